//! Running processors: one consumer of the log per processor, its batches applied through
//! the output entity's [`EntityService`].

use crate::plan::{Input, Item, PlanIo, Planner};
use crate::ProcessorPlan;
use async_trait::async_trait;
use meshql_changes::{
    confirmed, Change, Confirmation, Consumer, ConsumerError, ConsumerLog, ConsumerOptions,
    Handler, HandlerError,
};
use meshql_core::{
    now_millis, Credentials, DeadLetter, Grants, OutputBatch, OutputWrite, ReadContext, StoreError,
};
use meshql_engine::{EntityService, Session};
use meshql_log::{FileLock, LogError};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ProcessError {
    #[error("processor \"{processor}\": entity `{entity}` is not served by this config")]
    UnknownEntity { processor: String, entity: String },
    #[error(
        "processor \"{processor}\": the storage of `{entity}` cannot commit a processor's \
         outputs with its position (MongoDB: see the meshql-store-mongo docs; use SQLite, \
         PostgreSQL, MySQL/MariaDB or memory storage for a processor's output)"
    )]
    OutputUnsupported { processor: String, entity: String },
    #[error(
        "processor \"{processor}\": its output is at position {checkpoint} but the change log \
         ends at {last}: the log was replaced since; rebuild the projection \
         (`meshql projections rebuild {processor}`)"
    )]
    CheckpointAhead {
        processor: String,
        checkpoint: u64,
        last: u64,
    },
    #[error(
        "processor \"{processor}\" runs in another process on this machine ({source}): run each \
         processor once (`meshql serve --no-processors` beside `meshql process`)"
    )]
    RunningElsewhere { processor: String, source: LogError },
    #[error(
        "processor \"{processor}\": its output is at a position of change log {stored}, but \
         this service's log is {current} (its data directory was replaced while the storage \
         was kept): the processor is rebuilt from this log (`meshql projections rebuild \
         {processor}`), which starts by itself"
    )]
    LogReplaced {
        processor: String,
        stored: String,
        current: String,
    },
    #[error(transparent)]
    Consumer(#[from] ConsumerError),
}

/// Which processors to start.
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// Only this one (`meshql process --only NAME`).
    pub only: Option<String>,
    /// Where each running processor holds a lock file (`<name>.lock`), so that a processor
    /// runs in one process of the machine at a time.
    pub lock_dir: Option<std::path::PathBuf>,
}

/// What a processor has done, for `/metrics` and the console.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessorStats {
    pub name: String,
    pub kind: &'static str,
    pub output: String,
    pub inputs: Vec<String>,
    /// Input changes applied since start.
    pub processed: u64,
    /// Output versions written since start.
    pub written: u64,
    /// Batches committed since start.
    pub batches: u64,
    /// Dead letters in the output store (all time).
    pub dead_letters: u64,
    /// Failed batches since start (each retried).
    pub errors: u64,
    /// The last input position whose effects are committed.
    pub position: u64,
    /// Changes in the log after the consumer's committed position.
    pub lag: u64,
    /// Age of the oldest change not yet processed (0 when caught up).
    pub lag_seconds: f64,
}

#[derive(Default)]
struct Counters {
    processed: AtomicU64,
    written: AtomicU64,
    batches: AtomicU64,
    dead: AtomicU64,
}

pub(crate) struct ProcessorHandler {
    pub(crate) name: String,
    kind: &'static str,
    output_entity: String,
    planner: Arc<dyn Planner>,
    pub(crate) output: Arc<EntityService>,
    lookups: HashMap<String, Arc<EntityService>>,
    grants: Arc<Grants>,
    /// The last input position committed with the output.
    pub(crate) position: AtomicU64,
    /// Whether `position` (and the dead-letter count) were read from the output store: at
    /// the first batch, so that a store unreachable at start-up delays the processor
    /// instead of the server.
    loaded: std::sync::atomic::AtomicBool,
    /// The log whose end the stored position may not be past (log-fed processors).
    log: Option<Arc<dyn ConsumerLog>>,
    /// The identity of the log the position is in, committed with the outputs (state row
    /// [`LOG_ID`]) once per start, so that a position of another log is not read as this
    /// one's. `None`: not fed by the log, or a log without an identity.
    log_id: Option<String>,
    log_id_written: std::sync::atomic::AtomicBool,
    counters: Counters,
}

