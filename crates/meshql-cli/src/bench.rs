//! `meshql bench`: argument parsing and output files; the work is in `meshql-bench`.

use clap::{Args, Subcommand};
use meshql_bench::load::ClosedModel;
use meshql_bench::report::Bounds;
use meshql_bench::Options;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// List the scenarios.
    List,
    /// Compare two report.json files: throughput and latency ratios side by side (B/A).
    Compare { a: PathBuf, b: PathBuf },
    /// Render a report.json again: the terminal table on stdout, and report.md, report.html
    /// and charts/ into --out (default: beside the JSON).
    Render {
        report: PathBuf,
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(Args)]
pub struct BenchRun {
    /// Scenarios or groups to run (`all`, `egg-economy`, or names from `meshql bench list`).
    #[arg(default_value = "throughput")]
    scenarios: Vec<String>,
    /// Measure this running server (http://host:port) instead of starting one per scenario.
    #[arg(long)]
    url: Option<String>,
    /// Local mode: serve this config instead of each scenario's example (e.g. the PostgreSQL
    /// variant of egg-economy).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Local mode: where the example configs are (default: ./examples, then the source tree's).
    #[arg(long)]
    examples: Option<PathBuf>,
    /// Closed-model profile: smoke (1 user, 10 s), load (5→10→0 users, 55 s) or stress
    /// (10→30→50→0 users, 90 s). Default: smoke for the egg-economy suite.
    #[arg(long)]
    profile: Option<String>,
    /// Think time of every user of a closed-model profile between two iterations, in ms
    /// (MeshQL's k6 scripts sleep 500: `--think-ms 500` reproduces the seeds' load; default:
    /// back to back, which saturates the server).
    #[arg(long)]
    think_ms: Option<u64>,
    /// Seconds of each constant-load run (throughput 8, fan-out and core-scaling 10, farm-graph
    /// 60, soak 1800; kafka-store 5 per rate).
    #[arg(long)]
    duration: Option<u64>,
    /// Users of constant-load runs.
    #[arg(long, default_value_t = 10)]
    vus: usize,
    /// Local mode: server worker threads (default: one per core, as `meshql serve`).
    #[arg(long)]
    workers: Option<usize>,
    /// Products seeded by the products scenario.
    #[arg(long, default_value_t = 100_000)]
    products: usize,
    /// Arrival rates (per second) the products scenario runs before its sweep.
    #[arg(long, value_delimiter = ',', default_value = "300,900")]
    rates: Vec<f64>,
    /// The products sweep stops once p95 exceeds this many milliseconds.
    #[arg(long, default_value_t = 2.0)]
    sweep_p95_ms: f64,
    /// Seconds of each fixed arrival-rate step (sweep steps take a third of it, at least 1).
    #[arg(long, default_value_t = 30)]
    step_secs: u64,
    /// Rounds of the throughput scenario (ratios reported as medians).
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Seconds of each point of the throughput scenario's latency-vs-load curves (open model
    /// at 10, 25, 50, 75 and 90 % of each hot path's measured throughput: 20 points); 0 = no
    /// curves.
    #[arg(long, default_value_t = 2.0)]
    curve_secs: f64,
    /// Base URL of an external ceiling server (default: a built-in one on its own thread).
    #[arg(long)]
    ceiling: Option<String>,
    /// Throughput: writes per second sent while each read path is measured (new hens in a
    /// coop of their own), to measure reads with writes flowing (e.g. through `[cache]`).
    #[arg(long, default_value_t = 0.0)]
    writes_per_sec: f64,
    /// Products (local mode): serve the config as `--role write` and `--role read` (one data
    /// directory): products are seeded and written through the write process and read through
    /// the read process (with `read_url`, on the replica)
    #[arg(long)]
    cqrs: bool,
    /// Iterations per second of the `soak` scenario (a fixed arrival rate; each iteration is
    /// one of the egg-economy suite's, 3.75 requests on average).
    #[arg(long, default_value_t = 1000.0)]
    soak_rate: f64,
    /// Kafka bootstrap servers (host:port): the `changes` scenario then also measures a Kafka
    /// relay's catch-up throughput and POST → Kafka latency; `kafka-store` needs them.
    #[arg(long)]
    kafka: Option<String>,
    /// Versions (lay reports) the `kafka-store` scenario writes before it times a second
    /// process's rebuild of them.
    #[arg(long, default_value_t = 200_000)]
    kafka_versions: usize,
    /// The `legacy` scenario's PostgreSQL (wal_level = logical; `scripts/services/postgres.sh
    /// start` runs one): it makes a database of its own there and drops it at the end.
    #[arg(long, env = "MESHQL_BENCH_LEGACY_URL", default_value = meshql_bench::DEFAULT_LEGACY_URL)]
    legacy_url: String,
    /// Rows of the `legacy` scenario's initial snapshot.
    #[arg(long, default_value_t = 1_000_000)]
    legacy_rows: usize,
    /// Threshold: p95 of every request kind must stay below this (ms).
    #[arg(long, default_value_t = 500.0)]
    max_p95_ms: f64,
    /// Threshold: failed requests / requests must stay below this.
    #[arg(long, default_value_t = 0.01)]
    max_error_rate: f64,
    /// Directory for report.json, report.md and report.html (default: bench-results/<time>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Threads of the load generator.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// No progress or per-run lines on stderr.
    #[arg(long)]
    quiet: bool,
}

fn find_examples(given: Option<PathBuf>) -> Option<PathBuf> {
    if given.is_some() {
        return given;
    }
    let here = PathBuf::from("examples");
    if here.join("egg-economy").is_dir() {
        return Some(here);
    }
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    source.join("egg-economy").is_dir().then_some(source)
}

