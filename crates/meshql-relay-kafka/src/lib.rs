//! The Kafka relay: a [`Sink`] that sends meshql's change feed to Apache Kafka.
//!
//! One topic per entity (`<topic_prefix><entity>`, or Debezium's
//! `<topic_prefix>.<db>.<collection>`), message key = the document id, message timestamp =
//! the version's `created_at`, headers `change_id`, `op`, `position` and `correlation_id`
//! (absent when the write had none). The value is the change as `/_changes` publishes it
//! ([`Format::Meshql`]) or a Debezium change event ([`Format::Debezium`], see
//! [`debezium_value`]).
//!
//! The producer is librdkafka's idempotent producer (`enable.idempotence=true`,
//! `acks=all`): within one producer session its own retries neither duplicate nor reorder a
//! partition's messages. [`KafkaSink::enqueue`] puts a batch on the producer's queue in order
//! and returns at once; its confirmation is `Ok` only once the broker acknowledged every
//! message of the batch (the relay keeps several batches in flight meanwhile); otherwise the
//! relay sends that batch and every later one again, so a topic can hold a change more than once (after a failed batch, or a
//! crash before the relay committed): consumers de-duplicate on the `change_id` header.
//!
//! [`KafkaBackend`] registers the relay with the server's relay registry: it owns the fields
//! of a `[[changes.relay]] type = "kafka"` entry ([`KafkaSettings`]: defaults, checks, JSON
//! Schema) and builds the sink from them.
//!
//! librdkafka is compiled from the source bundled with `rdkafka-sys` (its `cmake-build`
//! feature: cmake and a C compiler, no system librdkafka), so the version is the one the
//! bindings were written for; Debian 12's `librdkafka-dev` (2.0) is older than the bindings
//! require for dynamic linking.

use async_trait::async_trait;
use meshql_changes::{Confirmation, RelayChange, Sink, SinkError};
use meshql_core::ChangeOp;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::ClientConfig;
use serde::Serialize;
use serde_json::value::RawValue;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use thiserror::Error;

mod settings;
pub use settings::{
    default_topic_prefix, kafka_topic, KafkaBackend, KafkaFormat, KafkaFormat as Format,
    KafkaSettings, OptionValue, TopicNaming,
};

/// What a Kafka relay needs.
#[derive(Debug, Clone)]
pub struct KafkaSinkConfig {
    /// The relay's name (the producer's `client.id` is `meshql-relay-<name>`).
    pub name: String,
    /// `bootstrap.servers`.
    pub brokers: String,
    pub topic_naming: TopicNaming,
    pub topic_prefix: String,
    /// The database name of Debezium topic names and envelopes.
    pub db: String,
    pub format: Format,
    /// Entity → table (or collection) name, for Debezium names; the entity name otherwise.
    pub tables: HashMap<String, String>,
    /// librdkafka settings that override meshql's.
    pub options: BTreeMap<String, String>,
    /// Whether the relay creates missing topics when it starts ([`KafkaSink::create_topics`]).
    pub create_topics: bool,
}

#[derive(Debug, Error)]
#[error("kafka relay \"{name}\": {message}")]
pub struct KafkaSinkError {
    pub name: String,
    pub message: String,
}

/// The producer settings meshql uses unless `options` says otherwise.
pub const DEFAULTS: &[(&str, &str)] = &[
    ("enable.idempotence", "true"),
    ("acks", "all"),
    ("compression.type", "lz4"),
    ("linger.ms", "5"),
    ("message.timeout.ms", "30000"),
];

/// The client settings of the relay's producer (and of its admin client).
pub(crate) fn client_config(config: &KafkaSinkConfig) -> ClientConfig {
    let mut client = ClientConfig::new();
    client.set("bootstrap.servers", &config.brokers);
    client.set("client.id", format!("meshql-relay-{}", config.name));
    for (key, value) in DEFAULTS {
        client.set(*key, *value);
    }
    for (key, value) in &config.options {
        client.set(key, value);
    }
    client
}

/// Sends changes to Kafka (see the crate docs).
pub struct KafkaSink {
    producer: FutureProducer,
    config: KafkaSinkConfig,
    /// Entity → topic, for the entities of the config (others are named on the fly).
    topics: HashMap<String, String>,
}

