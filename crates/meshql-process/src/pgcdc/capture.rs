//! One capture session after another: connect, take the snapshot when there is no position,
//! then stream transactions, each batch committed with the processor's outputs and the
//! position it reached (see the module docs of [`crate::pgcdc`]).

use super::decode::{item, key_of, oid, pg_micros_to_unix_ms, row_of, text_of, Relation};
use super::settings::{PostgresCdcSource, Table};
use super::sql::{db_error, replication_config, Sql};
use crate::plan::Input;
use crate::source::contract::{Intake, SourceCounters};
use meshql_core::{ChangeOp, StateWrite};
use meshql_pg::tunnel::{TlsTarget, Tunnel};
use pg_walstream::{LogicalReplicationMessage, LogicalReplicationParser};
use pgwire_replication::{Lsn, ReplicationClient, ReplicationConfig, ReplicationEvent};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

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
    handler: Arc<dyn Intake>,
    counters: Arc<SourceCounters>,
    mut stop: watch::Receiver<bool>,
) {
    let batch = batch.max(1);
    let mut failures: u32 = 0;
    loop {
        if *stop.borrow() {
            return;
        }
        if !crate::source::contract::back_off(failures, &mut stop).await {
            return;
        }
        let mut capture = Capture {
            name: &name,
            source: &source,
            inputs: &inputs,
            batch,
            handler: handler.as_ref(),
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
    handler: &'a dyn Intake,
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
            .state(std::slice::from_ref(&key))
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
        let fresh = self.handler.position() == 0;
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
                    let position = self.handler.position() + pending.len() as u64 + 1;
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
            .map_or(self.handler.position(), |i| i.position);
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
        let position = self.handler.position() + pending.len() as u64 + 1;
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

/// How long a batch of streamed changes waits for the next change before it is committed.
const LINGER: Duration = Duration::from_millis(2);
/// The longest a streamed change waits for its batch to be committed (under a steady stream
/// of small transactions, which is never quiet for [`LINGER`]).
const BATCH_WAIT: Duration = Duration::from_millis(5);

#[cfg(test)]
mod tests {
    use super::*;
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
}
