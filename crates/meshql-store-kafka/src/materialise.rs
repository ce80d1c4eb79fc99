//! The local materialisation of one entity's topic: every record read from the start (or from
//! the positions committed before) and applied to the entity's SQLite table with
//! `SqliteStore::apply_log`, each batch committed with the next offset of every partition it
//! read in the same transaction — so a restart, `kill -9` included, resumes where the last
//! commit left off and applies nothing twice.
//!
//! The consumer is *assigned* every partition of the topic (no consumer group: every process
//! reads everything into its own file), `read_committed` (an aborted bulk write is never
//! applied), and takes batches of what has arrived (up to [`BATCH`] records, never waiting for
//! more once one is there). A record that is not an envelope ([`crate::record`]) is skipped
//! with its reason logged and counted; its offset moves on with the batch.
//!
//! [`Applied`] — the next offset of each partition this process has applied, and the records
//! skipped — is published on a watch channel after every commit: what a write waits on to
//! acknowledge once its own record is applied (read-your-writes by offset), and what `/metrics`
//! and the lag header will read.

use crate::health::{ConsumerWatch, Health, STATS_INTERVAL_MS};
use crate::record;
use crate::settings::KafkaStorage;
use futures::StreamExt;
use meshql_core::{StateWrite, StoreError};
use meshql_store_sqlite::SqliteStore;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::watch;

/// What the consumer of a topic may fetch ahead of the materialiser, in KiB.
pub const PREFETCH_KIB: u32 = 4096;

/// The most records applied in one transaction.
pub const BATCH: usize = 1000;

/// The first and the longest wait before a batch the local store refused is tried again.
const RETRY_FIRST: std::time::Duration = std::time::Duration::from_millis(100);
const RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// How long the topic must be quiet before the consumer's position is read (see
/// [`past_markers`]).
const IDLE: std::time::Duration = std::time::Duration::from_millis(50);

/// What this process has applied of a topic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// Partition → the next offset to apply (every record before it is applied).
    pub next: BTreeMap<i32, i64>,
    /// Records that were not envelopes, skipped since start.
    pub skipped: u64,
    /// Why the last batch could not be applied, while it is being tried again.
    pub stalled: Option<String>,
}

impl Applied {
    /// Whether the record at `offset` of `partition` is applied.
    pub fn covers(&self, partition: i32, offset: i64) -> bool {
        self.next.get(&partition).is_some_and(|n| *n > offset)
    }

    /// Whether every partition is applied up to `ends` (partition `p`'s end at `ends[p]`).
    pub fn reached(&self, ends: &[i64]) -> bool {
        ends.iter()
            .enumerate()
            .all(|(p, end)| self.next.get(&(p as i32)).is_some_and(|n| n >= end))
    }

    /// Records still to apply before `ends`, summed over the partitions.
    pub fn behind(&self, ends: &[i64]) -> i64 {
        ends.iter()
            .enumerate()
            .map(|(p, end)| (end - self.next.get(&(p as i32)).copied().unwrap_or(0)).max(0))
            .sum()
    }
}

/// Why the materialiser stopped.
#[derive(Debug, thiserror::Error)]
pub enum MaterialiseError {
    #[error("topic {topic}: {reason}")]
    Kafka { topic: String, reason: String },
    #[error("the materialisation of {topic}: {source}")]
    Store {
        topic: String,
        #[source]
        source: StoreError,
    },
}

/// The state row of a partition's next offset.
fn offset_key(topic: &str, partition: i32) -> String {
    format!("{topic}/{partition}")
}

/// The consumer name the materialisation's positions are kept under.
pub fn consumer_name(topic: &str) -> String {
    format!("kafka:{topic}")
}