impl KafkaSink {
    /// Creates the producer (it connects in the background: a broker that is down now is
    /// not an error, only invalid settings are).
    pub fn new(config: KafkaSinkConfig) -> Result<KafkaSink, KafkaSinkError> {
        let producer: FutureProducer =
            client_config(&config)
                .create()
                .map_err(|e| KafkaSinkError {
                    name: config.name.clone(),
                    message: e.to_string(),
                })?;
        let topics = config
            .tables
            .keys()
            .map(|entity| (entity.clone(), topic_of(&config, entity)))
            .collect();
        Ok(KafkaSink {
            producer,
            config,
            topics,
        })
    }

    /// Creates the topics of the config's entities that do not exist yet, with the broker's
    /// default partitions and replication factor; returns the topics it created. Failures
    /// (a broker that is down, creation not authorised) are logged, not returned: the producer
    /// still publishes, and a broker with `auto.create.topics.enable` creates a topic on its
    /// first message — after about a second in which that message, and the relay's batches
    /// behind it, wait.
    pub async fn create_topics(&self) -> Vec<String> {
        let names = self.topic_names();
        if names.is_empty() {
            return Vec::new();
        }
        let admin: AdminClient<DefaultClientContext> = match client_config(&self.config).create() {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(relay = %self.config.name, error = %e, "kafka relay cannot create its topics");
                return Vec::new();
            }
        };
        // -1: the broker's `num.partitions` and `default.replication.factor` (KIP-464)
        let new: Vec<NewTopic<'_>> = names
            .iter()
            .map(|n| NewTopic::new(n, -1, TopicReplication::Fixed(-1)))
            .collect();
        let options = AdminOptions::new()
            .request_timeout(Some(Duration::from_secs(10)))
            .operation_timeout(Some(Duration::from_secs(10)));
        let results = match admin.create_topics(&new, &options).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(relay = %self.config.name, error = %e, "kafka relay cannot create its topics; the broker may create them on first use");
                return Vec::new();
            }
        };
        let mut created = Vec::new();
        for result in results {
            match result {
                Ok(topic) => created.push(topic),
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((topic, code)) => {
                    tracing::warn!(relay = %self.config.name, %topic, error = %code, "kafka relay cannot create a topic; the broker may create it on first use")
                }
            }
        }
        if !created.is_empty() {
            tracing::info!(relay = %self.config.name, topics = ?created, "kafka relay created its topics");
        }
        created
    }

    /// The topics of the config's entities, sorted, each once.
    fn topic_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.topics.values().cloned().collect();
        names.sort();
        names.dedup();
        names
    }

    /// Readies the relay for its first changes: creates the missing topics (with
    /// `create_topics`), then loads the producer's metadata of every topic. librdkafka's
    /// producer asks for a topic's metadata only at its next periodic scan (every second)
    /// after a message for an unknown topic is queued, so without this the first change of
    /// each entity waited up to a second (measured: 0.8 s), and the relay's batches behind it
    /// with it.
    pub async fn prepare(&self) {
        if self.config.create_topics {
            self.create_topics().await;
        }
        let names = self.topic_names();
        let producer = self.producer.clone();
        let relay = self.config.name.clone();
        let loaded = tokio::task::spawn_blocking(move || {
            for topic in &names {
                if let Err(e) = producer
                    .client()
                    .fetch_metadata(Some(topic), Duration::from_secs(5))
                {
                    // the broker is unreachable: the producer asks again when it sends (and a
                    // blocking thread is not held for every topic in turn)
                    tracing::debug!(%relay, %topic, error = %e, "kafka relay: no metadata for its topics yet");
                    break;
                }
            }
        })
        .await;
        if let Err(e) = loaded {
            tracing::debug!(relay = %self.config.name, error = %e, "kafka relay: loading metadata stopped");
        }
    }

    /// The topic of an entity's changes.
    pub fn topic(&self, entity: &str) -> String {
        match self.topics.get(entity) {
            Some(t) => t.clone(),
            None => topic_of(&self.config, entity),
        }
    }

    /// The message value of a change.
    pub fn value(&self, change: &RelayChange) -> Vec<u8> {
        match self.config.format {
            Format::Meshql => change.json.clone(),
            Format::Debezium => debezium_value(
                change,
                &self.config.topic_prefix,
                &self.config.db,
                self.table(&change.entity),
            ),
        }
    }

    fn table<'a>(&'a self, entity: &'a str) -> &'a str {
        self.config
            .tables
            .get(entity)
            .map(String::as_str)
            .unwrap_or(entity)
    }
}

fn topic_of(config: &KafkaSinkConfig, entity: &str) -> String {
    let table = config
        .tables
        .get(entity)
        .map(String::as_str)
        .unwrap_or(entity);
    kafka_topic(
        config.topic_naming,
        &config.topic_prefix,
        &config.db,
        entity,
        table,
    )
}

