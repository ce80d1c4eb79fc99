//! meshql on a real PostgreSQL through the binary: REST round trips, and the failure
//! behaviour users rely on (database down at start-up, recovery without restart, pool
//! exhaustion answered 503 after a bounded wait).

mod common;

use common::{examples_dir, Server};
use serde_json::json;
use std::process::Command;
use std::time::{Duration, Instant};

fn egg_economy_on(url: String) -> Server {
    Server::start_with_env(
        &examples_dir().join("egg-economy/meshql-postgres.toml"),
        &[("DATABASE_URL", url)],
        None,
    )
}

#[tokio::test]
async fn rest_round_trip_on_postgres() {
    let server = egg_economy_on(common::fresh_postgres_database());
    let c = server.client();
    let r = c
        .post_json(
            "/farm/api",
            &json!({"name": "Emerdale", "farm_type": "megafarm", "zone": "north"}),
        )
        .await;
    r.expect_status(201);
    let id = r.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(
        c.get(&format!("/farm/api/{id}")).await.json()["name"],
        "Emerdale"
    );
    c.put_json(
        &format!("/farm/api/{id}"),
        &json!({"name": "Renamed", "farm_type": "megafarm", "zone": "south"}),
    )
    .await
    .expect_status(200);
    let list = c.list("/farm/api").await;
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["name"], "Renamed");
    // a rejected write stores nothing
    c.post_json("/farm/api", &json!({"name": "x"}))
        .await
        .expect_status(400);
    assert_eq!(c.list("/farm/api").await.len(), 1);
    c.delete(&format!("/farm/api/{id}"))
        .await
        .expect_status(200);
    c.get(&format!("/farm/api/{id}")).await.expect_status(404);
    c.delete(&format!("/farm/api/{id}"))
        .await
        .expect_status(200);
    let bulk = c
        .post_json(
            "/farm/api/bulk",
            &json!([
                {"name": "a", "farm_type": "homestead", "zone": "n"},
                {"name": "b", "farm_type": "homestead", "zone": "n"}
            ]),
        )
        .await;
    bulk.expect_status(201);
    assert_eq!(c.list("/farm/api").await.len(), 2);
}

#[tokio::test]
async fn database_down_at_start_then_back_without_restart() {
    let port = common::free_port();
    let services = tempfile::tempdir().unwrap();
    let server = egg_economy_on(format!("postgres://postgres@127.0.0.1:{port}/meshql_test"));
    let c = server.client();

    let ready = c.get("/ready").await;
    ready.expect_status(503);
    assert!(ready.text.contains("farm"), "{}", ready.text);
    let r = c.get("/farm/api").await;
    r.expect_status(503);
    assert!(
        r.json()["error"].as_str().unwrap().contains("PostgreSQL"),
        "{}",
        r.text
    );

    // the database comes up on that port
    let script = examples_dir().join("../scripts/services/postgres.sh");
    let start = Command::new("bash")
        .arg(&script)
        .arg("start")
        .env("MESHQL_SERVICES_DIR", services.path())
        .env("MESHQL_PG_PORT", port.to_string())
        .output()
        .unwrap();
    assert!(
        start.status.success(),
        "{}",
        String::from_utf8_lossy(&start.stderr)
    );
    let stop = || {
        let _ = Command::new("bash")
            .arg(&script)
            .arg("stop")
            .env("MESHQL_SERVICES_DIR", services.path())
            .env("MESHQL_PG_PORT", port.to_string())
            .output();
    };

    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if c.get("/ready").await.status == 200 {
            break;
        }
        if Instant::now() > deadline {
            stop();
            panic!("meshql did not recover after the database came up");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let r = c
        .post_json(
            "/farm/api",
            &json!({"name": "late", "farm_type": "megafarm", "zone": "north"}),
        )
        .await;
    let ok = r.status == 201;
    let list = c.list("/farm/api").await;
    stop();
    assert!(ok, "{}", r.text);
    assert_eq!(list.len(), 1);
}

#[tokio::test]
async fn pool_exhaustion_waits_then_answers_503() {
    common::pool_exhaustion_answers_503(
        "postgres",
        &common::fresh_postgres_database(),
        "(SELECT pg_sleep(2)) IS NOT NULL",
    )
    .await;
}

/// psql against `url` with `sql`, returning stdout.
fn psql(url: &str, sql: &str) -> String {
    let out = Command::new("psql")
        .arg(url)
        .args(["-qtAc", sql])
        .output()
        .expect("run psql");
    assert!(
        out.status.success(),
        "psql {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn a_connection_lost_mid_request_answers_503_and_writes_nothing() {
    let url = common::fresh_postgres_database();
    let server = egg_economy_on(url.clone());
    let c = server.client();
    c.post_json(
        "/farm/api",
        &json!({"name": "kept", "farm_type": "megafarm", "zone": "north"}),
    )
    .await
    .expect_status(201);

    // another session locks the farm table, so the next write blocks inside its transaction
    let mut locker = Command::new("psql")
        .arg(&url)
        .args([
            "-qc",
            "BEGIN; LOCK TABLE farm IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(60);",
        ])
        .env("PGAPPNAME", "meshql-test-locker")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start psql");
    let db = url.rsplit('/').next().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(10);
    while psql(
        &url,
        &format!("SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE a.application_name = 'meshql-test-locker' AND a.datname = '{db}' AND l.mode = 'AccessExclusiveLock' AND l.granted"),
    )
    .trim()
        != "1"
    {
        assert!(Instant::now() < deadline, "the locker never got its lock");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let writer = server.client();
    let doomed = tokio::spawn(async move {
        writer
            .post_json(
                "/farm/api",
                &json!({"name": "doomed", "farm_type": "megafarm", "zone": "north"}),
            )
            .await
    });
    // wait until meshql's insert is waiting on the lock (not the change feed's read, which
    // the lock holds up too), then cut meshql's connections
    let deadline = Instant::now() + Duration::from_secs(10);
    let waiting = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = '{db}' AND wait_event_type = 'Lock' AND application_name <> 'meshql-test-locker' AND query ILIKE 'INSERT%'"
    );
    while psql(&url, &waiting).trim() == "0" {
        assert!(
            Instant::now() < deadline,
            "the write never reached the lock"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    psql(
        &url,
        &format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{db}' AND application_name <> 'meshql-test-locker' AND pid <> pg_backend_pid()"
        ),
    );
    let r = doomed.await.unwrap();
    // end the locker's session (killing psql alone leaves its backend asleep with the lock)
    psql(
        &url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'meshql-test-locker'",
    );
    let _ = locker.kill();
    let _ = locker.wait();
    r.expect_status(503);
    assert!(
        r.json()["error"]
            .as_str()
            .is_some_and(|e| e.contains("PostgreSQL")),
        "{}",
        r.text
    );

    // nothing of the interrupted write was stored, and the service carries on
    assert_eq!(
        psql(
            &url,
            "SELECT count(*) FROM farm WHERE payload->>'name' = 'doomed'"
        )
        .trim(),
        "0"
    );
    common::assert_interrupted_write_left_nothing(&c).await;
}
