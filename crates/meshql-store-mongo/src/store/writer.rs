//! [`Writer`]: what a store's writes share, and how one version is appended: the id's current
//! version, its place in time and in the feed, the insert, then the `latest` flags settled;
//! an update and a remove as such an append. The locks are in `locks.rs`, a `create_many` in
//! `batch.rs`.

use crate::document::stored_text;
use crate::error::{error, is_duplicate_key};
use crate::feed::Feed;
use meshql_core::{
    now_millis, CommitSignal, Envelope, Millis, Placement, RemoveOutcome, StoreError, WriteContext,
};
use mongodb::bson::{doc, oid::ObjectId, DateTime, Document};
use mongodb::Collection;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;

/// What writes share. Once a write holds the locks of its ids it runs in a task of its own
/// ([`detached`]) to the end: stored (and in the feed), or failed and undone, even should its
/// caller go away meanwhile (a cancelled request drops its future). Without that, an insert
/// already sent could land after the compensation meant to remove it.
pub(super) struct Writer {
    pub(super) coll: Collection<Document>,
    pub(super) feed: Arc<Feed>,
    pub(super) locks: Vec<Arc<Mutex<()>>>,
    pub(super) signal: CommitSignal,
    pub(super) writes: AtomicU64,
    pub(super) commits: AtomicU64,
}

/// Runs a write in its own task, to the end whatever becomes of the caller (see [`Writer`]).
pub(super) async fn detached<T: Send + 'static>(
    write: impl Future<Output = Result<T, StoreError>> + Send + 'static,
) -> Result<T, StoreError> {
    match tokio::spawn(write).await {
        Ok(result) => result,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(StoreError::Unavailable(
            "the write was cancelled: the runtime is shutting down".into(),
        )),
    }
}

/// See [`Writer::supersede`].
async fn settle_latest(
    coll: &Collection<Document>,
    id: &str,
    oid: ObjectId,
    stamp: Millis,
) -> Result<(), mongodb::error::Error> {
    coll.update_many(
        doc! {
            "id": id,
            "latest": true,
            "_id": {"$ne": oid},
            "created_at": {"$lt": DateTime::from_millis(stamp)},
        },
        doc! {"$set": {"latest": false}},
    )
    .await?;
    let newer = coll
        .find_one(doc! {"id": id, "created_at": {"$gt": DateTime::from_millis(stamp)}})
        .projection(doc! {"_id": 1})
        .await?;
    if newer.is_some() {
        coll.update_one(doc! {"_id": oid}, doc! {"$set": {"latest": false}})
            .await?;
    }
    Ok(())
}

pub(super) struct Current {
    payload: Document,
    pub(super) created_at: Millis,
    deleted: bool,
    tokens: Vec<String>,
    pub(super) seq: ObjectId,
}

/// A version about to be appended by a single write.
pub(super) struct NewVersion<'a> {
    pub(super) id: &'a str,
    pub(super) payload: Document,
    pub(super) created_at: Option<Millis>,
    pub(super) deleted: bool,
    pub(super) tokens: &'a [String],
    /// The id was generated for this write, so no earlier version can exist.
    pub(super) fresh_id: bool,
    pub(super) correlation_id: Option<&'a str>,
}

impl Writer {
    /// Counts a committed write of `versions` versions and wakes the feed's tailers.
    pub(super) fn committed(&self, versions: u64) {
        self.writes.fetch_add(versions, Ordering::Relaxed);
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.signal.notify();
    }

    pub(super) async fn current(&self, id: &str) -> Result<Option<Current>, StoreError> {
        let d = self
            .coll
            .find_one(doc! {"id": id, "latest": true})
            .sort(doc! {"created_at": -1})
            .await
            .map_err(error)?;
        Ok(d.map(|d| Current {
            payload: d.get_document("payload").cloned().unwrap_or_default(),
            created_at: crate::document::created_at(&d),
            deleted: d.get_bool("deleted").unwrap_or(false),
            tokens: crate::document::tokens(&d),
            seq: d.get_object_id("seq").unwrap_or_default(),
        }))
    }

    pub(super) async fn version_at(&self, id: &str, stamp: Millis) -> Result<bool, StoreError> {
        Ok(self
            .coll
            .find_one(doc! {"id": id, "created_at": DateTime::from_millis(stamp)})
            .projection(doc! {"_id": 1})
            .await
            .map_err(error)?
            .is_some())
    }

