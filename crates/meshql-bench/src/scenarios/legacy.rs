//! `legacy`: change capture from a legacy PostgreSQL into a clean entity — the issue's
//! "legacy INSERT → clean document readable through GraphQL" and "initial snapshot of a
//! 1,000,000-row legacy table" — with the `postgres_cdc` source and a declared `mapping`
//! processor, as `examples/legacy` runs them.
//!
//! The PostgreSQL is `--legacy-url` (`MESHQL_BENCH_LEGACY_URL`, default the one
//! `scripts/services/postgres.sh start` runs, `wal_level = logical`); without it, or with
//! another `wal_level`, the scenario fails naming the URL and that command. It makes a database
//! of its own there (`meshql_bench_legacy_<pid>_<n>`) with one legacy table, `cust_acct`: a
//! `SERIAL` key, `VARCHAR` account number and upper-case name, a one-letter status code, a
//! `YYYYMMDD` date as text, an amount in cents and a `Y`/`N` flag. A temporary config serves
//! the clean entity `customer` (REST and GraphQL, SQLite, `[changes] enabled = true`) written
//! by a `mapping` processor reading the table through `postgres_cdc` (title-cased name, the
//! code expanded, an ISO date, dollars, a boolean; the document's id is
//! [`legacy_id`]`("cust_acct", [acct_id])`). The replication slot and the database are always
//! dropped at the end, whatever happened (a slot nothing reads keeps the server's WAL); ones
//! left behind by a bench that was killed are dropped at the next start.
//!
//! 1. **Snapshot.** `--legacy-rows` rows (default 1,000,000) are inserted with one `INSERT …
//!    SELECT generate_series` before meshql starts; then meshql starts on the config, makes
//!    the slot and copies the table. Measured: from just before `meshql serve` is spawned until
//!    the processor's committed outputs (`meshql_processor_outputs_total` in `/metrics`,
//!    counted after each batch's transaction commits, polled every 20 ms) reach the row count.
//!    Goal ≥ 20,000 rows/s on 1,000,000 rows. Then a few copied rows are read through GraphQL
//!    `getById` and compared with the clean document expected from their columns.
//! 2. and 3. **INSERT → readable** at a constant arrival rate of 100 and 1,000 rows/s for
//!    `--duration` (default 10 s): each row is one `INSERT … RETURNING acct_id` in its own
//!    transaction (`synchronous_commit = on`, four connections), stamped just before it is
//!    sent. Arrival = when the bench's SSE reader (a thread of its own) read the clean
//!    document's change on `/_changes?entity=customer`, matched by its account number; the
//!    feed only holds committed versions, so the document is readable through GraphQL by then.
//!    That is checked too: every 10th row, once its change has arrived, is read with GraphQL
//!    `getById` (the id the mapping computes from the key `RETURNING` gave) and compared with
//!    the clean document expected. Each run reports p50/p95/p99/max (goal p99 < 100 ms;
//!    MeshQL's Debezium path took seconds).
//!
//! The gate: every committed row's document arrives once (none lost 10 s after the run, none
//! twice: a second version on the feed counts as duplicated), every sampled GraphQL read
//! answers the clean document, no dead letters, and at the end the processor has written
//! exactly one version per row of the table.

use super::changes::kafka::toml_string;
use super::changes::{ms, open_model, Reader, Tracker, ARRIVAL_TIMEOUT};
use super::{Ctx, Example, Scenario};
use crate::client::{Session, Target};
use crate::gate::{self, GateResult, ScenarioError};
use crate::load::{RunOutcome, Vu, Workload};
use crate::monitor::Live;
use crate::server::{LocalServer, ServerSpec};
use crate::stats::Outcome;
use async_trait::async_trait;
use http::Method;
use meshql_core::legacy_id::legacy_id;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_postgres::{Client, NoTls, Statement};

pub struct Legacy;

/// Goal of the snapshot (rows/s, on 1,000,000 rows).
const GOAL_SNAPSHOT_ROWS_PER_S: f64 = 20_000.0;
/// Goal of INSERT → readable (p99, ms).
const GOAL_P99_MS: f64 = 100.0;
/// Arrival rates of the latency runs (rows/s).
const RATES: [f64; 2] = [100.0, 1_000.0];
/// Connections inserting the rows of a latency run.
const WRITERS: usize = 4;
/// Every this many rows one is read through GraphQL once its change arrived.
const SAMPLE_EVERY: usize = 10;
const TABLE: &str = "cust_acct";
const PROCESSOR: &str = "customers";
const GRAPH: &str = "/customer/graph";
const STREAM: &str = "/_changes?since=now&entity=customer";
/// Names of the scenario's databases and slots: `<PREFIX><pid>_<n>`.
const PREFIX: &str = "meshql_bench_legacy_";
/// How often the snapshot's progress is read.
const POLL: Duration = Duration::from_millis(20);
/// A snapshot whose outputs do not grow for this long has failed.
const STALL: Duration = Duration::from_secs(60);

const CREATE_TABLE: &str = "CREATE TABLE cust_acct (
    acct_id       SERIAL PRIMARY KEY,
    acct_num      VARCHAR(32) NOT NULL,
    cust_nm       VARCHAR(60) NOT NULL,
    stat_cd       VARCHAR(1) NOT NULL,  -- A / S / C
    conn_dt       VARCHAR(8) NOT NULL,  -- YYYYMMDD
    bal_amt       INT NOT NULL,         -- cents
    paperless_flg VARCHAR(1) NOT NULL DEFAULT 'N'
)";

