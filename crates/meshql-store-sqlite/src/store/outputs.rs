//! Processor outputs committed with their input position (`meshql_core::output`).
//!
//! Three tables per database file, beside the entity tables, created with the first store
//! prepared in the file:
//!
//! | table | holds |
//! |---|---|
//! | `_meshql_outputs` | `consumer → position`: the last input committed |
//! | `_meshql_output_state` | `(consumer, key) → (grp, value)`, with an index on `(consumer, grp)` |
//! | `_meshql_dead_letters` | inputs a consumer gave up on, with the reason |
//!
//! [`OutputStore::apply_output`] is one job of the file's writer: the document versions, the
//! state rows, the dead letters and the position are written in the same transaction (the
//! writer's group commit), so they are committed together or not at all.

use super::{Current, SqliteStore, Version};
use crate::db::query_error;
use crate::dialect::DIALECT;
use crate::sql::quote_ident;
use async_trait::async_trait;
use meshql_core::{
    DeadLetter, Envelope, OutputBatch, OutputStore, OutputWrite, RemoveOutcome, StateWrite,
    StoreError, WriteContext,
};
use meshql_store_sql::outputs::{put_tokens, with_id, OutputSql};
use meshql_store_sql::table_core::TableCore;
use rusqlite::{params, Connection, OptionalExtension};
use std::collections::HashMap;
use std::sync::LazyLock;

