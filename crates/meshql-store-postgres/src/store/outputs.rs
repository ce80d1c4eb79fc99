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
//!
//! # Rebuilds
//!
//! [`OutputStore::rebuild_store`] drops what an earlier rebuild left and creates the entity's
//! table again under [`crate::sql::rebuild_table`]'s name (`<table>__rebuild`), with the
//! indexes of the live table's templates, and answers a store on it: the rebuild writes
//! there while every reader and writer of the entity still uses the live table. Its versions
//! are written at transaction id 0 (the `tx` column's default on that table), so once they
//! take the live table's place they sit before every cursor of the change feed but its start:
//! a feed reader does not get them again (what readers already read of the old table stays
//! read), and the versions written after the swap come after every cursor as always.
//!
//! [`OutputStore::swap_rebuilt`] is one transaction, PostgreSQL's DDL being transactional:
//! both tables locked (ACCESS EXCLUSIVE, the live one first), the live table dropped, the
//! rebuild table renamed to the live name, its indexes, constraints and `_id` sequence
//! renamed to the names the live table's had (so that `prepare` at the next start finds its
//! indexes under the names it creates them with, and the next rebuild's names are free),
//! `tx`'s default restored, then consumer `from`'s position, state rows and dead letters
//! become `to`'s. A reader's statement runs before the lock (on the old table, which the
//! swap waits for) or after the commit (on the new one); one that arrives meanwhile waits on
//! the lock and, as PostgreSQL looks the name up again once it holds a lock on a relation
//! that changed, reads the new table. Never an empty or partial table: the rebuild table
//! was complete before the transaction began.
//!
//! Why a rename and not a view or a second name: every statement of this store names the
//! table, and the statements are prepared once per pooled connection and cached by their
//! text (deadpool's `prepare_cached`, [`PostgresStore`]'s nested statements, its template
//! statements). A prepared statement keeps its query's names, not the table it found: when a
//! table it reads is altered, renamed or dropped, PostgreSQL invalidates the plan and plans
//! it again from the names at its next execution (with the same result columns, which the
//! rebuild table has). So the live store's cached texts, its nested statements and the
//! statements cached on every connection stay valid and read the new table after the swap;
//! nothing of this store has to follow it. The rebuild table's name is fixed per table, not
//! a new generation each time, for the same caches: the statements the rebuild store
//! prepared on the pool's connections name it, and the next rebuild uses them again instead
//! of adding a set per rebuild to caches that are never emptied.

use super::{current_of_row_at, prepared, PostgresStore};
use crate::db::{pg_error, pool_error};
use crate::dialect::DIALECT;
use crate::pipeline::pipelined_all;
use crate::sql::{self, quote_ident};
use async_trait::async_trait;
use meshql_core::{
    DeadLetter, Envelope, OutputBatch, OutputStore, OutputWrite, StoreError, WriteContext,
};
use meshql_store_sql::outputs::{bigint, OutputSql, OutputStep, OutputWrites};
use meshql_store_sql::rules::{Current, Version};
use std::collections::HashMap;
use std::sync::LazyLock;
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

/// The statements of outputs every SQL store shares ([`OutputSql`]).
static OUTPUT_SQL: LazyLock<OutputSql> = LazyLock::new(|| OutputSql::new(&DIALECT));

/// A consumer's state rows of several keys (consumer, keys).
const STATE: &str =
    "SELECT key, value FROM _meshql_output_state WHERE consumer = $1 AND key = ANY($2::text[])";

