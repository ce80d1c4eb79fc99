//! `changes`: what the change feed costs a writer, and how soon a write can be seen on it.
//!
//! 1. **Feed on vs off.** REST POST of a farm (as in `throughput`) with `--vus` closed-loop
//!    users, on the scenario's server (feed on) and on a second server started the same way
//!    but with `MESHQL_CHANGES=false` in its environment (the example config reads
//!    `[changes] enabled = ${MESHQL_CHANGES:-true}`), alternating on, off, on, off … for
//!    `--rounds`. The result is the median of the per-round ratios on / off (goal: at least
//!    0.90, i.e. at most 10 % lower with the feed on). No feed reader is connected meanwhile:
//!    this is the cost of copying every write into the log.
//! 2. **POST → SSE latency.** An event stream on `/_changes?since=now` (a hand-written reader,
//!    [`crate::sse`], on a thread and runtime of its own so that its arrival stamps do not
//!    wait for the load generator), then POSTs at a constant arrival rate (1,000/s, then
//!    10,000/s), each with a unique `x-correlation-id`. The send instant (just before the
//!    request is written) and the instant the open model had it due are kept per correlation
//!    id; the reader stamps each socket read before parsing it. Latency = arrival − send
//!    (`feed_latency_*`), and arrival − due (`feed_latency_from_due_*`, which also charges the
//!    generator's own lateness). Every POST answered 2xx must arrive within 10 s after the
//!    run, or the scenario fails its gate.
//!
//! 3. and 4. **Kafka** (with `--kafka BROKERS`): a relay's catch-up throughput and POST →
//!    Kafka latency, see [`kafka`].
//!
//! The gate first proves the feed is real: a POST with a correlation id shows up on a
//! `/_changes` page with its entity, id and operation, and the feed-off server answers 404 on
//! `/_changes` (so the comparison is not between two servers with the feed on).

use super::{Ctx, Example, Scenario};
use crate::client::{Session, Target};
use crate::gate::{self, ensure, GateResult, ScenarioError};
use crate::load::{OpenModel, Vu, Workload};
use crate::server::LocalServer;
use crate::sse::{Event, EventStream};
use async_trait::async_trait;
use bytes::Bytes;
use hdrhistogram::Histogram;
use http::Method;
use serde::Deserialize;
use serde_json::{json, Value};
use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

pub(super) mod kafka;

pub struct Changes;

/// Feed-on throughput must be at least this fraction of feed-off throughput.
const GOAL_RATIO: f64 = 0.90;
/// Goal for the p99 of POST → SSE (ms).
const GOAL_P99_MS: f64 = 5.0;
/// Arrival rates of the latency runs.
const RATES: [f64; 2] = [1_000.0, 10_000.0];
/// How long after a run changes may still arrive before they count as missing.
pub(super) const ARRIVAL_TIMEOUT: Duration = Duration::from_secs(10);
/// Histograms: microseconds up to one minute.
pub(super) const MAX_MICROS: u64 = 60_000_000;
/// The entity written.
pub(super) const PATH: &str = "/farm/api";

pub(super) fn farm_doc() -> Value {
    json!({"name": "feed", "farm_type": "homestead", "zone": "north"})
}

/// Closed-model POSTs (feed on vs off).
struct Post {
    body: Bytes,
}

#[async_trait]
impl Workload for Post {
    async fn iteration(&self, vu: &mut Vu, _due: Instant) {
        let r = vu
            .session
            .call("rest_post", Method::POST, PATH, Some(self.body.clone()))
            .await;
        vu.session
            .check("rest_post", r.is_some_and(|r| r.status.is_success()));
    }
}

/// Send, due and arrival instants of one latency run, indexed by the sequence number in the
/// correlation id (`<prefix><seq>`). Instants are nanoseconds after `base`, plus one (0 =
/// not yet).
pub(super) struct Tracker {
    base: Instant,
    pub(super) prefix: String,
    /// A change's payload field holding the key, instead of its `correlation_id`.
    payload_key: Option<&'static str>,
    pub(super) next: AtomicUsize,
    pub(super) sent: Vec<AtomicU64>,
    pub(super) due: Vec<AtomicU64>,
    pub(super) ok: Vec<AtomicBool>,
    arrived: Vec<AtomicU64>,
    pub(super) duplicates: AtomicU64,
    /// Changes on the stream that are not this run's (other writers).
    pub(super) foreign: AtomicU64,
    /// The reader stopped (stream ended or failed): nothing more will arrive.
    reader_gone: AtomicBool,
}

