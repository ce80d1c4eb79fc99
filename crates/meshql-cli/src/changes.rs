//! `meshql changes`: prints a service's change feed as JSON lines, read from its change log
//! on this machine (the serving process need not be stopped: the log is read, never locked).

use clap::Args;
use meshql_changes::feed::read_page;
use meshql_changes::FeedFilter;
use meshql_log::LogReader;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Args)]
pub struct ChangesArgs {
    /// Config file or directory (its data directory holds the change log).
    #[arg(default_value = ".")]
    config: PathBuf,
    /// Start after this position (`now`: after the newest change). Default: the beginning,
    /// or the group's committed position with --group.
    #[arg(long)]
    since: Option<String>,
    /// Keep printing changes as they arrive, until interrupted.
    #[arg(long)]
    follow: bool,
    /// Only these entities (comma-separated).
    #[arg(long, value_delimiter = ',')]
    entity: Vec<String>,
    /// Stop after this many changes.
    #[arg(long)]
    limit: Option<usize>,
    /// The config's data directory, when the server was started with --data-dir.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Consumer group: start after its committed position and commit what was printed.
    #[arg(long)]
    group: Option<String>,
}

pub fn run(args: ChangesArgs) -> ExitCode {
    match print_changes(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("meshql changes: {message}");
            ExitCode::FAILURE
        }
    }
}

fn print_changes(args: ChangesArgs) -> Result<(), String> {
    let mut config = meshql_config::load(&args.config).map_err(|e| e.to_string())?;
    if let Some(d) = args.data_dir {
        config.set_data_dir(d);
    }
    if !config.changes.config.enabled {
        return Err(format!(
            "{}: the change feed is off ([changes] enabled = false)",
            config.file.display()
        ));
    }
    let dir = &config.changes.dir;
    if !dir.is_dir() {
        return Err(format!(
            "no change log at {} (it is created when `meshql serve` runs with this config)",
            dir.display()
        ));
    }
    let log = LogReader::open(dir).map_err(|e| e.to_string())?;
    if let Some(unknown) = args
        .entity
        .iter()
        .find(|e| !config.entities.iter().any(|x| x.name == **e))
    {
        return Err(format!("unknown entity `{unknown}`"));
    }
    let filter = if args.entity.is_empty() {
        FeedFilter::everything()
    } else {
        FeedFilter::everything().only(&args.entity)
    };
    let committed = match &args.group {
        Some(g) => log.committed(g).map_err(|e| e.to_string())?,
        None => None,
    };
    let mut position = match args.since.as_deref() {
        Some("now") => log.last_offset().map_err(|e| e.to_string())?,
        Some(p) => p
            .parse()
            .map_err(|_| format!("--since must be a position or `now`, not `{p}`"))?,
        None => committed.unwrap_or(0),
    };
    let mut left = args.limit.unwrap_or(usize::MAX);
    let stdout = std::io::stdout();
    loop {
        let page = read_page(&log, position, left.min(1000), &filter).map_err(|e| e.to_string())?;
        {
            let mut out = stdout.lock();
            for (_, change) in &page.changes {
                out.write_all(change)
                    .and_then(|()| out.write_all(b"\n"))
                    .map_err(|e| e.to_string())?;
            }
            out.flush().map_err(|e| e.to_string())?;
        }
        left -= page.changes.len();
        let moved = page.last > position;
        position = page.last;
        if let (Some(g), true) = (&args.group, moved) {
            log.commit(g, position).map_err(|e| e.to_string())?;
        }
        if left == 0 {
            return Ok(());
        }
        if !moved {
            if !args.follow {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
