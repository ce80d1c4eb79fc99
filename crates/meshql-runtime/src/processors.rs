//! `[[processor]]`: each entry's fields checked by `meshql_process` against the service's
//! entities (errors name the file, the field's line and the field), and the processors
//! started on the hub's log, writing through the engine's entity services.

use crate::error::BuildError;
use meshql_config::{ConfigError, ResolvedConfig};
use meshql_engine::EntityService;
use meshql_process::{EntityInfo, ProcessorPlan, ProcessorStats, Processors, StartOptions};
use std::collections::HashMap;
use std::sync::Arc;

/// The entities as processors see them: names and JSON Schema fields.
fn entities(config: &ResolvedConfig) -> Vec<EntityInfo> {
    config
        .entities
        .iter()
        .map(|e| EntityInfo {
            name: e.name.clone(),
            fields: EntityInfo::fields_of(e.rest.as_ref().and_then(|r| r.schema.as_ref())),
            properties: EntityInfo::properties_of(e.rest.as_ref().and_then(|r| r.schema.as_ref())),
            required: EntityInfo::required_of(e.rest.as_ref().and_then(|r| r.schema.as_ref())),
        })
        .collect()
}

/// Checks every processor; or every problem, naming the file, line and field.
pub fn configure(config: &ResolvedConfig) -> Result<Vec<ProcessorPlan>, Vec<ConfigError>> {
    let entities = entities(config);
    let mut plans = Vec::new();
    let mut problems = Vec::new();
    let error = |spec: &meshql_config::ProcessorSpec, e: meshql_core::SettingError| ConfigError {
        file: config.file.clone(),
        line: spec.line_of(e.field.as_deref()),
        field: match e.field {
            Some(field) => format!("{}.{field}", spec.path),
            None => spec.path.clone(),
        },
        message: e.message,
    };
    for spec in &config.processors {
        let base = config.file.parent().unwrap_or(std::path::Path::new("."));
        match meshql_process::configure(&spec.name, &spec.kind, &spec.settings, &entities, base) {
            Ok(plan) => plans.push(plan),
            Err(e) => problems.push(error(spec, e)),
        }
    }
    if problems.is_empty() {
        if let Err((i, e)) = meshql_process::check_plans(&plans) {
            let spec = config
                .processors
                .iter()
                .find(|s| s.name == plans[i].name())
                .expect("every plan has its entry");
            problems.push(error(spec, e));
        }
    }
    if problems.is_empty() {
        Ok(plans)
    } else {
        Err(problems)
    }
}

/// Starts every enabled processor of the config on `log`.
pub async fn start(
    config: &ResolvedConfig,
    log: Arc<dyn meshql_changes::ConsumerLog>,
    services: &HashMap<String, Arc<EntityService>>,
    mut options: StartOptions,
) -> Result<Processors, BuildError> {
    let plans = configure(config)
        .map_err(|errors| BuildError::Preflight(errors.iter().map(|e| e.to_string()).collect()))?;
    options.lock_dir = Some(config.changes.dir.join("processors"));
    meshql_process::start(&plans, services, log, options)
        .await
        .map_err(|e| BuildError::Changes {
            dir: config.changes.dir.display().to_string(),
            message: e.to_string(),
        })
}

/// Processors running on their own (`meshql process`), beside a server that serves the same
/// config on this machine: they read its change log as a reader in another process and write
/// their outputs to the config's storage directly.
pub struct ProcessorHost {
    processors: Arc<Processors>,
    databases: Vec<meshql_core::DynDatabase>,
}

impl ProcessorHost {
    pub fn stats(&self) -> Vec<ProcessorStats> {
        self.processors.stats()
    }

    /// Stops every processor (after it applied what the log holds, bounded) and closes the
    /// storage it opened.
    pub async fn stop(&self) {
        self.processors.stop().await;
        for db in &self.databases {
            db.close().await;
        }
    }
}

/// Starts the config's processors (or only `only`) in this process: opens the storage of
/// their output and lookup entities, and reads the log under the config's data directory.
pub async fn host(
    config: &ResolvedConfig,
    registries: &crate::Registries,
    only: Option<String>,
) -> Result<ProcessorHost, BuildError> {
    let plans = configure(config)
        .map_err(|errors| BuildError::Preflight(errors.iter().map(|e| e.to_string()).collect()))?;
    if let Some(name) = &only {
        if !plans.iter().any(|p| p.name() == name) {
            let names: Vec<&str> = plans.iter().map(|p| p.name()).collect();
            return Err(BuildError::Preflight(vec![format!(
                "{}: no processor named \"{name}\" (the config has: {})",
                config.file.display(),
                names.join(", ")
            )]));
        }
    }
    if plans.is_empty() {
        return Err(BuildError::Preflight(vec![format!(
            "{}: declares no [[processor]]",
            config.file.display()
        )]));
    }
    if !config.changes.config.enabled {
        return Err(BuildError::Preflight(vec![format!(
            "{}: the change feed is off ([changes] enabled = false): processors have nothing to read",
            config.file.display()
        )]));
    }
    let mut wanted: Vec<String> = Vec::new();
    for p in plans
        .iter()
        .filter(|p| only.as_deref().is_none_or(|o| o == p.name()))
    {
        for e in std::iter::once(p.output().to_owned()).chain(p.lookups()) {
            if !wanted.contains(&e) {
                wanted.push(e);
            }
        }
    }
    let targets = crate::storage::configure(config, &registries.storage)
        .map_err(|errors| BuildError::Preflight(errors.iter().map(|e| e.to_string()).collect()))?;
    let mut databases: HashMap<String, meshql_core::DynDatabase> = HashMap::new();
    let mut services = HashMap::new();
    for entity in config.entities.iter().filter(|e| wanted.contains(&e.name)) {
        let target = &targets[&entity.storage];
        let storage_error = |error| BuildError::Storage {
            entity: entity.name.clone(),
            error,
        };
        let db = match databases.get(&target.target()) {
            Some(db) => db.clone(),
            None => {
                let db = target.open().await.map_err(storage_error)?;
                databases.insert(target.target(), db.clone());
                db
            }
        };
        let store = db.store(&entity.table);
        let templates: Vec<_> = entity
            .graph
            .iter()
            .flat_map(|g| g.queries.iter().map(|q| q.template.clone()))
            .collect();
        store.prepare(&templates).await.map_err(storage_error)?;
        let validator = entity
            .rest
            .as_ref()
            .and_then(|r| r.schema.as_ref())
            .map(meshql_engine::PayloadValidator::new)
            .transpose()
            .map_err(|e| BuildError::Schema {
                entity: entity.name.clone(),
                file: String::new(),
                message: e.0,
            })?;
        services.insert(
            entity.name.clone(),
            Arc::new(EntityService::new(
                &entity.name,
                store,
                validator,
                entity.tokens.clone(),
                Arc::new(meshql_core::NoAuth),
            )),
        );
    }
    let reader =
        meshql_log::LogReader::open(&config.changes.dir).map_err(|e| BuildError::Changes {
            dir: config.changes.dir.display().to_string(),
            message: format!("{e} (is a server serving this config on this machine?)"),
        })?;
    let log = Arc::new(meshql_changes::TailedReader::new(
        reader,
        std::time::Duration::from_millis(20),
    ));
    let processors = start(
        config,
        log,
        &services,
        StartOptions {
            only,
            lock_dir: None,
        },
    )
    .await?;
    let processors = Arc::new(processors);
    processors.rebuild_if_log_replaced();
    Ok(ProcessorHost {
        processors,
        databases: databases.into_values().collect(),
    })
}
