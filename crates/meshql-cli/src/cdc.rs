//! `meshql cdc`: the replication slots behind a config's `postgres_cdc` sources. A slot keeps
//! the legacy database's WAL until its consumer confirms it, so an abandoned one grows without
//! bound: `slots` lists each slot of the config's legacy databases with what it keeps and
//! which processor reads it; `drop-slot` drops one (a processor whose slot is dropped takes a
//! new snapshot when it starts again).

use clap::{Args, Subcommand};
use meshql_process::pgcdc::{self, PostgresCdcSource, SlotInfo};
use meshql_process::ProcessorPlan;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Args)]
pub struct CdcArgs {
    #[command(subcommand)]
    command: CdcCommand,
}

#[derive(Subcommand)]
enum CdcCommand {
    /// List the logical replication slots of the config's legacy databases.
    Slots {
        /// Config file or directory.
        #[arg(default_value = ".")]
        config: PathBuf,
    },
    /// Drop a replication slot of one of the config's legacy databases.
    DropSlot {
        /// The slot's name.
        slot: String,
        /// Config file or directory.
        #[arg(default_value = ".")]
        config: PathBuf,
        /// Drop it even though a processor of the config reads it (it takes a new snapshot).
        #[arg(long)]
        force: bool,
    },
}

/// How long listing one database's slots may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(10);

/// The config's `postgres_cdc` sources by database URL: (processor, source) pairs.
fn sources(config: &Path) -> Result<BTreeMap<String, Vec<(String, PostgresCdcSource)>>, String> {
    let resolved = meshql_config::load(config).map_err(|e| e.to_string())?;
    let plans = meshql_runtime::processor_plans(&resolved)
        .map_err(|errors| meshql_config::ConfigErrors(errors).to_string())?;
    let mut by_url: BTreeMap<String, Vec<(String, PostgresCdcSource)>> = BTreeMap::new();
    for plan in &plans {
        if let Some(s) = plan.source().and_then(|s| pgcdc::of(s.as_ref())) {
            by_url
                .entry(s.url.clone())
                .or_default()
                .push((plan.name().to_owned(), s.clone()));
        }
    }
    Ok(by_url)
}

async fn list(url: &str) -> Result<Vec<SlotInfo>, String> {
    tokio::time::timeout(LIST_TIMEOUT, pgcdc::slots(url))
        .await
        .map_err(|_| format!("no answer within {} s", LIST_TIMEOUT.as_secs()))?
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
}

