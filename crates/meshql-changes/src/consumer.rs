//! Consumers of the change log: one loop that reads the log, hands changes to a [`Handler`]
//! and commits what the handler confirmed, for every kind of consumer (a relay to a broker,
//! a processor).
//!
//! A [`Consumer`] is one task. It is a consumer group of the log (relays use
//! `relay-<name>`, processors `processor-<name>`): it resumes after the group's committed
//! position, reads a page of changes and enqueues it on its [`Handler`], which hands back
//! the confirmation of that batch to await later. Up to [`ConsumerOptions::in_flight`]
//! batches are enqueued at once, so a round trip (a broker's acknowledgement, Kafka's
//! `linger.ms`) is paid once for them all instead of once per batch, in turn. Confirmations
//! are awaited oldest first, and a batch's last position is committed only once it and every
//! batch before it are confirmed; a failed confirmation drops every later batch in flight
//! and the consumer reads again after the last commit. A crash between a confirmation and
//! its commit hands that batch over again after the restart, so delivery is *at least
//! once*; every change carries a `change_id` that is the same on every delivery, which lets
//! a handler be exactly once by de-duplicating on it.
//!
//! With [`ConsumerOptions::entities`] only changes of those entities reach the handler. The
//! consumer still reads past the others and commits their positions: a page in which nothing
//! is admitted is never enqueued, it is a batch confirmed from the start, queued behind the
//! batches in flight, so that its last position is committed once every batch before it is
//! confirmed, and the lag of a consumer reaches 0 on a log of changes it does not want.
//!
//! A consumer never touches the write path: writes go to the stores and the hub copies them
//! into the log whatever the consumers do. A handler that fails (broker down, network cut)
//! is retried with capped exponential backoff, forever; the consumer falls behind meanwhile
//! (its lag, in changes and in seconds, is in [`ConsumerStats`]) and catches up when the
//! handler recovers. When caught up it waits for the log's next append. [`Consumer::stop`]
//! hands over what the log still holds (for a bounded time), closes the handler and returns.

use crate::feed::FeedSource;
use crate::feed::{scan, FeedFilter};
use async_trait::async_trait;
use meshql_core::ChangeOp;
use meshql_log::{Log, LogError, LogReader};
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use thiserror::Error;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A handler's failure to handle a batch (the whole batch is handed over again).
#[derive(Debug, Clone, Error)]
#[error("{0}")]
pub struct HandlerError(pub String);

impl HandlerError {
    pub fn new(message: impl std::fmt::Display) -> Self {
        HandlerError(message.to_string())
    }
}

/// The confirmation of one enqueued batch: `Ok` once the handler is done with every change
/// of it (for a relay, once the broker durably accepted them); a failure part-way is a
/// failure of the batch.
pub type Confirmation = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send>>;

/// A confirmation that is already `Ok`: what a handler returns when it handled the batch
/// before returning from [`Handler::enqueue`].
pub fn confirmed() -> Confirmation {
    Box::pin(std::future::ready(Ok(())))
}

/// What a consumer hands changes to: a relay's sink (a broker's client), a processor.
#[async_trait]
pub trait Handler: Send + Sync {
    /// The handler's type, as the config names it (`kafka`, `nats`, a processor's kind).
    fn kind(&self) -> &'static str;
    /// Takes `batch` (never empty), in order and after every batch enqueued before it, and
    /// returns the confirmation of the batch. An error means nothing of the batch needs
    /// confirming (it is enqueued again later). A handler that cannot keep batches in flight
    /// handles the batch before returning and returns [`confirmed`].
    async fn enqueue(&self, batch: &[Change]) -> Result<Confirmation, HandlerError>;
    /// Enqueues `batch` and waits for its confirmation.
    async fn send(&self, batch: &[Change]) -> Result<(), HandlerError> {
        self.enqueue(batch).await?.await
    }
    /// Flushes and releases the handler's resources (connections); called once, when the
    /// consumer stops.
    async fn close(&self) {}
}

/// One change as a consumer hands it over.
#[derive(Debug, Clone)]
pub struct Change {
    /// Position in the log.
    pub position: u64,
    /// `entity:id:created_at`: the same on every delivery of this change.
    pub change_id: String,
    pub entity: String,
    /// The document id.
    pub id: String,
    pub op: ChangeOp,
    /// The version's time, milliseconds since the Unix epoch.
    pub created_at: i64,
    pub correlation_id: Option<String>,
    pub authorized_tokens: Vec<String>,
    /// The published change: `{"position":N,"change_id":…,…,"payload":{…}}`, as served at
    /// `/_changes`.
    pub json: Vec<u8>,
    /// The document (for a delete, the last version before it), including its `"id"`.
    pub payload: Box<RawValue>,
    /// When the change was appended to the log, milliseconds since the Unix epoch.
    pub appended_at_ms: i64,
}

#[derive(Deserialize)]
struct Parts<'a> {
    change_id: String,
    entity: String,
    id: String,
    created_at: i64,
    op: ChangeOp,
    #[serde(default)]
    authorized_tokens: Vec<String>,
    #[serde(default)]
    correlation_id: Option<String>,
    #[serde(borrow)]
    payload: &'a RawValue,
}

