//! Declared migrations (`[[entity.migration]]`) through the binary, on SQLite: hens stored
//! under one schema are migrated to the next at start-up — once, as new versions (`at` reads
//! before them unchanged), nothing served until every document is in the new shape — and a
//! run killed with SIGKILL half-way resumes at the next start and writes each document once.
//! `meshql migrate` shows where each migration stands and what the pending ones would do.

mod common;

use common::Server;
use serde_json::{json, Value};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const SCHEMA_V1: &str = r#"{
  "type": "object",
  "properties": {
    "name": { "type": "string" },
    "eggs": { "type": "string" },
    "colour": { "type": "string" }
  },
  "required": ["name"]
}"#;

const SCHEMA_V2: &str = r#"{
  "type": "object",
  "properties": {
    "title": { "type": "string" },
    "eggs": { "type": "integer" },
    "status": { "type": "string", "enum": ["active", "retired"] }
  },
  "required": ["title", "status"],
  "additionalProperties": false
}"#;

fn config(schema: &str, migrations: &str) -> String {
    config_on("type = \"sqlite\"\nfile = \"hens.db\"", schema, migrations)
}

/// The config on the storage `storage` declares (the body of `[storage.main]`).
fn config_on(storage: &str, schema: &str, migrations: &str) -> String {
    format!(
        r#"
port = 3999
data_dir = "data"

[storage.main]
{storage}

[[entity]]
name = "hen"
storage = "main"

[entity.rest]
path = "/hen/api"
schema = "{schema}"
{migrations}
"#
    )
}

/// The two migrations from v1 to v2 (`batch`: documents per transaction).
fn migrations(batch: u32) -> String {
    format!(
        r#"
[[entity.migration]]
name = "name-becomes-title"
rename = {{ name = "title" }}
drop = ["colour"]
batch = {batch}

[[entity.migration]]
name = "eggs-as-integers"
set = {{ eggs = {{ int = "eggs", omit_empty = true }} }}
default = {{ status = "active" }}
batch = {batch}
"#
    )
}

/// A directory holding `v1.toml` and `v2.toml` (with `batch`) and their schemas.
fn configs(batch: u32) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("v1.schema.json"), SCHEMA_V1).unwrap();
    std::fs::write(dir.path().join("v2.schema.json"), SCHEMA_V2).unwrap();
    std::fs::write(dir.path().join("v1.toml"), config("v1.schema.json", "")).unwrap();
    std::fs::write(
        dir.path().join("v2.toml"),
        config("v2.schema.json", &migrations(batch)),
    )
    .unwrap();
    dir
}

fn meshql(args: &[&str]) -> Output {
    Command::new(common::meshql_bin())
        .args(args)
        .output()
        .expect("run meshql")
}

