//! Processors reading a NATS JetStream stream (`source = { type = "nats" }`) through the
//! binary, against a real nats-server: one meshql publishes its events with a NATS relay,
//! another runs the enrichment processor on that stream; every event is processed exactly
//! once across `kill -9` of the consumer, and the consumer resumes at the stream sequence
//! its outputs committed (it neither reads a committed message again nor skips one). A
//! server whose NATS is down at start serves anyway, and its processor catches up once NATS
//! is up.
//!
//! The shared server comes from `scripts/services/nats.sh` (or `MESHQL_TEST_NATS_URL`); the
//! outage test runs one of its own on another port. A test fails when it cannot have one.

mod common;

use common::{
    check_error_line, example_copy, processed_once, spawn_process, Client, OwnService, Server,
};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn nats() -> String {
    meshql_conformance::test_server_url("nats", "MESHQL_TEST_NATS_URL")
}

/// A short id that keeps this run's subjects and streams apart from other runs'.
fn run_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..8].to_owned()
}

/// The events example whose processor reads `source` (a TOML inline table) instead of the
/// service's own change log.
fn consumer_of(source: &str) -> tempfile::TempDir {
    example_copy("events", |t| {
        assert!(t.contains("output = \"processedevent\"\n"));
        t.replace(
            "output = \"processedevent\"\n",
            &format!("output = \"processedevent\"\nsource = {source}\n"),
        )
    })
}

/// POSTs events (`<prefix>-<n>`, with `data`) until `stop`, 3,000 at most; how many it POSTed.
fn post_events(
    c: Client,
    stop: Arc<AtomicBool>,
    prefix: &'static str,
    data: &'static str,
) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) && n < 3000 {
            let body = json!({"name": format!("{prefix}-{n}"), "data": data, "timestamp": "2026-11-27T10:00:00Z"});
            c.post_json("/event/api", &body).await.expect_status(201);
            n += 1;
        }
        n
    })
}

/// The ids of the events a server stores.
async fn event_ids(c: &Client) -> BTreeSet<String> {
    c.list("/event/api")
        .await
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect()
}

