//! Storage errors, shared by every backend and converted to HTTP/GraphQL errors at the edge.
//!
//! Every error has a [`ErrorKind`]: frontends map kinds (never variants) to HTTP statuses and
//! GraphQL `extensions.code`, in one place each, and retry logic asks
//! [`StoreError::is_retryable`].

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
    /// A concurrent write got in the way (a serialization failure, a deadlock victim).
    #[error("write conflict: {0}")]
    Conflict(String),
}

/// What kind of failure an error is, independent of the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The backend is down, overloaded or shutting down: try again later.
    Unavailable,
    /// A concurrent write conflicted: the same request may succeed when retried.
    Conflict,
    /// The request itself is wrong: retrying cannot help.
    Invalid,
    /// What was asked for does not exist.
    NotFound,
    /// A fault in the backend or in stored data.
    Internal,
    /// The caller's credentials are missing (where required) or invalid: a forged, expired or
    /// otherwise unacceptable token.
    Unauthenticated,
    /// The caller is known but may not do this (its roles or the policy do not allow the
    /// action on the entity).
    Forbidden,
    /// The caller sent more requests than its rate limit allows: it may retry later.
    RateLimited,
}

impl ErrorKind {
    /// The code frontends publish (GraphQL `extensions.code`, REST `code`).
    pub fn code(self) -> &'static str {
        match self {
            ErrorKind::Unavailable => "UNAVAILABLE",
            ErrorKind::Conflict => "CONFLICT",
            ErrorKind::Invalid => "BAD_REQUEST",
            ErrorKind::NotFound => "NOT_FOUND",
            ErrorKind::Internal => "INTERNAL_SERVER_ERROR",
            ErrorKind::Unauthenticated => "UNAUTHENTICATED",
            ErrorKind::Forbidden => "FORBIDDEN",
            ErrorKind::RateLimited => "RATE_LIMITED",
        }
    }
}

impl StoreError {
    /// The message without the kind prefix.
    pub fn message(&self) -> &str {
        match self {
            StoreError::Unavailable(m)
            | StoreError::Query(m)
            | StoreError::Corrupt(m)
            | StoreError::Invalid(m)
            | StoreError::Conflict(m) => m,
        }
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            StoreError::Unavailable(_) => ErrorKind::Unavailable,
            StoreError::Conflict(_) => ErrorKind::Conflict,
            StoreError::Invalid(_) => ErrorKind::Invalid,
            StoreError::Query(_) | StoreError::Corrupt(_) => ErrorKind::Internal,
        }
    }

    /// Whether the same operation may succeed if tried again (transient failures).
    pub fn is_retryable(&self) -> bool {
        matches!(self.kind(), ErrorKind::Unavailable | ErrorKind::Conflict)
    }
}

/// The first error of type `T` in `e`'s chain of sources, looking inside `io::Error`s too
/// (a TLS layer's error reaches a driver wrapped in one): what tells a handshake refused from
/// a network or server failure.
pub fn cause_of<'e, T: std::error::Error + 'static>(
    e: &'e (dyn std::error::Error + 'static),
) -> Option<&'e T> {
    let mut cur: Option<&'e (dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(found) = err.downcast_ref::<T>() {
            return Some(found);
        }
        if let Some(found) = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<T>())
        {
            return Some(found);
        }
        cur = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_map_once() {
        let e = StoreError::Unavailable("down".into());
        assert_eq!((e.kind(), e.is_retryable()), (ErrorKind::Unavailable, true));
        let e = StoreError::Invalid("bad".into());
        assert_eq!((e.kind().code(), e.is_retryable()), ("BAD_REQUEST", false));
        assert_eq!(StoreError::Corrupt("x".into()).kind(), ErrorKind::Internal);
        assert!(StoreError::Conflict("x".into()).is_retryable());
    }
}
