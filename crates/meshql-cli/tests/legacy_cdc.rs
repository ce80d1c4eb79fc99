//! Change capture from a legacy PostgreSQL (`source = { type = "postgres_cdc" }`) through the
//! binary, against the real server `scripts/services/postgres.sh` starts (`wal_level =
//! logical`): the rows present at start arrive by the snapshot, then inserts, updates and
//! deletes as they commit, each row always the same clean document; `kill -9` while rows are
//! being written loses nothing and applies nothing twice; the slot is dropped at the end.
//!
//! The processor here is a script (the row → document logic of the test), so that the
//! source is tested on its own.

mod common;

use common::{fresh_postgres_database, psql, run_meshql, Server};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// A legacy database with one table, its slot dropped when the test ends (a slot left behind
/// would keep the server's WAL forever).
struct Legacy {
    url: String,
    admin: String,
    slot: String,
}

impl Legacy {
    fn new(run: &str) -> Legacy {
        let url = fresh_postgres_database();
        psql(
            &url,
            "CREATE TABLE cust_acct (acct_id serial PRIMARY KEY, acct_num varchar(12) NOT NULL, \
             cust_nm_first varchar(30), stat_cd varchar(1) NOT NULL, tot_amt int)",
        );
        Legacy {
            admin: common::postgres_url(),
            url,
            slot: format!("meshql_t{run}"),
        }
    }
}

impl Drop for Legacy {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .args([
                &self.admin,
                "-tAqc",
                &format!(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE '{}%'",
                    self.slot
                ),
            ])
            .output();
    }
}

/// A service whose `customer` entity is written by a script from the legacy table's rows.
/// A service with one `customer` entity (on SQLite) written by `processor` (a TOML
/// `[[processor]]` entry).
fn customer_service(dir: &Path, processor: &str) {
    std::fs::write(
        dir.join("customer.schema.json"),
        r#"{"type": "object", "properties": {"account_number": {"type": "string"},
            "first_name": {"type": ["string", "null"]}, "status": {"type": "string"},
            "total": {"type": ["number", "null"]}, "legacy_id": {"type": "integer"}},
            "required": ["account_number", "status"], "additionalProperties": false}"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("customer.graphql"),
        "type Customer { id: ID, account_number: String, first_name: String, status: String, total: Float, legacy_id: Int }\n\
         type Query { getById(id: ID, at: Float): Customer }\n",
    )
    .unwrap();
    let toml = format!(
        r#"port = 4999
data_dir = "${{MESHQL_DATA_DIR:-data}}"

[storage.default]
type = "sqlite"
file = "clean.db"

[changes]
enabled = true

[[entity]]
name = "customer"

[entity.rest]
path = "/customer/api"
schema = "customer.schema.json"

[entity.graphql]
path = "/customer/graph"
schema = "customer.graphql"

[[entity.graphql.singletons]]
name = "getById"
query = '{{"id": "{{{{id}}}}"}}'

{processor}"#
    );
    std::fs::write(dir.join("meshql.toml"), toml).unwrap();
}

/// The service whose `customer` entity a script writes from the legacy table's rows.
fn service(dir: &Path, legacy: &Legacy) {
    service_at(dir, legacy, &legacy.url)
}

/// [`service`], reading the legacy database at `url`.
fn service_at(dir: &Path, legacy: &Legacy, url: &str) {
    std::fs::write(
        dir.join("customer.js"),
        r#"function transform(change) {
  const id = "cust-" + change.id;
  if (change.op === "delete") return { id: id, _delete: true };
  const r = change.payload;
  const status = { A: "active", S: "suspended", C: "closed" }[r.stat_cd];
  if (!status) throw new Error("unknown status " + r.stat_cd);
  return { id: id, account_number: r.acct_num, first_name: r.cust_nm_first, status: status,
           total: r.tot_amt === null ? null : r.tot_amt / 100, legacy_id: r.acct_id };
}
"#,
    )
    .unwrap();
    customer_service(
        dir,
        &format!(
            r#"[[processor]]
name = "customers"
type = "script"
script = "customer.js"
inputs = ["cust_acct"]
output = "customer"
source = {{ type = "postgres_cdc", url = "{url}", publication = "{slot}", slot = "{slot}", tables = ["cust_acct"] }}
"#,
            slot = legacy.slot,
        ),
    );
}