/// A series of the events processor in `/metrics` (`None`: not there).
async fn processor_metric(c: &Client, series: &str) -> Option<f64> {
    let prefix = format!(
        "{series}{{processor=\"events-processor\",type=\"rust\",output=\"processedevent\"}} "
    );
    c.get("/metrics")
        .await
        .text
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map(|v| v.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_processor_reads_a_nats_relay_once_across_kill_9() {
    let run = run_id();
    let url = nats();
    let publisher = example_copy("events", |t| {
        format!(
            "{t}\n[[changes.relay]]\nname = \"nats\"\ntype = \"nats\"\nurl = \"{url}\"\nsubject_prefix = \"n{run}.changes\"\nstream = \"N{run}\"\n"
        )
    });
    let consumer = consumer_of(&format!(
        "{{ type = \"nats\", url = \"{url}\", stream = \"N{run}\", subjects = [\"n{run}.changes.event\"] }}"
    ));
    let a = Server::start(&publisher.path().join("meshql.toml"), &["--no-processors"]);
    let data = tempfile::tempdir().unwrap();
    let b_config = consumer.path().join("meshql.toml");
    let mut b = Server::start_with_data_dir(&b_config, data.path(), &[]);

    let stop = Arc::new(AtomicBool::new(false));
    let writer = post_events(a.client(), stop.clone(), "n", "{\"user_id\":\"u\"}");
    // the consumer has committed some batches when it is killed
    let deadline = Instant::now() + Duration::from_secs(30);
    while b.client().list("/processedevent/api").await.len() < 20 {
        assert!(
            Instant::now() < deadline,
            "the consumer processed nothing: {}",
            b.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    b.signal("KILL");
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
    // the load runs on until the restarted consumer has applied events of its own
    let deadline = Instant::now() + Duration::from_secs(30);
    while processor_metric(&b.client(), "meshql_processor_inputs_total")
        .await
        .unwrap_or(0.0)
        < 1.0
    {
        assert!(
            Instant::now() < deadline,
            "the restarted consumer applied nothing: {}",
            b.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let written = writer.await.unwrap();
    assert!(written > committed, "the load ran on ({written} events)");

    // every event of the publisher is processed exactly once by the consumer
    let events = event_ids(&a.client()).await;
    assert_eq!(events.len() as u64, written);
    let bc = b.client();
    processed_once(&bc, &events, Duration::from_secs(60)).await;
    // the restarted consumer read on at the committed sequence: it applied exactly the
    // events the killed one had not committed
    let inputs = processor_metric(&bc, "meshql_processor_inputs_total")
        .await
        .expect("the processor's series");
    assert_eq!(
        committed + inputs as u64,
        written,
        "{committed} committed before the kill, {inputs} applied after it, {written} events"
    );
    assert_eq!(
        processor_metric(&bc, "meshql_processor_dead_letters").await,
        Some(0.0)
    );
}

/// The same stream read by `meshql process` beside a server that runs no processor (SQLite
/// shared between them), killed (-9) mid-stream and started again: still every event once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meshql_process_reads_a_nats_stream_once_across_kill_9() {
    let run = run_id();
    let url = nats();
    let publisher = example_copy("events", |t| {
        format!(
            "{t}\n[[changes.relay]]\nname = \"nats\"\ntype = \"nats\"\nurl = \"{url}\"\nsubject_prefix = \"p{run}.changes\"\nstream = \"P{run}\"\n"
        )
    });
    let consumer = example_copy("events", |t| {
        let source = format!(
            "{{ type = \"nats\", url = \"{url}\", stream = \"P{run}\", subjects = [\"p{run}.changes.event\"] }}"
        );
        t.replace(
            "output = \"processedevent\"\n",
            &format!("output = \"processedevent\"\nsource = {source}\n"),
        )
        .replace(
            "file = \"events.db\"",
            "file = \"events.db\"\nexclusive = false",
        )
    });
    let a = Server::start(&publisher.path().join("meshql.toml"), &["--no-processors"]);
    let data = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let b_config = consumer.path().join("meshql.toml");
    let b = Server::start_with_data_dir(&b_config, data.path(), &["--no-processors"]);
    let mut process = spawn_process(&b_config, data.path(), &logs.path().join("p0.log"));

    let stop = Arc::new(AtomicBool::new(false));
    let writer = post_events(a.client(), stop.clone(), "p", "{}");
    let bc = b.client();
    let deadline = Instant::now() + Duration::from_secs(30);
    while bc.list("/processedevent/api").await.len() < 20 {
        let log = std::fs::read_to_string(logs.path().join("p0.log")).unwrap_or_default();
        assert!(
            Instant::now() < deadline,
            "`meshql process` processed nothing: {log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    process.kill().unwrap();
    process.wait().unwrap();
    let at_kill = bc.list("/processedevent/api").await.len();
    let mut process = spawn_process(&b_config, data.path(), &logs.path().join("p1.log"));
    // the load runs on until the new process has committed events of its own
    let deadline = Instant::now() + Duration::from_secs(30);
    while bc.list("/processedevent/api").await.len() <= at_kill {
        let log = std::fs::read_to_string(logs.path().join("p1.log")).unwrap_or_default();
        assert!(
            Instant::now() < deadline,
            "the restarted `meshql process` processed nothing: {log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let written = writer.await.unwrap();
    let events = event_ids(&a.client()).await;
    assert_eq!(events.len() as u64, written);
    processed_once(&bc, &events, Duration::from_secs(60)).await;
    process.kill().unwrap();
    process.wait().unwrap();
}

/// A change as a meshql NATS relay publishes it.
fn change(entity: &str, id: &str, n: u64) -> Value {
    let created_at = 1_700_000_000_000 + n as i64;
    json!({
        "position": n,
        "change_id": format!("{entity}:{id}:{created_at}"),
        "entity": entity,
        "id": id,
        "created_at": created_at,
        "op": "create",
        "authorized_tokens": [],
        "correlation_id": null,
        "source": "0.1",
        "payload": {"id": id, "name": format!("d-{n}"), "data": "{}", "timestamp": "2026-11-27T10:00:00Z"},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_nats_is_down_at_start_serves_and_catches_up() {
    let own = OwnService::new("nats", "MESHQL_NATS_PORT", 14323);
    own.stop();
    let url = own.url();
    let run = run_id();
    let consumer = consumer_of(&format!(
        "{{ type = \"nats\", url = \"{url}\", stream = \"D{run}\" }}"
    ));
    let b = Server::start(&consumer.path().join("meshql.toml"), &[]);
    let c = b.client();
    // it serves: reads, writes, readiness
    c.get("/ready").await.expect_status(200);
    c.post_json(
        "/event/api",
        &json!({"name": "local", "data": "{}", "timestamp": "2026-11-27T10:00:00Z"}),
    )
    .await
    .expect_status(201);
    assert_eq!(c.list("/event/api").await.len(), 1);
    // and counts the source's failures
    let deadline = Instant::now() + Duration::from_secs(30);
    while processor_metric(&c, "meshql_processor_errors_total")
        .await
        .unwrap_or(0.0)
        < 1.0
    {
        assert!(Instant::now() < deadline, "no error counted: {}", b.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // NATS comes up; the stream fills
    assert_eq!(own.start(), url);
    let client = async_nats::connect(url.as_str())
        .await
        .expect("the test's nats-server");
    let js = async_nats::jetstream::new(client);
    js.create_stream(async_nats::jetstream::stream::Config {
        name: format!("D{run}"),
        subjects: vec![format!("d{run}.changes.>")],
        ..Default::default()
    })
    .await
    .unwrap();
    let mut ids = BTreeSet::new();
    for n in 0..40u64 {
        let id = format!("00000000-0000-4000-8000-{n:012}");
        let body = change("event", &id, n);
        js.publish(format!("d{run}.changes.event"), body.to_string().into())
            .await
            .unwrap()
            .await
            .unwrap();
        ids.insert(id);
        if n == 10 {
            // another entity's change, and a message that is no change at all
            for (subject, body) in [
                ("hen", change("hen", "h1", 100).to_string()),
                ("event", "not json".to_owned()),
            ] {
                js.publish(format!("d{run}.changes.{subject}"), body.into())
                    .await
                    .unwrap()
                    .await
                    .unwrap();
            }
        }
    }
    processed_once(&c, &ids, Duration::from_secs(90)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while processor_metric(&c, "meshql_processor_dead_letters").await != Some(1.0) {
        assert!(
            Instant::now() < deadline,
            "the bad message is a dead letter"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        processor_metric(&c, "meshql_processor_inputs_total").await,
        Some(40.0)
    );
}

/// `meshql check` on a bad NATS source names the file, the source's line and the field.
#[test]
fn check_names_file_line_and_field_of_a_bad_nats_source() {
    for (source, field, needle) in [
        (
            "{ type = \"nats\", url = \"nats://127.0.0.1:4222\", stream = \"a.b\" }",
            "source.stream",
            "`a.b` is not a stream name",
        ),
        (
            "{ type = \"nats\", url = \"nats://127.0.0.1:4222\", stream = \"S\", subjects = [\"a.>.b\"] }",
            "source.subjects[0]",
            "not a subject filter",
        ),
        (
            "{ type = \"nats\", url = \"nats://127.0.0.1:4222\", stream = \"S\", format = \"avro\" }",
            "source.format",
            "avro",
        ),
        (
            "{ type = \"pulsar\", url = \"pulsar://h\" }",
            "source.type",
            "unknown source `pulsar` (this build has: kafka, nats",
        ),
    ] {
        let dir = consumer_of(source);
        let config = dir.path().join("meshql.toml");
        let text = std::fs::read_to_string(&config).unwrap();
        let at = text
            .lines()
            .position(|l| l.starts_with("source = "))
            .expect("the source line")
            + 1;
        let line = check_error_line(&config, needle);
        assert!(
            line.contains(&format!("meshql.toml:{at}: processor[0] \"events-processor\".{field}:")),
            "line {at}, {field} in {line}"
        );
    }
}
