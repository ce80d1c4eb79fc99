//! `kafka-store`: Kafka as the database (`[storage] type = "kafka"`), served by
//! `examples/egg-economy-kafka` (its 10 actor and event entities on topics). Needs
//! `--kafka BROKERS` (it fails at once without) and servers the bench starts; not in `all`.
//!
//! Every run works on topics of its own (`PREFIX=meshql-bench-ks-<8 hex>`, `ENV=bench`), made
//! by the first process and deleted at the end. Every process is a `meshql serve` of the
//! example with a data directory (a materialisation) of its own, `MESHQL_PROJECTIONS=false`
//! (otherwise each process's projection processors would read every lay report again and
//! compete for the cores with what is measured) and `--log-level info --log-format json`, so
//! that the store's own timings can be read from its log.
//!
//! 1. **Rebuild rate** (goal ≥ 50,000 versions/s). Process A starts on the empty topics
//!    (making them). A process on an empty data directory is timed from just before its spawn
//!    until `GET /ready` answers 200 (polled every 20 ms) while the topics are still empty:
//!    what any start costs (`start_on_empty_topics`). Then `--kafka-versions` lay reports
//!    (default 200,000) are written to A through `POST /lay_report/api/bulk`, 1,000 a request
//!    (one Kafka transaction each) with 4 requests in flight, and a process B on another empty
//!    data directory is timed the same way (`rebuild_<N>_versions`): rebuild rate = N / (B's
//!    time to ready − the empty start's). B's log line "kafka store: caught up with the topic"
//!    gives the lay_report topic's own catch-up (`rebuild_log_*`; its `offsets` also count the
//!    transactions' commit markers). The gate: B's change feed holds exactly N versions, and
//!    the first and the last report written read back from B as written. The goal is only
//!    judged from [`GOAL_FROM_VERSIONS`] versions up: a smaller catch-up is within the noise of
//!    a start.
//! 2. **POST on A → readable on B** at 100/s and 1,000/s for `--duration` (default 5 s) each:
//!    farms POSTed to A at a constant arrival rate, each with its own `x-correlation-id`; an
//!    SSE reader of B's `/_changes?since=now&entity=farm` (a thread of its own, connected before
//!    the run) stamps each change's arrival. B's feed only holds versions B has applied, so the
//!    farm is readable on B by then. Latency = arrival − just before the POST was written (and
//!    − when the open model had it due). Lost = POSTs A answered 2xx whose change had not
//!    reached B 10 s after the run; duplicated = changes that reached B twice. Goals: 0 lost,
//!    0 duplicated (thresholds of each run).
//!
//! POST → readable on the writing process itself is the egg-economy suite's, run on this
//! config (`KAFKA_BROKERS=… meshql bench egg-economy --config examples/egg-economy-kafka`).

use super::changes::{
    farm_doc, ms, open_model, Reader, TrackedPost, Tracker, ARRIVAL_TIMEOUT, PATH as FARMS,
};
use super::projections::report;
use super::{Ctx, Example, Scenario};
use crate::client::{Session, Target};
use crate::gate::{self, ensure, GateResult, ScenarioError};
use crate::load::RunOutcome;
use crate::monitor::Live;
use crate::report::Threshold;
use crate::server::{LocalServer, ServerSpec};
use crate::stats::Outcome;
use async_trait::async_trait;
use bytes::Bytes;
use http::Method;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use serde_json::Value;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct KafkaStore;

