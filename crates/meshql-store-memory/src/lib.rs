//! In-memory storage: the versioned envelope model held in a map, for tests and demos.
//! Nothing survives the process. Same semantics as every backend (the conformance suite runs
//! against it); query templates must be Mongo-style filters (SQL fragments need a SQL store).

mod settings;
pub use settings::{MemoryBackend, MemorySettings};

use async_trait::async_trait;
use meshql_core::auth::is_visible;
use meshql_core::template::TemplateKind;
use meshql_core::{
    now_millis, BoundArgs, ChangeOp, CommitSignal, Cursor, Envelope, KeyedRows, Millis,
    NewDocument, QueryTemplate, RemoveOutcome, Row, Store, StoreChange, StoreError, StoreStats,
    TokenFilter, WriteContext,
};
use meshql_core::{BatchSearch, ChangeFeed, ReadContext, Search, StoreReader, StoreWriter};
use parking_lot::RwLock;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Debug, Clone)]
struct Version {
    payload: String,
    parsed: Arc<Map<String, Value>>,
    created_at: Millis,
    deleted: bool,
    tokens: Vec<String>,
}

struct Data {
    /// Versions per id, oldest first; ordered by id for [`StoreReader::list_page`].
    docs: BTreeMap<String, Vec<Version>>,
    /// Ids in creation order.
    order: Vec<String>,
    /// Every version in commit order: the change feed (cursor = `(epoch, index + 1)`).
    feed: Vec<StoreChange>,
    /// When this store was made: nothing survives a restart, so its cursors start over, and
    /// a cursor from an earlier process (another epoch) reads the new feed from its start.
    epoch: u64,
}

impl Default for Data {
    fn default() -> Self {
        Self {
            docs: BTreeMap::new(),
            order: Vec::new(),
            feed: Vec::new(),
            epoch: now_millis().max(1) as u64,
        }
    }
}

impl Data {
    /// The version of `id` visible at `at` (latest when `None`), tombstones included.
    fn at(&self, id: &str, at: Option<Millis>) -> Option<&Version> {
        let versions = self.docs.get(id)?;
        match at {
            None => versions.last(),
            Some(at) => versions.iter().rev().find(|v| v.created_at <= at),
        }
    }

    fn visible(&self, id: &str, filter: &TokenFilter, at: Option<Millis>) -> Option<&Version> {
        self.at(id, at)
            .filter(|v| !v.deleted && is_visible(filter, &v.tokens))
    }

    fn append(
        &mut self,
        id: &str,
        mut v: Version,
        explicit_time: bool,
        correlation_id: Option<&str>,
    ) -> Envelope {
        let versions = self.docs.entry(id.to_owned()).or_default();
        let first = versions.is_empty();
        if first {
            self.order.push(id.to_owned());
        }
        let last = versions.last().map(|l| l.created_at);
        match last {
            Some(last) if !explicit_time || v.created_at >= last => {
                if v.created_at <= last {
                    v.created_at = last + 1;
                }
                versions.push(v.clone());
            }
            Some(_) => {
                // back-dated: keep (id, created_at) unique and the history ordered
                while versions.iter().any(|x| x.created_at == v.created_at) {
                    v.created_at += 1;
                }
                let pos = versions.partition_point(|x| x.created_at < v.created_at);
                versions.insert(pos, v.clone());
            }
            None => versions.push(v.clone()),
        }
        self.feed.push(StoreChange {
            cursor: Cursor(self.epoch, self.feed.len() as u64 + 1),
            id: id.to_owned(),
            created_at: v.created_at,
            op: ChangeOp::of_version(v.deleted, first),
            payload: v.payload.clone(),
            authorized_tokens: v.tokens.clone(),
            correlation_id: correlation_id.map(str::to_owned),
        });
        Envelope {
            id: id.to_owned(),
            payload: v.payload,
            created_at: v.created_at,
            deleted: v.deleted,
            authorized_tokens: v.tokens,
        }
    }
}

fn envelope(id: &str, v: &Version) -> Envelope {
    Envelope {
        id: id.to_owned(),
        payload: v.payload.clone(),
        created_at: v.created_at,
        deleted: v.deleted,
        authorized_tokens: v.tokens.clone(),
    }
}

/// One entity's documents in memory.
#[derive(Default)]
pub struct MemoryStore {
    data: RwLock<Data>,
    reads: AtomicU64,
    writes: AtomicU64,
    commits: AtomicU64,
    signal: CommitSignal,
    /// Processors' positions, state and dead letters (see `meshql_core::output`).
    outputs: parking_lot::Mutex<Outputs>,
    /// The store a rebuild writes (`OutputStore::rebuild_store`).
    rebuild: parking_lot::Mutex<Option<Arc<MemoryStore>>>,
}