/// What `meshql migrate CONFIG --data-dir DIR --status` prints.
fn status_of(config: &str, data_dir: &str) -> String {
    let out = meshql(&["migrate", config, "--data-dir", data_dir, "--status"]);
    assert!(out.status.success(), "{out:?}");
    stdout(&out)
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Creates `n` hens under schema v1, 1000 per bulk request.
async fn hens(client: &common::Client, n: usize) {
    let mut i = 0;
    while i < n {
        let batch: Vec<Value> = (i..n.min(i + 1000))
            .map(|k| {
                let mut hen = json!({ "name": format!("hen {k}"), "colour": "brown" });
                // every seventh hen never had its eggs counted
                if !k.is_multiple_of(7) {
                    hen["eggs"] = json!(format!("{}", k % 30));
                }
                hen
            })
            .collect();
        i += batch.len();
        common::Client::post_json(client, "/hen/api/bulk", &Value::Array(batch))
            .await
            .expect_status(201);
    }
}

/// Asserts that `doc` is hen `k` in the v2 shape.
fn assert_v2(doc: &Value) {
    let title = doc["title"].as_str().expect("a title");
    let k: usize = title.strip_prefix("hen ").unwrap().parse().unwrap();
    let mut keys: Vec<&str> = doc
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    keys.sort();
    if k.is_multiple_of(7) {
        assert_eq!(keys, ["id", "status", "title"], "{doc}");
    } else {
        assert_eq!(keys, ["eggs", "id", "status", "title"], "{doc}");
        assert_eq!(doc["eggs"], json!((k % 30) as i64), "{doc}");
    }
    assert_eq!(doc["status"], "active", "{doc}");
}

/// `meshql export --history` of the data directory: every version, by document id.
fn history(config: &Path, data_dir: &Path) -> std::collections::BTreeMap<String, Vec<Value>> {
    let file = data_dir.parent().unwrap().join("history.ndjson");
    let out = meshql(&[
        "export",
        config.to_str().unwrap(),
        "--data-dir",
        data_dir.to_str().unwrap(),
        "--history",
        "--out",
        file.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut by_id: std::collections::BTreeMap<String, Vec<Value>> = Default::default();
    for line in std::fs::read_to_string(&file).unwrap().lines().skip(1) {
        let v: Value = serde_json::from_str(line).unwrap();
        by_id
            .entry(v["id"].as_str().unwrap().to_owned())
            .or_default()
            .push(v);
    }
    by_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_run_once_at_start_as_new_versions_and_reads_before_them_are_unchanged() {
    let dir = configs(100);
    let data = tempfile::tempdir().unwrap();
    let (v1, v2) = (dir.path().join("v1.toml"), dir.path().join("v2.toml"));
    let server = Server::start_with_data_dir(&v1, data.path(), &[]);
    let client = server.client();
    hens(&client, 300).await;
    let before = now_ms();
    let old = client.list(&format!("/hen/api?at={before}")).await;
    assert_eq!(old.len(), 300);
    server.stop_gracefully();
    std::thread::sleep(Duration::from_millis(5));

    let data_dir = data.path().to_str().unwrap();
    let status = meshql(&[
        "migrate",
        v2.to_str().unwrap(),
        "--data-dir",
        data_dir,
        "--status",
    ]);
    assert!(status.status.success(), "{status:?}");
    let text = stdout(&status);
    assert!(text.contains("pending  name-becomes-title"), "{text}");
    assert!(text.contains("pending  eggs-as-integers"), "{text}");

    // `check --data` says the stored documents are not in the new shape yet, and why
    let checked = meshql(&[
        "check",
        v2.to_str().unwrap(),
        "--data-dir",
        data_dir,
        "--data",
    ]);
    let text = stdout(&checked);
    assert!(!checked.status.success(), "{text}");
    assert!(
        text.contains("hen: migrations not applied yet (name-becomes-title, eggs-as-integers)")
            && text.contains("300 of 300 documents fail"),
        "{text}"
    );

    // a dry run: a sample's diff, the count, and nothing written
    let dry = meshql(&[
        "migrate",
        v2.to_str().unwrap(),
        "--data-dir",
        data_dir,
        "--dry-run",
        "--sample",
        "2",
    ]);
    let text = stdout(&dry);
    assert!(
        dry.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    assert!(
        text.contains("300 documents read, 300 would get a new version"),
        "{text}"
    );
    for line in [
        "- colour: \"brown\"",
        "- name: \"hen ",
        "+ title: \"hen ",
        "+ status: \"active\"",
    ] {
        assert!(text.contains(line), "`{line}` missing from:\n{text}");
    }
    assert_eq!(
        text.matches("  hen ").count(),
        2,
        "two documents shown:\n{text}"
    );

    let server = Server::start_with_data_dir(&v2, data.path(), &[]);
    let client = server.client();
    let now = client.list("/hen/api").await;
    assert_eq!(now.len(), 300);
    now.iter().for_each(assert_v2);
    // the history before the migration reads as it did
    let mut then = client.list(&format!("/hen/api?at={before}")).await;
    let mut old = old;
    let by_id = |a: &Value, b: &Value| a["id"].as_str().cmp(&b["id"].as_str());
    then.sort_by(by_id);
    old.sort_by(by_id);
    assert_eq!(then, old);
    // writes take the new schema
    client
        .post_json("/hen/api", &json!({ "name": "old shape" }))
        .await
        .expect_status(400);
    server.stop_gracefully();

    let text = status_of(v2.to_str().unwrap(), data_dir);
    assert!(text.contains("applied  name-becomes-title"), "{text}");
    assert!(
        text.contains("applied  eggs-as-integers") && text.contains("(300 documents)"),
        "{text}"
    );

    // a second start runs nothing: two versions per hen, the original and the migrated one
    let server = Server::start_with_data_dir(&v2, data.path(), &[]);
    assert_eq!(server.client().list("/hen/api").await.len(), 300);
    server.stop_gracefully();
    let versions = history(&v2, data.path());
    assert_eq!(versions.len(), 300);
    assert!(versions.values().all(|v| v.len() == 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_killed_half_way_resumes_at_the_next_start_and_writes_each_document_once() {
    const HENS: usize = 20_000;
    // 25 documents per transaction: 800 of them, so the run is still going when it is killed
    let dir = configs(25);
    let data = tempfile::tempdir().unwrap();
    let (v1, v2) = (dir.path().join("v1.toml"), dir.path().join("v2.toml"));
    let server = Server::start_with_data_dir(&v1, data.path(), &[]);
    hens(&server.client(), HENS).await;
    server.stop_gracefully();

    // serve v2, and kill it once its first batches are committed
    let port = common::free_port();
    let log: PathBuf = dir.path().join("serve.log");
    let child = Command::new(common::meshql_bin())
        .args(["serve", v2.to_str().unwrap(), "--port", &port.to_string()])
        .args(["--data-dir", data.path().to_str().unwrap()])
        .args(["--log-level", "warn,meshql_runtime::migrations=debug"])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // killed however the test ends
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Killed(child);
    let deadline = Instant::now() + Duration::from_secs(120);
    let read_log = || {
        let mut s = String::new();
        std::fs::File::open(&log)
            .unwrap()
            .read_to_string(&mut s)
            .unwrap();
        s
    };
    while read_log().matches("migration batch committed").count() < 3 {
        assert!(Instant::now() < deadline, "no progress:\n{}", read_log());
        assert!(
            child.0.try_wait().unwrap().is_none(),
            "it exited:\n{}",
            read_log()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // nothing is served while the entity is half-migrated
    let probe = std::net::TcpStream::connect(("127.0.0.1", port));
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    assert!(probe.is_err(), "the port answered during the migration");
    let text = read_log();
    assert!(
        !text.contains("migrations applied"),
        "the run finished before the kill:\n{text}"
    );

    let text = status_of(v2.to_str().unwrap(), data.path().to_str().unwrap());
    assert!(text.contains("running  name-becomes-title"), "{text}");
    assert!(text.contains("interrupted"), "{text}");

    // the next start resumes, and serves once every document is migrated
    let server = Server::start_with_data_dir(&v2, data.path(), &["--log-level", "info"]);
    assert!(
        server.log().contains("resumed=true"),
        "the run resumed:\n{}",
        server.log()
    );
    let now = server.client().list("/hen/api").await;
    assert_eq!(now.len(), HENS);
    now.iter().for_each(assert_v2);
    server.stop_gracefully();
    // each document written once by the migration: its original and one migrated version
    let versions = history(&v2, data.path());
    assert_eq!(versions.len(), HENS);
    let twice: Vec<&String> = versions
        .iter()
        .filter(|(_, v)| v.len() != 2)
        .map(|(id, _)| id)
        .collect();
    assert!(
        twice.is_empty(),
        "{} documents without exactly 2 versions",
        twice.len()
    );
}

#[test]
fn a_migration_that_cannot_be_right_is_refused_with_its_line_and_field() {
    let dir = configs(100);
    let bad = config(
        "v2.schema.json",
        r#"
[[entity.migration]]
name = "typo"
rename = { name = "titel" }
"#,
    );
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, bad).unwrap();
    let out = meshql(&["check", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr).into_owned() + &stdout(&out);
    assert!(
        text.contains("bad.toml:19")
            && text.contains("migration[0] \"typo\".rename.name")
            && text.contains("has no field `titel`"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_process_serves_only_once_the_write_process_has_migrated() {
    let dir = configs(100);
    let data = tempfile::tempdir().unwrap();
    let (v1, v2) = (dir.path().join("v1.toml"), dir.path().join("v2.toml"));
    let server = Server::start_with_data_dir(&v1, data.path(), &[]);
    hens(&server.client(), 500).await;
    server.stop_gracefully();

    // the read process starts first: it waits for the migrations instead of serving
    let (config, dir_path) = (v2.clone(), data.path().to_owned());
    let reader = std::thread::spawn(move || {
        Server::start_sharing(&config, &dir_path, &["--role", "read"], &[], None)
    });
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        !reader.is_finished(),
        "the read process served before the migrations ran"
    );
    let writer = Server::start_sharing(&v2, data.path(), &["--role", "write"], &[], None);
    let reader = reader
        .join()
        .expect("the read process starts once they ran");
    assert!(
        reader
            .log()
            .contains("waiting for the process that writes this entity"),
        "{}",
        reader.log()
    );
    let now = reader.client().list("/hen/api").await;
    assert_eq!(now.len(), 500);
    now.iter().for_each(assert_v2);
    drop(writer);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_run_on_postgresql_and_mariadb() {
    for (backend, storage) in [
        (
            "postgres",
            format!(
                "type = \"postgres\"\nurl = \"{}\"",
                common::fresh_postgres_database()
            ),
        ),
        (
            "mysql",
            format!(
                "type = \"mysql\"\nurl = \"{}\"",
                common::fresh_mysql_database()
            ),
        ),
    ] {
        let dir = configs(40);
        std::fs::write(
            dir.path().join("v1.toml"),
            config_on(&storage, "v1.schema.json", ""),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("v2.toml"),
            config_on(&storage, "v2.schema.json", &migrations(40)),
        )
        .unwrap();
        let data = tempfile::tempdir().unwrap();
        let (v1, v2) = (dir.path().join("v1.toml"), dir.path().join("v2.toml"));
        let server = Server::start_with_data_dir(&v1, data.path(), &[]);
        hens(&server.client(), 150).await;
        server.stop_gracefully();

        let server = Server::start_with_data_dir(&v2, data.path(), &[]);
        let now = server.client().list("/hen/api").await;
        assert_eq!(now.len(), 150, "{backend}");
        now.iter().for_each(assert_v2);
        server.stop_gracefully();
        let text = status_of(v2.to_str().unwrap(), data.path().to_str().unwrap());
        assert!(
            text.contains("applied  eggs-as-integers") && text.contains("(150 documents)"),
            "{backend}: {text}"
        );
        let versions = history(&v2, data.path());
        assert_eq!(versions.len(), 150, "{backend}");
        assert!(versions.values().all(|v| v.len() == 2), "{backend}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_to_a_moment_before_a_migration_makes_it_pending_again() {
    let dir = configs(100);
    let data = tempfile::tempdir().unwrap();
    let (v1, v2) = (dir.path().join("v1.toml"), dir.path().join("v2.toml"));
    let server = Server::start_with_data_dir(&v1, data.path(), &[]);
    hens(&server.client(), 200).await;
    server.stop_gracefully();
    std::thread::sleep(Duration::from_millis(5));
    let before = now_ms();
    std::thread::sleep(Duration::from_millis(5));
    // migrated at start-up, then backed up
    let server = Server::start_with_data_dir(&v2, data.path(), &[]);
    server
        .client()
        .list("/hen/api")
        .await
        .iter()
        .for_each(assert_v2);
    server.stop_gracefully();
    let backups = dir.path().join("backups");
    let data_dir = data.path().to_str().unwrap();
    let out = meshql(&[
        "backup",
        v2.to_str().unwrap(),
        "--data-dir",
        data_dir,
        "--to",
        backups.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let backup = std::fs::read_dir(&backups)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("meshql-")
        })
        .expect("a backup");

    // restored as of before the migration: the old shape, and the migrations pending again
    let restored = dir.path().join("restored");
    let out = meshql(&[
        "restore",
        backup.to_str().unwrap(),
        "--config",
        v2.to_str().unwrap(),
        "--data-dir",
        restored.to_str().unwrap(),
        "--at",
        &before.to_string(),
    ]);
    let text = stdout(&out);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("`name-becomes-title` ran after the moment: pending again"),
        "{text}"
    );
    let text = status_of(v2.to_str().unwrap(), restored.to_str().unwrap());
    assert!(text.contains("pending  name-becomes-title"), "{text}");
    assert!(text.contains("pending  eggs-as-integers"), "{text}");

    // served, the restored data is migrated again
    let server = Server::start_with_data_dir(&v2, &restored, &[]);
    let now = server.client().list("/hen/api").await;
    assert_eq!(now.len(), 200);
    now.iter().for_each(assert_v2);
    server.stop_gracefully();
    let versions = history(&v2, &restored);
    assert!(versions.values().all(|v| v.len() == 2));
}
