//! The backend registry: the storage backends this binary serves, each registered once. A
//! backend crate owns its storage block (fields, defaults, checks, JSON Schema) and its
//! database ([`meshql_core::Component`]`<Storage>`); everything else in the server — one database
//! per storage target, one store per entity, readiness, shutdown — works on databases
//! without knowing their backend. A new backend is its crate, proven by the conformance
//! suite, and one line in [`registry`].

use meshql_config::{ConfigError, ResolvedConfig};
use meshql_core::{BackendContext, BackendRegistry, StorageTarget};
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// Every storage backend this binary serves, by `type`.
pub fn registry() -> &'static BackendRegistry {
    static REGISTRY: OnceLock<BackendRegistry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        BackendRegistry::new()
            .register(meshql_store_sqlite::SqliteBackend)
            .register(meshql_store_memory::MemoryBackend)
            .register(meshql_store_postgres::PostgresBackend)
            .register(meshql_store_mysql::MysqlBackend)
            .register(meshql_store_mongo::MongoBackend)
            .register(meshql_store_kafka::KafkaBackend)
    })
}

/// Checks the storage blocks entities use and returns what opens each, by block name; or
/// every problem, naming the file, the block's line and the field.
pub fn configure(
    config: &ResolvedConfig,
) -> Result<BTreeMap<String, Box<dyn StorageTarget>>, Vec<ConfigError>> {
    let mut targets = BTreeMap::new();
    let mut problems = Vec::new();
    for (name, spec) in &config.storages {
        let context = BackendContext {
            block: name,
            data_dir: &config.data_dir,
        };
        match registry().configure(&spec.kind, &spec.settings, &context) {
            Ok(target) => {
                targets.insert(name.clone(), target);
            }
            Err(e) => problems.push(ConfigError {
                file: config.file.clone(),
                line: spec.line_of(e.field.as_deref()),
                field: match e.field {
                    Some(field) => format!("storage.{name}.{field}"),
                    None => format!("storage.{name}"),
                },
                message: e.message,
            }),
        }
    }
    if problems.is_empty() {
        Ok(targets)
    } else {
        Err(problems)
    }
}

/// The config's JSON Schema with every registered backend's storage block and every
/// registered relay type's `[[changes.relay]]` entry.
pub fn config_json_schema() -> serde_json::Value {
    meshql_config::config_json_schema(&registry().schemas(), &crate::relays::registry().schemas())
}