const INSERT: &str = "INSERT INTO cust_acct (acct_num, cust_nm, stat_cd, conn_dt, bal_amt, \
                      paperless_flg) VALUES ($1, $2, $3, $4, $5, $6) RETURNING acct_id";

/// The snapshot's rows: row `g` has the columns [`LegacyRow::new`]`("S-<g>", g)` gives.
fn seed_sql(rows: usize) -> String {
    format!(
        "INSERT INTO cust_acct (acct_num, cust_nm, stat_cd, conn_dt, bal_amt, paperless_flg)
         SELECT 'S-' || g, 'CUSTOMER ' || g || ' O''NEIL-SMITH', (ARRAY['A', 'S', 'C'])[1 + g % 3],
                to_char(make_date(1990 + g % 30, 1 + g % 12, 1 + g % 28), 'YYYYMMDD'),
                ((g::bigint * 37) % 1000000)::int, CASE WHEN g % 2 = 0 THEN 'Y' ELSE 'N' END
         FROM generate_series(1, {rows}) AS g"
    )
}

/// The service: `customer` on SQLite, written by a mapping of `cust_acct` read from `url`.
fn config(url: &str, slot: &str) -> String {
    format!(
        r#"# written by `meshql bench legacy` (the bench passes --port and --data-dir)
port = 4998

[storage.default]
type = "sqlite"
file = "legacy.db"

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

[[processor]]
name = "{PROCESSOR}"
type = "mapping"
inputs = ["cust_acct"]
output = "customer"
source = {{ type = "postgres_cdc", url = {url}, publication = "meshql_bench_legacy", slot = {slot}, tables = ["cust_acct"] }}

[processor.mapping]
table = "cust_acct"
key = ["acct_id"]

[processor.mapping.fields]
legacy_acct_id = {{ int = "acct_id" }}
account_number = "acct_num"
name = {{ title = "cust_nm" }}
status = {{ code = "stat_cd", map = {{ A = "active", S = "suspended", C = "closed" }} }}
connected_date = {{ date = "conn_dt" }}
balance = {{ cents = "bal_amt" }}
paperless = {{ flag = "paperless_flg" }}
"#,
        url = toml_string(url),
        slot = toml_string(slot),
    )
}

const SCHEMA: &str = r#"{"type": "object", "properties": {
  "legacy_acct_id": {"type": "integer"}, "account_number": {"type": "string"},
  "name": {"type": "string"}, "status": {"type": "string"},
  "connected_date": {"type": ["string", "null"]}, "balance": {"type": "number"},
  "paperless": {"type": "boolean"}}, "required": ["account_number", "status"]}"#;

const GRAPHQL: &str = "type Customer { id: ID, legacy_acct_id: Int, account_number: String, \
    name: String, status: String, connected_date: String, balance: Float, paperless: Boolean }\n\
    type Query { getById(id: ID, at: Float): Customer }\n";

const STATUS: [(&str, &str); 3] = [("A", "active"), ("S", "suspended"), ("C", "closed")];

/// The columns of one legacy row, made from a number, and what its clean document must say.
struct LegacyRow {
    acct_num: String,
    n: u64,
    cust_nm: String,
    conn_dt: String,
    bal_amt: i32,
}

impl LegacyRow {
    fn new(acct_num: String, n: u64) -> Self {
        Self {
            acct_num,
            n,
            cust_nm: format!("CUSTOMER {n} O'NEIL-SMITH"),
            conn_dt: format!("{:04}{:02}{:02}", 1990 + n % 30, 1 + n % 12, 1 + n % 28),
            bal_amt: ((n * 37) % 1_000_000) as i32,
        }
    }

    fn stat_cd(&self) -> &'static str {
        STATUS[(self.n % 3) as usize].0
    }

    fn paperless_flg(&self) -> &'static str {
        if self.n.is_multiple_of(2) {
            "Y"
        } else {
            "N"
        }
    }

    /// `doc` (a GraphQL `getById`) is this row's clean document, whose key is `acct_id`.
    fn check(&self, acct_id: i32, doc: &Value) -> Result<(), String> {
        if doc.is_null() {
            return Err("getById answered null".into());
        }
        let d = &self.conn_dt;
        let expected = [
            ("legacy_acct_id", json!(acct_id)),
            ("account_number", json!(self.acct_num)),
            ("name", json!(format!("Customer {} O'Neil-Smith", self.n))),
            ("status", json!(STATUS[(self.n % 3) as usize].1)),
            (
                "connected_date",
                json!(format!("{}-{}-{}", &d[..4], &d[4..6], &d[6..])),
            ),
            ("paperless", json!(self.n.is_multiple_of(2))),
        ];
        for (field, want) in expected {
            if doc[field] != want {
                return Err(format!("{field}: expected {want}, got {}", doc[field]));
            }
        }
        let balance = self.bal_amt as f64 / 100.0;
        match doc["balance"].as_f64() {
            Some(b) if (b - balance).abs() < 1e-9 => Ok(()),
            _ => Err(format!(
                "balance: expected {balance}, got {}",
                doc["balance"]
            )),
        }
    }
}