/// Goal of the rebuild (versions/s).
const GOAL_REBUILD_PER_S: f64 = 50_000.0;
/// The rebuild goal is judged from this many versions up.
const GOAL_FROM_VERSIONS: usize = 100_000;
/// Arrival rates of the POST → readable-on-B runs.
const RATES: [f64; 2] = [100.0, 1_000.0];
/// Seconds of each rate without `--duration`.
const RATE_SECS: u64 = 5;
/// Reports per bulk request (one Kafka transaction each).
const BULK: usize = 1_000;
/// Bulk requests in flight while writing.
const WRITERS: usize = 4;
/// How often `/ready` is polled while a start is timed.
const POLL: Duration = Duration::from_millis(20);
const EXAMPLE: &str = "egg-economy-kafka";
/// `ENV` of the processes: the topics are `<prefix>-bench-<entity>`.
const ENV: &str = "bench";
const REPORTS: &str = "/lay_report/api";
const STREAM: &str = "/_changes?since=now&entity=farm";
/// The store's log line when an entity's topic has been caught up with at start.
const CAUGHT_UP: &str = "kafka store: caught up with the topic";

/// The processes of one run: the example on `brokers`, topics under `prefix`.
fn spec(ctx: &Ctx, brokers: &str, prefix: &str) -> ServerSpec {
    let env = [
        ("KAFKA_BROKERS", brokers),
        ("PREFIX", prefix),
        ("ENV", ENV),
        ("MESHQL_PROJECTIONS", "false"),
    ];
    ServerSpec {
        exe: ctx.opts.exe.clone(),
        config: ctx.opts.examples.join(EXAMPLE),
        workers: ctx.opts.server_workers(),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        args: ["--log-level", "info", "--log-format", "json"]
            .map(String::from)
            .to_vec(),
        data_dir: None,
    }
}

fn topic(prefix: &str, entity: &str) -> String {
    format!("{prefix}-{ENV}-{entity}")
}

fn parse_target(server: &LocalServer) -> GateResult<Target> {
    Target::parse(&server.url()).map_err(|e| ScenarioError::Setup(e.to_string()))
}

