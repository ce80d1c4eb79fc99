//! `subscriptions`: GraphQL subscriptions under load. The goal (issue 21): 1,000 subscribers,
//! 1,000 writes/s, delivery p99 < 50 ms, the server's RSS reported. On the farm example, whose
//! hen SDL declares `Subscription { getById getByCoop }`.
//!
//! 1. **Seed**: a farm and 100 coops through REST.
//! 2. **Gate**: one event stream subscribed to a coop's hens receives a hen POSTed into that
//!    coop (its id and name, `extensions.change.op` = `create`) and not the one POSTed into
//!    another coop just before it.
//! 3. **Subscribers**: 1,000 graphql-sse event streams (`POST /hen/graph` with
//!    `Accept: text/event-stream`, `subscription { getByCoop(id: …) { id name } }`), each on a
//!    connection of its own; subscriber *i* follows coop *i* mod 100, so each coop has 10 (one
//!    cohort on the server). They all run on one thread of their own (a current-thread
//!    runtime, one task per stream, the bench's [`crate::sse`] reader), so their arrival
//!    stamps do not wait for the load generator. Writes start once `/metrics` counts every
//!    subscription open (`meshql_subscriptions`): none can miss a write for being late.
//! 4. **Writes**: hens POSTed at 1,000/s (an open model, the bench's fixed-rate runner) for
//!    `--duration` (default 10 s), each into a random coop and named after its sequence
//!    number; the instant just before each POST is written is kept.
//! 5. **Deliveries**: each stream stamps every socket read before parsing it; a delivery's
//!    latency = that stamp − the send instant of the write it carries (matched by name).
//!    Every write accepted is expected at the 10 subscribers of its coop, within 10 s after
//!    the run.
//!
//! Reports delivery p50/p95/p99/max, deliveries expected and received, lost (expected, never
//! received), duplicated (received twice), misrouted (a hen of another coop), the server's RSS
//! before the subscribers, with them open and idle, and at its peak during the writes; the
//! POST latency is the run's own. Lost, duplicated or misrouted deliveries, an error event
//! and a stream the server ended fail the gate; the goal (p99 < 50 ms) is reported as met or
//! not.

use super::changes::{ms, open_model, ARRIVAL_TIMEOUT, MAX_MICROS};
use super::{Ctx, Example, Scenario};
use crate::client::{Session, Target};
use crate::gate::{self, ensure, GateResult, ScenarioError};
use crate::load::{Vu, Workload};
use crate::sse::{Event, EventStream};
use async_trait::async_trait;
use bytes::Bytes;
use hdrhistogram::Histogram;
use http::Method;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch};

pub struct Subscriptions;

/// Event streams open during the writes.
const SUBSCRIBERS: usize = 1_000;
/// Coops the subscribers follow (and the hens are written into): 10 subscribers per coop.
const COOPS: usize = 100;
/// Hens POSTed per second.
const RATE: f64 = 1_000.0;
const GOAL_P99_MS: f64 = 50.0;
/// How long opening every stream (until `/metrics` counts them) may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(60);
/// Open files the bench needs besides the streams (its writers, setup connections).
const SPARE_FILES: u64 = 512;
const GRAPH: &str = "/hen/graph";

/// A graphql-sse request body: the hens of `coop`.
fn subscription(coop: &str) -> Vec<u8> {
    json!({ "query": format!("subscription {{ getByCoop(id: \"{coop}\") {{ id name }} }}") })
        .to_string()
        .into_bytes()
}

