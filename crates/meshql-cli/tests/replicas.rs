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

/// Tests that pause the standby's replay take turns (a paused standby stalls the others).
static STANDBY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Replay paused on the standby until dropped (also when the test fails on the way).
struct ReplayPaused<'a>(&'a str);

impl<'a> ReplayPaused<'a> {
    fn start(replica: &'a str) -> Self {
        psql(replica, "SELECT pg_wal_replay_pause()");
        ReplayPaused(replica)
    }
}

impl Drop for ReplayPaused<'_> {
    fn drop(&mut self) {
        psql(self.0, "SELECT pg_wal_replay_resume()");
    }
}

/// The standby's URL for the database `primary` names.
fn on_standby(primary: &str) -> String {
    let replica_base =
        meshql_conformance::test_server_url("postgres-replica", "MESHQL_TEST_POSTGRES_REPLICA_URL");
    let (_, database) = primary.rsplit_once('/').unwrap();
    let (replica_server, _) = replica_base.rsplit_once('/').unwrap();
    format!("{replica_server}/{database}")
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
    let _turn = STANDBY.lock().await;
    let primary = common::fresh_postgres_database();
    let replica = on_standby(&primary);
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
    let paused = ReplayPaused::start(&replica);
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
    drop(paused);
    until("the standby catches up", async || {
        let r = c.get(&format!("/farm/api/{late_id}")).await;
        r.status == 200 && r.json()["name"] == "Late, renamed"
    })
    .await;
}

/// `meshql serve --role write|read` of one config on the primary and its standby: the write
/// process reads what it writes at once (the primary); the read process serves the standby,
/// so with replay paused it does not see a new write, and sees it once replay resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_write_role_reads_the_primary_and_the_read_role_the_standby() {
    let _turn = STANDBY.lock().await;
    let primary = common::fresh_postgres_database();
    let replica = on_standby(&primary);
    let dir = common::example_copy("farm-cqrs", |t| {
        let t = t.replace(
            "type = \"sqlite\"\nfile = \"farm-cqrs.db\"",
            "type = \"postgres\"\nurl = \"${DATABASE_URL}\"\nread_url = \"${DATABASE_READ_URL}\"",
        );
        assert!(t.contains("read_url = "), "the storage block was replaced");
        t
    });
    let config = dir.path().join("meshql.toml");
    let data = tempfile::tempdir().unwrap();
    let read_port = common::free_port();
    let envs = [
        ("DATABASE_URL", primary.clone()),
        ("DATABASE_READ_URL", replica.clone()),
        ("READ_SERVICE_URL", format!("http://127.0.0.1:{read_port}")),
    ];
    let write = Server::start_sharing(&config, data.path(), &["--role", "write"], &envs, None);
    let read = Server::start_sharing(
        &config,
        data.path(),
        &["--role", "read"],
        &envs,
        Some(read_port),
    );
    let (w, r) = (write.client(), read.client());
    let farm = w.post_json("/farm/api", &json!({"name": "Emerdale"})).await;
    farm.expect_status(201);
    let farm = farm.json()["id"].as_str().unwrap().to_owned();
    until("the standby has the farm", async || {
        r.get(&format!("/farm/api/{farm}")).await.status == 200
    })
    .await;

    let paused = ReplayPaused::start(&replica);
    let coop = w
        .post_json("/coop/api", &json!({"name": "red", "farm_id": farm}))
        .await;
    coop.expect_status(201);
    let coop = coop.json()["id"].as_str().unwrap().to_owned();
    // the write process reads its write at once, from the primary
    assert_eq!(
        w.get(&format!("/coop/api/{coop}")).await.json()["name"],
        "red"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    r.get(&format!("/coop/api/{coop}")).await.expect_status(404);
    let graph = r
        .post_json(
            "/farm/graph",
            &json!({"query": format!(r#"{{ getById(id: "{farm}") {{ name coops {{ name }} }} }}"#)}),
        )
        .await;
    assert_eq!(
        graph.json()["data"]["getById"],
        json!({"name": "Emerdale", "coops": []}),
        "{}",
        graph.text
    );

    drop(paused);
    until("the read process sees the coop", async || {
        let graph = r
            .post_json(
                "/farm/graph",
                &json!({"query": format!(r#"{{ getById(id: "{farm}") {{ coops {{ name }} }} }}"#)}),
            )
            .await;
        graph.json()["data"]["getById"]["coops"] == json!([{"name": "red"}])
    })
    .await;
}
