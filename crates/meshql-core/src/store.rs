//! The storage trait every backend implements (MeshQL's Repository and Searcher in one).
//!
//! Semantics (CONTRACT §4), identical on every backend and checked by `meshql-conformance`:
//! * every write appends a version `(id, created_at)`; an update is a new version;
//! * a read "at T" sees, per id, the latest version with `created_at <= T`; with no `at`,
//!   the latest version;
//! * a delete appends a tombstone: the document is invisible from the delete on and still
//!   visible at earlier times;
//! * searches take the latest visible version of each document first, then apply the
//!   template filter ("latest, then filter");
//! * a token filter hides documents whose authorized tokens are non-empty and do not overlap.

use crate::{Envelope, Millis, NewDocument, QueryTemplate, Row, StoreError};
use async_trait::async_trait;
use std::sync::Arc;

/// Which authorized tokens a reader holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenFilter {
    /// No filtering.
    All,
    /// Documents with no tokens, or with at least one of these.
    AnyOf(Vec<String>),
}

/// What a remove did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoveOutcome {
    /// A tombstone was appended.
    Removed,
    /// The document exists but was already deleted (removal is idempotent).
    AlreadyDeleted,
    /// No version of the id was ever stored (or none is visible to the caller).
    NotFound,
}

/// Rows found for each key of a batched search: `(key, row)` pairs, rows of one key in the
/// backend's natural order.
pub type KeyedRows = Vec<(String, Row)>;

/// The rows of one batched lookup, grouped per key.
pub type BatchRows = std::collections::HashMap<String, Vec<Row>>;

/// A document read for a list: an alias used by frontends.
pub type Document = Envelope;

/// Counters a backend keeps (for `/metrics` and for tests that count queries).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Read statements executed (one per find, find_batch, read, list...).
    pub reads: u64,
    /// Write transactions committed.
    pub commits: u64,
    /// Documents written.
    pub writes: u64,
}

/// Storage for one entity.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Creates tables and the indexes the given templates need. Called once at start-up.
    async fn prepare(&self, templates: &[QueryTemplate]) -> Result<(), StoreError>;

    /// Appends a version (a fresh id when the document has none).
    async fn create(&self, doc: NewDocument, tokens: &[String]) -> Result<Envelope, StoreError>;

    /// Appends many versions in one transaction: all or nothing.
    async fn create_many(
        &self,
        docs: Vec<NewDocument>,
        tokens: &[String],
    ) -> Result<Vec<Envelope>, StoreError>;

    /// Appends a version of `id` only if a current, visible, non-deleted version exists.
    /// `None` when there is none (nothing is written). `tokens: None` keeps the current
    /// version's authorized tokens (an update does not change who owns a document).
    async fn update(
        &self,
        id: &str,
        doc: NewDocument,
        tokens: Option<&[String]>,
        filter: &TokenFilter,
    ) -> Result<Option<Envelope>, StoreError>;

    /// The visible version of `id` at `at` (latest when `None`).
    async fn read(
        &self,
        id: &str,
        filter: &TokenFilter,
        at: Option<Millis>,
    ) -> Result<Option<Envelope>, StoreError>;

    /// The visible versions of several ids (missing ones are left out), in the given order.
    async fn read_many(
        &self,
        ids: &[String],
        filter: &TokenFilter,
        at: Option<Millis>,
    ) -> Result<Vec<Envelope>, StoreError>;

    /// The visible version of every document.
    async fn list(
        &self,
        filter: &TokenFilter,
        at: Option<Millis>,
    ) -> Result<Vec<Envelope>, StoreError>;

    /// Appends a tombstone for `id`.
    async fn remove(&self, id: &str, filter: &TokenFilter) -> Result<RemoveOutcome, StoreError>;

    /// Removes several ids in one transaction.
    async fn remove_many(
        &self,
        ids: &[String],
        filter: &TokenFilter,
    ) -> Result<Vec<(String, RemoveOutcome)>, StoreError>;

    /// Every stored version of `id`, oldest first, tombstones included.
    async fn versions(&self, id: &str) -> Result<Vec<Envelope>, StoreError>;

    /// Documents matching a template at `at`, at most `limit`.
    async fn find(
        &self,
        template: &QueryTemplate,
        args: &crate::BoundArgs,
        filter: &TokenFilter,
        at: Option<Millis>,
        limit: Option<usize>,
    ) -> Result<Vec<Row>, StoreError>;

    /// One lookup for many keys: evaluates the template once per key with `key_arg` bound to
    /// the key, in a single storage round trip. This is what makes relationship resolution
    /// cost one query per nesting level.
    async fn find_batch(
        &self,
        template: &QueryTemplate,
        key_arg: &str,
        keys: &[String],
        filter: &TokenFilter,
        at: Option<Millis>,
    ) -> Result<KeyedRows, StoreError>;

    /// Whether the backend can serve requests now.
    async fn ready(&self) -> Result<(), StoreError>;

    /// Counters since start.
    fn stats(&self) -> StoreStats;

    /// Flushes pending writes and releases resources.
    async fn shutdown(&self);
}

/// A shared, dynamically dispatched store.
pub type DynStore = Arc<dyn Store>;
