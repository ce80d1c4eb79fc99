//! The store's [`StoreWriter`] impl: each write takes a permit and the locks of its ids, then
//! runs detached on the [`Writer`](super::writer::Writer).

use super::batch::BatchItem;
use super::writer::{detached, NewVersion};
use super::MongoStore;
use crate::document::{payload_doc, stored_text};
use async_trait::async_trait;
use meshql_core::{Envelope, NewDocument, RemoveOutcome, StoreError, StoreWriter, WriteContext};
use tokio::sync::OwnedSemaphorePermit;

impl MongoStore {
    /// Removes one id: its lock taken here, the write detached (see [`Writer`](super::writer::Writer)).
    async fn remove_one(
        &self,
        id: &str,
        ctx: &WriteContext,
        permit: OwnedSemaphorePermit,
    ) -> Result<RemoveOutcome, StoreError> {
        let guard = self.w.lock(id).await;
        let (w, id, ctx) = (self.w.clone(), id.to_owned(), ctx.clone());
        detached(async move {
            let _held = (permit, guard);
            w.remove_locked(&id, &ctx).await
        })
        .await
    }
}

#[async_trait]
impl StoreWriter for MongoStore {
    /// Without transactions each version is a write of its own (under its id's lock): an
    /// import stopped midway is completed, not repeated, by running it again (a version
    /// stored already is skipped).
    async fn import_versions(&self, versions: &[Envelope]) -> Result<u64, StoreError> {
        let permit = self.db.checkout_owned().await?;
        let mut items = Vec::with_capacity(versions.len());
        for v in versions {
            let payload = payload_doc(&meshql_core::payload_with_id(&v.id, &v.payload)?)?;
            items.push((v.clone(), payload));
        }
        let guards = self
            .w
            .lock_all(items.iter().map(|(v, _)| v.id.as_str()))
            .await;
        let w = self.w.clone();
        detached(async move {
            let _held = (permit, guards);
            let mut written = 0u64;
            for (v, payload) in items {
                if w.version_at(&v.id, v.created_at).await? {
                    continue;
                }
                w.append(NewVersion {
                    id: &v.id,
                    payload,
                    created_at: Some(v.created_at),
                    deleted: v.deleted,
                    tokens: &v.authorized_tokens,
                    fresh_id: false,
                    correlation_id: None,
                })
                .await?;
                written += 1;
            }
            if written > 0 {
                w.committed(written);
            }
            Ok(written)
        })
        .await
    }

    async fn create(
        &self,
        mut doc: NewDocument,
        ctx: &WriteContext,
    ) -> Result<Envelope, StoreError> {
        let permit = self.db.checkout_owned().await?;
        let fresh_id = doc.id.is_none();
        let id = doc.resolve_id();
        let created_at = doc.created_at;
        let payload = payload_doc(&doc.into_payload_text(&id))?;
        let guard = if fresh_id {
            None
        } else {
            Some(self.w.lock(&id).await)
        };
        let (w, ctx) = (self.w.clone(), ctx.clone());
        detached(async move {
            let _held = (permit, guard);
            let env = w
                .append(NewVersion {
                    id: &id,
                    payload,
                    created_at,
                    deleted: false,
                    tokens: ctx.create_tokens(),
                    fresh_id,
                    correlation_id: ctx.correlation_id.as_deref(),
                })
                .await?;
            w.committed(1);
            Ok(env)
        })
        .await
    }

    /// All or nothing without transactions: the versions are placed, then inserted with one
    /// ordered `insert_many` under one range of feed positions; only once every one is in are
    /// the `latest` flags settled. Should the insert fail part-way, what it inserted is
    /// deleted again and the positions become void (see [`crate::feed`] for what readers see
    /// meanwhile). A clash with another process on a unique index places the batch again.
    async fn create_many(
        &self,
        docs: Vec<NewDocument>,
        ctx: &WriteContext,
    ) -> Result<Vec<Envelope>, StoreError> {
        let permit = self.db.checkout_owned().await?;
        if docs.is_empty() {
            return Ok(Vec::new());
        }
        // validate everything first
        let mut items = Vec::with_capacity(docs.len());
        for mut d in docs {
            let fresh_id = d.id.is_none();
            let id = d.resolve_id();
            let created_at = d.created_at;
            let payload = payload_doc(&d.into_payload_text(&id))?;
            items.push(BatchItem {
                text: stored_text(&payload),
                id,
                payload,
                created_at,
                fresh_id,
            });
        }
        let guards = self
            .w
            .lock_all(items.iter().filter(|i| !i.fresh_id).map(|i| i.id.as_str()))
            .await;
        let (w, ctx) = (self.w.clone(), ctx.clone());
        detached(async move {
            let _held = (permit, guards);
            w.create_many_locked(items, &ctx).await
        })
        .await
    }

    async fn update(
        &self,
        id: &str,
        doc: NewDocument,
        ctx: &WriteContext,
    ) -> Result<Option<Envelope>, StoreError> {
        let permit = self.db.checkout_owned().await?;
        let created_at = doc.created_at;
        let payload = payload_doc(&doc.into_payload_text(id))?;
        let guard = self.w.lock(id).await;
        let (w, id, ctx) = (self.w.clone(), id.to_owned(), ctx.clone());
        detached(async move {
            let _held = (permit, guard);
            w.update_locked(&id, payload, created_at, &ctx).await
        })
        .await
    }

    async fn remove(&self, id: &str, ctx: &WriteContext) -> Result<RemoveOutcome, StoreError> {
        let permit = self.db.checkout_owned().await?;
        self.remove_one(id, ctx, permit).await
    }

    async fn remove_many(
        &self,
        ids: &[String],
        ctx: &WriteContext,
    ) -> Result<Vec<(String, RemoveOutcome)>, StoreError> {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let permit = self.db.checkout_owned().await?;
            out.push((id.clone(), self.remove_one(id, ctx, permit).await?));
        }
        Ok(out)
    }
}
