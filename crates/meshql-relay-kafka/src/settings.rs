//! `[[changes.relay]] type = "kafka"`: the entry's fields and their registration.

use crate::{KafkaSink, KafkaSinkConfig};
use async_trait::async_trait;
use meshql_changes::{RelayContext, RelayTarget, Relays, Sink};
use meshql_core::Component;
use meshql_core::SettingError;
use schemars::JsonSchema;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Kafka (librdkafka: idempotent producer, `acks=all`): one topic per entity, created when
/// the relay starts if missing (`create_topics`); message key = the document id; headers
/// `change_id`, `op`, `position`, `correlation_id`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KafkaSettings {
    /// Bootstrap servers, `host:port[,host:port...]`.
    pub brokers: String,
    /// Prefix of topic names. `topic_naming = "entity"`: topics are
    /// `<topic_prefix><entity>` (default `meshql.`). `topic_naming = "debezium"`: it is
    /// Debezium's `topic.prefix` and topics are `<topic_prefix>.<db>.<collection>` (default
    /// `meshql`).
    #[serde(default)]
    pub topic_prefix: Option<String>,
    /// How topics are named (default `entity`).
    #[serde(default)]
    pub topic_naming: TopicNaming,
    /// The database name in Debezium-style topic names and in the Debezium envelope's
    /// `source.db` (default `meshql`; MeshQL's examples use `<prefix>_<env>`, e.g.
    /// `events_development`).
    #[serde(default = "default_db")]
    pub db: String,
    /// The message value, `meshql` (default: the change as `/_changes` serves it) or
    /// `debezium` (a Debezium MongoDB-connector change event, as MeshQL's CDC processors read
    /// it).
    #[serde(default)]
    pub format: KafkaFormat,
    /// Extra librdkafka producer settings, e.g. `"linger.ms" = 20`; they override meshql's
    /// (`enable.idempotence = true`, `acks = all`, `compression.type = lz4`, `linger.ms = 5`,
    /// `message.timeout.ms = 30000`). One this build's librdkafka cannot take (no TLS, SASL,
    /// gzip or zstd) is refused when the config is checked.
    #[serde(default)]
    pub options: BTreeMap<String, OptionValue>,
    /// Create the entities' topics that do not exist yet when the relay starts (default
    /// `true`; the broker's default partitions and replication factor). Without it the first
    /// change of an entity waits while the broker auto-creates the topic
    /// (`auto.create.topics.enable`), about a second, and the batches behind it wait too.
    /// `false` where topics are provisioned by the operator (a refused creation is only
    /// logged).
    #[serde(default = "yes")]
    pub create_topics: bool,
}

fn yes() -> bool {
    true
}

fn default_db() -> String {
    "meshql".into()
}

/// See `topic_prefix`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TopicNaming {
    /// `<topic_prefix><entity>`
    #[default]
    Entity,
    /// `<topic_prefix>.<db>.<collection>` (the entity's `table`), as Debezium names topics.
    Debezium,
}

/// See `format`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum KafkaFormat {
    #[default]
    Meshql,
    Debezium,
}

/// A librdkafka setting's value, written as TOML text, number or boolean.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum OptionValue {
    Bool(bool),
    Integer(i64),
    Float(f64),
    Text(String),
}

impl std::fmt::Display for OptionValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OptionValue::Bool(b) => write!(f, "{b}"),
            OptionValue::Integer(i) => write!(f, "{i}"),
            OptionValue::Float(x) => write!(f, "{x}"),
            OptionValue::Text(t) => f.write_str(t),
        }
    }
}

/// The Kafka topic of an entity's changes (`table` is the entity's table or collection).
pub fn kafka_topic(
    naming: TopicNaming,
    prefix: &str,
    db: &str,
    entity: &str,
    table: &str,
) -> String {
    match naming {
        TopicNaming::Entity => format!("{prefix}{entity}"),
        TopicNaming::Debezium => format!("{prefix}.{db}.{table}"),
    }
}

/// The default `topic_prefix` of a topic naming.
pub fn default_topic_prefix(naming: TopicNaming) -> &'static str {
    match naming {
        TopicNaming::Entity => "meshql.",
        TopicNaming::Debezium => "meshql",
    }
}

