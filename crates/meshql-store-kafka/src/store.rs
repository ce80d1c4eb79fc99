//! The store of one entity on Kafka: reads from the local materialisation (the SQLite
//! backend's store over this process's file), writes produced to the entity's topic and
//! acknowledged once applied here ([`crate::produce`]).
//!
//! An update or a delete is checked against the materialisation before it is produced: the
//! id must have a current version the caller may see (else `None` / `NotFound`, nothing is
//! produced), a delete of a tombstone is `AlreadyDeleted`. Since this process has applied
//! every write it acknowledged, its own writes are always seen; a write of another process
//! that is not applied here yet is not, and two processes writing one document at once both
//! succeed: the later offset is the current version (what one process does with concurrent
//! writes of one id too). A bulk write is one Kafka transaction: all or nothing.

use crate::applied::Applied;
use crate::database::KafkaDatabase;
use crate::health::Health;
use crate::produce::Writer;
use async_trait::async_trait;
use meshql_core::{
    now_millis, BatchSearch, ChangeFeed, Cursor, Envelope, KeyedRows, LogLag, Millis, Nested,
    NestedRow, NewDocument, OutputStore, QueryTemplate, ReadContext, Relation, RemoveOutcome, Row,
    Search, Store, StoreChange, StoreError, StoreReader, StoreStats, StoreWriter, WriteContext,
};
use meshql_store_sqlite::{LogVersion, SqliteStore};
use std::sync::{Arc, OnceLock};
use tokio::sync::watch;

/// How often a store whose brokers could not be reached at start tries again.
const START_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// One entity's store.
pub struct KafkaStore {
    database: Arc<KafkaDatabase>,
    topic: String,
    local: Arc<SqliteStore>,
    /// Set by [`Store::prepare`] (or, when the brokers could not be reached at start, by its
    /// retries): the writer and what the materialiser has applied.
    running: Arc<OnceLock<Running>>,
    /// Set when [`Store::prepare`] could not reach the brokers and this process's copy was
    /// served as it was: when the copy was last written.
    degraded: OnceLock<std::time::SystemTime>,
}

struct Running {
    writer: Writer,
    applied: watch::Receiver<Applied>,
    health: Arc<Health>,
}

impl KafkaStore {
    pub(crate) fn new(database: Arc<KafkaDatabase>, table: &str) -> Self {
        let local = Arc::new(SqliteStore::new(database.local(), table));
        KafkaStore {
            topic: database.storage().topic_of(table),
            database,
            local,
            running: Arc::default(),
            degraded: OnceLock::new(),
        }
    }