/// Polls `/ready` until it answers 200 or `limit` has passed since `spawned`; the run lasts
/// from the spawn, and `ready` gets the time to ready. Polls the server answered are recorded
/// as `ready_poll` (a 503 while the stores catch up is an answer, not an error); refused
/// connections (not listening yet) are not.
async fn watch_ready(
    target: Target,
    live: Arc<Live>,
    spawned: Instant,
    limit: Duration,
    ready: Arc<Mutex<Option<Duration>>>,
) -> RunOutcome {
    let mut s = Session::new(target);
    let mut answered = 0;
    // the run ends when /ready answered: its duration is the time to ready, the same figure
    let mut ended = None;
    loop {
        let asked = Instant::now();
        if let Ok(reply) = s.send(Method::GET, "/ready", None).await {
            s.recorder
                .kind("ready_poll")
                .record(asked.elapsed(), Outcome::Ok);
            live.add_requests(1);
            answered += 1;
            if reply.status.is_success() {
                let t = spawned.elapsed();
                *ready.lock().expect("ready lock") = Some(t);
                ended = Some(t);
                break;
            }
        }
        if spawned.elapsed() > limit {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    RunOutcome {
        recorder: s.recorder,
        schedule_lag: hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 3)
            .expect("static bounds"),
        elapsed: ended.unwrap_or_else(|| spawned.elapsed()),
        iterations: answered,
        dropped: 0,
        peak_vus: 1,
    }
}

/// Starts a process on an empty data directory and measures its start as the run `label`
/// (the process sampled meanwhile): from just before its spawn until `/ready` answers 200.
/// Returns the process and its time to ready (s).
async fn timed_start(
    ctx: &mut Ctx,
    spec: &ServerSpec,
    label: &str,
    expected: Duration,
    limit: Duration,
) -> GateResult<(LocalServer, f64)> {
    let spawned = Instant::now();
    let server = LocalServer::launch(spec.clone())
        .map_err(|e| ScenarioError::Setup(format!("{label}: {e}")))?;
    let saved_target = std::mem::replace(&mut ctx.target, parse_target(&server)?);
    let saved_server = ctx.server.replace(server);
    let ready = Arc::new(Mutex::new(None));
    let r = ready.clone();
    let model = format!(
        "a process on an empty data directory, timed from just before its spawn until GET /ready answers 200 (polled every {} ms)",
        POLL.as_millis()
    );
    let run = ctx
        .measure(label, model, expected, None, move |target, live| {
            watch_ready(target, live, spawned, limit, r)
        })
        .await;
    ctx.listed(run);
    let mut server =
        std::mem::replace(&mut ctx.server, saved_server).expect("the process just measured");
    ctx.target = saved_target;
    let ready = *ready.lock().expect("ready lock");
    match ready {
        Some(t) => Ok((server, t.as_secs_f64())),
        None => {
            // it exited, or was too slow: the error says which, with its log's end
            let why = server
                .wait_ready_within(Duration::ZERO)
                .await
                .err()
                .map_or_else(|| "not ready in time".to_string(), |e| e.to_string());
            Err(ScenarioError::Setup(format!("{label}: {why}")))
        }
    }
}

/// Writes `n` lay reports through the bulk endpoint, [`WRITERS`] requests in flight; returns
/// the ids of the first and the last report.
async fn write_reports(target: &Target, n: usize) -> GateResult<(String, String)> {
    let chunks = n.div_ceil(BULK);
    let next = Arc::new(AtomicUsize::new(0));
    let mut writers = Vec::new();
    for _ in 0..WRITERS.min(chunks) {
        let (target, next) = (target.clone(), next.clone());
        writers.push(tokio::spawn(async move {
            let mut s = Session::new(target);
            let mut ends = Vec::new();
            loop {
                let chunk = next.fetch_add(1, Ordering::Relaxed);
                if chunk >= chunks {
                    return Ok::<_, ScenarioError>(ends);
                }
                let from = chunk * BULK;
                let docs: Vec<Value> = (from..(from + BULK).min(n)).map(report).collect();
                let ids = gate::create_bulk(&mut s, REPORTS, &docs).await?;
                if chunk == 0 {
                    ends.push((0, ids[0].clone()));
                }
                if chunk == chunks - 1 {
                    ends.push((n - 1, ids[ids.len() - 1].clone()));
                }
            }
        }));
    }
    let (mut first, mut last) = (None, None);
    for w in writers {
        let ends = w
            .await
            .map_err(|e| ScenarioError::Setup(format!("a writer task: {e}")))??;
        for (i, id) in ends {
            if i == 0 {
                first = Some(id.clone());
            }
            if i == n - 1 {
                last = Some(id);
            }
        }
    }
    match (first, last) {
        (Some(f), Some(l)) => Ok((f, l)),
        _ => Err(ScenarioError::Setup("no reports were written".into())),
    }
}

/// B holds what A was given: the first and the last report as written, and, once its change
/// feed has copied them from the store (the feed is filled after the store, so it may still be
/// behind when `/ready` answers), exactly `n` versions on its feed. Returns how long after
/// `ready` the feed held them.
async fn gate_rebuilt(
    b: &Target,
    n: usize,
    first: &str,
    last: &str,
    ready: Instant,
    limit: Duration,
) -> GateResult<Duration> {
    let mut s = Session::new(b.clone());
    for (i, id) in [(0, first), (n - 1, last)] {
        let doc = gate::get_json(&mut s, &format!("{REPORTS}/{id}")).await?;
        let expected = report(i);
        for field in ["hen_id", "eggs", "timestamp"] {
            gate::expect_eq(
                &doc,
                field,
                &expected[field],
                &format!("report {i} read on process B"),
            )?;
        }
    }
    loop {
        let feed = gate::get_json(&mut s, "/_changes?since=now&limit=1").await?;
        let at = feed.get("last").and_then(Value::as_u64);
        let held = ready.elapsed();
        ensure(at <= Some(n as u64), || {
            format!(
                "process B's change feed holds {at:?} versions after its rebuild; {n} were written"
            )
        })?;
        if at == Some(n as u64) {
            return Ok(held);
        }
        ensure(held < limit, || {
            format!(
                "process B's change feed holds {at:?} of the {n} versions written {:.0} s after it was ready",
                held.as_secs_f64()
            )
        })?;
        tokio::time::sleep(POLL).await;
    }
}

/// `(offsets, ms)` of `topic`'s "caught up" line in a JSON log.
fn caught_up(log: &str, topic: &str) -> Option<(u64, u64)> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find_map(|v| {
            let f = &v["fields"];
            if f["message"] != CAUGHT_UP || f["topic"] != topic {
                return None;
            }
            Some((f["offsets"].as_u64()?, f["ms"].as_u64()?))
        })
}

