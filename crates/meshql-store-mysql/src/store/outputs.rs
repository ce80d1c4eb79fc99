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

use super::{Current, MysqlStore, Version, WriteTx};
use crate::db::my_error;
use async_trait::async_trait;
use meshql_core::{
    DeadLetter, Envelope, OutputBatch, OutputStore, OutputWrite, StateWrite, StoreError,
    WriteContext,
};
use mysql_async::prelude::Queryable;
use mysql_async::TxOpts;
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

/// The tables, created if missing (run by `prepare`, under its DDL lock).
pub(super) const DDL: [&str; 3] = [
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

const POSITION: &str = "SELECT `position` FROM _meshql_outputs WHERE consumer = ?";
/// The keys (a JSON array, each at most [`KEY_MAX`] long) drive the join, each one primary
/// key lookup (the optimiser, left alone, may scan all the consumer's rows instead).
const STATE: &str = concat!(
    "SELECT STRAIGHT_JOIN s.`key`, s.`value` FROM JSON_TABLE(?, '$[*]' COLUMNS (",
    "k VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) j ",
    "JOIN _meshql_output_state s FORCE INDEX (PRIMARY) ON s.consumer = ? AND s.`key` = j.k"
);
/// By `(consumer, grp)`, whose entries end with the primary key: in key order, no sort.
const GROUP: &str = "SELECT `key`, `value` FROM _meshql_output_state FORCE INDEX (k_grp) \
                     WHERE consumer = ? AND grp = ? ORDER BY `key`";
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
const UPSERT_POSITION: &str = "INSERT INTO _meshql_outputs (consumer, `position`) VALUES (?, ?) \
                               ON DUPLICATE KEY UPDATE `position` = VALUES(`position`)";
const LETTER_COLUMNS: &str = "consumer, `position`, change_id, entity, reason, input, `at`";
const COUNT_LETTERS: &str = "SELECT COUNT(*) FROM _meshql_dead_letters WHERE consumer = ?";
const RESET: [&str; 3] = [
    "DELETE FROM _meshql_outputs WHERE consumer = ?",
    "DELETE FROM _meshql_output_state WHERE consumer = ?",
    "DELETE FROM _meshql_dead_letters WHERE consumer = ?",
];

/// A log position as a BIGINT.
fn bigint(position: u64, what: &str) -> Result<i64, StoreError> {
    i64::try_from(position)
        .map_err(|_| StoreError::Invalid(format!("{what} {position} exceeds a BIGINT")))
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

/// The stored text of an output payload with `"id"` set to `id`.
fn with_id(id: &str, payload: &str) -> Result<String, StoreError> {
    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_str(payload)
        .map_err(|e| StoreError::Invalid(format!("output payload of `{id}`: {e}")))?;
    Ok(meshql_core::NewDocument::with_id(id, map).into_payload_text(id))
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

impl MysqlStore {
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
            .map(|r| Ok((r.get(0).unwrap_or_default(), Current::of_row_at(r, 1)?)))
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
        let mut current = self.current_many(w, &ids).await?;
        // a batch writes each id once; should one come twice, its second write reads the
        // version its first appended
        let mut written_ids: HashSet<String> = HashSet::with_capacity(writes.len());
        let mut written = Vec::with_capacity(writes.len());
        for write in writes {
            let cur = match written_ids.contains(write.id()) {
                true => self.current(&mut w.tx, write.id()).await?,
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
                        fresh_id: false,
                        correlation_id: ctx.correlation_id.as_deref(),
                    };
                    written.push(self.append_after(w, version, cur).await?);
                }
                // the remove path's tombstone, as a writer that sees everything; nothing for
                // an id without a current version
                OutputWrite::Delete { id } => {
                    if let Some(cur) = cur.filter(|c| !c.deleted) {
                        let correlation_id = ctx.correlation_id.as_deref();
                        written.push(self.tombstone(w, &id, cur, correlation_id).await?);
                    }
                }
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
            .exec_first(POSITION, (consumer,))
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
        conn.exec(GROUP, (consumer, group)).await.map_err(my_error)
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
                    tx.exec_drop(UPSERT_POSITION, (&consumer, position))
                        .await
                        .map_err(my_error)?;
                    Ok(written)
                })
            })
            .await?;
        self.writes
            .fetch_add(written.len() as u64, Ordering::Relaxed);
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
            Some(c) => {
                conn.exec(
                    format!(
                        "SELECT {LETTER_COLUMNS} FROM _meshql_dead_letters WHERE consumer = ? \
                         ORDER BY seq DESC LIMIT ?"
                    ),
                    (c, limit),
                )
                .await
            }
            None => {
                conn.exec(
                    format!(
                        "SELECT {LETTER_COLUMNS} FROM _meshql_dead_letters \
                         ORDER BY seq DESC LIMIT ?"
                    ),
                    (limit,),
                )
                .await
            }
        }
        .map_err(my_error)?;
        Ok(rows.into_iter().map(letter).collect())
    }

    async fn dead_letter_count(&self, consumer: &str) -> Result<u64, StoreError> {
        let mut conn = self.db.conn().await?;
        let n: Option<i64> = conn
            .exec_first(COUNT_LETTERS, (consumer,))
            .await
            .map_err(my_error)?;
        Ok(n.unwrap_or(0) as u64)
    }

    async fn reset_output(&self, consumer: &str) -> Result<(), StoreError> {
        let mut conn = self.db.conn().await?;
        let mut tx = conn
            .start_transaction(TxOpts::default())
            .await
            .map_err(my_error)?;
        for sql in RESET {
            if let Err(e) = tx.exec_drop(sql, (consumer,)).await {
                let _ = tx.rollback().await;
                return Err(my_error(e));
            }
        }
        tx.commit().await.map_err(my_error)
    }
}
