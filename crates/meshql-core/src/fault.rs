//! Fault injection for the conformance suite: with the `faults` feature (enabled only by
//! test builds, through `meshql-conformance`), a document whose payload contains [`POISON`]
//! fails when a backend stores it, after the versions before it in the same transaction were
//! written. That is how the suite proves, on every backend, that a batch failing part-way
//! through storage leaves nothing behind, in the data or in the change feed. Without the
//! feature [`check`] compiles to nothing.

use crate::StoreError;

/// The marker that makes a write fail (with the `faults` feature).
pub const POISON: &str = "__meshql_fault_fail_this_write__";

/// Fails a write of `payload` that carries [`POISON`] (with the `faults` feature).
#[inline(always)]
pub fn check(payload: &str) -> Result<(), StoreError> {
    #[cfg(feature = "faults")]
    if payload.contains(POISON) {
        return Err(StoreError::Query(
            "injected fault: this document cannot be stored".into(),
        ));
    }
    let _ = payload;
    Ok(())
}
