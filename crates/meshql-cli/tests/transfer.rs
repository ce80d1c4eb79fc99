//! `meshql export` and `meshql import` through the binary: egg-economy's history on SQLite,
//! exported and imported into PostgreSQL, MySQL/MariaDB and MongoDB, answers every `at` read
//! at ten moments as SQLite does; a second import writes nothing; versions the target's
//! schema refuses are reported per entity without stopping the import.

mod common;

use common::{examples_dir, Server};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

fn meshql(args: &[&str], envs: &[(&str, String)]) -> Output {
    Command::new(common::meshql_bin())
        .args(args)
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("run meshql")
}

fn ok(out: &Output, what: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{what}: {}\n{}\n{stderr}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    stderr
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Documents by id.
type Listed = BTreeMap<String, Value>;

/// What `GET <path>?at=T` lists, by id.
async fn at(client: &common::Client, path: &str, t: i64) -> BTreeMap<String, Value> {
    client
        .list(&format!("{path}?at={t}"))
        .await
        .into_iter()
        .map(|d| (d["id"].as_str().unwrap().to_owned(), d))
        .collect()
}

/// Farms and coops created, renamed and deleted over time on `client`; the moments between.
async fn history(client: &common::Client) -> Vec<i64> {
    let mut moments = Vec::new();
    let mut farms: Vec<String> = Vec::new();
    let mut coops: Vec<String> = Vec::new();
    for step in 0..40 {
        match step % 4 {
            0 => {
                let r = client
                    .post_json(
                        "/farm/api",
                        &json!({"name": format!("farm {step}"), "farm_type": "megafarm", "zone": "north"}),
                    )
                    .await;
                r.expect_status(201);
                farms.push(r.json()["id"].as_str().unwrap().to_owned());
            }
            1 => {
                let farm = farms[step % farms.len()].clone();
                let r = client
                    .post_json(
                        "/coop/api",
                        &json!({"name": format!("coop {step}"), "farm_id": farm, "capacity": step, "coop_type": "a-frame"}),
                    )
                    .await;
                r.expect_status(201);
                coops.push(r.json()["id"].as_str().unwrap().to_owned());
            }
            2 => {
                let farm = farms[step % farms.len()].clone();
                client
                    .put_json(
                        &format!("/farm/api/{farm}"),
                        &json!({"name": format!("farm renamed at {step}"), "farm_type": "homestead", "zone": "south"}),
                    )
                    .await
                    .expect_status(200);
            }
            _ => {
                if step % 8 == 7 && coops.len() > 1 {
                    let coop = coops.remove(0);
                    client
                        .delete(&format!("/coop/api/{coop}"))
                        .await
                        .expect_status(200);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        if step % 4 == 3 {
            moments.push(now_ms());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    moments
}

/// Imports `file` into `config` (with `envs`), twice, serves it, and compares every `at`
/// read at each moment with `expected`.
async fn import_and_compare(
    name: &str,
    config: &Path,
    envs: Vec<(&str, String)>,
    file: &Path,
    moments: &[i64],
    expected: &[(Listed, Listed)],
) {
    let args = ["import", config.to_str().unwrap(), file.to_str().unwrap()];
    let first = ok(&meshql(&args, &envs), &format!("import into {name}"));
    assert!(first.contains("imported "), "{first}");
    let again = ok(&meshql(&args, &envs), &format!("second import into {name}"));
    assert!(
        again.contains("imported 0 of"),
        "a second import into {name} wrote something:\n{again}"
    );
    let server = Server::start_with_env(config, &envs, None);
    let client = server.client();
    for (k, t) in moments.iter().enumerate() {
        let farms = at(&client, "/farm/api", *t).await;
        let coops = at(&client, "/coop/api", *t).await;
        assert_eq!(farms, expected[k].0, "{name}: farms at moment {k}");
        assert_eq!(coops, expected[k].1, "{name}: coops at moment {k}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_round_trips_from_sqlite_to_postgres_mysql_and_mongodb() {
    let sqlite = examples_dir().join("egg-economy/meshql.toml");
    let data = tempfile::tempdir().unwrap();
    let server = Server::start_with_data_dir(&sqlite, data.path(), &[]);
    let client = server.client();
    let moments = history(&client).await;
    assert_eq!(moments.len(), 10);
    let mut expected = Vec::new();
    for t in &moments {
        expected.push((
            at(&client, "/farm/api", *t).await,
            at(&client, "/coop/api", *t).await,
        ));
    }
    assert!(expected[9].0.len() >= 5 && !expected[9].1.is_empty());
    drop(server);

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("eggs.ndjson.zst");
    let out = meshql(
        &[
            "export",
            sqlite.to_str().unwrap(),
            "--data-dir",
            data.path().to_str().unwrap(),
            "--history",
            "--out",
            file.to_str().unwrap(),
        ],
        &[],
    );
    let printed = ok(&out, "export");
    assert!(printed.contains("exported "), "{printed}");
    let bytes = std::fs::read(&file).unwrap();
    assert_eq!(
        &bytes[..4],
        &[0x28, 0xb5, 0x2f, 0xfd],
        "a .zst export is zstd"
    );

    import_and_compare(
        "PostgreSQL",
        &examples_dir().join("egg-economy/meshql-postgres.toml"),
        vec![("DATABASE_URL", common::fresh_postgres_database())],
        &file,
        &moments,
        &expected,
    )
    .await;
    import_and_compare(
        "MariaDB",
        &examples_dir().join("egg-economy/meshql-mysql.toml"),
        vec![("DATABASE_URL", common::fresh_mysql_database())],
        &file,
        &moments,
        &expected,
    )
    .await;
    import_and_compare(
        "MongoDB",
        &examples_dir().join("egg-economy/meshql-mongo.toml"),
        vec![
            ("MONGO_URI", common::mongo_url()),
            ("PREFIX", common::fresh_mongo_database()),
        ],
        &file,
        &moments,
        &expected,
    )
    .await;
}

/// Versions the target's JSON Schema refuses, and entities it does not declare, are counted
/// and shown per entity (exit 3), and the others are imported.
#[test]
fn refused_versions_are_reported_without_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mixed.ndjson");
    let lines = [
        json!({"meshql_export": 1, "exported_at": 1, "at": null, "history": true, "entities": ["farm", "barn"]}),
        json!({"entity": "farm", "id": "f1", "created_at": 1_000, "deleted": false, "authorized_tokens": [], "payload": {"name": "ok"}}),
        json!({"entity": "farm", "id": "f2", "created_at": 1_000, "deleted": false, "authorized_tokens": [], "payload": {"name": 7}}),
        json!({"entity": "barn", "id": "b1", "created_at": 1_000, "deleted": false, "authorized_tokens": [], "payload": {"name": "x"}}),
        json!({"entity": "farm", "id": "f1", "created_at": 2_000, "deleted": true, "authorized_tokens": [], "payload": {"name": "ok"}}),
    ];
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&file, text).unwrap();
    let data = tempfile::tempdir().unwrap();
    let config = examples_dir().join("farm/meshql.toml");
    let out = meshql(
        &[
            "import",
            config.to_str().unwrap(),
            file.to_str().unwrap(),
            "--data-dir",
            data.path().to_str().unwrap(),
        ],
        &[],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("line 3: f2"), "{stderr}");
    assert!(stderr.contains("declares no entity \"barn\""), "{stderr}");
    assert!(stderr.contains("imported 2 of 4 versions"), "{stderr}");
    // not an export at all: refused at once
    std::fs::write(&file, "{\"hello\": 1}\n").unwrap();
    let out = meshql(
        &[
            "import",
            config.to_str().unwrap(),
            file.to_str().unwrap(),
            "--data-dir",
            data.path().to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a meshql export"));
}

/// `meshql check --data`: the stored documents against the schema the config names now — a
/// property made required fails every document without it, counted per rule with examples.
#[test]
fn check_data_counts_documents_a_new_schema_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("farms.ndjson");
    let mut text = format!(
        "{}\n",
        json!({"meshql_export": 1, "exported_at": 1, "at": null, "history": true, "entities": ["farm"]})
    );
    for (i, name) in ["Emerdale", "Hollow", "Brook"].iter().enumerate() {
        let line = json!({"entity": "farm", "id": format!("00000000-0000-4000-8000-00000000000{i}"),
            "created_at": 1_000 + i as i64, "deleted": false, "authorized_tokens": [],
            "payload": {"name": name}});
        text.push_str(&format!("{line}\n"));
    }
    std::fs::write(&file, text).unwrap();
    let data = tempfile::tempdir().unwrap();
    let config = examples_dir().join("farm/meshql.toml");
    let d = data.path().to_str().unwrap();
    ok(
        &meshql(
            &[
                "import",
                config.to_str().unwrap(),
                file.to_str().unwrap(),
                "--data-dir",
                d,
            ],
            &[],
        ),
        "import",
    );
    let out = meshql(
        &["check", config.to_str().unwrap(), "--data", "--data-dir", d],
        &[],
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{printed}");
    assert!(
        printed.contains("farm: 3 documents, all valid"),
        "{printed}"
    );

    let changed = common::example_copy("farm", |t| t);
    let schema = changed.path().join("schema/farm.schema.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&schema).unwrap()).unwrap();
    v["properties"]["region"] = json!({"type": "string"});
    v["required"].as_array_mut().unwrap().push("region".into());
    std::fs::write(&schema, v.to_string()).unwrap();
    let out = meshql(
        &[
            "check",
            changed.path().to_str().unwrap(),
            "--data",
            "--data-dir",
            d,
        ],
        &[],
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{printed}");
    assert!(
        printed.contains("farm: 3 of 3 documents fail its JSON Schema"),
        "{printed}"
    );
    assert!(
        printed.contains("3 × /: \"region\" is a required property"),
        "{printed}"
    );
}

/// The lines of an export without its header (whose `exported_at` differs).
fn versions_of(file: &Path) -> Vec<String> {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .skip(1)
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_and_import_go_through_a_running_service_as_they_do_through_the_files() {
    let config = examples_dir().join("egg-economy/meshql.toml");
    let data = tempfile::tempdir().unwrap();
    let server = Server::start_with_data_dir(&config, data.path(), &[]);
    let client = server.client();
    let moments = history(&client).await;
    let mut expected = Vec::new();
    for t in &moments {
        expected.push((
            at(&client, "/farm/api", *t).await,
            at(&client, "/coop/api", *t).await,
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let (live, offline) = (
        dir.path().join("live.ndjson"),
        dir.path().join("files.ndjson"),
    );
    let url = server.url("");
    let export = |out: &Path, data_dir: &Path, url: Option<&str>| {
        let mut args = vec![
            "export".to_owned(),
            config.to_str().unwrap().to_owned(),
            "--data-dir".to_owned(),
            data_dir.to_str().unwrap().to_owned(),
            "--history".to_owned(),
            "--out".to_owned(),
            out.to_str().unwrap().to_owned(),
        ];
        if let Some(u) = url {
            args.extend(["--url".to_owned(), u.to_owned()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        meshql(&args, &[])
    };

    // while it serves (and holds its SQLite files): through the service
    let printed = ok(
        &export(&live, data.path(), Some(&url)),
        "export while serving",
    );
    assert!(
        printed.contains("exporting through the service"),
        "{printed}"
    );
    // a service that keeps other data is not exported as if it were this data directory
    let other = tempfile::tempdir().unwrap();
    let refused = export(&dir.path().join("x.ndjson"), other.path(), Some(&url));
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("keeps its data in"), "{said}");
    // its parameters are checked
    let r = client.get("/_meshql/export?histroy=true").await;
    r.expect_status(400);
    assert!(r.json()["error"].as_str().unwrap().contains("histroy"));
    drop(server);

    // stopped: from its files, the same versions in the same order
    ok(
        &export(&offline, data.path(), None),
        "export from the files",
    );
    let (a, b) = (versions_of(&live), versions_of(&offline));
    assert!(a.len() >= 30, "{} versions", a.len());
    assert_eq!(a, b);

    // imported through another running service: its `at` reads answer as the first one's
    let copy = tempfile::tempdir().unwrap();
    let server = Server::start_with_data_dir(&config, copy.path(), &[]);
    let url = server.url("");
    let import = || {
        meshql(
            &[
                "import",
                config.to_str().unwrap(),
                live.to_str().unwrap(),
                "--url",
                &url,
                "--data-dir",
                copy.path().to_str().unwrap(),
            ],
            &[],
        )
    };
    let printed = ok(&import(), "import while serving");
    assert!(
        printed.contains("importing through the service"),
        "{printed}"
    );
    assert!(
        printed.contains(&format!("imported {} of {}", a.len(), a.len())),
        "{printed}"
    );
    let client = server.client();
    for (k, t) in moments.iter().enumerate() {
        assert_eq!(
            at(&client, "/farm/api", *t).await,
            expected[k].0,
            "farms at {k}"
        );
        assert_eq!(
            at(&client, "/coop/api", *t).await,
            expected[k].1,
            "coops at {k}"
        );
    }
    let again = ok(&import(), "the same import again");
    assert!(again.contains("imported 0 of"), "{again}");
    // not an export: refused before anything is written
    let r = client
        .request(
            "POST",
            "/_meshql/import",
            Some(b"{\"hello\":1}\n".to_vec()),
            &[],
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text);
    assert!(r.text.contains("not a meshql export"), "{}", r.text);
}
