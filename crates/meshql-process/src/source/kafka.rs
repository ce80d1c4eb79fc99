//! Kafka topics as a processor's input (`source = { type = "kafka", … }`), so that a
//! MeshQL/Debezium pipeline can point at meshql unchanged.
//!
//! ```toml
//! [[processor]]
//! name = "events-processor"
//! type = "rust"
//! function = "events.enrich"
//! inputs = ["event"]
//! output = "processedevent"
//! source = { type = "kafka", brokers = "127.0.0.1:9092", topics = ["events.events_development.event"] }
//! ```
//!
//! Formats (`format`, [`crate::envelope`]): `debezium` (default) — Debezium change events;
//! `meshql` — the changes a meshql Kafka relay publishes. The entity of a message:
//! `entities = { "<topic>" = "<entity>" }`, else the envelope's, else the topic's last
//! segment.
//!
//! **Exactly once.** Each partition's next offset is a state row of the processor
//! (`kafka/<topic>/<partition>`), committed with the batch's outputs in one transaction; at
//! start the consumer is *assigned* its partitions at those offsets (the beginning for the
//! others), so a restart — after `kill -9` or a broker restart — reads on where the outputs
//! stopped, whatever Kafka's own group offsets say. A broker that is down is retried with
//! backoff; the processor's `errors` count meanwhile.

use crate::plan::Input;
use crate::plan::Item;
use crate::source::contract::{Intake, SourceKind, SourceRun, SourceType};
pub use crate::source::envelope::Format;
use crate::source::envelope::{self, Origin};
use meshql_core::{SettingError, StateWrite};
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

fn debezium() -> Format {
    Format::Debezium
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    brokers: String,
    topics: Vec<String>,
    #[serde(default = "debezium")]
    format: Format,
    #[serde(default)]
    entities: BTreeMap<String, String>,
    /// librdkafka consumer properties passed through.
    #[serde(default)]
    options: BTreeMap<String, Value>,
}

/// A checked Kafka source.
#[derive(Debug, Clone, PartialEq)]
pub struct KafkaSource {
    pub brokers: String,
    pub topics: Vec<String>,
    pub format: Format,
    pub entities: BTreeMap<String, String>,
    pub options: BTreeMap<String, String>,
}

impl SourceKind for KafkaSource {
    const KIND: &'static str = "kafka";
    type Settings = Settings;

