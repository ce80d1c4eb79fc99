//! The store every entity is served through: one forwarding layer around the backend's store
//! that
//!
//! - opens a `storage` tracing span (debug level) per call, named after the entity and the
//!   operation (`read`, `find_batch`, `create`…), so that with `--log-level debug` (or
//!   `RUST_LOG=meshql_server=debug`) each request's storage calls are logged with their busy
//!   and idle time inside the request's span — the per-stage timings of one request. At the
//!   default `info` level the span's callsite is disabled once and costs a check per call;
//! - for a backend that was unreachable at start-up, answers 503 (and `/ready` 503) for that
//!   entity while it keeps preparing the backend in the background until it succeeds — no
//!   restart needed when the database comes back.

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
use tracing::Instrument;

/// The target of the storage spans: the one operators filter the serving path's timings by
/// (`--log-level info,meshql_server=debug`, docs/OPERATIONS.md), where this code served from.
const SPANS: &str = "meshql_server::storage";

pub struct Served {
    inner: DynStore,
    entity: Arc<str>,
    /// `None` once the backend is prepared (from the start, or after a deferred start).
    pending: Option<Pending>,
}

/// A backend unreachable at start-up, being prepared again in the background.
struct Pending {
    prepared: AtomicBool,
    last_error: Mutex<String>,
}

impl Served {
    /// Serves a prepared store.
    pub fn ready(entity: &str, inner: DynStore) -> Arc<Served> {
        Arc::new(Served {
            inner,
            entity: entity.into(),
            pending: None,
        })
    }

    /// Serves a store whose `prepare(templates)` failed with `first_error`: retried every
    /// `every` until it succeeds, 503 until then.
    pub fn deferred(
        entity: &str,
        inner: DynStore,
        templates: Vec<QueryTemplate>,
        first_error: StoreError,
        every: Duration,
    ) -> Arc<Served> {
        let d = Arc::new(Served {
            inner,
            entity: entity.into(),
            pending: Some(Pending {
                prepared: AtomicBool::new(false),
                last_error: Mutex::new(first_error.message().to_owned()),
            }),
        });
        let weak = Arc::downgrade(&d);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(d) = weak.upgrade() else { return };
                match d.inner.prepare(&templates).await {
                    Ok(()) => {
                        d.mark_prepared();
                        tracing::info!(entity = %d.entity, "storage is reachable again; entity ready");
                        return;
                    }
                    Err(e) => {
                        if let Some(p) = &d.pending {
                            *p.last_error.lock() = e.message().to_owned();
                        }
                    }
                }
            }
        });
        d
    }

    fn mark_prepared(&self) {
        if let Some(p) = &self.pending {
            p.prepared.store(true, Ordering::Release);
        }
    }

    fn prepared(&self) -> bool {
        self.pending
            .as_ref()
            .is_none_or(|p| p.prepared.load(Ordering::Acquire))
    }

    fn gate(&self) -> Result<(), StoreError> {
        match &self.pending {
            Some(p) if !p.prepared.load(Ordering::Acquire) => Err(StoreError::Unavailable(
                format!("not ready yet ({})", p.last_error.lock()),
            )),
            _ => Ok(()),
        }
    }

    fn span(&self, op: &'static str) -> tracing::Span {
        tracing::debug_span!(target: SPANS, "storage", entity = &*self.entity, op)
    }
}

#[async_trait]
impl StoreReader for Served {
    async fn read(&self, id: &str, ctx: &ReadContext<'_>) -> Result<Option<Envelope>, StoreError> {
        self.gate()?;
        self.inner.read(id, ctx).instrument(self.span("read")).await
    }