#[async_trait]
impl crate::source::Intake for ProcessorHandler {
    fn processor(&self) -> &str {
        &self.name
    }

    fn position(&self) -> u64 {
        self.position.load(Ordering::Acquire)
    }

    async fn ensure_loaded(&self) -> Result<(), HandlerError> {
        ProcessorHandler::ensure_loaded(self).await
    }

    async fn state(&self, keys: &[String]) -> Result<HashMap<String, String>, StoreError> {
        self.output.writer().output_state(&self.name, keys).await
    }

    async fn apply(
        &self,
        items: Vec<Item<'_>>,
        letters: Vec<DeadLetter>,
        last: u64,
        extra: Vec<meshql_core::StateWrite>,
    ) -> Result<(), HandlerError> {
        ProcessorHandler::apply(self, items, letters, last, extra).await
    }
}

/// How long a processor woken by a change waits for more before reading its batch.
const PROCESSOR_LINGER: Duration = Duration::from_millis(3);

/// The state row holding the identity of the log a processor's position is in.
const LOG_ID: &str = "log";

struct Io<'a>(&'a ProcessorHandler);

#[async_trait]
impl PlanIo for Io<'_> {
    async fn state(&self, keys: &[String]) -> Result<HashMap<String, String>, StoreError> {
        self.0
            .output
            .writer()
            .output_state(&self.0.name, keys)
            .await
    }

    async fn group(&self, group: &str) -> Result<Vec<(String, String)>, StoreError> {
        self.0
            .output
            .writer()
            .output_group(&self.0.name, group)
            .await
    }

    async fn current(&self, id: &str) -> Result<Option<Map<String, Value>>, StoreError> {
        let found = self
            .0
            .output
            .writer()
            .read(id, &ReadContext::LATEST)
            .await?;
        Ok(found.and_then(|e| e.payload_map().ok()))
    }

    async fn lookup(
        &self,
        entity: &str,
        id: &str,
    ) -> Result<Option<Map<String, Value>>, StoreError> {
        let Some(service) = self.0.lookups.get(entity) else {
            return Ok(None);
        };
        let found = service.writer().read(id, &ReadContext::LATEST).await?;
        Ok(found.and_then(|e| e.payload_map().ok()))
    }
}

/// The dead letter of an input read as `raw`.
fn letter_of(input: &Input, raw: &str, reason: String) -> DeadLetter {
    DeadLetter {
        position: input.position,
        change_id: input.change_id.clone(),
        entity: input.entity.clone(),
        reason,
        // an input read without text of its own (a database row) is kept as its payload
        input: if raw.is_empty() {
            Value::Object(input.payload.clone()).to_string()
        } else {
            raw.to_owned()
        },
        at: now_millis(),
    }
}

impl ProcessorHandler {
    fn letter(change: &Change, reason: String) -> DeadLetter {
        DeadLetter {
            position: change.position,
            change_id: change.change_id.clone(),
            entity: change.entity.clone(),
            reason,
            input: String::from_utf8_lossy(&change.json).into_owned(),
            at: now_millis(),
        }
    }

    /// Reads the committed position and the dead-letter count, once.
    pub(crate) async fn ensure_loaded(&self) -> Result<(), HandlerError> {
        if self.loaded.load(Ordering::Acquire) {
            return Ok(());
        }
        let writer = self.output.writer();
        let position = writer
            .output_position(&self.name)
            .await
            .map_err(HandlerError::new)?
            .unwrap_or(0);
        let dead = writer
            .dead_letter_count(&self.name)
            .await
            .map_err(HandlerError::new)?;
        if let (Some(current), true) = (&self.log_id, position > 0) {
            let stored = writer
                .output_state(&self.name, &[LOG_ID.to_owned()])
                .await
                .map_err(HandlerError::new)?
                .remove(LOG_ID);
            // a position without an identity (written before logs had one) is this log's
            if let Some(stored) = stored.filter(|s| s != current) {
                return Err(HandlerError::new(ProcessError::LogReplaced {
                    processor: self.name.clone(),
                    stored,
                    current: current.clone(),
                }));
            }
        }
        if let Some(log) = &self.log {
            if position > log.last() {
                return Err(HandlerError::new(ProcessError::CheckpointAhead {
                    processor: self.name.clone(),
                    checkpoint: position,
                    last: log.last(),
                }));
            }
        }
        self.position.store(position, Ordering::Release);
        self.counters.dead.store(dead, Ordering::Relaxed);
        self.loaded.store(true, Ordering::Release);
        Ok(())
    }

