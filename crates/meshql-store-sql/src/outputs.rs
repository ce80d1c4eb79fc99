//! Processor outputs (`meshql_core::OutputStore`): what the SQL stores share of them.

use meshql_core::StoreError;

/// The stored text of an output payload with `"id"` set to `id`.
pub fn with_id(id: &str, payload: &str) -> Result<String, StoreError> {
    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_str(payload)
        .map_err(|e| StoreError::Invalid(format!("output payload of `{id}`: {e}")))?;
    Ok(meshql_core::NewDocument::with_id(id, map).into_payload_text(id))
}

/// A log position as a BIGINT (`what` names it in the error).
pub fn bigint(position: u64, what: &str) -> Result<i64, StoreError> {
    i64::try_from(position)
        .map_err(|_| StoreError::Invalid(format!("{what} {position} exceeds a BIGINT")))
}
