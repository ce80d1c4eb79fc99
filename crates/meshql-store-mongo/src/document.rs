//! The stored version document and meshql's types: a payload's JSON text as BSON and back,
//! a version as an [`Envelope`] or as a change of the feed.

use meshql_core::{ChangeOp, Cursor, Envelope, StoreChange, StoreError};
use mongodb::bson::{self, Bson, Document};

pub(crate) fn json_to_bson(v: &serde_json::Value) -> Bson {
    bson::to_bson(v).unwrap_or(Bson::Null)
}

pub(crate) fn payload_doc(text: &str) -> Result<Document, StoreError> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| StoreError::Invalid(e.to_string()))?;
    match json_to_bson(&v) {
        Bson::Document(d) => Ok(d),
        _ => Err(StoreError::Invalid("payload must be an object".into())),
    }
}

pub(crate) fn payload_text(d: &Document) -> Result<String, StoreError> {
    let payload = d
        .get_document("payload")
        .map_err(|e| StoreError::Corrupt(format!("payload: {e}")))?;
    let v: serde_json::Value = Bson::Document(payload.clone()).into_relaxed_extjson();
    Ok(v.to_string())
}

pub(crate) fn envelope(d: &Document) -> Result<Envelope, StoreError> {
    Ok(Envelope {
        id: d.get_str("id").unwrap_or_default().to_owned(),
        payload: payload_text(d)?,
        created_at: created_at(d),
        deleted: d.get_bool("deleted").unwrap_or(false),
        authorized_tokens: tokens(d),
    })
}

/// A version document's `created_at`, in milliseconds.
pub(crate) fn created_at(d: &Document) -> i64 {
    d.get_datetime("created_at")
        .map(|t| t.timestamp_millis())
        .unwrap_or_default()
}

/// A version document's authorized tokens.
pub(crate) fn tokens(d: &Document) -> Vec<String> {
    d.get_array("authorized_tokens")
        .map(|a| {
            a.iter()
                .filter_map(|t| t.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The stored text of a payload: what reads answer.
pub(crate) fn stored_text(payload: &Document) -> String {
    Bson::Document(payload.clone())
        .into_relaxed_extjson()
        .to_string()
}

/// The change a version is.
pub(crate) fn change_of(d: &Document, pos: u64) -> Result<StoreChange, StoreError> {
    let env = envelope(d)?;
    let first_version = match (d.get_object_id("_id"), d.get_object_id("seq")) {
        (Ok(oid), Ok(seq)) => oid == seq,
        _ => true,
    };
    Ok(StoreChange {
        cursor: Cursor::seq(pos),
        op: ChangeOp::of_version(env.deleted, first_version),
        id: env.id,
        created_at: env.created_at,
        payload: env.payload,
        authorized_tokens: env.authorized_tokens,
        correlation_id: d.get_str("correlation_id").ok().map(str::to_owned),
    })
}
