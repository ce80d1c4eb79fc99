//! Relays: the change log copied to an external broker (Kafka, NATS JetStream, ...), at
//! least once.
//!
//! A [`Relay`] is one task per configured relay. It is a consumer group of the log
//! (`relay-<name>`): it resumes after the group's committed position, reads a page of changes
//! and enqueues it on its [`Sink`], which hands back the broker's confirmation of that batch
//! to await later. Up to [`RelayOptions::in_flight`] batches are enqueued at once, so the
//! broker's round trip and the client's batching delay (Kafka's `linger.ms`) are paid once
//! for them all instead of once per batch, in turn. Confirmations are awaited oldest first,
//! and a batch's last position is committed only once it and every batch before it are
//! confirmed; a failed confirmation drops every later batch in flight and the relay reads
//! again after the last commit. A crash between a confirmation and its commit sends that
//! batch again after the restart, so delivery is *at least once*; every change
//! carries a `change_id` that is the same on every delivery, which lets a consumer be exactly
//! once by de-duplicating on it.
//!
//! A relay never touches the write path: writes go to the stores and the hub copies them
//! into the log whatever the relays do. A sink that fails (broker down, network cut) is
//! retried with capped exponential backoff, forever; the relay falls behind meanwhile (its
//! lag is in [`RelayStats`]) and catches up when the sink recovers. When caught up it waits
//! for the log's next append. [`Relay::stop`] sends what the log still holds (for a bounded
//! time), closes the sink and returns.

use crate::feed::{read_page, FeedFilter};
use async_trait::async_trait;
use meshql_core::ChangeOp;
use meshql_log::{Log, LogError};
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use thiserror::Error;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A sink's failure to deliver a batch (the whole batch is sent again).
#[derive(Debug, Clone, Error)]
#[error("{0}")]
pub struct SinkError(pub String);

impl SinkError {
    pub fn new(message: impl std::fmt::Display) -> Self {
        SinkError(message.to_string())
    }
}

/// The broker's confirmation of one enqueued batch: `Ok` once the broker has durably accepted
/// every change of it (a failure part-way is a failure of the batch).
pub type Confirmation = Pin<Box<dyn Future<Output = Result<(), SinkError>> + Send>>;

/// A confirmation that is already `Ok`: what a sink returns when it delivered the batch
/// before returning from [`Sink::enqueue`].
pub fn confirmed() -> Confirmation {
    Box::pin(std::future::ready(Ok(())))
}

/// Where a relay sends changes.
#[async_trait]
pub trait Sink: Send + Sync {
    /// The sink's type, as the config names it (`kafka`, `nats`).
    fn kind(&self) -> &'static str;
    /// Hands `batch` to the broker's client, in order and after every batch enqueued before
    /// it, and returns the broker's confirmation of the batch. An error means nothing of the
    /// batch needs confirming (it is enqueued again later). A sink whose client cannot keep
    /// batches in flight delivers before returning and returns [`confirmed`].
    async fn enqueue(&self, batch: &[RelayChange]) -> Result<Confirmation, SinkError>;
    /// Enqueues `batch` and waits for its confirmation.
    async fn send(&self, batch: &[RelayChange]) -> Result<(), SinkError> {
        self.enqueue(batch).await?.await
    }
    /// Flushes and releases the sink's connections; called once, when the relay stops.
    async fn close(&self) {}
}

/// One change as a relay delivers it.
#[derive(Debug, Clone)]
pub struct RelayChange {
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

impl RelayChange {
    /// Reads a published change (`{"position":N,…}`).
    pub fn parse(position: u64, json: Vec<u8>) -> Result<RelayChange, serde_json::Error> {
        let parts: Parts<'_> = serde_json::from_slice(&json)?;
        let payload = parts.payload.to_owned();
        Ok(RelayChange {
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
        })
    }

