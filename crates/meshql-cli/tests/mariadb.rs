//! meshql on a real MariaDB through the binary: REST round trips and an unreachable database.

mod common;

use common::{examples_dir, Server};
use serde_json::json;

fn egg_economy_on(url: String) -> Server {
    Server::start_with_env(
        &examples_dir().join("egg-economy/meshql-mysql.toml"),
        &[("DATABASE_URL", url)],
        None,
    )
}

#[tokio::test]
async fn rest_round_trip_on_mariadb() {
    let server = egg_economy_on(common::fresh_mysql_database());
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
    c.post_json("/farm/api", &json!({"name": "x"}))
        .await
        .expect_status(400);
    assert_eq!(c.list("/farm/api").await.len(), 1);
    c.delete(&format!("/farm/api/{id}"))
        .await
        .expect_status(200);
    c.get(&format!("/farm/api/{id}")).await.expect_status(404);
    let r = c
        .post_json(
            "/farm/graph",
            &json!({"query": "{ getByZone(zone: \"south\") { name } }"}),
        )
        .await;
    assert_eq!(r.json(), json!({"data": {"getByZone": []}}));
}

#[tokio::test]
async fn unreachable_database_answers_503() {
    let port = common::free_port();
    let server = egg_economy_on(format!("mysql://meshql:meshql@127.0.0.1:{port}/nowhere"));
    let c = server.client();
    c.get("/ready").await.expect_status(503);
    let r = c.get("/farm/api").await;
    r.expect_status(503);
    assert!(
        r.json()["error"].as_str().unwrap().contains("MySQL"),
        "{}",
        r.text
    );
}

/// The `mariadb` client against the database of `url`, running `sql`.
fn mariadb_cmd(url: &str, sql: &str) -> std::process::Command {
    let rest = url.strip_prefix("mysql://").expect("mysql URL");
    let (creds, host_db) = rest.split_once('@').expect("user@host");
    let (user, password) = creds.split_once(':').unwrap_or((creds, ""));
    let (host_port, db) = host_db.split_once('/').expect("host/db");
    let (host, port) = host_port.split_once(':').unwrap_or((host_port, "3306"));
    let mut cmd = std::process::Command::new("mariadb");
    cmd.args(["-h", host, "-P", port, "-u", user, &format!("-p{password}")])
        .args(["-N", "-B", db, "-e", sql]);
    cmd
}

fn mariadb(url: &str, sql: &str) -> String {
    let out = mariadb_cmd(url, sql)
        .output()
        .expect("run the mariadb client");
    assert!(
        out.status.success(),
        "mariadb {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn a_connection_lost_mid_request_answers_503_and_writes_nothing() {
    use std::time::{Duration, Instant};
    let url = common::fresh_mysql_database();
    let db = url.rsplit('/').next().unwrap().to_owned();
    let server = egg_economy_on(url.clone());
    let c = server.client();
    c.post_json(
        "/farm/api",
        &json!({"name": "kept", "farm_type": "megafarm", "zone": "north"}),
    )
    .await
    .expect_status(201);

    // another session write-locks the farm table, so the next insert blocks mid-request
    let mut locker = mariadb_cmd(&url, "LOCK TABLES farm WRITE; SELECT SLEEP(60);")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the mariadb client");
    let locked = format!(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = '{db}' AND INFO LIKE 'SELECT SLEEP%'"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while mariadb(&url, &locked).trim() != "1" {
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
    let waiting = format!(
        "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = '{db}' AND STATE LIKE 'Waiting for table%' AND INFO LIKE 'INSERT%'"
    );
    // only the insert: the change feed's poller may be waiting on the same lock, and killing
    // it instead would leave the write blocked until the locker lets go
    let deadline = Instant::now() + Duration::from_secs(10);
    let victims = loop {
        let ids = mariadb(&url, &waiting);
        if !ids.trim().is_empty() {
            break ids;
        }
        assert!(
            Instant::now() < deadline,
            "the write never reached the lock"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for id in victims.split_whitespace() {
        mariadb(&url, &format!("KILL {id}"));
    }
    let r = doomed.await.unwrap();
    let _ = locker.kill();
    let _ = locker.wait();
    r.expect_status(503);
    assert!(
        r.json()["error"]
            .as_str()
            .is_some_and(|e| e.contains("MySQL")),
        "{}",
        r.text
    );

    // nothing of the interrupted write was stored, and the service carries on
    assert_eq!(
        mariadb(
            &url,
            "SELECT COUNT(*) FROM farm WHERE JSON_VALUE(payload, '$.name') = 'doomed'"
        )
        .trim(),
        "0"
    );
    common::assert_interrupted_write_left_nothing(&c).await;
}

#[tokio::test]
async fn database_down_at_start_then_back_without_restart() {
    use std::process::Command;
    use std::time::{Duration, Instant};
    let port = common::free_port();
    let services = tempfile::tempdir().unwrap();
    let server = egg_economy_on(format!(
        "mysql://meshql:meshql@127.0.0.1:{port}/meshql_test"
    ));
    let c = server.client();
    c.get("/ready").await.expect_status(503);
    c.get("/farm/api").await.expect_status(503);

    // MariaDB comes up on that port
    let script = examples_dir().join("../scripts/services/mariadb.sh");
    let run = |action: &str| {
        Command::new("bash")
            .arg(&script)
            .arg(action)
            .env("MESHQL_SERVICES_DIR", services.path())
            .env("MESHQL_MARIADB_PORT", port.to_string())
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
    let list = c.get("/farm/api").await;
    let _ = run("stop");
    assert!(recovered, "meshql did not recover after MariaDB came up");
    r.expect_status(201);
    assert_eq!(
        list.json().as_array().map(Vec::len),
        Some(1),
        "{}",
        list.text
    );
}

#[tokio::test]
async fn pool_exhaustion_waits_then_answers_503() {
    common::pool_exhaustion_answers_503(
        "mysql",
        &common::fresh_mysql_database(),
        "(SELECT SLEEP(2)) = 0",
    )
    .await;
}
