//! One version of a document as a Kafka record, in the format MeshQL's ksqlDB variant writes
//! (CONTRACT §14.4), so that its topics can be served without a copy and meshql's read by it:
//!
//! - key: the document id (UTF-8);
//! - value: `{"payload": "<the document as JSON text>", "created_at": <epoch ms>, "deleted":
//!   <bool>, "authorized_tokens": "<a JSON array of strings, as text>"}`, and `"stamp":
//!   "requested"` when the writer asked for the version's `created_at` (a back-dated write,
//!   placed in the past when it is older than the current version) rather than "now"
//!   (MeshQL's readers ignore the extra field; its records never have it), and
//!   `"correlation_id": "<text>"` when the write carried one (the change feed's).
//!
//! [`encode`] writes exactly that. [`decode`] also accepts `payload` and `authorized_tokens` as
//! JSON values rather than text, a missing `deleted` (false) and missing or null
//! `authorized_tokens` (none); a payload without an `id` gets the key's, and one whose `id`
//! differs from the key is refused. Anything else that is not an envelope — no key, a value
//! that is not a JSON object, a missing or malformed field — is a [`RecordError`] naming what
//! is wrong: the materialiser skips such a record, logs the reason and counts it.

use meshql_core::{Envelope, Millis};
use meshql_store_sqlite::LogVersion;
use serde_json::{Map, Value};

/// Why a record is not a version of a document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("the record has no key (the document id)")]
    NoKey,
    #[error("the record's key is not UTF-8 text")]
    KeyNotText,
    #[error("the record has no value (a tombstone: meshql's topics are never compacted)")]
    NoValue,
    #[error("the record's value is not JSON: {0}")]
    NotJson(String),
    #[error("the record's value is not a JSON object")]
    NotObject,
    #[error("`{field}` {problem}")]
    Field {
        field: &'static str,
        problem: String,
    },
}

fn field(field: &'static str, problem: impl Into<String>) -> RecordError {
    RecordError::Field {
        field,
        problem: problem.into(),
    }
}

/// The record of a version: its key and its value.
pub fn encode(version: &LogVersion) -> (Vec<u8>, Vec<u8>) {
    let envelope = &version.envelope;
    let tokens = serde_json::to_string(&envelope.authorized_tokens).expect("strings serialise");
    let mut value = serde_json::json!({
        "payload": envelope.payload,
        "created_at": envelope.created_at,
        "deleted": envelope.deleted,
        "authorized_tokens": tokens,
    });
    if version.requested {
        value["stamp"] = Value::String("requested".into());
    }
    if let Some(c) = &version.correlation_id {
        value["correlation_id"] = Value::String(c.clone());
    }
    (
        envelope.id.as_bytes().to_vec(),
        serde_json::to_vec(&value).expect("a JSON value serialises"),
    )
}

