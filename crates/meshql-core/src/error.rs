//! Storage errors, shared by every backend and converted to HTTP/GraphQL errors at the edge.

use thiserror::Error;

#[derive(Debug, Clone, Error)]
pub enum StoreError {
    /// The backend cannot be reached or is shutting down.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// The backend rejected or failed a statement.
    #[error("storage query failed: {0}")]
    Query(String),
    /// A stored document could not be decoded.
    #[error("stored document is corrupt: {0}")]
    Corrupt(String),
    /// The caller asked for something the backend cannot do (bad template, bad argument).
    #[error("invalid query: {0}")]
    Invalid(String),
}

impl StoreError {
    /// The message without the kind prefix.
    pub fn message(&self) -> &str {
        match self {
            StoreError::Unavailable(m)
            | StoreError::Query(m)
            | StoreError::Corrupt(m)
            | StoreError::Invalid(m) => m,
        }
    }
}
