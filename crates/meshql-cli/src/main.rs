//! The `meshql` command line.

mod backup;
mod bench;
mod cdc;
mod changes;
mod check_data;
mod diff;
mod init;
mod migrate;
mod process;
mod projections;
mod registries;
#[cfg(target_os = "linux")]
mod startup_pages;
mod transfer;

/// mimalloc instead of the system allocator: every request allocates and frees small
/// buffers (headers, JSON values, plans' outputs) on several threads; glibc malloc showed up
/// at ~10 % of the server's CPU samples under load.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser)]
#[command(
    name = "meshql",
    version,
    about = "REST and GraphQL data services from a declarative model of entities"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Colour in log lines: `auto` (only when they go to a terminal, and `NO_COLOR` is not
    /// set), `always` or `never`.
    #[arg(long, global = true, default_value = "auto", env = "MESHQL_COLOR")]
    color: ColorChoice,
}

/// Whether log lines carry ANSI colour codes (`--color`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ColorChoice {
    Auto,
    Always,
    Never,
}

impl ColorChoice {
    /// Whether to colour what is written to standard output (where the logs go).
    fn enabled(self) -> bool {
        use std::io::IsTerminal;
        match self {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => {
                std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
                    && std::io::stdout().is_terminal()
            }
        }
    }
}

/// How `meshql serve` runs its connections (see `--runtime`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum RuntimeKind {
    ThreadPerCore,
    WorkStealing,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the entities of a config (a meshql.toml file, or a directory holding one).
    Serve {
        /// Config file or directory.
        #[arg(default_value = ".")]
        config: PathBuf,
        /// Override the config's port.
        #[arg(long, env = "MESHQL_PORT")]
        port: Option<u16>,
        /// Override the config's bind address.
        #[arg(long)]
        host: Option<String>,
        /// Override the config's data directory (created if missing).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Threads serving connections (default: one per core).
        #[arg(long)]
        workers: Option<usize>,
        /// `thread-per-core`: each serving thread runs a single-threaded runtime and serves
        /// every connection it accepts to the end (background work has a thread of its own);
        /// `work-stealing`: one multi-threaded runtime serves everything. docs/BENCHMARKS.md
        /// ("Thread per core") compares them.
        #[arg(long, default_value = "thread-per-core", env = "MESHQL_RUNTIME")]
        runtime: RuntimeKind,
        /// error, warn, info, debug or trace (or a tracing filter); the last one given wins.
        #[arg(
            long,
            default_value = "info",
            env = "MESHQL_LOG",
            overrides_with = "log_level"
        )]
        log_level: String,
        /// `text` (for people) or `json` (one JSON object per line, for log shippers).
        #[arg(
            long,
            default_value = "text",
            env = "MESHQL_LOG_FORMAT",
            overrides_with = "log_format"
        )]
        log_format: LogFormat,
        /// Do not run the config's processors here (they run in `meshql process`).
        #[arg(long)]
        no_processors: bool,
        /// What to serve of the config: `all`; `write` (REST and the change feed on the
        /// primary); or `read` (GraphQL, REST reads and the console, on the replicas).
        #[arg(long, default_value = "all", env = "MESHQL_ROLE")]
        role: meshql_config::Role,
    },
    /// Validate a config and every file it names; exit non-zero on any error.
    Check {
        #[arg(default_value = ".")]
        config: PathBuf,
        /// Also validate every entity's current documents against its JSON Schema (reads
        /// the storage: stop a service that holds SQLite files first).
        #[arg(long)]
        data: bool,
        /// With `--data`: the data directory, when it is not the config's.
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
    /// Print the JSON Schema of the config format.
    ConfigSchema,
    /// The breaking, dangerous and safe changes between two versions of a config (JSON
    /// Schemas and GraphQL SDL); exits 1 on a breaking change, for CI.
    Diff(diff::DiffArgs),
    /// Write the service's documents (with `--history`, every version) as NDJSON.
    Export(transfer::ExportArgs),
    /// Write an export's versions into the config's storage (any backend), keeping ids,
    /// times, tombstones and tokens; a second import changes nothing.
    Import(transfer::ImportArgs),
    /// Take an online backup of the service's embedded databases and change log (through
    /// the running service, or from the files when none runs).
    Backup(backup::BackupArgs),
    /// Restore a backup into a new data directory, as of its moment or an earlier one
    /// (`--at`).
    Restore(backup::RestoreArgs),
    /// The config's declared migrations (`[[entity.migration]]`), with the service stopped:
    /// where each stands (`--status`), what they would do (`--dry-run`), or run them
    /// (`serve` runs pending ones at start-up too).
    Migrate(migrate::MigrateArgs),
    /// Generate a config from an existing database's schema (`--from-postgres URL`): an
    /// entity per table, or with `--acl` a clean entity per table fed by change capture.
    Init(init::InitArgs),
    /// Print the change feed (one JSON object per line) from the config's change log.
    Changes(changes::ChangesArgs),
    /// Run the config's processors in this process, beside `meshql serve --no-processors`.
    Process(process::ProcessArgs),
    /// The replication slots behind the config's `postgres_cdc` sources (`slots`,
    /// `drop-slot SLOT`).
    Cdc(cdc::CdcArgs),
    /// Operate a running server's projections (`rebuild NAME`).
    Projections(projections::ProjectionsArgs),
    /// Load-test a server with the scenarios of the seed reports (starts a fresh meshql per
    /// scenario unless --url is given) and write JSON, Markdown and HTML reports.
    #[command(args_conflicts_with_subcommands = true)]
    Bench {
        #[command(subcommand)]
        command: Option<bench::BenchCommand>,
        #[command(flatten)]
        run: Box<bench::BenchRun>,
    },
}

