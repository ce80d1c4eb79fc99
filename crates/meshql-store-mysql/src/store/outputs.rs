//! Processor outputs committed with their input position (`meshql_core::output`).
//!
//! Three tables per database, beside the entity tables, created by `prepare`:
//!
//! | table | holds |
//! |---|---|
//! | `_meshql_outputs` | `consumer → position`: the last input committed |
//! | `_meshql_output_state` | `(consumer, key) → (grp, value)`, with an index on `(consumer, grp)` |
//! | `_meshql_dead_letters` | inputs a consumer gave up on, with the reason |
//!
//! [`OutputStore::apply_output`] is one write transaction (READ COMMITTED, like every write
//! of this store): the newest versions of the ids the batch writes are read and locked with
//! one statement (`FOR UPDATE` through the `(latest, id)` index, the row locks the update
//! path takes, in id order), each `Put` or `Delete` appends a version exactly as an update or
//! a remove does (latest flags, collision checks), the state rows are upserted and deleted
//! with one statement each and the dead letters inserted with one (their rows passed as one
//! JSON array through `JSON_TABLE`), the position upserted, and — the last lock, as on every
//! write — the table's feed clock gives the versions their positions just before the
//! commit. So each version is one change of the feed, and the commit makes all of it
//! visible at once or none of it.
//!
//! Consumer names are at most 255 characters, state keys and groups at most 512 (the
//! indexes' limit with utf8mb4); keys and groups compare and sort bytewise (`utf8mb4_bin`),
//! as on every backend. A batch with a longer consumer name or key fails as a whole.
//!
//! # Rebuilds
//!
//! [`OutputStore::rebuild_store`] creates the entity's table again under
//! [`crate::sql::rebuild_table`]'s name (`<table>__rebuild`, dropping what an earlier
//! rebuild left), with the generated columns and indexes of the live table's templates, and
//! answers a store on it; every reader and writer of the entity still uses the live table.
//!
//! [`OutputStore::swap_rebuilt`] puts it in place with `RENAME TABLE t TO t__old, t__rebuild
//! TO t`, which is atomic: it waits for the statements using either table to end, holds off
//! new ones, and a statement that waited opens `t` by its name afterwards, the new table.
//! A reader never sees an empty or a partial table. Nothing of this store has to follow the
//! rename: its statements, nested ones included, name the table, and the server prepares a
//! statement again when a table it names changed (mysql_async's per-connection cache keeps
//! the text, which stays right).
//!
//! MySQL and MariaDB commit before and after every DDL statement, so the rename cannot share
//! a transaction with the consumer's rows; the swap is made atomic as a whole by a row of
//! `_meshql_rebuild_swaps` (`table → from, to`), all of it under the DDL lock
//! (`GET_LOCK('meshql-ddl')`) that `prepare` takes too:
//!
//! 1. one transaction: the rebuilt versions' feed positions negated (they were the rebuild
//!    table's own, and would otherwise come after the cursors of the live table's feed:
//!    negated, they sit before every cursor, so the rebuilt versions are not replayed into
//!    the feed; the next versions take positions from the live table's clock as before),
//!    and the swap's row written;
//! 2. the rename;
//! 3. one transaction: `to`'s position, state rows and dead letters deleted, `from`'s made
//!    `to`'s, the swap's row deleted (retried a few times should it fail);
//! 4. the old table dropped.
//!
//! After a crash, `prepare` (and the next rebuild) finds the swap's row: with the rebuild
//! table still there the rename never happened and the row is deleted (the live table and
//! consumer are as they were); without it, step 3 is done then. Until then, a processor
//! started on the rebuilt table resumes from its old position with its old rows; once step
//! 3 runs it goes on from the rebuild's position, and the inputs after it recompute every
//! key they touch from the rebuilt state.

