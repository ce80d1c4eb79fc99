//! A real PostgreSQL streaming replica (scripts/services/postgres-replica.sh) as `read_url`,
//! through the binary: the API's reads are served by the standby (a write is readable once the
//! standby has replayed it; with replay paused, reads do not see new writes), while writes —
//! and what they read — go to the primary, so they succeed whatever the standby has replayed.

mod common;

use common::{examples_dir, Server};
use serde_json::{json, Value};
use std::process::Command;
use std::time::{Duration, Instant};

fn psql(url: &str, sql: &str) -> String {
    let out = Command::new("psql")
        .args([url, "-X", "-tAc", sql])
        .output()
        .expect("run psql");
    assert!(
        out.status.success(),
        "psql {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

async fn until(what: &str, mut ok: impl AsyncFnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !ok().await {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{what} within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_come_from_the_standby_and_writes_from_the_primary() {
    let replica_base =
        meshql_conformance::test_server_url("postgres-replica", "MESHQL_TEST_POSTGRES_REPLICA_URL");
    let primary = common::fresh_postgres_database();
    let (_, database) = primary.rsplit_once('/').unwrap();
    let (replica_server, _) = replica_base.rsplit_once('/').unwrap();
    let replica = format!("{replica_server}/{database}");
    // egg-economy on PostgreSQL, each storage reading from the standby
    let dir = tempfile::tempdir().unwrap();
    let source = examples_dir().join("egg-economy");
    for entry in std::fs::read_dir(&source).unwrap() {
        let path = entry.unwrap().path();
        let to = dir.path().join(path.file_name().unwrap());
        if path.is_dir() {
            std::fs::create_dir_all(&to).unwrap();
            for f in std::fs::read_dir(&path).unwrap() {
                let f = f.unwrap().path();
                std::fs::copy(&f, to.join(f.file_name().unwrap())).unwrap();
            }
        } else {
            std::fs::copy(&path, &to).unwrap();
        }
    }
    let config = dir.path().join("meshql-postgres.toml");
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "url = \"${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/eggs}\"",
        "url = \"${DATABASE_URL}\"\nread_url = \"${READ_URL}\"",
    );
    assert!(text.contains("read_url"));
    std::fs::write(&config, text).unwrap();
    let server = Server::start_with_env(
        &config,
        &[
            ("DATABASE_URL", primary.clone()),
            ("READ_URL", replica.clone()),
        ],
        None,
    );
    let c = server.client();
    // the standby gets the tables the server created on the primary
    until("the standby has the tables", async || {
        c.get("/farm/api").await.status == 200
    })
    .await;

    let farm = c
        .post_json(
            "/farm/api",
            &json!({"name": "Emerdale", "farm_type": "megafarm", "zone": "north"}),
        )
        .await;
    farm.expect_status(201);
    let id = farm.json()["id"].as_str().unwrap().to_owned();
    let lag = until("the write is readable from the standby", async || {
        c.get(&format!("/farm/api/{id}")).await.status == 200
    })
    .await;
    eprintln!("a write became readable through the standby after {lag:?}");

    // replay paused: new writes are not readable, but writes (and updates of documents the
    // standby does not have yet) succeed on the primary
    psql(&replica, "SELECT pg_wal_replay_pause()");
    let late = c
        .post_json(
            "/farm/api",
            &json!({"name": "Late", "farm_type": "homestead", "zone": "south"}),
        )
        .await;
    late.expect_status(201);
    let late_id = late.json()["id"].as_str().unwrap().to_owned();
    c.put_json(
        &format!("/farm/api/{late_id}"),
        &json!({"name": "Late, renamed", "farm_type": "homestead", "zone": "south"}),
    )
    .await
    .expect_status(200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    c.get(&format!("/farm/api/{late_id}"))
        .await
        .expect_status(404);
    let graph = c
        .post_json(
            "/farm/graph",
            &json!({"query": format!(r#"{{ getById(id: "{late_id}") {{ name }} }}"#)}),
        )
        .await;
    assert_eq!(
        graph.json()["data"]["getById"],
        Value::Null,
        "{}",
        graph.text
    );
    assert_eq!(
        psql(
            &primary,
            &format!("SELECT count(*) FROM farm WHERE id = '{late_id}'")
        ),
        "2",
        "both versions are on the primary"
    );

    // replay resumed: the standby catches up, and reads see the latest version
    psql(&replica, "SELECT pg_wal_replay_resume()");
    until("the standby catches up", async || {
        let r = c.get(&format!("/farm/api/{late_id}")).await;
        r.status == 200 && r.json()["name"] == "Late, renamed"
    })
    .await;
}
