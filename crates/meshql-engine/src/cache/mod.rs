//! A read cache that is never stale: in process (moka), or shared by several processes
//! (a [`SharedCache`] such as Redis).
//!
//! **Read-through, invalidated by generation.** Every answer is cached with the generations
//! of the tags it depends on ([`tags`]: its entity, or for a read by id its document) as they
//! were *before* the store was read. Every write advances its tags after the store committed
//! it and before the engine acknowledges it ([`Cache::invalidate`]); writes by other processes
//! advance them when the change feed brings them ([`Cache::invalidated`]), or, with a shared
//! cache, in the shared cache itself before they are acknowledged. A cached answer is used only
//! while its tags are still at the generations it was read under, so an answer read before a
//! write — even one stored after the write advanced its tags — is never served after it.
//!
//! **Latest and past reads.** A read without `at`, or at a recent moment (a GraphQL request's
//! snapshot), is a read of the latest state: cached without the moment, valid for any later
//! moment until its tags advance. An answer read as of `t` is kept only when no write newer
//! than `t` is known to its tags, and serves reads as of `t` or later. A read at a moment older
//! than `settle` cannot change any more (writes are stamped with the time they are made): it is
//! cached under its moment, without tags, until it expires.
//!
//! **Replicas.** In front of a replica the cache keeps an answer only when the replica is known
//! to have applied every write its tags have seen ([`meshql_core::StoreReader::applied_through`]):
//! otherwise a read just after a write could store the replica's older answer under the new
//! generation. "Seen" is when the tags were last advanced, after the writes committed, not the
//! writes' stamps: a write is stamped before its transaction commits, and a replica that has
//! applied every commit up to a moment after the stamp may not have this one.
//!
//! **A shared cache that rarely hits** is consulted by a sample of the reads only ([`worth`]):
//! its round trip costs every read, and saves only the reads that hit.
//!
//! **A shared cache that fails** (down, slow past its timeout) is skipped: reads go to the
//! store with no error to the client, logged once. A write whose tags could not be advanced in
//! it leaves the process reading around it until it answers again; then the shared epoch (a tag
//! of every answer) is advanced, so nothing cached before the gap is served after it.

mod key;
mod reader;
pub mod tags;
mod worth;

pub use reader::CachedReader;
pub use tags::{TagRef, TagState, Tags};

use async_trait::async_trait;
use meshql_core::{Envelope, KeyedRows, Millis, NestedRow, Row};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How a cache is bounded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CacheSettings {
    /// The in-process cache's size (the answers' payload bytes, approximately).
    pub max_bytes: u64,
    /// How long an answer is kept at most.
    pub ttl: Duration,
    /// Reads as of a moment at least this old are immutable.
    pub settle: Duration,
    /// A shared cache is consulted by every read of an operation only while at least this
    /// share of them hit (0: always); below it, by one read in 32 ([`worth`]).
    pub min_hit_rate: f64,
}

impl Default for CacheSettings {
    fn default() -> Self {
        CacheSettings {
            max_bytes: 64 << 20,
            ttl: Duration::from_secs(300),
            settle: Duration::from_secs(5),
            min_hit_rate: 0.1,
        }
    }
}

/// A shared cache failed (unreachable, too slow, an unexpected answer).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct SharedCacheError(pub String);

/// A cache shared by several processes: answers and tag generations kept by a server
/// (meshql-cache-redis). Each call is one round trip.
#[async_trait]
pub trait SharedCache: Send + Sync + 'static {
    /// For logs and metrics (`"redis"`).
    fn kind(&self) -> &'static str;

    /// The states of `tags` and the entry under `key`, if any.
    async fn get(
        &self,
        key: &str,
        tags: &[String],
    ) -> Result<(Vec<TagState>, Option<Vec<u8>>), SharedCacheError>;

    /// Stores `entry` under `key` for `ttl`.
    async fn put(&self, key: &str, entry: Vec<u8>, ttl: Duration) -> Result<(), SharedCacheError>;

    /// Advances `tags`, recording `stamp` as their newest change and the current moment as
    /// their last advance (see [`TagState::advanced_at`]; the writes have committed).
    async fn advance(&self, tags: &[String], stamp: Millis) -> Result<(), SharedCacheError>;
}