fn get_by_id(acct_id: i32) -> String {
    let id = legacy_id(TABLE, &[&json!(acct_id)]).expect("an integer key has an id");
    format!(
        "{{ getById(id: \"{id}\") {{ legacy_acct_id account_number name status connected_date balance paperless }} }}"
    )
}

/// `url` with its database replaced by `name` (query parameters kept).
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let host = base.find("://").map_or(0, |i| i + 3);
    let base = match base[host..].find('/') {
        Some(i) => &base[..host + i],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    }
}

/// `url` without its password, for messages and reports.
fn redact(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://") {
        if let Some((userinfo, host)) = rest.rsplit_once('@') {
            if let Some((user, _)) = userinfo.split_once(':') {
                return format!("{scheme}://{user}:***@{host}");
            }
        }
    }
    url.to_string()
}

/// A PostgreSQL error with its causes (`db error: ERROR: …`, `error connecting to server:
/// Connection refused …`).
fn pg(e: &tokio_postgres::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

async fn connect(url: &str) -> Result<Client, String> {
    let connecting = tokio_postgres::connect(url, NoTls);
    let (client, connection) = tokio::time::timeout(Duration::from_secs(10), connecting)
        .await
        .map_err(|_| "no answer within 10 s".to_string())?
        .map_err(|e| pg(&e))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// The administrative connection to `--legacy-url`, once it is known to allow logical
/// replication.
async fn connect_checked(url: &str) -> GateResult<Client> {
    let fix = "start one with `scripts/services/postgres.sh start` (wal_level = logical, 127.0.0.1:55432), or point --legacy-url (MESHQL_BENCH_LEGACY_URL) at a PostgreSQL with wal_level = logical";
    let client = connect(url).await.map_err(|e| {
        ScenarioError::Setup(format!(
            "the legacy PostgreSQL at {} is not reachable ({e}): {fix}",
            redact(url)
        ))
    })?;
    let level: String = client
        .query_one("SHOW wal_level", &[])
        .await
        .map_err(|e| {
            ScenarioError::Setup(format!("SHOW wal_level on {}: {}", redact(url), pg(&e)))
        })?
        .get(0);
    if level != "logical" {
        return Err(ScenarioError::Setup(format!(
            "the legacy PostgreSQL at {} has wal_level = {level}; change capture needs logical: {fix}",
            redact(url)
        )));
    }
    Ok(client)
}

/// Drops the slots and databases of earlier runs whose bench process is gone (killed before
/// it could clean up); returns their names.
async fn sweep(admin: &Client) -> Vec<String> {
    let gone = |name: &str| {
        name.strip_prefix(PREFIX)
            .and_then(|rest| rest.split('_').next()?.parse::<u32>().ok())
            .is_some_and(|pid| {
                pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists()
            })
    };
    let names = |sql: &'static str| async move {
        admin
            .query(sql, &[])
            .await
            .map(|rows| rows.iter().map(|r| r.get::<_, String>(0)).collect())
            .unwrap_or_else(|_| Vec::<String>::new())
    };
    let mut swept = Vec::new();
    for slot in names(
        "SELECT slot_name::text FROM pg_replication_slots WHERE left(slot_name, 20) = 'meshql_bench_legacy_' AND NOT active",
    )
    .await
    {
        if gone(&slot)
            && admin
                .batch_execute(&format!("SELECT pg_drop_replication_slot('{slot}')"))
                .await
                .is_ok()
        {
            swept.push(format!("slot {slot}"));
        }
    }
    for db in names(
        "SELECT datname::text FROM pg_database WHERE left(datname, 20) = 'meshql_bench_legacy_'",
    )
    .await
    {
        // without FORCE: a database someone is connected to stays
        if gone(&db)
            && admin
                .batch_execute(&format!("DROP DATABASE IF EXISTS {db}"))
                .await
                .is_ok()
        {
            swept.push(format!("database {db}"));
        }
    }
    swept
}

/// Drops the scenario's replication slot (once meshql's session has let go of it) and
/// database.
async fn drop_slot_and_database(admin_url: &str, name: &str) -> Result<(), String> {
    let admin = connect(admin_url).await?;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let rows = admin
            .query(
                "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
                &[&name],
            )
            .await
            .map_err(|e| format!("reading pg_replication_slots: {}", pg(&e)))?;
        let Some(row) = rows.first() else {
            break;
        };
        let holder: Option<i32> = row.get(0);
        match holder {
            None => match admin
                .batch_execute(&format!("SELECT pg_drop_replication_slot('{name}')"))
                .await
            {
                Ok(()) => break,
                Err(e) if Instant::now() > deadline => {
                    return Err(format!("dropping the slot {name}: {}", pg(&e)))
                }
                Err(_) => {}
            },
            // meshql has stopped; a session still holding the slot is ended
            Some(pid) if Instant::now() > deadline => {
                let _ = admin
                    .execute("SELECT pg_terminate_backend($1)", &[&pid])
                    .await;
            }
            Some(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .await
        .map_err(|e| format!("dropping the database {name}: {}", pg(&e)))
}

/// Drops the slot and database when the scenario ends by a panic ([`Cleanup::run`] does on
/// every other way out).
struct Cleanup {
    admin_url: String,
    name: String,
    armed: bool,
}

impl Cleanup {
    async fn run(mut self) -> Result<(), String> {
        self.armed = false;
        drop_slot_and_database(&self.admin_url, &self.name).await
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (url, name) = (self.admin_url.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                if let Err(e) = rt.block_on(drop_slot_and_database(&url, &name)) {
                    eprintln!("legacy: cleaning up {name}: {e}");
                }
            }
        })
        .join();
    }
}

/// The processor's series `name` in a `/metrics` text.
fn processor_metric(metrics: &str, name: &str) -> Option<u64> {
    let label = format!("processor=\"{PROCESSOR}\"");
    metrics
        .lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|r| r.starts_with('{')) && l.contains(&label))
        .find_map(|l| l.rsplit_once(' ')?.1.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

/// The processor's counters: (outputs, dead letters, errors).
async fn processor_counters(s: &mut Session) -> Option<(u64, u64, u64)> {
    let reply = s.send(Method::GET, "/metrics", None).await.ok()?;
    counters_of(&String::from_utf8_lossy(&reply.body))
}

fn counters_of(text: &str) -> Option<(u64, u64, u64)> {
    Some((
        processor_metric(text, "meshql_processor_outputs_total")?,
        processor_metric(text, "meshql_processor_dead_letters").unwrap_or(0),
        processor_metric(text, "meshql_processor_errors_total").unwrap_or(0),
    ))
}

/// What the snapshot watch saw.
#[derive(Default)]
struct Watched {
    /// When the first copied rows were committed (from the spawn).
    first: Option<Duration>,
    outputs: u64,
    errors: u64,
    failure: Option<String>,
}

/// Polls `/metrics` until the processor's outputs reach `rows`; the run's time is from
/// `spawned`.
async fn watch_snapshot(
    target: Target,
    live: Arc<Live>,
    rows: u64,
    spawned: Instant,
    watched: Arc<Mutex<Watched>>,
) -> RunOutcome {
    let limit = Duration::from_secs(120 + rows / 5_000);
    let mut s = Session::new(target);
    let mut progressed = Instant::now();
    let mut outputs = 0;
    let mut refused = 0;
    let failure = loop {
        let reply = s.call("metrics_poll", Method::GET, "/metrics", None).await;
        live.add_requests(1);
        let counters = reply
            .filter(|r| r.status.is_success())
            .and_then(|r| counters_of(&String::from_utf8_lossy(&r.body)));
        match counters {
            Some((out, dead, errors)) => {
                refused = 0;
                let mut w = watched.lock().expect("watch lock");
                w.errors = errors;
                if out > outputs {
                    outputs = out;
                    w.outputs = out;
                    progressed = Instant::now();
                    w.first.get_or_insert(spawned.elapsed());
                }
                if outputs >= rows {
                    break None;
                }
                if dead > 0 {
                    break Some(format!("{dead} legacy rows became dead letters"));
                }
            }
            None => {
                refused += 1;
                if refused >= 50 {
                    break Some("/metrics stopped answering (did meshql exit?)".into());
                }
            }
        }
        if progressed.elapsed() > STALL || spawned.elapsed() > limit {
            let errors = watched.lock().expect("watch lock").errors;
            break Some(format!(
                "{outputs} of {rows} rows copied after {:.0} s, none for the last {:.0} s; the processor counts {errors} errors (meshql_processor_errors_total: is the legacy user allowed to replicate?)",
                spawned.elapsed().as_secs_f64(),
                progressed.elapsed().as_secs_f64(),
            ));
        }
        tokio::time::sleep(POLL).await;
    };
    let elapsed = spawned.elapsed();
    watched.lock().expect("watch lock").failure = failure;
    RunOutcome {
        recorder: s.recorder,
        schedule_lag: hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 3)
            .expect("static bounds"),
        elapsed,
        iterations: outputs,
        dropped: 0,
        peak_vus: 1,
    }
}

