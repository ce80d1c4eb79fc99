//! Processor outputs (`meshql_core::OutputStore`): what the SQL stores share of them.

use crate::dialect::Dialect;
use crate::rules::Current;
use meshql_core::{OutputWrite, StoreError, WriteContext};
use std::collections::{HashMap, HashSet};

/// The stored text of an output payload with `"id"` set to `id`.
pub fn with_id(id: &str, payload: &str) -> Result<String, StoreError> {
    meshql_core::payload_with_id(id, payload)
}

/// A log position as a BIGINT (`what` names it in the error).
pub fn bigint(position: u64, what: &str) -> Result<i64, StoreError> {
    i64::try_from(position)
        .map_err(|_| StoreError::Invalid(format!("{what} {position} exceeds a BIGINT")))
}

/// The tables every consumer's rows are in: what a reset deletes, and what a rebuild's swap
/// moves from one consumer to another.
pub const CONSUMER_TABLES: [&str; 3] = [
    "_meshql_outputs",
    "_meshql_output_state",
    "_meshql_dead_letters",
];

/// Statements of processor outputs (the tables `_meshql_outputs`, `_meshql_output_state`
/// and `_meshql_dead_letters`, which each store creates with its own DDL). Parameters are
/// numbered where the dialect numbers them, else bound in order of appearance.
#[derive(Debug, Clone)]
pub struct OutputSql {
    /// A consumer's position (consumer).
    pub position: String,
    /// A consumer's state rows of a group, by key (consumer, group).
    pub group: String,
    /// One state row written (consumer, key, group, value).
    pub upsert_state: String,
    /// One state row deleted (consumer, key).
    pub delete_state: String,
    /// One dead letter (consumer, position, change id, entity, reason, input, at).
    pub insert_letter: String,
    /// A consumer's position written (consumer, position).
    pub upsert_position: String,
    /// A consumer's dead letters, newest first (consumer, how many).
    pub letters_of: String,
    /// Every consumer's dead letters, newest first (how many).
    pub letters: String,
    /// How many dead letters a consumer has (consumer).
    pub count_letters: String,
    /// A consumer's rows deleted, per table of [`CONSUMER_TABLES`] (consumer).
    pub delete_consumer: [String; 3],
    /// A consumer's rows made another's, per table of [`CONSUMER_TABLES`]: numbered (from
    /// `1`, to `2`), or positional (to, from).
    pub move_consumer: [String; 3],
}

impl OutputSql {
    pub fn new(d: &dyn Dialect) -> Self {
        let p = |n: usize| d.numbered(n).unwrap_or_else(|| "?".to_owned());
        let c = |name: &str| d.column(name);
        let (key, value, position) = (c("key"), c("value"), c("position"));
        let letter_columns = format!(
            "consumer, {position}, change_id, entity, reason, input, {}",
            c("at")
        );
        Self {
            position: format!(
                "SELECT {position} FROM _meshql_outputs WHERE consumer = {}",
                p(1)
            ),
            group: format!(
                "SELECT {key}, {value} FROM _meshql_output_state{} \
                 WHERE consumer = {} AND grp = {} ORDER BY {key}",
                d.group_hint(),
                p(1),
                p(2)
            ),
            upsert_state: format!(
                "INSERT INTO _meshql_output_state (consumer, {key}, grp, {value}) \
                 VALUES ({}, {}, {}, {}) {}",
                p(1),
                p(2),
                p(3),
                p(4),
                d.upsert(&["consumer", "key"], &["grp", "value"])
            ),
            delete_state: format!(
                "DELETE FROM _meshql_output_state WHERE consumer = {} AND {key} = {}",
                p(1),
                p(2)
            ),
            insert_letter: format!(
                "INSERT INTO _meshql_dead_letters ({letter_columns}) \
                 VALUES ({}, {}, {}, {}, {}, {}, {})",
                p(1),
                p(2),
                p(3),
                p(4),
                p(5),
                p(6),
                p(7)
            ),
            upsert_position: format!(
                "INSERT INTO _meshql_outputs (consumer, {position}) VALUES ({}, {}) {}",
                p(1),
                p(2),
                d.upsert(&["consumer"], &["position"])
            ),
            letters_of: format!(
                "SELECT {letter_columns} FROM _meshql_dead_letters WHERE consumer = {} \
                 ORDER BY seq DESC LIMIT {}",
                p(1),
                p(2)
            ),
            letters: format!(
                "SELECT {letter_columns} FROM _meshql_dead_letters ORDER BY seq DESC LIMIT {}",
                p(1)
            ),
            count_letters: format!(
                "SELECT COUNT(*) FROM _meshql_dead_letters WHERE consumer = {}",
                p(1)
            ),
            delete_consumer: CONSUMER_TABLES
                .map(|t| format!("DELETE FROM {t} WHERE consumer = {}", p(1))),
            move_consumer: CONSUMER_TABLES.map(|t| {
                format!(
                    "UPDATE {t} SET consumer = {} WHERE consumer = {}",
                    p(2),
                    p(1)
                )
            }),
        }
    }
}

/// The tokens of a `Put`'s version: the writer's when it sets them, else the current
/// version's unless that is a tombstone, else none.
pub fn put_tokens<'a>(ctx: &'a WriteContext, current: Option<&'a Current>) -> &'a [String] {
    match (&ctx.tokens, current) {
        (Some(t), _) => t,
        (None, Some(cur)) if !cur.deleted => &cur.tokens,
        (None, _) => &[],
    }
}

/// The document writes of an output batch, in their order, with the current version each
/// applies to: read for all the batch's ids at once, but read again where an id comes
/// twice (its second write applies to the version its first appended).
pub struct OutputWrites {
    current: HashMap<String, Current>,
    written: HashSet<String>,
}

/// What to do for one [`OutputWrite`], given the current version of its id.
pub enum OutputStep {
    /// Append this version (the payload with its `"id"`, the tokens of [`put_tokens`])
    /// after `current`.
    Put {
        id: String,
        payload: String,
        tokens: Vec<String>,
        current: Option<Current>,
    },
    /// Append the tombstone of `id` after `current`, its newest version (not deleted):
    /// the remove path's, as a writer that sees everything.
    Tombstone { id: String, current: Current },
    /// Nothing (a `Delete` of an id without a current version).
    Nothing,
}

impl OutputWrites {
    /// `current`: the newest versions of the batch's ids, by id.
    pub fn new(current: HashMap<String, Current>, writes: usize) -> Self {
        Self {
            current,
            written: HashSet::with_capacity(writes),
        }
    }

    /// The current version of `id` for its next write: `Ok` with the one read for the
    /// batch, `Err(())` when the store must read it again (the batch wrote `id` already).
    #[allow(clippy::result_unit_err)]
    pub fn current(&mut self, id: &str) -> Result<Option<Current>, ()> {
        if self.written.contains(id) {
            return Err(());
        }
        self.written.insert(id.to_owned());
        Ok(self.current.remove(id))
    }

    /// What `write` does after `current`, its id's current version.
    pub fn step(
        write: OutputWrite,
        current: Option<Current>,
        ctx: &WriteContext,
    ) -> Result<OutputStep, StoreError> {
        Ok(match write {
            OutputWrite::Put { id, payload } => OutputStep::Put {
                payload: with_id(&id, &payload)?,
                tokens: put_tokens(ctx, current.as_ref()).to_vec(),
                id,
                current,
            },
            OutputWrite::Delete { id } => match current.filter(|c| !c.deleted) {
                Some(current) => OutputStep::Tombstone { id, current },
                None => OutputStep::Nothing,
            },
        })
    }
}
