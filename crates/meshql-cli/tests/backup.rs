//! `meshql backup` and `meshql restore` through the binary: a backup taken under write load
//! restores every write acknowledged before it began; a restore to a moment answers as the
//! service did at that moment; a backup killed midway, a damaged one, one of another
//! config and a full disk are refused with their reason, and never leave something that
//! restores.

mod common;

use common::{example_copy, free_port, run_meshql, Client, Server};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MINUTE: Duration = Duration::from_secs(60);

fn ok(out: &std::process::Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn refused(out: &std::process::Output, what: &str) -> String {
    assert!(
        !out.status.success(),
        "{what} should have failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `meshql restore BACKUP --config CONFIG --data-dir DIR [--at AT]`.
fn restore(backup: &Path, config: &Path, dir: &Path, at: Option<&str>) -> std::process::Output {
    let mut args = vec![
        "restore",
        backup.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        dir.to_str().unwrap(),
    ];
    if let Some(at) = at {
        args.extend(["--at", at]);
    }
    run_meshql(&args, MINUTE)
}

/// The backup directories (with a manifest) under `dir`.
fn backups_in(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    found.retain(|p| p.join("manifest.json").exists());
    found.sort();
    found
}

/// Every document of an entity as REST lists it now, by id.
async fn documents(client: &Client, path: &str) -> BTreeMap<String, Value> {
    client
        .list(path)
        .await
        .into_iter()
        .map(|d| (d["id"].as_str().expect("an id").to_owned(), d))
        .collect()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A write the service acknowledged: its path, id, body and when.
type Acked = (String, String, Value, Instant);

/// Writes go on into two files (farms in actors.db, lay reports in events.db) while a
/// backup is taken through the running service. Restored, the data holds every write
/// acknowledged before the backup began, none acknowledged after it ended, each exactly as
/// written; the restored change log continues the live one's positions and the hub copies
/// into it what the log did not hold yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_under_write_load_restores_every_write_acknowledged_before_it() {
    let config = common::examples_dir().join("egg-economy/meshql.toml");
    let server = Server::start(&config, &[]);
    let data_dir = server.data_dir().to_owned();
    let acked: Arc<Mutex<Vec<Acked>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..4 {
        let (client, acked, stop) = (server.client(), acked.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let (path, body) = if w % 2 == 0 {
                    (
                        "/farm/api",
                        json!({"name": format!("farm {w}-{n}"), "farm_type": "megafarm", "zone": "north"}),
                    )
                } else {
                    (
                        "/lay_report/api",
                        json!({"hen_id": format!("00000000-0000-4000-8000-{:012}", n),
                               "coop_id": "00000000-0000-4000-8000-000000000001",
                               "farm_id": "00000000-0000-4000-8000-000000000002",
                               "eggs": n % 7, "timestamp": "2026-12-01T10:00:00Z"}),
                    )
                };
                let r = client.post_json(path, &body).await;
                r.expect_status(201);
                let id = r.json()["id"].as_str().unwrap().to_owned();
                acked
                    .lock()
                    .unwrap()
                    .push((path.to_owned(), id, body, Instant::now()));
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let to = tempfile::tempdir().unwrap();
    let began = Instant::now();
    let url = format!("http://127.0.0.1:{}", server.port());
    let (config_s, data_s, to_s) = (
        config.display().to_string(),
        data_dir.display().to_string(),
        to.path().display().to_string(),
    );
    let out = tokio::task::spawn_blocking(move || {
        run_meshql(
            &[
                "backup",
                &config_s,
                "--data-dir",
                &data_s,
                "--url",
                &url,
                "--to",
                &to_s,
            ],
            MINUTE,
        )
    })
    .await
    .unwrap();
    let ended = Instant::now();
    let printed = ok(&out, "meshql backup");
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    assert!(printed.contains("restore: meshql restore"), "{printed}");
    let found = backups_in(to.path());
    assert_eq!(found.len(), 1, "one backup in {}", to.path().display());
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(found[0].join("manifest.json")).unwrap()).unwrap();
    let files: Vec<&str> = manifest["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "sqlite")
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        files,
        ["actors.db", "events.db", "projections.db"],
        "{manifest}"
    );
    let log_end = manifest["log"]["last_offset"].as_u64().unwrap();
    assert!(log_end > 0);
    drop(server);

    let restored = tempfile::tempdir().unwrap();
    let new_dir = restored.path().join("data");
    let out = run_meshql(
        &[
            "restore",
            found[0].to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
            "--data-dir",
            new_dir.to_str().unwrap(),
        ],
        MINUTE,
    );
    ok(&out, "meshql restore");
    let server = Server::start_with_data_dir(&config, &new_dir, &[]);
    let client = server.client();
    let farms = documents(&client, "/farm/api").await;
    let reports = documents(&client, "/lay_report/api").await;
    let (mut before, mut after, mut between_kept) = (0, 0, 0);
    for (path, id, body, at) in acked.lock().unwrap().iter() {
        let stored = if path == "/farm/api" {
            farms.get(id)
        } else {
            reports.get(id)
        };
        if *at < began {
            before += 1;
            let stored = stored.unwrap_or_else(|| {
                panic!("{path} {id}, acknowledged before the backup began, is not restored")
            });
            for (k, v) in body.as_object().unwrap() {
                assert_eq!(&stored[k], v, "{path} {id}: {k}");
            }
        } else if *at > ended {
            after += 1;
            assert!(
                stored.is_none(),
                "{path} {id} was acknowledged after the backup ended but is restored"
            );
        } else if stored.is_some() {
            between_kept += 1;
        }
    }
    assert!(before > 20, "only {before} writes before the backup");
    assert!(after > 5, "only {after} writes after the backup");
    eprintln!("{before} writes before the backup, all restored; {after} after it, none; {between_kept} during it restored");
    // the change log continues: every restored document has its change in the feed
    let expected = farms.len() + reports.len();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let feed = changes_of(&client, "farm,lay_report").await;
        if feed == expected {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the restored feed holds {feed} changes of farms and lay reports, the data {expected}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How many changes of `entities` the feed holds, read page by page.
async fn changes_of(client: &Client, entities: &str) -> usize {
    let (mut since, mut n) = (0u64, 0usize);
    loop {
        let page = client
            .get(&format!(
                "/_changes?since={since}&limit=1000&entity={entities}"
            ))
            .await;
        page.expect_status(200);
        let page = page.json();
        let got = page["changes"].as_array().unwrap().len();
        n += got;
        let last = page["last"].as_u64().unwrap();
        if got == 0 || last == since {
            return n;
        }
        since = last;
    }
}

/// A restore to each of ten moments answers, for every document, what the test wrote up to
/// that moment (creates, updates, deletes); the backup itself restores the last state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_at_a_moment_holds_each_documents_version_of_that_moment() {
    let copy = example_copy("farm", |t| t);
    let config = copy.path().join("meshql.toml");
    let port = free_port();
    let server = Server::start_with_env(&config, &[("PORT", port.to_string())], Some(port));
    let client = server.client();
    // the model: each moment's documents, as the test wrote them
    let mut state: BTreeMap<String, Value> = BTreeMap::new();
    let mut moments: Vec<(i64, BTreeMap<String, Value>)> = Vec::new();
    let mut ids: Vec<String> = Vec::new();
    for step in 0..30 {
        match step % 3 {
            0 | 1 if ids.len() < 3 || step % 3 == 0 => {
                let body = json!({"name": format!("farm {step}")});
                let r = client.post_json("/farm/api", &body).await;
                r.expect_status(201);
                let id = r.json()["id"].as_str().unwrap().to_owned();
                let mut doc = body.clone();
                doc["id"] = json!(id);
                state.insert(id.clone(), doc);
                ids.push(id);
            }
            1 => {
                let id = ids[step % ids.len()].clone();
                let body = json!({"name": format!("farm renamed at {step}")});
                let r = client.put_json(&format!("/farm/api/{id}"), &body).await;
                r.expect_status(200);
                let mut doc = body.clone();
                doc["id"] = json!(id);
                state.insert(id, doc);
            }
            _ => {
                let id = ids.remove(step % ids.len());
                client
                    .delete(&format!("/farm/api/{id}"))
                    .await
                    .expect_status(200);
                state.remove(&id);
            }
        }
        tokio::time::sleep(Duration::from_millis(15)).await;
        if step % 3 == 2 {
            moments.push((now_ms(), state.clone()));
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
    }
    assert_eq!(moments.len(), 10);
    let to = tempfile::tempdir().unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let out = run_meshql(
        &[
            "backup",
            config.to_str().unwrap(),
            "--url",
            &url,
            "--data-dir",
            server.data_dir().to_str().unwrap(),
            "--to",
            to.path().to_str().unwrap(),
        ],
        MINUTE,
    );
    ok(&out, "meshql backup");
    let backup = backups_in(to.path()).pop().expect("a backup");
    drop(server);

    let restores = tempfile::tempdir().unwrap();
    for (k, (moment, expected)) in moments.iter().enumerate() {
        let dir = restores.path().join(format!("at-{k}"));
        // one moment as RFC 3339, the others in milliseconds
        let at = if k == 4 {
            chrono::DateTime::from_timestamp_millis(*moment)
                .unwrap()
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        } else {
            moment.to_string()
        };
        let out = restore(&backup, &config, &dir, Some(&at));
        ok(&out, "meshql restore --at");
        let server = Server::start_with_data_dir(&config, &dir, &[]);
        let docs = documents(&server.client(), "/farm/api").await;
        assert_eq!(&docs, expected, "restored at moment {k} ({at})");
    }
    // without --at: the last state
    let dir = restores.path().join("latest");
    ok(&restore(&backup, &config, &dir, None), "meshql restore");
    let server = Server::start_with_data_dir(&config, &dir, &[]);
    assert_eq!(documents(&server.client(), "/farm/api").await, state);
    drop(server);

    // refusals: a moment after the backup, a directory with data, another config, damage
    let err = refused(
        &restore(
            &backup,
            &config,
            &restores.path().join("later"),
            Some(&(now_ms() + 60_000).to_string()),
        ),
        "a restore after the backup's moment",
    );
    assert!(err.contains("cannot restore a later moment"), "{err}");
    let err = refused(
        &restore(&backup, &config, &dir, None),
        "a restore over data",
    );
    assert!(err.contains("is not empty"), "{err}");
    let other = common::examples_dir().join("egg-economy/meshql.toml");
    let err = refused(
        &restore(&backup, &other, &restores.path().join("other"), None),
        "a restore for another config",
    );
    assert!(err.contains("is a backup of another service"), "{err}");
    assert!(!restores.path().join("other").exists());
    let db = backup.join("farm.db");
    let mut bytes = std::fs::read(&db).unwrap();
    let last = bytes.len() - 100;
    bytes[last] ^= 0xff;
    std::fs::write(&db, bytes).unwrap();
    let err = refused(
        &restore(&backup, &config, &restores.path().join("damaged"), None),
        "a restore of a damaged backup",
    );
    assert!(err.contains("the backup is damaged"), "{err}");
    assert!(!restores.path().join("damaged").exists());
}

/// Fills `data_dir/farm.db` (the farm example's file) with `n` farms of about 2 KiB.
async fn fill(data_dir: &Path, n: usize) {
    use meshql_core::{NewDocument, Store, StoreWriter, WriteContext};
    let db = meshql_store_sqlite::SqliteDatabase::open(
        &data_dir.join("farm.db"),
        meshql_store_sqlite::SqliteOptions::default(),
    )
    .unwrap();
    let store = meshql_store_sqlite::SqliteStore::new(db.clone(), "farm");
    store.prepare(&[]).await.unwrap();
    let filler = "x".repeat(2000);
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let docs: Vec<NewDocument> = chunk
            .iter()
            .map(|i| {
                let mut payload = serde_json::Map::new();
                payload.insert("name".into(), json!(format!("farm {i} {filler}")));
                NewDocument::new(payload)
            })
            .collect();
        store
            .create_many(docs, &WriteContext::SYSTEM)
            .await
            .unwrap();
    }
    db.shutdown().await;
}

/// A backup killed with SIGKILL midway leaves no backup that restores (only a `.partial-…`
/// directory, which restore refuses and the next backup removes); the next one is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_killed_midway_leaves_nothing_that_restores() {
    let copy = example_copy("farm", |t| t);
    let config = copy.path().join("meshql.toml");
    let data = tempfile::tempdir().unwrap();
    fill(data.path(), 60_000).await;
    let to = tempfile::tempdir().unwrap();
    // no service answers on this port: the command opens the files itself
    let port = free_port().to_string();
    let mut child = std::process::Command::new(common::meshql_bin())
        .args([
            "backup",
            config.to_str().unwrap(),
            "--data-dir",
            data.path().to_str().unwrap(),
            "--to",
            to.path().to_str().unwrap(),
        ])
        .env("PORT", &port)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + MINUTE;
    let partial = loop {
        let found = std::fs::read_dir(to.path())
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(".partial-")
            });
        if let Some(p) = found {
            // let it write a part of the copy
            std::thread::sleep(Duration::from_millis(20));
            break p;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the backup finished before it could be killed: give it more data"
        );
        assert!(Instant::now() < deadline, "no backup started");
        std::thread::sleep(Duration::from_millis(1));
    };
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(
        backups_in(to.path()).is_empty(),
        "a killed backup left a complete-looking backup"
    );
    if partial.exists() {
        let err = refused(
            &restore(&partial, &config, &to.path().join("r1"), None),
            "a restore of a killed backup",
        );
        assert!(err.contains("never finished"), "{err}");
    }
    // the next backup is whole, and cleans up after the killed one
    let out = std::process::Command::new(common::meshql_bin())
        .args([
            "backup",
            config.to_str().unwrap(),
            "--data-dir",
            data.path().to_str().unwrap(),
            "--to",
            to.path().to_str().unwrap(),
        ])
        .env("PORT", &port)
        .output()
        .unwrap();
    ok(&out, "the backup after the killed one");
    assert!(!partial.exists(), "the killed backup's directory is left");
    let backup = backups_in(to.path()).pop().unwrap();
    let restored = to.path().join("restored");
    ok(
        &restore(&backup, &config, &restored, None),
        "meshql restore",
    );
    let conn = rusqlite_count(&restored.join("farm.db"));
    assert_eq!(conn, 60_000);
}

/// Versions in the farm table of a SQLite file.
fn rusqlite_count(path: &Path) -> i64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row("SELECT COUNT(*) FROM farm", [], |r| r.get(0))
        .unwrap()
}

/// A backup onto a full disk fails with that reason, leaves nothing there, and the data it
/// was copying is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_onto_a_full_disk_says_so_and_leaves_nothing() {
    let copy = example_copy("farm", |t| t);
    let config = copy.path().join("meshql.toml");
    let data = tempfile::tempdir().unwrap();
    fill(data.path(), 3_000).await; // about 7 MB
    let small = tempfile::tempdir().unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"])
        .arg(small.path())
        .status()
        .expect("run mount");
    assert!(
        mounted.success(),
        "cannot mount a 2 MiB tmpfs to fill (this test needs root, as CI has)"
    );
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(small.path().to_owned());
    let out = std::process::Command::new(common::meshql_bin())
        .args([
            "backup",
            config.to_str().unwrap(),
            "--data-dir",
            data.path().to_str().unwrap(),
            "--to",
            small.path().to_str().unwrap(),
        ])
        .env("PORT", free_port().to_string())
        .output()
        .unwrap();
    let err = refused(&out, "a backup onto a full disk");
    assert!(err.contains("no space left"), "{err}");
    let left: Vec<_> = std::fs::read_dir(small.path()).unwrap().flatten().collect();
    assert!(
        left.is_empty(),
        "left behind: {:?}",
        left.iter().map(|e| e.path()).collect::<Vec<_>>()
    );
    assert_eq!(rusqlite_count(&data.path().join("farm.db")), 3_000);
}

