//! The entities' topics, made or checked at start.
//!
//! A Kafka store's topics must keep every version for as long as the topic exists — `at`
//! reads any of them, and a new process builds its materialisation from the start — and must
//! keep a document's versions on one partition. So, for each entity's topic:
//!
//! - a missing topic is made (with `create_topics`; otherwise it is an error) with
//!   `partitions`, `replication_factor`, `cleanup.policy=delete`, `retention.ms=-1` and
//!   `retention.bytes=-1`;
//! - an existing one is refused when compaction is on (`cleanup.policy` with `compact`: older
//!   versions of a key would be dropped) or when time or size retention is set (`retention.ms`
//!   or `retention.bytes` other than -1: the oldest versions would be deleted). These are what
//!   an operator must not change on a meshql topic; the error names the topic, the setting
//!   and the command that puts it right.
//!
//! The partition count of each topic is returned: the materialisation records it, and a count
//! that changed under it (a document's later versions could then land on another partition,
//! out of order with its earlier ones) stops the store at its next start.

use crate::settings::KafkaStorage;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::ClientConfig;
use std::collections::BTreeMap;
use std::time::Duration;

/// Why the topics cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    #[error("the Kafka brokers {brokers} cannot be reached: {reason}")]
    Unreachable { brokers: String, reason: String },
    #[error("topic {topic} does not exist (create_topics = false)")]
    Missing { topic: String },
    #[error("topic {topic} cannot be made: {reason}")]
    NotMade { topic: String, reason: String },
    #[error(
        "topic {topic} has {setting}={value}: {why}; a meshql topic keeps every version \
         (kafka-configs.sh --alter --entity-type topics --entity-name {topic} --add-config {fix})"
    )]
    Loses {
        topic: String,
        setting: &'static str,
        value: String,
        why: &'static str,
        fix: &'static str,
    },
}

/// How long an admin request may take.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(15);

/// A client of the brokers with the consumer's properties (they carry `options`: TLS, SASL).
fn client_config(storage: &KafkaStorage) -> ClientConfig {
    let mut config = ClientConfig::new();
    for (k, v) in &storage.consumer {
        config.set(k, v);
    }
    config.set("bootstrap.servers", &storage.brokers);
    config
}

fn admin(storage: &KafkaStorage) -> Result<AdminClient<DefaultClientContext>, TopicError> {
    client_config(storage)
        .create()
        .map_err(|e| TopicError::Unreachable {
            brokers: storage.brokers.clone(),
            reason: e.to_string(),
        })
}

/// Makes the missing topics of `entities` and checks every one; returns each topic's
/// partition count.
pub async fn ensure(
    storage: &KafkaStorage,
    entities: &[String],
) -> Result<BTreeMap<String, usize>, TopicError> {
    let admin = admin(storage)?;
    let options = AdminOptions::new()
        .request_timeout(Some(ADMIN_TIMEOUT))
        .operation_timeout(Some(ADMIN_TIMEOUT));
    let topics: Vec<String> = entities.iter().map(|e| storage.topic_of(e)).collect();
    let existing = partitions(storage, &topics).await?;
    let missing: Vec<&String> = topics
        .iter()
        .filter(|t| !existing.contains_key(*t))
        .collect();
    if !missing.is_empty() {
        if !storage.create_topics {
            return Err(TopicError::Missing {
                topic: missing[0].clone(),
            });
        }
        let new: Vec<NewTopic<'_>> = missing
            .iter()
            .map(|t| {
                NewTopic::new(
                    t,
                    storage.partitions as i32,
                    TopicReplication::Fixed(i32::from(storage.replication_factor)),
                )
                .set("cleanup.policy", "delete")
                .set("retention.ms", "-1")
                .set("retention.bytes", "-1")
            })
            .collect();
        let results =
            admin
                .create_topics(&new, &options)
                .await
                .map_err(|e| TopicError::Unreachable {
                    brokers: storage.brokers.clone(),
                    reason: e.to_string(),
                })?;
        for r in results {
            match r {
                Ok(_) => {}
                // made meanwhile by another process: checked below like any other
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((topic, code)) => {
                    return Err(TopicError::NotMade {
                        topic,
                        reason: code.to_string(),
                    })
                }
            }
        }
    }
    for topic in &topics {
        let settings = settings_of(&admin, storage, topic, &options).await?;
        let value = |name: &str| settings.get(name).cloned().unwrap_or_default();
        let policy = value("cleanup.policy");
        if policy.contains("compact") {
            return Err(TopicError::Loses {
                topic: topic.clone(),
                setting: "cleanup.policy",
                value: policy,
                why: "compaction drops a document's older versions",
                fix: "cleanup.policy=delete",
            });
        }
        for (setting, why, fix) in [
            (
                "retention.ms",
                "time retention deletes the oldest versions",
                "retention.ms=-1",
            ),
            (
                "retention.bytes",
                "size retention deletes the oldest versions",
                "retention.bytes=-1",
            ),
        ] {
            let v = value(setting);
            if v != "-1" {
                return Err(TopicError::Loses {
                    topic: topic.clone(),
                    setting,
                    value: v,
                    why,
                    fix,
                });
            }
        }
    }
    let counts = partitions(storage, &topics).await?;
    topics
        .into_iter()
        .map(|t| match counts.get(&t) {
            Some(n) => Ok((t, *n)),
            None => Err(TopicError::Missing { topic: t }),
        })
        .collect()
}