    async fn process(&self, batch: &[Change]) -> Result<(), HandlerError> {
        self.ensure_loaded().await?;
        let done = self.position.load(Ordering::Acquire);
        let Some(last) = batch.last().map(|c| c.position) else {
            return Ok(());
        };
        if last <= done {
            return Ok(()); // redelivered after a crash: already committed
        }
        let mut letters = Vec::new();
        let mut items = Vec::new();
        for c in batch.iter().filter(|c| c.position > done) {
            match serde_json::from_str::<Map<String, Value>>(c.payload.get()) {
                Ok(payload) => items.push(Item {
                    input: Input {
                        position: c.position,
                        change_id: c.change_id.clone(),
                        entity: c.entity.clone(),
                        id: c.id.clone(),
                        op: c.op,
                        created_at: c.created_at,
                        correlation_id: c.correlation_id.clone(),
                        payload,
                        // `last` follows the log: the most recent change wins
                        order: (0, c.position),
                        // the log holds a change once, and this processor's position says
                        // it was not applied: a create has no contribution yet
                        fresh: c.op == meshql_core::ChangeOp::Create,
                    },
                    raw: String::from_utf8_lossy(&c.json),
                }),
                Err(e) => letters.push(Self::letter(
                    c,
                    format!("the payload is not a JSON object: {e}"),
                )),
            }
        }
        self.apply(items, letters, last, Vec::new()).await
    }

    /// Plans `items`, sets aside what cannot be applied, and commits the writes, the state,
    /// `extra` state rows (a source's own positions) and the dead letters with `position`.
    pub(crate) async fn apply(
        &self,
        items: Vec<Item<'_>>,
        mut letters: Vec<DeadLetter>,
        last: u64,
        extra: Vec<meshql_core::StateWrite>,
    ) -> Result<(), HandlerError> {
        let (all, raws): (Vec<Input>, Vec<std::borrow::Cow<'_, str>>) =
            items.into_iter().map(|it| (it.input, it.raw)).unzip();
        let mut excluded = vec![false; all.len()];
        loop {
            let active: Vec<usize> = (0..all.len()).filter(|i| !excluded[*i]).collect();
            // the inputs are copied only once one is set aside (rare)
            let some: Vec<Input>;
            let plan_inputs: &[Input] = if active.len() == all.len() {
                &all
            } else {
                some = active.iter().map(|i| all[*i].clone()).collect();
                &some
            };
            let outcome = self
                .planner
                .plan(&Io(self), plan_inputs)
                .await
                .map_err(HandlerError::new)?;
            for (ai, reason) in &outcome.dead {
                let i = active[*ai];
                excluded[i] = true;
                letters.push(letter_of(&all[i], &raws[i], reason.clone()));
            }
            // an output the entity's schema refuses: blame the last input that touched it,
            // set it aside and plan again
            let mut culprit = None;
            for (write, touching) in &outcome.writes {
                let OutputWrite::Put { payload, .. } = write else {
                    continue;
                };
                let value: Value = serde_json::from_str(payload).unwrap_or(Value::Null);
                if let Err(e) = self.output.validate(value) {
                    let details = match &e {
                        meshql_engine::EngineError::Invalid(v) => {
                            serde_json::to_string(v).unwrap_or_default()
                        }
                        other => other.to_string(),
                    };
                    if let Some(ai) = touching.iter().rev().find(|ai| !excluded[active[**ai]]) {
                        culprit = Some((
                            active[*ai],
                            format!(
                                "the `{}` document it leads to is invalid: {details}",
                                self.output_entity
                            ),
                        ));
                    }
                    break;
                }
            }
            if let Some((i, reason)) = culprit {
                excluded[i] = true;
                letters.push(letter_of(&all[i], &raws[i], reason));
                continue;
            }
            let applied = excluded.iter().filter(|x| !**x).count() as u64;
            let dead = letters.len() as u64;
            let mut out = OutputBatch::new(self.name.clone(), last);
            out.writes = outcome.writes.into_iter().map(|(w, _)| w).collect();
            out.state = outcome.state;
            out.state.extend(extra);
            let writes_id = !self.log_id_written.load(Ordering::Acquire);
            if let (Some(id), true) = (&self.log_id, writes_id) {
                out.state.push(meshql_core::StateWrite {
                    key: LOG_ID.to_owned(),
                    group: None,
                    value: Some(id.clone()),
                });
            }
            out.dead_letters = letters;
            let session = Session {
                credentials: Credentials::Unrestricted,
                grants: self.grants.clone(),
                correlation_id: std::sync::OnceLock::from(format!("{}:{last}", self.name)),
                from_primary: false,
            };
            let written = self
                .output
                .apply_output(&session, out)
                .await
                .map_err(HandlerError::new)?;
            self.position.store(last, Ordering::Release);
            if writes_id {
                self.log_id_written.store(true, Ordering::Release);
            }
            let c = &self.counters;
            c.processed.fetch_add(applied, Ordering::Relaxed);
            c.written.fetch_add(written.len() as u64, Ordering::Relaxed);
            c.batches.fetch_add(1, Ordering::Relaxed);
            c.dead.fetch_add(dead, Ordering::Relaxed);
            if dead > 0 {
                tracing::warn!(processor = %self.name, dead, position = last, "inputs set aside as dead letters");
            }
            return Ok(());
        }
    }
}

#[async_trait]
impl Handler for ProcessorHandler {
    fn kind(&self) -> &'static str {
        self.kind
    }

