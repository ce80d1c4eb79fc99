//! Processors through the binary: the egg-economy projections computed live, under load,
//! with corrections and deletes of inputs, across `kill -9` of the server; each time the
//! projections must equal a recomputation from the inputs stored (nothing lost, nothing
//! counted twice).

mod common;

use common::{
    check_error_line, example_copy, examples_dir, one_version_each, processed_once, spawn_process,
    Client, Server,
};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// (date, ISO week, month) off a calendar: 2026-11-27 is a Friday.
const DATES: [(&str, &str, &str); 6] = [
    ("2026-10-30", "W44", "10"),
    ("2026-11-02", "W45", "11"),
    ("2026-11-05", "W45", "11"),
    ("2026-11-23", "W48", "11"),
    ("2026-11-27", "W48", "11"),
    ("2026-12-01", "W49", "12"),
];
const GOOD: [&str; 2] = ["grade_a", "double_yolk"];
const QUALITIES: [&str; 4] = ["grade_a", "grade_b", "cracked", "double_yolk"];

fn hen(i: usize) -> String {
    format!("00000000-0000-4000-8000-00000000000{i}")
}
fn farm_of(i: usize) -> String {
    format!("00000000-0000-4000-9000-00000000000{}", i % 2)
}

fn kill_9(server: &Server) {
    let status = std::process::Command::new("kill")
        .args(["-9", &server.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// `series` of processor `name` in `/metrics` at `base` (0 while it is not there).
async fn processor_metric(base: &str, name: &str, series: &str) -> f64 {
    let prefix = format!("{series}{{processor=\"{name}\",");
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.rsplit(' ').next())
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

/// Waits (up to 30 s) until processor `name` of the server at `base` has committed at least
/// `n` output versions since it started (`meshql_processor_outputs_total`): a kill after this
/// lands on a processor with committed work behind it and (under load) more in flight.
async fn until_outputs_committed(server: &Server, name: &str, n: f64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let done = processor_metric(&server.url(""), name, "meshql_processor_outputs_total").await;
        if done >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} committed {done} outputs of {n} within 30 s: {}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One writer's loop: lay reports created, corrected and deleted, deposits and
/// withdrawals, until stopped or the server is gone.
async fn write_load(
    base: String,
    containers: Arc<Vec<String>>,
    seed: u64,
    stop: Arc<AtomicBool>,
    done: Arc<Mutex<u64>>,
) {
    let container = |i: usize| containers[i].clone();
    let http = reqwest::Client::new();
    let mut x = seed;
    let mut next = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n) as usize
    };
    let mut mine: Vec<String> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let h = next(4);
        let report = json!({
            "hen_id": hen(h), "coop_id": hen(9), "farm_id": farm_of(h),
            "eggs": next(9), "quality": QUALITIES[next(4)],
            "timestamp": format!("{}T08:00:00Z", DATES[next(DATES.len() as u64)].0),
        });
        let sent = match next(10) {
            0..=4 => {
                http.post(format!("{base}/lay_report/api"))
                    .json(&report)
                    .send()
                    .await
            }
            5 | 6 if !mine.is_empty() => {
                let id = &mine[next(mine.len() as u64)];
                http.put(format!("{base}/lay_report/api/{id}"))
                    .json(&report)
                    .send()
                    .await
            }
            7 if !mine.is_empty() => {
                let id = mine.swap_remove(next(mine.len() as u64));
                http.delete(format!("{base}/lay_report/api/{id}"))
                    .send()
                    .await
            }
            8 => {
                let body = json!({
                    "container_id": container(next(2)), "source_type": "farm",
                    "source_id": farm_of(0), "eggs": 1 + next(20), "timestamp": "2026-11-27",
                });
                http.post(format!("{base}/storage_deposit/api"))
                    .json(&body)
                    .send()
                    .await
            }
            _ => {
                let body = json!({
                    "container_id": container(next(2)), "reason": "breakage",
                    "eggs": 1 + next(5), "timestamp": "2026-11-27",
                });
                http.post(format!("{base}/storage_withdrawal/api"))
                    .json(&body)
                    .send()
                    .await
            }
        };
        let Ok(r) = sent else { return };
        if r.status() == 201 && r.url().path() == "/lay_report/api" {
            if let Ok(v) = r.json::<Value>().await {
                if let Some(id) = v["id"].as_str() {
                    mine.push(id.to_owned());
                }
            }
        }
        *done.lock().unwrap() += 1;
    }
}

