//! Relays through the binary, against real brokers: every change reaches Kafka (both value
//! formats, both topic namings) and NATS JetStream; while a broker is down, writes are
//! acknowledged as fast as before it went down (medians compared in the same test), the
//! relay's errors and lag show in `/metrics`, and everything is delivered once it is back;
//! `kill -9` of meshql mid-load loses nothing (every stored version arrives at least once,
//! exactly once by `change_id`).
//!
//! The shared servers come from `scripts/services/{kafka,nats}.sh` (or
//! `MESHQL_TEST_KAFKA_BROKERS` / `MESHQL_TEST_NATS_URL`); the outage tests start brokers of
//! their own on other ports, so stopping them disturbs no other test.

mod common;

use common::{example_copy, feed, Client, OwnService, Server};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::ClientConfig;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn kafka() -> String {
    meshql_conformance::test_server_url("kafka", "MESHQL_TEST_KAFKA_BROKERS")
}

fn nats() -> String {
    meshql_conformance::test_server_url("nats", "MESHQL_TEST_NATS_URL")
}

/// A short id that keeps this run's topics, subjects and streams apart from other runs'.
fn run_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..8].to_owned()
}

/// A copy of the farm example with `extra` appended to its config.
fn farm_with(extra: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = example_copy("farm", |text| format!("{text}\n{extra}\n"));
    let config = dir.path().join("meshql.toml");
    (dir, config)
}

