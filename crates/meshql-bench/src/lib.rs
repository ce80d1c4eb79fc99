//! `meshql bench`: a load generator (closed and open models, HdrHistogram latencies) and the
//! scenarios that reproduce the seed reports' experiments, with a validation gate before every
//! measurement and reports as a terminal table, JSON, Markdown and an HTML page with charts.
//!
//! The bench talks HTTP only, so it measures any server exposing the same API (`--url`); with
//! no URL it starts a fresh `meshql serve` per scenario on a temporary data directory and also
//! samples the server's memory and CPU.

pub mod client;
pub mod gate;
pub mod http1;
pub mod load;
pub mod monitor;
pub mod precise;
pub mod report;
pub mod scenarios;
pub mod server;
pub mod sse;
pub mod stats;

use crate::client::Target;
use crate::gate::ScenarioError;
use crate::load::ClosedModel;
use crate::report::{Bounds, Machine, Report, ScenarioReport, Status, TargetInfo};
use crate::scenarios::{Ctx, Scenario};
use crate::server::{LocalServer, ServerSpec};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The PostgreSQL `scripts/services/postgres.sh start` runs, for the `legacy` scenario.
pub const DEFAULT_LEGACY_URL: &str = "postgres://postgres@127.0.0.1:55432/postgres";

/// Everything `meshql bench` can be told.
#[derive(Debug, Clone)]
pub struct Options {
    /// Scenario or group names (`all`, `egg-economy`, `throughput`, …).
    pub scenarios: Vec<String>,
    /// Measure this server instead of starting one.
    pub url: Option<String>,
    /// The `meshql` binary used for local servers.
    pub exe: PathBuf,
    /// Where the example configs live (local mode).
    pub examples: PathBuf,
    /// Serve this config instead of the scenario's example (local mode), e.g. a PostgreSQL
    /// variant of egg-economy.
    pub config: Option<PathBuf>,
    /// Closed-model profile for the egg-economy suite (`smoke`, `load`, `stress`).
    pub profile: Option<ClosedModel>,
    /// Think time of every closed-model user between two iterations (MeshQL's k6 scripts
    /// sleep 500 ms); `None`: the scenario's own (back to back).
    pub think: Option<Duration>,
    /// Length of constant-load runs.
    pub duration: Option<Duration>,
    /// Users of constant-load runs.
    pub vus: usize,
    /// Server worker threads (local mode).
    pub workers: Option<usize>,
    /// Products seeded by the products scenario.
    pub products: usize,
    /// Arrival rates the products scenario runs before its sweep.
    pub rates: Vec<f64>,
    /// The products sweep stops once p95 exceeds this (ms) or iterations are dropped.
    pub sweep_p95_ms: f64,
    /// Seconds of each open-model step.
    pub step_secs: u64,
    /// Rounds of the throughput scenario (medians reported).
    pub rounds: usize,
    /// Products (local mode): serve the config as a `--role write` and a `--role read`
    /// process, seeding and writes to the first, reads to the second.
    pub cqrs: bool,
    /// Seconds of each point of the throughput scenario's latency-vs-load curves (open
    /// model at fractions of each path's measured saturation); 0 measures no curve.
    pub curve_secs: f64,
    /// Base URL of an external ceiling server (default: the built-in one).
    pub ceiling: Option<String>,
    /// Writes per second the throughput scenario sends while it measures each read path
    /// (new hens in a coop of their own): reads with writes flowing. 0: none.
    pub writes_per_sec: f64,
    /// Iterations per second of the `soak` scenario (open model).
    pub soak_rate: f64,
    /// Kafka bootstrap servers: the `changes` scenario's relay runs (skipped without) and
    /// the `kafka-store` scenario (which needs them).
    pub kafka: Option<String>,
    /// Versions the `kafka-store` scenario writes before it times a second process's rebuild.
    pub kafka_versions: usize,
    /// PostgreSQL (`wal_level = logical`) of the `legacy` scenario: it makes a database of its
    /// own there, and drops it with its replication slot at the end.
    pub legacy_url: String,
    /// Rows of the `legacy` scenario's initial snapshot.
    pub legacy_rows: usize,
    pub bounds: Bounds,
    pub quiet: bool,
    pub client_threads: usize,
}

impl Options {
    pub fn new(exe: PathBuf, examples: PathBuf) -> Self {
        Self {
            scenarios: vec!["throughput".into()],
            url: None,
            exe,
            examples,
            config: None,
            profile: None,
            think: None,
            duration: None,
            vus: 10,
            workers: None,
            products: 100_000,
            rates: vec![300.0, 900.0],
            sweep_p95_ms: 2.0,
            step_secs: 30,
            rounds: 1,
            cqrs: false,
            curve_secs: 2.0,
            ceiling: None,
            writes_per_sec: 0.0,
            kafka: None,
            kafka_versions: 200_000,
            legacy_url: DEFAULT_LEGACY_URL.into(),
            legacy_rows: 1_000_000,
            soak_rate: 1000.0,
            bounds: Bounds::default(),
            quiet: false,
            client_threads: 1,
        }
    }
}

