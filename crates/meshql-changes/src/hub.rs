//! The hub: copies every store's change feed into the service's log, exactly once.
//!
//! One tailer task per entity reads its store's feed after the last cursor it copied
//! (`Store::changes`), appends the changes to the log, and waits for the store's commit signal
//! (writes in this process) or a short poll (writes by other processes on a shared database).
//!
//! **Exactly once across crashes.** Each log record carries its store cursor (`source`).
//! Appending a batch and advancing the entity's cursor happen under one lock, and a checkpoint
//! file (`hub.json`: a log offset and every entity's cursor at that offset) is written every
//! second and at shutdown. At start the hub reads the checkpoint, then scans the records after
//! its offset and takes each entity's cursor from the last record of that entity: the log
//! itself is the truth, the checkpoint only bounds the scan. So a change copied just before a
//! crash is not copied again, and a change committed in the store but not yet copied is copied
//! after the restart. If the log lost its tail (a machine crash with a lazy fsync policy) the
//! checkpoint may point past its end: it is then ignored and the whole log scanned, and what
//! the log lost is copied again from the stores.

use crate::record::{encode, Head};
use meshql_core::{Cursor, DynStore, StoreChange};
use meshql_log::{Log, LogError};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[derive(Debug, Error)]
pub enum HubError {
    #[error("change log: {0}")]
    Log(#[from] LogError),
    #[error("change log checkpoint {path}: {message}")]
    Checkpoint { path: PathBuf, message: String },
}

/// Tuning of a hub.
#[derive(Debug, Clone)]
pub struct HubOptions {
    /// Changes read from a store per round trip.
    pub batch: usize,
    /// How often a tailer looks for writes made by other processes.
    pub poll: Duration,
    /// The least time between two reads of one store's feed. Under a stream of commits a
    /// tailer woken by each would read (and append) once per commit; waiting this long
    /// between reads lets one read take every commit of the interval instead. It bounds
    /// what the feed adds to a write's visibility, and is not waited when the store is quiet.
    pub min_read_interval: Duration,
    /// How often the checkpoint is written.
    pub checkpoint_every: Duration,
    /// Told of every batch of changes once it is in the log.
    pub listeners: Listeners,
}

/// Told of the changes the hub copies into the log, as it copies them: writes of this
/// process and of others sharing the database (a read cache invalidates by them).
pub trait CopyListener: Send + Sync + 'static {
    fn copied(&self, entity: &str, changes: &[StoreChange]);
}

/// The [`CopyListener`]s of a hub.
#[derive(Clone, Default)]
pub struct Listeners(pub Vec<Arc<dyn CopyListener>>);

impl std::fmt::Debug for Listeners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Listeners({})", self.0.len())
    }
}

impl Default for HubOptions {
    fn default() -> Self {
        Self {
            batch: 512,
            poll: Duration::from_millis(200),
            min_read_interval: Duration::from_millis(1),
            checkpoint_every: Duration::from_secs(1),
            listeners: Listeners::default(),
        }
    }
}

/// What the checkpoint file holds.
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq)]
struct Checkpoint {
    /// Every record up to this offset is accounted for in `cursors`.
    offset: u64,
    /// Per entity, the store cursor of its last change at or before `offset`.
    cursors: BTreeMap<String, String>,
}

/// Counters of one entity's tailer.
#[derive(Debug, Clone, PartialEq)]
pub struct EntityFeedStats {
    pub entity: String,
    /// Changes copied into the log since start.
    pub copied: u64,
    /// The store cursor of the last change copied.
    pub cursor: Cursor,
    /// Failed reads of the store feed or appends to the log since start.
    pub errors: u64,
}

struct Tailer {
    entity: String,
    copied: AtomicU64,
    errors: AtomicU64,
}

struct Shared {
    log: Log,
    /// The log's last offset and each entity's cursor at it, changed together.
    state: Mutex<Checkpoint>,
    tailers: Vec<Tailer>,
    checkpoint_path: PathBuf,
}

impl Shared {
    /// Appends one entity's batch and advances its cursor, as one step.
    fn append(&self, entity: &str, records: &[Vec<u8>], last: Cursor) -> Result<(), LogError> {
        let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
        let mut state = self.state.lock();
        let offset = self.log.append(&refs)?;
        state.offset = offset;
        state.cursors.insert(entity.to_owned(), last.to_string());
        Ok(())
    }