fn slots<T>(n: usize, f: impl Fn() -> T) -> Vec<T> {
    (0..n).map(|_| f()).collect()
}

impl Tracker {
    pub(super) fn new(capacity: usize, prefix: String) -> Self {
        Self {
            base: Instant::now(),
            prefix,
            payload_key: None,
            next: AtomicUsize::new(0),
            sent: slots(capacity, || AtomicU64::new(0)),
            due: slots(capacity, || AtomicU64::new(0)),
            ok: slots(capacity, || AtomicBool::new(false)),
            arrived: slots(capacity, || AtomicU64::new(0)),
            duplicates: AtomicU64::new(0),
            foreign: AtomicU64::new(0),
            reader_gone: AtomicBool::new(false),
        }
    }

    /// Matches changes by the payload's `field` instead of their correlation id (a
    /// processor's output carries its input's key in its document).
    pub(super) fn keyed_by_payload(mut self, field: &'static str) -> Self {
        self.payload_key = Some(field);
        self
    }

    pub(super) fn stamp(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.base).as_nanos() as u64 + 1
    }

    /// The reader saw `event`, read at `at`.
    fn arrive(&self, event: &Event, at: Instant) {
        #[derive(Deserialize)]
        struct Head<'a> {
            #[serde(borrow, default)]
            correlation_id: Option<Cow<'a, str>>,
        }
        if event.event != "change" {
            return;
        }
        if let Some(field) = self.payload_key {
            let key = serde_json::from_str::<Value>(&event.data)
                .ok()
                .and_then(|v| v["payload"][field].as_str().map(str::to_owned));
            self.arrive_correlated(key.as_deref(), at);
            return;
        }
        let head = serde_json::from_str::<Head>(&event.data).ok();
        self.arrive_correlated(head.as_ref().and_then(|h| h.correlation_id.as_deref()), at);
    }

    /// A change with this correlation id (if any) arrived at `at`.
    fn arrive_correlated(&self, correlation: Option<&str>, at: Instant) {
        let seq = correlation
            .and_then(|c| c.strip_prefix(self.prefix.as_str())?.parse::<usize>().ok())
            .filter(|&seq| seq < self.arrived.len());
        let Some(seq) = seq else {
            self.foreign.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let first = self.arrived[seq]
            .compare_exchange(0, self.stamp(at), Ordering::Relaxed, Ordering::Relaxed)
            .is_ok();
        if !first {
            self.duplicates.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Sequence numbers of the POSTs answered 2xx.
    pub(super) fn expected(&self) -> Vec<usize> {
        let n = self.next.load(Ordering::Relaxed).min(self.ok.len());
        (0..n)
            .filter(|&i| self.ok[i].load(Ordering::Relaxed))
            .collect()
    }

    /// Waits until every expected change has arrived, the reader is gone, or `timeout`;
    /// returns the ones still missing.
    pub(super) async fn wait_for(&self, mut pending: Vec<usize>, timeout: Duration) -> Vec<usize> {
        let deadline = Instant::now() + timeout;
        loop {
            pending.retain(|&i| self.arrived[i].load(Ordering::Relaxed) == 0);
            if pending.is_empty()
                || self.reader_gone.load(Ordering::Relaxed)
                || Instant::now() >= deadline
            {
                return pending;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Latencies (from send, from due) of every expected change that arrived.
    pub(super) fn latencies(&self, expected: &[usize]) -> (Histogram<u64>, Histogram<u64>) {
        let new = || Histogram::new_with_bounds(1, MAX_MICROS, 3).expect("static bounds");
        let (mut from_send, mut from_due) = (new(), new());
        for &i in expected {
            let arrived = self.arrived[i].load(Ordering::Relaxed);
            if arrived == 0 {
                continue;
            }
            let micros = |from: u64| (arrived.saturating_sub(from) / 1000).clamp(1, MAX_MICROS);
            let _ = from_send.record(micros(self.sent[i].load(Ordering::Relaxed)));
            let _ = from_due.record(micros(self.due[i].load(Ordering::Relaxed)));
        }
        (from_send, from_due)
    }
}

/// Open-model POSTs of `body` to the farm's REST path, each with its own correlation id.
pub(super) struct TrackedPost {
    pub(super) body: Bytes,
    pub(super) tracker: Arc<Tracker>,
}

#[async_trait]
impl Workload for TrackedPost {
    async fn iteration(&self, vu: &mut Vu, due: Instant) {
        let t = &self.tracker;
        let seq = t.next.fetch_add(1, Ordering::Relaxed);
        if seq >= t.sent.len() {
            return; // the model schedules exactly `capacity` iterations; never reached
        }
        let id = format!("{}{seq}", t.prefix);
        t.due[seq].store(t.stamp(due), Ordering::Relaxed);
        t.sent[seq].store(t.stamp(Instant::now()), Ordering::Relaxed);
        let r = vu
            .session
            .call_with(
                "rest_post",
                Method::POST,
                PATH,
                &[("x-correlation-id", &id)],
                Some(self.body.clone()),
            )
            .await;
        let ok = r.is_some_and(|r| r.status.is_success());
        t.ok[seq].store(ok, Ordering::Relaxed);
        vu.session.check("rest_post", ok);
    }
}

/// The event-stream reader, on a thread of its own.
pub(super) struct Reader {
    stop: Option<oneshot::Sender<()>>,
    done: oneshot::Receiver<Option<String>>,
}

impl Reader {
    /// Opens the stream; returns once the server has answered with its head (from then on
    /// every change after `since=now` is on it).
    async fn start(target: &Target, tracker: Arc<Tracker>) -> Result<Self, String> {
        Self::start_on(target, "/_changes?since=now", tracker).await
    }

    /// The reader of the event stream at `path` (a `/_changes` query).
    pub(super) async fn start_on(
        target: &Target,
        path: &str,
        tracker: Arc<Tracker>,
    ) -> Result<Self, String> {
        let authority = target.authority().to_string();
        let path = target.path(path);
        let (ready_tx, ready_rx) = oneshot::channel::<Result<(), String>>();
        let (stop_tx, mut stop_rx) = oneshot::channel::<()>();
        let (done_tx, done_rx) = oneshot::channel::<Option<String>>();
        std::thread::Builder::new()
            .name("feed-reader".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                rt.block_on(async move {
                    let mut stream = match EventStream::connect(&authority, &path, &[]).await {
                        Ok(s) => s,
                        Err(e) => {
                            let _ = ready_tx.send(Err(format!("GET {path}: {e}")));
                            return;
                        }
                    };
                    let _ = ready_tx.send(Ok(()));
                    let mut events = Vec::new();
                    let error = loop {
                        tokio::select! {
                            biased;
                            _ = &mut stop_rx => break None,
                            r = stream.next_batch(&mut events) => match r {
                                Ok(Some(at)) => {
                                    for e in events.drain(..) {
                                        tracker.arrive(&e, at);
                                    }
                                }
                                Ok(None) => break Some("the server ended the event stream".to_string()),
                                Err(e) => break Some(format!("event stream: {e}")),
                            },
                        }
                    };
                    tracker.reader_gone.store(true, Ordering::Relaxed);
                    let _ = done_tx.send(error);
                });
            })
            .map_err(|e| format!("cannot start the feed reader thread: {e}"))?;
        match ready_rx.await {
            Ok(Ok(())) => Ok(Self {
                stop: Some(stop_tx),
                done: done_rx,
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err("the feed reader thread ended before connecting".into()),
        }
    }

    /// Stops the reader; returns why it had stopped by itself, if it had.
    pub(super) async fn stop(mut self) -> Option<String> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.done.await.unwrap_or(None)
    }
}

pub(super) fn open_model(rate: f64, duration: Duration) -> OpenModel {
    let pre = ((rate / 10.0) as usize).clamp(10, 100);
    OpenModel {
        rate,
        duration,
        pre_allocated: pre,
        max_workers: pre * 4,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

pub(super) fn ms(micros: u64) -> f64 {
    micros as f64 / 1000.0
}

/// `/_changes` must carry a POST made with a correlation id: entity, id and operation.
async fn gate_feed(s: &mut Session) -> GateResult<()> {
    let now = gate::get_json(s, "/_changes?since=now&limit=1").await?;
    let since = now.get("last").and_then(Value::as_u64).ok_or_else(|| {
        ScenarioError::Gate(format!("/_changes?since=now answered no `last`: {now}"))
    })?;
    let correlation = format!("bench-gate-{}", uuid::Uuid::new_v4().simple());
    let reply = s
        .send_with(
            Method::POST,
            PATH,
            &[("x-correlation-id", &correlation)],
            Some(Bytes::from(farm_doc().to_string())),
        )
        .await
        .map_err(|e| ScenarioError::Setup(format!("POST {PATH}: {e}")))?;
    ensure(reply.status.is_success(), || {
        format!("POST {PATH} answered {}", reply.status)
    })?;
    let id = reply
        .json()
        .and_then(|v| v.get("id").and_then(Value::as_str).map(str::to_owned))
        .ok_or_else(|| ScenarioError::Gate(format!("POST {PATH} answered no id")))?;
    // the feed may first answer with writes made before this one (a long poll returns as
    // soon as there is anything after `since`): read on until this write or the deadline
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut after = since;
    let (found, page) = loop {
        let page = gate::get_json(
            s,
            &format!("/_changes?since={after}&limit=100&wait_ms=1000"),
        )
        .await?;
        let found = page
            .get("changes")
            .and_then(Value::as_array)
            .and_then(|changes| {
                changes
                    .iter()
                    .find(|c| c.get("correlation_id") == Some(&json!(correlation)))
                    .cloned()
            });
        after = page.get("last").and_then(Value::as_u64).unwrap_or(after);
        if found.is_some() || std::time::Instant::now() >= deadline {
            break (found, page);
        }
    };
    ensure(
        found.is_some_and(|c| {
            c.get("entity") == Some(&json!("farm"))
                && c.get("id") == Some(&json!(id))
                && c.get("op") == Some(&json!("create"))
        }),
        || {
            format!("a POST with x-correlation-id {correlation} (farm {id}) is not on /_changes after position {since}: {page}")
        },
    )
}

/// Feed on vs off, alternating for `--rounds`.
/// One alternating comparison: [`alternate`]'s per-round req/s of the scenario's server and
/// of a second one started like it.
pub(super) struct Alternation {
    pub on: Vec<f64>,
    pub off: Vec<f64>,
    pub ratios: Vec<f64>,
}

/// Runs `workload` (closed, `ctx.constant(8)`) alternately on the scenario's server (`<label>_on`)
/// and on a second one started the same way but with `env` set (`<label>_off`), for
/// `--rounds`; `check_off` first proves the second server is what it should be. Each round's
/// on / off ratio is kept on the "on" run as `metric`. `None` without a local server.
pub(super) async fn alternate(
    ctx: &mut Ctx,
    env: (&str, &str),
    label: &str,
    metric: &str,
    workload: Arc<dyn Workload>,
    check_off: impl AsyncFnOnce(&mut Session) -> GateResult<()>,
) -> GateResult<Option<Alternation>> {
    let Some(on) = ctx.server.as_ref() else {
        return Ok(None);
    };
    let mut spec = on.spec().clone();
    spec.env.retain(|(k, _)| k != env.0);
    spec.env.push((env.0.into(), env.1.into()));
    let off = LocalServer::start(spec)
        .await
        .map_err(|e| ScenarioError::Setup(format!("the server with {}={}: {e}", env.0, env.1)))?;
    let mut off_target =
        Target::parse(&off.url()).map_err(|e| ScenarioError::Setup(e.to_string()))?;
    let mut off = Some(off);
    check_off(&mut Session::new(off_target.clone())).await?;
    let model = ctx.constant(8);
    let rounds = ctx.opts.rounds.max(1);
    let mut out = Alternation {
        on: Vec::new(),
        off: Vec::new(),
        ratios: Vec::new(),
    };
    for round in 1..=rounds {
        let suffix = if rounds > 1 {
            format!(" #{round}")
        } else {
            String::new()
        };
        let r_on = ctx
            .closed(&format!("{label}_on{suffix}"), workload.clone(), &model)
            .await;
        // the same run against the second server, sampled like the first
        std::mem::swap(&mut ctx.target, &mut off_target);
        std::mem::swap(&mut ctx.server, &mut off);
        let r_off = ctx
            .closed(&format!("{label}_off{suffix}"), workload.clone(), &model)
            .await;
        std::mem::swap(&mut ctx.target, &mut off_target);
        std::mem::swap(&mut ctx.server, &mut off);
        let ratio = if r_off.overall.rps > 0.0 {
            r_on.overall.rps / r_off.overall.rps
        } else {
            0.0
        };
        let n = ctx.runs.len();
        if let Some(run) = ctx.runs.get_mut(n - 2) {
            run.metrics.insert(metric.into(), ratio);
        }
        out.on.push(r_on.overall.rps);
        out.off.push(r_off.overall.rps);
        out.ratios.push(ratio);
    }
    drop(off);
    Ok(Some(out))
}

async fn on_versus_off(ctx: &mut Ctx) -> GateResult<()> {
    let workload: Arc<dyn Workload> = Arc::new(Post {
        body: Bytes::from(farm_doc().to_string()),
    });
    let compared = alternate(
        ctx,
        ("MESHQL_CHANGES", "false"),
        "rest_post_feed",
        "feed_on_of_off",
        workload,
        async |s: &mut Session| {
            let reply = s
                .send(Method::GET, "/_changes?since=now", None)
                .await
                .map_err(|e| ScenarioError::Setup(format!("GET /_changes: {e}")))?;
            ensure(reply.status == http::StatusCode::NOT_FOUND, || {
                format!(
                    "the server started with MESHQL_CHANGES=false still serves /_changes ({}): its config must read `[changes] enabled = ${{MESHQL_CHANGES:-true}}`",
                    reply.status
                )
            })?;
            let id = gate::create(s, PATH, &farm_doc()).await?;
            let doc = gate::get_json(s, &format!("{PATH}/{id}")).await?;
            gate::expect_eq(
                &doc,
                "name",
                &farm_doc()["name"],
                "feed-off server: REST read",
            )
        },
    )
    .await?;
    let Some(Alternation {
        on: on_rps,
        off: off_rps,
        ratios,
    }) = compared
    else {
        ctx.note(
            "feed on vs off: not measured (needs servers the bench starts; run without --url)",
        );
        return Ok(());
    };
    let rounds = ratios.len();
    let r = median(ratios.clone());
    let rounds_text = if rounds > 1 {
        format!(
            " (rounds: {})",
            ratios
                .iter()
                .map(|r| format!("{r:.3}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    } else {
        String::new()
    };
    ctx.note(format!(
        "REST POST, {} users: feed on {:.0} req/s, feed off {:.0} req/s (medians of {rounds} round(s)); on / off = {r:.3}{rounds_text}, goal ≥ {GOAL_RATIO} (at most 10 % lower): {}",
        ctx.opts.vus,
        median(on_rps),
        median(off_rps),
        if r >= GOAL_RATIO { "met" } else { "NOT met" }
    ));
    Ok(())
}

/// Where the latency runs read the changes.
enum Via {
    /// `/_changes` as an event stream.
    Sse,
    /// The topic a Kafka relay writes the entity's changes to.
    Kafka { brokers: String, topic: String },
}

impl Via {
    fn key(&self) -> &'static str {
        match self {
            Via::Sse => "sse",
            Via::Kafka { .. } => "kafka",
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Via::Sse => "SSE",
            Via::Kafka { .. } => "Kafka",
        }
    }

    fn source(&self) -> String {
        match self {
            Via::Sse => "the /_changes event stream".into(),
            Via::Kafka { topic, .. } => format!("Kafka topic {topic}"),
        }
    }

    fn goal_p99_ms(&self) -> f64 {
        match self {
            Via::Sse => GOAL_P99_MS,
            Via::Kafka { .. } => kafka::GOAL_P99_MS,
        }
    }

    async fn reader(&self, target: &Target, tracker: Arc<Tracker>) -> Result<Reader, String> {
        match self {
            Via::Sse => Reader::start(target, tracker).await,
            Via::Kafka { brokers, topic } => kafka::reader(brokers, topic, tracker).await,
        }
    }
}

/// POST → change on `via` at each rate; returns the problems (missing changes) to fail the
/// gate with.
async fn latency(ctx: &mut Ctx, via: &Via) -> GateResult<Vec<String>> {
    let duration = ctx.opts.duration.unwrap_or(Duration::from_secs(10));
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let body = Bytes::from(farm_doc().to_string());
    let mut problems = Vec::new();
    for rate in RATES {
        let model = open_model(rate, duration);
        let prefix = format!("bench-{}-{rate:.0}-", &tag[..8]);
        let tracker = Arc::new(Tracker::new(model.iterations() as usize, prefix));
        let reader = via
            .reader(&ctx.target, tracker.clone())
            .await
            .map_err(|e| ScenarioError::Gate(format!("cannot read {}: {e}", via.source())))?;
        let label = format!("post_to_{}_{rate:.0}/s", via.key());
        let run = ctx
            .open(
                &label,
                Arc::new(TrackedPost {
                    body: body.clone(),
                    tracker: tracker.clone(),
                }),
                &model,
            )
            .await;
        let expected = tracker.expected();
        let waited = Instant::now();
        let missing = tracker.wait_for(expected.clone(), ARRIVAL_TIMEOUT).await;
        let waited = waited.elapsed();
        let reader_error = reader.stop().await;
        let (from_send, from_due) = tracker.latencies(&expected);
        let received = expected.len() - missing.len();
        let duplicates = tracker.duplicates.load(Ordering::Relaxed);
        let foreign = tracker.foreign.load(Ordering::Relaxed);
        if let Some(r) = ctx.runs.last_mut() {
            let m = &mut r.metrics;
            if !from_send.is_empty() {
                for (name, q) in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99)] {
                    m.insert(
                        format!("feed_latency_{name}_ms"),
                        ms(from_send.value_at_quantile(q)),
                    );
                }
                m.insert("feed_latency_max_ms".into(), ms(from_send.max()));
                m.insert(
                    "feed_latency_from_due_p50_ms".into(),
                    ms(from_due.value_at_quantile(0.5)),
                );
                m.insert(
                    "feed_latency_from_due_p99_ms".into(),
                    ms(from_due.value_at_quantile(0.99)),
                );
            }
            m.insert("feed_changes_received".into(), received as f64);
            m.insert("feed_changes_missing".into(), missing.len() as f64);
            if duplicates > 0 {
                m.insert("feed_changes_duplicated".into(), duplicates as f64);
            }
        }
        let p99 = ms(from_send.value_at_quantile(0.99));
        ctx.note(format!(
            "POST → {} at {rate:.0}/s offered ({:.0}/s achieved, {} dropped, {} POSTs answered 2xx): from send p50 {:.2} · p90 {:.2} · p99 {:.2} · max {:.2} ms (goal p99 < {} ms: {}); from due p50 {:.2} · p99 {:.2} ms; {received} changes received, {} missing{}{}",
            via.name(),
            run.overall.rps,
            run.dropped,
            expected.len(),
            ms(from_send.value_at_quantile(0.5)),
            ms(from_send.value_at_quantile(0.9)),
            p99,
            ms(from_send.max()),
            via.goal_p99_ms(),
            if from_send.is_empty() {
                "not measured"
            } else if p99 < via.goal_p99_ms() {
                "met"
            } else {
                "NOT met"
            },
            ms(from_due.value_at_quantile(0.5)),
            ms(from_due.value_at_quantile(0.99)),
            missing.len(),
            if duplicates > 0 {
                format!(", {duplicates} delivered twice")
            } else {
                String::new()
            },
            if foreign > 0 {
                format!(", {foreign} other changes on the stream")
            } else {
                String::new()
            },
        ));
        if run.dropped > 0 || run.overall.rps < rate * 0.95 {
            ctx.note(format!(
                "{rate:.0}/s was not sustained here: {:.0} POSTs/s answered, {} iterations dropped (no free worker of {})",
                run.overall.rps, run.dropped, model.max_workers
            ));
        }
        if !missing.is_empty() {
            let first: Vec<String> = missing
                .iter()
                .take(5)
                .map(|i| format!("{}{i}", tracker.prefix))
                .collect();
            problems.push(format!(
                "{rate:.0}/s: {} of {} changes never arrived on {} within {:.1} s after the run (first: {}){}",
                missing.len(),
                expected.len(),
                via.source(),
                waited.as_secs_f64(),
                first.join(", "),
                reader_error.map_or(String::new(), |e| format!("; {e}"))
            ));
        }
    }
    ctx.note(match via {
        Via::Sse => "SSE latency = when the reader read the change's bytes from the socket − just before the POST was written (from due: − when the open model had the POST due); the reader runs on a thread of its own",
        Via::Kafka { .. } => "Kafka latency = when the bench's consumer (librdkafka, its own thread, partitions assigned before the run) received the relay's message − just before the POST was written; it includes the relay's linger.ms (5) and the broker's acks=all",
    });
    Ok(problems)
}

#[async_trait]
impl Scenario for Changes {
    fn name(&self) -> &'static str {
        "changes"
    }
    fn description(&self) -> &'static str {
        "change feed: REST POST with the feed on vs off (a second server, MESHQL_CHANGES=false; --rounds), then POST → change on /_changes SSE at 1,000/s and 10,000/s; with --kafka, a Kafka relay's catch-up rate and POST → Kafka at the same rates (goals: on ≥ 0.90 × off; SSE p99 < 5 ms; relay ≥ 50,000/s; Kafka p99 < 25 ms)"
    }
    fn example(&self) -> Example {
        Example::EggEconomy
    }
    async fn run(&self, ctx: &mut Ctx) -> GateResult<()> {
        let mut s = ctx.session();
        let id = gate::create(&mut s, PATH, &farm_doc()).await?;
        let doc = gate::get_json(&mut s, &format!("{PATH}/{id}")).await?;
        gate::expect_eq(&doc, "name", &farm_doc()["name"], "REST read")?;
        gate_feed(&mut s).await?;
        drop(s);
        on_versus_off(ctx).await?;
        let mut problems = latency(ctx, &Via::Sse).await?;
        problems.extend(kafka::run(ctx).await?);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ScenarioError::Gate(problems.join("; ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(correlation: &str) -> Event {
        Event {
            event: "change".into(),
            data: json!({"position": 1, "entity": "farm", "correlation_id": correlation, "payload": {"name": "x"}}).to_string(),
            id: "1".into(),
        }
    }

    #[test]
    fn arrivals_are_matched_by_correlation_id() {
        let t = Tracker::new(4, "bench-ab-1000-".into());
        for i in 0..3 {
            t.next.fetch_add(1, Ordering::Relaxed);
            t.sent[i].store(
                t.stamp(t.base + Duration::from_millis(i as u64)),
                Ordering::Relaxed,
            );
            t.due[i].store(t.stamp(t.base), Ordering::Relaxed);
            t.ok[i].store(i != 1, Ordering::Relaxed); // POST 1 failed: not expected
        }
        let later = t.base + Duration::from_millis(5);
        t.arrive(&change("bench-ab-1000-0"), later);
        t.arrive(&change("bench-ab-1000-0"), later);
        t.arrive(&change("bench-ab-1000-9"), later); // out of range
        t.arrive(&change("someone-else"), later);
        t.arrive(
            &Event {
                event: "message".into(),
                data: "{}".into(),
                id: String::new(),
            },
            later,
        );
        assert_eq!(t.expected(), vec![0, 2]);
        assert_eq!(t.duplicates.load(Ordering::Relaxed), 1);
        assert_eq!(t.foreign.load(Ordering::Relaxed), 2);
        let (send, due) = t.latencies(&t.expected());
        assert_eq!(send.len(), 1);
        assert!((send.max() as i64 - 5000).abs() < 10, "{}", send.max());
        assert!((due.max() as i64 - 5000).abs() < 10);
        t.arrive(&change("bench-ab-1000-2"), later + Duration::from_millis(1));
        let (send, due) = t.latencies(&t.expected());
        assert_eq!(send.len(), 2);
        assert!((send.min() as i64 - 4000).abs() < 10, "{}", send.min());
        assert!((due.max() as i64 - 6000).abs() < 10, "{}", due.max());
    }

    #[tokio::test]
    async fn missing_changes_are_reported_after_the_timeout() {
        let t = Tracker::new(2, "p-".into());
        t.next.store(2, Ordering::Relaxed);
        t.ok[0].store(true, Ordering::Relaxed);
        t.ok[1].store(true, Ordering::Relaxed);
        t.arrive(&change("p-1"), Instant::now());
        let missing = t.wait_for(t.expected(), Duration::from_millis(30)).await;
        assert_eq!(missing, vec![0]);
        t.arrive(&change("p-0"), Instant::now());
        assert!(t
            .wait_for(t.expected(), Duration::from_secs(5))
            .await
            .is_empty());
    }

    #[test]
    fn medians() {
        assert_eq!(median(vec![]), 0.0);
        assert_eq!(median(vec![0.9, 0.8, 1.0]), 0.9);
        assert_eq!(median(vec![1.0, 0.5]), 0.75);
    }
}
