//! Scenarios: each one seeds its data, passes its validation gate, then measures one or more
//! runs through the [`Ctx`]. Adding a scenario is one file with a [`Scenario`] impl and one
//! line in [`all`].

pub use soak::{least_squares, LinearFit, RssTrend};

mod cdc;
mod changes;
mod core_scaling;
mod egg_economy;
mod fan_out;
mod farm_graph;
mod kafka_store;
mod legacy;
mod products;
mod projections;
mod soak;
mod subscriptions;
mod throughput;
mod writes;

use crate::client::{Session, Target};
use crate::gate::{GateResult, ScenarioError};
use crate::load::{run_closed, run_open, ClosedModel, OpenModel, RunOutcome, Workload};
use crate::monitor::{Live, Monitor};
use crate::report::{Bounds, Curve, RunReport};
use crate::server::LocalServer;
use crate::Options;
use async_trait::async_trait;
use http::Method;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Which example config a scenario needs when the bench starts the server itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Example {
    EggEconomy,
    /// egg-economy with its live projections on.
    EggEconomyProjections,
    Events,
    Farm,
    /// The farm as a CQRS pair (`--role write` and `--role read` of one config).
    FarmCqrs,
    Products,
}

impl Example {
    pub fn dir(self) -> &'static str {
        match self {
            Example::EggEconomy | Example::EggEconomyProjections => "egg-economy",
            Example::Events => "events",
            Example::Farm => "farm",
            Example::FarmCqrs => "farm-cqrs",
            Example::Products => "products",
        }
    }

    /// Environment the example's config expects; `{url}` is the server's own base URL.
    pub fn env(self) -> Vec<(String, String)> {
        match self {
            Example::Farm => vec![("PLATFORM_URL".into(), "{url}".into())],
            Example::FarmCqrs => vec![("READ_SERVICE_URL".into(), "{url}".into())],
            _ => vec![],
        }
    }
}

#[async_trait]
pub trait Scenario: Send + Sync {
    fn name(&self) -> &'static str;
    fn description(&self) -> &'static str;
    fn example(&self) -> Example;
    /// Whether the `all` group runs it (`soak` is too long; it runs by name only).
    fn in_all(&self) -> bool {
        true
    }
    /// Seeds, passes the gate, measures.
    async fn run(&self, ctx: &mut Ctx) -> Result<(), ScenarioError>;
}

/// Every scenario, in the order `all` runs them (those that are [`Scenario::in_all`]).
pub fn all() -> Vec<Box<dyn Scenario>> {
    vec![
        Box::new(throughput::Throughput),
        Box::new(egg_economy::RestCrud),
        Box::new(egg_economy::GraphqlQueries),
        Box::new(egg_economy::FederationDepth),
        Box::new(egg_economy::MixedWorkload),
        Box::new(farm_graph::FarmGraph),
        Box::new(farm_graph::FarmCqrs),
        Box::new(products::Products),
        Box::new(fan_out::FanOut),
        Box::new(core_scaling::CoreScaling),
        Box::new(changes::Changes),
        Box::new(cdc::Cdc),
        Box::new(projections::Projections),
        Box::new(subscriptions::Subscriptions),
        Box::new(soak::Soak),
        Box::new(legacy::Legacy),
        Box::new(kafka_store::KafkaStore),
    ]
}

/// Named groups of scenarios.
pub fn group(name: &str) -> Option<Vec<&'static str>> {
    match name {
        "egg-economy" => Some(vec![
            "rest-crud",
            "graphql-queries",
            "federation-depth",
            "mixed-workload",
        ]),
        "all" => Some(
            all()
                .iter()
                .filter(|s| s.in_all())
                .map(|s| s.name())
                .collect(),
        ),
        _ => None,
    }
}

/// Storage and cache counters from meshql's `/metrics` (absent on other servers).
#[derive(Debug, Clone, Copy, Default)]
pub struct Counters {
    pub reads: u64,
    pub writes: u64,
    pub commits: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Reads that did not consult a shared cache (their operation's hit rate was low).
    pub cache_skipped: u64,
}

/// What a scenario works with: the target, the options, the local server (if any), and the
/// runs measured so far.
pub struct Ctx {
    pub opts: Arc<Options>,
    pub target: Target,
    pub server: Option<LocalServer>,
    pub(crate) scenario: &'static str,
    pub(crate) runs: Vec<RunReport>,
    pub(crate) notes: Vec<String>,
    pub(crate) curves: Vec<Curve>,
}

/// The local server's config served as a CQRS pair ([`Ctx::split_into_roles`]): the write
/// process, the shared data directory, and the target to go back to.
pub(crate) struct RolePair {
    write: LocalServer,
    _data: tempfile::TempDir,
    monolith: Target,
}

impl Ctx {
    /// A fresh connection for setup and gate requests.
    pub fn session(&self) -> Session {
        Session::new(self.target.clone())
    }