    fn write_checkpoint(&self) -> Result<(), HubError> {
        let snapshot = self.state.lock().clone();
        let text = serde_json::to_vec(&snapshot).expect("a checkpoint serialises");
        let tmp = self.checkpoint_path.with_extension("json.tmp");
        let fail = |e: std::io::Error| HubError::Checkpoint {
            path: self.checkpoint_path.clone(),
            message: e.to_string(),
        };
        std::fs::write(&tmp, text).map_err(fail)?;
        std::fs::rename(&tmp, &self.checkpoint_path).map_err(fail)
    }
}

/// Copies the change feeds of a service's stores into its log (see the module docs).
pub struct Hub {
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Hub {
    /// Recovers each entity's cursor from the log and starts one tailer per store.
    pub fn start(
        log: Log,
        stores: Vec<(String, DynStore)>,
        options: HubOptions,
    ) -> Result<Hub, HubError> {
        let checkpoint_path = log.dir().join("hub.json");
        let state = recover(&log, &checkpoint_path)?;
        let shared = Arc::new(Shared {
            tailers: stores
                .iter()
                .map(|(entity, _)| Tailer {
                    entity: entity.clone(),
                    copied: AtomicU64::new(0),
                    errors: AtomicU64::new(0),
                })
                .collect(),
            log,
            state: Mutex::new(state),
            checkpoint_path,
        });
        let (stop, stop_rx) = watch::channel(false);
        let mut tasks = Vec::new();
        for (index, (entity, store)) in stores.into_iter().enumerate() {
            let cursor = shared
                .state
                .lock()
                .cursors
                .get(&entity)
                .and_then(|c| c.parse().ok())
                .unwrap_or(Cursor::START);
            tasks.push(tokio::spawn(tail(
                shared.clone(),
                index,
                store,
                cursor,
                stop_rx.clone(),
                options.clone(),
            )));
        }
        tasks.push(tokio::spawn(checkpointer(
            shared.clone(),
            stop_rx,
            options.checkpoint_every,
        )));
        Ok(Hub {
            shared,
            stop,
            tasks: Mutex::new(tasks),
        })
    }

    /// The log the hub writes.
    pub fn log(&self) -> &Log {
        &self.shared.log
    }

    pub fn stats(&self) -> Vec<EntityFeedStats> {
        let state = self.shared.state.lock();
        self.shared
            .tailers
            .iter()
            .map(|t| EntityFeedStats {
                entity: t.entity.clone(),
                copied: t.copied.load(Ordering::Relaxed),
                cursor: state
                    .cursors
                    .get(&t.entity)
                    .and_then(|c| c.parse().ok())
                    .unwrap_or_default(),
                errors: t.errors.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Copies what the stores still hold, stops the tailers, writes the checkpoint and forces
    /// the log to disk. Call before the stores shut down. Idempotent.
    pub async fn stop(&self) {
        let _ = self.stop.send(true);
        let tasks: Vec<_> = self.tasks.lock().drain(..).collect();
        for t in tasks {
            let _ = t.await;
        }
        if let Err(e) = self.shared.write_checkpoint() {
            tracing::warn!(error = %e, "change log checkpoint not written");
        }
        if let Err(e) = self.shared.log.flush() {
            tracing::warn!(error = %e, "change log not flushed");
        }
    }
}

/// Each entity's cursor as the log holds it (see the module docs).
fn recover(log: &Log, checkpoint_path: &std::path::Path) -> Result<Checkpoint, HubError> {
    let last = log.last_offset();
    let mut state = match std::fs::read(checkpoint_path) {
        Ok(bytes) => match serde_json::from_slice::<Checkpoint>(&bytes) {
            Ok(c) if c.offset <= last => c,
            Ok(c) => {
                tracing::warn!(
                    checkpoint = c.offset,
                    log = last,
                    "change log is shorter than its checkpoint (lost its tail): rescanning it; \
                     the stores' changes it lost are copied again"
                );
                Checkpoint::default()
            }
            Err(e) => {
                tracing::warn!(error = %e, "change log checkpoint unreadable: rescanning the log");
                Checkpoint::default()
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Checkpoint::default(),
        Err(e) => {
            return Err(HubError::Checkpoint {
                path: checkpoint_path.to_owned(),
                message: e.to_string(),
            })
        }
    };
    let mut after = state.offset;
    loop {
        let records = log.read(after, 4096, 16 << 20)?;
        let Some(tail) = records.last() else { break };
        after = tail.offset;
        for r in &records {
            match Head::parse(&r.data) {
                Ok(head) => {
                    state.cursors.insert(head.entity, head.source);
                }
                Err(e) => {
                    tracing::warn!(position = r.offset, error = %e, "unreadable change record skipped")
                }
            }
        }
    }
    state.offset = after.max(state.offset);
    Ok(state)
}

async fn tail(
    shared: Arc<Shared>,
    index: usize,
    store: DynStore,
    mut cursor: Cursor,
    mut stop: watch::Receiver<bool>,
    options: HubOptions,
) {
    let tailer = &shared.tailers[index];
    let entity = tailer.entity.clone();
    let mut signal = store.commit_signal();
    let mut failures = 0u32;
    let mut last_read = tokio::time::Instant::now() - options.min_read_interval;
    loop {
        // batch the commits of a busy store (see `HubOptions::min_read_interval`)
        let next_read = last_read + options.min_read_interval;
        if tokio::time::Instant::now() < next_read {
            tokio::time::sleep_until(next_read).await;
        }
        last_read = tokio::time::Instant::now();
        // a hub dropped without `stop` stops its tailers too
        let stopping = *stop.borrow() || stop.has_changed().is_err();
        let outcome = match store.changes(cursor, options.batch).await {
            Ok(batch) if batch.is_empty() => Ok(false),
            Ok(batch) => {
                let records: Vec<Vec<u8>> = batch.iter().map(|c| encode(&entity, c)).collect();
                let last = batch.last().expect("not empty").cursor;
                match shared.append(&entity, &records, last) {
                    Ok(()) => {
                        cursor = last;
                        for listener in &options.listeners.0 {
                            listener.copied(&entity, &batch);
                        }
                        tailer
                            .copied
                            .fetch_add(records.len() as u64, Ordering::Relaxed);
                        if records.len() >= options.batch {
                            // a full page: more is waiting, read on at once
                            last_read = tokio::time::Instant::now() - options.min_read_interval;
                        }
                        Ok(true)
                    }
                    Err(e) => Err(e.to_string()),
                }
            }
            Err(e) => Err(e.to_string()),
        };
        match outcome {
            // more may be waiting: read again at once
            Ok(true) => {
                failures = 0;
                continue;
            }
            Ok(false) if stopping => return,
            Ok(false) => failures = 0,
            Err(message) => {
                tailer.errors.fetch_add(1, Ordering::Relaxed);
                failures += 1;
                if failures == 1 || failures.is_power_of_two() {
                    tracing::warn!(entity = %entity, error = %message, failures, "change feed: copying into the log failed; retrying");
                }
                if stopping {
                    return;
                }
                let backoff = Duration::from_millis(100 * u64::from(failures.min(20)));
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.changed() => {}
                }
                continue;
            }
        }
        tokio::select! {
            _ = committed(&mut signal) => {}
            _ = tokio::time::sleep(options.poll) => {}
            _ = stop.changed() => {}
        }
    }
}

/// Resolves after the store's next local commit (never, without a signal).
async fn committed(signal: &mut Option<meshql_core::CommitReceiver>) {
    match signal {
        Some(rx) => {
            if rx.changed().await.is_err() {
                *signal = None;
                std::future::pending::<()>().await
            }
        }
        None => std::future::pending::<()>().await,
    }
}

async fn checkpointer(shared: Arc<Shared>, mut stop: watch::Receiver<bool>, every: Duration) {
    let mut written = u64::MAX;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => return,
        }
        let offset = shared.state.lock().offset;
        if offset != written {
            match shared.write_checkpoint() {
                Ok(()) => written = offset,
                Err(e) => tracing::warn!(error = %e, "change log checkpoint not written"),
            }
        }
    }
}