    fn check(s: Settings) -> Result<Self, SettingError> {
        if s.brokers.trim().is_empty() {
            return Err(SettingError::new(
                "source.brokers",
                "name at least one broker",
            ));
        }
        if s.topics.is_empty() {
            return Err(SettingError::new(
                "source.topics",
                "name at least one topic",
            ));
        }
        let options = s
            .options
            .into_iter()
            .map(|(k, v)| {
                let text = match v {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
                (k, text)
            })
            .collect::<BTreeMap<String, String>>();
        // what librdkafka would refuse when the source starts is refused now (`meshql check`)
        let mut probe = ClientConfig::new();
        probe.set("bootstrap.servers", &s.brokers);
        for (k, v) in &options {
            probe.set(k, v);
        }
        probe
            .create_native_config()
            .map_err(|e| SettingError::new("source.options", e.to_string()))?;
        Ok(KafkaSource {
            brokers: s.brokers,
            topics: s.topics,
            format: s.format,
            entities: s.entities,
            options,
        })
    }

    async fn read(self, run: SourceRun) {
        read(self, run).await
    }
}

/// Registers the source (`type = "kafka"`).
pub type KafkaSourceType = SourceType<KafkaSource>;

fn offset_key(topic: &str, partition: i32) -> String {
    format!("kafka/{topic}/{partition}")
}

/// One message as an input (`Err`: why it cannot be read).
pub(crate) fn input_of(
    source: &KafkaSource,
    topic: &str,
    partition: i32,
    offset: i64,
    timestamp: Option<i64>,
    value: &[u8],
    position: u64,
) -> Result<Input, String> {
    envelope::input_of(
        source.format,
        &source.entities,
        Origin {
            channel: topic,
            at: format!("{topic}:{partition}:{offset}"),
            timestamp,
            position,
        },
        value,
    )
}

/// Reads the topics into `handler` until `stop`.
async fn read(source: KafkaSource, run: SourceRun) {
    let SourceRun {
        name,
        inputs,
        batch,
        intake: handler,
        counters,
        mut stop,
    } = run;
    let mut failures: u32 = 0;
    'connect: loop {
        if *stop.borrow() {
            return;
        }
        if failures > 0 {
            // at most 3.2 s: a topic that does not exist yet (a relay creates it with its first
            // message) is found soon after it appears
            let delay = Duration::from_millis(100 * (1u64 << failures.min(5)));
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = stop.changed() => return,
            }
        }
        let consumer = match connect(&name, &source, handler.as_ref()).await {
            Ok(c) => c,
            Err(e) => {
                failures += 1;
                counters.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(processor = %name, error = %e, "kafka source cannot start; retrying");
                continue;
            }
        };
        let mut position = handler.position();
        let mut lag_checked = std::time::Instant::now();
        loop {
            let first = tokio::select! {
                m = consumer.recv() => m,
                _ = stop.changed() => return,
            };
            type Owned = (String, i32, i64, Option<i64>, Option<Vec<u8>>);
            fn take(messages: &mut Vec<Owned>, m: rdkafka::message::BorrowedMessage<'_>) {
                messages.push((
                    m.topic().to_owned(),
                    m.partition(),
                    m.offset(),
                    m.timestamp().to_millis(),
                    m.payload().map(<[u8]>::to_vec),
                ));
            }
            let mut messages: Vec<Owned> = Vec::with_capacity(batch);
            match first {
                Ok(m) => take(&mut messages, m),
                Err(e) if needs_reconnect(&e) => {
                    failures += 1;
                    counters.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(processor = %name, error = %e, "kafka source: receiving failed; reconnecting");
                    continue 'connect;
                }
                Err(e) => {
                    counters.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(processor = %name, error = %e, "kafka source: the consumer reported an error; it retries by itself");
                    continue;
                }
            }
            while messages.len() < batch {
                match tokio::time::timeout(Duration::from_millis(2), consumer.recv()).await {
                    Ok(Ok(m)) => take(&mut messages, m),
                    _ => break,
                }
            }
            let mut items = Vec::with_capacity(messages.len());
            let mut letters = Vec::new();
            let mut next: HashMap<(String, i32), i64> = HashMap::new();
            for (topic, partition, offset, timestamp, value) in &messages {
                let (partition, offset) = (*partition, *offset);
                position += 1;
                next.insert((topic.clone(), partition), offset + 1);
                let Some(value) = value else {
                    continue; // a tombstone (null value) after a Debezium delete: nothing
                };
                // the message's text, copied only for a dead letter
                let raw = String::from_utf8_lossy(value);
                match input_of(
                    &source, topic, partition, offset, *timestamp, value, position,
                ) {
                    Ok(input) if inputs.contains(&input.entity) => items.push(Item { input, raw }),
                    Ok(_) => {} // another entity's change on the topic
                    Err(reason) => letters.push(meshql_core::DeadLetter {
                        position,
                        change_id: format!("{topic}:{partition}:{offset}"),
                        entity: source
                            .entities
                            .get(topic)
                            .cloned()
                            .unwrap_or_else(|| topic.clone()),
                        reason,
                        input: raw.into_owned(),
                        at: meshql_core::now_millis(),
                    }),
                }
            }
            let extra = next
                .iter()
                .map(|((t, p), o)| StateWrite {
                    key: offset_key(t, *p),
                    group: None,
                    value: Some(o.to_string()),
                })
                .collect();
            if let Err(e) = handler.apply(items, letters, position, extra).await {
                failures += 1;
                counters.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(processor = %name, error = %e.0, "kafka source: a batch failed; reading it again");
                // the store did not take the batch: start again from its offsets
                continue 'connect;
            }
            failures = 0;
            if lag_checked.elapsed() > Duration::from_secs(1) {
                lag_checked = std::time::Instant::now();
                counters.lag.store(lag(&consumer), Ordering::Relaxed);
            }
        }
    }
}

