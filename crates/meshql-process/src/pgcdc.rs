//! Change capture from a PostgreSQL meshql does not own (`source = { type = "postgres_cdc", … }`):
//! the rows of legacy tables as a processor's inputs, first as they are (a snapshot), then
//! every insert, update and delete as it commits (logical replication, `pgoutput`).
//!
//! ```toml
//! [[processor]]
//! name = "customers"
//! type = "mapping"
//! inputs = ["cust_acct"]
//! output = "customer"
//! source = { type = "postgres_cdc", url = "${LEGACY_URL}", publication = "meshql_legacy", tables = ["cust_acct"] }
//! ```
//!
//! Settings: `url` (a `postgres://` URL of the legacy database; the user needs the
//! `REPLICATION` attribute, and `CREATE` on the database when meshql makes the publication),
//! `publication` (made `FOR TABLE` the tables when it does not exist, and the missing tables
//! added when it does, unless `create = false`: then it must exist and publish them), `slot`
//! (the replication slot, default `meshql_<publication>`; one slot per processor), `tables`
//! (`name` or `schema.name`), `snapshot` (default true: copy the rows present when the slot is
//! made before streaming) and `entities = { "<table>" = "<entity>" }` (an input's entity is
//! the table's name, `schema.name` outside `public`, unless mapped here).
//!
//! **What an input is.** One row change: `op` create (a snapshot row or an INSERT), update or
//! delete; `payload` the row as column → JSON value (integers, floating and numeric columns as
//! numbers, booleans, `json`/`jsonb` parsed, everything else as PostgreSQL's text; a delete
//! carries what the table's replica identity logs: its key columns, or the whole row with
//! `REPLICA IDENTITY FULL`; a large value an update left untouched is absent unless the
//! identity is `FULL`); `id` the primary key's values joined by `,`; `created_at` the commit
//! time (a snapshot row: the snapshot's).
//!
//! **Exactly once.** The slot streams whole transactions in commit order. A state row of the
//! processor (`pgcdc/<slot>`) holds the end of the last transaction whose changes are
//! committed with the outputs, and, when a transaction was larger than a batch, how many of
//! its changes are; it is committed with the batch's outputs in one transaction. After a
//! restart, `kill -9` included, streaming starts again from there: transactions at or before
//! it, and the first changes of a partial one, are skipped. The slot is told a position only
//! after the outputs are committed, so PostgreSQL keeps the WAL the processor has not applied
//! — and, while the publication's tables are idle, the server's current position, so the slot
//! never holds WAL for nothing.
//!
//! **The snapshot.** With no committed position, the slot is made with an exported snapshot
//! (`CREATE_REPLICATION_SLOT … (SNAPSHOT 'export')`); the tables are read through a cursor in
//! a `REPEATABLE READ` transaction that adopts it, so the copy holds exactly the rows committed
//! before the slot's first change, in transactions of at least 5,000 rows; the position is
//! committed with the copy's last batch. A copy
//! cut short (a crash, a lost connection) starts again with a new slot: rows copied twice are
//! the same rows (a mapping derives a row's document from its key).
//!
//! **Faults.** A database that is down, refuses the slot or drops the connection is retried
//! with backoff (100 ms doubling up to 12.8 s), counted in the processor's `errors`; the
//! service meanwhile serves as usual. A slot still held by a session that died (the server
//! has not noticed yet) is waited for the same way. A slot that disappeared (dropped by an
//! operator) lost the changes since: the processor warns and takes a new snapshot.
//!
//! **Latency.** Logical decoding sends a transaction once its WAL is flushed: with
//! `synchronous_commit = on` a change is an input within milliseconds of its commit; a database
//! that commits asynchronously delays it until the WAL writer flushes (`wal_writer_delay`,
//! 200 ms by default).
//!
//! The processor's `lag` (`meshql_processor_lag`) is the WAL, in bytes, the slot keeps for it:
//! from the slot's confirmed position to the server's current one, read every 5 s. `meshql cdc
//! slots CONFIG` lists the slots of the config's legacy databases (with what each keeps, and
//! whether a processor of the config reads it), `meshql cdc drop-slot SLOT CONFIG` drops one,
//! and `meshql check` warns about a slot of meshql's (`meshql_…`) no processor reads.
//!
//! **TLS.** The URL's `sslmode` (`disable`, `prefer` — the default —, `require`, `verify-ca`,
//! `verify-full`) and `sslrootcert` (a PEM file, or `system`) are read as meshql's PostgreSQL
//! store reads them, for both connections ([`crate::pgtls`]).

use crate::pgtls::{TlsTarget, Tunnel};
use crate::plan::Input;
use crate::runtime::{Item, ProcessorHandler};
use crate::source::{scoped, SourceCounters};
use meshql_core::{parse_settings, ChangeOp, SettingError, StateWrite};
use meshql_store_postgres::client_tls;
use pg_walstream::{ColumnData, LogicalReplicationMessage, LogicalReplicationParser, TupleData};
use pgwire_replication::{Lsn, ReplicationClient, ReplicationConfig, ReplicationEvent};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    #[serde(rename = "type")]
    kind: String,
    url: String,
    publication: String,
    #[serde(default)]
    slot: Option<String>,
    tables: Vec<String>,
    #[serde(default = "yes")]
    create: bool,
    #[serde(default = "yes")]
    snapshot: bool,
    #[serde(default)]
    entities: BTreeMap<String, String>,
}

/// A table of the legacy database.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Table {
    pub schema: String,
    pub name: String,
}

impl Table {
    /// `name` or `schema.name` (as configured: unquoted identifiers, folded to lower case).
    fn parse(text: &str) -> Option<Table> {
        let (schema, name) = match text.split_once('.') {
            Some((s, n)) => (s, n),
            None => ("public", text),
        };
        (ident_ok(schema) && ident_ok(name)).then(|| Table {
            schema: schema.to_ascii_lowercase(),
            name: name.to_ascii_lowercase(),
        })
    }

    /// How inputs name it: `name` in `public`, else `schema.name`.
    pub fn label(&self) -> String {
        if self.schema == "public" {
            self.name.clone()
        } else {
            format!("{}.{}", self.schema, self.name)
        }
    }