/// The settings of `topic` this check reads. A topic just made may not show them at once:
/// they are asked for again, briefly, until they do.
async fn settings_of(
    admin: &AdminClient<DefaultClientContext>,
    storage: &KafkaStorage,
    topic: &str,
    options: &AdminOptions,
) -> Result<BTreeMap<String, String>, TopicError> {
    const READ: [&str; 3] = ["cleanup.policy", "retention.ms", "retention.bytes"];
    let mut last = String::new();
    for _ in 0..25 {
        let described = admin
            .describe_configs(&[ResourceSpecifier::Topic(topic)], options)
            .await
            .map_err(|e| TopicError::Unreachable {
                brokers: storage.brokers.clone(),
                reason: e.to_string(),
            })?;
        match described.into_iter().next() {
            Some(Ok(resource)) => {
                let found: BTreeMap<String, String> = READ
                    .iter()
                    .filter_map(|k| Some((k.to_string(), resource.get(k)?.value.clone()?)))
                    .collect();
                if found.len() == READ.len() {
                    return Ok(found);
                }
                last = format!("it shows {} of {}", found.len(), READ.join(", "));
            }
            Some(Err(code)) => last = code.to_string(),
            None => last = "no answer".into(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(TopicError::NotMade {
        topic: topic.to_owned(),
        reason: format!("its settings cannot be read: {last}"),
    })
}

/// The partition counts of those of `topics` that exist.
async fn partitions(
    storage: &KafkaStorage,
    topics: &[String],
) -> Result<BTreeMap<String, usize>, TopicError> {
    let config = client_config(storage);
    let wanted: Vec<String> = topics.to_vec();
    let brokers = storage.brokers.clone();
    let unreachable = move |reason: String| TopicError::Unreachable {
        brokers: brokers.clone(),
        reason,
    };
    let fetched = tokio::task::spawn_blocking(move || {
        let client: BaseConsumer = config.create().map_err(|e| e.to_string())?;
        let metadata = client
            .fetch_metadata(None, ADMIN_TIMEOUT)
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(
            metadata
                .topics()
                .iter()
                .filter(|t| wanted.iter().any(|w| w == t.name()) && t.error().is_none())
                .map(|t| (t.name().to_owned(), t.partitions().len()))
                .collect::<BTreeMap<_, _>>(),
        )
    })
    .await
    .map_err(|e| unreachable(e.to_string()))?;
    fetched.map_err(unreachable)
}

/// Whether a broker answers a metadata request within `timeout`: a start with the brokers
/// away learns it at once instead of after the admin requests' 15 s.
pub async fn reachable(storage: &KafkaStorage, timeout: Duration) -> bool {
    let config = client_config(storage);
    tokio::task::spawn_blocking(move || {
        config
            .create::<BaseConsumer>()
            .is_ok_and(|client| client.fetch_metadata(None, timeout).is_ok())
    })
    .await
    .unwrap_or(false)
}

/// The offset after the last committed record of each of `topic`'s `partitions` partitions
/// (the last stable offset, as a `read_committed` reader sees the end): what a process
/// starting up reads to before it serves.
pub async fn end_offsets(
    storage: &KafkaStorage,
    topic: &str,
    partitions: usize,
) -> Result<Vec<i64>, TopicError> {
    let mut config = client_config(storage);
    config.set("isolation.level", "read_committed");
    let topic = topic.to_owned();
    let brokers = storage.brokers.clone();
    let unreachable = move |reason: String| TopicError::Unreachable {
        brokers: brokers.clone(),
        reason,
    };
    let fetched = tokio::task::spawn_blocking(move || {
        let client: BaseConsumer = config.create().map_err(|e| e.to_string())?;
        (0..partitions as i32)
            .map(|p| {
                client
                    .fetch_watermarks(&topic, p, ADMIN_TIMEOUT)
                    .map(|(_, high)| high)
                    .map_err(|e| e.to_string())
            })
            .collect::<Result<Vec<i64>, String>>()
    })
    .await
    .map_err(|e| unreachable(e.to_string()))?;
    fetched.map_err(unreachable)
}