    async fn read_many(
        &self,
        ids: &[String],
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Envelope>, StoreError> {
        self.gate()?;
        self.inner
            .read_many(ids, ctx)
            .instrument(self.span("read_many"))
            .await
    }

    async fn list(&self, ctx: &ReadContext<'_>) -> Result<Vec<Envelope>, StoreError> {
        self.gate()?;
        self.inner.list(ctx).instrument(self.span("list")).await
    }

    async fn list_page(
        &self,
        after: Option<&str>,
        limit: usize,
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Envelope>, StoreError> {
        self.gate()?;
        self.inner
            .list_page(after, limit, ctx)
            .instrument(self.span("list_page"))
            .await
    }

    async fn versions(&self, id: &str) -> Result<Vec<Envelope>, StoreError> {
        self.gate()?;
        self.inner
            .versions(id)
            .instrument(self.span("versions"))
            .await
    }

    async fn find(
        &self,
        search: &Search<'_>,
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Row>, StoreError> {
        self.gate()?;
        self.inner
            .find(search, ctx)
            .instrument(self.span("find"))
            .await
    }

    async fn find_batch(
        &self,
        batch: &BatchSearch<'_>,
        ctx: &ReadContext<'_>,
    ) -> Result<KeyedRows, StoreError> {
        self.gate()?;
        self.inner
            .find_batch(batch, ctx)
            .instrument(self.span("find_batch"))
            .await
    }

    async fn find_nested(
        &self,
        search: &Search<'_>,
        nested: &[Nested],
        ctx: &ReadContext<'_>,
    ) -> Result<Option<Vec<NestedRow>>, StoreError> {
        self.gate()?;
        self.inner
            .find_nested(search, nested, ctx)
            .instrument(self.span("find_nested"))
            .await
    }

    fn relation(&self) -> Option<Relation> {
        if self.prepared() {
            self.inner.relation()
        } else {
            None
        }
    }
}

#[async_trait]
impl StoreWriter for Served {
    async fn import_versions(&self, versions: &[Envelope]) -> Result<u64, StoreError> {
        self.gate()?;
        self.inner
            .import_versions(versions)
            .instrument(self.span("import_versions"))
            .await
    }

    async fn create(&self, doc: NewDocument, ctx: &WriteContext) -> Result<Envelope, StoreError> {
        self.gate()?;
        self.inner
            .create(doc, ctx)
            .instrument(self.span("create"))
            .await
    }

    async fn create_many(
        &self,
        docs: Vec<NewDocument>,
        ctx: &WriteContext,
    ) -> Result<Vec<Envelope>, StoreError> {
        self.gate()?;
        self.inner
            .create_many(docs, ctx)
            .instrument(self.span("create_many"))
            .await
    }

    async fn update(
        &self,
        id: &str,
        doc: NewDocument,
        ctx: &WriteContext,
    ) -> Result<Option<Envelope>, StoreError> {
        self.gate()?;
        self.inner
            .update(id, doc, ctx)
            .instrument(self.span("update"))
            .await
    }

    async fn remove(&self, id: &str, ctx: &WriteContext) -> Result<RemoveOutcome, StoreError> {
        self.gate()?;
        self.inner
            .remove(id, ctx)
            .instrument(self.span("remove"))
            .await
    }

    async fn remove_many(
        &self,
        ids: &[String],
        ctx: &WriteContext,
    ) -> Result<Vec<(String, RemoveOutcome)>, StoreError> {
        self.gate()?;
        self.inner
            .remove_many(ids, ctx)
            .instrument(self.span("remove_many"))
            .await
    }
}

#[async_trait]
impl ChangeFeed for Served {
    async fn changes(&self, after: Cursor, limit: usize) -> Result<Vec<StoreChange>, StoreError> {
        self.gate()?;
        self.inner
            .changes(after, limit)
            // the feed's tailers poll between requests: trace level, not debug
            .instrument(tracing::trace_span!(
                target: SPANS,
                "storage",
                entity = &*self.entity,
                op = "changes"
            ))
            .await
    }

    fn commit_signal(&self) -> Option<meshql_core::CommitReceiver> {
        self.inner.commit_signal()
    }
}

#[async_trait]
impl Store for Served {
    async fn prepare(&self, templates: &[QueryTemplate]) -> Result<(), StoreError> {
        self.inner.prepare(templates).await?;
        self.mark_prepared();
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

#[async_trait]
impl meshql_core::OutputStore for Served {
    fn supports_outputs(&self) -> bool {
        self.inner.supports_outputs()
    }

    async fn output_position(&self, consumer: &str) -> Result<Option<u64>, StoreError> {
        self.gate()?;
        self.inner.output_position(consumer).await
    }

    async fn output_state(
        &self,
        consumer: &str,
        keys: &[String],
    ) -> Result<std::collections::HashMap<String, String>, StoreError> {
        self.gate()?;
        self.inner.output_state(consumer, keys).await
    }

    async fn output_group(
        &self,
        consumer: &str,
        group: &str,
    ) -> Result<Vec<(String, String)>, StoreError> {
        self.gate()?;
        self.inner.output_group(consumer, group).await
    }

    async fn apply_output(
        &self,
        batch: meshql_core::OutputBatch,
        ctx: &WriteContext,
    ) -> Result<Vec<Envelope>, StoreError> {
        self.gate()?;
        self.inner
            .apply_output(batch, ctx)
            .instrument(self.span("apply_output"))
            .await
    }

    async fn dead_letters(
        &self,
        consumer: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, meshql_core::DeadLetter)>, StoreError> {
        self.gate()?;
        self.inner.dead_letters(consumer, limit).await
    }

    async fn dead_letter_count(&self, consumer: &str) -> Result<u64, StoreError> {
        self.gate()?;
        self.inner.dead_letter_count(consumer).await
    }

    async fn reset_output(&self, consumer: &str) -> Result<(), StoreError> {
        self.gate()?;
        self.inner.reset_output(consumer).await
    }

    async fn rebuild_store(&self) -> Result<meshql_core::DynStore, StoreError> {
        self.gate()?;
        self.inner.rebuild_store().await
    }

    async fn swap_rebuilt(&self, from: &str, to: &str) -> Result<(), StoreError> {
        self.gate()?;
        self.inner.swap_rebuilt(from, to).await
    }
}