    /// Appends a version (the caller holds the id's lock unless the id is fresh).
    pub(super) async fn append(&self, v: NewVersion<'_>) -> Result<Envelope, StoreError> {
        let NewVersion {
            id,
            payload,
            created_at,
            deleted,
            tokens,
            fresh_id,
            correlation_id,
        } = v;
        let current = if fresh_id {
            None
        } else {
            self.current(id).await?
        };
        let cur_time = current.as_ref().map(|c| c.created_at);
        let mut place = Placement::new(created_at, cur_time, now_millis());
        if place.check_collisions {
            let mut stamp = place.stamp;
            while self.version_at(id, stamp).await? {
                stamp += 1;
            }
            place = place.settle(stamp, cur_time);
        }
        let (mut stamp, is_latest) = (place.stamp, place.latest);
        let oid = ObjectId::new();
        let seq = current.as_ref().map(|c| c.seq).unwrap_or(oid);
        let text = stored_text(&payload);
        // The version's place in the change feed, drawn before the insert (see `feed`).
        let mut hold = self.feed.draw(1).await?;
        let mut version = doc! {
            "_id": oid,
            "id": id,
            "payload": payload,
            "created_at": DateTime::from_millis(stamp),
            "deleted": deleted,
            "authorized_tokens": tokens.to_vec(),
            "latest": is_latest,
            "seq": seq,
            "pos": hold.first() as i64,
        };
        if let Some(c) = correlation_id {
            version.insert("correlation_id", c);
        }
        if let Err(e) = meshql_core::fault::check(&text) {
            hold.abandon(false).await;
            return Err(e);
        }
        hold.will_insert(vec![oid]);
        // The insert is the commit point. Another process may have taken this millisecond
        // for the same id (unique {id, created_at}): a server-stamped version moves on. Or,
        // on FerretDB, another client may have drawn the same position (unique `pos`): the
        // version draws again. FerretDB does not say which index refused the insert, so the
        // position is looked up.
        let mut attempts = 0;
        loop {
            let e = match self.coll.insert_one(&version).await {
                Ok(_) => break,
                Err(e) => e,
            };
            if is_duplicate_key(&e) && attempts < 8 {
                attempts += 1;
                let taken = match self.feed.taken_by_other(hold.first(), oid).await {
                    Ok(taken) => taken,
                    Err(lookup) => {
                        hold.abandon(false).await;
                        return Err(lookup);
                    }
                };
                if taken {
                    let fresh = match self.feed.draw(1).await {
                        Ok(fresh) => fresh,
                        Err(draw) => {
                            hold.taken();
                            return Err(draw);
                        }
                    };
                    std::mem::replace(&mut hold, fresh).taken();
                    hold.will_insert(vec![oid]);
                    version.insert("pos", hold.first() as i64);
                    continue;
                }
                if created_at.is_none() {
                    stamp += 1;
                    version.insert("created_at", DateTime::from_millis(stamp));
                    continue;
                }
            }
            // whether the server applied the insert is not always known (an I/O error, a
            // retried write): the version is deleted by its `_id` should it be there
            hold.abandon(true).await;
            return Err(error(e));
        }
        hold.stored();
        // A server-generated id has no other version to supersede.
        if is_latest && !fresh_id {
            self.supersede(id, oid, stamp).await;
        }
        Ok(Envelope {
            id: id.to_owned(),
            payload: text,
            created_at: stamp,
            deleted,
            authorized_tokens: tokens.to_vec(),
        })
    }

    /// Leaves the version `oid` (stamped `stamp`) flagged `latest` only if it is the newest
    /// of `id`: clears the flag of every older version (one statement, so a stale flag left
    /// by an earlier failure goes too), then, should a newer version exist (another process
    /// inserted one while this write's stamp was being chosen), clears its own. Each step is
    /// a single-document-atomic operation, and whichever of two concurrent writers inserts
    /// last sees the other's version, so they end with exactly the newer one flagged.
    ///
    /// The new version is already stored, so a failure here does not fail the write: readers
    /// keep the newest of several flagged versions, and the flags are fixed in the background.
    pub(super) async fn supersede(&self, id: &str, oid: ObjectId, stamp: Millis) {
        if let Err(e) = settle_latest(&self.coll, id, oid, stamp).await {
            tracing::warn!(id, error = %e, "MongoDB: version stored, settling the `latest` flags failed; retrying in the background");
            let (coll, id) = (self.coll.clone(), id.to_owned());
            tokio::spawn(async move {
                for _ in 0..600 {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    if settle_latest(&coll, &id, oid, stamp).await.is_ok() {
                        return;
                    }
                }
                tracing::error!(id, "MongoDB: gave up settling `latest` flags after 10 minutes; the next write of the id settles them");
            });
        }
    }

    /// Removes `id` (the caller holds its lock).
    pub(super) async fn remove_locked(
        &self,
        id: &str,
        ctx: &WriteContext,
    ) -> Result<RemoveOutcome, StoreError> {
        match self.current(id).await? {
            None => Ok(RemoveOutcome::NotFound),
            Some(cur) if !meshql_core::auth::is_visible(&ctx.filter, &cur.tokens) => {
                Ok(RemoveOutcome::NotFound)
            }
            Some(cur) if cur.deleted => Ok(RemoveOutcome::AlreadyDeleted),
            Some(cur) => {
                self.append(NewVersion {
                    id,
                    payload: cur.payload,
                    created_at: None,
                    deleted: true,
                    tokens: &cur.tokens,
                    fresh_id: false,
                    correlation_id: ctx.correlation_id.as_deref(),
                })
                .await?;
                self.committed(1);
                Ok(RemoveOutcome::Removed)
            }
        }
    }

    /// Appends a version of `id` if a current version visible to the writer exists (the
    /// caller holds the id's lock).
    pub(super) async fn update_locked(
        &self,
        id: &str,
        payload: Document,
        created_at: Option<Millis>,
        ctx: &WriteContext,
    ) -> Result<Option<Envelope>, StoreError> {
        let Some(cur) = self.current(id).await? else {
            return Ok(None);
        };
        if cur.deleted || !meshql_core::auth::is_visible(&ctx.filter, &cur.tokens) {
            return Ok(None);
        }
        let tokens = ctx.tokens.clone().unwrap_or(cur.tokens);
        let env = self
            .append(NewVersion {
                id,
                payload,
                created_at,
                deleted: false,
                tokens: &tokens,
                fresh_id: false,
                correlation_id: ctx.correlation_id.as_deref(),
            })
            .await?;
        self.committed(1);
        Ok(Some(env))
    }
}