/// The soft limit on open files from `/proc/self/limits` (`None`: unlimited or unknown).
fn open_file_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// What the writers and the streams share: per write its coop, send instant and outcome; per
/// (write, member of its coop) when the delivery arrived. Instants are nanoseconds after
/// `base`, plus one (0 = not yet).
struct Deliveries {
    base: Instant,
    prefix: String,
    coops: usize,
    /// Subscribers per coop: subscriber `s` follows coop `s % coops` as its member `s / coops`.
    members: Vec<usize>,
    /// Slots per write in `arrived` (the most members of any coop).
    per_write: usize,
    next: AtomicUsize,
    coop: Vec<AtomicUsize>,
    sent: Vec<AtomicU64>,
    ok: Vec<AtomicBool>,
    arrived: Vec<AtomicU64>,
    duplicated: AtomicU64,
    misrouted: AtomicU64,
    /// Hens on the streams that are not this run's writes (other writers).
    foreign: AtomicU64,
    /// Error events (or undecodable ones), and the first of them.
    errors: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl Deliveries {
    fn new(writes: usize, subscribers: usize, coops: usize, prefix: String) -> Self {
        let coops = coops.max(1);
        let members: Vec<usize> = (0..coops)
            .map(|c| (subscribers + coops - 1 - c) / coops)
            .collect();
        let per_write = members.iter().copied().max().unwrap_or(0);
        let slots = |n: usize| (0..n).map(|_| AtomicU64::new(0)).collect::<Vec<_>>();
        Self {
            base: Instant::now(),
            prefix,
            coops,
            members,
            per_write,
            next: AtomicUsize::new(0),
            coop: (0..writes).map(|_| AtomicUsize::new(0)).collect(),
            sent: slots(writes),
            ok: (0..writes).map(|_| AtomicBool::new(false)).collect(),
            arrived: slots(writes * per_write),
            duplicated: AtomicU64::new(0),
            misrouted: AtomicU64::new(0),
            foreign: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            first_error: Mutex::new(None),
        }
    }

    fn stamp(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.base).as_nanos() as u64 + 1
    }

    fn error(&self, message: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        self.first_error
            .lock()
            .expect("error lock")
            .get_or_insert(message);
    }