/// The statements of this module, by name, for the golden test.
#[cfg(test)]
pub(super) fn golden_statements() -> Vec<(String, String)> {
    meshql_store_sql::golden::output_statements(&OUTPUT_SQL, &[("state", STATE)])
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

/// The names of a table's primary key (`'p'`), its unique key (`'u'`) and its `_id` sequence
/// (`'S'`), which PostgreSQL chose from the table's name when it was created.
async fn implicit_names<C: deadpool_postgres::GenericClient>(
    client: &C,
    table: &str,
) -> Result<Vec<(char, String)>, StoreError> {
    let rows = client
        .query(
            "SELECT c.contype::text, c.conname::text FROM pg_constraint c \
             WHERE c.conrelid = $1::text::regclass AND c.contype IN ('p', 'u') \
             UNION ALL SELECT 'S', s.relname::text FROM pg_class s \
             WHERE s.oid = pg_get_serial_sequence($1::text, '_id')::regclass",
            &[&table],
        )
        .await
        .map_err(pg_error)?;
    Ok(rows
        .iter()
        .map(|r| {
            let kind: String = r.get(0);
            (kind.chars().next().unwrap_or(' '), r.get(1))
        })
        .collect())
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
            .map(|r| (r.get(0), current_of_row_at(r, 1)))
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
        let mut plan = OutputWrites::new(self.current_many(client, &ids).await?, writes.len());
        let mut written = Vec::with_capacity(writes.len());
        let correlation_id = ctx.correlation_id.as_deref();
        for write in writes {
            let cur = match plan.current(write.id()) {
                Ok(cur) => cur,
                Err(()) => self.current(client, write.id()).await?,
            };
            match OutputWrites::step(write, cur, ctx)? {
                OutputStep::Put {
                    id,
                    payload,
                    tokens,
                    current,
                } => {
                    let version = Version {
                        id: &id,
                        payload,
                        created_at: None,
                        deleted: false,
                        tokens: &tokens,
                        fresh_id: false,
                        correlation_id,
                    };
                    written.push(self.append(client, version, current.as_ref()).await?);
                }
                OutputStep::Tombstone { id, current } => {
                    written.push(self.tombstone(client, &id, current, correlation_id).await?);
                }
                OutputStep::Nothing => {}
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
        let stmt = prepared(&client, &OUTPUT_SQL.position).await?;
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
        let stmt = prepared(&client, &OUTPUT_SQL.group).await?;
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
        let upsert = prepared(&tx, &OUTPUT_SQL.upsert_state).await?;
        let delete = prepared(&tx, &OUTPUT_SQL.delete_state).await?;
        let insert_letter = prepared(&tx, &OUTPUT_SQL.insert_letter).await?;
        let upsert_position = prepared(&tx, &OUTPUT_SQL.upsert_position).await?;
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
        self.core.wrote(written.len() as u64);
        self.core.committed();
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
                let stmt = prepared(&client, &OUTPUT_SQL.letters_of).await?;
                client.query(&stmt, &[&c, &limit]).await
            }
            None => {
                let stmt = prepared(&client, &OUTPUT_SQL.letters).await?;
                client.query(&stmt, &[&limit]).await
            }
        }
        .map_err(pg_error)?;
        Ok(rows.iter().map(letter).collect())
    }

    async fn dead_letter_count(&self, consumer: &str) -> Result<u64, StoreError> {
        let client = self.db.write.get().await.map_err(pool_error)?;
        let stmt = prepared(&client, &OUTPUT_SQL.count_letters).await?;
        let row = client
            .query_one(&stmt, &[&consumer])
            .await
            .map_err(pg_error)?;
        Ok(row.get::<_, i64>(0) as u64)
    }

    async fn rebuild_store(&self) -> Result<meshql_core::DynStore, StoreError> {
        let shadow = sql::rebuild_table(self.core.table());
        let client = self.db.write.get().await.map_err(pool_error)?;
        client
            .batch_execute(&format!("DROP TABLE IF EXISTS {}", quote_ident(&shadow)))
            .await
            .map_err(pg_error)?;
        drop(client);
        let store = PostgresStore::new(self.db.clone(), &shadow);
        let templates = self.core.templates();
        meshql_core::Store::prepare(&store, &templates).await?;
        // its versions are before every cursor of the feed once swapped in (module docs)
        let client = self.db.write.get().await.map_err(pool_error)?;
        client
            .batch_execute(&format!(
                "ALTER TABLE {} ALTER COLUMN tx SET DEFAULT '0'::xid8",
                quote_ident(&shadow)
            ))
            .await
            .map_err(pg_error)?;
        Ok(std::sync::Arc::new(store))
    }

    async fn swap_rebuilt(&self, from: &str, to: &str) -> Result<(), StoreError> {
        let shadow = sql::rebuild_table(self.core.table());
        let (live_q, shadow_q) = (quote_ident(self.core.table()), quote_ident(&shadow));
        let templates = self.core.templates();
        let mut client = self.db.write.get().await.map_err(pool_error)?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let exists = tx
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&shadow_q])
            .await
            .map_err(pg_error)?;
        if !exists.get::<_, bool>(0) {
            return Err(StoreError::Invalid(format!(
                "no rebuild of `{}` to swap in",
                self.core.table()
            )));
        }
        tx.batch_execute(&format!(
            "LOCK TABLE {live_q}, {shadow_q} IN ACCESS EXCLUSIVE MODE"
        ))
        .await
        .map_err(pg_error)?;
        // the names PostgreSQL chose for the live table's constraints and sequence
        let (live_names, shadow_names) = (
            implicit_names(&tx, &live_q).await?,
            implicit_names(&tx, &shadow_q).await?,
        );
        let mut ddl = format!(
            "DROP TABLE {live_q};\nALTER TABLE {shadow_q} RENAME TO {live_q};\n\
             ALTER TABLE {live_q} ALTER COLUMN tx SET DEFAULT pg_current_xact_id();\n"
        );
        for suffix in sql::index_suffixes(&templates) {
            let (was, is) = (
                sql::index_name(&shadow, &suffix),
                sql::index_name(self.core.table(), &suffix),
            );
            ddl.push_str(&format!("ALTER INDEX IF EXISTS {was} RENAME TO {is};\n"));
        }
        for (kind, live_name) in &live_names {
            let Some((_, shadow_name)) = shadow_names.iter().find(|(k, _)| k == kind) else {
                continue;
            };
            if shadow_name == live_name {
                continue;
            }
            let (was, is) = (quote_ident(shadow_name), quote_ident(live_name));
            ddl.push_str(&match kind {
                'S' => format!("ALTER SEQUENCE {was} RENAME TO {is};\n"),
                _ => format!("ALTER TABLE {live_q} RENAME CONSTRAINT {was} TO {is};\n"),
            });
        }
        tx.batch_execute(&ddl).await.map_err(pg_error)?;
        let params: [&(dyn ToSql + Sync); 2] = [&from, &to];
        for (delete, update) in OUTPUT_SQL
            .delete_consumer
            .iter()
            .zip(&OUTPUT_SQL.move_consumer)
        {
            tx.execute(delete, &params[1..]).await.map_err(pg_error)?;
            tx.execute(update, &params).await.map_err(pg_error)?;
        }
        tx.commit().await.map_err(pg_error)?;
        self.core.committed();
        Ok(())
    }

    async fn reset_output(&self, consumer: &str) -> Result<(), StoreError> {
        let mut client = self.db.write.get().await.map_err(pool_error)?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let mut statements = Vec::with_capacity(OUTPUT_SQL.delete_consumer.len());
        for sql in &OUTPUT_SQL.delete_consumer {
            statements.push(prepared(&tx, sql).await?);
        }
        let params: [&(dyn ToSql + Sync); 1] = [&consumer];
        pipelined_all(statements.iter().map(|s| tx.execute(s, &params)))
            .await
            .map_err(pg_error)?;
        tx.commit().await.map_err(pg_error)
    }
}
