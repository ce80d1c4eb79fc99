//! The message formats an external source ([`crate::source`]) reads: one message (a Kafka
//! record, a JetStream message) as a processor's [`Input`].
//!
//! - `debezium`: Debezium change events, schemaless or inside `{"schema", "payload"}`,
//!   `after`/`before` as JSON text (the MongoDB connector) or objects; a document in MeshQL's
//!   layout (`{id, payload: {…}, …}`) yields its `payload`, any other document (a table row)
//!   itself; `op` `c`/`r` create, `u` update, `d` delete.
//! - `meshql`: the changes meshql's relays publish, as `/_changes` serves them
//!   (`{"position", "change_id", "entity", "id", "op", "payload", "correlation_id", …}`).
//!
//! The entity of a message: the source's `entities` map (keyed by the message's topic or
//! subject), else the envelope's (`entity`, or Debezium's `source.collection` /
//! `source.table`), else the topic's or subject's last `.`-separated segment.

use crate::plan::Input;
use meshql_core::ChangeOp;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// How a source's messages are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Debezium,
    Meshql,
}

impl Format {
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Debezium => "debezium",
            Format::Meshql => "meshql",
        }
    }
}

/// Where a message was read, for what its envelope does not say.
pub(crate) struct Origin<'a> {
    /// The topic or subject it arrived on.
    pub channel: &'a str,
    /// Its place in the source (`topic:partition:offset`, `stream:sequence`): the change id
    /// when the envelope has none, and the document id when a Debezium row has none.
    pub at: String,
    /// The source's own time of the message (milliseconds), when the envelope has none.
    pub timestamp: Option<i64>,
    /// The input position the runner gives it.
    pub position: u64,
}

/// A JSON value that may be JSON text (Debezium's MongoDB connector writes documents so).
fn document(v: &Value) -> Option<Map<String, Value>> {
    match v {
        Value::Object(m) => Some(m.clone()),
        Value::String(s) => match serde_json::from_str::<Value>(s) {
            Ok(Value::Object(m)) => Some(m),
            _ => None,
        },
        _ => None,
    }
}

fn id_of(doc: &Map<String, Value>) -> Option<String> {
    match doc.get("id").or_else(|| doc.get("_id")) {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Object(o)) => o.get("$oid").and_then(Value::as_str).map(str::to_owned),
        Some(Value::Null) | None => None,
        Some(other) => Some(other.to_string()),
    }
}

/// One message as an input (`Err`: why it cannot be read).
pub(crate) fn input_of(
    format: Format,
    entities: &BTreeMap<String, String>,
    origin: Origin<'_>,
    value: &[u8],
) -> Result<Input, String> {
    let v: Value =
        serde_json::from_slice(value).map_err(|e| format!("the message is not JSON: {e}"))?;
    let Origin {
        channel,
        at,
        timestamp,
        position,
    } = origin;
    let mapped = entities.get(channel).cloned();
    let last_segment = channel.rsplit('.').next().unwrap_or(channel).to_owned();
    match format {
        Format::Meshql => {
            let entity = mapped
                .or_else(|| v["entity"].as_str().map(str::to_owned))
                .unwrap_or(last_segment);
            let op: ChangeOp = serde_json::from_value(v["op"].clone())
                .map_err(|_| "no `op` of create, update or delete".to_string())?;
            let payload = document(&v["payload"]).ok_or("no `payload` object")?;
            let id = v["id"]
                .as_str()
                .map(str::to_owned)
                .or_else(|| id_of(&payload))
                .ok_or("no `id`")?;
            Ok(Input {
                position,
                change_id: v["change_id"].as_str().map(str::to_owned).unwrap_or(at),
                entity,
                id,
                op,
                created_at: v["created_at"].as_i64().or(timestamp).unwrap_or(0),
                correlation_id: v["correlation_id"].as_str().map(str::to_owned),
                payload,
                order: (0, position),
                // a topic or stream may hold a message twice: look its contribution up
                fresh: false,
            })
        }
        Format::Debezium => {
            let env = match v.get("payload") {
                Some(p) if p.get("op").is_some() => p,
                _ => &v,
            };
            let op = match env["op"].as_str() {
                Some("c") | Some("r") => ChangeOp::Create,
                Some("u") => ChangeOp::Update,
                Some("d") => ChangeOp::Delete,
                other => return Err(format!("Debezium `op` is {other:?}, not c, r, u or d")),
            };
            let doc = match op {
                ChangeOp::Delete => document(&env["before"]).unwrap_or_default(),
                _ => document(&env["after"]).ok_or("no `after` document")?,
            };
            let entity = mapped
                .or_else(|| env["source"]["collection"].as_str().map(str::to_owned))
                .or_else(|| env["source"]["table"].as_str().map(str::to_owned))
                .unwrap_or(last_segment);
            // MeshQL's stored layout: the document's data is its `payload`
            let (id, payload) = match doc.get("payload") {
                Some(Value::Object(p)) => (id_of(&doc), p.clone()),
                _ => (id_of(&doc), doc.clone()),
            };
            let id = id.unwrap_or_else(|| at.clone());
            Ok(Input {
                position,
                change_id: env["source"]["change_id"]
                    .as_str()
                    .map(str::to_owned)
                    .unwrap_or(at),
                entity,
                id,
                op,
                created_at: doc
                    .get("created_at")
                    .and_then(Value::as_i64)
                    .or(env["ts_ms"].as_i64())
                    .or(timestamp)
                    .unwrap_or(0),
                correlation_id: None,
                payload,
                order: (0, position),
                // a topic or stream may hold a message twice: look its contribution up
                fresh: false,
            })
        }
    }
}