    /// Subscriber `s` read `event` (a `next`) at `at`.
    fn arrive(&self, s: usize, event: &Event, at: Instant) {
        let v: Value = match serde_json::from_str(&event.data) {
            Ok(v) => v,
            Err(e) => return self.error(format!("subscriber {s}: an event that is not JSON: {e}")),
        };
        if let Some(errors) = v.get("errors") {
            return self.error(format!("subscriber {s}: {errors}"));
        }
        let Some(hens) = v["data"]["getByCoop"].as_array() else {
            return self.error(format!(
                "subscriber {s}: an event without data.getByCoop: {v}"
            ));
        };
        let (coop, member) = (s % self.coops, s / self.coops);
        for hen in hens {
            let seq = hen["name"]
                .as_str()
                .and_then(|n| n.strip_prefix(self.prefix.as_str())?.parse::<usize>().ok())
                .filter(|&seq| seq < self.sent.len());
            let Some(seq) = seq else {
                self.foreign.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            if self.coop[seq].load(Ordering::Relaxed) != coop {
                self.misrouted.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let first = self.arrived[seq * self.per_write + member]
                .compare_exchange(0, self.stamp(at), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok();
            if !first {
                self.duplicated.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Sequence numbers of the writes answered 2xx.
    fn expected(&self) -> Vec<usize> {
        let n = self.next.load(Ordering::Relaxed).min(self.ok.len());
        (0..n)
            .filter(|&i| self.ok[i].load(Ordering::Relaxed))
            .collect()
    }

    /// The arrival slots `writes` are expected in: one per member of each write's coop.
    fn slots<'a>(&'a self, writes: &'a [usize]) -> impl Iterator<Item = (usize, u64)> + 'a {
        writes.iter().flat_map(move |&seq| {
            let members = self.members[self.coop[seq].load(Ordering::Relaxed)];
            (0..members).map(move |m| {
                let at = self.arrived[seq * self.per_write + m].load(Ordering::Relaxed);
                (seq, at)
            })
        })
    }

    fn deliveries_expected(&self, writes: &[usize]) -> usize {
        writes
            .iter()
            .map(|&seq| self.members[self.coop[seq].load(Ordering::Relaxed)])
            .sum()
    }

    fn missing(&self, writes: &[usize]) -> usize {
        self.slots(writes).filter(|&(_, at)| at == 0).count()
    }

    /// Waits until every expected delivery arrived or `timeout`; returns how many are missing.
    async fn wait_for(&self, writes: &[usize], timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            let missing = self.missing(writes);
            if missing == 0 || Instant::now() >= deadline {
                return missing;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Latency (arrival − send, µs) of every expected delivery that arrived.
    fn latencies(&self, writes: &[usize]) -> Histogram<u64> {
        let mut h = Histogram::new_with_bounds(1, MAX_MICROS, 3).expect("static bounds");
        for (seq, at) in self.slots(writes) {
            if at == 0 {
                continue;
            }
            let sent = self.sent[seq].load(Ordering::Relaxed);
            let _ = h.record((at.saturating_sub(sent) / 1000).clamp(1, MAX_MICROS));
        }
        h
    }
}

/// POSTs hens, each into a random coop and named `<prefix><seq>`.
struct Writes {
    deliveries: Arc<Deliveries>,
    coops: Arc<[String]>,
}

#[async_trait]
impl Workload for Writes {
    async fn iteration(&self, vu: &mut Vu, _due: Instant) {
        let d = &self.deliveries;
        let seq = d.next.fetch_add(1, Ordering::Relaxed);
        if seq >= d.sent.len() {
            return; // the model schedules exactly `capacity` iterations; never reached
        }
        let coop = vu.rng.usize(..self.coops.len());
        let body = json!({"name": format!("{}{seq}", d.prefix), "coop_id": self.coops[coop]});
        let body = Bytes::from(body.to_string());
        d.coop[seq].store(coop, Ordering::Relaxed);
        d.sent[seq].store(d.stamp(Instant::now()), Ordering::Relaxed);
        let r = vu
            .session
            .call("post_hen", Method::POST, "/hen/api", Some(body))
            .await;
        let ok = r.is_some_and(|r| r.status.is_success());
        d.ok[seq].store(ok, Ordering::Relaxed);
        vu.session.check("post_hen", ok);
    }
}

/// How the streams' thread ended.
#[derive(Default)]
struct StreamsEnd {
    /// Streams that ended before they were told to stop (closed, failed, completed).
    ended: usize,
    first: Option<String>,
}

/// The subscribers' event streams, on a thread of their own.
struct Streams {
    stop: watch::Sender<bool>,
    done: oneshot::Receiver<StreamsEnd>,
}

impl Streams {
    /// Opens `n` streams, subscriber `s` on the hens of `coops[s % coops.len()]`, one after
    /// the other; returns once the server has answered each with its head.
    async fn open(
        target: &Target,
        coops: &[String],
        n: usize,
        deliveries: Arc<Deliveries>,
    ) -> Result<Self, String> {
        let authority = target.authority().to_string();
        let path = target.path(GRAPH);
        let bodies: Vec<Vec<u8>> = coops.iter().map(|c| subscription(c)).collect();
        let (ready_tx, ready_rx) = oneshot::channel::<Result<(), String>>();
        let (stop_tx, stop_rx) = watch::channel(false);
        let (done_tx, done_rx) = oneshot::channel::<StreamsEnd>();
        std::thread::Builder::new()
            .name("subscribers".into())
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
                    let mut tasks = tokio::task::JoinSet::new();
                    for s in 0..n {
                        let body = &bodies[s % bodies.len()];
                        match EventStream::request(&authority, "POST", &path, &[], Some(body)).await
                        {
                            Ok(stream) => {
                                tasks.spawn(read(s, stream, deliveries.clone(), stop_rx.clone()));
                            }
                            Err(e) => {
                                let _ = ready_tx
                                    .send(Err(format!("subscriber {s} of {n}: POST {path}: {e}")));
                                return; // dropping the set closes the streams opened
                            }
                        }
                    }
                    let _ = ready_tx.send(Ok(()));
                    let mut end = StreamsEnd::default();
                    while let Some(r) = tasks.join_next().await {
                        let reason = match r {
                            Ok(reason) => reason,
                            Err(e) => Some(format!("a subscriber's task failed: {e}")),
                        };
                        if let Some(reason) = reason {
                            end.ended += 1;
                            end.first.get_or_insert(reason);
                        }
                    }
                    let _ = done_tx.send(end);
                });
            })
            .map_err(|e| format!("cannot start the subscribers' thread: {e}"))?;
        match ready_rx.await {
            Ok(Ok(())) => Ok(Self {
                stop: stop_tx,
                done: done_rx,
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err("the subscribers' thread ended before connecting".into()),
        }
    }

    /// Closes every stream; returns how many had ended by themselves.
    async fn stop(self) -> StreamsEnd {
        let _ = self.stop.send(true);
        self.done.await.unwrap_or_default()
    }
}

/// Reads subscriber `s`'s stream until told to stop; returns why it ended otherwise.
async fn read(
    s: usize,
    mut stream: EventStream,
    deliveries: Arc<Deliveries>,
    mut stop: watch::Receiver<bool>,
) -> Option<String> {
    let mut events = Vec::new();
    loop {
        tokio::select! {
            biased;
            _ = stop.changed() => return None,
            r = stream.next_batch(&mut events) => match r {
                Ok(Some(at)) => {
                    for e in events.drain(..) {
                        match e.event.as_str() {
                            "next" => deliveries.arrive(s, &e, at),
                            "complete" => {
                                return Some(format!("subscriber {s}: the server completed the stream"))
                            }
                            _ => {}
                        }
                    }
                }
                Ok(None) => return Some(format!("subscriber {s}: the server ended the stream")),
                Err(e) => return Some(format!("subscriber {s}: {e}")),
            },
        }
    }
}

/// A counter or gauge of `/metrics` (meshql's), if the server has it.
async fn metric(s: &mut Session, name: &str) -> Option<u64> {
    let reply = s.send(Method::GET, "/metrics", None).await.ok()?;
    if !reply.status.is_success() {
        return None;
    }
    String::from_utf8_lossy(&reply.body).lines().find_map(|l| {
        let (n, v) = l.split_once(' ')?;
        (n == name).then(|| v.trim().parse().ok())?
    })
}

/// Waits until `meshql_subscriptions` satisfies `done`; `Ok(false)` when the server has no
/// such gauge.
async fn until_open(
    s: &mut Session,
    done: impl Fn(u64) -> bool,
    timeout: Duration,
    what: &str,
) -> GateResult<bool> {
    let deadline = Instant::now() + timeout;
    loop {
        let Some(open) = metric(s, "meshql_subscriptions").await else {
            return Ok(false);
        };
        if done(open) {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Err(ScenarioError::Gate(format!(
                "{what}: /metrics still counts {open} open subscriptions after {} s",
                timeout.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A stream subscribed to coop 0's hens receives a hen POSTed into coop 0, with its id and
/// name, and not one POSTed into coop 1 before it.
async fn gate_events(ctx: &Ctx, s: &mut Session, coops: &[String]) -> GateResult<()> {
    let path = ctx.target.path(GRAPH);
    let mut stream = EventStream::request(
        ctx.target.authority(),
        "POST",
        &path,
        &[],
        Some(&subscription(&coops[0])),
    )
    .await
    .map_err(|e| {
        ScenarioError::Gate(format!(
            "cannot subscribe with POST {GRAPH} (Accept: text/event-stream): {e}"
        ))
    })?;
    gate::create(
        s,
        "/hen/api",
        &json!({"name": "gate-other", "coop_id": coops[1]}),
    )
    .await?;
    let id = gate::create(s, "/hen/api", &json!({"name": "gate", "coop_id": coops[0]})).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut events = Vec::new();
    let event = loop {
        if let Some(e) = events.iter().find(|e: &&Event| e.event == "next") {
            break e.clone();
        }
        match tokio::time::timeout_at(deadline, stream.next_batch(&mut events)).await {
            Err(_) => {
                return Err(ScenarioError::Gate(format!(
                    "no event within 10 s on a getByCoop subscription after hen {id} was POSTed into its coop"
                )))
            }
            Ok(Ok(Some(_))) => {}
            Ok(Ok(None)) => {
                return Err(ScenarioError::Gate(
                    "the server ended the subscription's event stream".into(),
                ))
            }
            Ok(Err(e)) => {
                return Err(ScenarioError::Gate(format!(
                    "the subscription's event stream: {e}"
                )))
            }
        }
    };
    let v: Value = serde_json::from_str(&event.data)
        .map_err(|e| ScenarioError::Gate(format!("an event that is not JSON ({e}): {event:?}")))?;
    gate::expect_eq(
        &v,
        "data.getByCoop",
        &json!([{"id": id, "name": "gate"}]),
        "the first event: the hen POSTed into the subscribed coop (not the other coop's)",
    )?;
    gate::expect_eq(
        &v,
        "extensions.change.op",
        &json!("create"),
        "the event's change",
    )?;
    gate::expect_eq(&v, "extensions.change.id", &json!(id), "the event's change")?;
    ensure(!event.id.is_empty(), || {
        format!("the event has no `id:` (its log position): {event:?}")
    })
}

#[async_trait]
impl Scenario for Subscriptions {
    fn name(&self) -> &'static str {
        "subscriptions"
    }
    fn description(&self) -> &'static str {
        "GraphQL subscriptions: 1,000 graphql-sse subscribers (getByCoop, 10 per coop), hens POSTed at 1,000/s; write → delivery latency, lost and duplicated deliveries, server RSS (goal p99 < 50 ms; 0 lost, 0 duplicated)"
    }
    fn example(&self) -> Example {
        Example::Farm
    }
    async fn run(&self, ctx: &mut Ctx) -> GateResult<()> {
        if let Some(limit) = std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|l| open_file_limit(&l))
        {
            if limit < SUBSCRIBERS as u64 + SPARE_FILES {
                return Err(ScenarioError::Setup(format!(
                    "{SUBSCRIBERS} event streams need more open files than the limit of {limit}: raise it (ulimit -n {})",
                    SUBSCRIBERS as u64 * 2 + SPARE_FILES
                )));
            }
        }
        let mut s = ctx.session();
        let farm =
            gate::create(&mut s, "/farm/api", &json!({"name": "bench-subscriptions"})).await?;
        let docs: Vec<Value> = (0..COOPS)
            .map(|i| json!({"name": format!("coop-{i}"), "farm_id": farm}))
            .collect();
        let coops: Arc<[String]> = gate::create_bulk(&mut s, "/coop/api", &docs).await?.into();
        let base = metric(&mut s, "meshql_subscriptions").await;
        gate_events(ctx, &mut s, &coops).await?;
        if let Some(base) = base {
            // the gate's stream is gone before the subscribers are counted
            until_open(
                &mut s,
                |n| n <= base,
                ARRIVAL_TIMEOUT,
                "the gate's stream closed",
            )
            .await?;
        }

        let duration = ctx.opts.duration.unwrap_or(Duration::from_secs(10));
        let model = open_model(RATE, duration);
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let deliveries = Arc::new(Deliveries::new(
            model.iterations() as usize,
            SUBSCRIBERS,
            COOPS,
            format!("sub-{}-", &tag[..8]),
        ));
        let rss = |ctx: &Ctx| ctx.server.as_ref().and_then(|s| s.probe().rss_mib());
        let rss_before = rss(ctx);
        let opening = Instant::now();
        let streams = Streams::open(&ctx.target, &coops, SUBSCRIBERS, deliveries.clone())
            .await
            .map_err(|e| ScenarioError::Gate(format!("cannot open the subscribers: {e}")))?;
        let counted = until_open(
            &mut s,
            |n| n >= base.unwrap_or(0) + SUBSCRIBERS as u64,
            OPEN_TIMEOUT,
            "subscribers opened",
        )
        .await?;
        let opened_s = opening.elapsed().as_secs_f64();
        if !counted {
            ctx.note("the server's /metrics has no meshql_subscriptions: the writes started once every stream's response head had arrived");
        }
        // what the open streams hold, once the server has settled
        tokio::time::sleep(Duration::from_secs(1)).await;
        let rss_open = rss(ctx);
        let events_before = metric(&mut s, "meshql_subscription_events_total").await;
        let dropped_before = metric(&mut s, "meshql_subscription_dropped_total").await;

        let label = format!("{RATE:.0}_writes_per_s");
        let run = ctx
            .open(
                &label,
                Arc::new(Writes {
                    deliveries: deliveries.clone(),
                    coops: coops.clone(),
                }),
                &model,
            )
            .await;
        let writes = deliveries.expected();
        let expected = deliveries.deliveries_expected(&writes);
        let waited = Instant::now();
        let lost = deliveries.wait_for(&writes, ARRIVAL_TIMEOUT).await;
        let waited = waited.elapsed();
        let handed = match (
            events_before,
            metric(&mut s, "meshql_subscription_events_total").await,
        ) {
            (Some(b), Some(a)) => Some(a.saturating_sub(b)),
            _ => None,
        };
        let dropped_slow = match (
            dropped_before,
            metric(&mut s, "meshql_subscription_dropped_total").await,
        ) {
            (Some(b), Some(a)) => Some(a.saturating_sub(b)),
            _ => None,
        };
        let end = streams.stop().await;
        let latency = deliveries.latencies(&writes);
        let received = expected - lost;
        let duplicated = deliveries.duplicated.load(Ordering::Relaxed);
        let misrouted = deliveries.misrouted.load(Ordering::Relaxed);
        let foreign = deliveries.foreign.load(Ordering::Relaxed);
        let errors = deliveries.errors.load(Ordering::Relaxed);
        let peak_rss = run.server.as_ref().map(|u| u.peak_rss_mib);
        let per_subscriber_kib = match (rss_before, rss_open) {
            (Some(b), Some(o)) => Some((o - b) * 1024.0 / SUBSCRIBERS as f64),
            _ => None,
        };
        let p99 = ms(latency.value_at_quantile(0.99));
        if let Some(r) = ctx.runs.last_mut() {
            let m = &mut r.metrics;
            if !latency.is_empty() {
                for (name, q) in [("p50", 0.5), ("p95", 0.95), ("p99", 0.99)] {
                    m.insert(
                        format!("delivery_latency_{name}_ms"),
                        ms(latency.value_at_quantile(q)),
                    );
                }
                m.insert("delivery_latency_max_ms".into(), ms(latency.max()));
            }
            m.insert("subscribers".into(), SUBSCRIBERS as f64);
            m.insert("subscribers_open_s".into(), opened_s);
            m.insert("deliveries_expected".into(), expected as f64);
            m.insert("deliveries_received".into(), received as f64);
            m.insert("deliveries_lost".into(), lost as f64);
            m.insert("deliveries_duplicated".into(), duplicated as f64);
            if misrouted > 0 {
                m.insert("deliveries_misrouted".into(), misrouted as f64);
            }
            if let Some(n) = handed {
                m.insert("server_events_handed".into(), n as f64);
            }
            if let Some(n) = dropped_slow {
                m.insert("server_subscribers_dropped".into(), n as f64);
            }
            for (key, value) in [
                ("server_rss_before_subscribers_mib", rss_before),
                ("server_rss_subscribed_mib", rss_open),
                ("server_rss_per_subscriber_kib", per_subscriber_kib),
            ] {
                if let Some(v) = value {
                    m.insert(key.into(), v);
                }
            }
        }
        ctx.note(format!(
            "{SUBSCRIBERS} subscribers ({COOPS} coops × {}, opened in {opened_s:.1} s), hens POSTed at {RATE:.0}/s offered ({:.0}/s achieved, {} dropped, {} accepted): write → delivery p50 {:.2} · p95 {:.2} · p99 {:.2} · max {:.2} ms (goal p99 < {GOAL_P99_MS} ms: {}); POST p99 {:.2} ms; {expected} deliveries expected, {received} received, {lost} lost, {duplicated} duplicated{}{}",
            SUBSCRIBERS / COOPS,
            run.overall.rps,
            run.dropped,
            writes.len(),
            ms(latency.value_at_quantile(0.5)),
            ms(latency.value_at_quantile(0.95)),
            p99,
            ms(latency.max()),
            if latency.is_empty() {
                "not measured"
            } else if p99 < GOAL_P99_MS {
                "met"
            } else {
                "NOT met"
            },
            run.overall.p99_ms,
            if misrouted > 0 {
                format!(", {misrouted} misrouted (a hen of another coop)")
            } else {
                String::new()
            },
            if foreign > 0 {
                format!(", {foreign} other hens on the streams")
            } else {
                String::new()
            },
        ));
        let mib = |v: Option<f64>| v.map_or("—".to_string(), |v| format!("{v:.1} MiB"));
        ctx.note(match (rss_before, rss_open) {
            (Some(_), Some(_)) => format!(
                "server RSS: {} before the subscribers, {} with {SUBSCRIBERS} open and idle ({:.1} KiB each), {} at its peak during the writes",
                mib(rss_before),
                mib(rss_open),
                per_subscriber_kib.unwrap_or(0.0),
                mib(peak_rss),
            ),
            _ => "server RSS not sampled: the bench did not start the server (--url)".into(),
        });
        ctx.note("delivery latency = when the subscriber's stream (one of 1,000 on the bench's own thread, one connection each) read the event's bytes − just before the hen's POST was written; every write is expected at the 10 subscribers of its coop");
        let mut problems = Vec::new();
        if lost > 0 {
            problems.push(format!(
                "{lost} of {expected} deliveries never arrived ({:.1} s after the run){}{}",
                waited.as_secs_f64(),
                handed.map_or(String::new(), |n| format!(
                    "; the server counts {n} events handed to subscribers"
                )),
                dropped_slow
                    .filter(|&n| n > 0)
                    .map_or(String::new(), |n| format!(
                        "; it dropped {n} subscribers as slow"
                    )),
            ));
        }
        if duplicated > 0 {
            problems.push(format!("{duplicated} deliveries arrived twice"));
        }
        if misrouted > 0 {
            problems.push(format!(
                "{misrouted} events carried a hen of another coop than the subscription's"
            ));
        }
        if errors > 0 {
            let first = deliveries.first_error.lock().expect("error lock").clone();
            problems.push(format!(
                "{errors} error events (first: {})",
                first.unwrap_or_default()
            ));
        }
        if end.ended > 0 {
            problems.push(format!(
                "{} streams ended before the bench closed them (first: {})",
                end.ended,
                end.first.unwrap_or_default()
            ));
        }
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

    fn next(hens: Value) -> Event {
        Event {
            event: "next".into(),
            data: json!({"data": {"getByCoop": hens}, "extensions": {"change": {"op": "create"}}})
                .to_string(),
            id: "7".into(),
        }
    }

    fn hen(name: &str) -> Value {
        json!([{"id": "h", "name": name}])
    }

    #[test]
    fn subscribers_spread_evenly_over_the_coops() {
        let d = Deliveries::new(1, 1000, 100, "p-".into());
        assert!(d.members.iter().all(|&m| m == 10));
        assert_eq!(d.per_write, 10);
        // uneven: 25 over 10 coops → 3, 3, 3, 3, 3, 2, 2, 2, 2, 2
        let d = Deliveries::new(1, 25, 10, "p-".into());
        assert_eq!(d.members, [3, 3, 3, 3, 3, 2, 2, 2, 2, 2]);
        assert_eq!(d.members.iter().sum::<usize>(), 25);
        assert_eq!(d.per_write, 3);
    }

    #[test]
    fn deliveries_are_matched_counted_and_timed() {
        // 6 subscribers over 3 coops: subscribers 0 and 3 follow coop 0, 1 and 4 coop 1, …
        let d = Deliveries::new(4, 6, 3, "p-".into());
        for (seq, coop, ok) in [(0, 0, true), (1, 1, false), (2, 2, true)] {
            d.next.fetch_add(1, Ordering::Relaxed);
            d.coop[seq].store(coop, Ordering::Relaxed);
            d.sent[seq].store(d.stamp(d.base), Ordering::Relaxed);
            d.ok[seq].store(ok, Ordering::Relaxed);
        }
        let at = |millis| d.base + Duration::from_millis(millis);
        assert_eq!(d.expected(), vec![0, 2]);
        assert_eq!(d.deliveries_expected(&d.expected()), 4);
        d.arrive(0, &next(hen("p-0")), at(3));
        d.arrive(3, &next(hen("p-0")), at(5));
        d.arrive(3, &next(hen("p-0")), at(6)); // twice
        d.arrive(1, &next(hen("p-0")), at(6)); // subscriber 1 follows coop 1
        d.arrive(2, &next(hen("p-2")), at(9));
        d.arrive(2, &next(hen("someone-else")), at(9));
        d.arrive(2, &next(hen("p-99")), at(9)); // out of range
        d.arrive(
            2,
            &Event {
                event: "next".into(),
                data: r#"{"errors":[{"message":"slow"}]}"#.into(),
                id: String::new(),
            },
            at(9),
        );
        assert_eq!(d.duplicated.load(Ordering::Relaxed), 1);
        assert_eq!(d.misrouted.load(Ordering::Relaxed), 1);
        assert_eq!(d.foreign.load(Ordering::Relaxed), 2);
        assert_eq!(d.errors.load(Ordering::Relaxed), 1);
        assert!(d
            .first_error
            .lock()
            .unwrap()
            .as_deref()
            .unwrap()
            .contains("slow"));
        let writes = d.expected();
        assert_eq!(d.missing(&writes), 1); // subscriber 5 never had write 2
        let h = d.latencies(&writes);
        assert_eq!(h.len(), 3);
        assert!((h.min() as i64 - 3000).abs() < 10, "{}", h.min());
        assert!((h.max() as i64 - 9000).abs() < 10, "{}", h.max());
        d.arrive(5, &next(hen("p-2")), at(10));
        assert_eq!(d.missing(&writes), 0);
    }

    #[tokio::test]
    async fn missing_deliveries_are_reported_after_the_timeout() {
        let d = Deliveries::new(1, 2, 1, "p-".into());
        d.next.store(1, Ordering::Relaxed);
        d.ok[0].store(true, Ordering::Relaxed);
        d.arrive(1, &next(hen("p-0")), Instant::now());
        let writes = d.expected();
        assert_eq!(d.wait_for(&writes, Duration::from_millis(30)).await, 1);
        d.arrive(0, &next(hen("p-0")), Instant::now());
        assert_eq!(d.wait_for(&writes, Duration::from_secs(5)).await, 0);
    }

    #[test]
    fn the_open_file_limit_is_read_from_proc_limits() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \nMax processes             95157                95157                processes \nMax open files            1024                 524288               files     \n";
        assert_eq!(open_file_limit(limits), Some(1024));
        assert_eq!(
            open_file_limit(
                "Max open files            unlimited            unlimited            files"
            ),
            None
        );
        assert_eq!(open_file_limit(""), None);
    }

    #[test]
    fn the_subscription_request_names_its_coop() {
        let body: Value = serde_json::from_slice(&subscription("c-1")).unwrap();
        assert_eq!(
            body["query"],
            "subscription { getByCoop(id: \"c-1\") { id name } }"
        );
    }
}