use super::{current_of_row_at, MysqlStore, WriteTx};
use crate::db::my_error;
use crate::dialect::DIALECT;
use crate::sql::{self, quote_ident};
use async_trait::async_trait;
use meshql_core::{
    DeadLetter, Envelope, OutputBatch, OutputStore, OutputWrite, StateWrite, StoreError,
    WriteContext,
};
use meshql_store_sql::outputs::{bigint, OutputSql, OutputStep, OutputWrites};
use meshql_store_sql::rules::{Current, Version};
use mysql_async::prelude::Queryable;
use mysql_async::TxOpts;
use serde_json::json;
use std::collections::HashMap;
use std::sync::LazyLock;

/// The lock every schema change of a database takes (`prepare`, a swap); `Some(1)` when
/// taken within 30 seconds.
pub(super) const DDL_LOCK: &str = "SELECT GET_LOCK('meshql-ddl', 30)";
pub(super) const DDL_UNLOCK: &str = "DO RELEASE_LOCK('meshql-ddl')";

/// The tables, created if missing (run by `prepare`, under its DDL lock).
pub(super) const DDL: [&str; 4] = [
    "CREATE TABLE IF NOT EXISTS _meshql_outputs (
        consumer VARCHAR(255) NOT NULL PRIMARY KEY,
        `position` BIGINT NOT NULL
     ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    // the secondary index holds the primary key after its own columns: a group's rows come
    // out of it in key order
    "CREATE TABLE IF NOT EXISTS _meshql_output_state (
        consumer VARCHAR(255) NOT NULL,
        `key` VARCHAR(512) NOT NULL,
        grp VARCHAR(512) NULL,
        `value` LONGTEXT NOT NULL,
        PRIMARY KEY (consumer, `key`),
        KEY k_grp (consumer, grp)
     ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS _meshql_dead_letters (
        seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        consumer VARCHAR(255) NOT NULL,
        `position` BIGINT NOT NULL,
        change_id TEXT NOT NULL,
        entity TEXT NOT NULL,
        reason LONGTEXT NOT NULL,
        input LONGTEXT NOT NULL,
        `at` BIGINT NOT NULL,
        KEY k_consumer (consumer, seq)
     ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    // a swap whose consumer rows are still to move (module docs, "Rebuilds")
    "CREATE TABLE IF NOT EXISTS _meshql_rebuild_swaps (
        tbl VARCHAR(64) NOT NULL PRIMARY KEY,
        from_consumer VARCHAR(255) NOT NULL,
        to_consumer VARCHAR(255) NOT NULL
     ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
];

/// The longest consumer name and state key or group (characters).
const CONSUMER_MAX: usize = 255;
const KEY_MAX: usize = 512;

/// A JSON_TABLE text column: utf8mb4 and bytewise like the tables (a JSON_TABLE column
/// otherwise takes the database's default character set, latin1 on a default MariaDB, and
/// loses what latin1 cannot hold); LONGTEXT, because a shorter type would silently truncate
/// (a value too long for the table then fails the INSERT instead, in strict mode).
macro_rules! text_column {
    ($name:literal, $path:literal) => {
        concat!(
            $name,
            " LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '",
            $path,
            "'"
        )
    };
}

/// The statements of outputs every SQL store shares ([`OutputSql`]).
static OUTPUT_SQL: LazyLock<OutputSql> = LazyLock::new(|| OutputSql::new(&DIALECT));

/// The keys (a JSON array, each at most [`KEY_MAX`] long) drive the join, each one primary
/// key lookup (the optimiser, left alone, may scan all the consumer's rows instead).
const STATE: &str = concat!(
    "SELECT STRAIGHT_JOIN s.`key`, s.`value` FROM JSON_TABLE(?, '$[*]' COLUMNS (",
    "k VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) j ",
    "JOIN _meshql_output_state s FORCE INDEX (PRIMARY) ON s.consumer = ? AND s.`key` = j.k"
);
/// Rows `{"k", "g"?, "v"}` (a missing `g`: no group).
const UPSERT_STATE: &str = concat!(
    "INSERT INTO _meshql_output_state (consumer, `key`, grp, `value`) ",
    "SELECT ?, j.k, j.g, j.v FROM JSON_TABLE(?, '$[*]' COLUMNS (n FOR ORDINALITY, ",
    text_column!("k", "$.k"),
    ", ",
    text_column!("g", "$.g"),
    ", ",
    text_column!("v", "$.v"),
    ")) j ORDER BY j.n ",
    "ON DUPLICATE KEY UPDATE grp = VALUES(grp), `value` = VALUES(`value`)"
);
/// Keys (each at most [`KEY_MAX`] long), each one primary key lookup (as [`STATE`]).
const DELETE_STATE: &str = concat!(
    "DELETE s FROM JSON_TABLE(?, '$[*]' COLUMNS (",
    "k VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) j ",
    "STRAIGHT_JOIN _meshql_output_state s FORCE INDEX (PRIMARY) ",
    "ON s.consumer = ? AND s.`key` = j.k"
);
/// Rows `{"p", "c", "e", "r", "i", "a"}`, inserted in their order (so `seq` follows it).
const INSERT_LETTERS: &str = concat!(
    "INSERT INTO _meshql_dead_letters ",
    "(consumer, `position`, change_id, entity, reason, input, `at`) ",
    "SELECT ?, j.p, j.c, j.e, j.r, j.i, j.a FROM JSON_TABLE(?, '$[*]' COLUMNS (",
    "n FOR ORDINALITY, p BIGINT PATH '$.p', ",
    text_column!("c", "$.c"),
    ", ",
    text_column!("e", "$.e"),
    ", ",
    text_column!("r", "$.r"),
    ", ",
    text_column!("i", "$.i"),
    ", a BIGINT PATH '$.a')) j ORDER BY j.n"
);
/// The statements of this module, by name, for the golden test.
#[cfg(test)]
pub(super) fn golden_statements() -> Vec<(String, String)> {
    let mut out = meshql_store_sql::golden::output_statements(
        &OUTPUT_SQL,
        &[
            ("ddl_lock", DDL_LOCK),
            ("ddl_unlock", DDL_UNLOCK),
            ("state", STATE),
            ("upsert_state", UPSERT_STATE),
            ("delete_state", DELETE_STATE),
            ("insert_letters", INSERT_LETTERS),
        ],
    );
    let state = [
        ("a", Some("g"), Some("1")),
        ("b", None, Some("2")),
        ("a", None, None),
        ("c", None, None),
        ("d", Some("h"), Some("4")),
    ]
    .map(|(k, g, v)| StateWrite {
        key: k.into(),
        group: g.map(Into::into),
        value: v.map(Into::into),
    });
    out.push(("state_rows".into(), format!("{:?}", state_rows(&state))));
    let letter = DeadLetter {
        position: 3,
        change_id: "hen:1:5".into(),
        entity: "hen".into(),
        reason: "bad".into(),
        input: "{}".into(),
        at: 9,
    };
    out.push((
        "letters_json".into(),
        format!("{:?}", letters_json(&[letter])),
    ));
    out
}

fn too_long(text: &str, max: usize) -> bool {
    text.len() > max && text.chars().count() > max
}

fn check_consumer(consumer: &str) -> Result<(), StoreError> {
    if too_long(consumer, CONSUMER_MAX) {
        return Err(StoreError::Invalid(format!(
            "a consumer name is at most {CONSUMER_MAX} characters on MySQL: `{consumer}`"
        )));
    }
    Ok(())
}

/// The state writes as the JSON arrays of [`UPSERT_STATE`] and [`DELETE_STATE`]: the last
/// write of each key (what writing them one after the other leaves).
fn state_rows(state: &[StateWrite]) -> Result<(String, String), StoreError> {
    let mut last: HashMap<&str, usize> = HashMap::with_capacity(state.len());
    for (i, s) in state.iter().enumerate() {
        last.insert(&s.key, i);
    }
    let (mut upserts, mut deletes) = (Vec::new(), Vec::new());
    for (i, s) in state.iter().enumerate() {
        if last[s.key.as_str()] != i {
            continue;
        }
        match &s.value {
            Some(v) => {
                if too_long(&s.key, KEY_MAX)
                    || s.group.as_deref().is_some_and(|g| too_long(g, KEY_MAX))
                {
                    return Err(StoreError::Invalid(format!(
                        "a state key or group is at most {KEY_MAX} characters on MySQL: `{}`",
                        s.key
                    )));
                }
                let mut row = json!({"k": s.key, "v": v});
                if let Some(g) = &s.group {
                    row["g"] = json!(g);
                }
                upserts.push(row);
            }
            // a longer key cannot be stored, so there is nothing to delete
            None if too_long(&s.key, KEY_MAX) => {}
            None => deletes.push(json!(s.key)),
        }
    }
    let text = |rows: Vec<serde_json::Value>| match rows.is_empty() {
        true => String::new(),
        false => serde_json::Value::Array(rows).to_string(),
    };
    Ok((text(upserts), text(deletes)))
}

fn letters_json(letters: &[DeadLetter]) -> Result<String, StoreError> {
    let rows = letters
        .iter()
        .map(|d| {
            Ok(json!({
                "p": bigint(d.position, "a dead letter's position")?,
                "c": d.change_id,
                "e": d.entity,
                "r": d.reason,
                "i": d.input,
                "a": d.at,
            }))
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    Ok(serde_json::Value::Array(rows).to_string())
}

fn letter(r: mysql_async::Row) -> (String, DeadLetter) {
    (
        r.get(0).unwrap_or_default(),
        DeadLetter {
            position: r.get::<i64, _>(1).unwrap_or_default() as u64,
            change_id: r.get(2).unwrap_or_default(),
            entity: r.get(3).unwrap_or_default(),
            reason: r.get(4).unwrap_or_default(),
            input: r.get(5).unwrap_or_default(),
            at: r.get(6).unwrap_or_default(),
        },
    )
}

/// Whether `table` exists in the connection's database.
async fn table_exists<Q: Queryable>(q: &mut Q, table: &str) -> Result<bool, StoreError> {
    let n: Option<i64> = q
        .exec_first(
            "SELECT COUNT(*) FROM information_schema.tables \
             WHERE table_schema = DATABASE() AND table_name = ?",
            (table,),
        )
        .await
        .map_err(my_error)?;
    Ok(n.unwrap_or(0) > 0)
}

impl MysqlStore {
    /// Step 3 of a swap (module docs): in one transaction, if the swap's row of this table is
    /// there, its `from` consumer's rows become its `to`'s and the row is deleted. Whether
    /// there was a row.
    async fn move_swapped_consumer(&self, q: &mut mysql_async::Conn) -> Result<bool, StoreError> {
        let mut tx = q
            .start_transaction(TxOpts::default())
            .await
            .map_err(my_error)?;
        let result: Result<bool, mysql_async::Error> = async {
            let swap: Option<(String, String)> = tx
                .exec_first(
                    "SELECT from_consumer, to_consumer FROM _meshql_rebuild_swaps \
                     WHERE tbl = ? FOR UPDATE",
                    (self.core.table(),),
                )
                .await?;
            let Some((from, to)) = swap else {
                return Ok(false);
            };
            // positional: the update binds to, then from
            for (delete, update) in OUTPUT_SQL
                .delete_consumer
                .iter()
                .zip(&OUTPUT_SQL.move_consumer)
            {
                tx.exec_drop(delete, (&to,)).await?;
                tx.exec_drop(update, (&to, &from)).await?;
            }
            tx.exec_drop(
                "DELETE FROM _meshql_rebuild_swaps WHERE tbl = ?",
                (self.core.table(),),
            )
            .await?;
            Ok(true)
        }
        .await;
        match result {
            Ok(true) => {
                tx.commit().await.map_err(my_error)?;
                Ok(true)
            }
            Ok(false) => {
                let _ = tx.rollback().await;
                Ok(false)
            }
            Err(e) => {
                let _ = tx.rollback().await;
                Err(my_error(e))
            }
        }
    }

    /// A swap of this table a crash interrupted, finished or abandoned (module docs); run
    /// holding the DDL lock.
    pub(super) async fn finish_swap(&self, q: &mut mysql_async::Conn) -> Result<(), StoreError> {
        let pending: Option<i64> = q
            .exec_first(
                "SELECT 1 FROM _meshql_rebuild_swaps WHERE tbl = ?",
                (self.core.table(),),
            )
            .await
            .map_err(my_error)?;
        if pending.is_none() {
            return Ok(());
        }
        if table_exists(q, &sql::rebuild_table(self.core.table())).await? {
            // the rename never happened: the live table and its consumer are as they were
            q.exec_drop(
                "DELETE FROM _meshql_rebuild_swaps WHERE tbl = ?",
                (self.core.table(),),
            )
            .await
            .map_err(my_error)?;
        } else {
            self.move_swapped_consumer(q).await?;
        }
        let old = quote_ident(&sql::swapped_out_table(self.core.table()));
        q.query_drop(format!("DROP TABLE IF EXISTS {old}"))
            .await
            .map_err(my_error)
    }

    /// [`OutputStore::swap_rebuilt`], holding the DDL lock.
    async fn swap_locked(
        &self,
        q: &mut mysql_async::Conn,
        from: &str,
        to: &str,
    ) -> Result<(), StoreError> {
        self.finish_swap(q).await?;
        let shadow = sql::rebuild_table(self.core.table());
        if !table_exists(q, &shadow).await? {
            return Err(StoreError::Invalid(format!(
                "no rebuild of `{}` to swap in",
                self.core.table()
            )));
        }
        let (live_q, shadow_q, old_q) = (
            quote_ident(self.core.table()),
            quote_ident(&shadow),
            quote_ident(&sql::swapped_out_table(self.core.table())),
        );
        // 1: the rebuilt versions before every cursor of the feed, and the swap's row
        let mut tx = q
            .start_transaction(TxOpts::default())
            .await
            .map_err(my_error)?;
        let prepared: Result<(), mysql_async::Error> = async {
            tx.query_drop(format!("UPDATE {shadow_q} SET pos = -pos WHERE pos > 0"))
                .await?;
            tx.exec_drop(
                "INSERT INTO _meshql_rebuild_swaps (tbl, from_consumer, to_consumer) \
                 VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE \
                 from_consumer = VALUES(from_consumer), to_consumer = VALUES(to_consumer)",
                (self.core.table(), from, to),
            )
            .await
        }
        .await;
        match prepared {
            Ok(()) => tx.commit().await.map_err(my_error)?,
            Err(e) => {
                let _ = tx.rollback().await;
                return Err(my_error(e));
            }
        }
        // 2: the rename, atomic
        if let Err(e) = q
            .query_drop(format!(
                "RENAME TABLE {live_q} TO {old_q}, {shadow_q} TO {live_q}"
            ))
            .await
        {
            let _ = q
                .exec_drop(
                    "DELETE FROM _meshql_rebuild_swaps WHERE tbl = ?",
                    (self.core.table(),),
                )
                .await;
            return Err(my_error(e));
        }
        // 3: the consumer's rows; the swap is done once the rename is, so this is retried
        let mut wait = std::time::Duration::from_millis(100);
        let mut attempt = 1;
        loop {
            match self.move_swapped_consumer(q).await {
                Ok(_) => break,
                Err(e) if attempt < 5 => {
                    tracing::warn!(table = %self.core.table(), error = %e, attempt,
                        "moving the rebuilt consumer's rows failed; retrying");
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                    attempt += 1;
                }
                Err(e) => {
                    return Err(StoreError::Unavailable(format!(
                        "the rebuilt table of `{}` is in place, but its consumer's rows could \
                         not be moved ({e}); the next start finishes it",
                        self.core.table()
                    )))
                }
            }
        }
        // 4: what is left of the old table and the rebuild table's clock
        q.query_drop(format!("DROP TABLE IF EXISTS {old_q}"))
            .await
            .map_err(my_error)?;
        q.exec_drop(
            "DELETE FROM meshql_feed_clock WHERE name = ?",
            (shadow.as_str(),),
        )
        .await
        .map_err(my_error)
    }
    /// The newest versions of `ids`, read and locked (in id order), by id.
    async fn current_many(
        &self,
        w: &mut WriteTx<'_>,
        ids: &[&str],
    ) -> Result<HashMap<String, Current>, StoreError> {
        let mut sorted = ids.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.is_empty() {
            return Ok(HashMap::new());
        }
        let keys = serde_json::to_string(&sorted).expect("strings serialise");
        let rows: Vec<mysql_async::Row> =
            w.tx.exec(&self.sql.current_many, (keys,))
                .await
                .map_err(my_error)?;
        rows.iter()
            .map(|r| Ok((r.get(0).unwrap_or_default(), current_of_row_at(r, 1)?)))
            .collect()
    }

    /// The document writes of a batch, in its transaction; the versions written, in order.
    async fn write_outputs(
        &self,
        w: &mut WriteTx<'_>,
        writes: Vec<OutputWrite>,
        ctx: &WriteContext,
    ) -> Result<Vec<Envelope>, StoreError> {
        let ids: Vec<&str> = writes.iter().map(OutputWrite::id).collect();
        let mut plan = OutputWrites::new(self.current_many(w, &ids).await?, writes.len());
        let mut written = Vec::with_capacity(writes.len());
        let correlation_id = ctx.correlation_id.as_deref();
        for write in writes {
            let cur = match plan.current(write.id()) {
                Ok(cur) => cur,
                Err(()) => self.current(&mut w.tx, write.id()).await?,
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
                    written.push(self.append_after(w, version, current).await?);
                }
                OutputStep::Tombstone { id, current } => {
                    written.push(self.tombstone(w, &id, current, correlation_id).await?);
                }
                OutputStep::Nothing => {}
            }
        }
        Ok(written)
    }
}

#[async_trait]
impl OutputStore for MysqlStore {
    fn supports_outputs(&self) -> bool {
        true
    }

    async fn output_position(&self, consumer: &str) -> Result<Option<u64>, StoreError> {
        let mut conn = self.db.conn().await?;
        let position: Option<i64> = conn
            .exec_first(&OUTPUT_SQL.position, (consumer,))
            .await
            .map_err(my_error)?;
        Ok(position.map(|p| p as u64))
    }

    async fn output_state(
        &self,
        consumer: &str,
        keys: &[String],
    ) -> Result<HashMap<String, String>, StoreError> {
        let mut wanted: Vec<&str> = keys
            .iter()
            .map(String::as_str)
            .filter(|k| !too_long(k, KEY_MAX))
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        if wanted.is_empty() {
            return Ok(HashMap::new());
        }
        let keys = serde_json::to_string(&wanted).expect("strings serialise");
        let mut conn = self.db.conn().await?;
        let rows: Vec<(String, String)> =
            conn.exec(STATE, (keys, consumer)).await.map_err(my_error)?;
        Ok(rows.into_iter().collect())
    }

    async fn output_group(
        &self,
        consumer: &str,
        group: &str,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let mut conn = self.db.conn().await?;
        conn.exec(&OUTPUT_SQL.group, (consumer, group))
            .await
            .map_err(my_error)
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
        check_consumer(&consumer)?;
        let position = bigint(position, "the position")?;
        let (upserts, deletes) = state_rows(&state)?;
        let letters = match dead_letters.is_empty() {
            true => String::new(),
            false => letters_json(&dead_letters)?,
        };
        let ctx = ctx.clone();
        let written = self
            .write_tx(move |s, w| {
                Box::pin(async move {
                    let written = s.write_outputs(w, writes, &ctx).await?;
                    let tx = &mut w.tx;
                    if !upserts.is_empty() {
                        tx.exec_drop(UPSERT_STATE, (&consumer, upserts))
                            .await
                            .map_err(my_error)?;
                    }
                    if !deletes.is_empty() {
                        tx.exec_drop(DELETE_STATE, (deletes, &consumer))
                            .await
                            .map_err(my_error)?;
                    }
                    if !letters.is_empty() {
                        tx.exec_drop(INSERT_LETTERS, (&consumer, letters))
                            .await
                            .map_err(my_error)?;
                    }
                    tx.exec_drop(&OUTPUT_SQL.upsert_position, (&consumer, position))
                        .await
                        .map_err(my_error)?;
                    Ok(written)
                })
            })
            .await?;
        self.core.count_writes(written.len() as u64);
        Ok(written)
    }

    async fn dead_letters(
        &self,
        consumer: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, DeadLetter)>, StoreError> {
        let limit = u64::try_from(limit).unwrap_or(u64::MAX);
        let mut conn = self.db.conn().await?;
        let rows: Vec<mysql_async::Row> = match consumer {
            Some(c) => conn.exec(&OUTPUT_SQL.letters_of, (c, limit)).await,
            None => conn.exec(&OUTPUT_SQL.letters, (limit,)).await,
        }
        .map_err(my_error)?;
        Ok(rows.into_iter().map(letter).collect())
    }

    async fn dead_letter_count(&self, consumer: &str) -> Result<u64, StoreError> {
        let mut conn = self.db.conn().await?;
        let n: Option<i64> = conn
            .exec_first(&OUTPUT_SQL.count_letters, (consumer,))
            .await
            .map_err(my_error)?;
        Ok(n.unwrap_or(0) as u64)
    }

    async fn rebuild_store(&self) -> Result<meshql_core::DynStore, StoreError> {
        let shadow = sql::rebuild_table(self.core.table());
        let mut conn = self.db.conn().await?;
        let locked: Option<Option<i64>> = conn.exec_first(DDL_LOCK, ()).await.map_err(my_error)?;
        if locked != Some(Some(1)) {
            return Err(StoreError::Unavailable(
                "another service is changing the schema (the `meshql-ddl` lock)".into(),
            ));
        }
        let cleared = async {
            self.finish_swap(&mut conn).await?;
            conn.query_drop(format!("DROP TABLE IF EXISTS {}", quote_ident(&shadow)))
                .await
                .map_err(my_error)?;
            conn.exec_drop(
                "DELETE FROM meshql_feed_clock WHERE name = ?",
                (shadow.as_str(),),
            )
            .await
            .map_err(my_error)
        }
        .await;
        let _ = conn.query_drop(DDL_UNLOCK).await;
        cleared?;
        drop(conn);
        let store = MysqlStore::new(self.db.clone(), &shadow);
        let templates = self.core.templates();
        meshql_core::Store::prepare(&store, &templates).await?;
        Ok(std::sync::Arc::new(store))
    }

    async fn swap_rebuilt(&self, from: &str, to: &str) -> Result<(), StoreError> {
        check_consumer(from)?;
        check_consumer(to)?;
        let mut conn = self.db.conn().await?;
        let locked: Option<Option<i64>> = conn.exec_first(DDL_LOCK, ()).await.map_err(my_error)?;
        if locked != Some(Some(1)) {
            return Err(StoreError::Unavailable(
                "another service is changing the schema (the `meshql-ddl` lock)".into(),
            ));
        }
        let result = self.swap_locked(&mut conn, from, to).await;
        let _ = conn.query_drop(DDL_UNLOCK).await;
        if result.is_ok() {
            self.core.committed();
        }
        result
    }

    async fn reset_output(&self, consumer: &str) -> Result<(), StoreError> {
        let mut conn = self.db.conn().await?;
        let mut tx = conn
            .start_transaction(TxOpts::default())
            .await
            .map_err(my_error)?;
        for sql in &OUTPUT_SQL.delete_consumer {
            if let Err(e) = tx.exec_drop(sql, (consumer,)).await {
                let _ = tx.rollback().await;
                return Err(my_error(e));
            }
        }
        tx.commit().await.map_err(my_error)
    }
}
