//! `meshql process`: a config's processors on their own, beside `meshql serve` of the same
//! config on this machine (started with `--no-processors`, so that each processor runs once).
//! The processors read the server's change log as a reader in another process and write to
//! the config's storage directly; SQLite files must then be shared (`exclusive = false` in
//! their storage block). Runs until SIGINT or SIGTERM, then lets each processor finish what
//! the log holds (bounded) and exits.

use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Args)]
pub struct ProcessArgs {
    /// Config file or directory.
    #[arg(default_value = ".")]
    config: PathBuf,
    /// Run only this processor.
    #[arg(long)]
    only: Option<String>,
    /// The config's data directory, when the server was started with --data-dir.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Seconds between the status lines (each processor's position, lag and dead letters).
    #[arg(long, default_value_t = 10)]
    status_every: u64,
}

pub fn run(args: ProcessArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("meshql process: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(process(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("meshql process: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn process(args: ProcessArgs) -> Result<(), String> {
    let mut config = meshql_config::load(&args.config).map_err(|e| e.to_string())?;
    if let Some(d) = args.data_dir {
        config.set_data_dir(d);
    }
    let host = meshql_runtime::host_processors(&config, crate::registries::registries(), args.only)
        .await
        .map_err(|e| e.to_string())?;
    let names: Vec<String> = host.stats().into_iter().map(|s| s.name).collect();
    tracing::info!(processors = ?names, "processing; SIGINT or SIGTERM stops");
    let shutdown = meshql_runtime::shutdown_signal();
    tokio::pin!(shutdown);
    let every = Duration::from_secs(args.status_every.max(1));
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep(every) => {
                for s in host.stats() {
                    tracing::info!(
                        processor = %s.name, position = s.position, lag = s.lag,
                        lag_seconds = s.lag_seconds, processed = s.processed,
                        dead_letters = s.dead_letters, errors = s.errors, "status"
                    );
                }
            }
        }
    }
    host.stop().await;
    Ok(())
}
