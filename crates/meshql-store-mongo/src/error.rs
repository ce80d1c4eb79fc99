//! The driver's errors as the store's: unreachable servers are `Unavailable` (the request
//! may be retried), everything else a query error; and the one error a write looks for.

use meshql_core::StoreError;

/// The driver's error as the store's.
pub(crate) fn error(e: mongodb::error::Error) -> StoreError {
    use mongodb::error::ErrorKind;
    match *e.kind {
        ErrorKind::Io(_)
        | ErrorKind::ServerSelection { .. }
        | ErrorKind::ConnectionPoolCleared { .. }
        | ErrorKind::Shutdown => StoreError::Unavailable(format!("MongoDB unavailable: {e}")),
        _ => StoreError::Query(format!("MongoDB: {e}")),
    }
}

/// E11000: an insert hit a unique index.
pub(crate) fn is_duplicate_key(e: &mongodb::error::Error) -> bool {
    use mongodb::error::{ErrorKind, WriteFailure};
    match &*e.kind {
        ErrorKind::Write(WriteFailure::WriteError(w)) => w.code == 11000,
        ErrorKind::Command(c) => c.code == 11000,
        ErrorKind::InsertMany(m) => m
            .write_errors
            .as_ref()
            .is_some_and(|w| w.iter().any(|w| w.code == 11000)),
        _ => false,
    }
}