impl Change {
    /// Reads a published change (`{"position":N,…}`) appended at `appended_at_ms`.
    pub fn parse(
        position: u64,
        appended_at_ms: i64,
        json: Vec<u8>,
    ) -> Result<Change, serde_json::Error> {
        let parts: Parts<'_> = serde_json::from_slice(&json)?;
        let payload = parts.payload.to_owned();
        Ok(Change {
            position,
            change_id: parts.change_id,
            entity: parts.entity,
            id: parts.id,
            op: parts.op,
            created_at: parts.created_at,
            correlation_id: parts.correlation_id,
            authorized_tokens: parts.authorized_tokens,
            payload,
            json,
            appended_at_ms,
        })
    }

    /// The payload's JSON text.
    pub fn payload_bytes(&self) -> &[u8] {
        self.payload.get().as_bytes()
    }
}

/// Tuning of a consumer.
#[derive(Debug, Clone)]
pub struct ConsumerOptions {
    /// Changes per batch at most.
    pub batch: usize,
    /// Batches enqueued on the handler and not yet confirmed, at most.
    pub in_flight: usize,
    /// First retry delay after a failed batch; doubled per failure up to `backoff_max`.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// How long [`Consumer::stop`] keeps handing over what the log still holds.
    pub drain_timeout: Duration,
    /// Failures are logged at most this often (with the count since the last warning).
    pub warn_every: Duration,
    /// Only changes of these entities are handed to the handler (the others are read past
    /// and committed); all when `None`.
    pub entities: Option<Vec<String>>,
    /// The group's position is written to disk at most this often (zero: after every
    /// batch). A commit is an fsync'ed file: a consumer whose handler keeps its own position
    /// (a processor commits it with its outputs) loses nothing by committing seldom, and
    /// spares the disk a sync per batch. The last position is always committed on stop.
    pub commit_every: Duration,
    /// When woken by an append after being caught up, wait this long before reading, so
    /// that one batch takes what arrives meanwhile (zero: read at once). A handler with a
    /// cost per batch (a processor's transaction) trades this much latency for far fewer
    /// batches under a stream of small writes.
    pub linger: Duration,
}

impl Default for ConsumerOptions {
    fn default() -> Self {
        Self {
            batch: 500,
            in_flight: 4,
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(5),
            warn_every: Duration::from_secs(30),
            entities: None,
            commit_every: Duration::ZERO,
            linger: Duration::ZERO,
        }
    }
}

#[derive(Debug, Error)]
pub enum ConsumerError {
    #[error("consumer group \"{group}\": reading its committed position: {source}")]
    Log {
        /// The consumer's name.
        name: String,
        group: String,
        source: LogError,
    },
}

/// What a consumer has done, for `/metrics`.
#[derive(Debug, Clone, PartialEq)]
pub struct ConsumerStats {
    pub name: String,
    /// The handler's type (`kafka`, `nats`, …).
    pub kind: &'static str,
    /// Changes the handler confirmed since start (a batch handed over twice counts twice).
    pub delivered: u64,
    /// Failed batches (and failed reads of the log) since start (each retried).
    pub errors: u64,
    /// The last position committed: every change up to it was confirmed by the handler (or
    /// is of an entity the consumer does not want).
    pub committed: u64,
    /// Changes in the log after `committed`.
    pub lag: u64,
    /// Age of the oldest change after `committed` (now − its append to the log), in
    /// seconds; 0 when caught up.
    pub lag_seconds: f64,
    /// Time since the consumer last confirmed a batch or was caught up (zero while caught
    /// up).
    pub since_success: Duration,
}

struct Counters {
    delivered: AtomicU64,
    errors: AtomicU64,
    committed: AtomicU64,
    /// When the consumer last confirmed a batch or found nothing to hand over.
    progress: Mutex<Instant>,
}

/// The log a consumer reads and commits its group's position to: the writer's own [`Log`]
/// in the serving process, or a [`TailedReader`] in another process (`meshql process`).
pub trait ConsumerLog: FeedSource + Send + Sync {
    /// The position of the newest record (0 when it cannot be read).
    fn last(&self) -> u64;
    /// The oldest position the log still keeps.
    fn first(&self) -> u64;
    fn committed(&self, group: &str) -> Result<Option<u64>, LogError>;
    fn commit(&self, group: &str, position: u64) -> Result<(), LogError>;
    /// Changes value after appends.
    fn appended(&self) -> watch::Receiver<u64>;
    /// The log's identity (`meshql_log::Log::id`): positions mean something only within
    /// one log. `None`: unknown.
    fn id(&self) -> Option<String> {
        None
    }
}

impl ConsumerLog for Log {
    fn last(&self) -> u64 {
        self.last_offset()
    }
    fn first(&self) -> u64 {
        self.first_offset()
    }
    fn committed(&self, group: &str) -> Result<Option<u64>, LogError> {
        Log::committed(self, group)
    }
    fn commit(&self, group: &str, position: u64) -> Result<(), LogError> {
        Log::commit(self, group, position)
    }
    fn appended(&self) -> watch::Receiver<u64> {
        self.subscribe()
    }
    fn id(&self) -> Option<String> {
        Some(Log::id(self).to_owned())
    }
}

/// A [`LogReader`] (the log of a server in another process) that notices appends by
/// looking at the log's end every `poll`.
pub struct TailedReader {
    reader: Arc<LogReader>,
    poll: Duration,
    appended: Mutex<Option<watch::Sender<u64>>>,
}

impl TailedReader {
    pub fn new(reader: LogReader, poll: Duration) -> Self {
        Self {
            reader: Arc::new(reader),
            poll,
            appended: Mutex::new(None),
        }
    }
}

