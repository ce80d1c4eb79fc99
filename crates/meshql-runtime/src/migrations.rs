//! `[[entity.migration]]`: each entry checked by `meshql_process::migration` against its
//! entity's JSON Schema (errors name the file, the field's line and the field), and the
//! pending ones run at start-up, before anything is served: by a process that writes the
//! entity; a process that only reads it (`--role read`) waits until they are recorded.

use crate::error::BuildError;
use meshql_config::{ConfigError, ResolvedConfig, ResolvedEntity};
use meshql_core::DynStore;
use meshql_engine::PayloadValidator;
use meshql_process::migration::{self, Migration, State};
use meshql_process::EntityInfo;
use std::time::{Duration, Instant};

/// Checks every entity's migrations: `(entity, its migrations in order)` for the entities
/// that declare any, or every problem, naming the file, line and field.
pub fn configure(
    config: &ResolvedConfig,
) -> Result<Vec<(String, Vec<Migration>)>, Vec<ConfigError>> {
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for entity in config.entities.iter().filter(|e| !e.migrations.is_empty()) {
        let info = entity_info(entity);
        let mut migrations = Vec::new();
        for spec in &entity.migrations {
            match Migration::compile(&spec.name, &spec.settings, &info) {
                Ok(m) => migrations.push(m),
                Err(e) => problems.push(ConfigError {
                    file: config.file.clone(),
                    line: spec.line_of(e.field.as_deref()),
                    field: match e.field {
                        Some(field) => format!("{}.{field}", spec.path),
                        None => spec.path.clone(),
                    },
                    message: e.message,
                }),
            }
        }
        out.push((entity.name.clone(), migrations));
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

fn schema(entity: &ResolvedEntity) -> Option<&serde_json::Value> {
    entity.rest.as_ref().and_then(|r| r.schema.as_ref())
}

fn entity_info(entity: &ResolvedEntity) -> EntityInfo {
    EntityInfo {
        name: entity.name.clone(),
        fields: EntityInfo::fields_of(schema(entity)),
        properties: EntityInfo::properties_of(schema(entity)),
        required: EntityInfo::required_of(schema(entity)),
    }
}

/// The entity's JSON Schema, compiled (what the migrations' results are validated against).
pub fn validator(entity: &ResolvedEntity) -> Result<Option<PayloadValidator>, BuildError> {
    schema(entity)
        .map(|s| {
            PayloadValidator::new(s).map_err(|e| BuildError::Schema {
                entity: entity.name.clone(),
                file: entity
                    .rest
                    .as_ref()
                    .and_then(|r| r.schema_file.as_ref())
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                message: e.0,
            })
        })
        .transpose()
}

/// How often a long run says how far it got.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);
/// How often a reading process looks whether the writer's run has finished.
const WAIT_POLL: Duration = Duration::from_millis(500);

/// Runs the pending migrations of every entity (`writes`: this process writes them), or,
/// in a process that only reads, waits until they are all recorded as applied.
pub async fn at_start(
    config: &ResolvedConfig,
    store_of: impl Fn(&str) -> DynStore,
    writes: bool,
) -> Result<(), BuildError> {
    let declared = configure(config)
        .map_err(|errors| BuildError::Preflight(errors.iter().map(|e| e.to_string()).collect()))?;
    for (name, migrations) in &declared {
        let entity = config
            .entities
            .iter()
            .find(|e| e.name == *name)
            .expect("configured from the config's entities");
        let store = store_of(name);
        if writes {
            run(name, &store, migrations, validator(entity)?.as_ref()).await?;
        } else {
            wait(name, &store, migrations).await?;
        }
    }
    Ok(())
}

async fn run(
    entity: &str,
    store: &DynStore,
    migrations: &[Migration],
    validator: Option<&PayloadValidator>,
) -> Result<(), BuildError> {
    let started = Instant::now();
    let mut said = Instant::now();
    let report = migration::run(entity, store, migrations, validator, &mut |p| {
        tracing::debug!(
            entity = p.entity,
            read = p.read,
            migrated = p.migrated,
            "migration batch committed"
        );
        if said.elapsed() >= PROGRESS_EVERY {
            said = Instant::now();
            tracing::info!(
                entity = p.entity,
                migrations = %p.migrations.join(", "),
                read = p.read,
                migrated = p.migrated,
                "migrating: not serving until it is done"
            );
        }
    })
    .await?;
    if !report.applied.is_empty() {
        tracing::info!(
            entity,
            migrations = %report.applied.join(", "),
            migrated = report.migrated,
            unchanged = report.unchanged,
            resumed = report.resumed,
            ms = started.elapsed().as_millis() as u64,
            "migrations applied"
        );
    }
    Ok(())
}

async fn wait(entity: &str, store: &DynStore, migrations: &[Migration]) -> Result<(), BuildError> {
    let mut said: Option<Instant> = None;
    loop {
        let states = migration::status(entity, store, migrations).await?;
        let pending: Vec<&str> = states
            .iter()
            .filter(|(_, s)| !matches!(s, State::Applied(_)))
            .map(|(n, _)| n.as_str())
            .collect();
        if pending.is_empty() {
            return Ok(());
        }
        if said.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY * 5) {
            said = Some(Instant::now());
            tracing::warn!(
                entity,
                migrations = %pending.join(", "),
                "waiting for the process that writes this entity to apply its migrations before serving it"
            );
        }
        tokio::time::sleep(WAIT_POLL).await;
    }
}