/// Run 1: the server starts on `config` with `rows` rows in the table; measured until they
/// are all clean documents.
async fn snapshot(ctx: &mut Ctx, config: &Path, rows: usize) -> GateResult<()> {
    let spec = ServerSpec {
        exe: ctx.opts.exe.clone(),
        config: config.to_path_buf(),
        workers: ctx.opts.server_workers(),
        env: Vec::new(),
        args: Vec::new(),
        data_dir: None,
    };
    if !ctx.opts.quiet {
        eprintln!("legacy: starting meshql serve {}", config.display());
    }
    let spawned = Instant::now();
    let server = LocalServer::start(spec)
        .await
        .map_err(|e| ScenarioError::Setup(format!("meshql on the legacy config: {e}")))?;
    let ready = spawned.elapsed();
    ctx.target = Target::parse(&server.url()).map_err(|e| ScenarioError::Setup(e.to_string()))?;
    ctx.server = Some(server);
    let watched = Arc::new(Mutex::new(Watched::default()));
    let planned = Duration::from_secs_f64(rows as f64 / 24_000.0);
    let label = format!("snapshot_{rows}_rows");
    let model = format!(
        "{rows} legacy rows present when meshql starts; /metrics polled every {} ms",
        POLL.as_millis()
    );
    let w = watched.clone();
    let run = ctx
        .measure(&label, model, planned, None, move |target, live| {
            watch_snapshot(target, live, rows as u64, spawned, w)
        })
        .await;
    let run = ctx.listed(run);
    let w = std::mem::take(&mut *watched.lock().expect("watch lock"));
    if let Some(failure) = w.failure {
        return Err(ScenarioError::Gate(format!("the snapshot: {failure}")));
    }
    let secs = run.duration_s;
    let rate = rows as f64 / secs;
    let from_ready = rows as f64 / (secs - ready.as_secs_f64()).max(1e-3);
    let first = w.first.unwrap_or_default().as_secs_f64();
    if let Some(r) = ctx.runs.last_mut() {
        let m = &mut r.metrics;
        m.insert("snapshot_rows".into(), rows as f64);
        m.insert("snapshot_rows_per_s".into(), rate);
        m.insert("snapshot_rows_per_s_from_ready".into(), from_ready);
        m.insert("snapshot_ready_s".into(), ready.as_secs_f64());
        m.insert("snapshot_first_commit_s".into(), first);
        m.insert("snapshot_outputs".into(), w.outputs as f64);
    }
    ctx.note(format!(
        "snapshot: {rows} legacy rows → clean customer documents in {secs:.2} s from meshql's spawn = {rate:.0} rows/s (goal ≥ 20,000 on 1,000,000 rows: {}); ready after {:.2} s, first copy transaction committed after {first:.2} s, {from_ready:.0} rows/s from ready",
        if rate >= GOAL_SNAPSHOT_ROWS_PER_S { "met" } else { "NOT met" },
        ready.as_secs_f64(),
    ));
    Ok(())
}