    async fn enqueue(&self, batch: &[Change]) -> Result<Confirmation, HandlerError> {
        self.process(batch).await?;
        Ok(confirmed())
    }
}

/// What feeds a running processor.
enum Feed {
    /// The service's change log.
    Log(Consumer),
    /// Kafka topics or a NATS stream ([`crate::source`]).
    Source {
        stop: tokio::sync::watch::Sender<bool>,
        task: parking_lot::Mutex<Option<tokio::task::JoinHandle<()>>>,
        counters: Arc<crate::source::SourceCounters>,
    },
}

impl Feed {
    /// Stops after what the source holds is applied (bounded).
    async fn stop(&self) {
        match self {
            Feed::Log(consumer) => consumer.stop().await,
            Feed::Source { stop, task, .. } => {
                stop.send_replace(true);
                let task = task.lock().take();
                if let Some(task) = task {
                    let _ = task.await;
                }
            }
        }
    }

    /// (errors, lag, lag in seconds)
    fn progress(&self) -> (u64, u64, f64) {
        match self {
            Feed::Log(consumer) => {
                let c = consumer.stats();
                (c.errors, c.lag, c.lag_seconds)
            }
            Feed::Source { counters, .. } => (
                counters.errors.load(Ordering::Relaxed),
                counters.lag.load(Ordering::Relaxed),
                0.0,
            ),
        }
    }
}

/// A processor's feed and handler while it runs.
struct Active {
    feed: Feed,
    handler: Arc<ProcessorHandler>,
}

/// Where a rebuild is.
#[derive(Debug, Clone, PartialEq)]
pub enum RebuildState {
    /// No rebuild since start.
    Idle,
    /// Recomputing from the start of the log into a new table; reads see the old one.
    Running {
        position: u64,
        lag: u64,
    },
    /// Done: the new table took the old one's place.
    Done {
        position: u64,
        seconds: f64,
    },
    Failed {
        reason: String,
    },
}

struct Running {
    _lock: Option<FileLock>,
    plan: ProcessorPlan,
    output: Arc<EntityService>,
    lookups: HashMap<String, Arc<EntityService>>,
    active: parking_lot::Mutex<Option<Arc<Active>>>,
    rebuild: parking_lot::Mutex<RebuildState>,
    /// One rebuild at a time.
    rebuilding: tokio::sync::Mutex<()>,
}

/// The running processors of a service.
#[derive(Default)]
pub struct Processors {
    running: Vec<Running>,
    log: Option<Arc<dyn ConsumerLog>>,
}

/// Why a rebuild did not start or did not finish.
#[derive(Debug, Error)]
pub enum RebuildError {
    #[error("no processor named \"{0}\" runs here")]
    Unknown(String),
    #[error(
        "processor \"{0}\" reads a {1} source: only processors of the change log can be rebuilt"
    )]
    NotFromLog(String, &'static str),
    #[error("processor \"{0}\" is being rebuilt already")]
    Busy(String),
    #[error(
        "the change log no longer holds its first changes (it starts at position {first}): \
         a rebuild needs the whole log ([changes] retention)"
    )]
    LogTrimmed { first: u64 },
    #[error("processor \"{processor}\": {message}")]
    Failed { processor: String, message: String },
}