impl FeedSource for TailedReader {
    fn read_records(
        &self,
        after: u64,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<meshql_log::Record>, LogError> {
        self.reader.read(after, max, max_bytes)
    }
    fn last_position(&self) -> Result<u64, LogError> {
        self.reader.last_offset()
    }
}

impl ConsumerLog for TailedReader {
    fn last(&self) -> u64 {
        self.reader.last_offset().unwrap_or(0)
    }
    fn first(&self) -> u64 {
        self.reader.first_offset().unwrap_or(0)
    }
    fn committed(&self, group: &str) -> Result<Option<u64>, LogError> {
        self.reader.committed(group)
    }
    fn commit(&self, group: &str, position: u64) -> Result<(), LogError> {
        self.reader.commit(group, position)
    }
    fn id(&self) -> Option<String> {
        self.reader.id()
    }
    /// Starts the poller on first use (inside the consumer's runtime); it ends when every
    /// receiver is gone.
    fn appended(&self) -> watch::Receiver<u64> {
        let mut slot = self.appended.lock();
        if let Some(tx) = slot.as_ref() {
            return tx.subscribe();
        }
        let (tx, rx) = watch::channel(self.last());
        let (reader, poll, sender) = (self.reader.clone(), self.poll, tx.clone());
        tokio::spawn(async move {
            let mut seen = *sender.borrow();
            loop {
                tokio::time::sleep(poll).await;
                if sender.is_closed() {
                    return;
                }
                let now = reader.last_offset().unwrap_or(seen);
                if now != seen {
                    seen = now;
                    sender.send_replace(now);
                }
            }
        });
        *slot = Some(tx);
        rx
    }
}

/// A running consumer (see the module docs).
pub struct Consumer {
    name: String,
    group: String,
    kind: &'static str,
    log: Arc<dyn ConsumerLog>,
    counters: Arc<Counters>,
    stop: watch::Sender<bool>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Consumer {
    /// Starts handing the changes after `group`'s committed position to `handler`.
    ///
    /// `group`: the consumer group in the log (relays use `relay-<name>`, processors
    /// `processor-<name>`). `name` names the consumer in logs and stats.
    pub fn start(
        name: &str,
        group: &str,
        log: Log,
        handler: Arc<dyn Handler>,
        options: ConsumerOptions,
    ) -> Result<Consumer, ConsumerError> {
        Self::start_on(name, group, Arc::new(log), handler, options)
    }

    /// [`Consumer::start`] on any [`ConsumerLog`]: the writer's [`Log`], or a
    /// [`TailedReader`] of the log of a server running in another process.
    pub fn start_on(
        name: &str,
        group: &str,
        log: Arc<dyn ConsumerLog>,
        handler: Arc<dyn Handler>,
        options: ConsumerOptions,
    ) -> Result<Consumer, ConsumerError> {
        let committed = log
            .committed(group)
            .map_err(|source| ConsumerError::Log {
                name: name.to_owned(),
                group: group.to_owned(),
                source,
            })?
            .unwrap_or(0);
        let counters = Arc::new(Counters {
            delivered: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            committed: AtomicU64::new(committed),
            progress: Mutex::new(Instant::now()),
        });
        let (stop, stop_rx) = watch::channel(false);
        let filter = match &options.entities {
            Some(entities) => FeedFilter::everything().only(entities),
            None => FeedFilter::everything(),
        };
        let worker = Worker {
            name: name.to_owned(),
            group: group.to_owned(),
            log: log.clone(),
            handler: handler.clone(),
            counters: counters.clone(),
            filter,
            options,
            stop: stop_rx,
            deadline: None,
            failures_unreported: 0,
            last_warning: None,
            last_commit: None,
        };
        tracing::info!(
            consumer = name,
            group,
            kind = handler.kind(),
            after = committed,
            "consumer started"
        );
        Ok(Consumer {
            name: name.to_owned(),
            group: group.to_owned(),
            kind: handler.kind(),
            log,
            counters,
            stop,
            task: Mutex::new(Some(tokio::spawn(worker.run(committed)))),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The consumer group in the log.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The handler's type.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// The consumer's counters, lag and lag in seconds (which reads the one record after
    /// `committed`).
    pub fn stats(&self) -> ConsumerStats {
        let committed = self.counters.committed.load(Ordering::Relaxed);
        let lag = self.log.last().saturating_sub(committed);
        ConsumerStats {
            name: self.name.clone(),
            kind: self.kind,
            delivered: self.counters.delivered.load(Ordering::Relaxed),
            errors: self.counters.errors.load(Ordering::Relaxed),
            committed,
            lag,
            lag_seconds: if lag == 0 {
                0.0
            } else {
                self.age_after(committed)
            },
            since_success: if lag == 0 {
                Duration::ZERO
            } else {
                self.counters.progress.lock().elapsed()
            },
        }
    }

    /// Seconds since the oldest change after `position` was appended (0 when there is none
    /// or it cannot be read).
    fn age_after(&self, position: u64) -> f64 {
        match self.log.read_records(position, 1, 1) {
            Ok(records) => records.first().map_or(0.0, |r| {
                now_ms().saturating_sub(r.timestamp_ms).max(0) as f64 / 1000.0
            }),
            Err(_) => 0.0,
        }
    }

    /// Hands over what the log holds (for at most the drain timeout; what is left is handed
    /// over after the next start), closes the handler and returns. Idempotent.
    pub async fn stop(&self) {
        self.stop.send_replace(true);
        let task = self.task.lock().take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

/// Milliseconds since the Unix epoch (negative before it).
fn now_ms() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

struct Worker {
    name: String,
    group: String,
    log: Arc<dyn ConsumerLog>,
    handler: Arc<dyn Handler>,
    counters: Arc<Counters>,
    /// What the handler wants (the entities of the options).
    filter: FeedFilter,
    options: ConsumerOptions,
    stop: watch::Receiver<bool>,
    /// Set once stopping: handing over goes on until then at most.
    deadline: Option<tokio::time::Instant>,
    failures_unreported: u64,
    last_warning: Option<Instant>,
    /// When the group's position was last written, and which.
    last_commit: Option<(Instant, u64)>,
}

/// A batch enqueued on the handler (or a page with nothing for it), not yet confirmed.
struct Pending {
    /// The page's last position (committed once the batch and every one before it are
    /// confirmed).
    last: u64,
    changes: usize,
    confirmation: Confirmation,
}

enum Outcome<T> {
    Done(T),
    /// The drain deadline passed first.
    OutOfTime,
}

impl Worker {
    fn stopping(&mut self) -> bool {
        if self.deadline.is_none() && (*self.stop.borrow() || self.stop.has_changed().is_err()) {
            self.deadline = Some(tokio::time::Instant::now() + self.options.drain_timeout);
        }
        self.deadline.is_some()
    }

    /// Runs `f` to completion, or until the drain deadline once the consumer is stopping.
    async fn bounded<F: Future>(&mut self, f: F) -> Outcome<F::Output> {
        tokio::pin!(f);
        loop {
            if let Some(deadline) = self.deadline {
                return tokio::select! {
                    r = &mut f => Outcome::Done(r),
                    _ = tokio::time::sleep_until(deadline) => Outcome::OutOfTime,
                };
            }
            tokio::select! {
                r = &mut f => return Outcome::Done(r),
                _ = self.stop.changed() => {}
            }
            self.stopping();
        }
    }

    /// The wanted changes after `after` (a batch at most) and the last position examined
    /// (`after` when the log holds nothing after it).
    fn read_page(&self, after: u64) -> Result<(Vec<Change>, u64), LogError> {
        let mut batch = Vec::new();
        let last = scan(
            &*self.log,
            after,
            self.options.batch.max(1),
            &self.filter,
            |record, json| match Change::parse(record.offset, record.timestamp_ms, json) {
                Ok(c) => batch.push(c),
                Err(e) => tracing::warn!(
                    consumer = %self.name,
                    position = record.offset,
                    error = %e,
                    "unreadable change skipped by the consumer"
                ),
            },
        )?;
        Ok((batch, last))
    }

    async fn run(mut self, committed: u64) {
        let mut appended = self.log.appended();
        let mut failures: u32 = 0;
        // every change up to `after` is confirmed and committed; up to `read_to` enqueued
        let mut after = committed;
        let mut read_to = committed;
        let mut in_flight: VecDeque<Pending> = VecDeque::new();
        let capacity = self.options.in_flight.max(1);
        loop {
            let stopping = self.stopping();
            if in_flight.len() < capacity {
                let (batch, last) = match self.read_page(read_to) {
                    Ok(page) => page,
                    Err(e) => {
                        failures += 1;
                        self.failed(&format!("reading the change log: {e}"), failures);
                        if stopping || !self.backoff(failures).await {
                            break;
                        }
                        continue;
                    }
                };
                if last != read_to {
                    self.warn_if_retention_overtook(read_to);
                    // a page with nothing wanted is confirmed from the start: its position
                    // is committed once every batch before it is
                    let confirmation = if batch.is_empty() {
                        Outcome::Done(Ok(confirmed()))
                    } else {
                        let handler = self.handler.clone();
                        self.bounded(handler.enqueue(&batch)).await
                    };
                    match confirmation {
                        Outcome::Done(Ok(confirmation)) => {
                            in_flight.push_back(Pending {
                                last,
                                changes: batch.len(),
                                confirmation,
                            });
                            read_to = last;
                        }
                        Outcome::Done(Err(e)) => {
                            failures += 1;
                            self.failed(&e.to_string(), failures);
                            in_flight.clear();
                            read_to = after;
                            if self.stopping() || !self.backoff(failures).await {
                                break;
                            }
                        }
                        Outcome::OutOfTime => break,
                    }
                    continue;
                }
                if in_flight.is_empty() {
                    // caught up, everything confirmed
                    *self.counters.progress.lock() = Instant::now();
                    if stopping {
                        break;
                    }
                    let position = self.counters.committed.load(Ordering::Relaxed);
                    self.commit(position);
                    // a position held back by `commit_every` is written once the log is quiet
                    let pending = self.last_commit.is_some_and(|(_, p)| p != position);
                    let quiet = if pending {
                        self.options.commit_every
                    } else {
                        Duration::from_secs(3600)
                    };
                    let woken = tokio::select! {
                        _ = appended.changed() => true,
                        _ = self.stop.changed() => false,
                        _ = tokio::time::sleep(quiet) => {
                            self.flush_commit();
                            false
                        }
                    };
                    if woken && !self.options.linger.is_zero() {
                        tokio::select! {
                            _ = tokio::time::sleep(self.options.linger) => {}
                            _ = self.stop.changed() => {}
                        }
                    }
                    continue;
                }
            }
            // the oldest batch's confirmation; while reading is caught up, a new append
            // interrupts the wait so that it is enqueued at once
            let reading_caught_up = in_flight.len() < capacity;
            let Some(oldest) = in_flight.front_mut() else {
                continue;
            };
            let outcome = if reading_caught_up {
                tokio::select! {
                    r = self.bounded(&mut oldest.confirmation) => Some(r),
                    _ = appended.changed() => None,
                }
            } else {
                Some(self.bounded(&mut oldest.confirmation).await)
            };
            match outcome {
                None => {}
                Some(Outcome::Done(Ok(()))) => {
                    let Some(done) = in_flight.pop_front() else {
                        continue;
                    };
                    self.counters
                        .delivered
                        .fetch_add(done.changes as u64, Ordering::Relaxed);
                    *self.counters.progress.lock() = Instant::now();
                    if failures > 0 {
                        tracing::info!(
                            consumer = %self.name,
                            group = %self.group,
                            failures,
                            "consumer delivers again"
                        );
                        self.failures_unreported = 0;
                        self.last_warning = None;
                    }
                    failures = 0;
                    after = done.last;
                    self.commit(after);
                }
                Some(Outcome::Done(Err(e))) => {
                    failures += 1;
                    self.failed(&e.to_string(), failures);
                    // later batches may have been handled or not: all are read again
                    in_flight.clear();
                    read_to = after;
                    if self.stopping() || !self.backoff(failures).await {
                        break;
                    }
                }
                Some(Outcome::OutOfTime) => break,
            }
        }
        if self.deadline.is_none() {
            self.stopping();
        }
        let handler = self.handler.clone();
        if let Outcome::OutOfTime = self.bounded(handler.close()).await {
            tracing::warn!(
                consumer = %self.name,
                kind = handler.kind(),
                "consumer handler did not close in time"
            );
        }
        self.flush_commit();
        let committed = self.counters.committed.load(Ordering::Relaxed);
        let left = self.log.last().saturating_sub(committed);
        if left > 0 {
            tracing::warn!(
                consumer = %self.name,
                group = %self.group,
                committed,
                left,
                "consumer stopped behind the log; the rest is handed over after the next start"
            );
        } else {
            tracing::info!(consumer = %self.name, group = %self.group, committed, "consumer stopped");
        }
    }

    /// Warns when the log no longer holds the changes right after `after`.
    fn warn_if_retention_overtook(&self, after: u64) {
        let first_kept = self.log.first();
        if first_kept > after + 1 {
            tracing::warn!(
                consumer = %self.name,
                group = %self.group,
                after,
                first_kept,
                lost = first_kept - after - 1,
                "log retention removed changes this consumer had not handled yet (raise [changes] retention_bytes / retention_hours)"
            );
        }
    }

    fn commit(&mut self, position: u64) {
        self.counters.committed.store(position, Ordering::Relaxed);
        let due = self.last_commit.is_none_or(|(at, _)| {
            self.options.commit_every.is_zero() || at.elapsed() >= self.options.commit_every
        });
        if due {
            self.write_commit(position);
        }
    }

    /// Writes the position the group has reached, if it was not written yet.
    fn flush_commit(&mut self) {
        let position = self.counters.committed.load(Ordering::Relaxed);
        if self.last_commit.is_some_and(|(_, p)| p != position) {
            self.write_commit(position);
        }
    }

    fn write_commit(&mut self, position: u64) {
        self.last_commit = Some((Instant::now(), position));
        // a failed commit only means the batch may be handed over again after a restart
        if let Err(e) = self.log.commit(&self.group, position) {
            tracing::warn!(
                consumer = %self.name,
                group = %self.group,
                position,
                error = %e,
                "consumer position not committed"
            );
        }
    }

    /// Counts a failure and warns at most every `warn_every`.
    fn failed(&mut self, message: &str, failures: u32) {
        self.counters.errors.fetch_add(1, Ordering::Relaxed);
        self.failures_unreported += 1;
        let due = self
            .last_warning
            .is_none_or(|t| t.elapsed() >= self.options.warn_every);
        if due {
            let behind = self
                .log
                .last()
                .saturating_sub(self.counters.committed.load(Ordering::Relaxed));
            tracing::warn!(
                consumer = %self.name,
                group = %self.group,
                kind = self.handler.kind(),
                error = message,
                consecutive_failures = failures,
                failures_since_last_warning = self.failures_unreported,
                behind,
                "consumer cannot deliver; retrying (writes are not affected)"
            );
            self.failures_unreported = 0;
            self.last_warning = Some(Instant::now());
        }
    }

    /// Waits before the next attempt; false when the consumer was stopped meanwhile.
    async fn backoff(&mut self, failures: u32) -> bool {
        let factor = 1u32 << failures.saturating_sub(1).min(16);
        let delay = self
            .options
            .backoff_min
            .saturating_mul(factor)
            .min(self.options.backoff_max);
        tokio::select! {
            _ = tokio::time::sleep(delay) => true,
            _ = self.stop.changed() => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshql_log::LogOptions;
    use std::sync::atomic::AtomicBool;

    /// Records what it receives; fails while `down` is set.
    #[derive(Default)]
    struct Recording {
        got: Mutex<Vec<(u64, String)>>,
        down: AtomicBool,
        closed: AtomicBool,
    }

    #[async_trait]
    impl Handler for Recording {
        fn kind(&self) -> &'static str {
            "test"
        }
        async fn enqueue(&self, batch: &[Change]) -> Result<Confirmation, HandlerError> {
            assert!(!batch.is_empty(), "an empty batch was enqueued");
            if self.down.load(Ordering::SeqCst) {
                return Err(HandlerError::new("down"));
            }
            let mut got = self.got.lock();
            for c in batch {
                got.push((c.position, c.change_id.clone()));
            }
            Ok(confirmed())
        }
        async fn close(&self) {
            self.closed.store(true, Ordering::SeqCst);
        }
    }

    fn record_of(entity: &str, i: usize) -> Vec<u8> {
        format!(
            r#"{{"change_id":"{entity}:h{i}:{}","entity":"{entity}","id":"h{i}","created_at":{},"op":"create","authorized_tokens":[],"correlation_id":null,"source":"0.{i}","payload":{{"name":"n{i}","id":"h{i}"}}}}"#,
            1000 + i,
            1000 + i
        )
        .into_bytes()
    }

    fn record(i: usize) -> Vec<u8> {
        record_of("hen", i)
    }

    fn append(log: &Log, from: usize, to: usize) {
        let records: Vec<Vec<u8>> = (from..to).map(record).collect();
        let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
        log.append(&refs).unwrap();
    }

    /// Appends one change per entity named, the i-th with id `h<from + i>`.
    fn append_entities(log: &Log, from: usize, entities: &[&str]) {
        let records: Vec<Vec<u8>> = entities
            .iter()
            .enumerate()
            .map(|(i, e)| record_of(e, from + i))
            .collect();
        let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
        log.append(&refs).unwrap();
    }

    fn options() -> ConsumerOptions {
        ConsumerOptions {
            batch: 7,
            in_flight: 3,
            backoff_min: Duration::from_millis(5),
            backoff_max: Duration::from_millis(20),
            drain_timeout: Duration::from_secs(2),
            warn_every: Duration::from_secs(30),
            entities: None,
            commit_every: Duration::ZERO,
            linger: Duration::ZERO,
        }
    }

    #[tokio::test]
    async fn a_throttled_group_position_is_written_when_quiet_and_on_stop() {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), LogOptions::default()).unwrap();
        let handler = Arc::new(Recording::default());
        let options = ConsumerOptions {
            commit_every: Duration::from_millis(300),
            ..options()
        };
        let consumer =
            Consumer::start("t1", "test-t1", log.clone(), handler.clone(), options).unwrap();
        append(&log, 0, 20);
        until("20 changes", || handler.got.lock().len() == 20).await;
        until("the lag", || consumer.stats().lag == 0).await;
        // batches of 7: the first was written at once, the rest waits for a quiet log
        assert_eq!(log.committed("test-t1").unwrap(), Some(7));
        until("written once quiet", || {
            log.committed("test-t1").unwrap() == Some(20)
        })
        .await;
        append(&log, 20, 22);
        until("22 changes", || handler.got.lock().len() == 22).await;
        consumer.stop().await;
        assert_eq!(
            log.committed("test-t1").unwrap(),
            Some(22),
            "written on stop"
        );
    }

    fn hens_only() -> ConsumerOptions {
        ConsumerOptions {
            entities: Some(vec!["hen".to_owned()]),
            ..options()
        }
    }

    async fn until(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[test]
    fn a_published_change_parses() {
        let mut json = Vec::new();
        crate::record::publish(9, &record(3), &mut json);
        let c = Change::parse(9, 1234, json).unwrap();
        assert_eq!(c.position, 9);
        assert_eq!(c.appended_at_ms, 1234);
        assert_eq!(c.change_id, "hen:h3:1003");
        assert_eq!(c.op, ChangeOp::Create);
        assert_eq!(c.payload_bytes(), br#"{"name":"n3","id":"h3"}"#);
        assert!(c.correlation_id.is_none());
    }

    #[tokio::test]
    async fn every_change_is_handed_over_in_order_and_the_position_committed() {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), LogOptions::default()).unwrap();
        append(&log, 0, 20);
        let handler = Arc::new(Recording::default());
        let consumer =
            Consumer::start("c1", "test-c1", log.clone(), handler.clone(), options()).unwrap();
        assert_eq!((consumer.name(), consumer.group()), ("c1", "test-c1"));
        until("20 changes", || handler.got.lock().len() == 20).await;
        append(&log, 20, 25);
        until("25 changes", || handler.got.lock().len() == 25).await;
        let positions: Vec<u64> = handler.got.lock().iter().map(|g| g.0).collect();
        assert_eq!(positions, (1..=25).collect::<Vec<_>>());
        until("the commit", || consumer.stats().committed == 25).await;
        let stats = consumer.stats();
        assert_eq!((stats.delivered, stats.errors, stats.lag), (25, 0, 0));
        assert_eq!(stats.lag_seconds, 0.0);
        consumer.stop().await;
        assert!(handler.closed.load(Ordering::SeqCst));
        assert_eq!(log.committed("test-c1").unwrap(), Some(25));
    }

    /// Settles one batch's confirmation.
    type Settle = tokio::sync::oneshot::Sender<Result<(), HandlerError>>;

    /// Confirms a batch only when the test says so; records every enqueue.
    #[derive(Default)]
    struct Held {
        enqueued: Mutex<Vec<Vec<u64>>>,
        confirm: Mutex<Vec<Option<Settle>>>,
    }

    impl Held {
        fn batches(&self) -> Vec<(u64, u64)> {
            let enqueued = self.enqueued.lock();
            enqueued.iter().map(|b| (b[0], b[b.len() - 1])).collect()
        }
        fn settle(&self, batch: usize, outcome: Result<(), HandlerError>) {
            let tx = self.confirm.lock()[batch].take().expect("not settled yet");
            let _ = tx.send(outcome);
        }
    }

    #[async_trait]
    impl Handler for Held {
        fn kind(&self) -> &'static str {
            "held"
        }
        async fn enqueue(&self, batch: &[Change]) -> Result<Confirmation, HandlerError> {
            assert!(!batch.is_empty(), "an empty batch was enqueued");
            let (tx, rx) = tokio::sync::oneshot::channel();
            self.enqueued
                .lock()
                .push(batch.iter().map(|c| c.position).collect());
            self.confirm.lock().push(Some(tx));
            Ok(Box::pin(async move {
                rx.await
                    .unwrap_or_else(|_| Err(HandlerError::new("confirmation dropped")))
            }))
        }
    }

    #[tokio::test]
    async fn batches_are_in_flight_together_and_committed_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), LogOptions::default()).unwrap();
        append(&log, 0, 20); // batches of 7: 1..=7, 8..=14, 15..=20
        let handler = Arc::new(Held::default());
        let options = ConsumerOptions {
            in_flight: 2,
            ..options()
        };
        let consumer =
            Consumer::start("p1", "test-p1", log.clone(), handler.clone(), options).unwrap();
        until("two batches enqueued", || handler.batches().len() == 2).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            handler.batches(),
            vec![(1, 7), (8, 14)],
            "at most two in flight"
        );
        assert_eq!(consumer.stats().committed, 0, "nothing confirmed yet");

        // the second confirmation first: nothing is committed before the first
        handler.settle(1, Ok(()));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(consumer.stats().committed, 0);
        handler.settle(0, Ok(()));
        until("both committed", || consumer.stats().committed == 14).await;
        until("the third batch", || handler.batches().len() == 3).await;
        assert_eq!(handler.batches()[2], (15, 20));
        handler.settle(2, Ok(()));
        until("all committed", || consumer.stats().committed == 20).await;
        assert_eq!(consumer.stats().delivered, 20);
        consumer.stop().await;
        assert_eq!(log.committed("test-p1").unwrap(), Some(20));
    }

    #[tokio::test]
    async fn a_failed_confirmation_hands_that_batch_and_every_later_one_over_again() {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), LogOptions::default()).unwrap();
        append(&log, 0, 20);
        let handler = Arc::new(Held::default());
        let consumer =
            Consumer::start("p2", "test-p2", log.clone(), handler.clone(), options()).unwrap();
        until("three batches enqueued", || handler.batches().len() == 3).await;
        handler.settle(0, Ok(()));
        until("the first committed", || consumer.stats().committed == 7).await;
        handler.settle(1, Err(HandlerError::new("broker lost it")));
        // the third batch was in flight: it is sent again after the second, whatever it did
        until("the retry", || handler.batches().len() == 5).await;
        assert_eq!(&handler.batches()[3..], &[(8, 14), (15, 20)]);
        assert_eq!(consumer.stats().errors, 1);
        handler.settle(3, Ok(()));
        handler.settle(4, Ok(()));
        until("all committed", || consumer.stats().committed == 20).await;
        consumer.stop().await;
        assert_eq!(log.committed("test-p2").unwrap(), Some(20));
    }