/// Copied rows read through GraphQL are their clean documents.
async fn gate_snapshot(ctx: &Ctx, db: &Client, rows: usize) -> GateResult<()> {
    let mut s = ctx.session();
    let mut sample = vec![1, rows.div_ceil(2), rows];
    sample.dedup();
    for g in sample {
        let acct_num = format!("S-{g}");
        let acct_id: i32 = db
            .query_one(
                "SELECT acct_id FROM cust_acct WHERE acct_num = $1",
                &[&acct_num],
            )
            .await
            .map_err(|e| {
                ScenarioError::Setup(format!("reading legacy row {acct_num}: {}", pg(&e)))
            })?
            .get(0);
        let data = gate::query(&mut s, GRAPH, &get_by_id(acct_id)).await?;
        LegacyRow::new(acct_num.clone(), g as u64)
            .check(acct_id, &data["getById"])
            .map_err(|e| {
                ScenarioError::Gate(format!(
                    "the copied row {acct_num} (acct_id {acct_id}) through GraphQL: {e}"
                ))
            })?;
    }
    Ok(())
}

/// One inserting connection.
struct Writer {
    client: Client,
    insert: Statement,
}

async fn writers(url: &str) -> GateResult<Arc<Vec<Writer>>> {
    let mut out = Vec::new();
    for _ in 0..WRITERS {
        let client = connect(url)
            .await
            .map_err(|e| ScenarioError::Setup(format!("connecting to {}: {e}", redact(url))))?;
        // the test server commits asynchronously; a legacy system waiting for its commits
        // flushes them (and logical decoding only sends what is flushed)
        client
            .batch_execute("SET synchronous_commit = on")
            .await
            .map_err(|e| ScenarioError::Setup(format!("SET synchronous_commit: {}", pg(&e))))?;
        let insert = client
            .prepare(INSERT)
            .await
            .map_err(|e| ScenarioError::Setup(format!("preparing the INSERT: {}", pg(&e))))?;
        out.push(Writer { client, insert });
    }
    Ok(Arc::new(out))
}

/// Inserts legacy rows, each in its own transaction; reads every [`SAMPLE_EVERY`]th through
/// GraphQL once its change has arrived.
struct Inserts {
    tracker: Arc<Tracker>,
    writers: Arc<Vec<Writer>>,
    /// `acct_id` of each committed row (0: none).
    acct_ids: Vec<AtomicI64>,
    read: AtomicU64,
    unreadable: AtomicU64,
    first_problem: Mutex<Option<String>>,
    insert_errors: AtomicU64,
}

impl Inserts {
    fn problem(&self, text: String) {
        self.first_problem
            .lock()
            .expect("problem lock")
            .get_or_insert(text);
    }
}

#[async_trait]
impl Workload for Inserts {
    async fn iteration(&self, vu: &mut Vu, due: Instant) {
        let t = &self.tracker;
        let seq = t.next.fetch_add(1, Ordering::Relaxed);
        if seq >= t.sent.len() {
            return;
        }
        let row = LegacyRow::new(format!("{}{seq}", t.prefix), seq as u64);
        let w = &self.writers[seq % self.writers.len()];
        t.due[seq].store(t.stamp(due), Ordering::Relaxed);
        let sent = Instant::now();
        t.sent[seq].store(t.stamp(sent), Ordering::Relaxed);
        let result = w
            .client
            .query_one(
                &w.insert,
                &[
                    &row.acct_num,
                    &row.cust_nm,
                    &row.stat_cd(),
                    &row.conn_dt,
                    &row.bal_amt,
                    &row.paperless_flg(),
                ],
            )
            .await;
        let latency = sent.elapsed();
        let acct_id: i32 = match result.and_then(|r| r.try_get(0)) {
            Ok(id) => {
                vu.session
                    .recorder
                    .kind("legacy_insert")
                    .record(latency, Outcome::Ok);
                id
            }
            Err(e) => {
                vu.session
                    .recorder
                    .kind("legacy_insert")
                    .record(latency, Outcome::HttpError);
                self.insert_errors.fetch_add(1, Ordering::Relaxed);
                self.problem(format!("INSERT {}: {}", row.acct_num, pg(&e)));
                return;
            }
        };
        self.acct_ids[seq].store(acct_id as i64, Ordering::Relaxed);
        t.ok[seq].store(true, Ordering::Relaxed);
        if !seq.is_multiple_of(SAMPLE_EVERY) {
            return;
        }
        // readable through GraphQL once its change is on the feed (a row that never arrives
        // is counted lost by the run)
        if !t.wait_for(vec![seq], ARRIVAL_TIMEOUT).await.is_empty() {
            return;
        }
        vu.session.due_at(Instant::now());
        let data = vu
            .session
            .graphql("graphql_get_by_id", GRAPH, &get_by_id(acct_id))
            .await;
        let verdict = match data {
            Some(d) => row.check(acct_id, &d["getById"]),
            None => Err("no data".into()),
        };
        self.read.fetch_add(1, Ordering::Relaxed);
        vu.session.check("graphql_get_by_id", verdict.is_ok());
        if let Err(e) = verdict {
            self.unreadable.fetch_add(1, Ordering::Relaxed);
            self.problem(format!(
                "{} (acct_id {acct_id}) through GraphQL after its change arrived: {e}",
                row.acct_num
            ));
        }
    }
}

