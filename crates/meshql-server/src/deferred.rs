//! A store whose backend was unreachable at start-up: the service starts anyway, answers
//! 503 (and `/ready` 503) for that entity, and keeps preparing the backend in the background
//! until it succeeds — no restart needed when the database comes back.

use async_trait::async_trait;
use meshql_core::{BatchSearch, ChangeFeed, ReadContext, Search, StoreReader, StoreWriter};
use meshql_core::{
    Cursor, DynStore, Envelope, KeyedRows, Nested, NestedRow, NewDocument, QueryTemplate, Relation,
    RemoveOutcome, Row, Store, StoreChange, StoreError, StoreStats, WriteContext,
};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub struct Deferred {
    inner: DynStore,
    prepared: AtomicBool,
    last_error: Mutex<String>,
}

impl Deferred {
    /// Wraps `inner` and retries `prepare(templates)` every `every` until it succeeds.
    pub fn start(
        entity: String,
        inner: DynStore,
        templates: Vec<QueryTemplate>,
        first_error: StoreError,
        every: Duration,
    ) -> Arc<Deferred> {
        let d = Arc::new(Deferred {
            inner,
            prepared: AtomicBool::new(false),
            last_error: Mutex::new(first_error.message().to_owned()),
        });
        let weak = Arc::downgrade(&d);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(d) = weak.upgrade() else { return };
                match d.inner.prepare(&templates).await {
                    Ok(()) => {
                        d.prepared.store(true, Ordering::Release);
                        tracing::info!(entity = %entity, "storage is reachable again; entity ready");
                        return;
                    }
                    Err(e) => *d.last_error.lock() = e.message().to_owned(),
                }
            }
        });
        d
    }

    fn gate(&self) -> Result<(), StoreError> {
        if self.prepared.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(StoreError::Unavailable(format!(
                "not ready yet ({})",
                self.last_error.lock()
            )))
        }
    }
}

#[async_trait]
impl StoreReader for Deferred {
    async fn read(&self, id: &str, ctx: &ReadContext<'_>) -> Result<Option<Envelope>, StoreError> {
        self.gate()?;
        self.inner.read(id, ctx).await
    }

    async fn read_many(
        &self,
        ids: &[String],
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Envelope>, StoreError> {
        self.gate()?;
        self.inner.read_many(ids, ctx).await
    }

    async fn list(&self, ctx: &ReadContext<'_>) -> Result<Vec<Envelope>, StoreError> {
        self.gate()?;
        self.inner.list(ctx).await
    }

    async fn list_page(
        &self,
        after: Option<&str>,
        limit: usize,
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Envelope>, StoreError> {
        self.gate()?;
        self.inner.list_page(after, limit, ctx).await
    }

    async fn versions(&self, id: &str) -> Result<Vec<Envelope>, StoreError> {
        self.gate()?;
        self.inner.versions(id).await
    }

    async fn find(
        &self,
        search: &Search<'_>,
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Row>, StoreError> {
        self.gate()?;
        self.inner.find(search, ctx).await
    }

    async fn find_batch(
        &self,
        batch: &BatchSearch<'_>,
        ctx: &ReadContext<'_>,
    ) -> Result<KeyedRows, StoreError> {
        self.gate()?;
        self.inner.find_batch(batch, ctx).await
    }

    async fn find_nested(
        &self,
        search: &Search<'_>,
        nested: &[Nested],
        ctx: &ReadContext<'_>,
    ) -> Result<Option<Vec<NestedRow>>, StoreError> {
        self.gate()?;
        self.inner.find_nested(search, nested, ctx).await
    }

    fn relation(&self) -> Option<Relation> {
        if self.prepared.load(Ordering::Acquire) {
            self.inner.relation()
        } else {
            None
        }
    }
}

#[async_trait]
impl StoreWriter for Deferred {
    async fn create(&self, doc: NewDocument, ctx: &WriteContext) -> Result<Envelope, StoreError> {
        self.gate()?;
        self.inner.create(doc, ctx).await
    }

    async fn create_many(
        &self,
        docs: Vec<NewDocument>,
        ctx: &WriteContext,
    ) -> Result<Vec<Envelope>, StoreError> {
        self.gate()?;
        self.inner.create_many(docs, ctx).await
    }

    async fn update(
        &self,
        id: &str,
        doc: NewDocument,
        ctx: &WriteContext,
    ) -> Result<Option<Envelope>, StoreError> {
        self.gate()?;
        self.inner.update(id, doc, ctx).await
    }

    async fn remove(&self, id: &str, ctx: &WriteContext) -> Result<RemoveOutcome, StoreError> {
        self.gate()?;
        self.inner.remove(id, ctx).await
    }

    async fn remove_many(
        &self,
        ids: &[String],
        ctx: &WriteContext,
    ) -> Result<Vec<(String, RemoveOutcome)>, StoreError> {
        self.gate()?;
        self.inner.remove_many(ids, ctx).await
    }
}

#[async_trait]
impl ChangeFeed for Deferred {
    async fn changes(&self, after: Cursor, limit: usize) -> Result<Vec<StoreChange>, StoreError> {
        self.gate()?;
        self.inner.changes(after, limit).await
    }

    fn commit_signal(&self) -> Option<meshql_core::CommitReceiver> {
        self.inner.commit_signal()
    }
}

#[async_trait]
impl Store for Deferred {
    async fn prepare(&self, templates: &[QueryTemplate]) -> Result<(), StoreError> {
        self.inner.prepare(templates).await?;
        self.prepared.store(true, Ordering::Release);
        Ok(())
    }

    async fn ready(&self) -> Result<(), StoreError> {
        self.gate()?;
        self.inner.ready().await
    }

    fn stats(&self) -> StoreStats {
        self.inner.stats()
    }

    async fn shutdown(&self) {
        self.inner.shutdown().await
    }
}