/// Reads `topic` (with `partitions` partitions) into `store` until `stop` turns true,
/// publishing what is applied on `applied`.
pub async fn run(
    storage: &KafkaStorage,
    topic: &str,
    partitions: usize,
    store: Arc<SqliteStore>,
    applied: watch::Sender<Applied>,
    health: Arc<Health>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), MaterialiseError> {
    let kafka = |reason: String| MaterialiseError::Kafka {
        topic: topic.to_owned(),
        reason,
    };
    let in_store = |source: StoreError| MaterialiseError::Store {
        topic: topic.to_owned(),
        source,
    };
    let consumer_name = consumer_name(topic);
    let keys: Vec<String> = (0..partitions as i32)
        .map(|p| offset_key(topic, p))
        .collect();
    let stored = meshql_core::OutputStore::output_state(store.as_ref(), &consumer_name, &keys)
        .await
        .map_err(in_store)?;
    let mut state = Applied::default();
    let mut list = TopicPartitionList::new();
    for (p, key) in keys.iter().enumerate() {
        let next = stored.get(key).and_then(|o| o.parse::<i64>().ok());
        state.next.insert(p as i32, next.unwrap_or(0));
        list.add_partition_offset(
            topic,
            p as i32,
            next.map_or(Offset::Beginning, Offset::Offset),
        )
        .map_err(|e| kafka(e.to_string()))?;
    }
    applied.send_replace(state.clone());

    let mut config = ClientConfig::new();
    // what librdkafka fetches ahead of the materialiser, per topic (its default is 64 MiB):
    // a process materialises every topic of its config at once (`consumer` options may set it)
    config.set("queued.max.messages.kbytes", PREFETCH_KIB.to_string());
    for (k, v) in &storage.consumer {
        config.set(k, v);
    }
    config
        .set("bootstrap.servers", &storage.brokers)
        .set("group.id", format!("meshql-materialise-{topic}"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        .set("statistics.interval.ms", STATS_INTERVAL_MS.to_string());
    health.watch_applied(applied.subscribe());
    let consumer: StreamConsumer<ConsumerWatch> = config
        .create_with_context(ConsumerWatch(health))
        .map_err(|e| kafka(e.to_string()))?;
    consumer.assign(&list).map_err(|e| kafka(e.to_string()))?;

    let mut batches = consumer.stream().ready_chunks(BATCH);
    loop {
        let batch = tokio::select! {
            b = batches.next() => b,
            _ = tokio::time::sleep(IDLE) => {
                // nothing arrived and nothing is in flight: the consumer's position counts
                // the transaction markers it read past, which no record's offset shows
                if past_markers(&consumer, topic, &mut state) {
                    applied.send_replace(state.clone());
                }
                continue;
            }
            _ = stop.changed() => return Ok(()),
        };
        let Some(batch) = batch else {
            return Err(kafka("the consumer's stream ended".into()));
        };
        let mut versions = Vec::with_capacity(batch.len());
        let mut next = state.next.clone();
        let mut skipped = 0u64;
        for message in batch {
            let message = match message {
                Ok(m) => m,
                Err(e) => {
                    // librdkafka retries on its own; what reaches here is reported and read on
                    tracing::warn!(topic, error = %e, "kafka store: consumer error");
                    continue;
                }
            };
            let (partition, offset) = (message.partition(), message.offset());
            match record::decode(message.key(), message.payload()) {
                Ok(v) => versions.push(v),
                Err(reason) => {
                    skipped += 1;
                    tracing::warn!(topic, partition, offset, %reason,
                        "kafka store: a record that is not a document version is skipped");
                }
            }
            next.insert(partition, offset + 1);
        }
        let rows: Vec<StateWrite> = next
            .iter()
            .filter(|(p, n)| state.next.get(p) != Some(n))
            .map(|(p, n)| StateWrite {
                key: offset_key(topic, *p),
                group: None,
                value: Some(n.to_string()),
            })
            .collect();
        if rows.is_empty() {
            continue;
        }
        // a batch the local store cannot take (a full disk, a fault) is tried again, later
        // and later, with the reason published: nothing after it is applied before it
        let mut wait = RETRY_FIRST;
        while let Err(e) = store
            .apply_log(&consumer_name, versions.clone(), rows.clone())
            .await
        {
            let reason = in_store(e).to_string();
            if state.stalled.as_deref() != Some(reason.as_str()) {
                tracing::error!(topic, %reason, "kafka store: a batch cannot be applied; trying again");
                state.stalled = Some(reason);
                applied.send_replace(state.clone());
            }
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.changed() => return Ok(()),
            }
            wait = (wait * 2).min(RETRY_MAX);
        }
        state.stalled = None;
        state.next = next;
        state.skipped += skipped;
        applied.send_replace(state.clone());
    }
}

/// Raises `state.next` to the consumer's position where it is ahead: a Kafka transaction's
/// commit or abort marker takes an offset that no record is delivered for, so after a bulk
/// write the next offset of the last record applied stays one below the partition's end
/// (and an aborted batch leaves a gap). Called only when no record is in flight, so every
/// offset below the position is applied or was not a record. Nothing is committed for it: a
/// restart reads past the markers again. Returns whether anything moved.
fn past_markers(
    consumer: &StreamConsumer<ConsumerWatch>,
    topic: &str,
    state: &mut Applied,
) -> bool {
    let Ok(position) = consumer.position() else {
        return false;
    };
    let mut moved = false;
    for element in position.elements_for_topic(topic) {
        if let Offset::Offset(at) = element.offset() {
            let next = state.next.entry(element.partition()).or_insert(0);
            if at > *next {
                *next = at;
                moved = true;
            }
        }
    }
    moved
}