    /// Quoted for SQL.
    fn sql(&self) -> String {
        format!("\"{}\".\"{}\"", self.schema, self.name)
    }
}

/// An unquoted SQL identifier.
fn ident_ok(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
        && s.len() <= 63
}

/// A publication or slot name meshql can write into a command unquoted.
fn name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// A checked `postgres_cdc` source.
#[derive(Debug, Clone, PartialEq)]
pub struct PostgresCdcSource {
    pub url: String,
    pub publication: String,
    pub slot: String,
    pub tables: Vec<Table>,
    pub create: bool,
    pub snapshot: bool,
    /// Table label → entity.
    pub entities: BTreeMap<String, String>,
}

impl PostgresCdcSource {
    /// The entity a table's changes are inputs of.
    pub fn entity_of(&self, table: &Table) -> String {
        let label = table.label();
        self.entities.get(&label).cloned().unwrap_or(label)
    }
}

/// Checks a processor's `source = { type = "postgres_cdc", … }` block.
pub fn compile(settings: &Value) -> Result<PostgresCdcSource, SettingError> {
    let s: Settings = parse_settings(settings).map_err(scoped)?;
    if s.kind != "postgres_cdc" {
        return Err(SettingError::new(
            "source.type",
            format!("`{}` is not a postgres_cdc source", s.kind),
        ));
    }
    let config = client_tls::read_url(s.url.trim())
        .map_err(|e| {
            SettingError::new(
                "source.url",
                format!(
                    "not a usable PostgreSQL URL: {e}; e.g. postgres://user@host:5432/database"
                ),
            )
        })?
        .config;
    if config.get_hosts().is_empty() || config.get_dbname().is_none() {
        return Err(SettingError::new(
            "source.url",
            "name the host and the database, e.g. postgres://user@host:5432/database",
        ));
    }
    if !name_ok(&s.publication) {
        return Err(SettingError::new(
            "source.publication",
            format!(
                "`{}` is not a publication name meshql uses (lower-case letters, digits and `_`, \
                 at most 63)",
                s.publication
            ),
        ));
    }
    let slot = s
        .slot
        .unwrap_or_else(|| format!("meshql_{}", s.publication));
    if !name_ok(&slot) {
        return Err(SettingError::new(
            "source.slot",
            format!(
                "`{slot}` is not a replication slot name (lower-case letters, digits and `_`, at \
                 most 63)"
            ),
        ));
    }
    if s.tables.is_empty() {
        return Err(SettingError::new(
            "source.tables",
            "name the tables to capture, e.g. [\"cust_acct\", \"billing.bill_hdr\"]",
        ));
    }
    let mut tables = Vec::with_capacity(s.tables.len());
    for (i, t) in s.tables.iter().enumerate() {
        let table = Table::parse(t).ok_or_else(|| {
            SettingError::new(
                format!("source.tables[{i}]"),
                format!("`{t}` is not a table name (`name` or `schema.name`, unquoted)"),
            )
        })?;
        if tables.contains(&table) {
            return Err(SettingError::new(
                format!("source.tables[{i}]"),
                format!("`{t}` is named twice"),
            ));
        }
        tables.push(table);
    }
    for key in s.entities.keys() {
        if !tables.iter().any(|t| t.label() == *key) {
            return Err(SettingError::new(
                format!("source.entities.{key}"),
                format!("`{key}` is not one of the source's tables"),
            ));
        }
    }
    Ok(PostgresCdcSource {
        url: s.url.trim().to_owned(),
        publication: s.publication,
        slot,
        tables,
        create: s.create,
        snapshot: s.snapshot,
        entities: s.entities,
    })
}

/// Rows per output transaction while copying (at least): the copy commits no position until
/// its end, so its batches can be larger than the stream's.
const COPY_BATCH: usize = 5000;

/// How often the slot's lag is read from the server.
const LAG_PROBE: Duration = Duration::from_secs(5);

/// The state row holding the source's position.
fn position_key(slot: &str) -> String {
    format!("pgcdc/{slot}")
}

/// What the state row says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Applied {
    /// The end of the last transaction whose changes are all committed.
    lsn: u64,
    /// A transaction (its commit position) of which only the first `done` changes are.
    partial: Option<(u64, usize)>,
}

impl Applied {
    fn parse(text: &str) -> Option<Applied> {
        let v: Value = serde_json::from_str(text).ok()?;
        let lsn = v["lsn"].as_u64()?;
        let partial = match (v["tx"].as_u64(), v["done"].as_u64()) {
            (Some(tx), Some(done)) => Some((tx, done as usize)),
            _ => None,
        };
        Some(Applied { lsn, partial })
    }

    fn text(&self) -> String {
        match self.partial {
            Some((tx, done)) => {
                serde_json::json!({"lsn": self.lsn, "tx": tx, "done": done}).to_string()
            }
            None => serde_json::json!({"lsn": self.lsn}).to_string(),
        }
    }
}

/// Reads the legacy tables into `handler` until `stop`.
pub(crate) async fn run(
    name: String,
    source: PostgresCdcSource,
    inputs: Vec<String>,
    batch: usize,
    handler: Arc<ProcessorHandler>,
    counters: Arc<SourceCounters>,
    mut stop: watch::Receiver<bool>,
) {
    let batch = batch.max(1);
    let mut failures: u32 = 0;
    loop {
        if *stop.borrow() {
            return;
        }
        if !crate::source::back_off(failures, &mut stop).await {
            return;
        }
        let mut capture = Capture {
            name: &name,
            source: &source,
            inputs: &inputs,
            batch,
            handler: &handler,
            counters: &counters,
            progressed: false,
        };
        let outcome = tokio::select! {
            o = capture.session() => o,
            _ = stop.changed() => return,
        };
        if capture.progressed {
            failures = 0;
        }
        match outcome {
            Ok(()) => return,
            Err(e) => {
                failures += 1;
                counters.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(processor = %name, slot = %source.slot, error = %e,
                    "postgres_cdc source: capture failed; starting again from the committed position");
            }
        }
    }
}