/// `[backup]` with a schedule (every two seconds), `keep = 2` and a real S3-compatible bucket
/// (SeaweedFS): the service takes backups on its own, uploads each (manifest last), keeps two
/// here and two in the bucket, and `meshql restore s3://…` brings the newest back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_backups_go_to_a_bucket_and_restore_from_it() {
    let endpoint = common::s3_url();
    let prefix = format!("t{}", now_ms());
    let copy = example_copy("farm", |t| {
        format!(
            "{t}\n[backup]\nschedule = \"*/2 * * * * *\"\nkeep = 2\n\
             s3 = {{ url = \"s3://meshql-test/{prefix}\", endpoint = \"{endpoint}\" }}\n"
        )
    });
    let config = copy.path().join("meshql.toml");
    let keys = [
        ("AWS_ACCESS_KEY_ID", "meshql".to_owned()),
        ("AWS_SECRET_ACCESS_KEY", "meshql-secret".to_owned()),
    ];
    let port = free_port();
    let mut envs = keys.to_vec();
    envs.push(("PORT", port.to_string()));
    let server = Server::start_with_env(&config, &envs, Some(port));
    let client = server.client();
    for i in 0..5 {
        client
            .post_json("/farm/api", &json!({"name": format!("farm {i}")}))
            .await
            .expect_status(201);
    }
    // three scheduled backups at least (every two seconds), uploaded and pruned to two
    let deadline = Instant::now() + Duration::from_secs(60);
    let metrics = loop {
        let m = client.get("/metrics").await;
        let text = m.text.clone();
        let uploaded = text
            .lines()
            .find(|l| l.starts_with("meshql_backup_uploads_total{result=\"ok\"}"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        if uploaded >= 3 {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "fewer than three scheduled backups uploaded in 60 s:\n{text}\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        metrics.contains("meshql_backup_uploads_total{result=\"failed\"} 0"),
        "{metrics}"
    );
    // one more, over HTTP (409 while a scheduled one runs: retried): it prunes the oldest
    // beyond two, here and in the bucket
    let taken = loop {
        let r = client.post_json("/_meshql/backup", &json!({})).await;
        if r.status == 409 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        r.expect_status(201);
        break r.json();
    };
    assert!(
        taken["uploaded"]
            .as_str()
            .unwrap()
            .starts_with("s3://meshql-test/"),
        "{taken}"
    );
    let pruned_in_bucket: Vec<String> = taken["pruned"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p.as_str()?.strip_prefix("s3: ").map(str::to_owned))
        .collect();
    assert!(
        !pruned_in_bucket.is_empty(),
        "nothing pruned in the bucket: {taken}"
    );
    let listed = client.get("/_meshql/backups").await.json();
    let local = listed["backups"].as_array().unwrap();
    assert!(
        local.len() <= 3,
        "keep = 2 (one may be in progress): {listed}"
    );
    let newest = taken["name"].as_str().unwrap().to_owned();
    drop(server);

    // the bucket keeps two; the newest restores
    let url = format!("s3://meshql-test/{prefix}/{newest}");
    let dir = tempfile::tempdir().unwrap();
    let restored = dir.path().join("restored");
    let out = std::process::Command::new(common::meshql_bin())
        .args([
            "restore",
            &url,
            "--config",
            config.to_str().unwrap(),
            "--data-dir",
            restored.to_str().unwrap(),
        ])
        .envs(keys.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    ok(&out, "meshql restore s3://…");
    let server = Server::start_with_data_dir(&config, &restored, &[]);
    assert_eq!(server.client().list("/farm/api").await.len(), 5);
    drop(server);
    // an old one, pruned from the bucket, is gone
    let out = std::process::Command::new(common::meshql_bin())
        .args([
            "restore",
            &format!("s3://meshql-test/{prefix}/{}", pruned_in_bucket[0]),
            "--config",
            config.to_str().unwrap(),
            "--data-dir",
            dir.path().join("none").to_str().unwrap(),
        ])
        .envs(keys.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    let err = refused(&out, "a restore of a backup the bucket does not hold");
    assert!(err.contains("no manifest"), "{err}");
}