pub fn run(args: CdcArgs) -> ExitCode {
    let outcome = runtime().and_then(|rt| {
        rt.block_on(async {
            match args.command {
                CdcCommand::Slots { config } => print_slots(&config).await,
                CdcCommand::DropSlot {
                    slot,
                    config,
                    force,
                } => drop_slot(&config, &slot, force).await,
            }
        })
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("meshql cdc: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn print_slots(config: &Path) -> Result<(), String> {
    let by_url = sources(config)?;
    if by_url.is_empty() {
        println!("no postgres_cdc source in this config");
        return Ok(());
    }
    let mut failed = false;
    for (url, readers) in &by_url {
        println!("{}", pgcdc::redacted_url(url));
        match list(url).await {
            Ok(slots) if slots.is_empty() => println!("  no logical replication slot"),
            Ok(slots) => {
                for s in slots {
                    let reader = readers
                        .iter()
                        .find(|(_, src)| src.slot == s.name)
                        .map(|(p, _)| format!("processor {p}"))
                        .unwrap_or_else(|| "no processor of this config".into());
                    println!(
                        "  {:<40} {:<8} keeps {:>12} B, {:>12} B unconfirmed  ({reader})",
                        s.name,
                        if s.active { "active" } else { "inactive" },
                        s.retained_bytes,
                        s.lag_bytes
                    );
                }
            }
            Err(e) => {
                failed = true;
                println!("  cannot list its slots: {e}");
            }
        }
    }
    if failed {
        Err("some databases could not be listed".into())
    } else {
        Ok(())
    }
}

async fn drop_slot(config: &Path, slot: &str, force: bool) -> Result<(), String> {
    let by_url = sources(config)?;
    for (url, readers) in &by_url {
        let Ok(slots) = list(url).await else { continue };
        if !slots.iter().any(|s| s.name == slot) {
            continue;
        }
        if let Some((processor, _)) = readers.iter().find(|(_, s)| s.slot == slot) {
            if !force {
                return Err(format!(
                    "processor {processor} reads slot {slot}: stop it first, and pass --force \
                     to drop the slot anyway (the processor then takes a new snapshot)"
                ));
            }
        }
        pgcdc::drop_slot(url, slot).await?;
        println!("dropped slot {slot} of {}", pgcdc::redacted_url(url));
        return Ok(());
    }
    Err(format!(
        "no slot {slot} in the config's legacy databases (`meshql cdc slots` lists them)"
    ))
}

/// Warnings for `meshql check`: slots of meshql's (`meshql_…`) in the config's legacy
/// databases that no processor of the config reads, and databases that cannot be asked.
pub fn orphan_slot_warnings(config: &meshql_config::ResolvedConfig) -> Vec<String> {
    let Ok(plans) = meshql_runtime::processor_plans(config) else {
        return Vec::new(); // preflight reports the errors
    };
    let mut by_url: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for plan in &plans {
        if let Some(s) = plan.source().and_then(|s| pgcdc::of(s.as_ref())) {
            by_url
                .entry(s.url.clone())
                .or_default()
                .push(s.slot.clone());
        }
    }
    if by_url.is_empty() {
        return Vec::new();
    }
    let Ok(rt) = runtime() else {
        return Vec::new();
    };
    rt.block_on(async {
        let mut warnings = Vec::new();
        for (url, used) in &by_url {
            match list(url).await {
                Ok(slots) => {
                    for s in slots {
                        if s.name.starts_with("meshql_") && !used.contains(&s.name) {
                            warnings.push(format!(
                                "replication slot {} of {} has no processor in this config: it \
                                 keeps {} bytes of WAL and grows; drop it with `meshql cdc \
                                 drop-slot {} CONFIG` if nothing else reads it",
                                s.name,
                                pgcdc::redacted_url(url),
                                s.retained_bytes,
                                s.name
                            ));
                        }
                    }
                }
                Err(e) => warnings.push(format!(
                    "cannot list the replication slots of {}: {e}",
                    pgcdc::redacted_url(url)
                )),
            }
        }
        warnings
    })
}

/// Errors for `meshql check`: a column a `mapping` names that its legacy table does not have
/// (or a table that does not exist), asked of each legacy database that can be reached (one
/// that cannot is already a warning of [`orphan_slot_warnings`]).
pub fn legacy_column_errors(config: &meshql_config::ResolvedConfig) -> Vec<String> {
    let Ok(plans) = meshql_runtime::processor_plans(config) else {
        return Vec::new(); // preflight reports the errors
    };
    let mut asks = Vec::new();
    for plan in &plans {
        let (Some(source), ProcessorPlan::Transform(t)) =
            (plan.source().and_then(|s| pgcdc::of(s.as_ref())), plan)
        else {
            continue;
        };
        let Some((table, named)) = t.transform.legacy_columns() else {
            continue;
        };
        let Some(spec) = config.processors.iter().find(|s| s.name == plan.name()) else {
            continue;
        };
        let Some(table) = source
            .tables
            .iter()
            .find(|tb| source.entity_of(tb).eq_ignore_ascii_case(&table))
            .cloned()
        else {
            continue; // the mapping's own checks name a table that is not an input
        };
        asks.push((source.clone(), spec, table, named));
    }
    if asks.is_empty() {
        return Vec::new();
    }
    let Ok(rt) = runtime() else {
        return Vec::new();
    };
    rt.block_on(async {
        let mut errors = Vec::new();
        for (source, spec, table, named) in asks {
            let Ok(found) = pgcdc::columns(&source.url, std::slice::from_ref(&table)).await else {
                continue;
            };
            let error = |field: &str, message: String| {
                meshql_config::ConfigError {
                    file: config.file.clone(),
                    line: spec.line_of(Some(field)),
                    field: format!("{}.{field}", spec.path),
                    message,
                }
                .to_string()
            };
            let Some(columns) = found.get(&table) else {
                errors.push(error(
                    "mapping.table",
                    format!(
                        "table `{}` does not exist in {}",
                        table.label(),
                        pgcdc::redacted_url(&source.url)
                    ),
                ));
                continue;
            };
            for (field, column) in named {
                if !columns.iter().any(|c| c.eq_ignore_ascii_case(&column)) {
                    errors.push(error(
                        &field,
                        format!(
                            "table `{}` has no column `{column}` (it has: {})",
                            table.label(),
                            columns.join(", ")
                        ),
                    ));
                }
            }
        }
        errors
    })
}
