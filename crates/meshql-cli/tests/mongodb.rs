//! meshql on a MongoDB-wire server (FerretDB) through the binary: REST round trips, and the
//! failure behaviour users rely on — server down at start-up and recovery without restart,
//! a connection lost before a write's insert is sent and after it (its acknowledgement lost:
//! stored once with one change, or not at all), pool exhaustion answered 503 after a
//! bounded wait. The network faults go through a proxy the test pauses, holds and cuts
//! ([`FaultProxy`]).

mod common;

use common::fault_proxy::FaultProxy;
use common::{examples_dir, Client, Server};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

fn egg_economy_on(uri: String) -> Server {
    Server::start_with_env(
        &examples_dir().join("egg-economy/meshql-mongo.toml"),
        &[
            ("MONGO_URI", uri),
            ("PREFIX", common::fresh_mongo_database()),
        ],
        None,
    )
}

/// The test server's address (`mongodb://host:port/` → `host:port`).
fn mongo_addr() -> SocketAddr {
    let url = common::mongo_url();
    let hostport = url
        .trim_start_matches("mongodb://")
        .split(['/', '?'])
        .next()
        .unwrap()
        .to_owned();
    hostport.parse().expect("a host:port address")
}

async fn proxy() -> FaultProxy {
    FaultProxy::start(mongo_addr()).await
}

fn uri_of(proxy: &FaultProxy) -> String {
    format!("mongodb://{}/", proxy.addr())
}

#[tokio::test]
async fn rest_round_trip_on_mongodb_wire() {
    let server = egg_economy_on(common::mongo_url());
    let c = server.client();
    let r = c
        .post_json(
            "/farm/api",
            &json!({"name": "Emerdale", "farm_type": "megafarm", "zone": "north"}),
        )
        .await;
    r.expect_status(201);
    let id = r.json()["id"].as_str().unwrap().to_owned();
    c.put_json(
        &format!("/farm/api/{id}"),
        &json!({"name": "Renamed", "farm_type": "megafarm", "zone": "south"}),
    )
    .await
    .expect_status(200);
    let list = c.list("/farm/api").await;
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["name"], "Renamed");
    c.post_json("/farm/api", &json!({"name": "x"}))
        .await
        .expect_status(400);
    assert_eq!(c.list("/farm/api").await.len(), 1);
    let r = c
        .post_json(
            "/farm/graph",
            &json!({"query": "{ getByZone(zone: \"north\") { name } }"}),
        )
        .await;
    assert_eq!(r.json(), json!({"data": {"getByZone": []}}));
    c.delete(&format!("/farm/api/{id}"))
        .await
        .expect_status(200);
    c.get(&format!("/farm/api/{id}")).await.expect_status(404);
}

#[tokio::test]
async fn server_down_at_start_then_back_without_restart() {
    let port = common::free_port();
    let started = Instant::now();
    let server = egg_economy_on(format!("mongodb://127.0.0.1:{port}/"));
    // all 13 entities on one unreachable server: each is reported (from one shared
    // reachability check, one driver timeout); the time is printed, not asserted (the
    // machine may be busy)
    eprintln!(
        "start-up against an unreachable server took {:?}",
        started.elapsed()
    );
    assert_eq!(
        server
            .log()
            .matches("storage unreachable at start-up")
            .count(),
        13,
        "{}",
        server.log()
    );
    let c = server.client();
    let ready = c.get("/ready").await;
    ready.expect_status(503);
    assert!(ready.text.contains("farm"), "{}", ready.text);
    let r = c.get("/farm/api").await;
    r.expect_status(503);
    assert!(
        r.json()["error"].as_str().unwrap().contains("MongoDB"),
        "{}",
        r.text
    );

    // the server comes up on that port (a second FerretDB, same binary, own data)
    let script = examples_dir().join("../scripts/services/ferretdb.sh");
    let bin = Command::new("bash")
        .arg(&script)
        .arg("bin")
        .output()
        .unwrap();
    assert!(
        bin.status.success(),
        "{}",
        String::from_utf8_lossy(&bin.stderr)
    );
    let bin = String::from_utf8_lossy(&bin.stdout).trim().to_owned();
    let run = |action: &str| {
        Command::new("bash")
            .arg(&script)
            .arg(action)
            .env("MESHQL_FERRETDB_PORT", port.to_string())
            .env("MESHQL_FERRETDB_BIN", &bin)
            .output()
            .unwrap()
    };
    let start = run("start");
    assert!(
        start.status.success(),
        "{}",
        String::from_utf8_lossy(&start.stderr)
    );

    let deadline = Instant::now() + Duration::from_secs(30);
    let recovered = loop {
        if c.get("/ready").await.status == 200 {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let r = c
        .post_json(
            "/farm/api",
            &json!({"name": "late", "farm_type": "megafarm", "zone": "north"}),
        )
        .await;
    let list = c.list("/farm/api").await;
    run("destroy");
    assert!(recovered, "meshql did not recover after the server came up");
    r.expect_status(201);
    assert_eq!(list.len(), 1);
}

/// Every farm change in `/_changes`, in order.
async fn farm_changes(c: &Client) -> Vec<Value> {
    let mut out = Vec::new();
    let mut since = 0;
    loop {
        let r = c
            .get(&format!("/_changes?since={since}&limit=1000&entity=farm"))
            .await;
        r.expect_status(200);
        let body = r.json();
        let page = body["changes"].as_array().unwrap().clone();
        let last = body["last"].as_u64().unwrap();
        out.extend(page);
        if last == since {
            return out;
        }
        since = last;
    }
}

/// The documents (`field` empty) or changes (`field` = `"payload"`) named `name`.
fn named<'a>(items: &'a [Value], name: &str, field: &str) -> Vec<&'a Value> {
    items
        .iter()
        .filter(|v| {
            let v = if field.is_empty() { v } else { &v[field] };
            v["name"] == name
        })
        .collect()
}