/// Runs 2 and 3: rows inserted at `rate` for `--duration`; latencies to their clean
/// documents' changes; the problems found.
async fn inserts(
    ctx: &mut Ctx,
    writers: &Arc<Vec<Writer>>,
    rate: f64,
) -> GateResult<Option<String>> {
    let duration = ctx.opts.duration.unwrap_or(Duration::from_secs(10));
    let model = open_model(rate, duration);
    let n = model.iterations() as usize;
    let label = format!("insert_to_readable_{rate:.0}_per_s");
    let tracker =
        Arc::new(Tracker::new(n, format!("r{rate:.0}-")).keyed_by_payload("account_number"));
    let reader = Reader::start_on(&ctx.target, STREAM, tracker.clone())
        .await
        .map_err(|e| ScenarioError::Gate(format!("cannot read {STREAM}: {e}")))?;
    let workload = Arc::new(Inserts {
        tracker: tracker.clone(),
        writers: writers.clone(),
        acct_ids: (0..n).map(|_| AtomicI64::new(0)).collect(),
        read: AtomicU64::new(0),
        unreadable: AtomicU64::new(0),
        first_problem: Mutex::new(None),
        insert_errors: AtomicU64::new(0),
    });
    let run = ctx.open(&label, workload.clone(), &model).await;
    let expected = tracker.expected();
    let missing = tracker.wait_for(expected.clone(), ARRIVAL_TIMEOUT).await;
    // a second version of a document would follow its first closely
    tokio::time::sleep(Duration::from_millis(300)).await;
    let reader_error = reader.stop().await;
    let (from_send, from_due) = tracker.latencies(&expected);
    let duplicates = tracker.duplicates.load(Ordering::Relaxed);
    let read = workload.read.load(Ordering::Relaxed);
    let unreadable = workload.unreadable.load(Ordering::Relaxed);
    let insert_errors = workload.insert_errors.load(Ordering::Relaxed);
    let committed = expected.len();
    let achieved = committed as f64 / run.duration_s.max(1e-9);
    let q = |q: f64| ms(from_send.value_at_quantile(q));
    if let Some(r) = ctx.runs.last_mut() {
        let m = &mut r.metrics;
        if !from_send.is_empty() {
            for (name, v) in [("p50", 0.5), ("p95", 0.95), ("p99", 0.99)] {
                m.insert(format!("legacy_latency_{name}_ms"), q(v));
            }
            m.insert("legacy_latency_max_ms".into(), ms(from_send.max()));
            m.insert(
                "legacy_latency_from_due_p99_ms".into(),
                ms(from_due.value_at_quantile(0.99)),
            );
        }
        m.insert("legacy_rows_committed".into(), committed as f64);
        m.insert("legacy_rows_per_s".into(), achieved);
        m.insert("legacy_lost".into(), missing.len() as f64);
        m.insert("legacy_duplicated".into(), duplicates as f64);
        m.insert("legacy_graphql_reads".into(), read as f64);
        m.insert("legacy_graphql_unreadable".into(), unreadable as f64);
    }
    let p99 = q(0.99);
    ctx.note(format!(
        "legacy INSERT → clean document readable, {rate:.0} rows/s offered ({achieved:.0}/s committed, {committed} rows, {} dropped{}): p50 {:.2} · p95 {:.2} · p99 {p99:.2} · max {:.2} ms (goal p99 < {GOAL_P99_MS} ms: {}); from due p99 {:.2} ms; {read} read through GraphQL getById after their change arrived, {unreadable} not the clean document; {} lost, {duplicates} duplicated",
        run.dropped,
        if insert_errors > 0 { format!(", {insert_errors} INSERTs failed") } else { String::new() },
        q(0.5),
        q(0.95),
        ms(from_send.max()),
        if from_send.is_empty() {
            "not measured"
        } else if p99 < GOAL_P99_MS {
            "met"
        } else {
            "NOT met"
        },
        ms(from_due.value_at_quantile(0.99)),
        missing.len(),
    ));
    if run.dropped > 0 || achieved < rate * 0.95 {
        ctx.note(format!(
            "{rate:.0} rows/s was not sustained here: {achieved:.0} rows/s committed, {} iterations dropped (no free worker of {})",
            run.dropped, model.max_workers
        ));
    }
    let mut problems = Vec::new();
    if !missing.is_empty() {
        let first: Vec<String> = missing
            .iter()
            .take(5)
            .map(|i| format!("{}{i}", tracker.prefix))
            .collect();
        problems.push(format!(
            "{rate:.0}/s: {} of {committed} committed rows have no clean document {} s after the run (first: {}){}",
            missing.len(),
            ARRIVAL_TIMEOUT.as_secs(),
            first.join(", "),
            reader_error.map_or(String::new(), |e| format!("; {e}"))
        ));
    }
    if duplicates > 0 {
        problems.push(format!(
            "{rate:.0}/s: {duplicates} rows written twice (a second version on the feed)"
        ));
    }
    if unreadable > 0 {
        problems.push(format!(
            "{rate:.0}/s: {unreadable} of {read} sampled rows were not their clean document through GraphQL"
        ));
    }
    if let Some(first) = workload.first_problem.lock().expect("problem lock").take() {
        if unreadable > 0 || insert_errors > 0 {
            problems.push(format!("{rate:.0}/s, first problem: {first}"));
        }
    }
    Ok((!problems.is_empty()).then(|| problems.join("; ")))
}