/// The tables, created if missing (run by `prepare`).
pub(super) const DDL: &str = "
CREATE TABLE IF NOT EXISTS _meshql_outputs (
  consumer TEXT PRIMARY KEY,
  position INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS _meshql_output_state (
  consumer TEXT NOT NULL,
  key TEXT NOT NULL,
  grp TEXT,
  value TEXT NOT NULL,
  PRIMARY KEY (consumer, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS _meshql_output_state_grp
  ON _meshql_output_state (consumer, grp) WHERE grp IS NOT NULL;
CREATE TABLE IF NOT EXISTS _meshql_dead_letters (
  seq INTEGER PRIMARY KEY,
  consumer TEXT NOT NULL,
  position INTEGER NOT NULL,
  change_id TEXT NOT NULL,
  entity TEXT NOT NULL,
  reason TEXT NOT NULL,
  input TEXT NOT NULL,
  at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS _meshql_dead_letters_consumer
  ON _meshql_dead_letters (consumer, seq);
";

/// A version of a log [`SqliteStore::apply_log`] applies.
#[derive(Debug, Clone, PartialEq)]
pub struct LogVersion {
    pub envelope: Envelope,
    /// Its writer asked for its `created_at` (a back-dated write), rather than "now".
    pub requested: bool,
    /// The correlation id of the write that made it, for the change feed.
    pub correlation_id: Option<String>,
}

impl From<Envelope> for LogVersion {
    /// A version stamped "now" by its writer.
    fn from(envelope: Envelope) -> Self {
        LogVersion {
            envelope,
            requested: false,
            correlation_id: None,
        }
    }
}

/// The statements of outputs every SQL store shares ([`OutputSql`]).
static OUTPUT_SQL: LazyLock<OutputSql> = LazyLock::new(|| OutputSql::new(&DIALECT));

/// A consumer's state row by key (consumer, key): one read per key.
const STATE: &str = "SELECT value FROM _meshql_output_state WHERE consumer = ?1 AND key = ?2";

/// The statements above, by name, for the golden test.
#[cfg(test)]
pub(super) fn golden_statements() -> Vec<(String, String)> {
    meshql_store_sql::golden::output_statements(&OUTPUT_SQL, &[("state", STATE)])
}

/// Writes (or, with no value, deletes) `consumer`'s state rows.
fn write_state(conn: &Connection, consumer: &str, state: &[StateWrite]) -> Result<(), StoreError> {
    let mut upsert = conn
        .prepare_cached(&OUTPUT_SQL.upsert_state)
        .map_err(query_error)?;
    let mut delete = conn
        .prepare_cached(&OUTPUT_SQL.delete_state)
        .map_err(query_error)?;
    for s in state {
        match &s.value {
            Some(v) => upsert.execute(params![consumer, s.key, s.group, v]),
            None => delete.execute(params![consumer, s.key]),
        }
        .map_err(query_error)?;
    }
    Ok(())
}

/// The table a rebuild of `table` writes (SQLite's names have no length limit).
pub(super) fn rebuild_table(table: &str) -> String {
    meshql_store_sql::names::rebuild_table(table, None)
}

impl SqliteStore {
    /// Applies versions made elsewhere, in the order of the log they come from (the Kafka
    /// backend's local materialisation, `meshql-store-kafka`), with `consumer`'s `state` rows
    /// (the log's positions) in the same transaction: all of it is committed, or none.
    ///
    /// Each version keeps its id, payload, tombstone flag and tokens. One stamped "now" by
    /// its writer becomes its document's newest: its `created_at` is the log's, raised to 1 ms
    /// after the current version's when it is not later (writers whose clocks disagree), so
    /// the latest version and `at` reads follow the log's order. One whose writer asked for
    /// its `created_at` ([`LogVersion::requested`]) is placed as a write with that time is
    /// placed here: in the past when it is older than the current version. Returns the
    /// versions as stored; they are on the store's change feed like any other write.
    pub async fn apply_log(
        &self,
        consumer: &str,
        versions: Vec<LogVersion>,
        state: Vec<StateWrite>,
    ) -> Result<Vec<Envelope>, StoreError> {
        let sql = self.sql.clone();
        let consumer = consumer.to_owned();
        let written = self
            .db
            .write(move |conn| {
                let mut written = Vec::with_capacity(versions.len());
                for LogVersion {
                    envelope: v,
                    requested,
                    correlation_id,
                } in versions
                {
                    let payload = with_id(&v.id, &v.payload)?;
                    // read once: it places the version and is what appending it replaces
                    let current = Self::current(conn, &sql, &v.id)?;
                    let stamp = match &current {
                        Some(c) if !requested => v.created_at.max(c.created_at + 1),
                        _ => v.created_at,
                    };
                    written.push(Self::append_after(
                        conn,
                        &sql,
                        Version {
                            id: &v.id,
                            payload,
                            created_at: Some(stamp),
                            deleted: v.deleted,
                            tokens: &v.authorized_tokens,
                            fresh_id: false,
                            correlation_id: correlation_id.as_deref(),
                        },
                        current,
                    )?);
                }
                write_state(conn, &consumer, &state)?;
                Ok(written)
            })
            .await?;
        if !written.is_empty() {
            self.core.wrote(written.len() as u64);
        }
        Ok(written)
    }

    /// A `Put`: the next version of `id`, keeping its tokens unless `ctx` sets them.
    fn put(
        conn: &Connection,
        sql: &super::TableSql,
        id: &str,
        payload: String,
        ctx: &WriteContext,
    ) -> Result<Envelope, StoreError> {
        let current: Option<Current> = Self::current(conn, sql, id)?;
        let tokens = put_tokens(ctx, current.as_ref());
        Self::append(
            conn,
            sql,
            Version {
                id,
                payload,
                created_at: None,
                deleted: false,
                tokens,
                fresh_id: false,
                correlation_id: ctx.correlation_id.as_deref(),
            },
        )
    }
}

fn letter_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(String, DeadLetter)> {
    Ok((
        r.get(0)?,
        DeadLetter {
            position: r.get::<_, i64>(1)? as u64,
            change_id: r.get(2)?,
            entity: r.get(3)?,
            reason: r.get(4)?,
            input: r.get(5)?,
            at: r.get(6)?,
        },
    ))
}

#[async_trait]
impl OutputStore for SqliteStore {
    fn supports_outputs(&self) -> bool {
        true
    }

    async fn output_position(&self, consumer: &str) -> Result<Option<u64>, StoreError> {
        self.db.read(|conn| {
            conn.prepare_cached(&OUTPUT_SQL.position)
                .map_err(query_error)?
                .query_row(params![consumer], |r| r.get::<_, i64>(0))
                .optional()
                .map(|p| p.map(|p| p as u64))
                .map_err(query_error)
        })
    }

    async fn output_state(
        &self,
        consumer: &str,
        keys: &[String],
    ) -> Result<HashMap<String, String>, StoreError> {
        self.db.read(|conn| {
            let mut stmt = conn.prepare_cached(STATE).map_err(query_error)?;
            let mut found = HashMap::with_capacity(keys.len());
            for key in keys {
                if let Some(v) = stmt
                    .query_row(params![consumer, key], |r| r.get::<_, String>(0))
                    .optional()
                    .map_err(query_error)?
                {
                    found.insert(key.clone(), v);
                }
            }
            Ok(found)
        })
    }

    async fn output_group(
        &self,
        consumer: &str,
        group: &str,
    ) -> Result<Vec<(String, String)>, StoreError> {
        self.db.read(|conn| {
            let mut stmt = conn
                .prepare_cached(&OUTPUT_SQL.group)
                .map_err(query_error)?;
            let rows = stmt
                .query_map(params![consumer, group], |r| Ok((r.get(0)?, r.get(1)?)))
                .map_err(query_error)?;
            rows.map(|r| r.map_err(query_error)).collect()
        })
    }

    async fn apply_output(
        &self,
        batch: OutputBatch,
        ctx: &WriteContext,
    ) -> Result<Vec<Envelope>, StoreError> {
        let sql = self.sql.clone();
        let ctx = ctx.clone();
        let written = self
            .db
            .write(move |conn| {
                let mut written = Vec::with_capacity(batch.writes.len());
                for write in batch.writes {
                    match write {
                        OutputWrite::Put { id, payload } => {
                            let payload = with_id(&id, &payload)?;
                            written.push(Self::put(conn, &sql, &id, payload, &ctx)?);
                        }
                        OutputWrite::Delete { id } => {
                            let ctx = WriteContext {
                                filter: meshql_core::TokenFilter::All,
                                ..ctx.clone()
                            };
                            if Self::remove_one(conn, &sql, &id, &ctx)? == RemoveOutcome::Removed {
                                if let Some(cur) = Self::current(conn, &sql, &id)? {
                                    written.push(Envelope {
                                        id,
                                        payload: cur.payload,
                                        created_at: cur.created_at,
                                        deleted: true,
                                        authorized_tokens: cur.tokens,
                                    });
                                }
                            }
                        }
                    }
                }
                write_state(conn, &batch.consumer, &batch.state)?;
                let mut letter = conn
                    .prepare_cached(&OUTPUT_SQL.insert_letter)
                    .map_err(query_error)?;
                for d in &batch.dead_letters {
                    letter
                        .execute(params![
                            batch.consumer,
                            d.position as i64,
                            d.change_id,
                            d.entity,
                            d.reason,
                            d.input,
                            d.at
                        ])
                        .map_err(query_error)?;
                }
                conn.prepare_cached(&OUTPUT_SQL.upsert_position)
                    .map_err(query_error)?
                    .execute(params![batch.consumer, batch.position as i64])
                    .map_err(query_error)?;
                Ok(written)
            })
            .await?;
        if !written.is_empty() {
            self.core.wrote(written.len() as u64);
        }
        Ok(written)
    }

    async fn dead_letters(
        &self,
        consumer: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, DeadLetter)>, StoreError> {
        let limit = limit.min(i64::MAX as usize) as i64;
        self.db.read(|conn| {
            let rows: Vec<_> = match consumer {
                Some(c) => conn
                    .prepare_cached(&OUTPUT_SQL.letters_of)
                    .map_err(query_error)?
                    .query_map(params![c, limit], letter_from_row)
                    .map_err(query_error)?
                    .collect(),
                None => conn
                    .prepare_cached(&OUTPUT_SQL.letters)
                    .map_err(query_error)?
                    .query_map(params![limit], letter_from_row)
                    .map_err(query_error)?
                    .collect(),
            };
            rows.into_iter().map(|r| r.map_err(query_error)).collect()
        })
    }

    async fn dead_letter_count(&self, consumer: &str) -> Result<u64, StoreError> {
        self.db.read(|conn| {
            conn.prepare_cached(&OUTPUT_SQL.count_letters)
                .map_err(query_error)?
                .query_row(params![consumer], |r| r.get::<_, i64>(0))
                .map(|n| n as u64)
                .map_err(query_error)
        })
    }

    async fn rebuild_store(&self) -> Result<meshql_core::DynStore, StoreError> {
        let shadow = rebuild_table(self.core.table());
        let drop = format!("DROP TABLE IF EXISTS {}", quote_ident(&shadow));
        self.db
            .write(move |conn| conn.execute_batch(&drop).map_err(query_error))
            .await?;
        let store = SqliteStore::new(self.db.clone(), &shadow);
        let templates = self.core.templates();
        meshql_core::Store::prepare(&store, &templates).await?;
        Ok(std::sync::Arc::new(store))
    }

    async fn swap_rebuilt(&self, from: &str, to: &str) -> Result<(), StoreError> {
        let table = self.core.table().to_owned();
        let shadow = rebuild_table(&table);
        let templates = self.core.templates();
        let (from, to) = (from.to_owned(), to.to_owned());
        self.db
            .write(move |conn| {
                let old = format!("{table}__old");
                let seq: i64 = conn
                    .query_row(
                        "SELECT COALESCE(MAX(seq), 0) FROM sqlite_sequence WHERE name = ?1",
                        params![table],
                        |r| r.get(0),
                    )
                    .map_err(query_error)?;
                // the rebuild table's indexes carry its name: drop them, the table takes the
                // live name, and the live names' indexes are made on it
                let shadow_indexes: Vec<String> = conn
                    .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?1 AND sql IS NOT NULL")
                    .and_then(|mut s| {
                        s.query_map(params![shadow], |r| r.get(0))?
                            .collect::<Result<Vec<String>, _>>()
                    })
                    .map_err(query_error)?;
                let mut ddl = String::new();
                for idx in shadow_indexes {
                    ddl.push_str(&format!("DROP INDEX {};\n", quote_ident(&idx)));
                }
                ddl.push_str(&format!(
                    "ALTER TABLE {} RENAME TO {};\nALTER TABLE {} RENAME TO {};\nDROP TABLE {};\n",
                    quote_ident(&table),
                    quote_ident(&old),
                    quote_ident(&shadow),
                    quote_ident(&table),
                    quote_ident(&old),
                ));
                let mut schema = vec![crate::sql::create_table(&table)];
                schema.extend(TableCore::index_ddl(&DIALECT, &table, &templates));
                ddl.push_str(&schema.join(";\n"));
                conn.execute_batch(&ddl).map_err(query_error)?;
                // row ids go on from the old table's: the change feed's cursor stays valid
                conn.execute(
                    "UPDATE sqlite_sequence SET seq = MAX(seq, ?2) WHERE name = ?1",
                    params![table, seq],
                )
                .map_err(query_error)?;
                conn.execute(
                    "INSERT INTO sqlite_sequence (name, seq) SELECT ?1, ?2 \
                     WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = ?1)",
                    params![table, seq],
                )
                .map_err(query_error)?;
                for (delete, update) in OUTPUT_SQL
                    .delete_consumer
                    .iter()
                    .zip(&OUTPUT_SQL.move_consumer)
                {
                    conn.execute(delete, params![to]).map_err(query_error)?;
                    conn.execute(update, params![from, to])
                        .map_err(query_error)?;
                }
                Ok(())
            })
            .await
    }

    async fn reset_output(&self, consumer: &str) -> Result<(), StoreError> {
        let consumer = consumer.to_owned();
        self.db
            .write(move |conn| {
                for delete in &OUTPUT_SQL.delete_consumer {
                    conn.execute(delete, params![consumer])
                        .map_err(query_error)?;
                }
                Ok(())
            })
            .await
    }
}