/// The stored document of a version, as MeshQL's MongoDB storage keeps it (less `_id`).
#[derive(Serialize)]
struct Document<'a> {
    id: &'a str,
    payload: &'a RawValue,
    created_at: i64,
    deleted: bool,
    authorized_tokens: &'a [String],
}

#[derive(Serialize)]
struct Source<'a> {
    version: &'static str,
    connector: &'static str,
    name: &'a str,
    ts_ms: i64,
    snapshot: &'static str,
    db: &'a str,
    collection: &'a str,
    table: &'a str,
    /// meshql's: the change's position in the service's change log and its stable id.
    position: u64,
    change_id: &'a str,
}

#[derive(Serialize)]
struct Envelope<'a> {
    before: Option<String>,
    after: Option<String>,
    #[serde(rename = "updateDescription")]
    update_description: Option<()>,
    source: Source<'a>,
    op: &'static str,
    ts_ms: i64,
}

/// A Debezium change event for `change`, shaped as the Debezium MongoDB connector emits
/// with a schemaless JSON converter (what MeshQL's CDC processors consume):
///
/// ```text
/// {"before":null,
///  "after":"{\"id\":\"…\",\"payload\":{…},\"created_at\":…,\"deleted\":false,\"authorized_tokens\":[]}",
///  "updateDescription":null,
///  "source":{"version":"meshql-0.1.0","connector":"meshql","name":"<prefix>","ts_ms":…,
///            "snapshot":"false","db":"<db>","collection":"<table>","table":"<table>",
///            "position":N,"change_id":"…"},
///  "op":"c","ts_ms":…}
/// ```
///
/// `after` is a JSON *string* holding the stored document (MeshQL's envelope: `id`,
/// `payload`, `created_at`, `deleted`, `authorized_tokens`), as the MongoDB connector
/// serialises documents; the document's data is `after.payload`. `op` is `c`, `u` or `d`.
/// A delete has `after: null` and `before` = the last version's document (the MongoDB
/// connector with pre-images, or PostgreSQL with `REPLICA IDENTITY FULL`). Both `ts_ms`
/// are the version's `created_at`, so a redelivered change is byte-identical. No tombstone
/// (null-value) message follows a delete.
pub fn debezium_value(change: &RelayChange, prefix: &str, db: &str, table: &str) -> Vec<u8> {
    let document = |deleted: bool| {
        serde_json::to_string(&Document {
            id: &change.id,
            payload: &change.payload,
            created_at: change.created_at,
            deleted,
            authorized_tokens: &change.authorized_tokens,
        })
        .expect("a document serialises")
    };
    let (before, after, op) = match change.op {
        ChangeOp::Create => (None, Some(document(false)), "c"),
        ChangeOp::Update => (None, Some(document(false)), "u"),
        ChangeOp::Delete => (Some(document(false)), None, "d"),
    };
    serde_json::to_vec(&Envelope {
        before,
        after,
        update_description: None,
        source: Source {
            version: concat!("meshql-", env!("CARGO_PKG_VERSION")),
            connector: "meshql",
            name: prefix,
            ts_ms: change.created_at,
            snapshot: "false",
            db,
            collection: table,
            table,
            position: change.position,
            change_id: &change.change_id,
        },
        op,
        ts_ms: change.created_at,
    })
    .expect("an envelope serialises")
}

fn headers(change: &RelayChange) -> OwnedHeaders {
    let position = change.position.to_string();
    let headers = OwnedHeaders::new_with_capacity(4)
        .insert(Header {
            key: "change_id",
            value: Some(change.change_id.as_bytes()),
        })
        .insert(Header {
            key: "op",
            value: Some(change.op.as_str().as_bytes()),
        })
        .insert(Header {
            key: "position",
            value: Some(position.as_bytes()),
        });
    match &change.correlation_id {
        Some(c) => headers.insert(Header {
            key: "correlation_id",
            value: Some(c.as_bytes()),
        }),
        None => headers,
    }
}

