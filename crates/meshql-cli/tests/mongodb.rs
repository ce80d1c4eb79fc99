//! meshql on a MongoDB-wire server (FerretDB) through the binary: REST round trips, and the
//! failure behaviour users rely on — server down at start-up and recovery without restart,
//! a connection lost mid-request, pool exhaustion answered 503 after a bounded wait. The
//! network faults go through a proxy the test pauses and cuts ([`FaultProxy`]).

mod common;

use common::fault_proxy::FaultProxy;
use common::{examples_dir, Server};
use serde_json::json;
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

// the proxy runs on the test runtime, also while `Server::start` blocks its thread
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_lost_mid_request_answers_503_and_writes_nothing() {
    let proxy = proxy().await;
    let server = egg_economy_on(uri_of(&proxy));
    let c = server.client();
    c.post_json(
        "/farm/api",
        &json!({"name": "kept", "farm_type": "megafarm", "zone": "north"}),
    )
    .await
    .expect_status(201);

    // the next write is on the wire when the network fails: its first request draws its
    // change-feed positions (`$inc` on the feed clock), and is held with its connection
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
