//! The service config: one TOML file that declares storage and entities, with per-entity
//! GraphQL SDL and JSON Schema files beside it.
//!
//! Loading runs in stages, each with its own errors, so that a server only ever sees a
//! config that is complete and consistent and starts deterministically:
//!
//! 1. [`expand`]: `${VAR}` / `${VAR:-default}` environment expansion on the raw text;
//! 2. [`model`]: TOML into the typed model (`deny_unknown_fields` everywhere);
//! 3. [`resolve`]: files read and parsed, names cross-checked (storage, queries, templates,
//!    resolver targets), into [`ResolvedConfig`].
//!
//! Every error names the config file, the line, and the field.

mod casbin;
pub mod error;
pub mod expand;
pub mod model;
pub mod resolve;
pub mod role;
pub mod schedule;
pub mod this_service;

pub use error::{ConfigError, ConfigErrors};
pub use model::{ConsoleConfig, GraphqlLimits, ServiceConfig, WriteResponse};
pub use resolve::{
    load, CacheSpec, ChangesSpec, ProcessorSpec, RelaySpec, ResolvedConfig, ResolvedEntity,
    ResolvedGraph, ResolvedQuery, ResolvedResolver, ResolvedRest, ResolverTarget, StorageSpec,
};
pub use role::{Role, UnknownRole};

/// The well-known config file name looked up inside a directory argument.
pub const CONFIG_FILE_NAME: &str = "meshql.toml";

/// The JSON Schema of the config format (for editors and `meshql config-schema`), with one
/// alternative per storage backend and one per relay type: its `type` and the JSON Schema of
/// its other fields (see `meshql_core::BackendRegistry::schemas` and
/// `meshql_changes::RelayRegistry::schemas`).
pub fn config_json_schema(
    storage: &[(&str, serde_json::Value)],
    relays: &[(&str, serde_json::Value)],
) -> serde_json::Value {
    let mut schema = serde_json::to_value(schemars::schema_for!(model::ServiceConfig))
        .expect("schemas serialise");
    one_of_kinds(
        &mut schema,
        "StorageConfig",
        "A storage block: `type` selects the backend, the other fields are that backend's.",
        &serde_json::Value::Null,
        storage,
    );
    let relay_fields =
        serde_json::to_value(schemars::schema_for!(model::RelayFields)).expect("schemas serialise");
    one_of_kinds(
        &mut schema,
        "RelayConfig",
        "A relay of the change feed: `type` selects the relay, `name`, `batch` and `retry_backoff_max_ms` are every relay's, the other fields are that relay's. Every message carries the change's `change_id` (`entity:id:created_at`), the same on every delivery: consumers de-duplicate on it to be exactly once.",
        &relay_fields,
        relays,
    );
    schema
}

/// Replaces the definition `name` of `schema` with one alternative per kind: an object with
/// `type` (the kind), the fields of `common` and the kind's own fields.
fn one_of_kinds(
    schema: &mut serde_json::Value,
    name: &str,
    description: &str,
    common: &serde_json::Value,
    kinds: &[(&str, serde_json::Value)],
) {
    let mut alternatives = Vec::new();
    for (kind, own) in kinds {
        let mut block = serde_json::Map::new();
        if let Some(description) = own.get("description") {
            block.insert("description".into(), description.clone());
        }
        block.insert("type".into(), "object".into());
        let mut properties = serde_json::Map::new();
        properties.insert("type".into(), serde_json::json!({ "const": kind }));
        let mut required = vec![serde_json::Value::from("type")];
        for part in [common, own] {
            if let Some(serde_json::Value::Object(p)) = part.get("properties") {
                properties.extend(p.clone());
            }
            if let Some(serde_json::Value::Array(r)) = part.get("required") {
                required.extend(r.iter().cloned());
            }
            // definitions the kind's schema refers to (`#/$defs/...`) move to the root
            if let (Some(serde_json::Value::Object(defs)), Some(root)) =
                (part.get("$defs"), schema.get_mut("$defs"))
            {
                if let Some(root) = root.as_object_mut() {
                    root.extend(defs.clone());
                }
            }
        }
        block.insert("properties".into(), properties.into());
        block.insert("required".into(), required.into());
        block.insert("additionalProperties".into(), false.into());
        alternatives.push(serde_json::Value::Object(block));
    }
    if let Some(defs) = schema.get_mut("$defs").and_then(|d| d.as_object_mut()) {
        defs.insert(
            name.into(),
            serde_json::json!({ "description": description, "oneOf": alternatives }),
        );
    }
}
