//! What the engine answers when a request cannot be served, with a kind that frontends map to
//! their protocol (HTTP status, GraphQL `extensions.code`) in one place each.

use meshql_core::{AuthError, ErrorKind, Forbidden, StoreError};
use serde_json::Value;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum EngineError {
    /// The payload breaks the entity's JSON Schema: every violation, as
    /// `{"path": "/field", "message": …}`.
    #[error("Invalid payload")]
    Invalid(Vec<Value>),
    /// Some items of a bulk write are invalid: `{"index": i, "errors": [...]}` per item.
    #[error("Invalid payload in batch")]
    InvalidBatch(Vec<Value>),
    /// The payload is not of the expected JSON type.
    #[error("the request body must be a JSON {0}")]
    WrongShape(&'static str),
    /// A request header the engine reads is malformed (a consistency token).
    #[error("{0}")]
    BadRequest(String),
    /// No visible document has this id.
    #[error("Resource not found")]
    NotFound,
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The caller's credentials were refused (a 401, or a 503 while keys are unavailable).
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// The caller may not do this to this entity (a 403).
    #[error(transparent)]
    Forbidden(#[from] Forbidden),
}

impl EngineError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            EngineError::Invalid(_)
            | EngineError::InvalidBatch(_)
            | EngineError::WrongShape(_)
            | EngineError::BadRequest(_) => ErrorKind::Invalid,
            EngineError::NotFound => ErrorKind::NotFound,
            EngineError::Store(e) => e.kind(),
            EngineError::Auth(e) => e.kind(),
            EngineError::Forbidden(e) => e.kind(),
        }
    }
}
