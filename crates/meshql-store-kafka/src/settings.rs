//! `[storage.<name>] type = "kafka"`: the block's fields, defaults and checks.
//!
//! ```toml
//! [storage.events]
//! type = "kafka"
//! brokers = "127.0.0.1:19092"                # bootstrap servers, comma-separated host:port
//! topic = "eggs-development-{entity}"         # one topic per entity (MeshQL's naming); default meshql-{entity}
//! partitions = 1                              # when meshql makes a topic (default 1)
//! replication_factor = 1                      # when meshql makes a topic (default 1)
//! create_topics = true                        # make missing topics (default true)
//! file = "events-kafka.db"                    # the local materialisation (default <block>-kafka.db, under data_dir)
//! write_timeout_ms = 10000                    # a write's wait for the broker and the local apply
//! options = { "socket.keepalive.enable" = true }  # producer and consumer
//! producer = { "linger.ms" = 1 }              # the producer only
//! consumer = { "fetch.wait.max.ms" = 10 }     # the consumer only
//! ```
//!
//! `options`, `producer` and `consumer` are librdkafka properties, passed through, except
//! those meshql sets itself because its guarantees rest on them ([`RESERVED`]): naming one is
//! an error that says why. A property or value this build's librdkafka cannot take (it is
//! built without OpenSSL, zlib or zstd: no TLS or SASL, no gzip or zstd compression) is
//! refused when the config is checked.

use meshql_core::{parse_settings, BackendContext, SettingError};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The librdkafka properties meshql sets itself, and why.
pub const RESERVED: &[(&str, &str)] = &[
    ("bootstrap.servers", "it is `brokers`"),
    (
        "enable.idempotence",
        "writes are produced idempotently: a retry never duplicates or reorders a version",
    ),
    (
        "acks",
        "a write is acknowledged only once every in-sync replica has it (acks=all)",
    ),
    (
        "transactional.id",
        "bulk writes are Kafka transactions under an id meshql derives per process",
    ),
    (
        "group.id",
        "each process reads every partition itself into its own materialisation",
    ),
    (
        "enable.auto.commit",
        "the materialisation keeps its offsets itself, with the versions it applied",
    ),
    (
        "isolation.level",
        "an aborted bulk write is never applied (read_committed)",
    ),
    (
        "auto.offset.reset",
        "a new materialisation reads the topics from their start",
    ),
];

/// The block's fields (besides `type`).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KafkaSettings {
    /// Bootstrap servers: comma-separated `host:port`.
    pub brokers: String,
    /// Each entity's topic: a name with `{entity}` once (default `meshql-{entity}`; MeshQL's
    /// ksqlDB variant uses `<prefix>-<env>-{entity}`).
    #[serde(default = "default_topic")]
    pub topic: String,
    /// Partitions of a topic meshql makes (default 1). Never change it on an existing topic:
    /// a document's later versions would go to another partition.
    #[serde(default = "one")]
    pub partitions: u32,
    /// Replication factor of a topic meshql makes (default 1).
    #[serde(default = "one_u16")]
    pub replication_factor: u16,
    /// Make missing topics (default true); otherwise a missing topic is an error at start.
    #[serde(default = "yes")]
    pub create_topics: bool,
    /// The local materialisation's SQLite file, relative to `data_dir` (default
    /// `<block>-kafka.db`).
    #[serde(default)]
    pub file: Option<String>,
    /// How long a write may wait for the broker's acknowledgement and the local apply before
    /// it answers 503 (default 10000).
    #[serde(default = "default_write_timeout")]
    pub write_timeout_ms: u64,
    /// librdkafka properties for the producer and the consumer (TLS, SASL, …).
    #[serde(default)]
    pub options: BTreeMap<String, Value>,
    /// librdkafka properties for the producer only.
    #[serde(default)]
    pub producer: BTreeMap<String, Value>,
    /// librdkafka properties for the consumer only.
    #[serde(default)]
    pub consumer: BTreeMap<String, Value>,
}

fn default_topic() -> String {
    "meshql-{entity}".into()
}
fn one() -> u32 {
    1
}
fn one_u16() -> u16 {
    1
}
fn yes() -> bool {
    true
}
fn default_write_timeout() -> u64 {
    10_000
}

/// The longest `write_timeout_ms`.
pub const MAX_WRITE_TIMEOUT_MS: u64 = 300_000;

/// A checked block.
#[derive(Debug, Clone, PartialEq)]
pub struct KafkaStorage {
    pub brokers: String,
    pub topic: String,
    pub partitions: u32,
    pub replication_factor: u16,
    pub create_topics: bool,
    pub file: PathBuf,
    pub write_timeout: std::time::Duration,
    /// The producer's properties (`options`, then `producer`), as librdkafka takes them.
    pub producer: BTreeMap<String, String>,
    /// The consumer's properties (`options`, then `consumer`).
    pub consumer: BTreeMap<String, String>,
}