/// After an interrupted write of a farm named `doomed` and a later write named `after`
/// (begun once the interrupted one was answered): waits until `/_changes` holds `after`
/// (the feed is in order for writes that began after another was acknowledged, so by then
/// it holds whatever the interrupted write left), then asserts the contract of a write
/// whose acknowledgement may have been lost: the farm is stored exactly once with exactly
/// one change, or absent with no change; `kept` and `after` once each; no change without
/// its document. The removal of a version whose insert may have been applied can finish in
/// the background, so this waits up to 20 s for the store and the feed to agree. Whether
/// the interrupted write was stored.
async fn assert_stored_once_or_not_at_all(c: &Client, doomed: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let changes = farm_changes(c).await;
        let listed = c.list("/farm/api").await;
        let have_after = !named(&changes, "after", "payload").is_empty();
        let (docs, fed) = (
            named(&listed, doomed, ""),
            named(&changes, doomed, "payload"),
        );
        let consistent = match (docs.len(), fed.len()) {
            (0, 0) => true,
            (1, 1) => docs[0]["id"] == fed[0]["id"] && fed[0]["op"] == "create",
            _ => false,
        };
        if have_after && consistent {
            for name in ["kept", "after"] {
                assert_eq!(named(&listed, name, "").len(), 1, "{name}: {listed:?}");
                assert_eq!(
                    named(&changes, name, "payload").len(),
                    1,
                    "{name}: {changes:?}"
                );
            }
            let listed_ids: BTreeSet<&str> =
                listed.iter().map(|d| d["id"].as_str().unwrap()).collect();
            let fed_ids: BTreeSet<&str> =
                changes.iter().map(|c| c["id"].as_str().unwrap()).collect();
            assert_eq!(changes.len(), fed_ids.len(), "no change twice: {changes:?}");
            assert_eq!(fed_ids, listed_ids, "a change for each document, no other");
            return docs.len() == 1;
        }
        assert!(
            Instant::now() < deadline,
            "the interrupted write left {} documents and {} changes (the feed {} `after`):\n\
             documents {listed:?}\nchanges {changes:?}",
            docs.len(),
            fed.len(),
            if have_after { "holds" } else { "lacks" }
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the service answers reads again (after a cut), then writes a farm `after`.
async fn recover_and_write_after(c: &Client) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = c.get("/farm/api").await;
        if r.status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "no recovery: {}", r.text);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.post_json(
        "/farm/api",
        &json!({"name": "after", "farm_type": "megafarm", "zone": "north"}),
    )
    .await
    .expect_status(201);
}