/// Kinds of shared cache, as `[cache]` names them (`redis = { … }`, the key is the kind).
/// Each shared-cache crate implements [`meshql_core::Component`]`<SharedCaches>` once and the
/// server registers it once; the config crate keeps the block's fields opaque and hands them
/// here, so the crate owns its settings: parsing, defaults, checks and JSON Schema. Building
/// the block connects nothing.
pub struct SharedCaches;

impl meshql_core::Family for SharedCaches {
    const WHAT: &'static str = "cache";
    type Context<'a> = ();
    type Built = Box<dyn SharedCacheTarget>;
}

/// The shared caches a binary knows, by their key in `[cache]`.
pub type SharedCacheRegistry = meshql_core::Registry<SharedCaches>;

/// Checked settings of a shared cache, ready to connect.
#[async_trait]
pub trait SharedCacheTarget: std::fmt::Debug + Send + Sync {
    /// The client. A server that is down now is not an error (the cache is skipped until it
    /// answers); only settings the client library rejects are.
    async fn connect(
        &self,
    ) -> Result<Arc<dyn SharedCache>, Box<dyn std::error::Error + Send + Sync>>;
}

/// A cached answer of one reader operation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum Answer {
    One(Envelope),
    /// A read by id found no document (see [`CachedReader`]'s `read`).
    Absent,
    Envelopes(Vec<Envelope>),
    Rows(Vec<Row>),
    Keyed(KeyedRows),
    Nested(Vec<NestedRow>),
}

impl Answer {
    fn weight(&self) -> u32 {
        fn env(e: &Envelope) -> usize {
            64 + e.id.len()
                + e.payload.len()
                + e.authorized_tokens.iter().map(String::len).sum::<usize>()
        }
        fn nested(r: &NestedRow) -> usize {
            64 + r.id.len()
                + r.payload
                    .iter()
                    .map(|(k, v)| k.len() + 32 + v.to_string().len())
                    .sum::<usize>()
                + r.children.iter().flatten().map(nested).sum::<usize>()
        }
        let bytes = match self {
            Answer::One(e) => env(e),
            Answer::Absent => 64,
            Answer::Envelopes(v) => v.iter().map(env).sum(),
            Answer::Rows(v) => v.iter().map(|r| 48 + r.id.len() + r.payload.len()).sum(),
            Answer::Keyed(v) => v
                .iter()
                .map(|(k, r)| 64 + k.len() + r.id.len() + r.payload.len())
                .sum(),
            Answer::Nested(v) => v.iter().map(nested).sum(),
        };
        u32::try_from(bytes).unwrap_or(u32::MAX)
    }
}

/// An answer and what it is valid for.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Entry {
    /// The generations of the answer's tags when it was read.
    generations: Vec<u64>,
    /// The answer holds every change stamped up to this moment and none after it.
    as_of: Millis,
    /// When the epoch was last advanced, as the lookup saw it: generations restart from zero
    /// when a shared cache restarts empty, the epoch's moment does not repeat.
    epoch_at: Millis,
    answer: Answer,
}

/// Counts since start (for `/metrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheCounts {
    pub hits: u64,
    pub misses: u64,
    /// Answers stored.
    pub fills: u64,
    /// Answers not stored because they might not be current (a write newer than their
    /// moment, a replica behind the tags).
    pub unfilled: u64,
    /// Tag advances (one per written document and entity).
    pub invalidations: u64,
    /// Failed calls to the shared cache.
    pub shared_errors: u64,
    /// Reads that went around the cache (a shared cache that failed).
    pub bypassed: u64,
    /// Reads that went straight to storage because their operation's recent hit rate in the
    /// shared cache was below `min_hit_rate`.
    pub skipped: u64,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    fills: AtomicU64,
    unfilled: AtomicU64,
    invalidations: AtomicU64,
    shared_errors: AtomicU64,
    bypassed: AtomicU64,
    skipped: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Where answers are kept.