/// Part 1 (see the module docs); returns process B, caught up.
async fn rebuild(ctx: &mut Ctx, spec: &ServerSpec, prefix: &str) -> GateResult<LocalServer> {
    let n = ctx.opts.kafka_versions.max(1);
    let (empty, empty_s) = timed_start(
        ctx,
        spec,
        "start_on_empty_topics",
        Duration::from_secs(3),
        Duration::from_secs(60),
    )
    .await?;
    drop(empty);
    if !ctx.opts.quiet {
        eprintln!("kafka-store: writing {n} lay reports to process A");
    }
    let writing = Instant::now();
    let (first, last) = write_reports(&ctx.target, n).await?;
    let written_s = writing.elapsed().as_secs_f64();
    let label = format!("rebuild_{n}_versions");
    // a rebuild at a tenth of the goal still ends in time
    let limit = Duration::from_secs(60 + (n as u64) / 5_000);
    let expected = Duration::from_secs_f64(empty_s + n as f64 / GOAL_REBUILD_PER_S);
    let (b, ready_s) = timed_start(ctx, spec, &label, expected, limit).await?;
    let ready = Instant::now();
    let b_target = parse_target(&b)?;
    let feed_s = gate_rebuilt(&b_target, n, &first, &last, ready, limit)
        .await?
        .as_secs_f64();

    let lay_reports = topic(prefix, "lay_report");
    let log = std::fs::read_to_string(b.log_path()).unwrap_or_default();
    let from_log = caught_up(&log, &lay_reports);
    let rebuild_s = ready_s - empty_s;
    let rate = (rebuild_s > 0.0).then(|| n as f64 / rebuild_s);
    let judged = n >= GOAL_FROM_VERSIONS;
    if let Some(run) = ctx.runs.last_mut() {
        let m = &mut run.metrics;
        m.insert("rebuild_versions".into(), n as f64);
        m.insert("rebuild_ready_s".into(), ready_s);
        m.insert("empty_start_ready_s".into(), empty_s);
        m.insert("rebuild_s".into(), rebuild_s);
        m.insert("rebuild_feed_after_ready_s".into(), feed_s);
        if let Some(rate) = rate {
            m.insert("rebuild_versions_per_s".into(), rate);
        }
        if let Some((offsets, ms)) = from_log {
            m.insert("rebuild_log_offsets".into(), offsets as f64);
            m.insert("rebuild_log_ms".into(), ms as f64);
            m.insert(
                "rebuild_log_versions_per_s".into(),
                n as f64 / (ms.max(1) as f64 / 1000.0),
            );
        }
        m.insert("written_versions_per_s".into(), n as f64 / written_s);
        if judged {
            run.thresholds.push(Threshold::at_least(
                "rebuild versions/s",
                GOAL_REBUILD_PER_S,
                rate.unwrap_or(0.0),
            ));
        }
    }
    ctx.note(format!(
        "{n} lay reports written to process A in {written_s:.2} s ({:.0}/s; bulk requests of {BULK}, each one Kafka transaction, {WRITERS} in flight)",
        n as f64 / written_s
    ));
    ctx.note(format!(
        "rebuild: process B on an empty data directory ready in {ready_s:.3} s over {n} versions, {empty_s:.3} s on the empty topics = {} (goal ≥ {GOAL_REBUILD_PER_S:.0} versions/s: {})",
        rate.map_or_else(
            || "no measurable difference".to_string(),
            |r| format!("{r:.0} versions/s over {rebuild_s:.3} s")
        ),
        match (judged, rate) {
            (false, _) => format!("not judged below {GOAL_FROM_VERSIONS} versions"),
            (true, Some(r)) if r >= GOAL_REBUILD_PER_S => "met".into(),
            (true, _) => "NOT met".into(),
        }
    ));
    ctx.note(format!(
        "process B's change feed (/_changes) held the {n} versions {feed_s:.3} s after /ready answered 200 (the feed is copied from the store after it; the next runs start once it has)"
    ));
    ctx.note(match from_log {
        Some((offsets, ms)) => format!(
            "process B's log: {lay_reports} caught up with {offsets} offsets (the versions and the transactions' commit markers) in {ms} ms = {:.0} versions/s",
            n as f64 / (ms.max(1) as f64 / 1000.0)
        ),
        None => format!(
            "process B's log has no \"{CAUGHT_UP}\" line for {lay_reports} (as JSON, at info level): the store's own catch-up time is not reported"
        ),
    });
    Ok(b)
}