// the proxy runs on the test runtime, also while `Server::start` blocks its thread
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_lost_before_the_insert_answers_503_and_writes_nothing() {
    let proxy = proxy().await;
    let server = egg_economy_on(uri_of(&proxy));
    let c = server.client();
    c.post_json(
        "/farm/api",
        &json!({"name": "kept", "farm_type": "megafarm", "zone": "north"}),
    )
    .await
    .expect_status(201);

    // the next write is on the wire when the network fails, before its version is sent: its
    // first request draws its change-feed positions (`$inc` on the feed clock), and is held
    // with its connection
    proxy.hold_request_with(b"$inc");
    let writer = server.client();
    let doomed = tokio::spawn(async move {
        writer
            .post_json(
                "/farm/api",
                &json!({"name": "doomed", "farm_type": "megafarm", "zone": "north"}),
            )
            .await
    });
    proxy
        .until_request_held(b"$inc", Duration::from_secs(10))
        .await;
    assert!(
        !doomed.is_finished(),
        "the write should be waiting on the wire"
    );
    proxy.cut();
    let r = doomed.await.unwrap();
    r.expect_status(503);
    assert!(
        r.json()["error"].as_str().unwrap().contains("MongoDB"),
        "{}",
        r.text
    );
    common::assert_interrupted_write_left_nothing(&c).await;
    assert!(
        !assert_stored_once_or_not_at_all(&c, "doomed").await,
        "a write cut before its insert is not stored"
    );
}

// the proxy runs on the test runtime, also while `Server::start` blocks its thread
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_lost_after_the_insert_was_sent_answers_503_and_stores_it_once_or_not_at_all()
{
    let proxy = proxy().await;
    let server = egg_economy_on(uri_of(&proxy));
    let c = server.client();
    c.post_json(
        "/farm/api",
        &json!({"name": "kept", "farm_type": "megafarm", "zone": "north"}),
    )
    .await
    .expect_status(201);

    // the next write's insert (the only request carrying its payload) reaches the server,
    // which stores the version and answers; the answer is held, and the connection cut
    // before it reaches meshql: the acknowledgement is lost
    proxy.hold_reply_to_request_with(b"doomed");
    let writer = server.client();
    let doomed = tokio::spawn(async move {
        writer
            .post_json(
                "/farm/api",
                &json!({"name": "doomed", "farm_type": "megafarm", "zone": "north"}),
            )
            .await
    });
    proxy
        .until_request_held(b"doomed", Duration::from_secs(10))
        .await;
    proxy.until_reply_held(Duration::from_secs(10)).await;
    // the server applied the insert: its (held) answer is `{n: 1, ok: 1.0}`
    let reply = proxy.held_reply();
    let has = |bytes: &[u8]| reply.windows(bytes.len()).any(|w| w == bytes);
    assert!(
        has(b"\x10n\x00\x01\x00\x00\x00") && !has(b"writeErrors"),
        "the insert's reply: {:?}",
        String::from_utf8_lossy(&reply)
    );
    assert!(
        !doomed.is_finished(),
        "the write should be waiting for the server's answer"
    );
    proxy.cut();
    let r = doomed.await.unwrap();
    r.expect_status(503);
    assert!(
        r.json()["error"].as_str().unwrap().contains("MongoDB"),
        "{}",
        r.text
    );
    recover_and_write_after(&c).await;
    let stored = assert_stored_once_or_not_at_all(&c, "doomed").await;
    eprintln!(
        "a write whose acknowledgement was lost: {}",
        if stored {
            "stored once, one change"
        } else {
            "absent, no change (its version removed again)"
        }
    );
}

// the proxy runs on the test runtime, also while `Server::start` blocks its thread
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_exhaustion_waits_then_answers_503() {
    let proxy = proxy().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("meshql.toml"),
        format!(
            r#"
[storage.db]
type = "mongo"
uri = "{}"
db = "{}"
pool_size = 1
pool_wait_ms = 200

[[entity]]
name = "thing"
storage = "db"
[entity.rest]
"#,
            uri_of(&proxy),
            common::fresh_mongo_database()
        ),
    )
    .unwrap();
    let server = Server::start(dir.path(), &[]);
    let c = server.client();
    c.post_json("/thing/api", &json!({"name": "x"}))
        .await
        .expect_status(201);

    // one request holds the only connection while the server is slow to answer...
    proxy.pause();
    let slow_client = server.client();
    let slow = tokio::spawn(async move { slow_client.get("/thing/api").await });
    // (the change feed's reader does not take a request's connection: this is the GET)
    c.until_connections_in_use("db", 1).await;
    // ...so this one waits 200 ms for a connection, then gets a clear 503
    let started = Instant::now();
    let r = c.get("/thing/api").await;
    r.expect_status(503);
    assert!(
        r.json()["error"]
            .as_str()
            .is_some_and(|e| e.contains("pool exhausted")),
        "{}",
        r.text
    );
    eprintln!("503 after {:?} (pool_wait_ms = 200)", started.elapsed());
    proxy.resume();
    let slow = slow.await.unwrap();
    slow.expect_status(200);
    assert_eq!(slow.json()[0]["name"], "x");
    // and the service is fine afterwards, every connection back in the pool
    c.get("/thing/api").await.expect_status(200);
    c.until_connections_in_use("db", 0).await;
}