/// After the runs: one clean version per legacy row, no dead letters.
async fn gate_totals(ctx: &mut Ctx, db: &Client) -> GateResult<Option<String>> {
    let rows: i64 = db
        .query_one("SELECT count(*) FROM cust_acct", &[])
        .await
        .map_err(|e| ScenarioError::Setup(format!("counting the legacy rows: {}", pg(&e))))?
        .get(0);
    let mut s = ctx.session();
    let deadline = Instant::now() + ARRIVAL_TIMEOUT;
    loop {
        let counters = processor_counters(&mut s).await;
        let (outputs, dead, _) = counters.unwrap_or_default();
        let settled = outputs >= rows as u64 || Instant::now() > deadline;
        if settled || dead > 0 {
            ctx.note(format!(
                "after the runs: {rows} legacy rows, {outputs} clean versions written by the mapping processor, {dead} dead letters"
            ));
            let mut problems = Vec::new();
            if outputs != rows as u64 {
                problems.push(format!(
                    "the table holds {rows} rows but the processor wrote {outputs} clean versions (one per row expected)"
                ));
            }
            if dead > 0 {
                problems.push(format!("{dead} legacy rows became dead letters"));
            }
            return Ok((!problems.is_empty()).then(|| problems.join("; ")));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Everything between creating the database and dropping it.
async fn measure(ctx: &mut Ctx, url: &str, slot: &str, dir: &Path) -> GateResult<()> {
    let rows = ctx.opts.legacy_rows.max(1);
    let db = connect(url)
        .await
        .map_err(|e| ScenarioError::Setup(format!("connecting to {}: {e}", redact(url))))?;
    let setup = |what: &'static str| {
        move |e: tokio_postgres::Error| ScenarioError::Setup(format!("{what}: {}", pg(&e)))
    };
    db.batch_execute(CREATE_TABLE)
        .await
        .map_err(setup("creating the legacy table"))?;
    if !ctx.opts.quiet {
        eprintln!("legacy: inserting {rows} legacy rows");
    }
    let seeding = Instant::now();
    db.batch_execute(&seed_sql(rows))
        .await
        .map_err(setup("inserting the snapshot's rows"))?;
    ctx.note(format!(
        "{rows} rows inserted into {slot}.cust_acct in {:.1} s (one INSERT … SELECT generate_series) before meshql started",
        seeding.elapsed().as_secs_f64()
    ));
    let files = [
        ("meshql.toml", config(url, slot)),
        ("customer.schema.json", SCHEMA.to_string()),
        ("customer.graphql", GRAPHQL.to_string()),
    ];
    for (name, text) in files {
        std::fs::write(dir.join(name), text)
            .map_err(|e| ScenarioError::Setup(format!("writing {name}: {e}")))?;
    }
    snapshot(ctx, &dir.join("meshql.toml"), rows).await?;
    gate_snapshot(ctx, &db, rows).await?;
    let writers = writers(url).await?;
    let mut problems = Vec::new();
    for rate in RATES {
        problems.extend(inserts(ctx, &writers, rate).await?);
    }
    problems.extend(gate_totals(ctx, &db).await?);
    ctx.note(format!(
        "latency = when the bench's SSE reader (its own thread) read the clean document's change on {STREAM} − just before the row's INSERT was sent (each row its own transaction, synchronous_commit = on, {WRITERS} connections); every {SAMPLE_EVERY}th row is then read with GraphQL getById (its id from the legacy key) and compared with the clean document expected"
    ));
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ScenarioError::Gate(problems.join("; ")))
    }
}

static RUNS: AtomicUsize = AtomicUsize::new(0);

