//! Outputs of a consumer of the change feed (a processor, a projection), committed exactly
//! once.
//!
//! A processor reads changes from a log at positions, and writes documents. If it crashed
//! between writing and remembering how far it got, a restart would apply some changes twice;
//! if it remembered first, a crash would lose them. A store that supports outputs
//! ([`OutputStore::supports_outputs`]) removes the window: an [`OutputBatch`] carries the
//! documents written for a run of input changes, the processor's own state rows, the changes
//! it gave up on (dead letters) and the position of the last input, and the store commits all
//! of it in **one transaction**. After a restart the processor asks the store for its
//! position ([`OutputStore::output_position`]) and skips every input at or before it.
//!
//! Each consumer (`name`) has, beside the entity tables of its output's database:
//!
//! * a position: the last input position whose effects are committed;
//! * state rows: `key → value` (JSON text), each optionally in a `group`, so that all rows of
//!   one group can be read back with one indexed lookup ([`OutputStore::output_group`]);
//! * dead letters: inputs that could not be processed, with the reason.
//!
//! Backends without transactions across tables (or not yet wired) answer
//! [`OutputStore::supports_outputs`] with `false`; a processor writing to them is refused at
//! start-up with a message naming the entity.

use crate::{Envelope, Millis, StoreError, WriteContext};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// One document write of an output batch.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputWrite {
    /// A new version of `id` — its first when the id has none, or after a tombstone.
    /// `payload` is a JSON object text; the store sets its `"id"`.
    Put { id: String, payload: String },
    /// A tombstone for `id` (nothing when it has no current version).
    Delete { id: String },
}

impl OutputWrite {
    pub fn id(&self) -> &str {
        match self {
            OutputWrite::Put { id, .. } | OutputWrite::Delete { id } => id,
        }
    }
}

/// One state row written with an output batch: `value: None` deletes the row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateWrite {
    pub key: String,
    /// Rows of one group are read back together ([`OutputStore::output_group`]).
    pub group: Option<String>,
    pub value: Option<String>,
}

/// An input a consumer could not process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The input's position in the log it was read from.
    pub position: u64,
    /// The input change's stable id (`entity:id:created_at`).
    pub change_id: String,
    pub entity: String,
    /// Why it was not processed.
    pub reason: String,
    /// The input change, as read (JSON text).
    pub input: String,
    /// When it was given up on.
    pub at: Millis,
}

/// What one consumer commits for a run of inputs, as one transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputBatch {
    /// The consumer (`<processor>` or `<processor>/<output>`).
    pub consumer: String,
    /// The position of the last input the batch accounts for.
    pub position: u64,
    /// Document writes, in order; each id at most once.
    pub writes: Vec<OutputWrite>,
    pub state: Vec<StateWrite>,
    pub dead_letters: Vec<DeadLetter>,
}

impl OutputBatch {
    pub fn new(consumer: impl Into<String>, position: u64) -> Self {
        Self {
            consumer: consumer.into(),
            position,
            writes: Vec::new(),
            state: Vec::new(),
            dead_letters: Vec::new(),
        }
    }
}

/// A store that commits a consumer's outputs with its position (see the module docs). Every
/// method but [`OutputStore::supports_outputs`] fails with [`StoreError::Invalid`] on a store
/// that does not.
#[async_trait]
pub trait OutputStore: Send + Sync {
    /// Whether [`OutputStore::apply_output`] is atomic on this store.
    fn supports_outputs(&self) -> bool {
        false
    }

    /// The position committed by `consumer`'s last batch (`None`: never).
    async fn output_position(&self, consumer: &str) -> Result<Option<u64>, StoreError> {
        let _ = consumer;
        Err(unsupported())
    }

    /// The state rows of `consumer` among `keys` (missing keys are left out).
    async fn output_state(
        &self,
        consumer: &str,
        keys: &[String],
    ) -> Result<HashMap<String, String>, StoreError> {
        let _ = (consumer, keys);
        Err(unsupported())
    }

    /// Every state row of `consumer` in `group`, as `(key, value)`, in key order.
    async fn output_group(
        &self,
        consumer: &str,
        group: &str,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let _ = (consumer, group);
        Err(unsupported())
    }

    /// Commits `batch` in one transaction: the document writes of this store's table (a
    /// `Put` of an id with a current version appends a new version keeping its tokens unless
    /// `ctx.tokens` sets them), the state rows, the dead letters and the position. Returns
    /// the versions written, in order.
    async fn apply_output(
        &self,
        batch: OutputBatch,
        ctx: &WriteContext,
    ) -> Result<Vec<Envelope>, StoreError> {
        let _ = (batch, ctx);
        Err(unsupported())
    }

    /// Up to `limit` dead letters of `consumer` (every consumer when `None`), newest first.
    async fn dead_letters(
        &self,
        consumer: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, DeadLetter)>, StoreError> {
        let _ = (consumer, limit);
        Err(unsupported())
    }

    /// How many dead letters `consumer` has.
    async fn dead_letter_count(&self, consumer: &str) -> Result<u64, StoreError> {
        let _ = consumer;
        Err(unsupported())
    }

    /// Forgets `consumer`'s position, state and dead letters (a rebuild starts over).
    async fn reset_output(&self, consumer: &str) -> Result<(), StoreError> {
        let _ = consumer;
        Err(unsupported())
    }

    /// A store on a new, empty table beside this one, for a rebuild: what a rebuild writes,
    /// while reads still see this table. Any earlier rebuild table is dropped.
    async fn rebuild_store(&self) -> Result<crate::DynStore, StoreError> {
        Err(unsupported())
    }

    /// In one transaction: the rebuild table (from [`OutputStore::rebuild_store`]) takes
    /// this table's place (the old rows are dropped), and consumer `from`'s position, state
    /// and dead letters become `to`'s (replacing `to`'s). Readers see the old table or the
    /// new one, never a mix. The new table's versions are not replayed into the change feed.
    async fn swap_rebuilt(&self, from: &str, to: &str) -> Result<(), StoreError> {
        let _ = (from, to);
        Err(unsupported())
    }
}

fn unsupported() -> StoreError {
    StoreError::Invalid("this storage backend cannot commit a processor's outputs yet".into())
}