    #[tokio::test]
    async fn a_failing_handler_is_retried_and_the_consumer_resumes_after_its_commit() {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), LogOptions::default()).unwrap();
        append(&log, 0, 10);
        let handler = Arc::new(Recording::default());
        handler.down.store(true, Ordering::SeqCst);
        let consumer =
            Consumer::start("r2", "test-r2", log.clone(), handler.clone(), options()).unwrap();
        until("failures", || consumer.stats().errors >= 3).await;
        let stats = consumer.stats();
        assert_eq!((stats.committed, stats.lag), (0, 10));
        handler.down.store(false, Ordering::SeqCst);
        until("catch-up", || consumer.stats().lag == 0).await;
        consumer.stop().await;
        assert_eq!(handler.got.lock().len(), 10);

        // a new consumer of the same group resumes after position 10
        append(&log, 10, 13);
        let again = Arc::new(Recording::default());
        let consumer =
            Consumer::start("r2", "test-r2", log.clone(), again.clone(), options()).unwrap();
        until("the rest", || again.got.lock().len() == 3).await;
        consumer.stop().await;
        assert_eq!(again.got.lock()[0].0, 11);
    }

    #[tokio::test]
    async fn stop_drains_the_log_and_gives_up_on_a_dead_handler() {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), LogOptions::default()).unwrap();
        let handler = Arc::new(Recording::default());
        let consumer =
            Consumer::start("r3", "test-r3", log.clone(), handler.clone(), options()).unwrap();
        append(&log, 0, 30);
        consumer.stop().await;
        assert_eq!(
            handler.got.lock().len(),
            30,
            "stop hands over what the log holds"
        );

        append(&log, 30, 40);
        let dead = Arc::new(Recording::default());
        dead.down.store(true, Ordering::SeqCst);
        let consumer =
            Consumer::start("r3", "test-r3", log.clone(), dead.clone(), options()).unwrap();
        let started = Instant::now();
        consumer.stop().await;
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(log.committed("test-r3").unwrap(), Some(30));
        assert!(dead.closed.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn only_wanted_entities_are_handed_over_and_the_others_committed() {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), LogOptions::default()).unwrap();
        // 1..=30: hens at every third position, and a tail of coops only
        let entities: Vec<&str> = (0..30)
            .map(|i| if i % 3 == 0 { "hen" } else { "coop" })
            .collect();
        append_entities(&log, 0, &entities);
        append_entities(&log, 30, &["coop"; 25]);
        let handler = Arc::new(Recording::default());
        let consumer =
            Consumer::start("f1", "test-f1", log.clone(), handler.clone(), hens_only()).unwrap();
        until("the log's end committed", || {
            consumer.stats().committed == 55
        })
        .await;
        let got = handler.got.lock().clone();
        let want: Vec<u64> = (0..10).map(|i| 1 + 3 * i).collect();
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), want);
        assert!(got.iter().all(|g| g.1.starts_with("hen:")));
        let stats = consumer.stats();
        assert_eq!((stats.delivered, stats.lag, stats.errors), (10, 0, 0));
        assert_eq!(stats.lag_seconds, 0.0);

        // unwanted changes only: nothing is handed over, the position moves on
        append_entities(&log, 55, &["coop"; 5]);
        until("the new end committed", || consumer.stats().committed == 60).await;
        assert_eq!(consumer.stats().lag, 0);
        assert_eq!(handler.got.lock().len(), 10);
        append_entities(&log, 60, &["coop", "hen"]);
        until("the next hen", || handler.got.lock().len() == 11).await;
        assert_eq!(handler.got.lock()[10].0, 62);
        until("its commit", || consumer.stats().committed == 62).await;
        consumer.stop().await;
        assert_eq!(log.committed("test-f1").unwrap(), Some(62));
    }

    #[tokio::test]
    async fn a_page_with_nothing_wanted_is_committed_after_the_batches_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), LogOptions::default()).unwrap();
        // 1..=7 hens (one batch), 8..=20 coops (a page with nothing wanted)
        append(&log, 0, 7);
        append_entities(&log, 7, &["coop"; 13]);
        let handler = Arc::new(Held::default());
        let consumer =
            Consumer::start("f2", "test-f2", log.clone(), handler.clone(), hens_only()).unwrap();
        until("the batch enqueued", || handler.batches().len() == 1).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(handler.batches(), vec![(1, 7)], "no empty batch enqueued");
        assert_eq!(consumer.stats().committed, 0, "the coops wait for the hens");

        // the hens fail: read again from 0, the coops still wait
        handler.settle(0, Err(HandlerError::new("down")));
        until("the retry", || handler.batches().len() == 2).await;
        assert_eq!(handler.batches()[1], (1, 7));
        assert_eq!(consumer.stats().committed, 0);
        handler.settle(1, Ok(()));
        until("everything committed", || consumer.stats().committed == 20).await;
        assert_eq!(handler.batches().len(), 2);
        consumer.stop().await;
        assert_eq!(log.committed("test-f2").unwrap(), Some(20));
    }

    /// Confirms nothing until released.
    #[derive(Default)]
    struct Gate {
        open: AtomicBool,
        got: Mutex<Vec<u64>>,
    }

    #[async_trait]
    impl Handler for Gate {
        fn kind(&self) -> &'static str {
            "gate"
        }
        async fn enqueue(&self, batch: &[Change]) -> Result<Confirmation, HandlerError> {
            if !self.open.load(Ordering::SeqCst) {
                return Err(HandlerError::new("closed"));
            }
            self.got.lock().extend(batch.iter().map(|c| c.position));
            Ok(confirmed())
        }
    }

    #[tokio::test]
    async fn lag_seconds_is_the_age_of_the_oldest_change_not_committed() {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), LogOptions::default()).unwrap();
        let handler = Arc::new(Gate::default());
        let consumer =
            Consumer::start("s1", "test-s1", log.clone(), handler.clone(), options()).unwrap();
        assert_eq!(consumer.stats().lag_seconds, 0.0, "nothing to hand over");
        append(&log, 0, 3);
        tokio::time::sleep(Duration::from_millis(120)).await;
        append(&log, 3, 5);
        let stats = consumer.stats();
        assert_eq!((stats.committed, stats.lag), (0, 5));
        // the age of position 1, not of the last append
        assert!(
            stats.lag_seconds >= 0.1 && stats.lag_seconds < 10.0,
            "lag_seconds {}",
            stats.lag_seconds
        );
        handler.open.store(true, Ordering::SeqCst);
        until("catch-up", || consumer.stats().lag == 0).await;
        assert_eq!(consumer.stats().lag_seconds, 0.0);
        consumer.stop().await;
        assert_eq!(*handler.got.lock(), (1..=5).collect::<Vec<u64>>());
    }

    #[tokio::test]
    async fn a_resumed_consumer_starts_after_the_committed_position() {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), LogOptions::default()).unwrap();
        append_entities(&log, 0, &["hen", "coop", "hen", "coop"]);
        let first = Arc::new(Recording::default());
        let consumer =
            Consumer::start("a", "test-group", log.clone(), first.clone(), hens_only()).unwrap();
        until("the commit", || consumer.stats().committed == 4).await;
        consumer.stop().await;
        assert_eq!(
            first.got.lock().iter().map(|g| g.0).collect::<Vec<_>>(),
            vec![1, 3]
        );

        append_entities(&log, 4, &["coop", "hen", "coop"]);
        // another name, the same group: the group's position is what counts
        let second = Arc::new(Recording::default());
        let consumer =
            Consumer::start("b", "test-group", log.clone(), second.clone(), hens_only()).unwrap();
        assert_eq!(consumer.stats().committed, 4);
        until("the new end", || consumer.stats().committed == 7).await;
        consumer.stop().await;
        assert_eq!(
            second.got.lock().iter().map(|g| g.0).collect::<Vec<_>>(),
            vec![6]
        );

        // another group starts from the beginning
        let third = Arc::new(Recording::default());
        let consumer =
            Consumer::start("c", "other-group", log.clone(), third.clone(), options()).unwrap();
        until("everything", || third.got.lock().len() == 7).await;
        consumer.stop().await;
    }
}
