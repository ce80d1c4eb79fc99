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

use crate::change::{Cursor, StoreChange, WriteContext};
use crate::{BoundArgs, Envelope, Millis, NewDocument, QueryTemplate, Row, StoreError};
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

/// `found` (the newest candidate version of some of `ids`, in any order) arranged as
/// [`StoreReader::read_many`] answers: in the order of `ids`, missing ids, tombstones and what
/// `filter` hides left out. Lets a client/server backend answer with one query.
pub fn in_request_order(
    ids: &[String],
    found: Vec<Envelope>,
    filter: &TokenFilter,
) -> Vec<Envelope> {
    let by_id: std::collections::HashMap<&str, &Envelope> =
        found.iter().map(|e| (e.id.as_str(), e)).collect();
    ids.iter()
        .filter_map(|id| by_id.get(id.as_str()))
        .filter(|e| !e.deleted && crate::auth::is_visible(filter, &e.authorized_tokens))
        .map(|e| (*e).clone())
        .collect()
}

/// A page of latest versions (`candidates`, in page order) as it was at `at`: a candidate
/// written after `at` is replaced by its newest version at or before `at`, looked up in
/// `older` (any order) — or dropped when it has none, it is a tombstone, or `filter` hides it.
/// Lets a backend page through the latest versions' id index (cheap) and look up only what
/// was written since `at` (usually nothing) instead of finding each row's version at `at`.
/// Candidates not written after `at` are kept as they are: the caller selected them visible.
pub fn page_as_of(
    candidates: Vec<Envelope>,
    at: crate::Millis,
    older: Vec<Envelope>,
    filter: &TokenFilter,
) -> Vec<Envelope> {
    let mut older: std::collections::HashMap<String, Envelope> =
        older.into_iter().map(|e| (e.id.clone(), e)).collect();
    candidates
        .into_iter()
        .filter_map(|e| {
            if e.created_at <= at {
                return Some(e);
            }
            older
                .remove(&e.id)
                .filter(|o| !o.deleted && crate::auth::is_visible(filter, &o.authorized_tokens))
        })
        .collect()
}

/// Where a store keeps its rows (see [`StoreReader::relation`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    /// The backend (`"postgres"`): only stores of one backend and database join.
    pub backend: &'static str,
    /// Identifies the database (its connection pool) within the process.
    pub database: usize,
    pub table: String,
}

/// A relationship below a search, for [`StoreReader::find_nested`]: for every row, the rows of
/// `store` matching `template` with its `id` argument bound to the row's `key_field`.
#[derive(Clone)]
pub struct Nested {
    /// The parent's payload field holding the key (`id`: the envelope id).
    pub key_field: String,
    /// Every matching row (`true`), or the first.
    pub vector: bool,
    pub store: DynReader,
    pub template: QueryTemplate,
    /// The payload fields read of this level's rows (`None`: all), the key fields of
    /// `children` among them; a store may leave the others out of [`NestedRow::payload`]
    /// ([`crate::field_set`]).
    pub fields: Option<crate::FieldSet>,
    /// The relationships below this one.
    pub children: Vec<Nested>,
}

impl std::fmt::Debug for Nested {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nested")
            .field("key_field", &self.key_field)
            .field("vector", &self.vector)
            .field("template", &self.template.source)
            .field("fields", &self.fields)
            .field("children", &self.children)
            .finish()
    }
}

/// A row of a nested search: the document and, per [`Nested`] relationship in order, its
/// related rows.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NestedRow {
    pub id: String,
    pub payload: serde_json::Map<String, serde_json::Value>,
    pub children: Vec<Vec<NestedRow>>,
}

/// Counters a backend keeps (for `/metrics` and for tests that count queries).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Read statements executed (one per find, find_batch, read, list...).
    pub reads: u64,
    /// Write transactions committed.
    pub commits: u64,
    /// Documents written.
    pub writes: u64,
    /// Connections open for reads, where the backend keeps its own (SQLite; `None` where the
    /// driver's pool is not counted).
    pub read_connections: Option<u64>,
    /// Connections of the backend's pool lent to an operation right now (`None` where the
    /// backend has no pool): at the pool's size, the next operation waits for one.
    pub connections_in_use: Option<u64>,
    /// For a store whose reads are a local materialisation of a log (Kafka): how far behind
    /// the log they may be. `None` for the others.
    pub log: Option<LogLag>,
}