/// The version a record holds.
pub fn decode(key: Option<&[u8]>, value: Option<&[u8]>) -> Result<LogVersion, RecordError> {
    let id =
        std::str::from_utf8(key.ok_or(RecordError::NoKey)?).map_err(|_| RecordError::KeyNotText)?;
    if id.is_empty() {
        return Err(RecordError::NoKey);
    }
    let value: Value = serde_json::from_slice(value.ok_or(RecordError::NoValue)?)
        .map_err(|e| RecordError::NotJson(e.to_string()))?;
    let Value::Object(mut value) = value else {
        return Err(RecordError::NotObject);
    };
    let mut payload = match value.remove("payload") {
        Some(Value::String(text)) => match serde_json::from_str::<Value>(&text) {
            Ok(Value::Object(m)) => m,
            Ok(_) => return Err(field("payload", "is not a JSON object")),
            Err(e) => return Err(field("payload", format!("is not JSON text: {e}"))),
        },
        Some(Value::Object(m)) => m,
        Some(_) => return Err(field("payload", "is neither a JSON object nor its text")),
        None => return Err(field("payload", "is missing")),
    };
    match payload.get("id") {
        None => {
            // the id goes first, as the stores write it
            let mut with_id = Map::with_capacity(payload.len() + 1);
            with_id.insert("id".into(), Value::String(id.to_owned()));
            with_id.extend(payload);
            payload = with_id;
        }
        Some(Value::String(s)) if s == id => {}
        Some(other) => {
            return Err(field(
                "payload",
                format!("has the id {other}, but the record's key is {id:?}"),
            ))
        }
    }
    let created_at: Millis = match value.get("created_at") {
        Some(Value::Number(n)) => match (n.as_i64(), n.as_f64()) {
            (Some(ms), _) => ms,
            (None, Some(f)) if f.fract() == 0.0 && f.abs() < 9.0e15 => f as Millis,
            _ => {
                return Err(field(
                    "created_at",
                    format!("{n} is not whole milliseconds"),
                ))
            }
        },
        Some(other) => {
            return Err(field(
                "created_at",
                format!("{other} is not epoch milliseconds"),
            ))
        }
        None => return Err(field("created_at", "is missing")),
    };
    let deleted = match value.get("deleted") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => return Err(field("deleted", format!("{other} is not true or false"))),
    };
    let tokens = |items: &[Value]| -> Result<Vec<String>, RecordError> {
        items
            .iter()
            .map(|t| match t {
                Value::String(s) => Ok(s.clone()),
                other => Err(field(
                    "authorized_tokens",
                    format!("holds {other}, not a string"),
                )),
            })
            .collect()
    };
    let authorized_tokens = match value.get("authorized_tokens") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => tokens(items)?,
        Some(Value::String(text)) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Array(items)) => tokens(&items)?,
            Ok(Value::Null) => Vec::new(),
            _ => {
                return Err(field(
                    "authorized_tokens",
                    "is not the text of a JSON array",
                ))
            }
        },
        Some(other) => {
            return Err(field(
                "authorized_tokens",
                format!("{other} is not an array of strings or its text"),
            ))
        }
    };
    let requested = match value.get("stamp") {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) if s == "requested" => true,
        Some(Value::String(s)) if s == "now" => false,
        Some(other) => {
            return Err(field(
                "stamp",
                format!("{other} is not \"requested\" or \"now\""),
            ))
        }
    };
    let correlation_id = match value.get("correlation_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => return Err(field("correlation_id", format!("{other} is not a string"))),
    };
    Ok(LogVersion {
        envelope: Envelope {
            id: id.to_owned(),
            payload: serde_json::to_string(&payload).expect("a map serialises"),
            created_at,
            deleted,
            authorized_tokens,
        },
        requested,
        correlation_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn envelope() -> Envelope {
        Envelope {
            id: "a1".into(),
            payload: r#"{"id":"a1","name":"Greta","eggs":3}"#.into(),
            created_at: 1_767_225_600_123,
            deleted: false,
            authorized_tokens: vec!["alice".into(), "ops".into()],
        }
    }

    fn bytes(v: Value) -> Vec<u8> {
        serde_json::to_vec(&v).unwrap()
    }

    #[test]
    fn a_version_round_trips_in_meshqls_ksqldb_format() {
        let e = envelope();
        let (key, value) = encode(&e.clone().into());
        assert_eq!(key, b"a1");
        // payload and tokens are JSON text, as MeshQL's ksqlDB variant writes them
        let v: Value = serde_json::from_slice(&value).unwrap();
        assert_eq!(
            v,
            json!({"payload": "{\"id\":\"a1\",\"name\":\"Greta\",\"eggs\":3}",
                   "created_at": 1_767_225_600_123_i64, "deleted": false,
                   "authorized_tokens": "[\"alice\",\"ops\"]"})
        );
        assert_eq!(decode(Some(&key), Some(&value)).unwrap(), e.clone().into());
        let mut gone = e.clone();
        gone.deleted = true;
        let back_dated = LogVersion {
            envelope: gone,
            requested: true,
            correlation_id: None,
        };
        let (key, value) = encode(&back_dated);
        let v: Value = serde_json::from_slice(&value).unwrap();
        assert_eq!(v["stamp"], "requested");
        assert_eq!(decode(Some(&key), Some(&value)).unwrap(), back_dated);
    }

    #[test]
    fn meshqls_records_are_read_as_written() {
        // a record of MeshQL's ksqlDB variant: no id in the payload, tokens as text
        let LogVersion {
            envelope: e,
            requested,
            ..
        } = decode(
            Some(b"f-1"),
            Some(&bytes(
                json!({"payload": "{\"name\":\"Sonnenhof\",\"zone\":\"north\"}",
                               "created_at": 1700000000000_i64, "deleted": false,
                               "authorized_tokens": "[\"*\"]"}),
            )),
        )
        .unwrap();
        assert_eq!(e.id, "f-1");
        assert_eq!(
            serde_json::from_str::<Value>(&e.payload).unwrap(),
            json!({"id": "f-1", "name": "Sonnenhof", "zone": "north"})
        );
        assert!(e.payload.starts_with("{\"id\":\"f-1\""), "{}", e.payload);
        assert_eq!(e.authorized_tokens, ["*"]);
        assert!(!requested, "MeshQL's records are stamped \"now\"");
        // JSON values instead of text, no `deleted`, no tokens
        let e = decode(
            Some(b"f-2"),
            Some(&bytes(
                json!({"payload": {"name": "x"}, "created_at": 1.7e12}),
            )),
        )
        .unwrap()
        .envelope;
        assert!(!e.deleted);
        assert!(e.authorized_tokens.is_empty());
        assert_eq!(e.created_at, 1_700_000_000_000);
    }

    #[test]
    fn what_is_not_an_envelope_is_named() {
        let ok = json!({"payload": "{}", "created_at": 1, "deleted": false});
        let with = |k: &str, v: Value| {
            let mut o = ok.clone();
            o[k] = v;
            bytes(o)
        };
        for (key, value, says) in [
            (None, Some(bytes(ok.clone())), "no key"),
            (Some(&b"\xff"[..]), Some(bytes(ok.clone())), "UTF-8"),
            (Some(&b""[..]), Some(bytes(ok.clone())), "no key"),
            (Some(&b"k"[..]), None, "tombstone"),
            (Some(&b"k"[..]), Some(b"{no".to_vec()), "not JSON"),
            (
                Some(&b"k"[..]),
                Some(bytes(json!([1]))),
                "not a JSON object",
            ),
            (
                Some(&b"k"[..]),
                Some(with("payload", json!("[1]"))),
                "`payload` is not a JSON object",
            ),
            (
                Some(&b"k"[..]),
                Some(with("payload", json!("{"))),
                "`payload` is not JSON text",
            ),
            (
                Some(&b"k"[..]),
                Some(with("payload", json!(7))),
                "`payload` is neither",
            ),
            (
                Some(&b"k"[..]),
                Some(with("payload", json!({"id": "other"}))),
                "the record's key is \"k\"",
            ),
            (
                Some(&b"k"[..]),
                Some(with("created_at", json!("2026"))),
                "`created_at`",
            ),
            (
                Some(&b"k"[..]),
                Some(with("created_at", json!(1.5))),
                "whole milliseconds",
            ),
            (
                Some(&b"k"[..]),
                Some(with("deleted", json!("no"))),
                "`deleted`",
            ),
            (
                Some(&b"k"[..]),
                Some(with("authorized_tokens", json!("{}"))),
                "`authorized_tokens`",
            ),
            (
                Some(&b"k"[..]),
                Some(with("authorized_tokens", json!([1]))),
                "not a string",
            ),
        ] {
            let e = decode(key, value.as_deref()).unwrap_err();
            assert!(e.to_string().contains(says), "{says}: {e}");
        }
        let mut no_time = ok.clone();
        no_time.as_object_mut().unwrap().remove("created_at");
        assert_eq!(
            decode(Some(b"k"), Some(&bytes(no_time))).unwrap_err(),
            field("created_at", "is missing")
        );
    }
}
