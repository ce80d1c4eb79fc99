//! How a change is kept in the log, and how it is published.
//!
//! A log record is the JSON object consumers receive, minus its position (which is the log
//! offset, known only once appended):
//!
//! ```text
//! {"change_id":"hen:4f…:1732380000123","entity":"hen","id":"4f…","created_at":1732380000123,
//!  "op":"update","authorized_tokens":[],"correlation_id":"…","source":"0.812","payload":{…}}
//! ```
//!
//! Publishing splices `"position":N,` after the opening brace, so the stored payload text is
//! never parsed or re-serialised on the way out. `change_id` is `entity:id:created_at`: a
//! version is unique per entity by `(id, created_at)`, so the id is the same however often a
//! change is delivered (a relay resending after a crash), which lets a consumer be exactly
//! once. `source` is the store's cursor, which the hub resumes from.

use meshql_core::{ChangeOp, Cursor, StoreChange};
use serde::Deserialize;

/// The stable id of a change (see the module docs).
pub fn change_id(entity: &str, id: &str, created_at: i64) -> String {
    format!("{entity}:{id}:{created_at}")
}

fn push_json_str(out: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(&mut *out, s).expect("a string serialises");
}

/// The log record of `change` of `entity`.
pub fn encode(entity: &str, change: &StoreChange) -> Vec<u8> {
    let mut out = Vec::with_capacity(change.payload.len() + 256);
    out.extend_from_slice(b"{\"change_id\":");
    push_json_str(&mut out, &change_id(entity, &change.id, change.created_at));
    out.extend_from_slice(b",\"entity\":");
    push_json_str(&mut out, entity);
    out.extend_from_slice(b",\"id\":");
    push_json_str(&mut out, &change.id);
    out.extend_from_slice(b",\"created_at\":");
    out.extend_from_slice(change.created_at.to_string().as_bytes());
    out.extend_from_slice(b",\"op\":\"");
    out.extend_from_slice(change.op.as_str().as_bytes());
    out.extend_from_slice(b"\",\"authorized_tokens\":");
    serde_json::to_writer(&mut out, &change.authorized_tokens).expect("strings serialise");
    out.extend_from_slice(b",\"correlation_id\":");
    match &change.correlation_id {
        Some(c) => push_json_str(&mut out, c),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"source\":\"");
    out.extend_from_slice(change.cursor.to_string().as_bytes());
    out.extend_from_slice(b"\",\"payload\":");
    out.extend_from_slice(change.payload.as_bytes());
    out.push(b'}');
    out
}

/// What consumers filter on, read from a record without touching its payload.
#[derive(Debug, Deserialize)]
pub struct Head {
    pub entity: String,
    pub id: String,
    pub op: ChangeOp,
    #[serde(default)]
    pub authorized_tokens: Vec<String>,
    pub source: String,
}

impl Head {
    pub fn parse(record: &[u8]) -> Result<Head, serde_json::Error> {
        serde_json::from_slice(record)
    }

    /// The store cursor this change was copied from.
    pub fn cursor(&self) -> Option<Cursor> {
        self.source.parse().ok()
    }
}

/// The published form of a record at `position`: `{"position":N,…record…}`.
pub fn publish(position: u64, record: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"position\":");
    out.extend_from_slice(position.to_string().as_bytes());
    match record.get(1..) {
        Some(rest) if rest.len() > 1 => {
            out.push(b',');
            out.extend_from_slice(rest);
        }
        _ => out.push(b'}'),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn change() -> StoreChange {
        StoreChange {
            cursor: Cursor(3, 41),
            id: "h\"1".into(),
            created_at: 1_700_000_000_123,
            op: ChangeOp::Update,
            payload: r#"{"name":"chuck","id":"h\"1"}"#.into(),
            authorized_tokens: vec!["alice".into()],
            correlation_id: Some("req-7".into()),
        }
    }

    #[test]
    fn a_record_publishes_as_one_json_object() {
        let record = encode("hen", &change());
        let mut out = Vec::new();
        publish(42, &record, &mut out);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["position"], 42);
        assert_eq!(v["change_id"], "hen:h\"1:1700000000123");
        assert_eq!(v["entity"], "hen");
        assert_eq!(v["op"], "update");
        assert_eq!(v["payload"]["name"], "chuck");
        assert_eq!(v["authorized_tokens"][0], "alice");
        assert_eq!(v["correlation_id"], "req-7");
        let head = Head::parse(&record).unwrap();
        assert_eq!(head.cursor(), Some(Cursor(3, 41)));
        assert_eq!(head.entity, "hen");
    }

    #[test]
    fn a_change_without_correlation_id_is_null() {
        let mut c = change();
        c.correlation_id = None;
        let v: Value = serde_json::from_slice(&encode("hen", &c)).unwrap();
        assert!(v["correlation_id"].is_null());
    }
}