    /// Starts the topic in the background, once a second (a probe at most every few seconds)
    /// until the brokers answer.
    fn start_later(&self) {
        let (database, topic, local) = (
            self.database.clone(),
            self.topic.clone(),
            self.local.clone(),
        );
        let running = self.running.clone();
        let mut stop = database.stopped();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(START_RETRY) => {}
                    _ = stop.changed() => return,
                }
                // a quick probe first: a start with the brokers away waits out the admin
                // requests' timeout
                if !database.reachable().await {
                    continue;
                }
                match database.start(&topic, local.clone()).await {
                    Ok((writer, applied, health)) => {
                        tracing::info!(
                            topic,
                            "kafka store: the brokers answer; writes are accepted again"
                        );
                        let _ = running.set(Running {
                            writer,
                            applied,
                            health,
                        });
                        return;
                    }
                    Err(e) => tracing::debug!(topic, error = %e, "kafka store: not started yet"),
                }
            }
        });
    }

    /// The entity's topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// What the materialiser has applied (`None` before [`Store::prepare`]).
    pub fn applied(&self) -> Option<Applied> {
        self.running.get().map(|r| r.applied.borrow().clone())
    }

    fn writer(&self) -> Result<&Writer, StoreError> {
        self.running.get().map(|r| &r.writer).ok_or_else(|| {
            StoreError::Unavailable(if self.degraded.get().is_some() {
                format!(
                    "kafka: no broker of {} could be reached since this process started",
                    self.topic
                )
            } else {
                format!("kafka: {} is not started", self.topic)
            })
        })
    }

    /// While the copy is served without the brokers: how old it is, in ms (since its file
    /// was last written).
    fn degraded_ms(&self) -> u64 {
        self.degraded
            .get()
            .and_then(|t| t.elapsed().ok())
            .map_or(0, |d| d.as_millis() as u64)
    }

    /// The newest version of `id` (a tombstone included) if the caller may see it.
    fn current(&self, id: &str, ctx: &WriteContext) -> Result<Option<Envelope>, StoreError> {
        Ok(self
            .local
            .current_version(id)?
            .filter(|c| meshql_core::auth::is_visible(&ctx.filter, &c.authorized_tokens)))
    }

    /// A version of `id` written "now" or at the caller's time, after `current`.
    fn version(
        id: String,
        payload: String,
        requested: Option<Millis>,
        current: Option<Millis>,
        deleted: bool,
        tokens: Vec<String>,
        ctx: &WriteContext,
    ) -> LogVersion {
        // the materialisation places a version stamped now 1 ms after the current one when
        // the clock has not moved on: stamped so here, the answer is what is stored
        let created_at = requested.unwrap_or_else(|| {
            let now = now_millis();
            current.map_or(now, |c| now.max(c + 1))
        });
        LogVersion {
            envelope: Envelope {
                id,
                payload,
                created_at,
                deleted,
                authorized_tokens: tokens,
            },
            requested: requested.is_some(),
            correlation_id: ctx.correlation_id.clone(),
        }
    }

    /// The tombstone of a visible, live current version; the outcome otherwise.
    fn tombstone(
        &self,
        id: &str,
        ctx: &WriteContext,
    ) -> Result<Result<LogVersion, RemoveOutcome>, StoreError> {
        Ok(match self.current(id, ctx)? {
            None => Err(RemoveOutcome::NotFound),
            Some(cur) if cur.deleted => Err(RemoveOutcome::AlreadyDeleted),
            Some(cur) => Ok(Self::version(
                id.to_owned(),
                cur.payload,
                None,
                Some(cur.created_at),
                true,
                cur.authorized_tokens,
                ctx,
            )),
        })
    }
}

#[async_trait]
impl StoreReader for KafkaStore {
    async fn read(&self, id: &str, ctx: &ReadContext<'_>) -> Result<Option<Envelope>, StoreError> {
        self.local.read(id, ctx).await
    }

