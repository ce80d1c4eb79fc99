//! The change feed through the binary: `/_changes` (pages, long polling, Server-Sent Events,
//! token filtering, bad input), failed writes leaving no change, order per entity and per
//! document, `meshql changes`, and what survives `kill -9` (per document, the feed equals the
//! stored versions).

mod common;

use common::{bearer, examples_dir, run_meshql, Client, Server};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn farm_config() -> PathBuf {
    examples_dir().join("farm")
}

async fn create(c: &Client, path: &str, body: Value, headers: &[(&str, &str)]) -> String {
    let r = c
        .request("POST", path, Some(body.to_string().into_bytes()), headers)
        .await;
    r.expect_status(201);
    r.json()["id"].as_str().unwrap().to_owned()
}

/// `/_changes` after `since` once it holds at least `n` changes (the hub copies a commit
/// into the log a moment after it is acknowledged), read page by page, as
/// `{"changes": [every change], "last": L}`.
async fn changes_after(c: &Client, since: u64, n: usize, query: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut all: Vec<Value> = Vec::new();
        let mut last = since;
        loop {
            let r = c
                .get(&format!("/_changes?since={last}&limit=1000{query}"))
                .await;
            r.expect_status(200);
            let body = r.json();
            let page = body["changes"].as_array().unwrap().clone();
            let next = body["last"].as_u64().unwrap();
            all.extend(page);
            if next == last {
                break;
            }
            last = next;
        }
        if all.len() >= n || Instant::now() > deadline {
            return json!({"changes": all, "last": last});
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn list(body: &Value) -> &Vec<Value> {
    body["changes"].as_array().expect("changes array")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rest_write_is_one_change_in_order_per_entity() {
    let server = Server::start(&farm_config(), &[]);
    let c = server.client();
    let farm = create(
        &c,
        "/farm/api",
        json!({"name": "Emerdale"}),
        &[("x-correlation-id", "req-1")],
    )
    .await;
    c.put_json(&format!("/farm/api/{farm}"), &json!({"name": "Emmerdale"}))
        .await
        .expect_status(200);
    let r = c
        .request(
            "POST",
            "/coop/api/bulk",
            Some(
                json!([{"name": "red", "farm_id": farm}, {"name": "blue", "farm_id": farm}])
                    .to_string()
                    .into_bytes(),
            ),
            &[("x-request-id", "bulk-7")],
        )
        .await;
    r.expect_status(201);
    c.delete(&format!("/farm/api/{farm}"))
        .await
        .expect_status(200);
    // what changes nothing is no change
    c.delete(&format!("/farm/api/{farm}"))
        .await
        .expect_status(200);
    c.post_json("/farm/api", &json!({"nope": 1}))
        .await
        .expect_status(400);

    let body = changes_after(&c, 0, 5, "").await;
    let changes = list(&body);
    assert_eq!(changes.len(), 5, "one change per write: {changes:?}");
    // The feed promises commit order per document, and per entity for writes where one began
    // after the other was acknowledged (each entity's store numbers its own commits). The hub
    // copies each entity's feed on its own, so how farm and coop changes interleave is not
    // promised, even for these sequential writes: each entity is checked on its own.
    let of = |entity: &str| -> Vec<(String, String)> {
        changes
            .iter()
            .filter(|ch| ch["entity"] == entity)
            .map(|ch| {
                (
                    ch["op"].as_str().unwrap().to_owned(),
                    ch["payload"]["name"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let s = |o: &str, n: &str| (o.to_owned(), n.to_owned());
    assert_eq!(
        of("farm"),
        vec![
            s("create", "Emerdale"),
            s("update", "Emmerdale"),
            s("delete", "Emmerdale"),
        ]
    );
    assert_eq!(of("coop"), vec![s("create", "red"), s("create", "blue")]);
    let positions: Vec<u64> = changes
        .iter()
        .map(|c| c["position"].as_u64().unwrap())
        .collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
    assert_eq!(body["last"], positions[4]);
    let farm_changes: Vec<&Value> = changes.iter().filter(|c| c["entity"] == "farm").collect();
    let coop_changes: Vec<&Value> = changes.iter().filter(|c| c["entity"] == "coop").collect();
    assert_eq!(farm_changes[0]["correlation_id"], "req-1");
    assert_eq!(coop_changes[0]["correlation_id"], "bulk-7");
    assert_eq!(
        coop_changes[1]["correlation_id"], "bulk-7",
        "one request, one correlation id"
    );
    assert!(
        farm_changes[1]["correlation_id"].as_str().unwrap().len() >= 32,
        "a fresh one when none is given"
    );
    assert_eq!(farm_changes[0]["id"], farm.as_str());
    assert_eq!(farm_changes[0]["payload"]["id"], farm.as_str());
    assert_eq!(
        farm_changes[0]["change_id"],
        format!("farm:{farm}:{}", farm_changes[0]["created_at"])
    );

    // resume, page, filter
    let last = body["last"].as_u64().unwrap();
    let after = c.get(&format!("/_changes?since={last}")).await;
    assert_eq!(after.json(), json!({"changes": [], "last": last}));
    let page = c.get("/_changes?since=0&limit=2").await.json();
    assert_eq!(list(&page).len(), 2);
    assert_eq!(page["last"], positions[1]);
    let coops = c.get("/_changes?since=0&entity=coop").await.json();
    assert_eq!(list(&coops).len(), 2);
    assert_eq!(
        coops["last"], positions[4],
        "last moves past what the filter leaves out"
    );
    let now = c.get("/_changes?since=now").await.json();
    assert_eq!(now, json!({"changes": [], "last": last}));

    // bad input: 400 with a JSON error naming the problem
    for (query, word) in [
        ("since=-1", "since"),
        ("since=abc", "since"),
        ("limit=0", "limit"),
        ("limit=100001", "limit"),
        ("entity=dragon", "dragon"),
        ("wait_ms=3600000", "wait_ms"),
        ("feed=continuous", "feed"),
        ("sinse=1", "sinse"),
    ] {
        let r = c.get(&format!("/_changes?{query}")).await;
        r.expect_status(400);
        let e = r.json()["error"].as_str().unwrap().to_owned();
        assert!(e.contains(word), "{query}: {e}");
    }
    let metrics = c.get("/metrics").await.text;
    assert!(
        metrics.contains("meshql_changes_copied_total{entity=\"farm\"} 3"),
        "{metrics}"
    );
    assert!(metrics.contains(&format!("meshql_changes_log_last_position {last}")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_write_leaves_no_change() {
    let server = Server::start(&farm_config(), &[]);
    let c = server.client();
    // refused by validation: a field the schema does not allow, a required field missing, a
    // body that is not JSON
    c.post_json("/farm/api", &json!({"name": "x", "nope": 1}))
        .await
        .expect_status(400);
    c.post_json("/farm/api", &json!({}))
        .await
        .expect_status(400);
    c.post_raw("/farm/api", b"{\"name\": ")
        .await
        .expect_status(400);
    // an unknown id: nothing to replace, nothing to delete
    let unknown = "00000000-0000-4000-8000-000000000000";
    c.put_json(&format!("/farm/api/{unknown}"), &json!({"name": "ghost"}))
        .await
        .expect_status(404);
    c.delete(&format!("/farm/api/{unknown}"))
        .await
        .expect_status(404);
    // a bulk create with one invalid item: all or nothing, so none of its valid items
    let r = c
        .post_json(
            "/farm/api/bulk",
            &json!([{"name": "bulk-ok-1"}, {"name": "bulk-ok-2"}, {"nope": true}]),
        )
        .await;
    r.expect_status(400);
    assert!(c.list("/farm/api").await.is_empty(), "nothing was stored");

    // then one good write, on the same store: its change lands after anything the failed
    // writes could have committed before it
    let good = create(&c, "/farm/api", json!({"name": "good"}), &[]).await;
    let body = changes_after(&c, 0, 1, "").await;
    let changes = list(&body);
    assert_eq!(changes.len(), 1, "exactly the good write: {changes:?}");
    assert_eq!(changes[0]["id"], good.as_str());
    assert_eq!(changes[0]["op"], "create");
    assert_eq!(changes[0]["payload"]["name"], "good");
    // and nothing arrives after it
    let last = body["last"].as_u64().unwrap();
    let r = c.get(&format!("/_changes?since={last}&wait_ms=500")).await;
    assert_eq!(r.json(), json!({"changes": [], "last": last}));
    let metrics = c.get("/metrics").await.text;
    assert!(
        metrics.contains("meshql_changes_copied_total{entity=\"farm\"} 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_answers_when_a_change_lands() {
    const WAIT_MS: u64 = 30_000;
    let server = Server::start(&farm_config(), &[]);
    let c = server.client();
    let poll_sent = Instant::now();
    let waiting = {
        let c = server.client();
        tokio::spawn(async move {
            let r = c.get(&format!("/_changes?since=0&wait_ms={WAIT_MS}")).await;
            (r, Instant::now())
        })
    };
    // the write comes a second after the poll went out: the poll is waiting for it by then
    // (this delay is the scenario, not a synchronisation: nothing else is waited for)
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!waiting.is_finished(), "an empty long poll waits");
    let write_sent = Instant::now();
    let id = create(&c, "/farm/api", json!({"name": "late"}), &[]).await;
    let write_acknowledged = Instant::now();
    let (r, answered) = tokio::time::timeout(Duration::from_millis(WAIT_MS + 5_000), waiting)
        .await
        .expect("the long poll answers")
        .unwrap();
    r.expect_status(200);
    let body = r.json();
    // it returned that change...
    assert_eq!(list(&body).len(), 1, "{body}");
    assert_eq!(list(&body)[0]["id"], id.as_str());
    assert_eq!(list(&body)[0]["op"], "create");
    assert_eq!(list(&body)[0]["payload"]["name"], "late");
    // ...after the write was sent, and far sooner than the wait's end: the change answered
    // it, not the time running out (a correctness bound, not a latency target)
    assert!(
        answered > write_sent,
        "answered {:?} before the write was sent",
        write_sent - answered
    );
    let open_for = answered - poll_sent;
    assert!(
        open_for < Duration::from_millis(WAIT_MS / 3),
        "the poll was open {open_for:?} of its {WAIT_MS} ms"
    );
    eprintln!(
        "long poll: open {open_for:?}; answered {:?} after the write was sent ({:?} after it \
         was acknowledged)",
        answered - write_sent,
        answered.saturating_duration_since(write_acknowledged)
    );
    // with nothing arriving it answers empty when the wait is over, not before
    let last = body["last"].as_u64().unwrap();
    let started = Instant::now();
    let r = c.get(&format!("/_changes?since={last}&wait_ms=300")).await;
    assert_eq!(r.json(), json!({"changes": [], "last": last}));
    assert!(started.elapsed() >= Duration::from_millis(300));
}

/// Reads a Server-Sent Events response until `until` holds for the events seen.
async fn read_events(
    response: &mut reqwest::Response,
    until: impl Fn(&[(u64, Value)]) -> bool,
) -> Vec<(u64, Value)> {
    let mut text = String::new();
    let mut events = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !until(&events) {
        assert!(
            Instant::now() < deadline,
            "events so far: {events:?}\n{text}"
        );
        let chunk = tokio::time::timeout(Duration::from_secs(10), response.chunk())
            .await
            .expect("a chunk in time")
            .expect("the stream reads")
            .expect("the stream stays open");
        text.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(end) = text.find("\n\n") {
            let block: String = text.drain(..end + 2).collect();
            let mut id = None;
            let mut data = None;
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = Some(v.parse::<u64>().unwrap());
                }
                if let Some(v) = line.strip_prefix("data: ") {
                    data = Some(serde_json::from_str::<Value>(v).unwrap());
                }
            }
            if let (Some(id), Some(data)) = (id, data) {
                events.push((id, data));
            }
        }
    }
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_sent_events_stream_live_and_resume() {
    let server = Server::start(&farm_config(), &[]);
    let c = server.client();
    create(&c, "/farm/api", json!({"name": "before"}), &[]).await;
    let http = reqwest::Client::new();
    let mut stream = http
        .get(server.url("/_changes?since=0"))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    assert_eq!(
        stream.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let first = read_events(&mut stream, |e| !e.is_empty()).await;
    assert_eq!(first[0].1["payload"]["name"], "before");
    for name in ["live-1", "live-2"] {
        create(&c, "/farm/api", json!({"name": name}), &[]).await;
    }
    let live = read_events(&mut stream, |e| e.len() >= 2).await;
    assert_eq!(live[1].1["payload"]["name"], "live-2");
    assert_eq!(live[1].0, live[1].1["position"].as_u64().unwrap());
    drop(stream);

    // resume with Last-Event-ID: only what came after it
    create(&c, "/farm/api", json!({"name": "while-away"}), &[]).await;
    let mut resumed = http
        .get(server.url("/_changes"))
        .header("accept", "text/event-stream")
        .header("last-event-id", live[1].0.to_string())
        .send()
        .await
        .unwrap();
    let again = read_events(&mut resumed, |e| !e.is_empty()).await;
    assert_eq!(again[0].1["payload"]["name"], "while-away");
    assert_eq!(again.len(), 1);
    drop(resumed);

    // an open stream does not hold up shutdown
    let open = http
        .get(server.url("/_changes?feed=eventsource"))
        .send()
        .await
        .unwrap();
    assert!(server.stop_gracefully().success());
    drop(open);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_filter_the_feed_as_they_filter_reads() {
    // the farm example with `[auth] type = "jwt"` (before its first table)
    let dir = common::example_copy("farm", |t| {
        t.replacen(
            "\n[storage.",
            &format!(
                "\n[auth]\ntype = \"jwt\"\nsecret = \"{}\"\n\n[storage.",
                common::JWT_SECRET
            ),
            1,
        )
    });
    let config = dir.path().join("meshql.toml");
    let server = Server::start(&config, &[]);
    let c = server.client();
    let alice = bearer("alice");
    let bob = bearer("bob");
    create(
        &c,
        "/farm/api",
        json!({"name": "alice's"}),
        &[("authorization", &alice)],
    )
    .await;
    create(
        &c,
        "/farm/api",
        json!({"name": "bob's"}),
        &[("authorization", &bob)],
    )
    .await;
    changes_after(&c, 0, 2, "").await;
    let seen = |auth: String| {
        let c = server.client();
        async move {
            let r = c
                .request(
                    "GET",
                    "/_changes?since=0",
                    None,
                    &[("authorization", &auth)],
                )
                .await;
            list(&r.json())
                .iter()
                .map(|ch| ch["payload"]["name"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(seen(alice).await, vec!["alice's"]);
    assert_eq!(seen(bob).await, vec!["bob's"]);
    let anonymous = c.get("/_changes?since=0").await.json();
    assert!(list(&anonymous).is_empty(), "{anonymous}");
    assert_eq!(anonymous["last"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_writers_each_change_once_in_order_per_document() {
    let server = Server::start(&farm_config(), &[]);
    let mut tasks = Vec::new();
    for w in 0..50 {
        let c = server.client();
        tasks.push(tokio::spawn(async move {
            let id = create(&c, "/farm/api", json!({"name": format!("w{w}-0")}), &[]).await;
            for i in 1..6 {
                c.put_json(
                    &format!("/farm/api/{id}"),
                    &json!({"name": format!("w{w}-{i}")}),
                )
                .await
                .expect_status(200);
            }
            id
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.unwrap());
    }
    let c = server.client();
    let body = changes_after(&c, 0, 300, "").await;
    let changes = list(&body);
    assert_eq!(changes.len(), 300, "exactly the acknowledged writes");
    let unique: BTreeSet<&str> = changes
        .iter()
        .map(|c| c["change_id"].as_str().unwrap())
        .collect();
    assert_eq!(unique.len(), 300);
    let mut per_doc: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for ch in changes {
        per_doc
            .entry(ch["id"].as_str().unwrap())
            .or_default()
            .push(ch["payload"]["name"].as_str().unwrap().to_owned());
    }
    assert_eq!(per_doc.len(), 50);
    for names in per_doc.values() {
        let w = names[0].split('-').next().unwrap().to_owned();
        let expected: Vec<String> = (0..6).map(|i| format!("{w}-{i}")).collect();
        assert_eq!(*names, expected);
    }
}

/// Sends a write; its status and JSON body when the server answered, `None` when the request
/// failed (the server died under it).
async fn send_lenient(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<Value>,
) -> Option<(u16, Value)> {
    let mut req = http.request(method, url);
    if let Some(body) = body {
        req = req
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let r = req.send().await.ok()?;
    let status = r.status().as_u16();
    let v: Value = r.json().await.ok()?;
    Some((status, v))
}

fn kill_9(server: &Server) {
    let status = std::process::Command::new("kill")
        .args(["-9", &server.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Runs `meshql changes` on a config and data dir; the JSON lines it prints.
fn cli_changes(config: &Path, data_dir: &Path, extra: &[&str]) -> Vec<Value> {
    let mut args = vec![
        "changes",
        config.to_str().unwrap(),
        "--data-dir",
        data_dir.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = run_meshql(&args, Duration::from_secs(30));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// One change or stored version as the kill -9 test compares them: op, payload, created_at.
type Step = (String, Value, Value);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_the_feed_equals_the_stored_versions() {
    use reqwest::Method;
    let data = tempfile::tempdir().unwrap();
    let config = farm_config();
    let server = Server::start_with_data_dir(&config, data.path(), &[]);
    // every acknowledged write: (id, op, name)
    type Acked = Vec<(String, &'static str, String)>;
    let acknowledged = std::sync::Arc::new(std::sync::Mutex::new(Acked::new()));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..8 {
        let base = server.url("/farm/api");
        let (acknowledged, stop) = (acknowledged.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            let ack = |id: &str, op: &'static str, name: String| {
                acknowledged.lock().unwrap().push((id.to_owned(), op, name))
            };
            // creates, updates of acknowledged ids, and deletes of some of them
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && i < 10_000 {
                let name = format!("k{w}-{i}");
                let Some((201, v)) =
                    send_lenient(&http, Method::POST, &base, Some(json!({ "name": name }))).await
                else {
                    return;
                };
                let id = v["id"].as_str().unwrap().to_owned();
                ack(&id, "create", name.clone());
                let url = format!("{base}/{id}");
                for u in 1..=(i % 3) {
                    let name = format!("{name}-v{u}");
                    match send_lenient(&http, Method::PUT, &url, Some(json!({ "name": name })))
                        .await
                    {
                        Some((200, _)) => ack(&id, "update", name),
                        _ => return,
                    }
                }
                if i % 4 == 1 {
                    match send_lenient(&http, Method::DELETE, &url, None).await {
                        Some((200, _)) => ack(&id, "delete", String::new()),
                        _ => return,
                    }
                }
                i += 1;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    kill_9(&server);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        let _ = w.await;
    }
    drop(server);
    let acknowledged = acknowledged.lock().unwrap().clone();
    let count = |op: &str| acknowledged.iter().filter(|a| a.1 == op).count();
    assert!(
        count("create") > 20 && count("update") > 10 && count("delete") > 5,
        "load ran: {} creates, {} updates, {} deletes",
        count("create"),
        count("update"),
        count("delete")
    );

    // restart on the same data: the feed catches up to exactly the stored versions
    let server = Server::start_with_data_dir(&config, data.path(), &[]);
    let c = server.client();
    // every stored id: those listed (alive), those acknowledged (deletes target only those);
    // a create whose answer was lost in the kill and that nothing deleted is listed
    let mut ids: BTreeSet<String> = c
        .list("/farm/api")
        .await
        .iter()
        .map(|d| d["id"].as_str().unwrap().to_owned())
        .collect();
    ids.extend(acknowledged.iter().map(|a| a.0.clone()));
    let mut stored: BTreeMap<String, Vec<Step>> = BTreeMap::new();
    for id in &ids {
        let r = c
            .get(&format!(
                "/_meshql/console/api/entities/farm/documents/{id}/versions"
            ))
            .await;
        r.expect_status(200);
        let versions = r.json()["versions"].as_array().unwrap().clone();
        let steps = versions
            .iter()
            .enumerate()
            .map(|(n, v)| {
                let op = if v["deleted"] == true {
                    "delete"
                } else if n == 0 {
                    "create"
                } else {
                    "update"
                };
                (op.to_owned(), v["payload"].clone(), v["created_at"].clone())
            })
            .collect();
        stored.insert(id.clone(), steps);
    }
    let total: usize = stored.values().map(Vec::len).sum();
    let body = changes_after(&c, 0, total, "&entity=farm").await;
    let mut fed: BTreeMap<String, Vec<Step>> = BTreeMap::new();
    for ch in list(&body) {
        fed.entry(ch["id"].as_str().unwrap().to_owned())
            .or_default()
            .push((
                ch["op"].as_str().unwrap().to_owned(),
                ch["payload"].clone(),
                ch["created_at"].clone(),
            ));
    }
    let change_ids: BTreeSet<&str> = list(&body)
        .iter()
        .map(|c| c["change_id"].as_str().unwrap())
        .collect();
    assert_eq!(change_ids.len(), list(&body).len(), "no change twice");
    // per id, in order: nothing missing, nothing twice, the same ops and payloads
    for (id, versions) in &stored {
        assert_eq!(
            fed.get(id),
            Some(versions),
            "the feed of {id} differs from its stored versions"
        );
    }
    let unknown: Vec<&String> = fed.keys().filter(|id| !stored.contains_key(*id)).collect();
    assert!(
        unknown.is_empty(),
        "changes of no stored document: {unknown:?}"
    );
    assert_eq!(list(&body).len(), total);
    // every acknowledged write is among them, in the order it was acknowledged
    let mut acked_per_id: BTreeMap<&str, Vec<(&str, &str)>> = BTreeMap::new();
    for (id, op, name) in &acknowledged {
        acked_per_id
            .entry(id.as_str())
            .or_default()
            .push((op, name.as_str()));
    }
    for (id, acked) in &acked_per_id {
        let versions = &stored[*id];
        let names: Vec<(&str, &str)> = versions
            .iter()
            .map(|(op, payload, _)| (op.as_str(), payload["name"].as_str().unwrap_or_default()))
            .collect();
        // a write acknowledged is stored; the one after the last acknowledged may be stored
        // too (committed, its answer lost in the kill)
        let stored_prefix: Vec<(&str, &str)> = names
            .iter()
            .take(acked.len())
            .map(|(op, name)| (*op, if *op == "delete" { "" } else { *name }))
            .collect();
        assert_eq!(&stored_prefix, acked, "{id}");
        assert!(
            names.len() <= acked.len() + 1,
            "{id}: {names:?} of {acked:?}"
        );
    }
    let ops: BTreeMap<&str, usize> = list(&body).iter().fold(BTreeMap::new(), |mut m, c| {
        *m.entry(c["op"].as_str().unwrap()).or_default() += 1;
        m
    });
    eprintln!(
        "kill -9: {} ids, {total} stored versions, {ops:?}",
        stored.len()
    );
    let ids: Vec<&str> = list(&body)
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    // another process reads the same log
    let printed = cli_changes(&config, data.path(), &["--entity", "farm"]);
    assert_eq!(printed.len(), ids.len());
    let first_two = cli_changes(&config, data.path(), &["--limit", "2", "--group", "audit"]);
    assert_eq!(first_two.len(), 2);
    let next = cli_changes(&config, data.path(), &["--limit", "1", "--group", "audit"]);
    assert_eq!(
        next[0]["position"],
        first_two[1]["position"].as_u64().unwrap() + 1,
        "the group resumes"
    );
    drop(server);
}
