//! Processor outputs committed with their input position (`meshql_core::output`).
//!
//! Three tables per database (in the schema the entity tables are created in), beside the
//! entity tables, created by `prepare`:
//!
//! | table | holds |
//! |---|---|
//! | `_meshql_outputs` | `consumer → position`: the last input committed |
//! | `_meshql_output_state` | `(consumer, key) → (grp, value)`, with an index on `(consumer, grp, key)` |
//! | `_meshql_dead_letters` | inputs a consumer gave up on, with the reason |
//!
//! [`OutputStore::apply_output`] is one transaction on the primary: the ids the batch writes
//! are locked first (the advisory locks of the update path, in one order, pipelined, so
//! REST writers of the same ids wait, and the transaction gets its id — its place in the
//! change feed — only once it holds them), and their newest versions read with one
//! statement; each `Put` or `Delete` is then a version appended exactly as an update or a
//! remove appends one (latest flags, collision checks, its own change in the feed); the
//! state rows, dead letters and the position follow, pipelined in one round trip, and the
//! commit makes all of it visible at once or none of it. Keys and groups compare and sort
//! bytewise (`COLLATE "C"`), as on every backend. The reads (position, state, dead letters)
//! go to the primary too: a processor must see what it committed, which a replica may not
//! show yet.

use super::{prepared, Current, PostgresStore, Version};
use crate::db::{pg_error, pool_error};
use crate::pipeline::pipelined_all;
use async_trait::async_trait;
use meshql_core::{
    DeadLetter, Envelope, OutputBatch, OutputStore, OutputWrite, StoreError, WriteContext,
};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use tokio_postgres::types::ToSql;

