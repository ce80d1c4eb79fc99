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

pub use error::{ConfigError, ConfigErrors};
pub use model::{GraphqlLimits, ServiceConfig};
pub use resolve::{
    load, ChangesSpec, RelaySinkSpec, RelaySpec, ResolvedConfig, ResolvedEntity, ResolvedGraph,
    ResolvedQuery, ResolvedResolver, ResolvedRest, ResolverTarget, StorageSpec,
};

/// The well-known config file name looked up inside a directory argument.
pub const CONFIG_FILE_NAME: &str = "meshql.toml";

/// The JSON Schema of the config format (for editors and `meshql config-schema`).
pub fn config_json_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(model::ServiceConfig)).expect("schemas serialise")
}