impl KafkaStorage {
    /// The topic of `entity`.
    pub fn topic_of(&self, entity: &str) -> String {
        self.topic.replace("{entity}", entity)
    }
}

/// A topic name's characters (Kafka's: ASCII letters, digits, `.`, `_`, `-`).
fn topic_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// Reads and checks a block.
pub fn configure(
    settings: &Value,
    context: &BackendContext<'_>,
) -> Result<KafkaStorage, SettingError> {
    checked(parse_settings(settings)?, context)
}

/// Checks a block's fields.
pub(crate) fn checked(
    s: KafkaSettings,
    context: &BackendContext<'_>,
) -> Result<KafkaStorage, SettingError> {
    let brokers: Vec<&str> = s
        .brokers
        .split(',')
        .map(str::trim)
        .filter(|b| !b.is_empty())
        .collect();
    if brokers.is_empty() {
        return Err(SettingError::new(
            "brokers",
            "name at least one broker, e.g. \"127.0.0.1:9092\"",
        ));
    }
    for b in &brokers {
        let port = b.rsplit_once(':').map(|(_, p)| p);
        if !port.is_some_and(|p| p.parse::<u16>().is_ok_and(|p| p > 0)) {
            return Err(SettingError::new(
                "brokers",
                format!("`{b}` is not host:port"),
            ));
        }
    }
    if s.topic.matches("{entity}").count() != 1 {
        return Err(SettingError::new(
            "topic",
            "must hold `{entity}` once: each entity has a topic of its own",
        ));
    }
    let literal = s.topic.replace("{entity}", "");
    if let Some(c) = literal.chars().find(|c| !topic_char(*c)) {
        return Err(SettingError::new(
            "topic",
            format!("{c:?} cannot be part of a Kafka topic name (letters, digits, `.`, `_`, `-`)"),
        ));
    }
    if literal.len() > 200 {
        return Err(SettingError::new(
            "topic",
            "too long: a Kafka topic name has at most 249 characters, the entity's included",
        ));
    }
    if s.partitions == 0 {
        return Err(SettingError::new("partitions", "must be at least 1"));
    }
    if s.replication_factor == 0 {
        return Err(SettingError::new(
            "replication_factor",
            "must be at least 1",
        ));
    }
    if !(1..=MAX_WRITE_TIMEOUT_MS).contains(&s.write_timeout_ms) {
        return Err(SettingError::new(
            "write_timeout_ms",
            format!("must be between 1 and {MAX_WRITE_TIMEOUT_MS}"),
        ));
    }
    let file = match s.file.as_deref() {
        Some("") => return Err(SettingError::new("file", "must name a file")),
        Some(f) => PathBuf::from(f),
        None => PathBuf::from(format!("{}-kafka.db", context.block)),
    };
    let file = if file.is_absolute() {
        file
    } else {
        context.data_dir.join(file)
    };
    let options = properties("options", &s.options)?;
    let mut producer = options.clone();
    producer.extend(properties("producer", &s.producer)?);
    let mut consumer = options;
    consumer.extend(properties("consumer", &s.consumer)?);
    // what librdkafka would refuse when the store opens is refused now (`meshql check`)
    for (block, properties) in [("producer", &producer), ("consumer", &consumer)] {
        let mut probe = rdkafka::ClientConfig::new();
        probe.set("bootstrap.servers", brokers.join(","));
        for (k, v) in properties {
            probe.set(k, v);
        }
        probe
            .create_native_config()
            .map_err(|e| SettingError::new(block, e.to_string()))?;
    }
    Ok(KafkaStorage {
        brokers: brokers.join(","),
        topic: s.topic,
        partitions: s.partitions,
        replication_factor: s.replication_factor,
        create_topics: s.create_topics,
        file,
        write_timeout: std::time::Duration::from_millis(s.write_timeout_ms),
        producer,
        consumer,
    })
}