/// The tables, created if missing (run by `prepare`, under its DDL lock).
pub(super) const DDL: &str = r#"
CREATE TABLE IF NOT EXISTS _meshql_outputs (
  consumer TEXT COLLATE "C" PRIMARY KEY,
  position BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS _meshql_output_state (
  consumer TEXT COLLATE "C" NOT NULL,
  key TEXT COLLATE "C" NOT NULL,
  grp TEXT COLLATE "C",
  value TEXT NOT NULL,
  PRIMARY KEY (consumer, key)
);
CREATE INDEX IF NOT EXISTS _meshql_output_state_grp
  ON _meshql_output_state (consumer, grp, key) WHERE grp IS NOT NULL;
CREATE TABLE IF NOT EXISTS _meshql_dead_letters (
  seq BIGSERIAL PRIMARY KEY,
  consumer TEXT COLLATE "C" NOT NULL,
  position BIGINT NOT NULL,
  change_id TEXT NOT NULL,
  entity TEXT NOT NULL,
  reason TEXT NOT NULL,
  input TEXT NOT NULL,
  at BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS _meshql_dead_letters_consumer
  ON _meshql_dead_letters (consumer, seq);
"#;

const POSITION: &str = "SELECT position FROM _meshql_outputs WHERE consumer = $1";
const STATE: &str =
    "SELECT key, value FROM _meshql_output_state WHERE consumer = $1 AND key = ANY($2::text[])";
const GROUP: &str = "SELECT key, value FROM _meshql_output_state \
                     WHERE consumer = $1 AND grp = $2 ORDER BY key";
const UPSERT_STATE: &str = "INSERT INTO _meshql_output_state (consumer, key, grp, value) \
                            VALUES ($1, $2, $3, $4) ON CONFLICT (consumer, key) \
                            DO UPDATE SET grp = EXCLUDED.grp, value = EXCLUDED.value";
const DELETE_STATE: &str = "DELETE FROM _meshql_output_state WHERE consumer = $1 AND key = $2";
const INSERT_LETTER: &str = "INSERT INTO _meshql_dead_letters \
                             (consumer, position, change_id, entity, reason, input, at) \
                             VALUES ($1, $2, $3, $4, $5, $6, $7)";
const UPSERT_POSITION: &str = "INSERT INTO _meshql_outputs (consumer, position) VALUES ($1, $2) \
                               ON CONFLICT (consumer) DO UPDATE SET position = EXCLUDED.position";
const LETTER_COLUMNS: &str = "consumer, position, change_id, entity, reason, input, at";
const COUNT_LETTERS: &str = "SELECT COUNT(*) FROM _meshql_dead_letters WHERE consumer = $1";
const RESET: [&str; 3] = [
    "DELETE FROM _meshql_outputs WHERE consumer = $1",
    "DELETE FROM _meshql_output_state WHERE consumer = $1",
    "DELETE FROM _meshql_dead_letters WHERE consumer = $1",
];

/// A log position as a BIGINT.
fn bigint(position: u64, what: &str) -> Result<i64, StoreError> {
    i64::try_from(position)
        .map_err(|_| StoreError::Invalid(format!("{what} {position} exceeds a BIGINT")))
}

fn letter(r: &tokio_postgres::Row) -> (String, DeadLetter) {
    (
        r.get(0),
        DeadLetter {
            position: r.get::<_, i64>(1) as u64,
            change_id: r.get(2),
            entity: r.get(3),
            reason: r.get(4),
            input: r.get(5),
            at: r.get(6),
        },
    )
}

/// The stored text of an output payload with `"id"` set to `id`.
fn with_id(id: &str, payload: &str) -> Result<String, StoreError> {
    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_str(payload)
        .map_err(|e| StoreError::Invalid(format!("output payload of `{id}`: {e}")))?;
    Ok(meshql_core::NewDocument::with_id(id, map).into_payload_text(id))
}

impl PostgresStore {
    /// The newest versions of `ids` (locked by the caller), by id.
    async fn current_many<C: deadpool_postgres::GenericClient>(
        &self,
        client: &C,
        ids: &[&str],
    ) -> Result<HashMap<String, Current>, StoreError> {
        if ids.is_empty() {
            return Ok(HashMap::new());
        }
        let stmt = prepared(client, &self.sql.current_many).await?;
        let rows = client.query(&stmt, &[&ids]).await.map_err(pg_error)?;
        Ok(rows
            .iter()
            .map(|r| (r.get(0), Current::of_row_at(r, 1)))
            .collect())
    }

    /// The document writes of a batch, in its transaction; the versions written, in order.
    async fn write_outputs<C: deadpool_postgres::GenericClient>(
        &self,
        client: &C,
        writes: Vec<OutputWrite>,
        ctx: &WriteContext,
    ) -> Result<Vec<Envelope>, StoreError> {
        let ids: Vec<&str> = writes.iter().map(OutputWrite::id).collect();
        self.lock_all(client, &ids).await?;
        let mut current = self.current_many(client, &ids).await?;
        // a batch writes each id once; should one come twice, its second write reads the
        // version its first appended
        let mut written_ids: HashSet<String> = HashSet::with_capacity(writes.len());
        let mut written = Vec::with_capacity(writes.len());
        for write in writes {
            let cur = match written_ids.contains(write.id()) {
                true => self.current(client, write.id()).await?,
                false => current.remove(write.id()),
            };
            written_ids.insert(write.id().to_owned());
            match write {
                OutputWrite::Put { id, payload } => {
                    let payload = with_id(&id, &payload)?;
                    let tokens = match (&ctx.tokens, &cur) {
                        (Some(t), _) => t.clone(),
                        (None, Some(cur)) if !cur.deleted => cur.tokens.clone(),
                        (None, _) => Vec::new(),
                    };
                    let version = Version {
                        id: &id,
                        payload,
                        created_at: None,
                        deleted: false,
                        tokens: &tokens,
                        correlation_id: ctx.correlation_id.as_deref(),
                    };
                    written.push(self.append(client, version, cur.as_ref()).await?);
                }
                // the remove path's tombstone, as a writer that sees everything; nothing for
                // an id without a current version
                OutputWrite::Delete { id } => {
                    if let Some(cur) = cur.filter(|c| !c.deleted) {
                        let correlation_id = ctx.correlation_id.as_deref();
                        written.push(self.tombstone(client, &id, cur, correlation_id).await?);
                    }
                }
            }
        }
        Ok(written)
    }
}

#[async_trait]
impl OutputStore for PostgresStore {
    fn supports_outputs(&self) -> bool {
        true
    }

    async fn output_position(&self, consumer: &str) -> Result<Option<u64>, StoreError> {
        let client = self.db.write.get().await.map_err(pool_error)?;
        let stmt = prepared(&client, POSITION).await?;
        let row = client
            .query_opt(&stmt, &[&consumer])
            .await
            .map_err(pg_error)?;
        Ok(row.map(|r| r.get::<_, i64>(0) as u64))
    }

    async fn output_state(
        &self,
        consumer: &str,
        keys: &[String],
    ) -> Result<HashMap<String, String>, StoreError> {
        if keys.is_empty() {
            return Ok(HashMap::new());
        }
        let client = self.db.write.get().await.map_err(pool_error)?;
        let stmt = prepared(&client, STATE).await?;
        let rows = client
            .query(&stmt, &[&consumer, &keys])
            .await
            .map_err(pg_error)?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    async fn output_group(
        &self,
        consumer: &str,
        group: &str,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let client = self.db.write.get().await.map_err(pool_error)?;
        let stmt = prepared(&client, GROUP).await?;
        let rows = client
            .query(&stmt, &[&consumer, &group])
            .await
            .map_err(pg_error)?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    async fn apply_output(
        &self,
        batch: OutputBatch,
        ctx: &WriteContext,
    ) -> Result<Vec<Envelope>, StoreError> {
        let OutputBatch {
            consumer,
            position,
            writes,
            state,
            dead_letters,
        } = batch;
        let position = bigint(position, "the position")?;
        let letter_positions = dead_letters
            .iter()
            .map(|d| bigint(d.position, "a dead letter's position"))
            .collect::<Result<Vec<i64>, _>>()?;
        let mut client = self.db.write.get().await.map_err(pool_error)?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let written = self.write_outputs(&tx, writes, ctx).await?;
        // the rest in one round trip, run in this order: state rows, dead letters, position
        let upsert = prepared(&tx, UPSERT_STATE).await?;
        let delete = prepared(&tx, DELETE_STATE).await?;
        let insert_letter = prepared(&tx, INSERT_LETTER).await?;
        let upsert_position = prepared(&tx, UPSERT_POSITION).await?;
        let mut statements: Vec<(&tokio_postgres::Statement, Vec<&(dyn ToSql + Sync)>)> =
            Vec::with_capacity(state.len() + dead_letters.len() + 1);
        for s in &state {
            statements.push(match &s.value {
                Some(v) => (&upsert, vec![&consumer, &s.key, &s.group, v]),
                None => (&delete, vec![&consumer, &s.key]),
            });
        }
        for (d, p) in dead_letters.iter().zip(&letter_positions) {
            statements.push((
                &insert_letter,
                vec![
                    &consumer,
                    p,
                    &d.change_id,
                    &d.entity,
                    &d.reason,
                    &d.input,
                    &d.at,
                ],
            ));
        }
        statements.push((&upsert_position, vec![&consumer, &position]));
        pipelined_all(
            statements
                .iter()
                .map(|(stmt, params)| tx.execute(*stmt, params.as_slice())),
        )
        .await
        .map_err(pg_error)?;
        tx.commit().await.map_err(pg_error)?;
        self.writes
            .fetch_add(written.len() as u64, Ordering::Relaxed);
        self.commits.fetch_add(1, Ordering::Relaxed);
        if !written.is_empty() {
            self.signal.notify();
        }
        Ok(written)
    }

    async fn dead_letters(
        &self,
        consumer: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, DeadLetter)>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let client = self.db.write.get().await.map_err(pool_error)?;
        let rows = match consumer {
            Some(c) => {
                let sql = format!(
                    "SELECT {LETTER_COLUMNS} FROM _meshql_dead_letters WHERE consumer = $1 \
                     ORDER BY seq DESC LIMIT $2"
                );
                let stmt = prepared(&client, &sql).await?;
                client.query(&stmt, &[&c, &limit]).await
            }
            None => {
                let sql = format!(
                    "SELECT {LETTER_COLUMNS} FROM _meshql_dead_letters ORDER BY seq DESC LIMIT $1"
                );
                let stmt = prepared(&client, &sql).await?;
                client.query(&stmt, &[&limit]).await
            }
        }
        .map_err(pg_error)?;
        Ok(rows.iter().map(letter).collect())
    }

    async fn dead_letter_count(&self, consumer: &str) -> Result<u64, StoreError> {
        let client = self.db.write.get().await.map_err(pool_error)?;
        let stmt = prepared(&client, COUNT_LETTERS).await?;
        let row = client
            .query_one(&stmt, &[&consumer])
            .await
            .map_err(pg_error)?;
        Ok(row.get::<_, i64>(0) as u64)
    }

    async fn reset_output(&self, consumer: &str) -> Result<(), StoreError> {
        let mut client = self.db.write.get().await.map_err(pool_error)?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let mut statements = Vec::with_capacity(RESET.len());
        for sql in RESET {
            statements.push(prepared(&tx, sql).await?);
        }
        let params: [&(dyn ToSql + Sync); 1] = [&consumer];
        pipelined_all(statements.iter().map(|s| tx.execute(s, &params)))
            .await
            .map_err(pg_error)?;
        tx.commit().await.map_err(pg_error)
    }
}