    /// The payload's JSON text.
    pub fn payload_bytes(&self) -> &[u8] {
        self.payload.get().as_bytes()
    }
}

/// Tuning of a relay.
#[derive(Debug, Clone)]
pub struct RelayOptions {
    /// Changes per batch at most.
    pub batch: usize,
    /// Batches enqueued on the sink and not yet confirmed, at most.
    pub in_flight: usize,
    /// First retry delay after a failed send; doubled per failure up to `backoff_max`.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// How long [`Relay::stop`] keeps sending what the log still holds.
    pub drain_timeout: Duration,
    /// Failures are logged at most this often (with the count since the last warning).
    pub warn_every: Duration,
}

impl Default for RelayOptions {
    fn default() -> Self {
        Self {
            batch: 500,
            in_flight: 4,
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(5),
            warn_every: Duration::from_secs(30),
        }
    }
}

/// The consumer group of relay `name` in the log.
pub fn relay_group(name: &str) -> String {
    format!("relay-{name}")
}

#[derive(Debug, Error)]
pub enum RelayError {
    #[error("relay \"{name}\": reading its committed position: {source}")]
    Log { name: String, source: LogError },
}

/// What a relay has done, for `/metrics`.
#[derive(Debug, Clone, PartialEq)]
pub struct RelayStats {
    pub name: String,
    /// The sink's type (`kafka`, `nats`).
    pub kind: &'static str,
    /// Changes the sink confirmed since start (a batch sent twice counts twice).
    pub sent: u64,
    /// Failed sends since start (each retried).
    pub errors: u64,
    /// The last position committed: every change up to it was confirmed by the sink.
    pub committed: u64,
    /// Changes in the log after `committed`.
    pub lag: u64,
    /// Time since the relay last confirmed a batch or was caught up (zero while caught up).
    pub since_success: Duration,
}

struct Counters {
    sent: AtomicU64,
    errors: AtomicU64,
    committed: AtomicU64,
    /// When the relay last confirmed a batch or found nothing to send.
    progress: Mutex<Instant>,
}

/// A running relay (see the module docs).
pub struct Relay {
    name: String,
    kind: &'static str,
    log: Log,
    counters: Arc<Counters>,
    stop: watch::Sender<bool>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Relay {
    /// Starts relaying the changes after the group's committed position to `sink`.
    pub fn start(
        name: &str,
        log: Log,
        sink: Arc<dyn Sink>,
        options: RelayOptions,
    ) -> Result<Relay, RelayError> {
        let group = relay_group(name);
        let committed = log
            .committed(&group)
            .map_err(|source| RelayError::Log {
                name: name.to_owned(),
                source,
            })?
            .unwrap_or(0);
        let counters = Arc::new(Counters {
            sent: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            committed: AtomicU64::new(committed),
            progress: Mutex::new(Instant::now()),
        });
        let (stop, stop_rx) = watch::channel(false);
        let worker = Worker {
            name: name.to_owned(),
            group,
            log: log.clone(),
            sink: sink.clone(),
            counters: counters.clone(),
            options,
            stop: stop_rx,
            deadline: None,
            failures_unreported: 0,
            last_warning: None,
        };
        tracing::info!(
            relay = name,
            kind = sink.kind(),
            after = committed,
            "relay started"
        );
        Ok(Relay {
            name: name.to_owned(),
            kind: sink.kind(),
            log,
            counters,
            stop,
            task: Mutex::new(Some(tokio::spawn(worker.run(committed)))),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn stats(&self) -> RelayStats {
        let committed = self.counters.committed.load(Ordering::Relaxed);
        let lag = self.log.last_offset().saturating_sub(committed);
        RelayStats {
            name: self.name.clone(),
            kind: self.kind,
            sent: self.counters.sent.load(Ordering::Relaxed),
            errors: self.counters.errors.load(Ordering::Relaxed),
            committed,
            lag,
            since_success: if lag == 0 {
                Duration::ZERO
            } else {
                self.counters.progress.lock().elapsed()
            },
        }
    }

    /// Sends what the log holds (for at most the drain timeout; what is left is sent after
    /// the next start), closes the sink and returns. Idempotent.
    pub async fn stop(&self) {
        self.stop.send_replace(true);
        let task = self.task.lock().take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

struct Worker {
    name: String,
    group: String,
    log: Log,
    sink: Arc<dyn Sink>,
    counters: Arc<Counters>,
    options: RelayOptions,
    stop: watch::Receiver<bool>,
    /// Set once stopping: sending goes on until then at most.
    deadline: Option<tokio::time::Instant>,
    failures_unreported: u64,
    last_warning: Option<Instant>,
}

/// A batch enqueued on the sink, not yet confirmed.
struct Pending {
    /// The batch's last position (committed once it is confirmed).
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

    /// Runs `f` to completion, or until the drain deadline once the relay is stopping.
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

    async fn run(mut self, committed: u64) {
        let mut appended = self.log.subscribe();
        let mut failures: u32 = 0;
        // every change up to `after` is confirmed and committed; up to `read_to` enqueued
        let mut after = committed;
        let mut read_to = committed;
        let mut in_flight: VecDeque<Pending> = VecDeque::new();
        let capacity = self.options.in_flight.max(1);
        loop {
            let stopping = self.stopping();
            if in_flight.len() < capacity {
                let page = match read_page(
                    &self.log,
                    read_to,
                    self.options.batch.max(1),
                    &FeedFilter::default(),
                ) {
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
                if page.last != read_to {
                    self.warn_if_retention_overtook(read_to);
                    let mut batch = Vec::with_capacity(page.changes.len());
                    for (position, json) in page.changes {
                        match RelayChange::parse(position, json) {
                            Ok(c) => batch.push(c),
                            Err(e) => {
                                tracing::warn!(relay = %self.name, position, error = %e, "unreadable change skipped by the relay")
                            }
                        }
                    }
                    let confirmation = if batch.is_empty() {
                        Outcome::Done(Ok(confirmed()))
                    } else {
                        let sink = self.sink.clone();
                        self.bounded(sink.enqueue(&batch)).await
                    };
                    match confirmation {
                        Outcome::Done(Ok(confirmation)) => {
                            in_flight.push_back(Pending {
                                last: page.last,
                                changes: batch.len(),
                                confirmation,
                            });
                            read_to = page.last;
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
                    tokio::select! {
                        _ = appended.changed() => {}
                        _ = self.stop.changed() => {}
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
                        .sent
                        .fetch_add(done.changes as u64, Ordering::Relaxed);
                    *self.counters.progress.lock() = Instant::now();
                    if failures > 0 {
                        tracing::info!(relay = %self.name, failures, "relay delivers again");
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
                    // later batches may have been accepted or not: all are read again
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
        let sink = self.sink.clone();
        if let Outcome::OutOfTime = self.bounded(sink.close()).await {
            tracing::warn!(relay = %self.name, "relay sink did not close in time");
        }
        let committed = self.counters.committed.load(Ordering::Relaxed);
        let left = self.log.last_offset().saturating_sub(committed);
        if left > 0 {
            tracing::warn!(relay = %self.name, committed, left, "relay stopped behind the log; the rest is sent after the next start");
        } else {
            tracing::info!(relay = %self.name, committed, "relay stopped");
        }
    }

    /// Warns when the log no longer holds the changes right after `after`.
    fn warn_if_retention_overtook(&self, after: u64) {
        let first_kept = self.log.first_offset();
        if first_kept > after + 1 {
            tracing::warn!(
                relay = %self.name,
                after,
                first_kept,
                lost = first_kept - after - 1,
                "log retention removed changes this relay had not sent yet (raise [changes] retention_bytes / retention_hours)"
            );
        }
    }

    fn commit(&self, position: u64) {
        self.counters.committed.store(position, Ordering::Relaxed);
        // a failed commit only means the batch may be sent again after a restart
        if let Err(e) = self.log.commit(&self.group, position) {
            tracing::warn!(relay = %self.name, position, error = %e, "relay position not committed");
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
                .last_offset()
                .saturating_sub(self.counters.committed.load(Ordering::Relaxed));
            tracing::warn!(
                relay = %self.name,
                kind = self.sink.kind(),
                error = message,
                consecutive_failures = failures,
                failures_since_last_warning = self.failures_unreported,
                behind,
                "relay cannot deliver; retrying (writes are not affected)"
            );
            self.failures_unreported = 0;
            self.last_warning = Some(Instant::now());
        }
    }

    /// Waits before the next attempt; false when the relay was stopped meanwhile.
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
    impl Sink for Recording {
        fn kind(&self) -> &'static str {
            "test"
        }
        async fn enqueue(&self, batch: &[RelayChange]) -> Result<Confirmation, SinkError> {
            if self.down.load(Ordering::SeqCst) {
                return Err(SinkError::new("down"));
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

    fn record(i: usize) -> Vec<u8> {
        format!(
            r#"{{"change_id":"hen:h{i}:{}","entity":"hen","id":"h{i}","created_at":{},"op":"create","authorized_tokens":[],"correlation_id":null,"source":"0.{i}","payload":{{"name":"n{i}","id":"h{i}"}}}}"#,
            1000 + i,
            1000 + i
        )
        .into_bytes()
    }

    fn append(log: &Log, from: usize, to: usize) {
        let records: Vec<Vec<u8>> = (from..to).map(record).collect();
        let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
        log.append(&refs).unwrap();
    }

    fn options() -> RelayOptions {
        RelayOptions {
            batch: 7,
            in_flight: 3,
            backoff_min: Duration::from_millis(5),
            backoff_max: Duration::from_millis(20),
            drain_timeout: Duration::from_secs(2),
            warn_every: Duration::from_secs(30),
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
        let c = RelayChange::parse(9, json).unwrap();
        assert_eq!(c.position, 9);
        assert_eq!(c.change_id, "hen:h3:1003");
        assert_eq!(c.op, ChangeOp::Create);
        assert_eq!(c.payload_bytes(), br#"{"name":"n3","id":"h3"}"#);
        assert!(c.correlation_id.is_none());
    }

    #[tokio::test]
    async fn every_change_is_sent_in_order_and_the_position_committed() {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), LogOptions::default()).unwrap();
        append(&log, 0, 20);
        let sink = Arc::new(Recording::default());
        let relay = Relay::start("r1", log.clone(), sink.clone(), options()).unwrap();
        until("20 changes", || sink.got.lock().len() == 20).await;
        append(&log, 20, 25);
        until("25 changes", || sink.got.lock().len() == 25).await;
        let positions: Vec<u64> = sink.got.lock().iter().map(|g| g.0).collect();
        assert_eq!(positions, (1..=25).collect::<Vec<_>>());
        until("the commit", || relay.stats().committed == 25).await;
        let stats = relay.stats();
        assert_eq!((stats.sent, stats.errors, stats.lag), (25, 0, 0));
        relay.stop().await;
        assert!(sink.closed.load(Ordering::SeqCst));
        assert_eq!(log.committed("relay-r1").unwrap(), Some(25));
    }

    /// Settles one batch's confirmation.
    type Settle = tokio::sync::oneshot::Sender<Result<(), SinkError>>;

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
        fn settle(&self, batch: usize, outcome: Result<(), SinkError>) {
            let tx = self.confirm.lock()[batch].take().expect("not settled yet");
            let _ = tx.send(outcome);
        }
    }

    #[async_trait]
    impl Sink for Held {
        fn kind(&self) -> &'static str {
            "held"
        }
        async fn enqueue(&self, batch: &[RelayChange]) -> Result<Confirmation, SinkError> {
            let (tx, rx) = tokio::sync::oneshot::channel();
            self.enqueued
                .lock()
                .push(batch.iter().map(|c| c.position).collect());
            self.confirm.lock().push(Some(tx));
            Ok(Box::pin(async move {
                rx.await
                    .unwrap_or_else(|_| Err(SinkError::new("confirmation dropped")))
            }))
        }
    }

    #[tokio::test]
    async fn batches_are_in_flight_together_and_committed_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), LogOptions::default()).unwrap();
        append(&log, 0, 20); // batches of 7: 1..=7, 8..=14, 15..=20
        let sink = Arc::new(Held::default());
        let options = RelayOptions {
            in_flight: 2,
            ..options()
        };
        let relay = Relay::start("p1", log.clone(), sink.clone(), options).unwrap();
        until("two batches enqueued", || sink.batches().len() == 2).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            sink.batches(),
            vec![(1, 7), (8, 14)],
            "at most two in flight"
        );
        assert_eq!(relay.stats().committed, 0, "nothing confirmed yet");

        // the second confirmation first: nothing is committed before the first
        sink.settle(1, Ok(()));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(relay.stats().committed, 0);
        sink.settle(0, Ok(()));
        until("both committed", || relay.stats().committed == 14).await;
        until("the third batch", || sink.batches().len() == 3).await;
        assert_eq!(sink.batches()[2], (15, 20));
        sink.settle(2, Ok(()));
        until("all committed", || relay.stats().committed == 20).await;
        assert_eq!(relay.stats().sent, 20);
        relay.stop().await;
        assert_eq!(log.committed("relay-p1").unwrap(), Some(20));
    }

    #[tokio::test]
    async fn a_failed_confirmation_sends_that_batch_and_every_later_one_again() {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), LogOptions::default()).unwrap();
        append(&log, 0, 20);
        let sink = Arc::new(Held::default());
        let relay = Relay::start("p2", log.clone(), sink.clone(), options()).unwrap();
        until("three batches enqueued", || sink.batches().len() == 3).await;
        sink.settle(0, Ok(()));
        until("the first committed", || relay.stats().committed == 7).await;
        sink.settle(1, Err(SinkError::new("broker lost it")));
        // the third batch was in flight: it is sent again after the second, whatever it did
        until("the retry", || sink.batches().len() == 5).await;
        assert_eq!(&sink.batches()[3..], &[(8, 14), (15, 20)]);
        assert_eq!(relay.stats().errors, 1);
        sink.settle(3, Ok(()));
        sink.settle(4, Ok(()));
        until("all committed", || relay.stats().committed == 20).await;
        relay.stop().await;
        assert_eq!(log.committed("relay-p2").unwrap(), Some(20));
    }

    #[tokio::test]
    async fn a_failing_sink_is_retried_and_the_relay_resumes_after_its_commit() {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), LogOptions::default()).unwrap();
        append(&log, 0, 10);
        let sink = Arc::new(Recording::default());
        sink.down.store(true, Ordering::SeqCst);
        let relay = Relay::start("r2", log.clone(), sink.clone(), options()).unwrap();
        until("failures", || relay.stats().errors >= 3).await;
        let stats = relay.stats();
        assert_eq!((stats.committed, stats.lag), (0, 10));
        sink.down.store(false, Ordering::SeqCst);
        until("catch-up", || relay.stats().lag == 0).await;
        relay.stop().await;
        assert_eq!(sink.got.lock().len(), 10);

        // a new relay with the same name resumes after position 10
        append(&log, 10, 13);
        let again = Arc::new(Recording::default());
        let relay = Relay::start("r2", log.clone(), again.clone(), options()).unwrap();
        until("the rest", || again.got.lock().len() == 3).await;
        relay.stop().await;
        assert_eq!(again.got.lock()[0].0, 11);
    }

    #[tokio::test]
    async fn stop_drains_the_log_and_gives_up_on_a_dead_sink() {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), LogOptions::default()).unwrap();
        let sink = Arc::new(Recording::default());
        let relay = Relay::start("r3", log.clone(), sink.clone(), options()).unwrap();
        append(&log, 0, 30);
        relay.stop().await;
        assert_eq!(sink.got.lock().len(), 30, "stop sends what the log holds");

        append(&log, 30, 40);
        let dead = Arc::new(Recording::default());
        dead.down.store(true, Ordering::SeqCst);
        let relay = Relay::start("r3", log.clone(), dead.clone(), options()).unwrap();
        let started = Instant::now();
        relay.stop().await;
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(log.committed("relay-r3").unwrap(), Some(30));
        assert!(dead.closed.load(Ordering::SeqCst));
    }
}