/// Messages after the consumer's positions, over its assigned partitions, from the high
/// watermarks librdkafka cached from its last fetch responses (no broker round trip: a
/// `fetch_watermarks` probe per partition stalled the thread it ran on, and its timed-out
/// requests came back to the consumer as errors).
fn lag(consumer: &StreamConsumer) -> u64 {
    let Ok(assigned) = consumer.assignment() else {
        return 0;
    };
    let Ok(positions) = consumer.position() else {
        return 0;
    };
    let client = consumer.client().native_ptr();
    let mut total = 0u64;
    for e in assigned.elements() {
        let Ok(topic) = std::ffi::CString::new(e.topic()) else {
            continue;
        };
        let (mut low, mut high) = (-1i64, -1i64);
        // SAFETY: `client` is the live handle of `consumer`, borrowed for this call; the topic
        // is a NUL-terminated string that outlives it; librdkafka only reads its cache.
        let err = unsafe {
            rdkafka_sys::rd_kafka_get_watermark_offsets(
                client,
                topic.as_ptr(),
                e.partition(),
                &mut low,
                &mut high,
            )
        };
        if err != rdkafka_sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || high < 0 {
            continue; // nothing fetched from this partition yet
        }
        let at = positions
            .find_partition(e.topic(), e.partition())
            .and_then(|p| match p.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            })
            .unwrap_or(high);
        total += (high - at).max(0) as u64;
    }
    total
}

/// Whether a consumer error needs a new consumer (assigned again from the stored offsets):
/// a fatal error, or a topic or partition that went away. Anything else (a timed-out request,
/// a broker connection that dropped) librdkafka recovers from by itself; tearing the consumer
/// down for it cost a reconnect and a fresh fetch session each time.
fn needs_reconnect(e: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::error::{KafkaError, RDKafkaErrorCode as C};
    match e {
        KafkaError::MessageConsumptionFatal(_) => true,
        KafkaError::MessageConsumption(code) => matches!(
            code,
            C::UnknownTopicOrPartition
                | C::UnknownTopic
                | C::UnknownPartition
                | C::OffsetOutOfRange
                | C::Fatal
        ),
        _ => true,
    }
}

/// A consumer assigned every partition of the topics at the offsets the output committed.
async fn connect(
    name: &str,
    source: &KafkaSource,
    handler: &dyn Intake,
) -> Result<Arc<StreamConsumer>, String> {
    handler.ensure_loaded().await.map_err(|e| e.0)?;
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &source.brokers)
        .set("group.id", format!("meshql-processor-{name}"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("client.id", format!("meshql-processor-{name}"));
    for (k, v) in &source.options {
        config.set(k, v);
    }
    let consumer: StreamConsumer = config.create().map_err(|e| e.to_string())?;
    let consumer = Arc::new(consumer);
    let topics = source.topics.clone();
    let c = consumer.clone();
    let partitions: Vec<(String, i32)> = tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        for t in &topics {
            let md = c
                .fetch_metadata(Some(t), Duration::from_secs(5))
                .map_err(|e| format!("metadata of {t}: {e}"))?;
            for topic in md.topics() {
                if let Some(e) = topic.error() {
                    return Err(format!("topic {t}: {e:?}"));
                }
                for p in topic.partitions() {
                    out.push((t.clone(), p.id()));
                }
            }
        }
        Ok::<_, String>(out)
    })
    .await
    .map_err(|e| e.to_string())??;
    if partitions.is_empty() {
        return Err(format!(
            "the topics {:?} have no partitions yet",
            source.topics
        ));
    }
    let keys: Vec<String> = partitions.iter().map(|(t, p)| offset_key(t, *p)).collect();
    let stored = handler.state(&keys).await.map_err(|e| e.to_string())?;
    let mut list = TopicPartitionList::new();
    for ((t, p), key) in partitions.iter().zip(&keys) {
        let offset = stored
            .get(key)
            .and_then(|o| o.parse::<i64>().ok())
            .map(Offset::Offset)
            .unwrap_or(Offset::Beginning);
        list.add_partition_offset(t, *p, offset)
            .map_err(|e| e.to_string())?;
    }
    consumer.assign(&list).map_err(|e| e.to_string())?;
    Ok(consumer)
}

#[cfg(test)]
mod tests {
    use super::*;
    fn compile(v: &serde_json::Value) -> Result<KafkaSource, SettingError> {
        crate::source::contract::compile(v)
    }
    use meshql_core::ChangeOp;
    use serde_json::json;

    fn source(format: Format) -> KafkaSource {
        KafkaSource {
            brokers: "b".into(),
            topics: vec!["events.events_development.event".into()],
            format,
            entities: BTreeMap::new(),
            options: BTreeMap::new(),
        }
    }

