//! Why a service could not be built: every problem the checks found, or the first part that
//! failed to start (storage, a JSON Schema, the GraphQL registry, the change feed, auth, a
//! migration).

use meshql_core::StoreError;
use meshql_graphql::RegistryError;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum BuildError {
    #[error("{}", .0.join("\n"))]
    Preflight(Vec<String>),
    /// (The store's error is part of the message, not a `source`: printed with its chain,
    /// it would be said twice.)
    #[error("entity \"{entity}\": storage: {error}")]
    Storage { entity: String, error: StoreError },
    #[error("entity \"{entity}\": JSON Schema {file}: {message}")]
    Schema {
        entity: String,
        file: String,
        message: String,
    },
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("change feed ({dir}): {message}")]
    Changes { dir: String, message: String },
    #[error("auth: {0}")]
    Auth(String),
    /// A declared migration could not run (nothing is served).
    #[error("migrations: {0}")]
    Migration(#[from] meshql_process::migration::MigrationError),
}