enum Tier {
    Local(moka::sync::Cache<String, Arc<Entry>>),
    Shared(Arc<dyn SharedCache>),
}

/// The read cache of a process, shared by its entities' [`CachedReader`]s.
pub struct Cache {
    settings: CacheSettings,
    tags: Tags,
    tier: Tier,
    /// A write could not advance its tags in the shared cache: reads go around it until the
    /// shared epoch has been advanced.
    degraded: AtomicBool,
    /// The shared cache's failure has been logged (once per outage).
    reported: AtomicBool,
    /// Fills of the shared cache under way (sent after the answer, at most
    /// [`MAX_SHARED_FILLS`] at once).
    fills_in_flight: Arc<tokio::sync::Semaphore>,
    /// The hits a window of consulted reads needs ([`worth`]); `None` when every read
    /// consults (an in-process cache, or a minimum of 0).
    min_hits: Option<u32>,
    counters: Counters,
}

/// Fills of a shared cache that may be under way at once; a miss beyond them is answered
/// without being stored (counted as unfilled), so a slow server cannot pile up tasks.
const MAX_SHARED_FILLS: usize = 256;

/// What a lookup found.
pub(crate) enum Lookup {
    /// The tags' current states, and the entry if one is stored.
    Found(Vec<TagState>, Option<Arc<Entry>>),
    /// The cache cannot be used for this read.
    Bypass,
}

impl Cache {
    /// An in-process cache of `entities`.
    pub fn local(
        settings: CacheSettings,
        entities: impl IntoIterator<Item = String>,
    ) -> Arc<Cache> {
        let store = moka::sync::Cache::builder()
            .max_capacity(settings.max_bytes)
            .weigher(|k: &String, e: &Arc<Entry>| {
                (k.len() as u32).saturating_add(e.answer.weight())
            })
            .time_to_live(settings.ttl)
            .build();
        Arc::new(Cache::with_tier(settings, entities, Tier::Local(store)))
    }

    /// A cache of `entities` kept in `shared`.
    pub fn shared(
        settings: CacheSettings,
        entities: impl IntoIterator<Item = String>,
        shared: Arc<dyn SharedCache>,
    ) -> Arc<Cache> {
        Arc::new(Cache::with_tier(settings, entities, Tier::Shared(shared)))
    }

    fn with_tier(
        settings: CacheSettings,
        entities: impl IntoIterator<Item = String>,
        tier: Tier,
    ) -> Cache {
        let min_hits = match tier {
            Tier::Shared(_) => Some(worth::min_hits(settings.min_hit_rate)).filter(|&m| m > 0),
            Tier::Local(_) => None,
        };
        Cache {
            min_hits,
            settings,
            tags: Tags::new(entities),
            tier,
            degraded: AtomicBool::new(false),
            reported: AtomicBool::new(false),
            fills_in_flight: Arc::new(tokio::sync::Semaphore::new(MAX_SHARED_FILLS)),
            counters: Counters::default(),
        }
    }