impl Options {
    /// Worker threads of the servers the bench starts: `--workers`, else one per core, as
    /// `meshql serve` runs by default. (On 2 cores a server sharing them with the generator
    /// does better on point reads with one worker and worse on depth 3:
    /// docs/BENCHMARKS.md, "Cores split between the generator and the server".) `None` with
    /// `--url`.
    pub fn server_workers(&self) -> Option<usize> {
        if self.url.is_some() {
            return None;
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Some(self.workers.unwrap_or(cores))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("unknown scenario {0:?}; known: {1}")]
    UnknownScenario(String, String),
    #[error(transparent)]
    Target(#[from] client::ClientError),
}

/// Names of every scenario and group, for help and errors.
pub fn known_names() -> String {
    let mut names: Vec<&str> = vec!["all", "egg-economy"];
    let scenarios = scenarios::all();
    names.extend(scenarios.iter().map(|s| s.name()));
    names.join(", ")
}

/// `(name, description)` of every scenario.
pub fn list() -> Vec<(&'static str, &'static str)> {
    scenarios::all()
        .iter()
        .map(|s| (s.name(), s.description()))
        .collect()
}

fn select(names: &[String]) -> Result<Vec<Box<dyn Scenario>>, BenchError> {
    let mut wanted: Vec<String> = Vec::new();
    for n in names {
        let expanded = scenarios::group(n).map_or_else(
            || vec![n.clone()],
            |g| g.into_iter().map(String::from).collect(),
        );
        for e in expanded {
            if !wanted.contains(&e) {
                wanted.push(e);
            }
        }
    }
    let mut out = Vec::new();
    for w in wanted {
        let scenario = scenarios::all()
            .into_iter()
            .find(|s| s.name() == w)
            .ok_or_else(|| BenchError::UnknownScenario(w.clone(), known_names()))?;
        out.push(scenario);
    }
    Ok(out)
}

/// Runs the selected scenarios and returns the report.
pub async fn run(opts: Options) -> Result<Report, BenchError> {
    let selected = select(&opts.scenarios)?;
    let remote = match &opts.url {
        Some(u) => Some(Target::parse(u)?),
        None => None,
    };
    let opts = Arc::new(opts);
    let mut report = Report {
        tool: format!("meshql bench {}", env!("CARGO_PKG_VERSION")),
        started: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
        machine: Machine::probe(opts.client_threads, opts.server_workers()),
        target: TargetInfo {
            url: remote.as_ref().map_or_else(String::new, |t| t.base.clone()),
            local: remote.is_none(),
        },
        scenarios: Vec::new(),
    };
    for scenario in selected {
        let (status, ctx) = run_one(scenario.as_ref(), &opts, remote.clone()).await;
        let (runs, notes, curves, url) = match ctx {
            Some(c) => (c.runs, c.notes, c.curves, c.target.base.clone()),
            None => (vec![], vec![], vec![], String::new()),
        };
        let status = match status {
            Status::Passed if runs.iter().any(|r| r.thresholds.iter().any(|t| !t.passed)) => {
                Status::ThresholdsFailed
            }
            s => s,
        };
        if !opts.quiet {
            eprintln!("{}: {}", scenario.name(), status.label());
        }
        if report.target.url.is_empty() || remote.is_none() {
            report.target.url = url.clone();
        }
        report.scenarios.push(ScenarioReport {
            name: scenario.name().to_string(),
            description: scenario.description().to_string(),
            status,
            url,
            runs,
            notes,
            curves,
        });
    }
    Ok(report)
}

async fn run_one(
    scenario: &dyn Scenario,
    opts: &Arc<Options>,
    remote: Option<Target>,
) -> (Status, Option<Ctx>) {
    let (target, server) = match remote {
        Some(t) => (t, None),
        None => {
            let example = scenario.example();
            let config = opts
                .config
                .clone()
                .unwrap_or_else(|| opts.examples.join(example.dir()));
            let spec = ServerSpec {
                exe: opts.exe.clone(),
                config,
                workers: opts.server_workers(),
                env: example.env(),
                args: Vec::new(),
                data_dir: None,
            };
            if !opts.quiet {
                eprintln!(
                    "{}: starting meshql serve {}",
                    scenario.name(),
                    spec.config.display()
                );
            }
            match LocalServer::start(spec).await {
                Ok(s) => (Target::parse(&s.url()).expect("local URLs parse"), Some(s)),
                Err(e) => {
                    return (
                        Status::Failed {
                            reason: e.to_string(),
                        },
                        None,
                    )
                }
            }
        }
    };
    let mut ctx = Ctx {
        opts: opts.clone(),
        target,
        server,
        scenario: scenario.name(),
        runs: Vec::new(),
        notes: Vec::new(),
        curves: Vec::new(),
    };
    let status = match scenario.run(&mut ctx).await {
        Ok(()) => Status::Passed,
        Err(ScenarioError::Gate(reason)) => Status::GateFailed { reason },
        Err(ScenarioError::Setup(reason)) => Status::Failed { reason },
        Err(ScenarioError::NeedsLocal) => Status::Skipped {
            reason: ScenarioError::NeedsLocal.to_string(),
        },
    };
    if let Status::GateFailed { .. } = status {
        // a scenario gates before it measures; never report numbers next to a failed gate
        ctx.runs.clear();
        ctx.curves.clear();
    }
    ctx.server = None; // stops the local server
    (status, Some(ctx))
}

/// Writes `report.json`, `report.md`, `report.html` and `charts/*.svg` into `dir`; returns
/// their paths.
pub fn write_outputs(report: &Report, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let files = [
        (
            "report.json",
            serde_json::to_string_pretty(report).expect("report serialises"),
        ),
        ("report.md", report::markdown(report)),
        ("report.html", report::html(report)),
    ];
    let mut paths = Vec::new();
    for (name, text) in files {
        let p = dir.join(name);
        std::fs::write(&p, text)?;
        paths.push(p);
    }
    let charts = report::charts(report);
    if !charts.is_empty() {
        let chart_dir = dir.join("charts");
        std::fs::create_dir_all(&chart_dir)?;
        for c in &charts {
            std::fs::write(chart_dir.join(&c.file), &c.svg)?;
        }
        paths.push(chart_dir);
    }
    Ok(paths)
}

/// Reads a `report.json` written by [`write_outputs`].
pub fn read_report(path: &Path) -> Result<Report, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: not a bench report: {e}", path.display()))
}
