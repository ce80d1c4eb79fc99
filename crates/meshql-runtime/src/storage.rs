//! The storage blocks of a config checked by their backends: what opens each block's
//! database. A backend crate owns its block (fields, defaults, checks, JSON Schema) and its
//! database ([`meshql_core::Component`]`<Storage>`); everything else — one database per storage
//! target, one store per entity, readiness, shutdown — works on databases without knowing
//! their backend.

use meshql_config::{ConfigError, ResolvedConfig};
use meshql_core::{BackendContext, BackendRegistry, StorageTarget};
use std::collections::BTreeMap;

/// Checks the storage blocks entities use and returns what opens each, by block name; or
/// every problem, naming the file, the block's line and the field.
pub fn configure(
    config: &ResolvedConfig,
    registry: &BackendRegistry,
) -> Result<BTreeMap<String, Box<dyn StorageTarget>>, Vec<ConfigError>> {
    let mut targets = BTreeMap::new();
    let mut problems = Vec::new();
    for (name, spec) in &config.storages {
        let context = BackendContext {
            block: name,
            data_dir: &config.data_dir,
        };
        match registry.configure(&spec.kind, &spec.settings, &context) {
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