    /// `"memory"` or the shared cache's kind.
    pub fn kind(&self) -> &'static str {
        match &self.tier {
            Tier::Local(_) => "memory",
            Tier::Shared(s) => s.kind(),
        }
    }

    /// A reader of `entity` answering from this cache and, on a miss, from `inner`. `None`
    /// when the cache was not made for `entity`.
    pub fn reader(
        self: &Arc<Self>,
        entity: &str,
        inner: meshql_core::DynReader,
    ) -> Option<CachedReader> {
        let index = self.tags.entity(entity)?;
        Some(CachedReader::new(self.clone(), index, entity, inner))
    }

    /// Writes to `ids` of `entity`, stamped up to `stamp`, were committed: advances their tags
    /// (in the shared cache too) before the caller acknowledges them.
    pub async fn invalidate(&self, entity: &str, ids: &[&str], stamp: Millis) {
        let Some(e) = self.tags.entity(entity) else {
            return;
        };
        self.tags.advance(e, ids.iter().copied(), stamp);
        self.counters
            .invalidations
            .fetch_add(ids.len() as u64 + 1, Ordering::Relaxed);
        if let Tier::Shared(shared) = &self.tier {
            let mut names: Vec<String> = ids
                .iter()
                .map(|id| self.tags.shared_name(self.tags.document(e, id)))
                .collect();
            names.push(self.tags.shared_name(TagRef::Entity(e)));
            if let Err(err) = shared.advance(&names, stamp).await {
                self.shared_failed(&err);
                self.degraded.store(true, Ordering::Release);
            }
        }
    }

    /// A change to `id` of `entity` stamped `stamp` came through the change feed (a write by
    /// this or another process): advances its in-process tags.
    pub fn invalidated(&self, entity: &str, id: &str, stamp: Millis) {
        if let Some(e) = self.tags.entity(entity) {
            self.tags.advance(e, [id], stamp);
            self.counters.invalidations.fetch_add(2, Ordering::Relaxed);
        }
    }

    /// Retires every cached answer: an entity's stored versions were replaced wholesale (a
    /// projection rebuild's swap), which no write tag describes.
    pub async fn clear(&self) {
        self.tags.advance_epoch();
        if let Tier::Shared(shared) = &self.tier {
            let epoch = [self.tags.shared_name(TagRef::Epoch)];
            if let Err(err) = shared
                .advance(&epoch, meshql_core::time::now_millis())
                .await
            {
                self.shared_failed(&err);
                self.degraded.store(true, Ordering::Release);
            }
        }
    }

    /// While degraded, tries to advance the shared epoch; true once the shared cache is
    /// usable again (or never was degraded). Called periodically by the server.
    pub async fn recover(&self) -> bool {
        if !self.degraded.load(Ordering::Acquire) {
            return true;
        }
        let Tier::Shared(shared) = &self.tier else {
            return true;
        };
        match shared
            .advance(
                &[self.tags.shared_name(TagRef::Epoch)],
                meshql_core::time::now_millis(),
            )
            .await
        {
            Ok(()) => {
                self.degraded.store(false, Ordering::Release);
                self.reported.store(false, Ordering::Relaxed);
                tracing::info!(
                    cache = shared.kind(),
                    "shared cache answering again: reads use it"
                );
                true
            }
            Err(_) => false,
        }
    }

    pub fn counts(&self) -> CacheCounts {
        let c = &self.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CacheCounts {
            hits: l(&c.hits),
            misses: l(&c.misses),
            fills: l(&c.fills),
            unfilled: l(&c.unfilled),
            invalidations: l(&c.invalidations),
            shared_errors: l(&c.shared_errors),
            bypassed: l(&c.bypassed),
            skipped: l(&c.skipped),
        }
    }

    /// Entries held in process (0 for a shared cache).
    pub fn entry_count(&self) -> u64 {
        match &self.tier {
            Tier::Local(m) => m.entry_count(),
            Tier::Shared(_) => 0,
        }
    }

    /// The in-process cache's size in weighted bytes, once its pending evictions ran (0 for a
    /// shared cache).
    pub fn weighted_bytes(&self) -> u64 {
        match &self.tier {
            Tier::Local(m) => {
                m.run_pending_tasks();
                m.weighted_size()
            }
            Tier::Shared(_) => 0,
        }
    }

    fn shared_failed(&self, err: &SharedCacheError) {
        bump(&self.counters.shared_errors);
        if !self.reported.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                cache = self.kind(),
                error = %err,
                "shared cache unavailable: reads go to storage until it answers again"
            );
        }
    }

    /// Whether this process's change feed has seen a change to one of `tags` stamped after
    /// `as_of` — for a shared cache, whose tags another process may have failed to advance
    /// (a writer cut off from it): an answer older than a change this process knows of is not
    /// served, whatever the shared tags say. (Stamps and `as_of` are both wall-clock
    /// milliseconds: the processes' clocks are assumed to agree within the feed's delay.)
    pub(crate) fn changed_after(&self, tags: &[TagRef], as_of: Millis) -> bool {
        matches!(self.tier, Tier::Shared(_))
            && tags.iter().any(|t| self.tags.state(*t).changed_at > as_of)
    }

    /// The tags' states and the entry under `key`.
    pub(crate) async fn lookup(&self, key: &str, tags: &[TagRef]) -> Lookup {
        match &self.tier {
            Tier::Local(store) => Lookup::Found(
                tags.iter()
                    .chain(std::iter::once(&TagRef::Epoch))
                    .map(|t| self.tags.state(*t))
                    .collect(),
                store.get(key),
            ),
            Tier::Shared(shared) => {
                if self.degraded.load(Ordering::Acquire) {
                    bump(&self.counters.bypassed);
                    return Lookup::Bypass;
                }
                let names: Vec<String> = tags
                    .iter()
                    .chain(std::iter::once(&TagRef::Epoch))
                    .map(|t| self.tags.shared_name(*t))
                    .collect();
                match shared.get(key, &names).await {
                    Ok((states, _)) if states.last().is_none_or(|e| e.changed_at == 0) => {
                        // a shared cache that (re)started empty: its generations begin again
                        // at zero and could meet those of answers stored before; a new epoch
                        // moment sets every answer stored from now on apart
                        let now = meshql_core::time::now_millis();
                        let epoch = [self.tags.shared_name(TagRef::Epoch)];
                        if let Err(err) = shared.advance(&epoch, now).await {
                            self.shared_failed(&err);
                        }
                        bump(&self.counters.bypassed);
                        Lookup::Bypass
                    }
                    Ok((states, bytes)) => {
                        let entry = bytes.and_then(|b| serde_json::from_slice::<Entry>(&b).ok());
                        Lookup::Found(states, entry.map(Arc::new))
                    }
                    Err(err) => {
                        self.shared_failed(&err);
                        bump(&self.counters.bypassed);
                        Lookup::Bypass
                    }
                }
            }
        }
    }

    /// Keeps `entry` under `key`. A shared cache is filled in a task of its own, so the
    /// answer does not wait for the round trip: an entry stored late is no less valid (it
    /// carries the generations read before the store was), and one that fails is only a miss
    /// the next time.
    pub(crate) fn store(self: &Arc<Self>, key: String, entry: Entry) {
        match &self.tier {
            Tier::Local(store) => {
                bump(&self.counters.fills);
                store.insert(key, Arc::new(entry));
            }
            Tier::Shared(shared) => {
                let Ok(permit) = self.fills_in_flight.clone().try_acquire_owned() else {
                    bump(&self.counters.unfilled);
                    return;
                };
                bump(&self.counters.fills);
                let bytes = serde_json::to_vec(&entry).expect("an entry serialises");
                let (cache, shared) = (self.clone(), shared.clone());
                tokio::spawn(async move {
                    if let Err(err) = shared.put(&key, bytes, cache.settings.ttl).await {
                        cache.shared_failed(&err);
                    }
                    drop(permit);
                });
            }
        }
    }

    pub(crate) fn tags(&self) -> &Tags {
        &self.tags
    }

    pub(crate) fn hit(&self) {
        bump(&self.counters.hits);
    }

    pub(crate) fn miss(&self) {
        bump(&self.counters.misses);
    }

    pub(crate) fn unfilled(&self) {
        bump(&self.counters.unfilled);
    }

    pub(crate) fn skipped(&self) {
        bump(&self.counters.skipped);
    }

    /// See [`Cache::min_hits`]'s field.
    pub(crate) fn min_hits(&self) -> Option<u32> {
        self.min_hits
    }
}