/// A farm POSTed to A is readable on A at once and on B soon after.
async fn gate_a_to_b(a: &Target, b: &Target) -> GateResult<()> {
    let mut on_a = Session::new(a.clone());
    let doc = farm_doc();
    let id = gate::create(&mut on_a, FARMS, &doc).await?;
    let read = gate::get_json(&mut on_a, &format!("{FARMS}/{id}")).await?;
    gate::expect_eq(
        &read,
        "name",
        &doc["name"],
        "a farm read on A after its POST",
    )?;
    let mut on_b = Session::new(b.clone());
    let deadline = Instant::now() + ARRIVAL_TIMEOUT;
    loop {
        let reply = on_b
            .send(Method::GET, &format!("{FARMS}/{id}"), None)
            .await
            .map_err(|e| ScenarioError::Setup(format!("GET {FARMS}/{id} on B: {e}")))?;
        if reply.status.is_success() {
            let read = reply.json().unwrap_or_default();
            return gate::expect_eq(&read, "name", &doc["name"], "a farm POSTed to A, read on B");
        }
        if Instant::now() > deadline {
            return Err(ScenarioError::Gate(format!(
                "a farm POSTed to A ({id}) was not readable on B after {} s (last answer {})",
                ARRIVAL_TIMEOUT.as_secs(),
                reply.status
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Part 2 at one rate: farms POSTed to A (the context's target) under an open model, their
/// changes read on B.
async fn a_to_b(ctx: &mut Ctx, b: &Target, rate: f64, duration: Duration) -> GateResult<()> {
    let model = open_model(rate, duration);
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let tracker = Arc::new(Tracker::new(
        model.iterations() as usize,
        format!("ks-{}-{rate:.0}-", &tag[..8]),
    ));
    let reader = Reader::start_on(b, STREAM, tracker.clone())
        .await
        .map_err(|e| ScenarioError::Gate(format!("cannot read {STREAM} on B: {e}")))?;
    let workload = Arc::new(TrackedPost {
        body: Bytes::from(farm_doc().to_string()),
        tracker: tracker.clone(),
    });
    let label = format!("post_on_a_readable_on_b_{rate:.0}/s");
    let run = ctx.open(&label, workload, &model).await;
    let accepted = tracker.expected();
    let waited = Instant::now();
    let missing = tracker.wait_for(accepted.clone(), ARRIVAL_TIMEOUT).await;
    let waited = waited.elapsed();
    // a second delivery of a change would follow its first closely
    tokio::time::sleep(Duration::from_millis(300)).await;
    let reader_error = reader.stop().await;
    let (from_send, from_due) = tracker.latencies(&accepted);
    let duplicated = tracker.duplicates.load(Ordering::Relaxed);
    let received = accepted.len() - missing.len();
    let q = |h: &hdrhistogram::Histogram<u64>, q: f64| ms(h.value_at_quantile(q));
    if let Some(r) = ctx.runs.last_mut() {
        let m = &mut r.metrics;
        if !from_send.is_empty() {
            for (name, v) in [("p50", 0.5), ("p95", 0.95), ("p99", 0.99)] {
                m.insert(format!("a_to_b_latency_{name}_ms"), q(&from_send, v));
            }
            m.insert("a_to_b_latency_max_ms".into(), ms(from_send.max()));
            m.insert("a_to_b_latency_from_due_p50_ms".into(), q(&from_due, 0.5));
            m.insert("a_to_b_latency_from_due_p99_ms".into(), q(&from_due, 0.99));
        }
        m.insert("a_to_b_accepted".into(), accepted.len() as f64);
        m.insert("a_to_b_received".into(), received as f64);
        m.insert("a_to_b_lost".into(), missing.len() as f64);
        m.insert("a_to_b_duplicated".into(), duplicated as f64);
        r.thresholds.push(Threshold::at_most(
            "lost (accepted by A, not on B's feed 10 s after the run)",
            0.0,
            missing.len() as f64,
        ));
        r.thresholds.push(Threshold::at_most(
            "duplicated (on B's feed twice)",
            0.0,
            duplicated as f64,
        ));
    }
    ctx.note(format!(
        "POST on A → readable on B, {rate:.0}/s offered ({:.0}/s achieved, {} dropped, {} POSTs answered 2xx): from send p50 {:.2} · p95 {:.2} · p99 {:.2} · max {:.2} ms; from due p50 {:.2} · p99 {:.2} ms; {received} received on B, {} lost, {duplicated} duplicated{}",
        run.overall.rps,
        run.dropped,
        accepted.len(),
        q(&from_send, 0.5),
        q(&from_send, 0.95),
        q(&from_send, 0.99),
        ms(from_send.max()),
        q(&from_due, 0.5),
        q(&from_due, 0.99),
        missing.len(),
        if missing.is_empty() {
            String::new()
        } else {
            format!(
                " (waited {:.1} s after the run; first missing: {}){}",
                waited.as_secs_f64(),
                missing
                    .iter()
                    .take(5)
                    .map(|i| format!("{}{i}", tracker.prefix))
                    .collect::<Vec<_>>()
                    .join(", "),
                reader_error.map_or(String::new(), |e| format!("; {e}"))
            )
        },
    ));
    if run.dropped > 0 || run.overall.rps < rate * 0.95 {
        ctx.note(format!(
            "{rate:.0}/s was not sustained here: {:.0} POSTs/s answered, {} iterations dropped (no free worker of {})",
            run.overall.rps, run.dropped, model.max_workers
        ));
    }
    Ok(())
}

/// Both parts, with process A as the context's server.
async fn measure(ctx: &mut Ctx, brokers: &str, prefix: &str) -> GateResult<()> {
    let spec = spec(ctx, brokers, prefix);
    if !ctx.opts.quiet {
        eprintln!(
            "kafka-store: starting process A on {brokers}, topics {}",
            topic(prefix, "*")
        );
    }
    let a = LocalServer::start(spec.clone())
        .await
        .map_err(|e| ScenarioError::Setup(format!("process A: {e}")))?;
    ctx.target = parse_target(&a)?;
    ctx.server = Some(a);
    let b = rebuild(ctx, &spec, prefix).await?;
    let b_target = parse_target(&b)?;
    gate_a_to_b(&ctx.target, &b_target).await?;
    let duration = ctx.opts.duration.unwrap_or(Duration::from_secs(RATE_SECS));
    for rate in RATES {
        a_to_b(ctx, &b_target, rate, duration).await?;
    }
    ctx.note("A → B latency = when the bench's SSE reader (its own thread) read the farm's change from B's /_changes?entity=farm − just before its POST to A was written (from due: − when the open model had it due); B serves it from its own materialisation by then");
    Ok(())
}

/// Deletes the topics whose names start with `prefix-`; returns their names.
async fn delete_topics(brokers: &str, prefix: &str) -> Result<Vec<String>, String> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .map_err(|e| e.to_string())?;
    let metadata = admin
        .inner()
        .fetch_metadata(None, Duration::from_secs(10))
        .map_err(|e| e.to_string())?;
    let ours = format!("{prefix}-");
    let names: Vec<String> = metadata
        .topics()
        .iter()
        .map(|t| t.name().to_owned())
        .filter(|n| n.starts_with(&ours))
        .collect();
    if names.is_empty() {
        return Ok(names);
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = admin
        .delete_topics(&refs, &options)
        .await
        .map_err(|e| e.to_string())?;
    let failed: Vec<String> = results
        .into_iter()
        .filter_map(|r| r.err().map(|(name, code)| format!("{name}: {code}")))
        .collect();
    if failed.is_empty() {
        Ok(names)
    } else {
        Err(failed.join(", "))
    }
}

#[async_trait]
impl Scenario for KafkaStore {
    fn name(&self) -> &'static str {
        "kafka-store"
    }
    fn description(&self) -> &'static str {
        "Kafka as the database (examples/egg-economy-kafka on --kafka BROKERS, fresh topics): a second process's rebuild from --kafka-versions lay reports (default 200,000; goal ≥ 50,000 versions/s), then POST on process A → change on process B's /_changes at 100/s and 1,000/s (0 lost, 0 duplicated) (not in `all`)"
    }
    fn example(&self) -> Example {
        // not served: the scenario starts its processes itself, with the broker and the
        // topics of its run (the server started for this is stopped first)
        Example::Products
    }
    fn in_all(&self) -> bool {
        // it needs a Kafka broker, which `all` does not assume
        false
    }
    async fn run(&self, ctx: &mut Ctx) -> GateResult<()> {
        if ctx.opts.url.is_some() {
            return Err(ScenarioError::NeedsLocal);
        }
        let Some(brokers) = ctx.opts.kafka.clone() else {
            return Err(ScenarioError::Setup(
                "kafka-store needs a Kafka broker: give --kafka BROKERS (host:port, e.g. 127.0.0.1:19092, the one `scripts/services/kafka.sh start` runs)".into(),
            ));
        };
        ctx.server = None;
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let prefix = format!("meshql-bench-ks-{}", &tag[..8]);
        let result = measure(ctx, &brokers, &prefix).await;
        // every process stops before its topics go
        ctx.server = None;
        match delete_topics(&brokers, &prefix).await {
            Ok(names) => ctx.note(format!(
                "the run's {} topics ({}) were deleted",
                names.len(),
                topic(&prefix, "*")
            )),
            Err(e) => ctx.note(format!(
                "the run's topics ({}) were not all deleted: {e}",
                topic(&prefix, "*")
            )),
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_catch_up_line_of_a_topic_is_read_from_a_json_log() {
        let log = [
            json!({"level": "INFO", "fields": {"message": CAUGHT_UP, "topic": "p-bench-farm", "offsets": 3, "ms": 1}}),
            json!({"level": "WARN", "fields": {"message": "something else"}}),
            json!({"level": "INFO", "fields": {"message": CAUGHT_UP, "topic": "p-bench-lay_report", "offsets": 200200, "ms": 4321}}),
        ]
        .map(|v| v.to_string())
        .join("\n");
        let log = format!("not json\n{log}\n");
        assert_eq!(caught_up(&log, "p-bench-lay_report"), Some((200_200, 4321)));
        assert_eq!(caught_up(&log, "p-bench-farm"), Some((3, 1)));
        assert_eq!(caught_up(&log, "p-bench-hen"), None);
        assert_eq!(topic("p", "lay_report"), "p-bench-lay_report");
    }
}