fn kafka_name_chars(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Registers the Kafka relay with a relay registry.
#[derive(Debug, Default, Clone, Copy)]
pub struct KafkaBackend;

impl Component<Relays> for KafkaBackend {
    const KIND: &'static str = "kafka";
    type Settings = KafkaSettings;

    const REQUIRED: &'static [(&'static str, &'static str)] =
        &[("brokers", "a kafka relay needs `brokers = \"host:port\"`")];

    fn build(
        &self,
        settings: KafkaSettings,
        context: &RelayContext<'_>,
    ) -> Result<Box<dyn RelayTarget>, SettingError> {
        Ok(Box::new(KafkaTarget(sink_config(settings, context)?)))
    }
}

/// Checks an entry's fields into what the sink needs.
fn sink_config(
    settings: KafkaSettings,
    context: &RelayContext<'_>,
) -> Result<KafkaSinkConfig, SettingError> {
    if settings.brokers.trim().is_empty() {
        return Err(SettingError::new(
            "brokers",
            "name at least one `host:port`",
        ));
    }
    let naming = settings.topic_naming;
    let prefix = settings
        .topic_prefix
        .unwrap_or_else(|| default_topic_prefix(naming).to_owned());
    let db = settings.db;
    let invalid = "Kafka topic names use only letters, digits, `.`, `_` and `-`";
    if !kafka_name_chars(&prefix) {
        return Err(SettingError::new(
            "topic_prefix",
            format!("`{prefix}`: {invalid}"),
        ));
    }
    if db.is_empty() || !kafka_name_chars(&db) {
        return Err(SettingError::new("db", format!("`{db}`: {invalid}")));
    }
    for e in context.entities {
        let topic = kafka_topic(naming, &prefix, &db, e.name, e.table);
        if topic.len() > 249 || !kafka_name_chars(&topic) {
            return Err(SettingError::new(
                "topic_naming",
                format!(
                    "entity \"{}\" would publish to `{topic}`, which is not a valid Kafka topic name ({invalid}; at most 249)",
                    e.name
                ),
            ));
        }
    }
    let mut options = BTreeMap::new();
    for (key, value) in settings.options {
        if matches!(key.as_str(), "bootstrap.servers" | "metadata.broker.list") {
            return Err(SettingError::new(
                "options",
                format!("`{key}` is set by `brokers`"),
            ));
        }
        options.insert(key, value.to_string());
    }
    let config = KafkaSinkConfig {
        name: context.name.to_owned(),
        brokers: settings.brokers,
        topic_naming: naming,
        topic_prefix: prefix,
        db,
        format: settings.format,
        tables: context
            .entities
            .iter()
            .map(|e| (e.name.to_owned(), e.table.to_owned()))
            .collect(),
        options,
        create_topics: settings.create_topics,
    };
    // what librdkafka would refuse when the relay starts is refused now (`meshql check`):
    // the producer's properties, checked without making a client
    crate::client_config(&config)
        .create_native_config()
        .map_err(|e| SettingError::new("options", e.to_string()))?;
    Ok(config)
}

#[derive(Debug)]
struct KafkaTarget(KafkaSinkConfig);

#[async_trait]
impl RelayTarget for KafkaTarget {
    async fn sink(&self) -> Result<Arc<dyn Sink>, Box<dyn std::error::Error + Send + Sync>> {
        let sink = Arc::new(KafkaSink::new(self.0.clone())?);
        // in the background: a broker that is down must not hold up the server's start
        let preparing = sink.clone();
        tokio::spawn(async move { preparing.prepare().await });
        Ok(sink)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshql_changes::RelayEntity;
    use serde_json::json;

    const ENTITIES: &[RelayEntity<'static>] = &[
        RelayEntity {
            name: "hen",
            table: "hen",
        },
        RelayEntity {
            name: "coop",
            table: "coops",
        },
    ];

    fn check(settings: serde_json::Value) -> Result<KafkaSinkConfig, SettingError> {
        sink_config(
            KafkaBackend.parse(&settings)?,
            &RelayContext {
                name: "k1",
                entities: ENTITIES,
                data_dir: std::path::Path::new("/tmp"),
            },
        )
    }

    fn rejected(settings: serde_json::Value) -> (String, String) {
        let e = check(settings).expect_err("rejected");
        (e.field.unwrap_or_default(), e.message)
    }

    #[test]
    fn settings_resolve_with_their_defaults() {
        let c = check(json!({
            "brokers": "127.0.0.1:9092",
            "topic_naming": "debezium",
            "db": "eggs_development",
            "format": "debezium",
            "options": { "linger.ms": 20, "compression.type": "snappy", "enable.idempotence": true },
        }))
        .unwrap();
        assert_eq!(c.name, "k1");
        assert_eq!(c.brokers, "127.0.0.1:9092");
        assert_eq!(c.topic_prefix, "meshql");
        assert_eq!(c.topic_naming, TopicNaming::Debezium);
        assert_eq!(c.db, "eggs_development");
        assert_eq!(c.format, KafkaFormat::Debezium);
        assert_eq!(c.options["linger.ms"], "20");
        assert_eq!(c.options["compression.type"], "snappy");
        assert_eq!(c.options["enable.idempotence"], "true");
        assert_eq!(c.tables["coop"], "coops");

        let c = check(json!({ "brokers": "h:1" })).unwrap();
        assert_eq!(c.topic_prefix, "meshql.");
        assert_eq!(c.topic_naming, TopicNaming::Entity);
        assert_eq!(c.db, "meshql");
        assert_eq!(c.format, KafkaFormat::Meshql);
        assert!(c.options.is_empty());
    }

    #[test]
    fn topics_follow_the_naming() {
        assert_eq!(
            kafka_topic(
                TopicNaming::Debezium,
                "meshql",
                "eggs_development",
                "coop",
                "coops"
            ),
            "meshql.eggs_development.coops"
        );
        assert_eq!(
            kafka_topic(TopicNaming::Entity, "meshql.", "x", "hen", "hen"),
            "meshql.hen"
        );
    }

    #[test]
    fn bad_values_name_the_field() {
        for (settings, field, words) in [
            (json!({}), "brokers", "needs `brokers = \"host:port\"`"),
            (
                json!({ "brokers": " " }),
                "brokers",
                "at least one `host:port`",
            ),
            (
                json!({ "brokers": "h:1", "db": "eggs development" }),
                "db",
                "`eggs development`: Kafka topic names use only",
            ),
            (
                json!({ "brokers": "h:1", "db": "" }),
                "db",
                "Kafka topic names",
            ),
            (
                json!({ "brokers": "h:1", "topic_prefix": "a b." }),
                "topic_prefix",
                "`a b.`: Kafka topic names use only",
            ),
            (
                json!({ "brokers": "h:1", "options": { "bootstrap.servers": "x:1" } }),
                "options",
                "`bootstrap.servers` is set by `brokers`",
            ),
            (
                json!({ "brokers": "h:1", "options": { "metadata.broker.list": "x:1" } }),
                "options",
                "`metadata.broker.list` is set by `brokers`",
            ),
            (
                json!({ "brokers": "h:1", "format": "avro" }),
                "format",
                "unknown variant `avro`",
            ),
            (
                json!({ "brokers": "h:1", "options": { "linger.ms": [1] } }),
                "options.linger.ms",
                "",
            ),
            (
                json!({ "brokers": "h:1", "colour": "red" }),
                "colour",
                "unknown field `colour`",
            ),
            (json!({ "brokers": 9092 }), "brokers", "invalid type"),
        ] {
            let (f, message) = rejected(settings.clone());
            assert_eq!(f, field, "{settings}: {message}");
            assert!(message.contains(words), "{settings}: {message}");
        }
    }

    #[test]
    fn options_librdkafka_refuses_are_refused_at_check() {
        let (field, message) =
            rejected(json!({ "brokers": "h:1", "options": {"linger.ms": "soon"} }));
        assert_eq!(field, "options");
        assert!(message.contains("linger.ms"), "{message}");
        let (field, message) =
            rejected(json!({ "brokers": "h:1", "options": {"no.such.property": 1} }));
        assert_eq!(field, "options");
        assert!(message.contains("no.such.property"), "{message}");
        // this build's librdkafka has no zstd: said at check, not when the relay starts
        let (field, message) =
            rejected(json!({ "brokers": "h:1", "options": {"compression.type": "zstd"} }));
        assert_eq!(field, "options");
        assert!(message.contains("zstd"), "{message}");
    }

    #[test]
    fn topics_must_be_valid_kafka_names() {
        let long = "c".repeat(250);
        let e = sink_config(
            KafkaBackend
                .parse(&json!({ "brokers": "h:1", "topic_naming": "debezium" }))
                .unwrap(),
            &RelayContext {
                name: "k1",
                entities: &[RelayEntity {
                    name: "coop",
                    table: &long,
                }],
                data_dir: std::path::Path::new("/tmp"),
            },
        )
        .expect_err("rejected");
        assert_eq!(e.field.as_deref(), Some("topic_naming"));
        assert!(e.message.contains("entity \"coop\""), "{}", e.message);
        assert!(e.message.contains("at most 249"), "{}", e.message);
    }

    #[test]
    fn the_schema_describes_the_fields() {
        let s = Component::<Relays>::schema(&KafkaBackend);
        assert_eq!(s["required"], json!(["brokers"]));
        assert!(s["properties"]["topic_naming"].is_object(), "{s}");
        assert!(s["description"].as_str().unwrap().contains("librdkafka"));
    }
}