/// A table's columns as the stream describes them.
struct Relation {
    table: Table,
    entity: String,
    /// Name and type of each column, in the tuple's order.
    columns: Vec<(String, u32)>,
    /// The primary key's columns (indexes into `columns`).
    key: Vec<usize>,
}

/// The transaction being read from the stream.
struct Transaction {
    /// Its commit position (the stream's `final_lsn`).
    commit: u64,
    commit_ms: i64,
    /// Changes of it seen so far.
    seen: usize,
    /// Changes of it already committed before a restart (all of them: `usize::MAX`).
    skip: usize,
}

/// One capture session: connect, snapshot if needed, stream until something fails.
struct Capture<'a> {
    name: &'a str,
    source: &'a PostgresCdcSource,
    inputs: &'a [String],
    batch: usize,
    handler: &'a ProcessorHandler,
    counters: &'a SourceCounters,
    /// Something was committed (the backoff starts again).
    progressed: bool,
}

impl Capture<'_> {
    async fn session(&mut self) -> Result<(), String> {
        self.handler.ensure_loaded().await.map_err(|e| e.0)?;
        let key = position_key(&self.source.slot);
        let stored = self
            .handler
            .output
            .writer()
            .output_state(&self.handler.name, std::slice::from_ref(&key))
            .await
            .map_err(|e| e.to_string())?
            .get(&key)
            .and_then(|s| Applied::parse(s));
        let sql = Sql::connect(&self.source.url).await?;
        sql.check_wal_level().await?;
        self.ensure_publication(&sql).await?;
        let keys = sql.primary_keys(&self.source.tables).await?;
        let slot_exists = sql.slot_exists(&self.source.slot).await?;
        // held for the session: the replication connections go through it
        let tunnel = match TlsTarget::of(&self.source.url)? {
            Some(target) => Some(Tunnel::open(target)?),
            None => None,
        };
        let config = replication_config(self.source, tunnel.as_ref())?;
        let failed =
            |e: pgwire_replication::PgWireError| match tunnel.as_ref().and_then(Tunnel::failure) {
                Some(reason) => format!("replication connection: {reason}"),
                None => format!("replication connection: {e}"),
            };
        let (mut client, applied) = match stored {
            Some(applied) if slot_exists => {
                let client = ReplicationClient::connect(config.with_start_lsn(Lsn(applied.lsn)))
                    .await
                    .map_err(failed)?;
                (client, applied)
            }
            _ => {
                if stored.is_some() {
                    tracing::warn!(processor = %self.name, slot = %self.source.slot,
                        "the replication slot is gone: the changes since the last committed position are lost to it; taking a new snapshot");
                }
                if slot_exists {
                    sql.drop_slot(&self.source.slot).await?;
                }
                self.snapshot(&sql, config, &keys).await.map_err(|e| {
                    match tunnel.as_ref().and_then(Tunnel::failure) {
                        Some(reason) => format!("{e} ({reason})"),
                        None => e,
                    }
                })?
            }
        };
        client
            .wait_started()
            .await
            .map_err(|e| format!("START_REPLICATION: {e}"))?;
        tracing::info!(processor = %self.name, slot = %self.source.slot, from = %Lsn(applied.lsn).to_pg_string(), "postgres_cdc source streaming");
        let result = self.stream(&sql, &mut client, applied, &keys).await;
        client.stop();
        result
    }

    /// Makes the publication, or adds the tables it lacks (or, with `create = false`, checks).
    async fn ensure_publication(&self, sql: &Sql) -> Result<(), String> {
        let published = sql.published(&self.source.publication).await?;
        let missing: Vec<&Table> = match &published {
            Some(tables) => self
                .source
                .tables
                .iter()
                .filter(|t| !tables.contains(t))
                .collect(),
            None => self.source.tables.iter().collect(),
        };
        if missing.is_empty() {
            return Ok(());
        }
        let list = missing
            .iter()
            .map(|t| t.sql())
            .collect::<Vec<_>>()
            .join(", ");
        if !self.source.create {
            return Err(match published {
                None => format!(
                    "publication `{}` does not exist (create = false)",
                    self.source.publication
                ),
                Some(_) => format!(
                    "publication `{}` does not publish {list} (create = false)",
                    self.source.publication
                ),
            });
        }
        let command = match published {
            None => format!(
                "CREATE PUBLICATION {} FOR TABLE {list}",
                self.source.publication
            ),
            Some(_) => format!(
                "ALTER PUBLICATION {} ADD TABLE {list}",
                self.source.publication
            ),
        };
        sql.client
            .batch_execute(&command)
            .await
            .map_err(|e| format!("{command}: {}", db_error(&e)))?;
        tracing::info!(processor = %self.name, "{command}");
        Ok(())
    }

    /// Makes the slot with an exported snapshot, copies the tables as of it, commits the
    /// slot's starting position with the last rows, and starts streaming.
    async fn snapshot(
        &mut self,
        sql: &Sql,
        config: ReplicationConfig,
        keys: &HashMap<Table, Vec<String>>,
    ) -> Result<(ReplicationClient, Applied), String> {
        let mut client = ReplicationClient::connect_gated(config.with_start_lsn(Lsn(0)))
            .await
            .map_err(|e| format!("replication connection: {e}"))?;
        let command = format!(
            "CREATE_REPLICATION_SLOT {} LOGICAL pgoutput (SNAPSHOT 'export')",
            self.source.slot
        );
        let rows = client
            .simple_query(&command)
            .await
            .map_err(|e| format!("{command}: {e}"))?;
        let text = |i: usize| -> Option<String> {
            rows.first()?
                .get(i)?
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).into_owned())
        };
        let start = text(1)
            .and_then(|s| Lsn::parse(&s).ok())
            .ok_or_else(|| format!("{command}: no consistent point in the answer"))?;
        let exported = text(2).ok_or_else(|| format!("{command}: no snapshot in the answer"))?;
        tracing::info!(processor = %self.name, slot = %self.source.slot, at = %start.to_pg_string(), "replication slot made");
        let applied = Applied {
            lsn: start.0,
            partial: None,
        };
        if self.source.snapshot {
            self.copy(sql, &exported, keys, applied).await?;
        } else {
            self.commit(Vec::new(), applied).await?;
        }
        client
            .start()
            .await
            .map_err(|e| format!("START_REPLICATION: {e}"))?;
        Ok((client, applied))
    }

    /// Copies every table as of the exported snapshot, in batches; the last one commits
    /// `applied`.
    async fn copy(
        &mut self,
        sql: &Sql,
        exported: &str,
        keys: &HashMap<Table, Vec<String>>,
        applied: Applied,
    ) -> Result<(), String> {
        let started = std::time::Instant::now();
        let at = meshql_core::now_millis();
        sql.client
            .batch_execute(&format!(
                "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '{}'",
                exported.replace('\'', "''")
            ))
            .await
            .map_err(|e| format!("adopting the slot's snapshot: {}", db_error(&e)))?;
        let mut rows_copied = 0u64;
        let batch = self.batch.max(COPY_BATCH);
        let mut pending: Vec<Input> = Vec::with_capacity(batch);
        // a processor that never committed anything has no document of these rows yet (a
        // copy taken again after one cut short has some: its rows are compared)
        let fresh = self.handler.position.load(Ordering::Acquire) == 0;
        for table in &self.source.tables {
            let entity = self.source.entity_of(table);
            let wanted = self.inputs.contains(&entity);
            if !wanted {
                continue;
            }
            let key = keys.get(table).cloned().unwrap_or_default();
            // each column as the stream gives it (see `value_of`): the types read as JSON
            // as they are, every other one as its text
            let select = sql
                .column_types(table)
                .await?
                .iter()
                .map(|(name, type_id)| {
                    let quoted = format!("\"{}\"", name.replace('"', "\"\""));
                    if oid::AS_JSON.contains(type_id) {
                        quoted
                    } else {
                        format!("{quoted}::text AS {quoted}")
                    }
                })
                .collect::<Vec<_>>()
                .join(", ");
            sql.client
                .batch_execute(&format!(
                    "DECLARE meshql_copy NO SCROLL CURSOR FOR \
                     SELECT to_jsonb(t)::text FROM (SELECT {select} FROM {}) t",
                    table.sql()
                ))
                .await
                .map_err(|e| format!("reading {}: {}", table.label(), db_error(&e)))?;
            loop {
                let fetch = format!("FETCH {batch} FROM meshql_copy");
                let rows = sql
                    .client
                    .query(&fetch, &[])
                    .await
                    .map_err(|e| format!("reading {}: {}", table.label(), db_error(&e)))?;
                let n = rows.len();
                for row in rows {
                    let text: String = row.get(0);
                    let payload = match serde_json::from_str::<Value>(&text) {
                        Ok(Value::Object(m)) => m,
                        _ => return Err(format!("{}: a row that is not an object", table.label())),
                    };
                    let position =
                        self.handler.position.load(Ordering::Acquire) + pending.len() as u64 + 1;
                    let id = key_of(&payload, &key);
                    pending.push(Input {
                        position,
                        change_id: format!("{}:snapshot:{id}", table.label()),
                        entity: entity.clone(),
                        id,
                        op: ChangeOp::Create,
                        created_at: at,
                        correlation_id: None,
                        payload,
                        order: (at, position),
                        fresh,
                    });
                    if pending.len() >= batch {
                        rows_copied += pending.len() as u64;
                        self.commit_snapshot_rows(std::mem::take(&mut pending))
                            .await?;
                    }
                }
                if n < batch {
                    break;
                }
            }
            sql.client
                .batch_execute("CLOSE meshql_copy")
                .await
                .map_err(|e| db_error(&e))?;
        }
        rows_copied += pending.len() as u64;
        self.commit(pending, applied).await?;
        sql.client
            .batch_execute("COMMIT")
            .await
            .map_err(|e| db_error(&e))?;
        let secs = started.elapsed().as_secs_f64();
        tracing::info!(processor = %self.name, rows = rows_copied, secs,
            rate = (rows_copied as f64 / secs.max(1e-9)) as u64, "postgres_cdc snapshot copied");
        Ok(())
    }

    /// Commits snapshot rows without a position: a copy cut short starts again.
    async fn commit_snapshot_rows(&mut self, rows: Vec<Input>) -> Result<(), String> {
        let last = rows.last().map_or(0, |r| r.position);
        let items = rows.into_iter().map(item).collect();
        self.handler
            .apply(items, Vec::new(), last, Vec::new())
            .await
            .map_err(|e| e.0)?;
        self.progressed = true;
        Ok(())
    }

    /// Commits `inputs` with the source's position `applied`.
    async fn commit(&mut self, inputs: Vec<Input>, applied: Applied) -> Result<(), String> {
        let last = inputs
            .last()
            .map_or(self.handler.position.load(Ordering::Acquire), |i| {
                i.position
            });
        let items = inputs.into_iter().map(item).collect();
        let state = vec![StateWrite {
            key: position_key(&self.source.slot),
            group: None,
            value: Some(applied.text()),
        }];
        self.handler
            .apply(items, Vec::new(), last, state)
            .await
            .map_err(|e| e.0)?;
        self.progressed = true;
        Ok(())
    }

    /// Streams changes until the connection fails.
    async fn stream(
        &mut self,
        sql: &Sql,
        client: &mut ReplicationClient,
        mut applied: Applied,
        keys: &HashMap<Table, Vec<String>>,
    ) -> Result<(), String> {
        let mut parser = LogicalReplicationParser::with_protocol_version(1);
        let mut relations: HashMap<u32, Relation> = HashMap::new();
        let mut tx: Option<Transaction> = None;
        // inputs read but not committed, and the position they bring the source to
        let mut pending: Vec<Input> = Vec::new();
        let mut reached = applied;
        let mut probe = tokio::time::interval(LAG_PROBE);
        // when the oldest input of `pending` was read
        let mut oldest: Option<std::time::Instant> = None;
        loop {
            if pending.is_empty() {
                oldest = None;
            }
            // a batch waits for more only briefly, and only between transactions: until the
            // stream is quiet for LINGER, and never past BATCH_WAIT after its first input (a
            // steady stream of small transactions is never quiet)
            let linger = !pending.is_empty() && tx.is_none();
            let waited = oldest.map_or(Duration::ZERO, |o| o.elapsed());
            if linger && waited >= BATCH_WAIT {
                self.flush(client, &mut pending, reached, &mut applied)
                    .await?;
                continue;
            }
            let next = async {
                if linger {
                    tokio::time::timeout(LINGER.min(BATCH_WAIT - waited), client.recv())
                        .await
                        .ok()
                } else {
                    Some(client.recv().await)
                }
            };
            let event = tokio::select! {
                e = next => e,
                _ = probe.tick() => {
                    match sql.slot_lag(&self.source.slot).await {
                        Ok(lag) => self.counters.lag.store(lag, Ordering::Relaxed),
                        Err(e) => return Err(format!("reading the slot's lag: {e}")),
                    }
                    continue;
                }
            };
            let Some(event) = event else {
                self.flush(client, &mut pending, reached, &mut applied)
                    .await?;
                continue;
            };
            let event = match event {
                Ok(Some(e)) => e,
                Ok(None) => return Err("the replication stream ended".into()),
                Err(e) => return Err(format!("replication stream: {e}")),
            };
            match event {
                ReplicationEvent::Begin {
                    final_lsn,
                    commit_time_micros,
                    ..
                } => {
                    // a transaction that committed before the committed position was
                    // applied before the restart (the slot had not been told yet); of the
                    // partial one, its first changes were
                    let skip = match applied.partial {
                        _ if final_lsn.0 < applied.lsn => usize::MAX,
                        Some((commit, done)) if commit == final_lsn.0 => done,
                        _ => 0,
                    };
                    tx = Some(Transaction {
                        commit: final_lsn.0,
                        commit_ms: pg_micros_to_unix_ms(commit_time_micros),
                        seen: 0,
                        skip,
                    });
                }
                ReplicationEvent::XLogData { data, .. } => {
                    let message = parser
                        .parse_wal_message_bytes(data)
                        .map_err(|e| format!("decoding pgoutput: {e}"))?
                        .message;
                    self.change(message, &mut relations, tx.as_mut(), keys, &mut pending)?;
                    if oldest.is_none() && !pending.is_empty() {
                        oldest = Some(std::time::Instant::now());
                    }
                    if pending.len() >= self.batch {
                        // a large transaction: commit what it has so far
                        if let Some(t) = &tx {
                            reached.partial = Some((t.commit, t.seen));
                        }
                        self.flush(client, &mut pending, reached, &mut applied)
                            .await?;
                    }
                }
                ReplicationEvent::Commit { end_lsn, .. } => {
                    tx = None;
                    if end_lsn.0 <= applied.lsn {
                        continue; // applied before the restart
                    }
                    reached = Applied {
                        lsn: end_lsn.0,
                        partial: None,
                    };
                    // a full batch goes at once; a smaller one when nothing follows at once
                    // (above); a transaction none of whose changes are inputs moves the slot
                    // with the next batch or the next idle keepalive
                    if pending.len() >= self.batch {
                        self.flush(client, &mut pending, reached, &mut applied)
                            .await?;
                    }
                }
                ReplicationEvent::KeepAlive { wal_end, .. } => {
                    if tx.is_none() && pending.is_empty() {
                        // everything read is committed: the slot may move to the server's end
                        client.update_applied_lsn(wal_end);
                    }
                }
                ReplicationEvent::Message { .. } => {}
                ReplicationEvent::StoppedAt { .. } => {
                    return Err("the replication stream stopped".into())
                }
            }
        }
    }

    /// Commits the pending inputs with `reached`, then tells the slot.
    async fn flush(
        &mut self,
        client: &ReplicationClient,
        pending: &mut Vec<Input>,
        reached: Applied,
        applied: &mut Applied,
    ) -> Result<(), String> {
        self.commit(std::mem::take(pending), reached).await?;
        *applied = reached;
        if reached.partial.is_none() {
            client.update_applied_lsn(Lsn(reached.lsn));
        }
        Ok(())
    }

    /// One decoded pgoutput message: a relation is remembered, a row change becomes an input.
    fn change(
        &self,
        message: LogicalReplicationMessage,
        relations: &mut HashMap<u32, Relation>,
        tx: Option<&mut Transaction>,
        keys: &HashMap<Table, Vec<String>>,
        pending: &mut Vec<Input>,
    ) -> Result<(), String> {
        let (relation_id, op, tuple, old) = match message {
            LogicalReplicationMessage::Relation {
                relation_id,
                namespace,
                relation_name,
                columns,
                ..
            } => {
                let table = Table {
                    schema: namespace.to_string(),
                    name: relation_name.to_string(),
                };
                let columns: Vec<(String, u32)> = columns
                    .iter()
                    .map(|c| (c.name.to_string(), c.type_id))
                    .collect();
                let key = match keys.get(&table) {
                    Some(names) => names
                        .iter()
                        .filter_map(|n| columns.iter().position(|(c, _)| c == n))
                        .collect(),
                    None => Vec::new(),
                };
                relations.insert(
                    relation_id,
                    Relation {
                        entity: self.source.entity_of(&table),
                        table,
                        columns,
                        key,
                    },
                );
                return Ok(());
            }
            LogicalReplicationMessage::Insert { relation_id, tuple } => {
                (relation_id, ChangeOp::Create, tuple, None)
            }
            LogicalReplicationMessage::Update {
                relation_id,
                old_tuple,
                new_tuple,
                ..
            } => (relation_id, ChangeOp::Update, new_tuple, old_tuple),
            LogicalReplicationMessage::Delete {
                relation_id,
                old_tuple,
                ..
            } => (relation_id, ChangeOp::Delete, old_tuple, None),
            LogicalReplicationMessage::Truncate { relation_ids, .. } => {
                let names: Vec<String> = relation_ids
                    .iter()
                    .filter_map(|r| relations.get(r).map(|r| r.table.label()))
                    .collect();
                tracing::warn!(processor = %self.name, tables = ?names,
                    "TRUNCATE of captured tables: their documents are kept (a truncate names no rows)");
                return Ok(());
            }
            _ => return Ok(()),
        };
        let Some(tx) = tx else {
            return Err("a row change outside a transaction".into());
        };
        tx.seen += 1;
        if tx.seen <= tx.skip {
            return Ok(()); // committed before the restart
        }
        let relation = relations
            .get(&relation_id)
            .ok_or_else(|| format!("a change of relation {relation_id} before its description"))?;
        if !self.inputs.contains(&relation.entity) {
            return Ok(());
        }
        let payload = row_of(relation, &tuple, old.as_ref());
        let id = relation
            .key
            .iter()
            .map(|i| text_of(payload.get(&relation.columns[*i].0)))
            .collect::<Vec<_>>()
            .join(",");
        let position = self.handler.position.load(Ordering::Acquire) + pending.len() as u64 + 1;
        pending.push(Input {
            position,
            change_id: format!("{}:{:X}:{}", relation.table.label(), tx.commit, tx.seen),
            entity: relation.entity.clone(),
            id,
            op,
            created_at: tx.commit_ms,
            correlation_id: None,
            payload,
            order: (tx.commit_ms, position),
            fresh: false,
        });
        Ok(())
    }
}

