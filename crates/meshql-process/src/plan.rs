//! What every kind of processor does with a batch: its inputs in, the writes, state rows and
//! dead letters of one output transaction out ([`Planner`]). The runtime
//! (`crate::runtime`) feeds batches from the log, checks the writes against the output
//! entity, and commits them with the batch's position.

use async_trait::async_trait;
use meshql_core::{ChangeOp, OutputWrite, StateWrite, StoreError};
use serde_json::{Map, Value};
use std::collections::HashMap;

/// One input change, as a processor reads it.
#[derive(Debug, Clone)]
pub struct Input {
    pub position: u64,
    /// `entity:id:created_at`: the same on every delivery.
    pub change_id: String,
    pub entity: String,
    pub id: String,
    pub op: ChangeOp,
    /// The version's time.
    pub created_at: i64,
    pub correlation_id: Option<String>,
    /// The document (for a delete, the last version before it).
    pub payload: Map<String, Value>,
    /// Orders inputs for `last` (the runtime uses the log position).
    pub order: (i64, u64),
    /// Certainly the first version of its document this processor sees (a create read from
    /// the service's own log, past the committed position): nothing of it is stored yet, so
    /// a projection need not look its contribution up.
    pub fresh: bool,
}

/// What a processor reads besides its inputs.
#[async_trait]
pub trait PlanIo: Send + Sync {
    /// Committed state rows among `keys`.
    async fn state(&self, keys: &[String]) -> Result<HashMap<String, String>, StoreError>;
    /// Committed state rows of a group.
    async fn group(&self, group: &str) -> Result<Vec<(String, String)>, StoreError>;
    /// The current document `id` of the processor's output (`None`: none, or a reader
    /// that cannot tell).
    async fn current(&self, id: &str) -> Result<Option<Map<String, Value>>, StoreError> {
        let _ = id;
        Ok(None)
    }
    /// The current document `id` of `entity`.
    async fn lookup(
        &self,
        entity: &str,
        id: &str,
    ) -> Result<Option<Map<String, Value>>, StoreError>;
}

/// What a batch comes to.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Document writes, with the indexes of the inputs that led to each.
    pub writes: Vec<(OutputWrite, Vec<usize>)>,
    pub state: Vec<StateWrite>,
    /// Inputs that could not be processed: `(index, reason)`.
    pub dead: Vec<(usize, String)>,
}

/// A kind of processor's logic for one batch.
#[async_trait]
pub trait Planner: Send + Sync {
    /// The processor's type, as the config names it.
    fn kind(&self) -> &'static str;
    /// The writes for `inputs` (every one after the committed position, in log order).
    async fn plan(&self, io: &dyn PlanIo, inputs: &[Input]) -> Result<Outcome, StoreError>;
}

/// An input as the runtime carries it: what the planner reads, and what a dead letter keeps.
pub struct Item<'a> {
    pub input: Input,
    /// The input as read (JSON text), for its dead letter (borrowed from the log's change:
    /// copied only for an input that becomes one); empty for an input read without text of
    /// its own (a database row), whose dead letter keeps its payload.
    pub raw: std::borrow::Cow<'a, str>,
}
