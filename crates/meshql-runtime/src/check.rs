//! Checks that need more than the config crate knows (compiled JSON Schemas, the fields of
//! each storage backend, relay type, shared cache, rate-limit store and processor, what each
//! backend supports).
//! The server adds its own (the CORS header, the TLS pair); `meshql check` runs them all, so
//! it accepts exactly what `serve` does. Nothing is opened or connected.

use crate::Registries;
use meshql_config::ResolvedConfig;
use meshql_core::template::TemplateKind;
use meshql_engine::PayloadValidator;

/// Every problem found, as messages naming the file and the field.
pub fn check(config: &ResolvedConfig, registries: &Registries) -> Vec<String> {
    let mut problems = Vec::new();
    let targets = match crate::storage::configure(config, &registries.storage) {
        Ok(targets) => targets,
        Err(errors) => {
            problems.extend(errors.iter().map(|e| e.to_string()));
            Default::default()
        }
    };
    if let Err(errors) = crate::relays::configure(config, &registries.relays) {
        problems.extend(errors.iter().map(|e| e.to_string()));
    }
    if let Err(errors) = crate::caches::configure(config, &registries.caches) {
        problems.extend(errors.iter().map(|e| e.to_string()));
    }
    if let Err(errors) = crate::rate_limits::configure(config, &registries.limits) {
        problems.extend(errors.iter().map(|e| e.to_string()));
    }
    if let Err(errors) = crate::processors::configure(config) {
        problems.extend(errors.iter().map(|e| e.to_string()));
    }
    if let Err(errors) = crate::migrations::configure(config) {
        problems.extend(errors.iter().map(|e| e.to_string()));
    }
    for entity in &config.entities {
        if let Some(rest) = &entity.rest {
            if let Some(schema) = &rest.schema {
                if let Err(e) = PayloadValidator::new(schema) {
                    problems.push(format!(
                        "{}: entity \"{}\" rest.schema: {e}",
                        rest.schema_file
                            .as_ref()
                            .map(|p| p.display().to_string())
                            .unwrap_or_default(),
                        entity.name
                    ));
                }
            }
        }
        let json_only = targets
            .get(&entity.storage)
            .is_some_and(|t| !t.sql_templates());
        if let (true, Some(g)) = (json_only, &entity.graph) {
            for q in &g.queries {
                if matches!(q.template.kind, TemplateKind::Sql(_)) {
                    problems.push(format!(
                        "{}: entity \"{}\" query `{}`: SQL fragments need a SQL storage; storage `{}` is {} (use a JSON `query`)",
                        config.file.display(),
                        entity.name,
                        q.name,
                        entity.storage,
                        config.storages[&entity.storage].kind,
                    ));
                }
            }
        }
    }
    problems
}
