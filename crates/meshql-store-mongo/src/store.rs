//! [`MongoStore`]: one entity collection; the store's parts are in `store/`: the writer
//! (`writer.rs`, its locks `locks.rs`, `create_many` in `batch.rs`, the [`StoreWriter`]
//! impl `write.rs`) and the reads (`visible.rs`, `parked.rs`, the [`StoreReader`] impl
//! `read.rs`). Here: the store, its indexes and stats, and its change feed.
//!
//! [`StoreWriter`]: meshql_core::StoreWriter
//! [`StoreReader`]: meshql_core::StoreReader

mod batch;
mod locks;
mod parked;
mod read;
mod visible;
mod write;
mod writer;

use crate::db::MongoDatabase;
use crate::document::change_of;
use crate::error::error;
use crate::feed::{Feed, CLOCK_COLLECTION};
use crate::filter::path_key;
use async_trait::async_trait;
use futures::TryStreamExt;
use meshql_core::template::TemplateKind;
use meshql_core::{
    ChangeFeed, CommitSignal, Cursor, QueryTemplate, Store, StoreChange, StoreError, StoreStats,
};
use mongodb::bson::{doc, Document};
use mongodb::options::IndexOptions;
use mongodb::{Collection, IndexModel};
use parked::Parked;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::Mutex;
use writer::Writer;

/// One entity's collection.
pub struct MongoStore {
    db: Arc<MongoDatabase>,
    coll: Collection<Document>,
    w: Arc<Writer>,
    reads: AtomicU64,
    /// Queries of the change feed (not counted in `reads`, which count what requests cost).
    feed_reads: AtomicU64,
    /// Cursors of list pages read at a fixed time, kept for the page after (see
    /// [`Parked`]).
    parked: std::sync::Mutex<Vec<Parked>>,
}

impl MongoStore {
    pub fn new(db: Arc<MongoDatabase>, collection: &str) -> Self {
        let coll: Collection<Document> = db.db.collection(collection);
        let feed = Feed::new(
            coll.clone(),
            db.db.collection(CLOCK_COLLECTION),
            collection,
            db.feed_grace,
        );
        let w = Arc::new(Writer {
            coll: coll.clone(),
            feed,
            locks: (0..64).map(|_| Arc::new(Mutex::new(()))).collect(),
            signal: CommitSignal::default(),
            writes: AtomicU64::new(0),
            commits: AtomicU64::new(0),
        });
        Self {
            coll,
            db,
            w,
            reads: AtomicU64::new(0),
            feed_reads: AtomicU64::new(0),
            parked: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// The collection as the database's `read_url` client serves it, for reads only (what
    /// [`meshql_core::Database::replica`] hands out); `None` without a `read_url`. The store
    /// made by [`Self::new`] keeps reading through the primary's client, so a write, and
    /// every read it depends on, never sees a replica's stale version.
    pub fn replica(db: Arc<MongoDatabase>, collection: &str) -> Option<Self> {
        let replica = db.replica.clone()?;
        Some(Self::new(replica, collection))
    }
}

#[async_trait]
impl ChangeFeed for MongoStore {
    /// The gap-free prefix of the versions' feed positions (see [`crate::feed`]).
    async fn changes(&self, after: Cursor, limit: usize) -> Result<Vec<StoreChange>, StoreError> {
        // this store's cursors are all `Cursor(0, pos)`: nothing comes after a larger one
        if after.0 > 0 || limit == 0 {
            return Ok(Vec::new());
        }
        // no request permit: the feed reader uses the connection kept for it (see `connect`)
        self.w
            .feed
            .changes(after.1, limit, &self.feed_reads, change_of)
            .await
    }

    fn commit_signal(&self) -> Option<meshql_core::CommitReceiver> {
        Some(self.w.signal.subscribe())
    }
}

#[async_trait]
impl Store for MongoStore {
    async fn prepare(&self, templates: &[QueryTemplate]) -> Result<(), StoreError> {
        let _permit = self.db.checkout().await?;
        let mut indexes = vec![
            IndexModel::builder()
                .keys(doc! {"id": 1, "created_at": -1})
                .options(IndexOptions::builder().unique(true).build())
                .build(),
            IndexModel::builder()
                .keys(doc! {"latest": 1, "deleted": 1, "seq": 1})
                .build(),
            // the versions written after a moment, for reads `at` it (see `visible_docs`)
            IndexModel::builder().keys(doc! {"created_at": 1}).build(),
            // the change feed; sparse for versions older than the feed (FerretDB ignores
            // `sparse`, and its unique indexes let any number of documents lack the field)
            IndexModel::builder()
                .keys(doc! {"pos": 1})
                .options(IndexOptions::builder().unique(true).sparse(true).build())
                .build(),
        ];
        let mut fields = std::collections::BTreeSet::new();
        for t in templates {
            if let TemplateKind::Sql(_) = t.kind {
                return Err(StoreError::Invalid(format!(
                    "SQL fragment `{}` needs a SQL backend; MongoDB takes JSON templates",
                    t.source
                )));
            }
            fields.extend(t.filtered_paths().iter().map(path_key));
        }
        for field in fields {
            indexes.push(IndexModel::builder().keys(doc! {field: 1}).build());
        }
        // Only the missing ones: a restart finds them in place (and FerretDB v1 drops the
        // connection on a createIndexes naming indexes that already exist).
        let existing: Vec<Document> = match self.coll.list_indexes().await {
            Ok(cursor) => cursor
                .map_ok(|m| m.keys)
                .try_collect()
                .await
                .map_err(error)?,
            // a collection that does not exist yet has no indexes
            Err(e) if matches!(&*e.kind, mongodb::error::ErrorKind::Command(c) if c.code == 26) => {
                Vec::new()
            }
            Err(e) => return Err(error(e)),
        };
        indexes.retain(|i| !existing.contains(&i.keys));
        if !indexes.is_empty() {
            self.coll.create_indexes(indexes).await.map_err(error)?;
        }
        self.w.feed.prepare().await
    }

    async fn ready(&self) -> Result<(), StoreError> {
        self.db.ping().await
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            reads: self.reads.load(Ordering::Relaxed),
            commits: self.w.commits.load(Ordering::Relaxed),
            writes: self.w.writes.load(Ordering::Relaxed),
            read_connections: None,
            connections_in_use: Some(self.db.connections_in_use()),
            log: None,
        }
    }

    async fn shutdown(&self) {
        self.db.close().await;
    }
}

/// Processor outputs are not supported: no multi-document transactions on the servers this
/// store is tested against (see the crate docs, "Processor outputs: not supported").
impl meshql_core::OutputStore for MongoStore {}