#[async_trait]
impl Scenario for Legacy {
    fn name(&self) -> &'static str {
        "legacy"
    }
    fn description(&self) -> &'static str {
        "legacy capture on --legacy-url's PostgreSQL (wal_level = logical; scripts/services/postgres.sh start): postgres_cdc → mapping processor → clean entity; the initial snapshot of --legacy-rows rows (goal ≥ 20,000 rows/s on 1,000,000), then legacy INSERT → clean document readable (change feed, sampled through GraphQL) at 100 and 1,000 rows/s (goal p99 < 100 ms); 0 lost, 0 duplicated (not in `all`)"
    }
    fn example(&self) -> Example {
        // not served: the scenario starts meshql on a config of its own once the legacy rows
        // are in place (the server started for this is stopped first)
        Example::Products
    }
    fn in_all(&self) -> bool {
        // it needs a PostgreSQL with wal_level = logical, which `all` does not assume
        false
    }
    async fn run(&self, ctx: &mut Ctx) -> GateResult<()> {
        if ctx.opts.url.is_some() {
            return Err(ScenarioError::NeedsLocal);
        }
        ctx.server = None;
        let admin_url = ctx.opts.legacy_url.clone();
        let admin = connect_checked(&admin_url).await?;
        let swept = sweep(&admin).await;
        if !swept.is_empty() {
            ctx.note(format!(
                "dropped what killed runs left on {}: {}",
                redact(&admin_url),
                swept.join(", ")
            ));
        }
        let name = format!(
            "{PREFIX}{}_{}",
            std::process::id(),
            RUNS.fetch_add(1, Ordering::Relaxed)
        );
        let dir = tempfile::Builder::new()
            .prefix("meshql-bench-legacy-")
            .tempdir()
            .map_err(|e| ScenarioError::Setup(format!("a config directory: {e}")))?;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .map_err(|e| {
                ScenarioError::Setup(format!(
                    "CREATE DATABASE {name} on {}: {}",
                    redact(&admin_url),
                    pg(&e)
                ))
            })?;
        drop(admin);
        let cleanup = Cleanup {
            admin_url: admin_url.clone(),
            name: name.clone(),
            armed: true,
        };
        let url = with_database(&admin_url, &name);
        let result = measure(ctx, &url, &name, dir.path()).await;
        // meshql's replication session holds the slot until it stops
        ctx.server = None;
        match cleanup.run().await {
            Ok(()) => ctx.note(format!(
                "the legacy database {name} and its replication slot were dropped"
            )),
            Err(e) => {
                let message = format!(
                    "cleaning up on {}: {e}; drop the replication slot {name} and the database {name} by hand (a slot nothing reads keeps the server's WAL)",
                    redact(&admin_url)
                );
                if result.is_ok() {
                    return Err(ScenarioError::Setup(message));
                }
                ctx.note(message);
            }
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_urls() {
        assert_eq!(
            with_database("postgres://postgres@127.0.0.1:55432/postgres", "x"),
            "postgres://postgres@127.0.0.1:55432/x"
        );
        assert_eq!(
            with_database("postgres://u:p@h/db?sslmode=disable", "x"),
            "postgres://u:p@h/x?sslmode=disable"
        );
        assert_eq!(with_database("postgres://h:1", "x"), "postgres://h:1/x");
        assert_eq!(
            redact("postgres://u:secret@h:1/db"),
            "postgres://u:***@h:1/db"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
    }

    #[test]
    fn rows_and_their_clean_documents() {
        let row = LegacyRow::new("S-7".into(), 7);
        assert_eq!(row.conn_dt, "19970808");
        assert_eq!(
            (row.stat_cd(), row.paperless_flg(), row.bal_amt),
            ("S", "N", 259)
        );
        let doc = json!({
            "legacy_acct_id": 3, "account_number": "S-7", "name": "Customer 7 O'Neil-Smith",
            "status": "suspended", "connected_date": "1997-08-08", "balance": 2.59,
            "paperless": false,
        });
        assert_eq!(row.check(3, &doc), Ok(()));
        assert!(row.check(4, &doc).unwrap_err().contains("legacy_acct_id"));
        let mut wrong = doc.clone();
        wrong["balance"] = json!(259);
        assert!(row.check(3, &wrong).unwrap_err().contains("balance"));
        assert!(row.check(3, &Value::Null).is_err());
        // the id the mapping gives the row whose key is 3 (its text, `"3"` or `3`)
        assert_eq!(
            legacy_id(TABLE, &[&json!(3)]),
            legacy_id(TABLE, &[&json!("3")])
        );
    }

    #[test]
    fn processor_counters_from_metrics() {
        let text = "# HELP x\n\
            meshql_processor_outputs_total{processor=\"customers\",type=\"mapping\",output=\"customer\"} 5000\n\
            meshql_processor_outputs_total{processor=\"other\",type=\"mapping\",output=\"x\"} 7\n\
            meshql_processor_dead_letters{processor=\"customers\",type=\"mapping\",output=\"customer\"} 0\n\
            meshql_processor_errors_total{processor=\"customers\",type=\"mapping\",output=\"customer\"} 2\n";
        assert_eq!(counters_of(text), Some((5000, 0, 2)));
        assert_eq!(counters_of("meshql_storage_reads_total 3\n"), None);
    }

    #[test]
    fn the_config_quotes_the_url_and_keeps_the_query_template() {
        let text = config("postgres://u@h:1/db", "meshql_bench_legacy_1_0");
        assert!(text.contains("url = \"postgres://u@h:1/db\""), "{text}");
        assert!(
            text.contains("slot = \"meshql_bench_legacy_1_0\""),
            "{text}"
        );
        assert!(text.contains("query = '{\"id\": \"{{id}}\"}'"), "{text}");
    }
}