/// A processor's handler; `known` is its committed position and dead-letter count when the
/// caller knows them (else they are read at the first batch).
fn handler_for(
    plan: &ProcessorPlan,
    name: &str,
    output: Arc<EntityService>,
    lookups: HashMap<String, Arc<EntityService>>,
    known: Option<(u64, u64)>,
    log: Option<Arc<dyn ConsumerLog>>,
    log_id: Option<String>,
) -> Arc<ProcessorHandler> {
    let (position, dead) = known.unwrap_or((0, 0));
    Arc::new(ProcessorHandler {
        name: name.to_owned(),
        kind: plan.kind(),
        output_entity: plan.output().to_owned(),
        planner: plan.planner(),
        output,
        lookups,
        grants: Arc::new(Grants::unrestricted()),
        position: AtomicU64::new(position),
        loaded: std::sync::atomic::AtomicBool::new(known.is_some()),
        log,
        log_id,
        log_id_written: std::sync::atomic::AtomicBool::new(false),
        counters: Counters {
            dead: AtomicU64::new(dead),
            ..Counters::default()
        },
    })
}

fn log_feed(
    plan: &ProcessorPlan,
    name: &str,
    group: &str,
    log: Arc<dyn ConsumerLog>,
    handler: Arc<ProcessorHandler>,
) -> Result<Feed, ConsumerError> {
    Ok(Feed::Log(Consumer::start_on(
        name,
        group,
        log,
        handler,
        ConsumerOptions {
            batch: plan.batch(),
            // a batch's state depends on the one before it
            in_flight: 1,
            entities: Some(plan.reads()),
            // the position that counts is committed with the outputs
            commit_every: Duration::from_secs(1),
            // a transaction per batch: under a stream of single writes, gather a few
            // milliseconds of them into one
            // (15 ms was measured too: 73–79 µs of CPU per POST against 82–85, within noise,
            // for 12 ms more on every quiet change)
            linger: PROCESSOR_LINGER,
            ..ConsumerOptions::default()
        },
    )?))
}

impl Processors {
    pub fn stats(&self) -> Vec<ProcessorStats> {
        self.running
            .iter()
            .filter_map(|r| {
                let active = r.active.lock().clone()?;
                let (errors, lag, lag_seconds) = active.feed.progress();
                let h = &active.handler.counters;
                Some(ProcessorStats {
                    name: r.plan.name().to_owned(),
                    kind: r.plan.kind(),
                    output: r.plan.output().to_owned(),
                    inputs: r.plan.reads(),
                    processed: h.processed.load(Ordering::Relaxed),
                    written: h.written.load(Ordering::Relaxed),
                    batches: h.batches.load(Ordering::Relaxed),
                    dead_letters: h.dead.load(Ordering::Relaxed),
                    errors,
                    position: active.handler.position.load(Ordering::Relaxed),
                    lag,
                    lag_seconds,
                })
            })
            .collect()
    }