/// How far the reads of a store materialised from a log may be behind it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogLag {
    /// How old its answers may be: 0 while the log is reachable and every record it reported
    /// is applied, otherwise the time since that was last true.
    pub behind_ms: u64,
    /// Records the log reported that are not applied yet.
    pub records_behind: u64,
    /// Records skipped because they were not document versions, since start.
    pub skipped: u64,
    /// Whether the log's servers are reachable.
    pub reachable: bool,
}

/// What a read sees: whose documents (`filter`), as of when (`at`; the latest when `None`).
/// Borrowed, so building one per call costs nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadContext<'a> {
    pub filter: &'a TokenFilter,
    pub at: Option<Millis>,
}

impl<'a> ReadContext<'a> {
    /// Everything, as it is now (tests, tools, processors).
    pub const LATEST: ReadContext<'static> = ReadContext {
        filter: &TokenFilter::All,
        at: None,
    };

    pub fn new(filter: &'a TokenFilter, at: Option<Millis>) -> Self {
        Self { filter, at }
    }
}

/// A search: a query template, its arguments, and at most how many rows.
#[derive(Debug, Clone, Copy)]
pub struct Search<'a> {
    pub template: &'a QueryTemplate,
    pub args: &'a BoundArgs,
    pub limit: Option<usize>,
    /// The payload fields the caller reads (`None`: all). A hint: a store may return only
    /// these ([`StoreReader::find_nested`] on SQLite does), or the whole payload.
    pub fields: Option<&'a crate::FieldSet>,
}

impl<'a> Search<'a> {
    pub fn new(template: &'a QueryTemplate, args: &'a BoundArgs, limit: Option<usize>) -> Self {
        Self {
            template,
            args,
            limit,
            fields: None,
        }
    }

    /// The same search, for a caller that reads only `fields` of each payload.
    pub fn reading(self, fields: Option<&'a crate::FieldSet>) -> Self {
        Self { fields, ..self }
    }
}

/// One lookup for many keys: the template evaluated once per key, with `key_arg` bound to it.
#[derive(Debug, Clone, Copy)]
pub struct BatchSearch<'a> {
    pub template: &'a QueryTemplate,
    pub key_arg: &'a str,
    pub keys: &'a [String],
}

impl<'a> BatchSearch<'a> {
    pub fn new(template: &'a QueryTemplate, key_arg: &'a str, keys: &'a [String]) -> Self {
        Self {
            template,
            key_arg,
            keys,
        }
    }

    /// The SQL backends bind each key to the template's `id` argument: any other is refused.
    pub fn require_id_key(&self) -> Result<(), StoreError> {
        if self.key_arg == "id" {
            Ok(())
        } else {
            Err(StoreError::Invalid(format!(
                "batched lookups bind the `id` argument, not `{}`",
                self.key_arg
            )))
        }
    }
}