/// The value of `name{relay="<relay>",...}` in `/metrics`.
async fn metric(c: &Client, name: &str, relay: &str) -> Option<f64> {
    let text = c.get("/metrics").await.text;
    let prefix = format!("{name}{{relay=\"{relay}\"");
    text.lines()
        .find(|l| l.starts_with(&prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Waits until every change of the log is committed by `relay` (panics after `limit`).
/// Waits until the feed holds at least `at_least` changes (the hub copies writes into the log
/// a moment after they are acknowledged: a relay "caught up" with a log that has not got them
/// yet proves nothing) and `relay` has committed its last one with no lag.
async fn caught_up(c: &Client, relay: &str, at_least: usize, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let changes = feed(c).await;
        let last = changes
            .last()
            .map_or(0, |v| v["position"].as_u64().unwrap());
        let committed = metric(c, "meshql_relay_committed_position", relay).await;
        let lag = metric(c, "meshql_relay_lag", relay).await;
        if changes.len() >= at_least && committed == Some(last as f64) && lag == Some(0.0) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "relay {relay} did not catch up: committed {committed:?} of {last}, lag {lag:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A Kafka message as a test reads it.
#[derive(Debug, Clone)]
struct Received {
    topic: String,
    key: String,
    headers: BTreeMap<String, String>,
    value: Value,
}

/// Reads `topics` from the start until every id in `want` was seen (panics after 90 s);
/// every message read, duplicates included.
async fn consume_kafka(brokers: &str, topics: &[String], want: BTreeSet<String>) -> Vec<Received> {
    let brokers = brokers.to_owned();
    let topics = topics.to_vec();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("group.id", format!("test-{}", run_id()))
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .create()
            .expect("consumer");
        let refs: Vec<&str> = topics.iter().map(String::as_str).collect();
        consumer.subscribe(&refs).expect("subscribe");
        let deadline = Instant::now() + Duration::from_secs(90);
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        while !want.is_subset(&seen) {
            assert!(
                Instant::now() < deadline,
                "{} of {} changes arrived on {topics:?}; missing e.g. {:?}",
                want.intersection(&seen).count(),
                want.len(),
                want.difference(&seen).next()
            );
            let Some(m) = consumer.poll(Duration::from_millis(200)) else {
                continue;
            };
            let m = m.expect("a message");
            let mut headers = BTreeMap::new();
            if let Some(h) = m.headers() {
                for header in h.iter() {
                    headers.insert(
                        header.key.to_owned(),
                        String::from_utf8_lossy(header.value.unwrap_or_default()).into_owned(),
                    );
                }
            }
            seen.insert(headers.get("change_id").cloned().unwrap_or_default());
            out.push(Received {
                topic: m.topic().to_owned(),
                key: String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
                headers,
                value: serde_json::from_slice(m.payload().unwrap_or(b"null")).unwrap(),
            });
        }
        out
    })
    .await
    .expect("the consumer thread")
}

/// Every message of a JetStream stream: (subject, Nats-Msg-Id, body).
async fn read_stream(url: &str, stream: &str) -> Vec<(String, String, Value)> {
    let client = async_nats::connect(url).await.expect("connect to NATS");
    let js = async_nats::jetstream::new(client);
    let mut s = js
        .get_stream(stream)
        .await
        .expect("the relay created the stream");
    let state = s.info().await.unwrap().state.clone();
    let mut out = Vec::new();
    for seq in state.first_sequence..=state.last_sequence {
        let m = s.get_raw_message(seq).await.expect("a stored message");
        let id = m
            .headers
            .get(async_nats::header::NATS_MESSAGE_ID)
            .map(|v| v.as_str().to_owned())
            .unwrap_or_default();
        out.push((
            m.subject.to_string(),
            id,
            serde_json::from_slice(&m.payload).unwrap(),
        ));
    }
    out
}

fn change_ids(changes: &[Value]) -> BTreeSet<String> {
    changes
        .iter()
        .map(|c| c["change_id"].as_str().unwrap().to_owned())
        .collect()
}

async fn create_farm(c: &Client, name: &str) -> String {
    let r = c.post_json("/farm/api", &json!({ "name": name })).await;
    r.expect_status(201);
    r.json()["id"].as_str().unwrap().to_owned()
}

/// A few writes of every kind: creates, an update, a delete, another entity.
async fn some_writes(c: &Client) {
    let a = create_farm(c, "a").await;
    let b = create_farm(c, "b").await;
    let r = c
        .request(
            "PUT",
            &format!("/farm/api/{a}"),
            Some(json!({"name": "a2"}).to_string().into_bytes()),
            &[("x-correlation-id", "req-update")],
        )
        .await;
    r.expect_status(200);
    c.delete(&format!("/farm/api/{b}")).await.expect_status(200);
    c.post_json("/coop/api", &json!({"name": "red", "farm_id": a}))
        .await
        .expect_status(201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_change_reaches_kafka_in_both_formats_and_namings() {
    let run = run_id();
    let brokers = kafka();
    let (_dir, config) = farm_with(&format!(
        r#"
[[changes.relay]]
name = "plain"
type = "kafka"
brokers = "{brokers}"
topic_prefix = "r{run}."

[[changes.relay]]
name = "cdc"
type = "kafka"
brokers = "{brokers}"
topic_naming = "debezium"
topic_prefix = "events{run}"
db = "farm_development"
format = "debezium"
"#
    ));
    let server = Server::start(&config, &[]);
    let c = server.client();
    some_writes(&c).await;
    caught_up(&c, "plain", 5, Duration::from_secs(60)).await;
    caught_up(&c, "cdc", 5, Duration::from_secs(60)).await;
    let changes = feed(&c).await;
    assert_eq!(changes.len(), 5);
    let want = change_ids(&changes);

    // meshql format: one topic per entity, the value is the published change
    let got = consume_kafka(
        &brokers,
        &[format!("r{run}.farm"), format!("r{run}.coop")],
        want.clone(),
    )
    .await;
    assert_eq!(got.len(), 5, "each change once: {got:?}");
    for change in &changes {
        let id = change["change_id"].as_str().unwrap();
        let m = got.iter().find(|m| m.headers["change_id"] == id).unwrap();
        assert_eq!(
            m.topic,
            format!("r{run}.{}", change["entity"].as_str().unwrap())
        );
        assert_eq!(m.key, change["id"].as_str().unwrap());
        assert_eq!(m.headers["op"], change["op"].as_str().unwrap());
        assert_eq!(m.headers["position"], change["position"].to_string());
        assert_eq!(
            m.headers["correlation_id"],
            change["correlation_id"].as_str().unwrap()
        );
        assert_eq!(
            &m.value, change,
            "the value is the change as /_changes serves it"
        );
    }
    let update = got.iter().find(|m| m.headers["op"] == "update").unwrap();
    assert_eq!(update.headers["correlation_id"], "req-update");

    // Debezium: <prefix>.<db>.<collection>, MongoDB-connector envelope
    let got = consume_kafka(
        &brokers,
        &[
            format!("events{run}.farm_development.farm"),
            format!("events{run}.farm_development.coop"),
        ],
        want,
    )
    .await;
    assert_eq!(got.len(), 5);
    let ops: Vec<&str> = got
        .iter()
        .filter(|m| m.topic.ends_with(".farm"))
        .map(|m| m.value["op"].as_str().unwrap())
        .collect();
    assert_eq!(ops, ["c", "c", "u", "d"], "a topic keeps the log's order");
    for m in &got {
        assert_eq!(m.value["source"]["connector"], "meshql");
        assert_eq!(m.value["source"]["name"], format!("events{run}"));
        assert_eq!(m.value["source"]["db"], "farm_development");
        let change = changes
            .iter()
            .find(|c| c["change_id"] == m.value["source"]["change_id"])
            .unwrap();
        assert_eq!(m.key, change["id"].as_str().unwrap());
        let doc = if m.value["op"] == "d" {
            assert!(m.value["after"].is_null());
            &m.value["before"]
        } else {
            assert!(m.value["before"].is_null());
            &m.value["after"]
        };
        // as MeshQL's processors read it: a JSON string, the data under `payload`
        let doc: Value = serde_json::from_str(doc.as_str().unwrap()).unwrap();
        assert_eq!(doc["id"], change["id"]);
        assert_eq!(doc["payload"], change["payload"]);
        assert_eq!(doc["created_at"], change["created_at"]);
    }
    assert_eq!(
        metric(&c, "meshql_relay_sent_total", "plain").await,
        Some(5.0)
    );
    assert_eq!(
        metric(&c, "meshql_relay_errors_total", "cdc").await,
        Some(0.0)
    );
    // the broker's state never makes the service unready
    c.get("/ready").await.expect_status(200);
    server.stop_gracefully();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_change_reaches_nats_jetstream_once() {
    let run = run_id();
    let url = nats();
    let (_dir, config) = farm_with(&format!(
        r#"
[[changes.relay]]
name = "js"
type = "nats"
url = "{url}"
subject_prefix = "r{run}.changes"
stream = "R{run}"
"#
    ));
    let server = Server::start(&config, &[]);
    let c = server.client();
    some_writes(&c).await;
    caught_up(&c, "js", 5, Duration::from_secs(60)).await;
    let changes = feed(&c).await;
    let stored = read_stream(&url, &format!("R{run}")).await;
    assert_eq!(stored.len(), changes.len(), "{stored:?}");
    for ((subject, msg_id, body), change) in stored.iter().zip(&changes) {
        assert_eq!(
            *subject,
            format!("r{run}.changes.{}", change["entity"].as_str().unwrap())
        );
        assert_eq!(msg_id, change["change_id"].as_str().unwrap());
        assert_eq!(body, change, "in log order, as /_changes serves it");
    }
    server.stop_gracefully();
}

/// Writes measured per phase of an outage test.
const WRITES_PER_PHASE: usize = 40;

/// POSTs a farm, which must be acknowledged (201): its id and how long the write took.
async fn timed_write(c: &Client, name: String) -> (String, Duration) {
    let started = Instant::now();
    let r = c.post_json("/farm/api", &json!({ "name": name })).await;
    let took = started.elapsed();
    assert_eq!(r.status, 201, "write {name} was not acknowledged: {r:?}");
    (r.json()["id"].as_str().unwrap().to_owned(), took)
}

/// `n` writes, one every ~20 ms: their ids and latencies.
async fn timed_writes(c: &Client, phase: &str, n: usize) -> (Vec<String>, Vec<Duration>) {
    let mut ids = Vec::new();
    let mut took = Vec::new();
    for i in 0..n {
        let (id, t) = timed_write(c, format!("{phase}-{i}")).await;
        ids.push(id);
        took.push(t);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (ids, took)
}

fn median(mut d: Vec<Duration>) -> Duration {
    d.sort();
    d[d.len() / 2]
}

/// `host:port` of a broker URL (`nats://127.0.0.1:14322`, `127.0.0.1:19192`).
fn broker_addr(url: &str) -> std::net::SocketAddr {
    url.rsplit("//")
        .next()
        .unwrap()
        .split(',')
        .next()
        .unwrap()
        .parse()
        .expect("a host:port address")
}

/// True when nothing accepts connections at `addr` (the broker is down).
fn refuses(addr: std::net::SocketAddr) -> bool {
    std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err()
}

/// Waits until the broker at `addr` refuses connections (panics after 30 s).
async fn until_refused(addr: std::net::SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !refuses(addr) {
        assert!(
            Instant::now() < deadline,
            "the broker at {addr} is still up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The writes of an outage, with the broker at `addr` already refusing connections: at least
/// [`WRITES_PER_PHASE`], one every ~20 ms, and on until the relay has failed twice more than
/// `errors_before` (it is retrying, not idle; panics after 40 s). Every write must be
/// acknowledged (201), and the broker must still refuse connections after the last one: all
/// of them were made while it was down. Their ids and latencies.
async fn writes_during_outage(
    c: &Client,
    relay: &str,
    addr: std::net::SocketAddr,
    errors_before: f64,
) -> (Vec<String>, Vec<Duration>) {
    assert!(refuses(addr), "the broker is down before the first write");
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut ids = Vec::new();
    let mut took = Vec::new();
    loop {
        let (id, t) = timed_write(c, format!("outage-{}", ids.len())).await;
        ids.push(id);
        took.push(t);
        if ids.len() >= WRITES_PER_PHASE {
            let errors = metric(c, "meshql_relay_errors_total", relay).await.unwrap();
            if errors >= errors_before + 2.0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "relay {relay} did not fail while the broker was down: {errors} errors"
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        refuses(addr),
        "the broker is still down after the last outage write"
    );
    (ids, took)
}

/// The outage's writes were not held up by the broker: their median latency is within a
/// generous factor of the baseline's (a property, not a benchmark).
fn assert_not_blocked(baseline: &[Duration], outage: &[Duration]) {
    let (b, o) = (median(baseline.to_vec()), median(outage.to_vec()));
    let max = |d: &[Duration]| d.iter().max().copied().unwrap_or_default();
    eprintln!(
        "write latency: baseline median {b:?} (max {:?}) over {}; broker down: median {o:?} \
         (max {:?}) over {}",
        max(baseline),
        baseline.len(),
        max(outage),
        outage.len()
    );
    assert!(
        o <= b * 5 + Duration::from_millis(50),
        "writes while the broker was down took a median {o:?}, before it {b:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_down_writes_are_acknowledged_as_fast_and_all_delivered_after() {
    let broker = Arc::new(OwnService::new("kafka", "MESHQL_KAFKA_PORT", 19192));
    let broker_url = broker.start();
    let addr = broker_addr(&broker_url);
    let run = run_id();
    let (_dir, config) = farm_with(&format!(
        r#"
[[changes.relay]]
name = "k"
type = "kafka"
brokers = "{}"
topic_prefix = "o{run}."
retry_backoff_max_ms = 1000
options = {{ "message.timeout.ms" = 3000 }}
"#,
        broker_url
    ));
    let server = Server::start(&config, &[]);
    let c = server.client();
    // the baseline, with the broker up
    let (before, baseline) = timed_writes(&c, "before", WRITES_PER_PHASE).await;
    caught_up(&c, "k", before.len(), Duration::from_secs(30)).await;
    let errors_before = metric(&c, "meshql_relay_errors_total", "k").await.unwrap();

    let b = broker.clone();
    tokio::task::spawn_blocking(move || b.stop()).await.unwrap();
    until_refused(addr).await;
    let (during, outage) = writes_during_outage(&c, "k", addr, errors_before).await;
    assert!(
        metric(&c, "meshql_relay_lag", "k").await.unwrap() > 0.0,
        "lag is visible while the broker is down"
    );
    let stale = metric(&c, "meshql_relay_seconds_since_last_success", "k")
        .await
        .unwrap();
    assert!(stale > 1.0, "{stale}");
    c.get("/ready").await.expect_status(200);
    assert!(refuses(addr), "the broker was down throughout");
    assert_not_blocked(&baseline, &outage);

    let b = broker.clone();
    tokio::task::spawn_blocking(move || b.start())
        .await
        .unwrap();
    let (after, _) = timed_writes(&c, "after", 5).await;
    let written = before.len() + during.len() + after.len();
    caught_up(&c, "k", written, Duration::from_secs(90)).await;
    assert_eq!(
        metric(&c, "meshql_relay_seconds_since_last_success", "k").await,
        Some(0.0)
    );

    let changes = feed(&c).await;
    let fed: Vec<&str> = changes.iter().map(|c| c["id"].as_str().unwrap()).collect();
    let written: Vec<&str> = before
        .iter()
        .chain(&during)
        .chain(&after)
        .map(String::as_str)
        .collect();
    assert_eq!(fed, written, "every acknowledged write, once, in order");
    let want = change_ids(&changes);
    let got = consume_kafka(&broker_url, &[format!("o{run}.farm")], want.clone()).await;
    let delivered: BTreeSet<String> = got.iter().map(|m| m.headers["change_id"].clone()).collect();
    assert_eq!(
        delivered, want,
        "every change, and nothing else, after the outage"
    );
    server.stop_gracefully();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_killed_writes_are_acknowledged_as_fast_and_all_delivered_after() {
    let server_nats = Arc::new(OwnService::new("nats", "MESHQL_NATS_PORT", 14322));
    let nats_url = server_nats.start();
    let addr = broker_addr(&nats_url);
    let run = run_id();
    let (_dir, config) = farm_with(&format!(
        r#"
[[changes.relay]]
name = "n"
type = "nats"
url = "{}"
subject_prefix = "o{run}.changes"
stream = "O{run}"
retry_backoff_max_ms = 1000
"#,
        nats_url
    ));
    let server = Server::start(&config, &[]);
    let c = server.client();
    let (before, baseline) = timed_writes(&c, "before", WRITES_PER_PHASE).await;
    caught_up(&c, "n", before.len(), Duration::from_secs(30)).await;
    let errors_before = metric(&c, "meshql_relay_errors_total", "n").await.unwrap();

    server_nats.kill_9();
    until_refused(addr).await;
    let (during, outage) = writes_during_outage(&c, "n", addr, errors_before).await;
    assert!(metric(&c, "meshql_relay_lag", "n").await.unwrap() > 0.0);
    c.get("/ready").await.expect_status(200);
    assert!(refuses(addr), "the server was down throughout");
    assert_not_blocked(&baseline, &outage);

    let n = server_nats.clone();
    tokio::task::spawn_blocking(move || n.start())
        .await
        .unwrap();
    let (after, _) = timed_writes(&c, "after", 5).await;
    let written = before.len() + during.len() + after.len();
    caught_up(&c, "n", written, Duration::from_secs(90)).await;

    let changes = feed(&c).await;
    let fed: Vec<&str> = changes.iter().map(|c| c["id"].as_str().unwrap()).collect();
    let written: Vec<&str> = before
        .iter()
        .chain(&during)
        .chain(&after)
        .map(String::as_str)
        .collect();
    assert_eq!(fed, written, "every acknowledged write, once, in order");
    let stored = read_stream(&nats_url, &format!("O{run}")).await;
    let delivered: BTreeSet<String> = stored.iter().map(|s| s.1.clone()).collect();
    assert_eq!(
        delivered,
        change_ids(&changes),
        "every change after the restart"
    );
    server.stop_gracefully();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_relays_resume_and_deliver_every_stored_version() {
    let run = run_id();
    let (brokers, url) = (kafka(), nats());
    let (_dir, config) = farm_with(&format!(
        r#"
[[changes.relay]]
name = "k"
type = "kafka"
brokers = "{brokers}"
topic_prefix = "x{run}."
batch = 50

[[changes.relay]]
name = "n"
type = "nats"
url = "{url}"
subject_prefix = "x{run}.changes"
stream = "X{run}"
batch = 50
"#
    ));
    let data = tempfile::tempdir().unwrap();
    let server = Server::start_with_data_dir(&config, data.path(), &[]);
    let acknowledged = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..6 {
        let c = server.client();
        let (acknowledged, stop) = (acknowledged.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) && i < 5_000 {
                let Ok(r) = tokio::time::timeout(
                    Duration::from_secs(5),
                    c.post_json("/farm/api", &json!({ "name": format!("k{w}-{i}") })),
                )
                .await
                else {
                    return;
                };
                if r.status != 201 {
                    return;
                }
                acknowledged
                    .lock()
                    .unwrap()
                    .push(r.json()["id"].as_str().unwrap().to_owned());
                i += 1;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let status = Command::new("kill")
        .args(["-9", &server.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        let _ = w.await;
    }
    drop(server);
    let acknowledged = acknowledged.lock().unwrap().clone();
    assert!(acknowledged.len() > 50, "load ran: {}", acknowledged.len());

    let server = Server::start_with_data_dir(&config, data.path(), &[]);
    let c = server.client();
    caught_up(&c, "k", acknowledged.len(), Duration::from_secs(90)).await;
    caught_up(&c, "n", acknowledged.len(), Duration::from_secs(90)).await;
    let changes = feed(&c).await;
    let stored = change_ids(&changes);
    let stored_ids: BTreeSet<&str> = changes.iter().map(|c| c["id"].as_str().unwrap()).collect();
    for id in &acknowledged {
        assert!(
            stored_ids.contains(id.as_str()),
            "acknowledged {id} is stored"
        );
    }

    let got = consume_kafka(&brokers, &[format!("x{run}.farm")], stored.clone()).await;
    let delivered: BTreeSet<String> = got.iter().map(|m| m.headers["change_id"].clone()).collect();
    assert_eq!(
        delivered, stored,
        "Kafka: de-duplicated by change_id = the stored versions"
    );
    assert!(got.len() >= stored.len());

    let in_stream = read_stream(&url, &format!("X{run}")).await;
    let delivered: BTreeSet<String> = in_stream.iter().map(|s| s.1.clone()).collect();
    assert_eq!(
        delivered, stored,
        "NATS: de-duplicated by change_id = the stored versions"
    );
    eprintln!(
        "kill -9: {} stored versions; Kafka held {} messages, JetStream {}",
        stored.len(),
        got.len(),
        in_stream.len()
    );
    server.stop_gracefully();
}

/// The JSON-lines relay through the binary: every change of the feed becomes one line of the
/// file under the data directory, in the feed's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_change_reaches_a_json_lines_file() {
    let (_dir, config) = farm_with(
        "[[changes.relay]]\nname = \"audit\"\ntype = \"jsonl\"\npath = \"audit/changes.jsonl\"\n",
    );
    let server = Server::start(&config, &[]);
    let c = server.client();
    some_writes(&c).await;
    // the hub copies writes into the log a moment after they are acknowledged: wait for all
    // five, then read the feed the file is compared with
    caught_up(&c, "audit", 5, Duration::from_secs(30)).await;
    let changes = feed(&c).await;
    assert_eq!(changes.len(), 5);
    let file = server.data_dir().join("audit/changes.jsonl");
    let text = std::fs::read_to_string(&file).expect("the relay wrote its file");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let positions: Vec<u64> = lines
        .iter()
        .map(|v| v["position"].as_u64().unwrap())
        .collect();
    let expected: Vec<u64> = changes
        .iter()
        .map(|v| v["position"].as_u64().unwrap())
        .collect();
    assert_eq!(
        positions, expected,
        "one line per change, in the feed's order"
    );
    assert_eq!(change_ids(&lines), change_ids(&changes));
}