/// What consumers committed with their outputs to this store.
#[derive(Default)]
struct Outputs {
    positions: std::collections::HashMap<String, u64>,
    /// Per consumer: key -> (group, value).
    state: std::collections::HashMap<String, BTreeMap<String, (Option<String>, String)>>,
    /// `(consumer, letter)` in commit order.
    dead: Vec<(String, meshql_core::DeadLetter)>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// The version a document becomes; every version of a write is made before any is
    /// applied, so a write that fails leaves the store as it was.
    fn version(
        mut doc: NewDocument,
        tokens: &[String],
    ) -> Result<(String, Version, bool), StoreError> {
        let id = doc.resolve_id();
        let explicit = doc.created_at.is_some();
        let created_at = doc.created_at.unwrap_or_else(now_millis);
        let parsed = {
            let mut p = doc.payload.clone();
            p.insert("id".into(), Value::String(id.clone()));
            Arc::new(p)
        };
        let payload = doc.into_payload_text(&id);
        meshql_core::fault::check(&payload)?;
        Ok((
            id,
            Version {
                payload,
                parsed,
                created_at,
                deleted: false,
                tokens: tokens.to_vec(),
            },
            explicit,
        ))
    }

    fn check(template: &QueryTemplate) -> Result<(), StoreError> {
        match template.kind {
            TemplateKind::Filter(_) | TemplateKind::Query(_) => Ok(()),
            TemplateKind::Sql(_) => Err(StoreError::Invalid(format!(
                "SQL fragment `{}` needs a SQL backend; the memory store takes JSON templates",
                template.source
            ))),
        }
    }

    fn remove_locked(data: &mut Data, id: &str, ctx: &WriteContext) -> RemoveOutcome {
        let Some(current) = data.at(id, None).cloned() else {
            return RemoveOutcome::NotFound;
        };
        if !is_visible(&ctx.filter, &current.tokens) {
            return RemoveOutcome::NotFound;
        }
        if current.deleted {
            return RemoveOutcome::AlreadyDeleted;
        }
        data.append(
            id,
            Version {
                deleted: true,
                created_at: now_millis(),
                ..current
            },
            false,
            ctx.correlation_id.as_deref(),
        );
        RemoveOutcome::Removed
    }
}

#[async_trait]
impl StoreReader for MemoryStore {
    async fn read(&self, id: &str, ctx: &ReadContext<'_>) -> Result<Option<Envelope>, StoreError> {
        let (filter, at) = (ctx.filter, ctx.at);
        self.reads.fetch_add(1, Ordering::Relaxed);
        Ok(self
            .data
            .read()
            .visible(id, filter, at)
            .map(|v| envelope(id, v)))
    }

