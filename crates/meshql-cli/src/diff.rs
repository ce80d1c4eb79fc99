//! `meshql diff OLD NEW`: the breaking, dangerous and safe changes between two versions of a
//! service's config — each entity's JSON Schema and GraphQL SDL (`meshql-diff` classifies
//! them; docs/SCHEMA-EVOLUTION.md lists the rules). Exits 1 when a change is breaking (or
//! dangerous, with `--fail-on dangerous`), for CI.

use clap::{Args, ValueEnum};
use meshql_diff::{diff_service, EntitySchemas, Level};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct DiffArgs {
    /// The config as it is (file or directory).
    old: PathBuf,
    /// The config as it will be.
    new: PathBuf,
    /// `text` (for people) or `json` (for tools).
    #[arg(long, default_value = "text")]
    format: Format,
    /// The least severe change that fails the command.
    #[arg(long, default_value = "breaking")]
    fail_on: FailOn,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
enum FailOn {
    Breaking,
    Dangerous,
}

/// Each entity's schemas as a loaded config declares them.
fn schemas(path: &std::path::Path) -> Result<Vec<EntitySchemas>, String> {
    let config = meshql_config::load(path).map_err(|e| e.to_string())?;
    config
        .entities
        .iter()
        .map(|e| {
            let sdl = match &e.graph {
                Some(g) => Some(
                    std::fs::read_to_string(&g.sdl_file)
                        .map_err(|err| format!("{}: {err}", g.sdl_file.display()))?,
                ),
                None => None,
            };
            Ok(EntitySchemas {
                name: e.name.clone(),
                json_schema: e.rest.as_ref().and_then(|r| r.schema.clone()),
                sdl,
            })
        })
        .collect()
}

pub fn run(args: DiffArgs) -> ExitCode {
    let loaded = schemas(&args.old).and_then(|old| Ok((old, schemas(&args.new)?)));
    let report = loaded.and_then(|(old, new)| diff_service(&old, &new).map_err(|e| e.to_string()));
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            eprintln!("meshql diff: {e}");
            return ExitCode::from(2);
        }
    };
    match args.format {
        Format::Text => print!("{}", report.to_text()),
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&report.to_json()).expect("JSON serialises")
        ),
    }
    let threshold = match args.fail_on {
        FailOn::Breaking => Level::Breaking,
        FailOn::Dangerous => Level::Dangerous,
    };
    if report.worst().is_some_and(|w| w >= threshold) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