    async fn read_many(
        &self,
        ids: &[String],
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Envelope>, StoreError> {
        self.local.read_many(ids, ctx).await
    }

    async fn list(&self, ctx: &ReadContext<'_>) -> Result<Vec<Envelope>, StoreError> {
        self.local.list(ctx).await
    }

    async fn list_page(
        &self,
        after: Option<&str>,
        limit: usize,
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Envelope>, StoreError> {
        self.local.list_page(after, limit, ctx).await
    }

    async fn versions(&self, id: &str) -> Result<Vec<Envelope>, StoreError> {
        self.local.versions(id).await
    }

    async fn find(
        &self,
        search: &Search<'_>,
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Row>, StoreError> {
        self.local.find(search, ctx).await
    }

    async fn find_batch(
        &self,
        batch: &BatchSearch<'_>,
        ctx: &ReadContext<'_>,
    ) -> Result<KeyedRows, StoreError> {
        self.local.find_batch(batch, ctx).await
    }

    async fn find_nested(
        &self,
        search: &Search<'_>,
        nested: &[Nested],
        ctx: &ReadContext<'_>,
    ) -> Result<Option<Vec<NestedRow>>, StoreError> {
        self.local.find_nested(search, nested, ctx).await
    }

    fn relation(&self) -> Option<Relation> {
        self.local.relation()
    }

    async fn has_version(&self, id: &str, stamp: Millis) -> Result<bool, StoreError> {
        self.local.has_version(id, stamp).await
    }
}

#[async_trait]
impl StoreWriter for KafkaStore {
    /// Each version not in the materialisation yet is produced with its own time (placed as
    /// a back-dated write is); the materialisation applies them before this returns, so an
    /// import run again finds them and writes nothing.
    async fn import_versions(&self, versions: &[Envelope]) -> Result<u64, StoreError> {
        let writer = self.writer()?;
        let mut out: Vec<LogVersion> = Vec::with_capacity(versions.len());
        for v in versions {
            let stored = self
                .local
                .versions(&v.id)
                .await?
                .iter()
                .any(|x| x.created_at == v.created_at);
            let queued = out
                .iter()
                .any(|x| x.envelope.id == v.id && x.envelope.created_at == v.created_at);
            if stored || queued {
                continue;
            }
            let mut envelope = v.clone();
            envelope.payload = meshql_core::payload_with_id(&v.id, &v.payload)?;
            out.push(LogVersion {
                envelope,
                requested: true,
                correlation_id: None,
            });
        }
        if !out.is_empty() {
            writer.write_all(&out).await?;
        }
        Ok(out.len() as u64)
    }

    async fn create(
        &self,
        mut doc: NewDocument,
        ctx: &WriteContext,
    ) -> Result<Envelope, StoreError> {
        let writer = self.writer()?;
        let fresh = doc.id.is_none();
        let id = doc.resolve_id();
        // a given id may have versions: the new one goes after them
        let current = if fresh {
            None
        } else {
            self.local.current_version(&id)?.map(|c| c.created_at)
        };
        let requested = doc.created_at;
        let payload = doc.into_payload_text(&id);
        let version = Self::version(
            id,
            payload,
            requested,
            current,
            false,
            ctx.create_tokens().to_vec(),
            ctx,
        );
        writer.write(&version).await?;
        Ok(version.envelope)
    }

    async fn create_many(
        &self,
        docs: Vec<NewDocument>,
        ctx: &WriteContext,
    ) -> Result<Vec<Envelope>, StoreError> {
        let writer = self.writer()?;
        let tokens = ctx.create_tokens().to_vec();
        let mut versions = Vec::with_capacity(docs.len());
        for mut doc in docs {
            let fresh = doc.id.is_none();
            let id = doc.resolve_id();
            let current = if fresh {
                None
            } else {
                self.local.current_version(&id)?.map(|c| c.created_at)
            };
            let requested = doc.created_at;
            let payload = doc.into_payload_text(&id);
            versions.push(Self::version(
                id,
                payload,
                requested,
                current,
                false,
                tokens.clone(),
                ctx,
            ));
        }
        writer.write_all(&versions).await?;
        Ok(versions.into_iter().map(|v| v.envelope).collect())
    }

    async fn update(
        &self,
        id: &str,
        doc: NewDocument,
        ctx: &WriteContext,
    ) -> Result<Option<Envelope>, StoreError> {
        let writer = self.writer()?;
        let Some(cur) = self.current(id, ctx)?.filter(|c| !c.deleted) else {
            return Ok(None);
        };
        let requested = doc.created_at;
        let payload = doc.into_payload_text(id);
        let tokens = ctx.tokens.clone().unwrap_or(cur.authorized_tokens);
        let version = Self::version(
            id.to_owned(),
            payload,
            requested,
            Some(cur.created_at),
            false,
            tokens,
            ctx,
        );
        writer.write(&version).await?;
        Ok(Some(version.envelope))
    }

    async fn remove(&self, id: &str, ctx: &WriteContext) -> Result<RemoveOutcome, StoreError> {
        let writer = self.writer()?;
        match self.tombstone(id, ctx)? {
            Ok(version) => {
                writer.write(&version).await?;
                Ok(RemoveOutcome::Removed)
            }
            Err(outcome) => Ok(outcome),
        }
    }

    async fn remove_many(
        &self,
        ids: &[String],
        ctx: &WriteContext,
    ) -> Result<Vec<(String, RemoveOutcome)>, StoreError> {
        let writer = self.writer()?;
        let mut outcomes = Vec::with_capacity(ids.len());
        let mut tombstones: Vec<LogVersion> = Vec::new();
        for id in ids {
            // an id named twice is removed once
            if tombstones.iter().any(|t| &t.envelope.id == id) {
                outcomes.push((id.clone(), RemoveOutcome::AlreadyDeleted));
                continue;
            }
            match self.tombstone(id, ctx)? {
                Ok(t) => {
                    tombstones.push(t);
                    outcomes.push((id.clone(), RemoveOutcome::Removed));
                }
                Err(o) => outcomes.push((id.clone(), o)),
            }
        }
        writer.write_all(&tombstones).await?;
        Ok(outcomes)
    }
}

#[async_trait]
impl ChangeFeed for KafkaStore {
    async fn changes(&self, after: Cursor, limit: usize) -> Result<Vec<StoreChange>, StoreError> {
        self.local.changes(after, limit).await
    }

    fn commit_signal(&self) -> Option<meshql_core::CommitReceiver> {
        self.local.commit_signal()
    }
}

/// Processor outputs are not written to a Kafka entity (the default refusal): they would need
/// the outputs and the processor's input position in one Kafka transaction. Projections of a
/// Kafka-stored model live in a local store of each process instead, computed from the log
/// every process reads in full (the crate docs; examples/egg-economy-kafka).
impl OutputStore for KafkaStore {}

#[async_trait]
impl Store for KafkaStore {
    async fn prepare(&self, templates: &[QueryTemplate]) -> Result<(), StoreError> {
        self.local.prepare(templates).await?;
        if self.running.get().is_some() || self.degraded.get().is_some() {
            return Ok(());
        }
        let started = if self.database.reachable().await {
            self.database.start(&self.topic, self.local.clone()).await
        } else {
            Err(StoreError::Unavailable(format!(
                "kafka: no broker of {} answers ({})",
                self.topic,
                self.database.storage().brokers
            )))
        };
        match started {
            Ok((writer, applied, health)) => {
                let _ = self.running.set(Running {
                    writer,
                    applied,
                    health,
                });
                Ok(())
            }
            // a copy this process made before is served while the brokers are away
            Err(StoreError::Unavailable(why))
                if crate::materialise::was_started(&self.local, &self.topic).await? =>
            {
                let written = self.database.last_written();
                tracing::warn!(topic = self.topic, reason = %why,
                    "kafka store: the brokers cannot be reached; reads are served from this \
                     process's copy as it was, writes fail until they can");
                let _ = self.degraded.set(written);
                self.start_later();
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    async fn ready(&self) -> Result<(), StoreError> {
        self.local.ready().await?;
        self.database.health(&self.topic)?;
        if self.running.get().is_none() && self.degraded.get().is_some() {
            return Err(StoreError::Unavailable(format!(
                "kafka: no broker of {} could be reached since this process started: writes \
                 fail; reads are served from its copy, which may miss writes of the last {} ms",
                self.topic,
                self.degraded_ms()
            )));
        }
        if let Some(r) = self.running.get() {
            if !r.health.brokers().reachable() {
                return Err(StoreError::Unavailable(format!(
                    "kafka: no broker of {} is reachable: writes fail; reads are served from \
                     this process's copy, which may miss writes of the last {} ms",
                    self.topic,
                    r.health.behind_ms()
                )));
            }
        }
        match self.applied().and_then(|a| a.stalled) {
            Some(why) => Err(StoreError::Unavailable(format!(
                "kafka: {} is not being applied: {why}",
                self.topic
            ))),
            None => Ok(()),
        }
    }

    fn stats(&self) -> StoreStats {
        let mut stats = self.local.stats();
        if let Some(r) = self.running.get() {
            stats.log = Some(LogLag {
                behind_ms: r.health.behind_ms(),
                records_behind: r.health.records_behind(),
                skipped: r.applied.borrow().skipped,
                reachable: r.health.brokers().reachable(),
            });
        } else if self.degraded.get().is_some() {
            stats.log = Some(LogLag {
                behind_ms: self.degraded_ms(),
                records_behind: 0,
                skipped: 0,
                reachable: false,
            });
        }
        stats
    }

    async fn shutdown(&self) {
        self.database.stop();
    }
}