pub fn run(command: Option<BenchCommand>, args: BenchRun) -> ExitCode {
    match command {
        Some(BenchCommand::List) => {
            for (name, description) in meshql_bench::list() {
                println!("{name:<18} {description}");
            }
            println!(
                "{:<18} rest-crud, graphql-queries, federation-depth, mixed-workload",
                "egg-economy"
            );
            println!(
                "{:<18} every scenario except soak, legacy and kafka-store",
                "all"
            );
            ExitCode::SUCCESS
        }
        Some(BenchCommand::Compare { a, b }) => {
            match (meshql_bench::read_report(&a), meshql_bench::read_report(&b)) {
                (Ok(ra), Ok(rb)) => {
                    print!(
                        "{}",
                        meshql_bench::report::compare(
                            &ra,
                            &rb,
                            &a.display().to_string(),
                            &b.display().to_string()
                        )
                    );
                    ExitCode::SUCCESS
                }
                (Err(e), _) | (_, Err(e)) => {
                    eprintln!("meshql bench compare: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Some(BenchCommand::Render { report, out }) => {
            let parsed = match meshql_bench::read_report(&report) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("meshql bench render: {e}");
                    return ExitCode::FAILURE;
                }
            };
            print!("{}", meshql_bench::report::terminal(&parsed));
            let dir = out.unwrap_or_else(|| {
                report
                    .parent()
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|| PathBuf::from("."))
            });
            match meshql_bench::write_outputs(&parsed, &dir) {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!(
                        "meshql bench render: cannot write to {}: {e}",
                        dir.display()
                    );
                    ExitCode::FAILURE
                }
            }
        }
        None => run_scenarios(args),
    }
}

fn run_scenarios(args: BenchRun) -> ExitCode {
    let profile = match args.profile.as_deref().map(ClosedModel::by_name) {
        None => None,
        Some(Some(p)) => Some(p),
        Some(None) => {
            eprintln!(
                "meshql bench: unknown profile {:?}; use smoke, load or stress",
                args.profile.unwrap_or_default()
            );
            return ExitCode::FAILURE;
        }
    };
    if !(args.soak_rate.is_finite() && args.soak_rate > 0.0) {
        eprintln!(
            "meshql bench: --soak-rate must be a positive number of iterations per second, not {}",
            args.soak_rate
        );
        return ExitCode::FAILURE;
    }
    if args.cqrs && args.url.is_some() {
        eprintln!(
            "meshql bench: --cqrs starts its own --role write and --role read processes; it cannot measure --url"
        );
        return ExitCode::FAILURE;
    }
    if args.cqrs && !args.scenarios.iter().any(|s| s == "products") {
        eprintln!("meshql bench: --cqrs applies to the products scenario only (`meshql bench products --cqrs`)");
        return ExitCode::FAILURE;
    }
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("meshql bench: cannot find the meshql binary: {e}");
            return ExitCode::FAILURE;
        }
    };
    let examples = match (find_examples(args.examples), &args.url, &args.config) {
        (Some(e), _, _) => e,
        (None, None, None) => {
            eprintln!("meshql bench: no examples directory here; pass --examples DIR, --config FILE or --url URL");
            return ExitCode::FAILURE;
        }
        (None, _, _) => PathBuf::from("examples"),
    };
    let mut opts = Options::new(exe, examples);
    opts.scenarios = args.scenarios;
    opts.url = args.url;
    opts.config = args.config;
    opts.profile = profile;
    opts.think = args.think_ms.map(Duration::from_millis);
    opts.duration = args.duration.map(Duration::from_secs);
    opts.vus = args.vus.max(1);
    opts.workers = args.workers;
    opts.products = args.products;
    opts.rates = args.rates;
    opts.sweep_p95_ms = args.sweep_p95_ms;
    opts.step_secs = args.step_secs;
    opts.rounds = args.rounds;
    opts.curve_secs = args.curve_secs.max(0.0);
    opts.kafka = args.kafka;
    opts.kafka_versions = args.kafka_versions.max(1);
    opts.legacy_url = args.legacy_url;
    opts.legacy_rows = args.legacy_rows;
    opts.soak_rate = args.soak_rate;
    opts.ceiling = args.ceiling;
    opts.writes_per_sec = args.writes_per_sec.max(0.0);
    opts.cqrs = args.cqrs;
    opts.bounds = Bounds {
        p95_ms: args.max_p95_ms,
        error_rate: args.max_error_rate,
    };
    opts.quiet = args.quiet;
    opts.client_threads = args.threads.max(1);
    // one generator thread (the default, like `wrk -t1`) runs on a current-thread runtime:
    // no work-stealing machinery between the virtual users and their sockets
    let mut builder = if opts.client_threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(opts.client_threads);
        b
    };
    let runtime = match builder.enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("meshql bench: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let report = match runtime.block_on(meshql_bench::run(opts)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("meshql bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    print!("{}", meshql_bench::report::terminal(&report));
    let out = args
        .out
        .unwrap_or_else(|| PathBuf::from("bench-results").join(report.started.replace(':', "-")));
    match meshql_bench::write_outputs(&report, &out) {
        Ok(paths) => {
            let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
            println!("\nreports: {}", names.join(", "));
        }
        Err(e) => {
            eprintln!(
                "meshql bench: cannot write reports to {}: {e}",
                out.display()
            );
            return ExitCode::FAILURE;
        }
    }
    if report.scenarios.iter().any(|s| s.status.is_failure()) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