fn run_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..10].to_owned()
}

/// Waits until `check` holds for the customer `id` (its document, `None` when absent).
async fn until(
    s: &Server,
    id: &str,
    what: &str,
    check: impl Fn(Option<&Value>) -> bool,
) -> Option<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = s.client().get(&format!("/customer/api/cust-{id}")).await;
        let doc = (r.status == 200).then(|| r.json());
        if check(doc.as_ref()) {
            return doc;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: got {doc:?}\n{}",
            s.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_rows_arrive_by_snapshot_then_by_stream_as_the_same_documents() {
    let legacy = Legacy::new(&run_id());
    psql(
        &legacy.url,
        "INSERT INTO cust_acct (acct_num, cust_nm_first, stat_cd, tot_amt) VALUES \
         ('100100-00001', 'MARGARET', 'A', 9840), ('200200-00002', 'KENJI', 'A', 42000), \
         ('100100-00003', 'SIOBHAN', 'S', NULL)",
    );
    let dir = tempfile::tempdir().unwrap();
    service(dir.path(), &legacy);
    let s = Server::start(&dir.path().join("meshql.toml"), &[]);

    // the snapshot: the rows present before the slot existed, typed as the columns are
    let first = until(&s, "1", "snapshot row 1", |d| d.is_some())
        .await
        .unwrap();
    assert_eq!(first["account_number"], "100100-00001");
    assert_eq!(first["total"], json!(98.4));
    assert_eq!(first["legacy_id"], json!(1));
    until(&s, "3", "snapshot row 3", |d| {
        d.is_some_and(|d| d["status"] == "suspended" && d["total"].is_null())
    })
    .await;

    // an insert arrives as it commits
    psql(&legacy.url, "INSERT INTO cust_acct (acct_num, cust_nm_first, stat_cd) VALUES ('300300-00004', 'JAMES', 'A')");
    until(&s, "4", "inserted row", |d| {
        d.is_some_and(|d| d["first_name"] == "JAMES")
    })
    .await;

    // an update is a new version of the same document; the version before stays readable
    let before = meshql_core_now_ms();
    tokio::time::sleep(Duration::from_millis(20)).await;
    psql(
        &legacy.url,
        "UPDATE cust_acct SET stat_cd = 'C', tot_amt = 100 WHERE acct_id = 2",
    );
    until(&s, "2", "updated row", |d| {
        d.is_some_and(|d| d["status"] == "closed")
    })
    .await;
    let then = s
        .client()
        .post_json(
            "/customer/graph",
            &json!({"query": format!("{{ getById(id: \"cust-2\", at: {before}) {{ status total }} }}")}),
        )
        .await
        .json();
    assert_eq!(then["data"]["getById"]["status"], "active", "{then}");
    assert_eq!(
        then["data"]["getById"]["total"].as_f64(),
        Some(420.0),
        "{then}"
    );
    assert_eq!(
        s.client().list("/customer/api").await.len(),
        4,
        "no second document"
    );

    // a delete tombstones it
    psql(&legacy.url, "DELETE FROM cust_acct WHERE acct_id = 3");
    until(&s, "3", "deleted row", |d| d.is_none()).await;

    // an unknown code is a dead letter, and the stream goes on
    psql(
        &legacy.url,
        "INSERT INTO cust_acct (acct_num, stat_cd) VALUES ('X', 'Z'); \
         INSERT INTO cust_acct (acct_num, stat_cd) VALUES ('400400-00006', 'A')",
    );
    until(&s, "6", "the row after a dead letter", |d| d.is_some()).await;
    let metrics = s.client().get("/metrics").await.text;
    assert!(
        metrics.contains(
            "meshql_processor_dead_letters{processor=\"customers\",type=\"script\",output=\"customer\"} 1"
        ),
        "{}",
        metrics.lines().filter(|l| l.contains("customers")).collect::<Vec<_>>().join("\n")
    );

    // the slot is told what is applied
    let confirmed = psql(
        &legacy.admin,
        &format!("SELECT confirmed_flush_lsn IS NOT NULL FROM pg_replication_slots WHERE slot_name = '{}'", legacy.slot),
    );
    assert_eq!(confirmed, "t");
}

fn meshql_core_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// `meshql_processor_outputs_total` of the `customers` processor of `s` (0 while absent).
async fn outputs_committed(s: &Server) -> u64 {
    let prefix =
        "meshql_processor_outputs_total{processor=\"customers\",type=\"script\",output=\"customer\"} ";
    s.client()
        .get("/metrics")
        .await
        .text
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// Committed changes per legacy row, as the audit trigger of [`audited`] recorded them in the
/// same transactions: (acct_id, changes).
fn changes_per_row(url: &str) -> Vec<(u64, usize)> {
    psql(
        url,
        "SELECT acct_id, count(*) FROM cust_audit GROUP BY acct_id ORDER BY acct_id",
    )
    .lines()
    .filter_map(|l| l.split_once('|'))
    .map(|(id, n)| (id.parse().unwrap(), n.parse().unwrap()))
    .collect()
}

/// Adds to the legacy table an audit of every row change (insert, update, delete), written by
/// a trigger in the change's own transaction: what the capture must turn into one version each.
fn audited(url: &str) {
    psql(
        url,
        "CREATE TABLE cust_audit (n bigserial PRIMARY KEY, acct_id int NOT NULL, op text NOT NULL); \
         CREATE FUNCTION cust_audit_f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           INSERT INTO cust_audit (acct_id, op) VALUES (COALESCE(NEW.acct_id, OLD.acct_id), TG_OP); \
           RETURN NULL; END $$; \
         CREATE TRIGGER cust_audit_t AFTER INSERT OR UPDATE OR DELETE ON cust_acct \
           FOR EACH ROW EXECUTE FUNCTION cust_audit_f()",
    );
}

/// Inserts, updates and deletes, each update changing the row's document (its total), so
/// that every change is one version and a change delivered again after the kill is either
/// equal to the current version (skipped) or shows as a version too many.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_while_rows_are_written_loses_nothing_and_applies_nothing_twice() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let legacy = Legacy::new(&run_id());
    audited(&legacy.url);
    psql(
        &legacy.url,
        "INSERT INTO cust_acct (acct_num, stat_cd) SELECT 'S-' || g, 'A' FROM generate_series(1, 300) g",
    );
    let dir = tempfile::tempdir().unwrap();
    service(dir.path(), &legacy);
    let config = dir.path().join("meshql.toml");
    let data = tempfile::tempdir().unwrap();
    // once the snapshot is in, rows keep changing (one transaction each: inserts of one row
    // and of 50, updates of one row and of many, deletes of rows updated before) while the
    // consumer is killed; changes committed before the slot's snapshot would reach it as one
    // row, so the writer starts only after the snapshot
    let writing = Arc::new(AtomicBool::new(true));
    let start_writer = || {
        let url = legacy.url.clone();
        let writing = writing.clone();
        std::thread::spawn(move || {
            for r in 0..80u64 {
                psql(
                    &url,
                    &format!(
                        "UPDATE cust_acct SET tot_amt = COALESCE(tot_amt, 0) + 1, \
                         stat_cd = CASE stat_cd WHEN 'A' THEN 'S' ELSE 'A' END \
                         WHERE acct_id % 40 = {}",
                        r % 40
                    ),
                );
                psql(
                    &url,
                    &format!(
                        "UPDATE cust_acct SET tot_amt = COALESCE(tot_amt, 0) + 1000 WHERE acct_id = {}",
                        (r * 37) % 300 + 1
                    ),
                );
                psql(
                    &url,
                    &format!(
                        "DELETE FROM cust_acct WHERE acct_id % 40 = {} AND acct_id % 3 = 0",
                        (r + 20) % 40
                    ),
                );
                psql(
                    &url,
                    &format!("INSERT INTO cust_acct (acct_num, stat_cd) VALUES ('R-{r}', 'A')"),
                );
                psql(
                    &url,
                    &format!("INSERT INTO cust_acct (acct_num, stat_cd) SELECT 'B-{r}-' || g, 'A' FROM generate_series(1, 50) g"),
                );
                std::thread::sleep(Duration::from_millis(40));
            }
            writing.store(false, Ordering::SeqCst);
        })
    };
    let mut writer = None;
    let mut killed_while_writing = 0;
    for round in 0..4 {
        let mut s = Server::start_with_data_dir(&config, data.path(), &[]);
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut from = 0;
        if writer.is_none() && round > 0 {
            // the snapshot (taken again if the first run was killed in its midst) is in
            while s.client().list("/customer/api").await.len() < 300 {
                assert!(
                    Instant::now() < deadline,
                    "round {round}: the snapshot did not arrive\n{}",
                    s.log()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            from = outputs_committed(&s).await;
            writer = Some(start_writer());
        }
        // killed once this run committed versions of its own (the first run: of the
        // snapshot; the others: streamed changes, the writer still writing)
        loop {
            let n = outputs_committed(&s).await;
            if n >= from + 100 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: {n} versions committed\n{}",
                s.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if writer.is_some() && writing.load(Ordering::SeqCst) {
            killed_while_writing += 1;
        }
        s.signal("KILL");
        assert!(s.wait_exit(Duration::from_secs(5)).is_some());
    }
    writer.expect("the writer ran").join().unwrap();
    assert!(
        killed_while_writing >= 2,
        "the writer finished before the kills ({killed_while_writing})"
    );
    let s = Server::start_with_data_dir(&config, data.path(), &[]);
    let c = s.client();
    let changes = changes_per_row(&legacy.url);
    let count = |op: &str| -> usize {
        psql(
            &legacy.url,
            &format!("SELECT count(*) FROM cust_audit WHERE op = '{op}'"),
        )
        .parse()
        .unwrap()
    };
    let (inserts, updates, deletes) = (count("INSERT"), count("UPDATE"), count("DELETE"));
    assert!(
        updates > 500 && deletes > 50,
        "the load changed rows: {inserts} inserts, {updates} updates, {deletes} deletes"
    );
    // every change is one version of its row's document: the insert (or the snapshot), each
    // update, the delete's tombstone; none missing, none twice
    let rows: usize = psql(&legacy.url, "SELECT count(*) FROM cust_acct")
        .parse()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut pending: Vec<(u64, usize)> = changes.clone();
    loop {
        use futures::StreamExt;
        let c = &c;
        let seen: Vec<(u64, usize, usize)> = futures::stream::iter(pending.iter().copied())
            .map(|(id, want)| async move {
                let r = c
                    .get(&format!(
                        "/_meshql/console/api/entities/customer/documents/cust-{id}/versions"
                    ))
                    .await;
                let got = match r.status {
                    200 => r.json()["versions"].as_array().unwrap().len(),
                    404 => 0,
                    other => panic!("versions of cust-{id}: {other} {}", r.text),
                };
                (id, want, got)
            })
            .buffer_unordered(8)
            .collect()
            .await;
        let twice: Vec<_> = seen.iter().filter(|(_, want, got)| got > want).collect();
        assert!(
            twice.is_empty(),
            "changes applied more than once (id, changes, versions): {:?}",
            &twice[..twice.len().min(20)]
        );
        pending = seen
            .iter()
            .filter(|(_, want, got)| got < want)
            .map(|(id, want, _)| (*id, *want))
            .collect();
        if pending.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} rows lack versions, e.g. {:?}\n{}",
            pending.len(),
            changes.len(),
            &pending[..pending.len().min(20)],
            s.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // and the current documents are the rows that remain, each as the row is now
    let live = c.list("/customer/api").await;
    assert_eq!(live.len(), rows, "a document per remaining row");
    let totals = psql(
        &legacy.url,
        "SELECT acct_id, COALESCE(tot_amt, -1) FROM cust_acct ORDER BY acct_id",
    );
    let want: std::collections::BTreeMap<u64, i64> = totals
        .lines()
        .filter_map(|l| l.split_once('|'))
        .map(|(id, t)| (id.parse().unwrap(), t.parse().unwrap()))
        .collect();
    let got: std::collections::BTreeMap<u64, i64> = live
        .iter()
        .map(|d| {
            let total = d["total"]
                .as_f64()
                .map_or(-1, |t| (t * 100.0).round() as i64);
            (d["legacy_id"].as_u64().unwrap(), total)
        })
        .collect();
    assert_eq!(got, want, "the documents are the rows as they are now");
    eprintln!(
        "kill -9 x4: {inserts} inserts, {updates} updates, {deletes} deletes; {} rows, one version per change",
        changes.len()
    );
}

/// `meshql cdc` and `meshql check` against the real server (their output as text).
fn meshql(args: &[&str]) -> (bool, String) {
    let out = run_meshql(args, Duration::from_secs(60));
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_are_listed_an_abandoned_one_is_warned_about_and_dropped() {
    let legacy = Legacy::new(&run_id());
    psql(
        &legacy.url,
        "INSERT INTO cust_acct (acct_num, stat_cd) VALUES ('1', 'A')",
    );
    let dir = tempfile::tempdir().unwrap();
    service(dir.path(), &legacy);
    let config = dir.path().join("meshql.toml");
    let config = config.to_str().unwrap();
    let s = Server::start(Path::new(config), &[]);
    until(&s, "1", "the snapshot", |d| d.is_some()).await;
    // a slot of an earlier config that nothing reads any more
    let orphan = format!("{}_old", legacy.slot);
    psql(
        &legacy.url,
        &format!("SELECT pg_create_logical_replication_slot('{orphan}', 'pgoutput')"),
    );

    let (ok, listed) = meshql(&["cdc", "slots", config]);
    assert!(ok, "{listed}");
    let line = |name: &str| {
        listed
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("{name} not listed:\n{listed}"))
            .to_owned()
    };
    assert!(
        line(&legacy.slot).contains("processor customers"),
        "{listed}"
    );
    assert!(line(&legacy.slot).contains(" active"), "{listed}");
    assert!(
        line(&orphan).contains("no processor of this config"),
        "{listed}"
    );

    let (ok, checked) = meshql(&["check", config]);
    assert!(ok, "{checked}");
    assert!(
        checked.contains(&format!("warning: replication slot {orphan} "))
            && checked.contains("drop-slot"),
        "{checked}"
    );
    assert!(
        !checked.contains(&format!("slot {} ", legacy.slot)),
        "{checked}"
    );

    // the slot a processor reads is not dropped without --force
    let (ok, refused) = meshql(&["cdc", "drop-slot", &legacy.slot, config]);
    assert!(
        !ok && refused.contains("processor customers reads slot"),
        "{refused}"
    );
    let (ok, dropped) = meshql(&["cdc", "drop-slot", &orphan, config]);
    assert!(ok, "{dropped}");
    let left = psql(
        &legacy.admin,
        &format!("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{orphan}'"),
    );
    assert_eq!(left, "0");
    let (ok, checked) = meshql(&["check", config]);
    assert!(
        ok && !checked.contains("warning: replication slot"),
        "{checked}"
    );
    // the processor's lag is the WAL its slot keeps past what it confirmed
    let metrics = s.client().get("/metrics").await.text;
    assert!(
        metrics.contains(
            "meshql_processor_lag{processor=\"customers\",type=\"script\",output=\"customer\"}"
        ),
        "{metrics}"
    );
}

/// The id a legacy row's document gets (mapping.rs: UUIDv5 in its namespace of the JSON
/// text `["<table>","<key>"]`), computed here from the documented rule.
fn legacy_doc_id(table: &str, key: &str) -> String {
    let namespace = uuid::Uuid::parse_str("6fa4a995-5b3f-41d4-a4a1-13b2a525552a").unwrap();
    uuid::Uuid::new_v5(&namespace, format!("[\"{table}\",\"{key}\"]").as_bytes()).to_string()
}

/// Debezium's PostgreSQL connector, already deployed, pointed at meshql: its change events on
/// Kafka (snapshot read, update, delete and the tombstone after it) through a declared mapping
/// become the same documents as rows captured directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_change_events_from_kafka_become_the_rows_documents() {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let brokers = meshql_conformance::test_server_url("kafka", "MESHQL_TEST_KAFKA_BROKERS");
    let topic = format!("legacy{}.public.cust_acct", run_id());
    let dir = tempfile::tempdir().unwrap();
    customer_service(
        dir.path(),
        &format!(
            r#"[[processor]]
name = "customers"
type = "mapping"
inputs = ["cust_acct"]
output = "customer"
source = {{ type = "kafka", brokers = "{brokers}", topics = ["{topic}"], format = "debezium" }}

[processor.mapping]
table = "cust_acct"
key = ["acct_id"]

[processor.mapping.fields]
account_number = "acct_num"
first_name = {{ title = "cust_nm_first" }}
status = {{ code = "stat_cd", map = {{ A = "active", S = "suspended", C = "closed" }} }}
total = {{ cents = "tot_amt" }}
"#
        ),
    );
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .unwrap();
    let event = |op: &str, before: Value, after: Value| {
        json!({"schema": {"type": "struct"}, "payload": {"before": before, "after": after, "op": op,
            "ts_ms": 1_764_000_000_000u64,
            "source": {"connector": "postgresql", "db": "springfield_electric", "schema": "public", "table": "cust_acct"}}})
        .to_string()
    };
    let row = |id: i64, first: &str, stat: &str, amt: i64| json!({"acct_id": id, "acct_num": format!("100100-0000{id}"), "cust_nm_first": first, "stat_cd": stat, "tot_amt": amt});
    let messages = [
        (
            1,
            Some(event("r", Value::Null, row(1, "MARGARET", "A", 9840))),
        ),
        (
            2,
            Some(event("r", Value::Null, row(2, "KENJI", "A", 42000))),
        ),
        (
            1,
            Some(event(
                "u",
                row(1, "MARGARET", "A", 9840),
                row(1, "MARGARET", "S", 100),
            )),
        ),
        (
            2,
            Some(event("d", row(2, "KENJI", "A", 42000), Value::Null)),
        ),
        (2, None), // the tombstone Debezium writes after a delete
    ];
    for (key, value) in messages {
        let key = json!({"acct_id": key}).to_string();
        let mut record = FutureRecord::<String, String>::to(&topic).key(&key);
        if let Some(v) = &value {
            record = record.payload(v);
        }
        producer
            .send(record, Duration::from_secs(10))
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }
    let s = Server::start(&dir.path().join("meshql.toml"), &[]);
    let (one, two) = (
        legacy_doc_id("cust_acct", "1"),
        legacy_doc_id("cust_acct", "2"),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let a = s.client().get(&format!("/customer/api/{one}")).await;
        let b = s.client().get(&format!("/customer/api/{two}")).await;
        if a.status == 200 && a.json()["status"] == "suspended" && b.status == 404 {
            let doc = a.json();
            assert_eq!(doc["first_name"], "Margaret");
            assert_eq!(doc["total"].as_f64(), Some(1.0));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} {}\n{}",
            a.text,
            b.text,
            s.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(s.client().list("/customer/api").await.len(), 1);
}

/// A legacy table whose rows cannot be told apart (no primary key) is refused with a message
/// that says so, counted as the processor's errors, and the service serves meanwhile; a slot
/// that does not exist is named when an operator tries to drop it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_without_a_primary_key_is_refused_by_name_and_the_service_serves() {
    let legacy = Legacy::new(&run_id());
    psql(
        &legacy.url,
        "ALTER TABLE cust_acct DROP CONSTRAINT cust_acct_pkey; \
         INSERT INTO cust_acct (acct_num, stat_cd) VALUES ('1', 'A')",
    );
    let dir = tempfile::tempdir().unwrap();
    service(dir.path(), &legacy);
    let config = dir.path().join("meshql.toml");
    let s = Server::start(&config, &[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !s.log().contains("table cust_acct has no primary key") {
        assert!(
            Instant::now() < deadline,
            "no refusal in the log:\n{}",
            s.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let metrics = s.client().get("/metrics").await.text;
    let errors: f64 = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(
                "meshql_processor_errors_total{processor=\"customers\",type=\"script\",output=\"customer\"} ",
            )
        })
        .unwrap_or_else(|| panic!("no errors series:\n{metrics}"))
        .trim()
        .parse()
        .unwrap();
    assert!(errors >= 1.0, "{metrics}");
    s.client().get("/customer/api").await.expect_status(200);
    assert!(s.client().list("/customer/api").await.is_empty());
    let (ok, said) = meshql(&[
        "cdc",
        "drop-slot",
        "meshql_no_such_slot",
        config.to_str().unwrap(),
    ]);
    assert!(
        !ok && said.contains("no slot meshql_no_such_slot"),
        "{said}"
    );
}

/// The test PostgreSQL's certificate directory (`ca.crt`, `other-ca.crt`).
fn postgres_tls_dir() -> std::path::PathBuf {
    common::postgres_url(); // started, with TLS on
    let out = Command::new("bash")
        .arg(common::examples_dir().join("../scripts/services/postgres.sh"))
        .arg("tls")
        .output()
        .unwrap();
    std::path::PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// `sslmode=verify-full`: a CA that did not sign the server's certificate stops the capture
/// with the reason in the log (nothing is read in clear); the right one captures over TLS, on
/// the SQL connection and the replication connection both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capture_over_tls_checks_the_servers_certificate() {
    let tls = postgres_tls_dir();
    let legacy = Legacy::new(&run_id());
    psql(
        &legacy.url,
        "INSERT INTO cust_acct (acct_num, cust_nm_first, stat_cd) VALUES ('1', 'ANN', 'A')",
    );
    let url = |ca: &str| {
        format!(
            "{}?sslmode=verify-full&sslrootcert={}",
            legacy.url,
            tls.join(ca).display()
        )
    };

    let dir = tempfile::tempdir().unwrap();
    service_at(dir.path(), &legacy, &url("other-ca.crt"));
    let s = Server::start(&dir.path().join("meshql.toml"), &[]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !s.log().contains("UnknownIssuer") {
        assert!(Instant::now() < deadline, "no TLS reason:\n{}", s.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(s.client().get("/customer/api/cust-1").await.status, 404);
    drop(s);

    let dir = tempfile::tempdir().unwrap();
    service_at(dir.path(), &legacy, &url("ca.crt"));
    let s = Server::start(&dir.path().join("meshql.toml"), &[]);
    until(&s, "1", "the snapshot over TLS", |d| d.is_some()).await;
    psql(
        &legacy.url,
        "INSERT INTO cust_acct (acct_num, cust_nm_first, stat_cd) VALUES ('2', 'BO', 'A')",
    );
    until(&s, "2", "the stream over TLS", |d| d.is_some()).await;
    let encrypted = psql(
        &legacy.admin,
        &format!(
            "SELECT count(*) FILTER (WHERE s.ssl) || '/' || count(*) FROM pg_stat_activity a \
             JOIN pg_stat_ssl s USING (pid) WHERE a.application_name = 'meshql {}'",
            legacy.slot
        ),
    );
    assert_eq!(encrypted, "1/1", "the replication connection is encrypted");
}

/// A row copied by the snapshot and the same row sent by the stream give the same document,
/// whatever the column types: arrays, time stamps, dates, uuids, numerics, booleans, JSON
/// (the snapshot once gave arrays as JSON arrays and time stamps in ISO form, the stream
/// PostgreSQL's text of them). Generated columns, which the stream does not send, are not
/// copied either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_snapshot_and_the_stream_give_a_row_the_same_values() {
    let run = run_id();
    let legacy = Legacy::new(&run);
    psql(
        &legacy.url,
        "CREATE TABLE thing (id int PRIMARY KEY, tags text[], at timestamptz, day date, \
         uid uuid, amount numeric(10,2), ok boolean, doc jsonb, big bigint, ratio float8, \
         code char(4), twice int GENERATED ALWAYS AS (id * 2) STORED); \
         INSERT INTO thing (id, tags, at, day, uid, amount, ok, doc, big, ratio, code) VALUES \
         (1, '{a,\"b c\"}', '2025-06-01 12:00:00+00', '2025-06-01', \
          'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 98.40, true, '{\"k\": [1, 2]}', \
          9007199254740993, 0.5, 'AB')",
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("meshql.toml"),
        format!(
            r#"port = 4999
data_dir = "${{MESHQL_DATA_DIR:-data}}"

[storage.default]
type = "sqlite"
file = "clean.db"

[changes]
enabled = true

[[entity]]
name = "thing"

[entity.rest]
path = "/thing/api"

[[processor]]
name = "things"
type = "mapping"
inputs = ["thing"]
output = "thing"
source = {{ type = "postgres_cdc", url = "{url}", publication = "{slot}", slot = "{slot}", tables = ["thing"] }}

[processor.mapping]
key = ["id"]

[processor.mapping.fields]
tags = "tags"
at = "at"
day = "day"
uid = "uid"
amount = "amount"
ok = "ok"
doc = "doc"
big = "big"
ratio = "ratio"
code = "code"
twice = "twice"
"#,
            url = legacy.url,
            slot = legacy.slot
        ),
    )
    .unwrap();
    let s = Server::start(&dir.path().join("meshql.toml"), &[]);
    let doc = |key: &'static str| {
        let s = &s;
        async move {
            let id = legacy_doc_id("thing", key);
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let r = s.client().get(&format!("/thing/api/{id}")).await;
                if r.status == 200 {
                    let mut d = r.json();
                    d.as_object_mut().unwrap().remove("id");
                    return d;
                }
                assert!(Instant::now() < deadline, "row {key}:\n{}", s.log());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let copied = doc("1").await;
    psql(
        &legacy.url,
        "INSERT INTO thing (id, tags, at, day, uid, amount, ok, doc, big, ratio, code) \
         SELECT 2, tags, at, day, uid, amount, ok, doc, big, ratio, code FROM thing WHERE id = 1",
    );
    let streamed = doc("2").await;
    assert_eq!(copied, streamed);
    assert_eq!(
        copied,
        json!({"tags": "{a,\"b c\"}", "at": "2025-06-01 12:00:00+00", "day": "2025-06-01",
               "uid": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "amount": 98.4, "ok": true,
               "doc": {"k": [1, 2]}, "big": 9007199254740993_i64, "ratio": 0.5, "code": "AB",
               "twice": null})
    );
}

/// `create = false`: a publication that does not exist is an error naming it (the service
/// serves meanwhile, and the processor tries again with a back-off); once an operator makes
/// it, the capture starts on its own and the rows arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_publication_is_named_and_the_capture_starts_once_it_exists() {
    let legacy = Legacy::new(&run_id());
    psql(
        &legacy.url,
        "INSERT INTO cust_acct (acct_num, cust_nm_first, stat_cd) VALUES ('1', 'ANN', 'A')",
    );
    let dir = tempfile::tempdir().unwrap();
    service(dir.path(), &legacy);
    let config = dir.path().join("meshql.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace(
            "tables = [\"cust_acct\"] }",
            "tables = [\"cust_acct\"], create = false }",
        ),
    )
    .unwrap();
    let s = Server::start(&config, &[]);
    let named = format!(
        "publication `{}` does not exist (create = false)",
        legacy.slot
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !s.log().contains(&named) {
        assert!(Instant::now() < deadline, "no `{named}`:\n{}", s.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    s.client().get("/customer/api").await.expect_status(200);
    assert!(s.client().list("/customer/api").await.is_empty());

    psql(
        &legacy.url,
        &format!("CREATE PUBLICATION {} FOR TABLE cust_acct", legacy.slot),
    );
    until(&s, "1", "the row once the publication exists", |d| {
        d.is_some_and(|d| d["first_name"] == "ANN")
    })
    .await;
}