/// Two fridges of 50 eggs; their server-generated ids.
async fn two_containers(base: &str) -> Vec<String> {
    let http = reqwest::Client::new();
    let mut ids = Vec::new();
    for c in 0..2 {
        let body = json!({"name": format!("c{c}"), "container_type": "fridge", "capacity": 50, "zone": "n"});
        let r = http
            .post(format!("{base}/container/api"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        ids.push(
            r.json::<Value>().await.unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    ids
}

async fn list(http: &reqwest::Client, base: &str, entity: &str) -> Vec<Value> {
    http.get(format!("{base}/{entity}/api"))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

/// hen_productivity and container_inventory as they must be, from the stored inputs alone.
fn expected(reports: &[Value], deposits: &[Value], withdrawals: &[Value]) -> Value {
    let date_of = |r: &Value| {
        let t = r["timestamp"].as_str().unwrap();
        DATES.iter().find(|d| t.starts_with(d.0)).unwrap()
    };
    let mut by_hen: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for r in reports {
        by_hen
            .entry(r["hen_id"].as_str().unwrap().to_owned())
            .or_default()
            .push(r);
    }
    let mut hens = serde_json::Map::new();
    for (h, rs) in by_hen {
        let eggs = |r: &&Value| r["eggs"].as_i64().unwrap();
        let total: i64 = rs.iter().map(eggs).sum();
        let newest = rs.iter().map(|r| date_of(r).0).max().unwrap();
        let nd = DATES.iter().find(|d| d.0 == newest).unwrap();
        let sum = |f: &dyn Fn(&(&str, &str, &str)) -> bool| -> i64 {
            rs.iter().filter(|r| f(date_of(r))).map(eggs).sum()
        };
        let good: i64 = rs
            .iter()
            .filter(|r| GOOD.contains(&r["quality"].as_str().unwrap()))
            .map(eggs)
            .sum();
        let weeks: BTreeSet<&str> = rs.iter().map(|r| date_of(r).1).collect();
        let mut v = json!({
            "hen_id": h, "farm_id": rs[0]["farm_id"], "total_eggs": total,
            "eggs_today": sum(&|d| d.0 == nd.0), "eggs_week": sum(&|d| d.1 == nd.1),
            "eggs_month": sum(&|d| d.2 == nd.2),
            "avg_per_week": ((total as f64 / weeks.len() as f64) * 100.0).round() / 100.0,
        });
        if total > 0 {
            v["quality_rate"] = json!(good as f64 / total as f64);
        }
        hens.insert(h, v);
    }
    let mut containers: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for d in deposits {
        containers
            .entry(d["container_id"].as_str().unwrap().to_owned())
            .or_default()
            .0 += d["eggs"].as_i64().unwrap();
    }
    for w in withdrawals {
        containers
            .entry(w["container_id"].as_str().unwrap().to_owned())
            .or_default()
            .1 += w["eggs"].as_i64().unwrap();
    }
    let inventory: serde_json::Map<String, Value> = containers
        .into_iter()
        .map(|(c, (dep, wd))| {
            let current = (dep - wd).max(0);
            let v = json!({
                "container_id": c, "total_deposits": dep, "total_withdrawals": wd,
                "total_transfers_in": 0, "total_transfers_out": 0, "total_consumed": 0,
                "current_eggs": current,
                "utilization_pct": ((current.min(50) as f64 * 100.0 / 50.0) * 100.0).round() / 100.0,
            });
            (c, v)
        })
        .collect();
    json!({ "hens": hens, "inventory": inventory })
}

/// The projections as served, keyed like [`expected`].
async fn served(http: &reqwest::Client, base: &str) -> Value {
    let keyed = |docs: Vec<Value>, key: &str| -> serde_json::Map<String, Value> {
        docs.into_iter()
            .map(|mut d| {
                d.as_object_mut().unwrap().remove("id");
                (d[key].as_str().unwrap().to_owned(), d)
            })
            .collect()
    };
    json!({
        "hens": keyed(list(http, base, "hen_productivity").await, "hen_id"),
        "inventory": keyed(list(http, base, "container_inventory").await, "container_id"),
    })
}

fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            (x.as_f64().unwrap() - y.as_f64().unwrap()).abs() < 1e-9
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

/// Waits until the served projections equal the recomputation from the stored inputs.
/// `GET /_meshql/processors/<name>`.
async fn processor_state(base: &str, name: &str) -> Value {
    reqwest::get(format!("{base}/_meshql/processors/{name}"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn converges(base: &str) {
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let want = expected(
            &list(&http, base, "lay_report").await,
            &list(&http, base, "storage_deposit").await,
            &list(&http, base, "storage_withdrawal").await,
        );
        let got = served(&http, base).await;
        if same(&got, &want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "projections differ from the recomputation:\n got  {got}\n want {want}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn projections_survive_kill_9_mid_stream_exactly_once() {
    let data = tempfile::tempdir().unwrap();
    let config = examples_dir().join("egg-economy");
    let mut server = Server::start_with_data_dir(&config, data.path(), &[]);
    let http = reqwest::Client::new();
    let containers = Arc::new(two_containers(&server.url("")).await);
    let mut total_writes = 0;
    for round in 0..3 {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(Mutex::new(0u64));
        let writers: Vec<_> = (0..4)
            .map(|w| {
                tokio::spawn(write_load(
                    server.url(""),
                    containers.clone(),
                    0x9e37_79b9 + w * 7919 + round * 104_729,
                    stop.clone(),
                    done.clone(),
                ))
            })
            .collect();
        // killed once this run's processors have committed work, the load still running
        until_outputs_committed(&server, "hen_productivity", 20.0 + 20.0 * round as f64).await;
        kill_9(&server);
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            let _ = w.await;
        }
        let writes = *done.lock().unwrap();
        assert!(writes > 30, "round {round}: the load ran ({writes} writes)");
        total_writes += writes;
        drop(server);
        server = Server::start_with_data_dir(&config, data.path(), &[]);
        converges(&server.url("")).await;
    }
    // a clean stop and start changes nothing either
    let before = served(&http, &server.url("")).await;
    server.stop_gracefully();
    let server = Server::start_with_data_dir(&config, data.path(), &[]);
    converges(&server.url("")).await;
    assert!(same(&served(&http, &server.url("")).await, &before));
    let metrics = http
        .get(server.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("meshql_processor_dead_letters{processor=\"hen_productivity\",type=\"projection\",output=\"hen_productivity\"} 0"),
        "{metrics}"
    );
    assert!(total_writes > 100);
}

/// Every stored event has exactly one processed event, and every processed event an event.
async fn events_processed_once(base: &str) -> usize {
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let events = list(&http, base, "event").await;
        let processed = list(&http, base, "processedevent").await;
        let ids: BTreeSet<&str> = events.iter().map(|e| e["id"].as_str().unwrap()).collect();
        let mut per_event: BTreeMap<&str, usize> = BTreeMap::new();
        for p in &processed {
            *per_event
                .entry(p["raw_event_id"].as_str().unwrap())
                .or_default() += 1;
        }
        let done = per_event.len() == ids.len()
            && per_event.iter().all(|(k, n)| *n == 1 && ids.contains(k));
        if done {
            // a processedevent's id is derived from its event's change, so an event processed
            // again overwrites it: only its versions show the repeat
            let raw: BTreeSet<String> = ids.iter().map(|k| (*k).to_owned()).collect();
            one_version_each(&Client::new(base), "processedevent", &raw).await;
            return ids.len();
        }
        assert!(
            per_event.values().all(|n| *n == 1),
            "an event processed twice: {per_event:?}"
        );
        assert!(
            per_event.keys().all(|k| ids.contains(k)),
            "a processed event without its event"
        );
        assert!(
            Instant::now() < deadline,
            "{} events, {} processed",
            ids.len(),
            per_event.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_events_example_enriches_every_event_once_across_kill_9() {
    let data = tempfile::tempdir().unwrap();
    let config = examples_dir().join("events");
    let server = Server::start_with_data_dir(&config, data.path(), &[]);
    let http = reqwest::Client::new();
    // CONTRACT §7.3, end to end: the processed event carries the event's data, enriched
    let r = http
        .post(server.url("/event/api"))
        .json(&json!({
            "name": "e2e", "correlationId": "corr-1", "source": "test", "version": "1",
            "timestamp": "2026-11-27T10:00:00Z",
            "data": "{\"user_id\":\"user_e2e\",\"username\":\"test_user\"}",
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let id = r.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let query = json!({ "query": format!(
        "{{ getById(id: \"{id}\") {{ name processedEvents {{ raw_event_id name status correlationId processing_time_ms processed_data }} }} }}"
    )});
    let deadline = Instant::now() + Duration::from_secs(10);
    let processed = loop {
        let d: Value = http
            .post(server.url("/event/graph"))
            .json(&query)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let list = d["data"]["getById"]["processedEvents"].clone();
        if list.as_array().is_some_and(|l| !l.is_empty()) {
            break list[0].clone();
        }
        assert!(Instant::now() < deadline, "never processed: {d}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(processed["raw_event_id"], id.as_str());
    assert_eq!(processed["name"], "e2e");
    assert_eq!(processed["status"], "SUCCESS");
    assert_eq!(processed["correlationId"], "corr-1");
    assert!(processed["processing_time_ms"].as_f64().unwrap() > 0.0);
    let enriched: Value =
        serde_json::from_str(processed["processed_data"].as_str().unwrap()).unwrap();
    assert_eq!(
        (
            &enriched["user_id"],
            &enriched["username"],
            &enriched["enriched"]
        ),
        (&json!("user_e2e"), &json!("test_user"), &json!(true))
    );
    // the way back: processedevent.rawEvent
    let back: Value = http
        .post(server.url("/processedevent/graph"))
        .json(&json!({ "query": format!("{{ getByEvent(id: \"{id}\") {{ rawEvent {{ id name }} }} }}") }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        back["data"]["getByEvent"][0]["rawEvent"]["id"],
        id.as_str(),
        "{back}"
    );

    // under load, killed mid-stream twice: every stored event is processed exactly once
    events_once_across_kill_9(&config, data.path(), server).await;
}

/// The enrichment in three lanes (`parallel = 3`), killed mid-stream twice: still every
/// event processed exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_enrichment_in_parallel_lanes_processes_every_event_once_across_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let src = examples_dir().join("events");
    for sub in ["graph", "schema"] {
        std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        for f in std::fs::read_dir(src.join(sub)).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, dir.path().join(sub).join(f.file_name().unwrap())).unwrap();
        }
    }
    let text = std::fs::read_to_string(src.join("meshql.toml")).unwrap();
    let line = "output = \"processedevent\"\n";
    assert!(text.contains(line));
    let text = text.replacen(line, &format!("{line}parallel = 3\n"), 1);
    std::fs::write(dir.path().join("meshql.toml"), text).unwrap();
    let config = dir.path().to_path_buf();
    let data = tempfile::tempdir().unwrap();
    let server = Server::start_with_data_dir(&config, data.path(), &[]);
    events_once_across_kill_9(&config, data.path(), server).await;
}

/// Four writers POST events; the server is killed (-9) mid-stream and started again, twice;
/// each time every stored event has exactly one processed record.
async fn events_once_across_kill_9(
    config: &std::path::Path,
    data: &std::path::Path,
    server: Server,
) {
    let mut server = server;
    for round in 0..2 {
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..4)
            .map(|w| {
                let (url, stop) = (server.url("/event/api"), stop.clone());
                tokio::spawn(async move {
                    let http = reqwest::Client::new();
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let body = json!({"name": format!("r{round}-w{w}-{i}"), "data": "{}", "timestamp": "2026-11-27T10:00:00Z"});
                        if http.post(&url).json(&body).send().await.is_err() {
                            return i;
                        }
                        i += 1;
                    }
                    i
                })
            })
            .collect();
        // killed once this run has committed outputs of its own, the load still running
        until_outputs_committed(&server, "events-processor", 50.0).await;
        kill_9(&server);
        stop.store(true, Ordering::Relaxed);
        let mut sent = 0;
        for w in writers {
            sent += w.await.unwrap();
        }
        assert!(sent > 20, "round {round}: the load ran ({sent})");
        drop(server);
        server = Server::start_with_data_dir(config, data, &[]);
        let n = events_processed_once(&server.url("")).await;
        eprintln!("round {round}: {sent} events sent, {n} stored, each processed once");
        assert!(n > 20);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meshql_process_runs_the_projections_beside_the_server_across_kill_9() {
    // SQLite files shared between the two processes
    let dir = example_copy("egg-economy", |t| {
        t.replace(
            "synchronous_full = ${MESHQL_SQLITE_FULL:-false}",
            "synchronous_full = false\nexclusive = false",
        )
    });
    let config = dir.path().join("meshql.toml");
    let data = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();

    // a processor runs in one process at a time: not beside a server that runs it
    let server = Server::start_with_data_dir(&config, data.path(), &[]);
    let mut refused = spawn_process(&config, data.path(), &logs.path().join("refused.log"));
    let status = refused.wait().unwrap();
    let said = std::fs::read_to_string(logs.path().join("refused.log")).unwrap();
    assert!(!status.success(), "{said}");
    assert!(said.contains("runs in another process"), "{said}");
    drop(server);

    let server = Server::start_with_data_dir(&config, data.path(), &["--no-processors"]);
    let metrics = reqwest::get(server.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        !metrics.contains("meshql_processor_"),
        "the server runs no processor"
    );
    let containers = Arc::new(two_containers(&server.url("")).await);
    let mut process = spawn_process(&config, data.path(), &logs.path().join("p0.log"));
    for round in 0..2u64 {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(Mutex::new(0u64));
        let writers: Vec<_> = (0..3)
            .map(|w| {
                tokio::spawn(write_load(
                    server.url(""),
                    containers.clone(),
                    0x51ed + w * 31 + round * 977,
                    stop.clone(),
                    done.clone(),
                ))
            })
            .collect();
        // the processors die mid-stream, once this process has committed inputs of its own
        // (its status lines count them); the server and its writers go on
        let log = logs.path().join(format!("p{round}.log"));
        until_process_applied(&log, 20).await;
        process.kill().unwrap();
        process.wait().unwrap();
        // the writers write on with no processor running: the next one has a backlog
        let before = *done.lock().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while *done.lock().unwrap() < before + 20 {
            assert!(Instant::now() < deadline, "the writers stopped");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.await.unwrap();
        }
        assert!(*done.lock().unwrap() > 30, "round {round}: the load ran");
        process = spawn_process(
            &config,
            data.path(),
            &logs.path().join(format!("p{}.log", round + 1)),
        );
        converges(&server.url("")).await;
    }
    process.kill().unwrap();
    process.wait().unwrap();
}

/// Waits (up to 30 s) until a `meshql process` whose output is in `log` reports (in its status
/// lines, `processed=N` once a second) at least `n` inputs applied by one of its processors.
async fn until_process_applied(log: &std::path::Path, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let most = text
            .lines()
            .filter_map(|l| l.split("processed=").nth(1))
            .filter_map(|v| {
                v.split(|c: char| !c.is_ascii_digit())
                    .next()
                    .and_then(|d| d.parse::<u64>().ok())
            })
            .max()
            .unwrap_or(0);
        if most >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "`meshql process` applied {most} inputs of {n} within 30 s:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn kafka_brokers() -> String {
    meshql_conformance::test_server_url("kafka", "MESHQL_TEST_KAFKA_BROKERS")
}

/// MeshQL's CDC pipeline pointed at meshql: one service publishes its events to Kafka in
/// Debezium's envelope (a relay), another runs the enrichment processor on that topic. Every
/// event is processed once, across `kill -9` of the processing service under load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_processor_reads_debezium_events_from_kafka_once_across_kill_9() {
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let brokers = kafka_brokers();
    let topic = format!("k{run}.events_development.event");
    let publisher = example_copy("events", |t| {
        format!(
            "{t}\n[[changes.relay]]\nname = \"kafka\"\ntype = \"kafka\"\nbrokers = \"{brokers}\"\ntopic_naming = \"debezium\"\ntopic_prefix = \"k{run}\"\ndb = \"events_development\"\nformat = \"debezium\"\n"
        )
    });
    let consumer_config = example_copy("events", |t| {
        t.replace(
            "output = \"processedevent\"\n",
            &format!("output = \"processedevent\"\nsource = {{ type = \"kafka\", brokers = \"{brokers}\", topics = [\"{topic}\"] }}\n"),
        )
    });
    let a = Server::start(&publisher.path().join("meshql.toml"), &["--no-processors"]);
    let data = tempfile::tempdir().unwrap();
    let b_config = consumer_config.path().join("meshql.toml");
    let mut b = Server::start_with_data_dir(&b_config, data.path(), &[]);
    let http = reqwest::Client::new();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (url, stop) = (a.url("/event/api"), stop.clone());
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) && n < 3000 {
                let body = json!({"name": format!("k-{n}"), "data": "{\"user_id\":\"u\"}", "timestamp": "2026-11-27T10:00:00Z"});
                let r = http.post(&url).json(&body).send().await.unwrap();
                assert_eq!(r.status(), 201);
                n += 1;
            }
            n
        })
    };
    // killed once the consumer has committed batches of its own, the load still running
    until_outputs_committed(&b, "events-processor", 20.0).await;
    kill_9(&b);
    assert!(b.wait_exit(Duration::from_secs(5)).is_some());
    drop(b);
    // what the killed consumer committed, read by a server that runs no processor
    let committed = {
        let quiet = Server::start_with_data_dir(&b_config, data.path(), &["--no-processors"]);
        let n = quiet.client().list("/processedevent/api").await.len() as u64;
        quiet.stop_gracefully();
        n
    };
    assert!(committed >= 20, "{committed} processed before the kill");
    b = Server::start_with_data_dir(&b_config, data.path(), &[]);
    // the restarted consumer commits while the load goes on
    until_outputs_committed(&b, "events-processor", 1.0).await;
    stop.store(true, Ordering::Relaxed);
    let written = writer.await.unwrap();
    assert!(written > committed, "the load ran on ({written} events)");
    // every event of the publisher is processed exactly once by the consumer: one
    // processedevent per event, each with one version (a redelivered event would add one)
    let events: BTreeSet<String> = list(&http, &a.url(""), "event")
        .await
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(events.len() as u64, written);
    processed_once(&Client::new(&b.url("")), &events, Duration::from_secs(60)).await;
    // the restarted consumer read on at the committed offsets: it applied exactly the events
    // the killed one had not committed
    let inputs = processor_metric(
        &b.url(""),
        "events-processor",
        "meshql_processor_inputs_total",
    )
    .await;
    assert_eq!(
        committed + inputs as u64,
        written,
        "{committed} committed before the kill, {inputs} applied after it, {written} events"
    );
    let metrics = http
        .get(b.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("meshql_processor_dead_letters{processor=\"events-processor\",type=\"rust\",output=\"processedevent\"} 0"),
        "{metrics}"
    );
}

/// `meshql projections rebuild` under load: reads of the projection never see an empty or
/// partial table while the new one is computed, and afterwards the projection equals the
/// recomputation from the stored inputs (the live processor took over from the rebuild).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_swaps_in_a_recomputed_projection_without_downtime() {
    let data = tempfile::tempdir().unwrap();
    let config = examples_dir().join("egg-economy");
    let server = Server::start_with_data_dir(&config, data.path(), &[]);
    let http = reqwest::Client::new();
    let containers = Arc::new(two_containers(&server.url("")).await);
    // history first, so that the rebuild has something to recompute
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(Mutex::new(0u64));
    let warmup = tokio::spawn(write_load(
        server.url(""),
        containers.clone(),
        77,
        stop.clone(),
        done.clone(),
    ));
    tokio::time::sleep(Duration::from_millis(800)).await;
    stop.store(true, Ordering::Relaxed);
    warmup.await.unwrap();
    converges(&server.url("")).await;
    let hens_before = list(&http, &server.url(""), "hen_productivity").await.len();
    assert!(hens_before > 0);

    // load and readers go on while the rebuild runs
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..2)
        .map(|w| {
            tokio::spawn(write_load(
                server.url(""),
                containers.clone(),
                991 + w,
                stop.clone(),
                done.clone(),
            ))
        })
        .collect();
    let reader = {
        let (url, stop) = (server.url("/hen_productivity/api"), stop.clone());
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            let (mut reads, mut smallest) = (0u64, usize::MAX);
            while !stop.load(Ordering::Relaxed) {
                let docs: Vec<Value> = http.get(&url).send().await.unwrap().json().await.unwrap();
                smallest = smallest.min(docs.len());
                reads += 1;
            }
            (reads, smallest)
        })
    };
    let url = server.url("");
    let out = tokio::task::spawn_blocking(move || {
        common::run_meshql(
            &["projections", "rebuild", "hen_productivity", "--url", &url],
            Duration::from_secs(60),
        )
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("rebuilt up to position"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    let (reads, smallest) = reader.await.unwrap();
    assert!(reads > 5, "the reader ran ({reads} reads)");
    assert!(
        smallest >= hens_before,
        "a read during the rebuild saw {smallest} of the {hens_before} documents"
    );
    converges(&server.url("")).await;
    let state = processor_state(&server.url(""), "hen_productivity").await;
    assert_eq!(state["rebuild"]["state"], "done", "{state}");
    // a rebuild of an unknown processor is a 404 naming it
    let r = http
        .post(server.url("/_meshql/processors/nope/rebuild"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

/// egg-economy on PostgreSQL: the projections live in the database, the change log in the
/// data directory. Served again with a new data directory (a new log, which the hub fills
/// from the database), each processor notices that its position belongs to the old log and is
/// rebuilt from the new one: the projections still equal a recomputation, nothing counted
/// twice or skipped, and writes after it count once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn projections_on_postgres_are_rebuilt_when_the_change_log_is_replaced() {
    rebuilt_when_the_change_log_is_replaced(
        "meshql-postgres.toml",
        common::fresh_postgres_database(),
    )
    .await;
}

/// The same on MariaDB (egg-economy's MySQL variant).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn projections_on_mariadb_are_rebuilt_when_the_change_log_is_replaced() {
    rebuilt_when_the_change_log_is_replaced("meshql-mysql.toml", common::fresh_mysql_database())
        .await;
}

async fn rebuilt_when_the_change_log_is_replaced(variant: &str, database: String) {
    let config = examples_dir().join("egg-economy").join(variant);
    let env = [("DATABASE_URL", database)];
    let serve = |data: &std::path::Path| Server::start_sharing(&config, data, &[], &env, None);
    let load = |server: &Server, containers: Arc<Vec<String>>, seed: u64| {
        let (stop, done) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(0u64)));
        let writer = tokio::spawn(write_load(
            server.url(""),
            containers,
            seed,
            stop.clone(),
            done.clone(),
        ));
        async move {
            tokio::time::sleep(Duration::from_millis(700)).await;
            stop.store(true, Ordering::Relaxed);
            writer.await.unwrap();
            let n = *done.lock().unwrap();
            n
        }
    };
    let first = tempfile::tempdir().unwrap();
    let server = serve(first.path());
    let containers = Arc::new(two_containers(&server.url("")).await);
    assert!(load(&server, containers.clone(), 17).await > 20);
    converges(&server.url("")).await;
    let log_id = |dir: &std::path::Path| {
        std::fs::read_to_string(dir.join("changes/log.id"))
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
    };
    let old_log = log_id(first.path());
    server.stop_gracefully();

    // a new data directory: a new log, the same database
    let second = tempfile::tempdir().unwrap();
    let server = serve(second.path());
    assert_ne!(log_id(second.path()), old_log);
    converges(&server.url("")).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let state = processor_state(&server.url(""), "farm_output").await;
        if state["rebuild"]["state"] == "done" {
            break;
        }
        assert!(Instant::now() < deadline, "never rebuilt: {state}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // and it goes on on the new log
    assert!(load(&server, containers, 29).await > 20);
    converges(&server.url("")).await;
}

/// The projections' database is down when the server starts: the service starts anyway and
/// takes events, the processors wait; once the database is up they catch up, without a
/// restart, to what a recomputation from the stored events says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn projections_on_a_database_down_at_start_catch_up_when_it_comes_up() {
    let port = common::free_port();
    let services = tempfile::tempdir().unwrap();
    let dir = example_copy("egg-economy", |t| {
        t.replace(
            "[storage.projections]\ntype = \"sqlite\"\nfile = \"projections.db\"\nsynchronous_full = ${MESHQL_SQLITE_FULL:-false}",
            &format!("[storage.projections]\ntype = \"postgres\"\nurl = \"postgres://postgres@127.0.0.1:{port}/meshql_test\""),
        )
    });
    let server = Server::start(&dir.path().join("meshql.toml"), &[]);
    let http = reqwest::Client::new();
    // events are stored while the projections' database is down
    let r = http
        .get(server.url("/hen_productivity/api"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503, "the projections answer 503 meanwhile");
    let containers = Arc::new(two_containers(&server.url("")).await);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(Mutex::new(0u64));
    let writer = tokio::spawn(write_load(
        server.url(""),
        containers,
        4242,
        stop.clone(),
        done.clone(),
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    assert!(
        *done.lock().unwrap() > 20,
        "events were taken while the database was down"
    );

    // the database comes up on that port
    let script = examples_dir().join("../scripts/services/postgres.sh");
    let run = |action: &str| {
        std::process::Command::new("bash")
            .arg(&script)
            .arg(action)
            .env("MESHQL_SERVICES_DIR", services.path())
            .env("MESHQL_PG_PORT", port.to_string())
            .output()
            .unwrap()
    };
    let started = run("start");
    assert!(
        started.status.success(),
        "{}",
        String::from_utf8_lossy(&started.stderr)
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while http
        .get(server.url("/ready"))
        .send()
        .await
        .unwrap()
        .status()
        != 200
    {
        if Instant::now() > deadline {
            run("stop");
            panic!("meshql did not recover after the database came up");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    converges(&server.url("")).await;
    run("stop");
}

/// `meshql check` on a processor that names what the config does not have: the error names
/// the file, a line inside the processor's block and the field.
#[test]
fn check_names_file_line_and_field_of_a_bad_processor() {
    let block_start = |text: &str, name: &str| {
        let lines: Vec<&str> = text.lines().collect();
        (1..lines.len())
            .find(|i| lines[i - 1] == "[[processor]]" && lines[*i] == format!("name = \"{name}\""))
            .expect("the processor")
    };
    for (example, edit, needle, field) in [
        (
            "egg-economy",
            (
                "entity = \"lay_report\"\nkey = \"hen_id\"",
                "entity = \"lay_reprot\"\nkey = \"hen_id\"",
            ),
            "unknown entity `lay_reprot`",
            "processor[0] \"hen_productivity\".from[0].entity",
        ),
        (
            "egg-economy",
            (
                "total_eggs = { sum = \"eggs\" }",
                "total_eggs = { sum = \"egs\" }",
            ),
            "entity `lay_report` has no field `egs`",
            "processor[0] \"hen_productivity\".from[0].fields.total_eggs.sum",
        ),
        (
            "egg-economy",
            (
                "avg_per_week = \"round(total_eggs / _weeks, 2)\"",
                "avg_per_week = \"sqrt(total_eggs)\"",
            ),
            "unknown function `sqrt`",
            "processor[0] \"hen_productivity\".derive.avg_per_week",
        ),
        (
            "events",
            (
                "function = \"events.enrich\"",
                "function = \"events.enrichh\"",
            ),
            "no function `events.enrichh` is registered",
            "processor[0] \"events-processor\".function",
        ),
    ] {
        let dir = example_copy(example, |t| {
            assert!(t.contains(edit.0), "{} in {example}", edit.0);
            t.replacen(edit.0, edit.1, 1)
        });
        let config = dir.path().join("meshql.toml");
        let text = std::fs::read_to_string(&config).unwrap();
        let name = if example == "events" {
            "events-processor"
        } else {
            "hen_productivity"
        };
        let first = block_start(&text, name);
        let line = check_error_line(&config, needle);
        assert!(line.contains(field), "{field} in {line}");
        let at: usize = line
            .split("meshql.toml:")
            .nth(1)
            .and_then(|r| r.split(':').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("a line number in {line}"));
        assert!(
            (first..first + 30).contains(&at),
            "line {at} is in the processor's block (from {first}): {line}"
        );
    }
}