/// The reading half of a store. A cache or a read replica implements only this.
#[async_trait]
pub trait StoreReader: Send + Sync + 'static {
    /// The visible version of `id` at `ctx.at`.
    async fn read(&self, id: &str, ctx: &ReadContext<'_>) -> Result<Option<Envelope>, StoreError>;

    /// The visible versions of several ids (missing ones are left out), in the given order.
    async fn read_many(
        &self,
        ids: &[String],
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Envelope>, StoreError>;

    /// The visible version of every document.
    async fn list(&self, ctx: &ReadContext<'_>) -> Result<Vec<Envelope>, StoreError>;

    /// One page of [`StoreReader::list`] in id order: the visible version (latest at
    /// `ctx.at`, not deleted, allowed by `ctx.filter`) of each document whose id sorts after
    /// `after` (every document when `None`), at most `limit`, ordered by id — fewer only when
    /// no more follow. `after` need not name a stored document. Read with one fixed
    /// `ctx.at`, successive pages — each starting
    /// after the last id of the one before — list every document of that moment exactly once,
    /// whatever is written in between. Backends answer with a keyset query on their
    /// `(id, created_at)` index, so a page costs O(limit) however large the table is.
    ///
    /// Ids compare as the backend's id column does: bytewise on SQLite, MySQL/MariaDB
    /// (`utf8mb4_bin`), MongoDB and memory; the database's collation on PostgreSQL.
    async fn list_page(
        &self,
        after: Option<&str>,
        limit: usize,
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Envelope>, StoreError>;

    /// Every stored version of `id`, oldest first, tombstones included.
    async fn versions(&self, id: &str) -> Result<Vec<Envelope>, StoreError>;

    /// Documents matching a search, at most `search.limit`.
    async fn find(
        &self,
        search: &Search<'_>,
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Row>, StoreError>;

    /// One lookup for many keys in a single storage round trip: what makes relationship
    /// resolution cost one query per nesting level.
    async fn find_batch(
        &self,
        batch: &BatchSearch<'_>,
        ctx: &ReadContext<'_>,
    ) -> Result<KeyedRows, StoreError>;

    /// A search and the relationships below it in one statement: what `find` followed by
    /// one `find_batch` per relationship and level returns (each level's key bound to the
    /// `id` argument of its template, singletons keeping their first row). `Ok(None)` when
    /// the backend cannot answer so (the default, or a relationship in another database):
    /// the caller then goes level by level.
    async fn find_nested(
        &self,
        search: &Search<'_>,
        nested: &[Nested],
        ctx: &ReadContext<'_>,
    ) -> Result<Option<Vec<NestedRow>>, StoreError> {
        let _ = (search, nested, ctx);
        Ok(None)
    }

    /// Where this store keeps its rows, for a backend joining stores of one database in
    /// [`StoreReader::find_nested`]; `None` (the default) when it cannot.
    fn relation(&self) -> Option<Relation> {
        None
    }

    /// A moment up to which this reader is known to have applied every write: a replica's
    /// replay position, as a time. `None` (the default): the reader is the primary, current
    /// by definition. A cache in front of a replica fills only with answers that cover the
    /// writes it has been told of.
    fn applied_through(&self) -> Option<crate::Millis> {
        None
    }

    /// The entity whose documents this reader serves, when it is a cache that tags its
    /// answers by entity (`None`, the default, otherwise): what lets a cache in front of one
    /// entity cache a [`StoreReader::find_nested`] answer that reads others.
    fn cached_entity(&self) -> Option<&str> {
        None
    }

    /// Whether this reader has a version of `id` stamped `stamp` or later (tombstones
    /// count): a replica or a cache has applied the write that stamped it. What
    /// read-your-writes waits for.
    async fn has_version(&self, id: &str, stamp: crate::Millis) -> Result<bool, StoreError> {
        Ok(self
            .versions(id)
            .await?
            .iter()
            .any(|v| v.created_at >= stamp))
    }
}

/// The writing half of a store: every write appends versions, and each committed version is
/// one change in the store's [`ChangeFeed`].
#[async_trait]
pub trait StoreWriter: Send + Sync + 'static {
    /// Appends a version (a fresh id when the document has none), stamped with
    /// `ctx.create_tokens()`.
    async fn create(&self, doc: NewDocument, ctx: &WriteContext) -> Result<Envelope, StoreError>;

    /// Appends many versions in one transaction: all or nothing.
    async fn create_many(
        &self,
        docs: Vec<NewDocument>,
        ctx: &WriteContext,
    ) -> Result<Vec<Envelope>, StoreError>;

    /// Appends a version of `id` only if a current, non-deleted version visible through
    /// `ctx.filter` exists. `None` when there is none (nothing is written). `ctx.tokens: None`
    /// keeps the current version's authorized tokens.
    async fn update(
        &self,
        id: &str,
        doc: NewDocument,
        ctx: &WriteContext,
    ) -> Result<Option<Envelope>, StoreError>;

    /// Appends a tombstone for `id` (if visible through `ctx.filter`).
    async fn remove(&self, id: &str, ctx: &WriteContext) -> Result<RemoveOutcome, StoreError>;

    /// Removes several ids in one transaction.
    async fn remove_many(
        &self,
        ids: &[String],
        ctx: &WriteContext,
    ) -> Result<Vec<(String, RemoveOutcome)>, StoreError>;

    /// Writes versions made elsewhere as they were — id, `created_at`, tombstone flag,
    /// authorized tokens and payload (an import, `meshql import`) — each placed in its
    /// document's history by its time, as a back-dated write is. A version whose
    /// `(id, created_at)` is stored already is skipped, so importing the same versions twice
    /// changes nothing. All or nothing; returns how many were written. Each written version
    /// is one change on the store's feed.
    async fn import_versions(&self, versions: &[crate::Envelope]) -> Result<u64, StoreError> {
        let _ = versions;
        Err(StoreError::Invalid(
            "this storage backend cannot import versions".into(),
        ))
    }
}

/// A store's change feed (see [`crate::change`] for the contract).
#[async_trait]
pub trait ChangeFeed: Send + Sync + 'static {
    /// Committed versions after `after`, in feed order, at most `limit`.
    async fn changes(&self, after: Cursor, limit: usize) -> Result<Vec<StoreChange>, StoreError>;

    /// Raised after every commit this process makes through this store, so that a feed
    /// tailer wakes at once; `None` when the backend has none (tailers then poll).
    fn commit_signal(&self) -> Option<crate::CommitReceiver> {
        None
    }
}

/// Storage for one entity: its reader, writer and change feed, and its lifecycle.
#[async_trait]
pub trait Store: StoreReader + StoreWriter + ChangeFeed + crate::OutputStore {
    /// Creates tables and the indexes the given templates need. Called once at start-up.
    async fn prepare(&self, templates: &[QueryTemplate]) -> Result<(), StoreError>;

    /// Whether the backend can serve requests now.
    async fn ready(&self) -> Result<(), StoreError>;

    /// Counters since start.
    fn stats(&self) -> StoreStats;

    /// Flushes pending writes and releases resources.
    async fn shutdown(&self);
}

/// A shared reader (a store, a replica, a cache).
pub type DynReader = Arc<dyn StoreReader>;
/// A shared writer.
pub type DynWriter = Arc<dyn StoreWriter>;

/// A shared, dynamically dispatched store.
pub type DynStore = Arc<dyn Store>;

/// Where a new version goes in its document's history: the versioning rules every backend
/// applies, written once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The version's `created_at`.
    pub stamp: Millis,
    /// Whether it becomes the newest version of its document.
    pub latest: bool,
    /// A back-dated version: the backend moves `stamp` past versions already at that time
    /// (`+1` while taken), then calls [`Placement::settle`].
    pub check_collisions: bool,
}

impl Placement {
    /// `requested`: the caller's `created_at`, if any; `current`: the newest version's time.
    /// A version written "now" always becomes the newest, 1 ms after the current one when
    /// the clock has not moved on.
    pub fn new(requested: Option<Millis>, current: Option<Millis>, now: Millis) -> Self {
        let stamp = requested.unwrap_or(now);
        match current {
            None => Placement {
                stamp,
                latest: true,
                check_collisions: false,
            },
            Some(cur) if requested.is_none() || stamp >= cur => Placement {
                stamp: stamp.max(cur + 1),
                latest: true,
                check_collisions: false,
            },
            Some(_) => Placement {
                stamp,
                latest: false,
                check_collisions: true,
            },
        }
    }

    /// After collisions moved a back-dated stamp: past the newest version, it is the newest.
    pub fn settle(mut self, stamp: Millis, current: Option<Millis>) -> Self {
        self.stamp = stamp;
        self.latest = self.latest || current.is_some_and(|c| stamp > c);
        self
    }
}

#[cfg(test)]
mod page_as_of_tests {
    use super::*;

    fn env(id: &str, at: i64, deleted: bool, tokens: &[&str]) -> Envelope {
        Envelope {
            id: id.into(),
            payload: format!("{{\"v\":{at}}}"),
            created_at: at,
            deleted,
            authorized_tokens: tokens.iter().map(|t| t.to_string()).collect(),
        }
    }

    #[test]
    fn what_was_written_since_is_replaced_by_the_version_before() {
        let page = vec![
            env("a", 5, false, &[]),
            env("b", 20, false, &[]), // updated since: b@7 instead
            env("c", 21, true, &[]),  // deleted since: c@8
            env("d", 22, false, &[]), // created since: gone
            env("e", 23, false, &[]), // was a tombstone at 10: gone
            env("f", 24, false, &[]), // was bob's at 10: hidden from alice
            env("g", 10, false, &[]),
        ];
        let older = vec![
            env("f", 9, false, &["bob"]),
            env("c", 8, false, &[]),
            env("b", 7, false, &[]),
            env("e", 6, true, &[]),
        ];
        let alice = TokenFilter::AnyOf(vec!["alice".into()]);
        let got: Vec<(String, i64)> = page_as_of(page, 10, older, &alice)
            .into_iter()
            .map(|e| (e.id, e.created_at))
            .collect();
        let want = [("a", 5), ("b", 7), ("c", 8), ("g", 10)];
        assert_eq!(
            got,
            want.map(|(i, t)| (i.to_owned(), t)).to_vec(),
            "in page order"
        );
    }
}

#[cfg(test)]
mod placement_tests {
    use super::Placement;

    #[test]
    fn placement_rules() {
        let first = Placement::new(None, None, 5);
        assert_eq!(
            (first.stamp, first.latest, first.check_collisions),
            (5, true, false)
        );
        assert_eq!(
            Placement::new(None, Some(5), 5).stamp,
            6,
            "same millisecond: 1 ms later"
        );
        assert_eq!(Placement::new(Some(9), Some(5), 1).stamp, 9);
        let back = Placement::new(Some(3), Some(5), 10);
        assert!(!back.latest && back.check_collisions);
        assert!(back.settle(6, Some(5)).latest);
        assert!(!back.settle(4, Some(5)).latest);
    }
}