    #[test]
    fn debezium_mongodb_events_read_as_meshql_documents() {
        let after = json!({"_id": {"$oid": "65f0"}, "id": "e1", "payload": {"name": "signup", "data": "{}"}, "created_at": 5, "deleted": false}).to_string();
        let msg = json!({"schema": {}, "payload": {"before": null, "after": after, "op": "c", "ts_ms": 9,
            "source": {"db": "events_development", "collection": "event"}}});
        let i = input_of(
            &source(Format::Debezium),
            "events.events_development.event",
            0,
            3,
            None,
            msg.to_string().as_bytes(),
            1,
        )
        .unwrap();
        assert_eq!(
            (i.entity.as_str(), i.id.as_str(), i.op),
            ("event", "e1", ChangeOp::Create)
        );
        assert_eq!(i.payload["name"], "signup");
        assert_eq!(i.created_at, 5);
        assert_eq!(i.change_id, "events.events_development.event:0:3");
        // a row of a table (no MeshQL layout), a delete with its before, a bad op
        let row = json!({"before": null, "after": {"ID": 7, "name": "x"}, "op": "r", "source": {"table": "t"}});
        let i = input_of(
            &source(Format::Debezium),
            "p.s.t",
            1,
            0,
            Some(4),
            row.to_string().as_bytes(),
            2,
        )
        .unwrap();
        assert_eq!(
            (i.entity.as_str(), i.payload["name"].as_str()),
            ("t", Some("x"))
        );
        let del =
            json!({"before": {"id": "e1", "payload": {"name": "x"}}, "after": null, "op": "d"});
        let i = input_of(
            &source(Format::Debezium),
            "a.b.event",
            0,
            1,
            None,
            del.to_string().as_bytes(),
            3,
        )
        .unwrap();
        assert_eq!(
            (i.op, i.entity.as_str(), i.id.as_str()),
            (ChangeOp::Delete, "event", "e1")
        );
        let bad = json!({"op": "x"});
        assert!(input_of(
            &source(Format::Debezium),
            "t",
            0,
            0,
            None,
            bad.to_string().as_bytes(),
            4
        )
        .unwrap_err()
        .contains("not c, r, u or d"));
        assert!(
            input_of(&source(Format::Debezium), "t", 0, 0, None, b"nope", 5)
                .unwrap_err()
                .contains("not JSON")
        );
    }

    #[test]
    fn meshql_relay_changes_read_as_they_were_published() {
        let msg = json!({"position": 7, "change_id": "hen:h1:5", "entity": "hen", "id": "h1", "created_at": 5,
            "op": "update", "authorized_tokens": [], "correlation_id": "c-1", "payload": {"name": "chuck", "id": "h1"}});
        let mut s = source(Format::Meshql);
        let i = input_of(&s, "meshql.hen", 0, 0, None, msg.to_string().as_bytes(), 1).unwrap();
        assert_eq!(
            (i.entity.as_str(), i.op, i.change_id.as_str()),
            ("hen", ChangeOp::Update, "hen:h1:5")
        );
        assert_eq!(i.correlation_id.as_deref(), Some("c-1"));
        s.entities.insert("meshql.hen".into(), "chicken".into());
        let i = input_of(&s, "meshql.hen", 0, 0, None, msg.to_string().as_bytes(), 1).unwrap();
        assert_eq!(i.entity, "chicken");
    }

    #[test]
    fn only_errors_librdkafka_cannot_recover_from_replace_the_consumer() {
        use rdkafka::error::{KafkaError, RDKafkaErrorCode as C};
        for code in [
            C::OperationTimedOut,
            C::BrokerTransportFailure,
            C::AllBrokersDown,
        ] {
            assert!(
                !needs_reconnect(&KafkaError::MessageConsumption(code)),
                "{code:?}"
            );
        }
        for code in [C::UnknownTopicOrPartition, C::OffsetOutOfRange] {
            assert!(
                needs_reconnect(&KafkaError::MessageConsumption(code)),
                "{code:?}"
            );
        }
        assert!(needs_reconnect(&KafkaError::MessageConsumptionFatal(
            C::Fatal
        )));
    }

    #[test]
    fn sources_are_checked() {
        assert!(compile(&json!({"type": "kafka", "brokers": "h:1", "topics": ["t"]})).is_ok());
        let e = compile(&json!({"type": "nats", "brokers": "h:1", "topics": ["t"]})).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("source.type"));
        let e = compile(&json!({"type": "kafka", "brokers": "h:1", "topics": []})).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("source.topics"));
        let e = compile(&json!({"type": "kafka", "brokers": "h:1", "topics": ["t"], "colour": 1}))
            .unwrap_err();
        assert!(e.field.as_deref().unwrap().starts_with("source"), "{e:?}");
    }
}