    /// Stops every processor after it applied what the log holds (bounded by the consumer's
    /// drain time).
    pub async fn stop(&self) {
        for r in &self.running {
            let active = r.active.lock().take();
            if let Some(active) = active {
                active.feed.stop().await;
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// Rebuilds, in the background, each processor of the log whose committed position
    /// belongs to another log ([`ProcessError::LogReplaced`]: a data directory replaced while
    /// the output's storage was kept). Its live consumer refuses to apply anything meanwhile;
    /// the rebuild recomputes it from this log, which the hub filled again from the stores.
    pub fn rebuild_if_log_replaced(self: &Arc<Self>) {
        let Some(current) = self.log.as_ref().and_then(|l| l.id()) else {
            return;
        };
        for r in self.running.iter().filter(|r| r.plan.source().is_none()) {
            let (name, output) = (r.plan.name().to_owned(), r.output.clone());
            let (processors, current) = (self.clone(), current.clone());
            tokio::spawn(async move {
                let mut failures: u32 = 0;
                let stored = loop {
                    match output
                        .writer()
                        .output_state(&name, &[LOG_ID.to_owned()])
                        .await
                    {
                        Ok(mut rows) => break rows.remove(LOG_ID),
                        Err(_) => {
                            // the store is down: the live consumer waits for it too
                            failures += 1;
                            let ms = (100u64 << failures.min(7)).min(10_000);
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                        }
                    }
                };
                let Some(stored) = stored.filter(|s| *s != current) else {
                    return;
                };
                tracing::warn!(processor = %name, %stored, %current, "the processor's position belongs to another change log; rebuilding it from this one");
                match processors.rebuild(&name).await {
                    Ok(state) => {
                        tracing::info!(processor = %name, ?state, "rebuilt on this change log")
                    }
                    Err(e) => {
                        tracing::error!(processor = %name, error = %e, "cannot rebuild on this change log")
                    }
                }
            });
        }
    }

    /// Where the last rebuild of `name` is.
    pub fn rebuild_state(&self, name: &str) -> Option<RebuildState> {
        self.running
            .iter()
            .find(|r| r.plan.name() == name)
            .map(|r| r.rebuild.lock().clone())
    }

    /// Recomputes processor `name` from the start of the log into a new table and swaps it
    /// in (see `OutputStore::swap_rebuilt`): reads see the old table until the swap, which is
    /// one transaction. The live processor goes on meanwhile; it stops only for the last
    /// catch-up and the swap, and starts again after the rebuild's position. REST writes to
    /// the output entity during a rebuild are lost with the old table.
    pub async fn rebuild(&self, name: &str) -> Result<RebuildState, RebuildError> {
        let r = self
            .running
            .iter()
            .find(|r| r.plan.name() == name)
            .ok_or_else(|| RebuildError::Unknown(name.to_owned()))?;
        if let Some(source) = r.plan.source() {
            return Err(RebuildError::NotFromLog(name.to_owned(), source.kind()));
        }
        let Ok(_one) = r.rebuilding.try_lock() else {
            return Err(RebuildError::Busy(name.to_owned()));
        };
        let log = self
            .log
            .clone()
            .expect("processors that read the log have it");
        if log.first() > 1 {
            return Err(RebuildError::LogTrimmed { first: log.first() });
        }
        let started = std::time::Instant::now();
        let result = self.rebuild_running(r, log).await;
        let state = match &result {
            Ok(position) => RebuildState::Done {
                position: *position,
                seconds: started.elapsed().as_secs_f64(),
            },
            Err(e) => RebuildState::Failed {
                reason: e.to_string(),
            },
        };
        *r.rebuild.lock() = state.clone();
        match result {
            Ok(_) => {
                tracing::info!(processor = %name, ?state, "rebuilt");
                Ok(state)
            }
            Err(e) => Err(e),
        }
    }

    async fn rebuild_running(
        &self,
        r: &Running,
        log: Arc<dyn ConsumerLog>,
    ) -> Result<u64, RebuildError> {
        let name = r.plan.name().to_owned();
        let failed = |message: String| RebuildError::Failed {
            processor: name.clone(),
            message,
        };
        let shadow = r
            .output
            .writer()
            .rebuild_store()
            .await
            .map_err(|e| failed(e.to_string()))?;
        let shadow_name = format!("{name}#rebuild");
        let group = format!("processor-{name}-rebuild");
        log.commit(&group, 0).map_err(|e| failed(e.to_string()))?;
        let handler = handler_for(
            &r.plan,
            &shadow_name,
            Arc::new(r.output.on_store(shadow)),
            r.lookups.clone(),
            Some((0, 0)),
            None,
            log.id(),
        );
        let feed = log_feed(&r.plan, &shadow_name, &group, log.clone(), handler.clone())
            .map_err(|e| failed(e.to_string()))?;
        caught_up(r, &feed, &handler).await;
        // the live processor stops for the last catch-up and the swap
        let live = r.active.lock().take();
        if let Some(live) = &live {
            live.feed.stop().await;
        }
        caught_up(r, &feed, &handler).await;
        feed.stop().await;
        let position = handler.position.load(Ordering::Acquire);
        let swapped = r
            .output
            .writer()
            .swap_rebuilt(&shadow_name, &name)
            .await
            .map_err(|e| failed(e.to_string()));
        if swapped.is_ok() {
            r.output.storage_replaced().await;
        }
        let committed = log.committed(&group).ok().flatten().unwrap_or(position);
        if swapped.is_ok() {
            let _ = log.commit(&format!("processor-{name}"), committed);
        }
        // the live processor starts again: after the rebuild's position, or where it was
        let resume = if swapped.is_ok() {
            position
        } else {
            live.as_ref()
                .map(|l| l.handler.position.load(Ordering::Acquire))
                .unwrap_or(0)
        };
        let dead = r
            .output
            .writer()
            .dead_letter_count(&name)
            .await
            .unwrap_or(0);
        let handler = handler_for(
            &r.plan,
            &name,
            r.output.clone(),
            r.lookups.clone(),
            Some((resume, dead)),
            Some(log.clone()),
            log.id(),
        );
        let feed = log_feed(
            &r.plan,
            &name,
            &format!("processor-{name}"),
            log,
            handler.clone(),
        )
        .map_err(|e| failed(e.to_string()))?;
        *r.active.lock() = Some(Arc::new(Active { feed, handler }));
        swapped.map(|_| position)
    }
}

/// Waits until a rebuild's feed has read the whole log, reporting its progress.
async fn caught_up(r: &Running, feed: &Feed, handler: &ProcessorHandler) {
    loop {
        let (_, lag, _) = feed.progress();
        *r.rebuild.lock() = RebuildState::Running {
            position: handler.position.load(Ordering::Relaxed),
            lag,
        };
        if lag == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts the processors of `plans` on `log` (each resuming after the position its output
/// committed), writing through `services`.
pub async fn start(
    plans: &[ProcessorPlan],
    services: &HashMap<String, Arc<EntityService>>,
    log: Arc<dyn ConsumerLog>,
    options: StartOptions,
) -> Result<Processors, ProcessError> {
    let mut running = Vec::new();
    for plan in plans {
        if !plan.enabled() || options.only.as_deref().is_some_and(|o| o != plan.name()) {
            continue;
        }
        let name = plan.name().to_owned();
        let service = |entity: &str| {
            services
                .get(entity)
                .cloned()
                .ok_or_else(|| ProcessError::UnknownEntity {
                    processor: name.clone(),
                    entity: entity.to_owned(),
                })
        };
        let lock = match &options.lock_dir {
            Some(dir) => Some(
                FileLock::acquire(&dir.join(format!("{name}.lock"))).map_err(|source| {
                    ProcessError::RunningElsewhere {
                        processor: name.clone(),
                        source,
                    }
                })?,
            ),
            None => None,
        };
        let output_entity = plan.output().to_owned();
        let output = service(&output_entity)?;
        if !output.writer().supports_outputs() {
            return Err(ProcessError::OutputUnsupported {
                processor: name,
                entity: output_entity,
            });
        }
        let mut lookups = HashMap::new();
        for entity in plan.lookups() {
            lookups.insert(entity.clone(), service(&entity)?);
        }
        // the position is read at the first batch: a store that is down now delays this
        // processor, not the service
        let log_bound = plan.source().is_none().then(|| log.clone());
        let log_id = log_bound.as_ref().and_then(|l| l.id());
        let handler = handler_for(
            plan,
            &name,
            output.clone(),
            lookups.clone(),
            None,
            log_bound,
            log_id,
        );
        let feed = match plan.source() {
            None => log_feed(
                plan,
                &name,
                &format!("processor-{name}"),
                log.clone(),
                handler.clone(),
            )?,
            Some(source) => {
                let (stop, stop_rx) = tokio::sync::watch::channel(false);
                let counters = Arc::new(crate::source::SourceCounters::default());
                let task = tokio::spawn(source.clone().run(crate::source::SourceRun {
                    name: name.clone(),
                    inputs: plan.inputs(),
                    batch: plan.batch(),
                    intake: handler.clone(),
                    counters: counters.clone(),
                    stop: stop_rx,
                }));
                Feed::Source {
                    stop,
                    task: parking_lot::Mutex::new(Some(task)),
                    counters,
                }
            }
        };
        tracing::info!(processor = %name, output = %output_entity, "processor started");
        running.push(Running {
            _lock: lock,
            plan: plan.clone(),
            output,
            lookups,
            active: parking_lot::Mutex::new(Some(Arc::new(Active { feed, handler }))),
            rebuild: parking_lot::Mutex::new(RebuildState::Idle),
            rebuilding: tokio::sync::Mutex::new(()),
        });
    }
    Ok(Processors {
        running,
        log: Some(log),
    })
}