#[async_trait]
impl Sink for KafkaSink {
    fn kind(&self) -> &'static str {
        "kafka"
    }

    /// Enqueues every record on the producer; the confirmation awaits their delivery reports.
    async fn enqueue(&self, batch: &[RelayChange]) -> Result<Confirmation, SinkError> {
        let mut deliveries = Vec::with_capacity(batch.len());
        for change in batch {
            let topic = self.topic(&change.entity);
            let value = self.value(change);
            let mut record = FutureRecord::to(&topic)
                .key(change.id.as_bytes())
                .payload(&value)
                .timestamp(change.created_at)
                .headers(headers(change));
            // enqueue in order; a full local queue waits for deliveries to make room
            loop {
                match self.producer.send_result(record) {
                    Ok(delivery) => {
                        deliveries.push(delivery);
                        break;
                    }
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                        record = r;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err((e, _)) => {
                        return Err(SinkError::new(format!("enqueueing for {topic}: {e}")))
                    }
                }
            }
        }
        Ok(Box::pin(async move {
            let mut first_error = None;
            for delivery in deliveries {
                let failure = match delivery.await {
                    Ok(Ok(_)) => None,
                    Ok(Err((e, _))) => Some(e.to_string()),
                    Err(_) => Some("the producer dropped the message".to_owned()),
                };
                if let Some(f) = failure {
                    first_error.get_or_insert(f);
                }
            }
            match first_error {
                None => Ok(()),
                Some(e) => Err(SinkError::new(format!("delivery to Kafka failed: {e}"))),
            }
        }))
    }

    async fn close(&self) {
        let producer = self.producer.clone();
        let flushed =
            tokio::task::spawn_blocking(move || producer.flush(Duration::from_secs(5))).await;
        if let Ok(Err(e)) = flushed {
            tracing::warn!(relay = %self.config.name, error = %e, "kafka producer not flushed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn change(op: &str) -> RelayChange {
        let json = format!(
            r#"{{"position":7,"change_id":"hen:h1:1700000000123","entity":"hen","id":"h1","created_at":1700000000123,"op":"{op}","authorized_tokens":["a"],"correlation_id":"c-1","source":"0.1","payload":{{"name":"chuck","id":"h1"}}}}"#
        );
        RelayChange::parse(7, 1_700_000_000_200, json.into_bytes()).unwrap()
    }

    #[test]
    fn debezium_values_follow_the_mongodb_connector() {
        let v: Value =
            serde_json::from_slice(&debezium_value(&change("create"), "events", "db1", "hens"))
                .unwrap();
        assert_eq!(v["op"], "c");
        assert!(v["before"].is_null());
        let after: Value = serde_json::from_str(v["after"].as_str().unwrap()).unwrap();
        assert_eq!(after["id"], "h1");
        assert_eq!(after["payload"]["name"], "chuck");
        assert_eq!(after["deleted"], false);
        assert_eq!(after["authorized_tokens"][0], "a");
        assert_eq!(v["source"]["name"], "events");
        assert_eq!(v["source"]["db"], "db1");
        assert_eq!(v["source"]["collection"], "hens");
        assert_eq!(v["source"]["ts_ms"], 1_700_000_000_123_i64);
        assert_eq!(v["source"]["change_id"], "hen:h1:1700000000123");
        assert_eq!(v["ts_ms"], 1_700_000_000_123_i64);

        let v: Value =
            serde_json::from_slice(&debezium_value(&change("update"), "p", "d", "t")).unwrap();
        assert_eq!(v["op"], "u");
        let v: Value =
            serde_json::from_slice(&debezium_value(&change("delete"), "p", "d", "t")).unwrap();
        assert_eq!(v["op"], "d");
        assert!(v["after"].is_null());
        let before: Value = serde_json::from_str(v["before"].as_str().unwrap()).unwrap();
        assert_eq!(before["payload"]["name"], "chuck");
    }

    #[test]
    fn topics_follow_the_naming() {
        let mut config = KafkaSinkConfig {
            name: "k".into(),
            brokers: "127.0.0.1:1".into(),
            topic_naming: TopicNaming::Entity,
            topic_prefix: "meshql.".into(),
            db: "eggs".into(),
            format: Format::Meshql,
            tables: HashMap::from([("hen".to_owned(), "hens".to_owned())]),
            options: BTreeMap::new(),
            create_topics: false,
        };
        let sink = KafkaSink::new(config.clone()).unwrap();
        assert_eq!(sink.topic("hen"), "meshql.hen");
        assert_eq!(sink.topic("gone"), "meshql.gone");
        config.topic_naming = TopicNaming::Debezium;
        config.topic_prefix = "events".into();
        let sink = KafkaSink::new(config.clone()).unwrap();
        assert_eq!(sink.topic("hen"), "events.eggs.hens");
        config.options.insert("no.such.setting".into(), "1".into());
        let e = KafkaSink::new(config).err().expect("rejected");
        assert!(e.to_string().contains("no.such.setting"), "{e}");
    }
}
