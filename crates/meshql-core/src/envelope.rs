//! The storage envelope: one version of one document.
//!
//! Payloads are kept as JSON object text, never as value trees, so that reads can splice
//! them into responses without re-serialising. Every stored payload carries its envelope id
//! under `"id"` (written by [`NewDocument::into_payload_text`]), so a REST read answers with
//! the stored text as it is.

use crate::time::Millis;
use serde_json::{Map, Value};

/// A document to write: a new version of `id` (or of a fresh id when `None`).
#[derive(Debug, Clone)]
pub struct NewDocument {
    pub id: Option<String>,
    pub payload: Map<String, Value>,
    /// Version timestamp; `None` means "now" (the store's clock).
    pub created_at: Option<Millis>,
}

impl NewDocument {
    pub fn new(payload: Map<String, Value>) -> Self {
        Self {
            id: None,
            payload,
            created_at: None,
        }
    }

    pub fn with_id(id: impl Into<String>, payload: Map<String, Value>) -> Self {
        Self {
            id: Some(id.into()),
            payload,
            created_at: None,
        }
    }

    pub fn at(mut self, created_at: Millis) -> Self {
        self.created_at = Some(created_at);
        self
    }

    /// The id this document will be stored under: the given one, or a fresh UUID.
    ///
    /// Generated ids are UUID version 7 (RFC 9562): random in their low 74 bits but ordered
    /// by creation time, so every id index of every backend grows at its right edge instead of
    /// dirtying a random page per insert. They still match `"format": "uuid"`; what they
    /// reveal is the millisecond of creation, which `created_at` publishes anyway.
    pub fn resolve_id(&mut self) -> String {
        self.id
            .get_or_insert_with(|| uuid::Uuid::now_v7().to_string())
            .clone()
    }

    /// Serialises the payload with `"id"` set to the envelope id (the envelope id always
    /// wins over a client-supplied `id`, as GraphQL reads do in MeshQL).
    pub fn into_payload_text(mut self, id: &str) -> String {
        self.payload
            .insert("id".to_owned(), Value::String(id.to_owned()));
        serde_json::to_string(&self.payload).expect("a JSON map always serialises")
    }
}

/// One stored version, as a backend returns it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Envelope {
    pub id: String,
    /// JSON object text, including `"id"`.
    pub payload: String,
    pub created_at: Millis,
    pub deleted: bool,
    pub authorized_tokens: Vec<String>,
}

/// `payload` (a JSON object's text) with its `"id"` set to `id`, as stores keep it.
pub fn payload_with_id(id: &str, payload: &str) -> Result<String, crate::StoreError> {
    let map: Map<String, Value> = serde_json::from_str(payload)
        .map_err(|e| crate::StoreError::Invalid(format!("payload of `{id}`: {e}")))?;
    Ok(NewDocument::with_id(id, map).into_payload_text(id))
}

impl Envelope {
    /// Parses the payload into a JSON map.
    pub fn payload_map(&self) -> Result<Map<String, Value>, serde_json::Error> {
        serde_json::from_str(&self.payload)
    }
}

/// A search result: the id and the payload text of the visible version.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Row {
    pub id: String,
    pub payload: String,
}

impl From<Envelope> for Row {
    fn from(e: Envelope) -> Self {
        Row {
            id: e.id,
            payload: e.payload,
        }
    }
}