    /// Stops the local server and serves its config as `--role write` and `--role read` on
    /// one data directory: from then on the target sends GETs and GraphQL to the read process
    /// and every other request to the write process, and the runs' resource columns sample
    /// the read process. [`Ctx::join_roles`] stops the pair.
    pub(crate) async fn split_into_roles(&mut self) -> GateResult<RolePair> {
        let Some(monolith) = self.server.take() else {
            return Err(ScenarioError::Setup(format!(
                "{} starts its own write and read processes: run it without --url",
                self.scenario
            )));
        };
        let spec = monolith.spec().clone();
        // the monolith stops: the pair gets the machine to itself
        drop(monolith);
        let data = tempfile::Builder::new()
            .prefix("meshql-bench-roles-")
            .tempdir()
            .map_err(|e| ScenarioError::Setup(e.to_string()))?;
        let role = |name: &str| {
            let mut s = spec.clone();
            s.args.extend(["--role".to_owned(), name.to_owned()]);
            s.data_dir = Some(data.path().to_owned());
            s
        };
        let write = LocalServer::start(role("write"))
            .await
            .map_err(|e| ScenarioError::Setup(format!("the write process: {e}")))?;
        let read = LocalServer::start(role("read"))
            .await
            .map_err(|e| ScenarioError::Setup(format!("the read process: {e}")))?;
        let parse =
            |url: String| Target::parse(&url).map_err(|e| ScenarioError::Setup(e.to_string()));
        let pair = parse(write.url())?.with_reads(parse(read.url())?);
        let monolith = std::mem::replace(&mut self.target, pair);
        self.server = Some(read);
        Ok(RolePair {
            write,
            _data: data,
            monolith,
        })
    }

    /// Stops a pair made by [`Ctx::split_into_roles`]; the target is the monolith's again
    /// (stopped too).
    pub(crate) fn join_roles(&mut self, pair: RolePair) {
        self.target = pair.monolith;
        drop(self.server.take());
        drop(pair.write);
    }

    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    /// The closed model the options ask for: `--profile`, else `--vus` users for
    /// `--duration` when a duration is given, else `default`; with `--think-ms`'s think time.
    pub fn profile(&self, default: ClosedModel) -> ClosedModel {
        let mut model = match (&self.opts.profile, self.opts.duration) {
            (Some(p), _) => p.clone(),
            (None, Some(d)) => ClosedModel::constant(self.opts.vus, d),
            (None, None) => default,
        };
        if let Some(think) = self.opts.think {
            model.think = think;
        }
        model
    }

    /// `--vus` users for `--duration` (or `secs`), no ramp.
    pub fn constant(&self, secs: u64) -> ClosedModel {
        ClosedModel::constant(
            self.opts.vus,
            self.opts.duration.unwrap_or(Duration::from_secs(secs)),
        )
    }

    pub async fn counters(&self) -> Option<Counters> {
        let mut s = self.session();
        let reply = s.send(Method::GET, "/metrics", None).await.ok()?;
        if !reply.status.is_success() {
            return None;
        }
        let text = String::from_utf8_lossy(&reply.body);
        let mut c = Counters::default();
        let mut seen = false;
        for line in text.lines() {
            let Some((name, value)) = line.split_once(' ') else {
                continue;
            };
            let Ok(v) = value.trim().parse::<u64>() else {
                continue;
            };
            let slot = if name.starts_with("meshql_storage_reads_total") {
                &mut c.reads
            } else if name.starts_with("meshql_storage_writes_total") {
                &mut c.writes
            } else if name.starts_with("meshql_storage_commits_total") {
                &mut c.commits
            } else if name.starts_with("meshql_cache_hits_total") {
                &mut c.cache_hits
            } else if name.starts_with("meshql_cache_misses_total") {
                &mut c.cache_misses
            } else if name.starts_with("meshql_cache_skipped_total") {
                &mut c.cache_skipped
            } else {
                continue;
            };
            *slot += v;
            seen = true;
        }
        seen.then_some(c)
    }

    /// Measures `workload` under a closed model.
    pub async fn closed(
        &mut self,
        label: &str,
        workload: Arc<dyn Workload>,
        model: &ClosedModel,
    ) -> RunReport {
        let run = self
            .measure(
                label,
                model.describe(),
                model.total(),
                None,
                |target, live| {
                    let model = model.clone();
                    async move { run_closed(&target, workload, &model, live).await }
                },
            )
            .await;
        self.listed(run)
    }