/// A command whose output is read through a pipe (`meshql check --data | head -1`) ends
/// quietly when the reader closes it, as `cat` does, instead of panicking in `println!`. Not
/// for the commands that serve or load-test: they keep Rust's ignored SIGPIPE (their sockets
/// are written with `MSG_NOSIGNAL` either way).
fn end_quietly_on_a_closed_pipe() {
    // SAFETY: restoring a signal's default disposition at start-up, before any thread runs
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let color = cli.color.enabled();
    if !matches!(
        cli.command,
        Command::Serve { .. } | Command::Process(_) | Command::Bench { .. }
    ) {
        end_quietly_on_a_closed_pipe();
    }
    match cli.command {
        Command::Bench { command, run } => bench::run(command, *run),
        Command::Changes(args) => changes::run(args),
        Command::Backup(args) => backup::run_backup(args),
        Command::Diff(args) => diff::run(args),
        Command::Export(args) => transfer::run_export(args),
        Command::Import(args) => transfer::run_import(args),
        Command::Restore(args) => backup::run_restore(args),
        Command::Migrate(args) => migrate::run(args),
        Command::Init(args) => init::run(args),
        Command::Projections(args) => projections::run(args),
        Command::Cdc(args) => cdc::run(args),
        Command::Process(args) => {
            init_tracing("info", LogFormat::Text, color);
            process::run(args)
        }
        Command::ConfigSchema => {
            println!(
                "{}",
                serde_json::to_string_pretty(&registries::registries().config_json_schema())
                    .expect("JSON serialises")
            );
            ExitCode::SUCCESS
        }
        Command::Check {
            config,
            data,
            data_dir,
        } => match meshql_config::load(&config) {
            Ok(mut c) => {
                if let Some(d) = data_dir {
                    c.set_data_dir(d);
                }
                for w in &c.warnings {
                    eprintln!("warning: {w}");
                }
                for w in cdc::orphan_slot_warnings(&c) {
                    eprintln!("warning: {w}");
                }
                let mut problems = meshql_server::preflight(&c, registries::registries());
                if problems.is_empty() {
                    problems.extend(cdc::legacy_column_errors(&c));
                }
                if !problems.is_empty() {
                    for p in &problems {
                        eprintln!("{p}");
                    }
                    eprintln!("{} error(s)", problems.len());
                    return ExitCode::FAILURE;
                }
                let resolvers: usize = c
                    .entities
                    .iter()
                    .filter_map(|e| e.graph.as_ref())
                    .map(|g| g.resolvers.len())
                    .sum();
                println!(
                    "{}: ok ({} entities, {} resolvers, port {})",
                    c.file.display(),
                    c.entities.len(),
                    resolvers,
                    c.port
                );
                if data {
                    return check_data::run(&c);
                }
                ExitCode::SUCCESS
            }
            Err(errors) => {
                eprintln!("{errors}");
                eprintln!("{} error(s)", errors.0.len());
                ExitCode::FAILURE
            }
        },
        Command::Serve {
            config,
            port,
            host,
            data_dir,
            workers,
            log_level,
            log_format,
            no_processors,
            role,
            runtime: runtime_kind,
        } => {
            let started = Instant::now();
            init_tracing(&log_level, log_format, color);
            let mut resolved = match meshql_config::load(&config) {
                Ok(c) => c,
                Err(errors) => {
                    eprintln!("{errors}");
                    return ExitCode::FAILURE;
                }
            };
            let moved = match port {
                Some(p) => resolved.serve_on(p),
                None => Vec::new(),
            };
            if let Some(first) = moved.first() {
                tracing::info!(
                    "served on port {} instead of the config's: {} relationship URL(s) that name this service follow it (e.g. `{}`: {} is now {}); set the variable behind them (PLATFORM_URL in examples/farm) to reach another process",
                    resolved.port,
                    moved.len(),
                    first.relationship,
                    first.from,
                    first.to
                );
            }
            if let Some(h) = host {
                resolved.host = h;
            }
            if let Some(d) = data_dir {
                resolved.set_data_dir(d);
            }
            if no_processors {
                resolved.processors.clear();
            }
            resolved.set_role(role);
            let mut runtime = tokio::runtime::Builder::new_multi_thread();
            runtime.enable_all();
            match runtime_kind {
                RuntimeKind::ThreadPerCore => {
                    // connections are served by threads of their own (meshql_server's
                    // listener); this runtime keeps the background work
                    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                    resolved.server.serve_threads = workers.unwrap_or(cores).max(1);
                    runtime.worker_threads(1);
                }
                RuntimeKind::WorkStealing => {
                    if let Some(w) = workers {
                        runtime.worker_threads(w.max(1));
                    }
                }
            }
            let runtime = match runtime.build() {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(serve(resolved, started)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("meshql: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn init_tracing(level: &str, format: LogFormat, color: bool) {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // a line when each enabled span closes, with its busy and idle time: at `debug`, the
    // `request` span and the `graphql_plan`, `graphql_execute` and `storage` spans inside it
    // are the per-stage timings of every request
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .with_target(false)
        .with_ansi(color && format == LogFormat::Text);
    match format {
        LogFormat::Text => builder.init(),
        // one object per line: time, level, message, fields, and the spans it happened in
        // (`request` with method and route at debug level)
        LogFormat::Json => builder.json().with_current_span(true).init(),
    }
}

async fn serve(config: meshql_config::ResolvedConfig, started: Instant) -> anyhow::Result<()> {
    for w in &config.warnings {
        tracing::warn!("{w}");
    }
    let app = meshql_server::build(&config, registries::registries()).await?;
    let address = format!("{}:{}", config.host, config.port);
    let listener = meshql_server::bind(&address, config.server.listen_backlog)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {address}: {e}"))?;
    let local = listener.local_addr()?;
    tracing::info!(
        "meshql serving {} entities from {} on {}://{} (data in {}), ready in {} ms",
        config.entities.len(),
        config.file.display(),
        if config.server.tls.is_some() {
            "https"
        } else {
            "http"
        },
        local,
        config.data_dir.display(),
        started.elapsed().as_millis()
    );
    tokio::spawn(return_freed_memory());
    #[cfg(target_os = "linux")]
    if std::env::var_os("MESHQL_KEEP_STARTUP_PAGES").is_none() {
        let released = startup_pages::release();
        tracing::debug!(released, "start-up pages released");
    }
    meshql_server::serve(
        app,
        listener,
        &config.server,
        meshql_runtime::shutdown_signal(),
    )
    .await?;
    Ok(())
}

/// mimalloc's `arena_eager_commit` (on by default where the OS overcommits) commits each
/// arena as a whole; measured on egg-economy under 10 clients of REST GET then POST, turning
/// it off took the server's resident set from 33 to 24 MiB idle and its peak from 40–43 to
/// 28 MiB (anonymous memory 23 → 10 MiB) with the same throughput, pages being committed as
/// they are used instead (docs/BENCHMARKS.md, "Footprint"). The first arena is reserved by the first allocation, which the Rust runtime
/// makes before `main`, so the option is set from an ELF constructor that runs before both
/// (a prioritised `.init_array` entry runs before the default-priority ones).
/// `MIMALLOC_ARENA_EAGER_COMMIT` in the environment still decides when it is set.
#[cfg(target_os = "linux")]
#[used]
#[link_section = ".init_array.00200"]
static COMMIT_MEMORY_LAZILY: extern "C" fn() = commit_memory_lazily;

#[cfg(target_os = "linux")]
extern "C" fn commit_memory_lazily() {
    /// `mi_option_arena_eager_commit` in mimalloc's option enum (not exported by the binding).
    const ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;
    extern "C" {
        fn getenv(name: *const std::ffi::c_char) -> *mut std::ffi::c_char;
    }
    // nothing here may allocate (that would reserve the arena): libc's getenv, not std's
    // SAFETY: getenv reads the environment with a NUL-terminated name; mi_option_set sets a
    // plain value; no other thread exists yet
    unsafe {
        if getenv(c"MIMALLOC_ARENA_EAGER_COMMIT".as_ptr()).is_null() {
            libmimalloc_sys::mi_option_set(ARENA_EAGER_COMMIT, 0);
        }
    }
}

/// mimalloc hands memory freed in bulk (say, by thousands of connections closing) back to the
/// OS only when a later allocation or collection finds the purge delay (1 s) passed; an idle
/// server may never get there and keeps its peak resident set. A collection every second
/// purges what is due, for every thread (the arenas are shared); it costs microseconds.
async fn return_freed_memory() {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // SAFETY: mi_collect only releases memory the allocator itself holds free
        unsafe { libmimalloc_sys::mi_collect(false) };
    }
}