    async fn read_many(
        &self,
        ids: &[String],
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Envelope>, StoreError> {
        let (filter, at) = (ctx.filter, ctx.at);
        self.reads.fetch_add(1, Ordering::Relaxed);
        let data = self.data.read();
        Ok(ids
            .iter()
            .filter_map(|id| data.visible(id, filter, at).map(|v| envelope(id, v)))
            .collect())
    }

    async fn list(&self, ctx: &ReadContext<'_>) -> Result<Vec<Envelope>, StoreError> {
        let (filter, at) = (ctx.filter, ctx.at);
        self.reads.fetch_add(1, Ordering::Relaxed);
        let data = self.data.read();
        Ok(data
            .order
            .iter()
            .filter_map(|id| data.visible(id, filter, at).map(|v| envelope(id, v)))
            .collect())
    }

    async fn list_page(
        &self,
        after: Option<&str>,
        limit: usize,
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Envelope>, StoreError> {
        use std::ops::Bound;
        let (filter, at) = (ctx.filter, ctx.at);
        self.reads.fetch_add(1, Ordering::Relaxed);
        let data = self.data.read();
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        Ok(data
            .docs
            .range::<str, _>((from, Bound::Unbounded))
            .filter_map(|(id, _)| data.visible(id, filter, at).map(|v| envelope(id, v)))
            .take(limit)
            .collect())
    }

    async fn versions(&self, id: &str) -> Result<Vec<Envelope>, StoreError> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        Ok(self
            .data
            .read()
            .docs
            .get(id)
            .map(|vs| vs.iter().map(|v| envelope(id, v)).collect())
            .unwrap_or_default())
    }

    async fn find(
        &self,
        search: &Search<'_>,
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Row>, StoreError> {
        let Search {
            template,
            args,
            limit,
            ..
        } = *search;
        let (filter, at) = (ctx.filter, ctx.at);
        Self::check(template)?;
        template
            .check_args(args)
            .map_err(|e| StoreError::Invalid(e.to_string()))?;
        self.reads.fetch_add(1, Ordering::Relaxed);
        let data = self.data.read();
        let matching = data.order.iter().filter_map(|id| {
            let v = data.visible(id, filter, at)?;
            template.matches(args, id, &v.parsed).then_some((id, v))
        });
        let row = |(id, v): (&String, &Version)| Row {
            id: id.clone(),
            payload: v.payload.clone(),
        };
        if template.sort().is_empty() {
            return Ok(matching
                .take(limit.unwrap_or(usize::MAX))
                .map(row)
                .collect());
        }
        let mut all: Vec<_> = matching.collect();
        template.sort_rows(&mut all, |(id, v)| (id.as_str(), &v.parsed));
        Ok(all
            .into_iter()
            .take(limit.unwrap_or(usize::MAX))
            .map(row)
            .collect())
    }

    async fn find_batch(
        &self,
        batch: &BatchSearch<'_>,
        ctx: &ReadContext<'_>,
    ) -> Result<KeyedRows, StoreError> {
        let BatchSearch {
            template,
            key_arg,
            keys,
        } = *batch;
        let (filter, at) = (ctx.filter, ctx.at);
        Self::check(template)?;
        self.reads.fetch_add(1, Ordering::Relaxed);
        let data = self.data.read();
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for key in keys {
            if !seen.insert(key) {
                continue;
            }
            let mut args = BoundArgs::new();
            args.insert(key_arg.to_owned(), Value::String(key.clone()));
            let mut matching: Vec<(&String, &Version)> = data
                .order
                .iter()
                .filter_map(|id| {
                    let v = data.visible(id, filter, at)?;
                    template.matches(&args, id, &v.parsed).then_some((id, v))
                })
                .collect();
            template.sort_rows(&mut matching, |(id, v)| (id.as_str(), &v.parsed));
            for (id, v) in matching {
                out.push((
                    key.clone(),
                    Row {
                        id: id.clone(),
                        payload: v.payload.clone(),
                    },
                ));
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl StoreWriter for MemoryStore {
    async fn import_versions(&self, versions: &[Envelope]) -> Result<u64, StoreError> {
        let mut prepared = Vec::with_capacity(versions.len());
        for v in versions {
            let mut parsed: serde_json::Map<String, Value> = serde_json::from_str(&v.payload)
                .map_err(|e| StoreError::Invalid(format!("payload of {}: {e}", v.id)))?;
            parsed.insert("id".into(), Value::String(v.id.clone()));
            let payload = Value::Object(parsed.clone()).to_string();
            prepared.push((
                v.id.clone(),
                Version {
                    payload,
                    parsed: Arc::new(parsed),
                    created_at: v.created_at,
                    deleted: v.deleted,
                    tokens: v.authorized_tokens.clone(),
                },
            ));
        }
        let mut data = self.data.write();
        let mut written = 0u64;
        for (id, v) in prepared {
            let stored = data
                .docs
                .get(&id)
                .is_some_and(|vs| vs.iter().any(|x| x.created_at == v.created_at));
            if !stored {
                data.append(&id, v, true, None);
                written += 1;
            }
        }
        drop(data);
        if written > 0 {
            self.writes.fetch_add(written, Ordering::Relaxed);
            self.commits.fetch_add(1, Ordering::Relaxed);
            self.signal.notify();
        }
        Ok(written)
    }

    async fn create(&self, doc: NewDocument, ctx: &WriteContext) -> Result<Envelope, StoreError> {
        let (id, v, explicit) = Self::version(doc, ctx.create_tokens())?;
        let env = self
            .data
            .write()
            .append(&id, v, explicit, ctx.correlation_id.as_deref());
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.signal.notify();
        Ok(env)
    }

    async fn create_many(
        &self,
        docs: Vec<NewDocument>,
        ctx: &WriteContext,
    ) -> Result<Vec<Envelope>, StoreError> {
        let versions: Vec<_> = docs
            .into_iter()
            .map(|d| Self::version(d, ctx.create_tokens()))
            .collect::<Result<_, _>>()?;
        let mut data = self.data.write();
        let envs: Vec<Envelope> = versions
            .into_iter()
            .map(|(id, v, explicit)| data.append(&id, v, explicit, ctx.correlation_id.as_deref()))
            .collect();
        drop(data);
        self.writes.fetch_add(envs.len() as u64, Ordering::Relaxed);
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.signal.notify();
        Ok(envs)
    }

    async fn update(
        &self,
        id: &str,
        mut doc: NewDocument,
        ctx: &WriteContext,
    ) -> Result<Option<Envelope>, StoreError> {
        doc.id = Some(id.to_owned());
        let mut data = self.data.write();
        let Some(current) = data.visible(id, &ctx.filter, None) else {
            return Ok(None);
        };
        let kept = current.tokens.clone();
        let (id, v, explicit) = Self::version(doc, ctx.tokens.as_deref().unwrap_or(&kept))?;
        let env = data.append(&id, v, explicit, ctx.correlation_id.as_deref());
        drop(data);
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.signal.notify();
        Ok(Some(env))
    }

    async fn remove(&self, id: &str, ctx: &WriteContext) -> Result<RemoveOutcome, StoreError> {
        let outcome = Self::remove_locked(&mut self.data.write(), id, ctx);
        if outcome == RemoveOutcome::Removed {
            self.writes.fetch_add(1, Ordering::Relaxed);
            self.commits.fetch_add(1, Ordering::Relaxed);
            self.signal.notify();
        }
        Ok(outcome)
    }

    async fn remove_many(
        &self,
        ids: &[String],
        ctx: &WriteContext,
    ) -> Result<Vec<(String, RemoveOutcome)>, StoreError> {
        let mut data = self.data.write();
        let outcomes: Vec<_> = ids
            .iter()
            .map(|id| (id.clone(), Self::remove_locked(&mut data, id, ctx)))
            .collect();
        drop(data);
        self.signal.notify();
        let removed = outcomes
            .iter()
            .filter(|(_, o)| *o == RemoveOutcome::Removed)
            .count() as u64;
        self.writes.fetch_add(removed, Ordering::Relaxed);
        self.commits.fetch_add(1, Ordering::Relaxed);
        Ok(outcomes)
    }
}

#[async_trait]
impl ChangeFeed for MemoryStore {
    async fn changes(&self, after: Cursor, limit: usize) -> Result<Vec<StoreChange>, StoreError> {
        let data = self.data.read();
        let start = if after.0 == data.epoch {
            usize::try_from(after.1)
                .unwrap_or(usize::MAX)
                .min(data.feed.len())
        } else {
            0
        };
        Ok(data.feed[start..].iter().take(limit).cloned().collect())
    }

    fn commit_signal(&self) -> Option<meshql_core::CommitReceiver> {
        Some(self.signal.subscribe())
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn prepare(&self, templates: &[QueryTemplate]) -> Result<(), StoreError> {
        templates.iter().try_for_each(Self::check)
    }

    async fn ready(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            reads: self.reads.load(Ordering::Relaxed),
            commits: self.commits.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            read_connections: None,
            connections_in_use: None,
            log: None,
        }
    }

    async fn shutdown(&self) {}
}

/// The in-memory "database": every table is a fresh [`MemoryStore`].
#[derive(Debug, Default, Clone, Copy)]
pub struct MemoryDatabase;

#[async_trait]
impl meshql_core::Database for MemoryDatabase {
    fn backend(&self) -> &'static str {
        "memory"
    }
    fn store(self: Arc<Self>, _table: &str) -> meshql_core::DynStore {
        Arc::new(MemoryStore::new())
    }
    async fn close(&self) {}
}

#[async_trait]
impl meshql_core::OutputStore for MemoryStore {
    fn supports_outputs(&self) -> bool {
        true
    }

    async fn output_position(&self, consumer: &str) -> Result<Option<u64>, StoreError> {
        Ok(self.outputs.lock().positions.get(consumer).copied())
    }

    async fn output_state(
        &self,
        consumer: &str,
        keys: &[String],
    ) -> Result<std::collections::HashMap<String, String>, StoreError> {
        let outputs = self.outputs.lock();
        let Some(rows) = outputs.state.get(consumer) else {
            return Ok(Default::default());
        };
        Ok(keys
            .iter()
            .filter_map(|k| rows.get(k).map(|(_, v)| (k.clone(), v.clone())))
            .collect())
    }

    async fn output_group(
        &self,
        consumer: &str,
        group: &str,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let outputs = self.outputs.lock();
        Ok(outputs
            .state
            .get(consumer)
            .map(|rows| {
                rows.iter()
                    .filter(|(_, (g, _))| g.as_deref() == Some(group))
                    .map(|(k, (_, v))| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn apply_output(
        &self,
        batch: meshql_core::OutputBatch,
        ctx: &WriteContext,
    ) -> Result<Vec<Envelope>, StoreError> {
        use meshql_core::OutputWrite;
        // every version is made (and checked) before anything is applied: all or nothing
        let mut data = self.data.write();
        let mut planned = Vec::with_capacity(batch.writes.len());
        for write in batch.writes {
            match write {
                OutputWrite::Put { id, payload } => {
                    let map: Map<String, Value> = serde_json::from_str(&payload)
                        .map_err(|e| StoreError::Invalid(format!("output payload: {e}")))?;
                    let kept = data
                        .at(&id, None)
                        .filter(|v| !v.deleted)
                        .map(|v| v.tokens.clone());
                    let tokens = ctx.tokens.clone().or(kept).unwrap_or_default();
                    let (id, v, explicit) = Self::version(NewDocument::with_id(id, map), &tokens)?;
                    planned.push((id, Some(v), explicit));
                }
                OutputWrite::Delete { id } => planned.push((id, None, false)),
            }
        }
        let mut outputs = self.outputs.lock();
        let mut written = Vec::with_capacity(planned.len());
        for (id, version, explicit) in planned {
            match version {
                Some(v) => {
                    written.push(data.append(&id, v, explicit, ctx.correlation_id.as_deref()))
                }
                None => {
                    let system = WriteContext {
                        filter: TokenFilter::All,
                        ..ctx.clone()
                    };
                    if Self::remove_locked(&mut data, &id, &system) == RemoveOutcome::Removed {
                        if let Some(v) = data.at(&id, None) {
                            written.push(envelope(&id, v));
                        }
                    }
                }
            }
        }
        let rows = outputs.state.entry(batch.consumer.clone()).or_default();
        for s in batch.state {
            match s.value {
                Some(v) => {
                    rows.insert(s.key, (s.group, v));
                }
                None => {
                    rows.remove(&s.key);
                }
            }
        }
        for letter in batch.dead_letters {
            outputs.dead.push((batch.consumer.clone(), letter));
        }
        outputs.positions.insert(batch.consumer, batch.position);
        drop(outputs);
        drop(data);
        self.writes
            .fetch_add(written.len() as u64, Ordering::Relaxed);
        self.commits.fetch_add(1, Ordering::Relaxed);
        if !written.is_empty() {
            self.signal.notify();
        }
        Ok(written)
    }

    async fn dead_letters(
        &self,
        consumer: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, meshql_core::DeadLetter)>, StoreError> {
        let outputs = self.outputs.lock();
        Ok(outputs
            .dead
            .iter()
            .rev()
            .filter(|(c, _)| consumer.is_none_or(|want| c == want))
            .take(limit)
            .cloned()
            .collect())
    }

    async fn dead_letter_count(&self, consumer: &str) -> Result<u64, StoreError> {
        let outputs = self.outputs.lock();
        Ok(outputs.dead.iter().filter(|(c, _)| c == consumer).count() as u64)
    }

    async fn rebuild_store(&self) -> Result<meshql_core::DynStore, StoreError> {
        let fresh = Arc::new(MemoryStore::new());
        *self.rebuild.lock() = Some(fresh.clone());
        Ok(fresh)
    }

    async fn swap_rebuilt(&self, from: &str, to: &str) -> Result<(), StoreError> {
        let Some(rebuilt) = self.rebuild.lock().take() else {
            return Err(StoreError::Invalid("no rebuild to swap in".into()));
        };
        let mut data = self.data.write();
        let mut outputs = self.outputs.lock();
        let new = rebuilt.data.read();
        data.docs = new.docs.clone();
        data.order = new.order.clone();
        let mut theirs = rebuilt.outputs.lock();
        outputs.positions.remove(to);
        outputs.state.remove(to);
        outputs.dead.retain(|(c, _)| c != to);
        if let Some(p) = theirs.positions.remove(from) {
            outputs.positions.insert(to.to_owned(), p);
        }
        if let Some(rows) = theirs.state.remove(from) {
            outputs.state.insert(to.to_owned(), rows);
        }
        for (c, letter) in theirs.dead.drain(..) {
            if c == from {
                outputs.dead.push((to.to_owned(), letter));
            }
        }
        Ok(())
    }

    async fn reset_output(&self, consumer: &str) -> Result<(), StoreError> {
        let mut outputs = self.outputs.lock();
        outputs.positions.remove(consumer);
        outputs.state.remove(consumer);
        outputs.dead.retain(|(c, _)| c != consumer);
        Ok(())
    }
}
