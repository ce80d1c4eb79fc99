//! `meshql migrate CONFIG [--dry-run]`: the config's declared migrations (`[[entity.migration]]`)
//! from the command line, with the service stopped — where each stands, what the pending
//! ones would do to a sample of documents (`--dry-run`: a diff per document, and how many
//! would fail), or the run itself. `meshql serve` runs the pending ones at start-up anyway;
//! this is for seeing them first, and for running a long one outside a deploy.

use crate::transfer::{load, runtime, Opened};
use clap::Args;
use meshql_process::migration::{self, DryRun, State};
use serde_json::{Map, Value};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct MigrateArgs {
    /// Config file or directory of the service.
    #[arg(default_value = ".")]
    config: PathBuf,
    /// The service's data directory, when it is not the config's.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Only these entities (repeat, or separate with commas). Default: all that declare
    /// migrations.
    #[arg(long, value_delimiter = ',')]
    entity: Vec<String>,
    /// Write nothing: print what the pending migrations would do to a sample of documents,
    /// and how many documents they would fail on.
    #[arg(long)]
    dry_run: bool,
    /// Documents shown per entity by a dry run.
    #[arg(long, default_value_t = 3)]
    sample: usize,
    /// Only print where each migration stands.
    #[arg(long, conflicts_with = "dry_run")]
    status: bool,
}

pub fn run(args: MigrateArgs) -> ExitCode {
    match migrate(&args) {
        Ok(true) => ExitCode::SUCCESS,
        // a dry run that found documents the migrations fail on
        Ok(false) => ExitCode::from(3),
        Err(e) => {
            eprintln!("meshql migrate: {e}");
            ExitCode::FAILURE
        }
    }
}

fn migrate(args: &MigrateArgs) -> Result<bool, String> {
    let config = load(&args.config, &args.data_dir)?;
    let declared = meshql_runtime::migrations::configure(&config)
        .map_err(|errors| meshql_config::ConfigErrors(errors).to_string())?;
    for e in &args.entity {
        if !declared.iter().any(|(name, _)| name == e) {
            return Err(format!(
                "{} declares no migration of an entity \"{e}\"",
                config.file.display()
            ));
        }
    }
    let chosen: Vec<_> = declared
        .iter()
        .filter(|(name, _)| args.entity.is_empty() || args.entity.contains(name))
        .collect();
    if chosen.is_empty() {
        println!("{} declares no migration", config.file.display());
        return Ok(true);
    }
    runtime()?.block_on(async {
        let opened = Opened::open(&config).await?;
        let mut clean = true;
        let mut result = Ok(());
        for (name, migrations) in chosen {
            let entity = config
                .entities
                .iter()
                .find(|e| e.name == *name)
                .expect("an entity of the config");
            let store = opened.store(name);
            let step = async {
                print_status(
                    name,
                    &migration::status(name, store, migrations)
                        .await
                        .map_err(|e| e.to_string())?,
                );
                if args.status {
                    return Ok(());
                }
                let validator =
                    meshql_runtime::migrations::validator(entity).map_err(|e| e.to_string())?;
                if args.dry_run {
                    let dry = migration::dry_run(
                        name,
                        store,
                        migrations,
                        validator.as_ref(),
                        args.sample,
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                    clean &= print_dry_run(name, &dry);
                    return Ok(());
                }
                let started = Instant::now();
                let mut said = Instant::now();
                let report =
                    migration::run(name, store, migrations, validator.as_ref(), &mut |p| {
                        if said.elapsed() >= Duration::from_secs(2) {
                            said = Instant::now();
                            eprintln!(
                                "  {}: {} read, {} migrated",
                                p.migrations.join(", "),
                                p.read,
                                p.migrated
                            );
                        }
                    })
                    .await
                    .map_err(|e| e.to_string())?;
                if report.applied.is_empty() {
                    println!("  nothing to do");
                } else {
                    println!(
                        "  applied {}: {} documents migrated, {} left as they were{} in {:.1} s",
                        report.applied.join(", "),
                        report.migrated,
                        report.unchanged,
                        if report.resumed {
                            " (an interrupted run resumed)"
                        } else {
                            ""
                        },
                        started.elapsed().as_secs_f64()
                    );
                }
                Ok::<(), String>(())
            };
            if let Err(e) = step.await {
                result = Err(e);
                break;
            }
        }
        opened.close().await;
        result.map(|()| clean)
    })
}

fn print_status(entity: &str, states: &[(String, State)]) {
    println!("{entity}:");
    for (name, state) in states {
        match state {
            State::Applied(a) => println!(
                "  applied  {name}  at {} ({} documents)",
                meshql_runtime::backup::rfc3339(a.finished_at),
                a.documents
            ),
            State::Running {
                started_at,
                migrated,
            } => println!(
                "  running  {name}  since {}, {migrated} documents so far (interrupted: it \
                 resumes at the next start)",
                meshql_runtime::backup::rfc3339(*started_at)
            ),
            State::Pending => println!("  pending  {name}"),
        }
    }
}

/// Prints a dry run; `false` when documents would fail.
fn print_dry_run(entity: &str, dry: &DryRun) -> bool {
    if dry.pending.is_empty() {
        println!("  nothing pending");
        return true;
    }
    println!(
        "  dry run of {}: {} documents read, {} would get a new version",
        dry.pending.join(", "),
        dry.read,
        dry.changed
    );
    for changed in &dry.sample {
        println!("  {entity} {}", changed.id);
        for line in diff(&changed.before, &changed.after) {
            println!("    {line}");
        }
    }
    if dry.failing == 0 && dry.invalid == 0 {
        return true;
    }
    println!(
        "  {} documents cannot be migrated and {} would fail the JSON Schema; the run would \
         refuse to start: {}",
        dry.failing,
        dry.invalid,
        dry.problems()
    );
    false
}

/// The fields that differ: `- field: old`, `+ field: new`, `~ field: old → new`.
fn diff(before: &Map<String, Value>, after: &Map<String, Value>) -> Vec<String> {
    let mut keys: Vec<&String> = before.keys().chain(after.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter_map(|k| match (before.get(k), after.get(k)) {
            (Some(a), Some(b)) if a == b => None,
            (Some(a), Some(b)) => Some(format!("~ {k}: {a} → {b}")),
            (Some(a), None) => Some(format!("- {k}: {a}")),
            (None, Some(b)) => Some(format!("+ {k}: {b}")),
            (None, None) => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::diff;
    use serde_json::json;

    #[test]
    fn a_diff_lists_removed_added_and_changed_fields_in_name_order() {
        let before = json!({ "id": "1", "name": "A", "eggs": "3" });
        let after = json!({ "id": "1", "title": "A", "eggs": 3 });
        assert_eq!(
            diff(before.as_object().unwrap(), after.as_object().unwrap()),
            vec!["~ eggs: \"3\" → 3", "- name: \"A\"", "+ title: \"A\""]
        );
    }
}