/// A row change as the runtime carries it: no text of its own (a dead letter keeps the row).
fn item(input: Input) -> Item<'static> {
    Item {
        input,
        raw: std::borrow::Cow::Borrowed(""),
    }
}

/// PostgreSQL's microseconds since 2000-01-01 as Unix milliseconds.
fn pg_micros_to_unix_ms(micros: i64) -> i64 {
    const PG_EPOCH_MS: i64 = 946_684_800_000;
    micros.div_euclid(1000) + PG_EPOCH_MS
}

/// A key column's value as text (the input's id).
fn text_of(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

/// The primary key's values of a snapshot row.
fn key_of(row: &Map<String, Value>, key: &[String]) -> String {
    key.iter()
        .map(|k| text_of(row.get(k)))
        .collect::<Vec<_>>()
        .join(",")
}

/// A tuple as column → JSON value; an unchanged large value comes from the old tuple when
/// the stream sent one, else it is left out.
fn row_of(relation: &Relation, tuple: &TupleData, old: Option<&TupleData>) -> Map<String, Value> {
    let mut row = Map::with_capacity(relation.columns.len());
    for (i, (name, type_id)) in relation.columns.iter().enumerate() {
        let Some(column) = tuple.columns.get(i) else {
            break;
        };
        let column = if column.is_unchanged() {
            match old.and_then(|o| o.columns.get(i)) {
                Some(c) if !c.is_unchanged() => c,
                _ => continue,
            }
        } else {
            column
        };
        row.insert(name.clone(), value_of(column, *type_id));
    }
    row
}

/// How long a batch of streamed changes waits for the next change before it is committed.
const LINGER: Duration = Duration::from_millis(2);
/// The longest a streamed change waits for its batch to be committed (under a steady stream
/// of small transactions, which is never quiet for [`LINGER`]).
const BATCH_WAIT: Duration = Duration::from_millis(5);

/// Built-in type ids of the columns given a JSON type other than text.
mod oid {
    pub const BOOL: u32 = 16;
    pub const INT8: u32 = 20;
    pub const INT2: u32 = 21;
    pub const INT4: u32 = 23;
    pub const OID: u32 = 26;
    pub const JSON: u32 = 114;
    pub const FLOAT4: u32 = 700;
    pub const FLOAT8: u32 = 701;
    pub const NUMERIC: u32 = 1700;
    pub const JSONB: u32 = 3802;
    /// The types `value_of` reads as JSON (the snapshot copies them so, and every other type
    /// as its text, as the stream sends it).
    pub const AS_JSON: &[u32] = &[
        BOOL, INT8, INT2, INT4, OID, JSON, FLOAT4, FLOAT8, NUMERIC, JSONB,
    ];
}

/// One column's text as the JSON value its type suggests.
fn value_of(column: &ColumnData, type_id: u32) -> Value {
    if column.is_null() {
        return Value::Null;
    }
    let Some(text) = column.as_str() else {
        return Value::Null;
    };
    let text = text.as_ref();
    match type_id {
        oid::BOOL => Value::Bool(text == "t"),
        oid::INT2 | oid::INT4 | oid::INT8 | oid::OID => text
            .parse::<i64>()
            .map(Value::from)
            .unwrap_or_else(|_| Value::String(text.to_owned())),
        oid::FLOAT4 | oid::FLOAT8 | oid::NUMERIC => {
            if let Ok(i) = text.parse::<i64>() {
                Value::from(i)
            } else {
                text.parse::<f64>()
                    .ok()
                    .and_then(serde_json::Number::from_f64)
                    .map(Value::Number)
                    // NaN and infinities stay text
                    .unwrap_or_else(|| Value::String(text.to_owned()))
            }
        }
        oid::JSON | oid::JSONB => {
            serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
        }
        _ => Value::String(text.to_owned()),
    }
}

/// The replication connection's settings, from the source's URL; through `tunnel` when the
/// URL asks for TLS (see [`crate::pgtls`]).
fn replication_config(
    source: &PostgresCdcSource,
    tunnel: Option<&Tunnel>,
) -> Result<ReplicationConfig, String> {
    let config = client_tls::read_url(&source.url)?.config;
    let host = match config.get_hosts().first() {
        _ if tunnel.is_some() => tunnel.expect("checked").socket_dir(),
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        #[cfg(unix)]
        Some(tokio_postgres::config::Host::Unix(p)) => p.to_string_lossy().into_owned(),
        None => "127.0.0.1".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let password = config
        .get_password()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .unwrap_or_default();
    let mut c = ReplicationConfig::new(
        host,
        config.get_user().unwrap_or("postgres"),
        password,
        config.get_dbname().unwrap_or("postgres"),
        source.slot.clone(),
        source.publication.clone(),
    )
    .with_port(port)
    .with_status_interval(Duration::from_secs(1))
    .with_wakeup_interval(Duration::from_secs(1));
    c.application_name = Some(format!("meshql {}", source.slot));
    Ok(c)
}

/// A server error's message and code, or the client's error.
fn db_error(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

/// The ordinary (SQL) connection to the legacy database.
struct Sql {
    client: tokio_postgres::Client,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Sql {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Sql {
    async fn connect(url: &str) -> Result<Sql, String> {
        let client_tls::Connection {
            mut config,
            mode,
            tls,
            ..
        } = client_tls::read_url(url)?;
        config
            .application_name("meshql postgres_cdc")
            .connect_timeout(Duration::from_secs(10));
        let connect = async {
            match config.connect(tls.clone()).await {
                Err(e) if mode == client_tls::SslMode::Prefer => {
                    match client_tls::tls_failure(&e) {
                        Some(reason) => {
                            tracing::warn!(
                                "postgres_cdc: the TLS handshake failed ({reason}); \
                                 sslmode=prefer: connecting without TLS"
                            );
                            let mut plain = config.clone();
                            plain.ssl_mode(tokio_postgres::config::SslMode::Disable);
                            plain.connect(tls).await
                        }
                        None => Err(e),
                    }
                }
                other => other,
            }
        };
        let (client, connection) = tokio::time::timeout(Duration::from_secs(15), connect)
            .await
            .map_err(|_| "connecting to the legacy database timed out".to_string())?
            .map_err(|e| {
                let reason = client_tls::tls_failure(&e).unwrap_or_else(|| db_error(&e));
                format!("connecting to the legacy database: {reason}")
            })?;
        let task = tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Sql { client, task })
    }

    /// A table's columns and their type ids, in the table's order.
    async fn column_types(&self, table: &Table) -> Result<Vec<(String, u32)>, String> {
        let rows = self
            .client
            .query(
                "SELECT a.attname::text, a.atttypid FROM pg_attribute a \
                 JOIN pg_class c ON c.oid = a.attrelid \
                 JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 \
                   AND NOT a.attisdropped AND a.attgenerated = '' ORDER BY a.attnum",
                &[&table.schema, &table.name],
            )
            .await
            .map_err(|e| format!("reading {}'s columns: {}", table.label(), db_error(&e)))?;
        Ok(rows
            .iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, u32>(1)))
            .collect())
    }

    async fn check_wal_level(&self) -> Result<(), String> {
        let row = self
            .client
            .query_one("SHOW wal_level", &[])
            .await
            .map_err(|e| db_error(&e))?;
        let level: String = row.get(0);
        if level != "logical" {
            return Err(format!(
                "the legacy database's wal_level is `{level}`: logical replication needs \
                 wal_level = logical (set it and restart PostgreSQL)"
            ));
        }
        Ok(())
    }

    /// The tables a publication publishes (`None`: no such publication).
    async fn published(&self, publication: &str) -> Result<Option<Vec<Table>>, String> {
        let exists = self
            .client
            .query_opt(
                "SELECT 1 FROM pg_publication WHERE pubname = $1",
                &[&publication],
            )
            .await
            .map_err(|e| db_error(&e))?
            .is_some();
        if !exists {
            return Ok(None);
        }
        let rows = self
            .client
            .query(
                "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1",
                &[&publication],
            )
            .await
            .map_err(|e| db_error(&e))?;
        Ok(Some(
            rows.iter()
                .map(|r| Table {
                    schema: r.get(0),
                    name: r.get(1),
                })
                .collect(),
        ))
    }

    /// Each table's primary key columns, in the key's order; a table without one is an error
    /// (its rows could not be told apart).
    async fn primary_keys(&self, tables: &[Table]) -> Result<HashMap<Table, Vec<String>>, String> {
        let mut keys = HashMap::with_capacity(tables.len());
        for table in tables {
            let rows = self
                .client
                .query(
                    "SELECT a.attname::text FROM pg_index i \
                     JOIN pg_class c ON c.oid = i.indrelid \
                     JOIN pg_namespace n ON n.oid = c.relnamespace \
                     JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true \
                     JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum \
                     WHERE i.indisprimary AND n.nspname = $1 AND c.relname = $2 \
                     ORDER BY k.ord",
                    &[&table.schema, &table.name],
                )
                .await
                .map_err(|e| db_error(&e))?;
            if rows.is_empty() {
                let exists = self
                    .client
                    .query_opt(
                        "SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                         WHERE n.nspname = $1 AND c.relname = $2",
                        &[&table.schema, &table.name],
                    )
                    .await
                    .map_err(|e| db_error(&e))?
                    .is_some();
                return Err(if exists {
                    format!(
                        "table {} has no primary key: its rows cannot be told apart",
                        table.label()
                    )
                } else {
                    format!("table {} does not exist", table.label())
                });
            }
            keys.insert(table.clone(), rows.iter().map(|r| r.get(0)).collect());
        }
        Ok(keys)
    }

    /// WAL bytes the slot keeps past what its consumer confirmed (0 when it has no such
    /// position yet).
    async fn slot_lag(&self, slot: &str) -> Result<u64, String> {
        let row = self
            .client
            .query_opt(
                "SELECT COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint \
                 FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await
            .map_err(|e| db_error(&e))?;
        Ok(row.map_or(0, |r| r.get::<_, i64>(0).max(0) as u64))
    }

    async fn slot_exists(&self, slot: &str) -> Result<bool, String> {
        Ok(self
            .client
            .query_opt(
                "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await
            .map_err(|e| db_error(&e))?
            .is_some())
    }

    /// Drops a slot left by a copy cut short; a slot still held by a session that died is
    /// waited for (up to 30 s).
    async fn drop_slot(&self, slot: &str) -> Result<(), String> {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            match self
                .client
                .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
                .await
            {
                Ok(_) => return Ok(()),
                Err(e)
                    if e.code() == Some(&tokio_postgres::error::SqlState::OBJECT_IN_USE)
                        && std::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(format!("dropping slot {slot}: {}", db_error(&e))),
            }
        }
    }
}

/// `url` without its password (for messages).
pub fn redacted_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((user, host)) => match user.split_once(':') {
            Some((name, _)) => format!("{scheme}://{name}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// A logical replication slot of a database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotInfo {
    pub name: String,
    /// A session streams from it now.
    pub active: bool,
    /// WAL the slot keeps for its consumer (bytes from its restart position to the server's
    /// current one).
    pub retained_bytes: u64,
    /// WAL past the position its consumer confirmed (bytes).
    pub lag_bytes: u64,
}

/// The columns of each of `tables` in the database `url` names (a table that does not exist
/// is left out).
pub async fn columns(url: &str, tables: &[Table]) -> Result<HashMap<Table, Vec<String>>, String> {
    let sql = Sql::connect(url).await?;
    let mut found = HashMap::with_capacity(tables.len());
    for table in tables {
        let rows = sql
            .client
            .query(
                "SELECT a.attname::text FROM pg_attribute a \
                 JOIN pg_class c ON c.oid = a.attrelid \
                 JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped \
                 ORDER BY a.attnum",
                &[&table.schema, &table.name],
            )
            .await
            .map_err(|e| db_error(&e))?;
        if !rows.is_empty() {
            found.insert(table.clone(), rows.iter().map(|r| r.get(0)).collect());
        }
    }
    Ok(found)
}

/// The logical slots of the database `url` names.
pub async fn slots(url: &str) -> Result<Vec<SlotInfo>, String> {
    let sql = Sql::connect(url).await?;
    let rows = sql
        .client
        .query(
            "SELECT slot_name::text, active, \
               COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)::bigint, \
               COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint \
             FROM pg_replication_slots WHERE slot_type = 'logical' AND database = current_database() \
             ORDER BY slot_name",
            &[],
        )
        .await
        .map_err(|e| db_error(&e))?;
    Ok(rows
        .iter()
        .map(|r| SlotInfo {
            name: r.get(0),
            active: r.get(1),
            retained_bytes: r.get::<_, i64>(2).max(0) as u64,
            lag_bytes: r.get::<_, i64>(3).max(0) as u64,
        })
        .collect())
}

/// Drops the slot `name` of the database `url` (refused while a session streams from it).
pub async fn drop_slot(url: &str, name: &str) -> Result<(), String> {
    let sql = Sql::connect(url).await?;
    sql.client
        .execute("SELECT pg_drop_replication_slot($1)", &[&name])
        .await
        .map_err(|e| format!("dropping slot {name}: {}", db_error(&e)))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(v: Value) -> PostgresCdcSource {
        compile(&v).unwrap()
    }

    fn err(v: Value) -> SettingError {
        compile(&v).unwrap_err()
    }

    #[test]
    fn settings_are_checked_field_by_field() {
        let s = ok(
            json!({"type": "postgres_cdc", "url": "postgres://u@h:5433/legacy",
            "publication": "legacy_pub", "tables": ["cust_acct", "Billing.BILL_HDR"]}),
        );
        assert_eq!(s.slot, "meshql_legacy_pub");
        assert_eq!(s.tables[0].label(), "cust_acct");
        assert_eq!(s.tables[1].label(), "billing.bill_hdr");
        assert!(s.create && s.snapshot);
        let base = json!({"type": "postgres_cdc", "url": "postgres://u@h/db", "publication": "p", "tables": ["t"]});
        let with = |k: &str, v: Value| {
            let mut b = base.clone();
            b[k] = v;
            b
        };
        assert_eq!(
            err(with("url", json!("mysql://x"))).field.as_deref(),
            Some("source.url")
        );
        // TLS settings are read as the PostgreSQL store reads them
        let bad = err(with("url", json!("postgres://u@h/db?sslmode=sometimes")));
        assert_eq!(bad.field.as_deref(), Some("source.url"));
        assert!(bad.message.contains("sslmode"), "{bad:?}");
        let bad = err(with(
            "url",
            json!("postgres://u@h/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem"),
        ));
        assert!(bad.message.contains("/nonexistent/ca.pem"), "{bad:?}");
        assert!(compile(&with("url", json!("postgres://u@h/db?sslmode=require"))).is_ok());
        assert_eq!(
            err(with("publication", json!("Legacy Pub")))
                .field
                .as_deref(),
            Some("source.publication")
        );
        assert_eq!(
            err(with("slot", json!("bad-slot"))).field.as_deref(),
            Some("source.slot")
        );
        assert_eq!(
            err(with("tables", json!([]))).field.as_deref(),
            Some("source.tables")
        );
        assert_eq!(
            err(with("tables", json!(["a b"]))).field.as_deref(),
            Some("source.tables[0]")
        );
        assert_eq!(
            err(with("tables", json!(["t", "T"]))).field.as_deref(),
            Some("source.tables[1]")
        );
        assert_eq!(
            err(with("entities", json!({"other": "e"})))
                .field
                .as_deref(),
            Some("source.entities.other")
        );
        assert!(err(with("nope", json!(1)))
            .field
            .unwrap()
            .starts_with("source"));
    }

    #[test]
    fn passwords_are_kept_out_of_messages() {
        assert_eq!(
            redacted_url("postgres://u:secret@h:5/db"),
            "postgres://u:***@h:5/db"
        );
        assert_eq!(redacted_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redacted_url("postgres://h/db"), "postgres://h/db");
    }

    #[test]
    fn the_state_row_round_trips() {
        for a in [
            Applied {
                lsn: 42,
                partial: None,
            },
            Applied {
                lsn: 42,
                partial: Some((50, 7)),
            },
        ] {
            assert_eq!(Applied::parse(&a.text()), Some(a));
        }
        assert_eq!(Applied::parse("{}"), None);
    }

    #[test]
    fn column_text_becomes_typed_json() {
        let t = |s: &str| ColumnData::text(s.as_bytes().to_vec());
        assert_eq!(value_of(&t("9840"), oid::INT4), json!(9840));
        assert_eq!(value_of(&t("98.40"), oid::NUMERIC), json!(98.4));
        assert_eq!(value_of(&t("12"), oid::NUMERIC), json!(12));
        assert_eq!(value_of(&t("NaN"), oid::NUMERIC), json!("NaN"));
        assert_eq!(value_of(&t("t"), oid::BOOL), json!(true));
        assert_eq!(value_of(&t("{\"a\":1}"), oid::JSONB), json!({"a": 1}));
        assert_eq!(value_of(&t("19980315"), 1043), json!("19980315"));
        assert_eq!(value_of(&ColumnData::null(), oid::INT4), Value::Null);
        assert_eq!(pg_micros_to_unix_ms(0), 946_684_800_000);
    }
}