    /// Measures `workload` under an open model.
    pub async fn open(
        &mut self,
        label: &str,
        workload: Arc<dyn Workload>,
        model: &OpenModel,
    ) -> RunReport {
        let run = self.open_unlisted(label, workload, model).await;
        self.runs.push(run.clone());
        run
    }

    /// [`Ctx::open`] without adding the run to the scenario's runs (points of a [`Curve`]).
    pub async fn open_unlisted(
        &mut self,
        label: &str,
        workload: Arc<dyn Workload>,
        model: &OpenModel,
    ) -> RunReport {
        self.measure(
            label,
            model.describe(),
            model.duration,
            Some(model.rate),
            |target, live| {
                let model = model.clone();
                async move { run_open(&target, workload, &model, live).await }
            },
        )
        .await
    }

    pub fn add_curve(&mut self, curve: Curve) {
        self.curves.push(curve);
    }

    /// Measures against another base URL (the ceiling server); nothing server-side is sampled.
    pub async fn closed_at(
        &mut self,
        target: Target,
        label: &str,
        workload: Arc<dyn Workload>,
        model: &ClosedModel,
    ) -> RunReport {
        let saved = std::mem::replace(&mut self.target, target);
        let server = self.server.take();
        let run = self.closed(label, workload, model).await;
        self.target = saved;
        self.server = server;
        run
    }

    /// Adds `run` to the scenario's runs (what its report lists).
    fn listed(&mut self, run: RunReport) -> RunReport {
        self.runs.push(run.clone());
        run
    }

    /// Runs `go` against the target with the server monitored, and reports it (not listed:
    /// see [`Ctx::listed`]).
    async fn measure<F, Fut>(
        &mut self,
        label: &str,
        model: String,
        planned: Duration,
        offered: Option<f64>,
        go: F,
    ) -> RunReport
    where
        F: FnOnce(Target, Arc<Live>) -> Fut,
        Fut: std::future::Future<Output = RunOutcome>,
    {
        let before = self.counters().await;
        let live = Arc::new(Live::default());
        let monitor = Monitor::start(
            format!("{} / {label}", self.scenario),
            planned,
            live.clone(),
            self.server.as_ref().map(LocalServer::probe),
        );
        let outcome = go(self.target.clone(), live).await;
        let (timeline, server) = monitor.finish().await;
        let after = self.counters().await;
        let (kinds, overall) = outcome.recorder.summarise(outcome.elapsed);
        let mut metrics = BTreeMap::new();
        if let (Some(b), Some(a)) = (before, after) {
            if overall.count > 0 {
                metrics.insert(
                    "storage_reads_per_request".into(),
                    (a.reads - b.reads) as f64 / overall.count as f64,
                );
            }
            let (hits, misses) = (a.cache_hits - b.cache_hits, a.cache_misses - b.cache_misses);
            let skipped = a.cache_skipped - b.cache_skipped;
            if hits + misses > 0 {
                // of the reads that consulted the cache, and of all reads through it
                metrics.insert(
                    "cache_hit_rate".into(),
                    hits as f64 / (hits + misses) as f64,
                );
                metrics.insert(
                    "cache_skipped_share".into(),
                    skipped as f64 / (hits + misses + skipped) as f64,
                );
            }
            if a.commits > b.commits && a.writes > b.writes {
                metrics.insert(
                    "documents_per_commit".into(),
                    (a.writes - b.writes) as f64 / (a.commits - b.commits) as f64,
                );
            }
        }
        if offered.is_some() && !outcome.schedule_lag.is_empty() {
            let lag = &outcome.schedule_lag;
            metrics.insert(
                "schedule_lag_p99_ms".into(),
                lag.value_at_quantile(0.99) as f64 / 1000.0,
            );
            metrics.insert("schedule_lag_max_ms".into(), lag.max() as f64 / 1000.0);
        }
        let bounds: Bounds = self.opts.bounds;
        let run = RunReport {
            label: label.to_string(),
            model,
            offered_rps: offered,
            duration_s: outcome.elapsed.as_secs_f64(),
            iterations: outcome.iterations,
            dropped: outcome.dropped,
            peak_vus: outcome.peak_vus,
            thresholds: bounds.evaluate(&kinds, &overall),
            kinds,
            overall,
            server,
            metrics,
            timeline,
        };
        if !self.opts.quiet {
            eprintln!(
                "{} / {}: {:.0} req/s, p95 {:.2} ms, {} errors{}",
                self.scenario,
                label,
                run.overall.rps,
                run.overall.p95_ms,
                run.overall.http_errors + run.overall.graphql_errors,
                if run.dropped > 0 {
                    format!(", {} dropped", run.dropped)
                } else {
                    String::new()
                }
            );
        }
        run
    }
}