/// librdkafka properties from a table: scalar values as text; meshql's own refused.
fn properties(
    block: &str,
    table: &BTreeMap<String, Value>,
) -> Result<BTreeMap<String, String>, SettingError> {
    let mut out = BTreeMap::new();
    for (key, value) in table {
        let at = format!("{block}.{key}");
        if let Some((_, why)) = RESERVED.iter().find(|(k, _)| k == key) {
            return Err(SettingError::new(
                at,
                format!("meshql sets `{key}` itself: {why}"),
            ));
        }
        let text = match value {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            _ => {
                return Err(SettingError::new(
                    at,
                    "a librdkafka property's value: text, a number or true/false",
                ))
            }
        };
        out.insert(key.clone(), text);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn context() -> BackendContext<'static> {
        BackendContext {
            block: "events",
            data_dir: std::path::Path::new("/srv/meshql"),
        }
    }

    fn check(v: Value) -> Result<KafkaStorage, SettingError> {
        configure(&v, &context())
    }

    #[test]
    fn properties_librdkafka_refuses_are_refused_at_check() {
        let e = check(json!({"brokers": "h:1", "options": {"security.protocol": "SASL_SSL"}}))
            .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("producer"));
        assert!(e.message.contains("SASL_SSL"), "{e}");
        let e = check(json!({"brokers": "h:1", "consumer": {"fetch.wait.max.ms": "soon"}}))
            .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("consumer"));
    }

    #[test]
    fn defaults_and_passed_through_properties() {
        let s = check(json!({"brokers": " 127.0.0.1:19092 , kafka-2:9092 ",
            "options": {"socket.keepalive.enable": true, "linger.ms": 5},
            "producer": {"linger.ms": 1, "batch.num.messages": 100},
            "consumer": {"fetch.wait.max.ms": "10"}}))
        .unwrap();
        assert_eq!(s.brokers, "127.0.0.1:19092,kafka-2:9092");
        assert_eq!(s.topic_of("lay_report"), "meshql-lay_report");
        assert_eq!((s.partitions, s.replication_factor), (1, 1));
        assert!(s.create_topics);
        assert_eq!(s.file, PathBuf::from("/srv/meshql/events-kafka.db"));
        assert_eq!(s.write_timeout, std::time::Duration::from_secs(10));
        // options go to both; producer and consumer win over them
        assert_eq!(s.producer["linger.ms"], "1");
        assert_eq!(s.producer["socket.keepalive.enable"], "true");
        assert_eq!(s.producer["batch.num.messages"], "100");
        assert_eq!(s.consumer["linger.ms"], "5");
        assert_eq!(s.consumer["fetch.wait.max.ms"], "10");
        assert!(!s
            .consumer
            .contains_key("enable.ssl.certificate.verification"));
        // MeshQL's ksqlDB naming
        let s = check(
            json!({"brokers": "k:9092", "topic": "eggs-development-{entity}",
                             "file": "/var/lib/m.db", "partitions": 3}),
        )
        .unwrap();
        assert_eq!(s.topic_of("farm"), "eggs-development-farm");
        assert_eq!(s.file, PathBuf::from("/var/lib/m.db"));
        assert_eq!(s.partitions, 3);
    }

    #[test]
    fn every_mistake_names_its_field() {
        for (block, at, says) in [
            (json!({}), None, "brokers"),
            (
                json!({"brokers": " , "}),
                Some("brokers"),
                "at least one broker",
            ),
            (
                json!({"brokers": "kafka"}),
                Some("brokers"),
                "`kafka` is not host:port",
            ),
            (json!({"brokers": "k:0"}), Some("brokers"), "host:port"),
            (
                json!({"brokers": "k:1", "topic": "all"}),
                Some("topic"),
                "`{entity}` once",
            ),
            (
                json!({"brokers": "k:1", "topic": "{entity}-{entity}"}),
                Some("topic"),
                "once",
            ),
            (
                json!({"brokers": "k:1", "topic": "a b-{entity}"}),
                Some("topic"),
                "' '",
            ),
            (
                json!({"brokers": "k:1", "partitions": 0}),
                Some("partitions"),
                "at least 1",
            ),
            (
                json!({"brokers": "k:1", "replication_factor": 0}),
                Some("replication_factor"),
                "at least 1",
            ),
            (
                json!({"brokers": "k:1", "write_timeout_ms": 0}),
                Some("write_timeout_ms"),
                "between",
            ),
            (
                json!({"brokers": "k:1", "file": ""}),
                Some("file"),
                "name a file",
            ),
            (
                json!({"brokers": "k:1", "producer": {"acks": "1"}}),
                Some("producer.acks"),
                "acks=all",
            ),
            (
                json!({"brokers": "k:1", "options": {"group.id": "g"}}),
                Some("options.group.id"),
                "its own materialisation",
            ),
            (
                json!({"brokers": "k:1", "consumer": {"isolation.level": "read_uncommitted"}}),
                Some("consumer.isolation.level"),
                "read_committed",
            ),
            (
                json!({"brokers": "k:1", "options": {"x": [1]}}),
                Some("options.x"),
                "a librdkafka property's value",
            ),
            (
                json!({"brokers": "k:1", "topics": "x"}),
                None,
                "unknown field",
            ),
        ] {
            let e = check(block.clone()).unwrap_err();
            if let Some(at) = at {
                assert_eq!(e.field.as_deref(), Some(at), "{block}: {e:?}");
            }
            assert!(e.message.contains(says), "{block}: {e:?}");
        }
    }
}
