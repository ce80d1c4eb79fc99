//! The local materialisation of one entity's topic: every record read from the start (or from
//! the positions committed before) and applied to the entity's SQLite table with
//! `SqliteStore::apply_log`, each batch committed with the next offset of every partition it
//! read in the same transaction — so a restart, `kill -9` included, resumes where the last
//! commit left off and applies nothing twice.
//!
//! A storage block has one consumer ([`Reader`]: one set of librdkafka threads and broker
//! connections, one statistics report, however many entities the block stores; a consumer
//! per topic kept 13 of them polling for egg-economy, 0.1 of a core while idle, and put the
//! p99 of reads at three times SQLite's). Each topic's partitions are split off it into
//! queues of their own before they are added to its assignment, so each materialiser reads
//! only its topic. The consumer is *assigned* the partitions (no consumer group: every
//! process reads everything into its own file), `read_committed` (an aborted bulk write is
//! never applied), and each materialiser takes batches of what has arrived (up to [`BATCH`] records, never waiting for
//! more once one is there). A record that is not an envelope ([`crate::record`]) is skipped
//! with its reason logged and counted; its offset moves on with the batch. Decoding and
//! applying are a pipeline: the consumer's task decodes the next batch while an applier task
//! applies the one before (on the SQLite writer's thread). On this machine (`meshql bench
//! kafka-store`, 200,000 versions): 11,700 versions/s with librdkafka's fetch backoff of a
//! second, 40,500 without it, 48,500 pipelined, 53,800 with one lookup of each document's
//! current version instead of two.
//!
//! [`Applied`] — the next offset of each partition this process has applied, and the records
//! skipped — is published on a watch channel after every commit: what a write waits on to
//! acknowledge once its own record is applied (read-your-writes by offset), and what `/metrics`
//! and the lag header read ([`crate::health`]).

pub use crate::applied::Applied;
use crate::health::{Brokers, ConsumerWatch, Health, STATS_INTERVAL_MS};
use crate::record;
use crate::settings::KafkaStorage;
use futures::StreamExt;
use meshql_core::{OutputStore, StateWrite, StoreError};
use meshql_store_sqlite::{LogVersion, SqliteStore};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};

/// What the consumer of a topic may fetch ahead of the materialiser, in KiB.
pub const PREFETCH_KIB: u32 = 4096;

/// The longest a fetch waits on the broker for records (`fetch.wait.max.ms`; see
/// [`Reader::new`]).
pub const FETCH_WAIT_MS: u32 = 50;

/// The most records applied in one transaction.
pub const BATCH: usize = 1000;

/// The first and the longest wait before a batch the local store refused is tried again.
const RETRY_FIRST: std::time::Duration = std::time::Duration::from_millis(100);
const RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// How long the topic must be quiet before the consumer's position is read (see
/// [`past_markers`]), and the longest wait between two readings of a quiet topic.
const IDLE: std::time::Duration = std::time::Duration::from_millis(50);
const IDLE_MAX: std::time::Duration = std::time::Duration::from_secs(1);

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

/// The state row saying the topic was materialised up to its end once (empty topics
/// included): a copy that may be served when the brokers are away at the next start.
const STARTED_KEY: &str = "started";

/// Records that `topic` has been materialised up to its end once (see [`STARTED_KEY`]).
pub(crate) async fn mark_started(store: &SqliteStore, topic: &str) -> Result<(), StoreError> {
    let name = consumer_name(topic);
    let key = [STARTED_KEY.to_owned()];
    if store.output_state(&name, &key).await?.is_empty() {
        let row = StateWrite {
            key: STARTED_KEY.to_owned(),
            group: None,
            value: Some(meshql_core::now_millis().to_string()),
        };
        store.apply_log(&name, Vec::new(), vec![row]).await?;
    }
    Ok(())
}

/// Whether `topic` was materialised up to its end once in `store`'s file.
pub(crate) async fn was_started(store: &SqliteStore, topic: &str) -> Result<bool, StoreError> {
    let key = [STARTED_KEY.to_owned()];
    let kept = store.output_state(&consumer_name(topic), &key).await?;
    Ok(!kept.is_empty())
}

/// The consumer name the materialisation's positions are kept under.
pub fn consumer_name(topic: &str) -> String {
    format!("kafka:{topic}")
}

/// The consumer of a storage block, shared by its topics' materialisers.
pub struct Reader {
    consumer: Arc<StreamConsumer<ConsumerWatch>>,
    _events: AbortOnDrop,
}

impl Reader {
    /// The block's consumer, its statistics telling `brokers` (and the topics' health).
    pub fn new(storage: &KafkaStorage, brokers: Arc<Brokers>) -> Result<Arc<Reader>, KafkaError> {
        let mut config = ClientConfig::new();
        // what librdkafka fetches ahead of the materialisers (its default is 64 MiB; the
        // `consumer` options may set it)
        config.set("queued.max.messages.kbytes", PREFETCH_KIB.to_string());
        // once the prefetched records are taken, fetch again at once: librdkafka's default
        // waits a second, which stalled a rebuild every 4 MiB (11,700 versions/s instead of
        // ~60,000)
        config.set("fetch.queue.backoff.ms", "5");
        // one fetch is in flight at a time for all the block's partitions: while a busy
        // topic's prefetch is full, the fetch for the others waits up to this long on the
        // broker for data, and the busy topic waits with it. librdkafka's 500 ms took a rebuild
        // of 200,000 versions from 5.1–5.6 s to 8.6–8.9 s; 50 ms gives 5.5–5.7 s, for 0.018
        // of a core more on the broker while idle (10 ms: 0.053)
        config.set("fetch.wait.max.ms", FETCH_WAIT_MS.to_string());
        for (k, v) in &storage.consumer {
            config.set(k, v);
        }
        config
            .set("bootstrap.servers", &storage.brokers)
            // required by librdkafka; nothing is committed to the group
            .set("group.id", "meshql-materialise")
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false")
            .set("statistics.interval.ms", STATS_INTERVAL_MS.to_string());
        let consumer: Arc<StreamConsumer<ConsumerWatch>> =
            Arc::new(config.create_with_context(ConsumerWatch::new(brokers))?);
        // the main queue serves librdkafka's events (statistics, errors); records arrive on
        // the partition queues, split off before their partitions are assigned
        let events = tokio::spawn({
            let consumer = consumer.clone();
            async move {
                loop {
                    match consumer.recv().await {
                        Err(e) => tracing::warn!(error = %e, "kafka store: consumer error"),
                        Ok(m) => tracing::error!(
                            topic = m.topic(),
                            partition = m.partition(),
                            offset = m.offset(),
                            "kafka store: a record outside its partition's queue (not applied)"
                        ),
                    }
                }
            }
        });
        Ok(Arc::new(Reader {
            consumer,
            _events: AbortOnDrop(events),
        }))
    }
}

/// Reads `topic` (with `partitions` partitions) into `store` until `stop` turns true,
/// publishing what is applied on `applied`.
pub async fn run(
    reader: &Reader,
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

    health.watch_applied(applied.subscribe());
    let consumer = &reader.consumer;
    consumer.context().watch(health);
    let queues = (0..partitions as i32)
        .map(|p| {
            consumer
                .split_partition_queue(topic, p)
                .ok_or_else(|| kafka(format!("partition {p} cannot be read")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    consumer
        .incremental_assign(&list)
        .map_err(|e| kafka(e.to_string()))?;
    let _assigned = Unassign(consumer, list);

    // decoding the next batch overlaps applying this one (the SQLite writer's thread): two
    // batches at most are decoded and not yet applied
    let (steps, queue) = mpsc::channel::<Step>(1);
    let applier = tokio::spawn(apply_steps(
        store,
        consumer_name,
        topic.to_owned(),
        state.clone(),
        applied,
        queue,
        stop.clone(),
    ));
    let _applier = AbortOnDrop(applier);
    // what has been handed to the applier (ahead of what it has applied)
    let mut sent = state.next;
    let mut batches =
        futures::stream::select_all(queues.iter().map(|q| q.stream())).ready_chunks(BATCH);
    // quiet topics are looked at less and less often (up to IDLE_MAX), and at IDLE again
    // after a batch
    let mut idle = IDLE;
    loop {
        let batch = tokio::select! {
            b = batches.next() => {
                idle = IDLE;
                b
            }
            _ = tokio::time::sleep(idle) => {
                idle = (idle * 2).min(IDLE_MAX);
                // nothing arrived for a while: the consumer's position counts the
                // transaction markers it read past, which no record's offset shows; the
                // applier takes it after every batch handed to it before
                let passed = past_markers(consumer, topic, &mut sent);
                if passed && steps.send(Step::Passed(sent.clone())).await.is_err() {
                    return Ok(());
                }
                continue;
            }
            _ = stop.changed() => return Ok(()),
        };
        let Some(batch) = batch else {
            return Err(kafka("the consumer's stream ended".into()));
        };
        let mut versions = Vec::with_capacity(batch.len());
        let mut next = sent.clone();
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
            .filter(|(p, n)| sent.get(p) != Some(n))
            .map(|(p, n)| StateWrite {
                key: offset_key(topic, *p),
                group: None,
                value: Some(n.to_string()),
            })
            .collect();
        if rows.is_empty() {
            continue;
        }
        sent = next.clone();
        let step = Step::Apply {
            versions,
            rows,
            next,
            skipped,
        };
        if steps.send(step).await.is_err() {
            // the applier stopped: it was told to
            return Ok(());
        }
    }
}

/// What the consumer hands the applier, in the topic's order.
enum Step {
    /// A batch: its versions, the state rows of the offsets after it, and those offsets.
    Apply {
        versions: Vec<LogVersion>,
        rows: Vec<StateWrite>,
        next: BTreeMap<i32, i64>,
        skipped: u64,
    },
    /// The consumer read past transaction markers up to these offsets (nothing to apply).
    Passed(BTreeMap<i32, i64>),
}

/// Aborts a task when dropped (the materialiser's applier ends with it).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

/// Takes a materialiser's partitions out of the block consumer's assignment when it ends.
struct Unassign<'c>(&'c StreamConsumer<ConsumerWatch>, TopicPartitionList);

impl Drop for Unassign<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.0.incremental_unassign(&self.1) {
            tracing::warn!(error = %e, "kafka store: partitions not unassigned");
        }
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Applies the steps in order, each batch with its offsets in one transaction, publishing
/// what is applied. A batch the local store cannot take (a full disk, a fault) is tried
/// again, later and later, with the reason published: nothing after it is applied first.
async fn apply_steps(
    store: Arc<SqliteStore>,
    consumer_name: String,
    topic: String,
    mut state: Applied,
    applied: watch::Sender<Applied>,
    mut steps: mpsc::Receiver<Step>,
    mut stop: watch::Receiver<bool>,
) {
    while let Some(step) = steps.recv().await {
        let (versions, rows, next, skipped) = match step {
            Step::Passed(next) => {
                for (p, n) in next {
                    let at = state.next.entry(p).or_insert(0);
                    *at = (*at).max(n);
                }
                applied.send_replace(state.clone());
                continue;
            }
            Step::Apply {
                versions,
                rows,
                next,
                skipped,
            } => (versions, rows, next, skipped),
        };
        let mut wait = RETRY_FIRST;
        while let Err(e) = store
            .apply_log(&consumer_name, versions.clone(), rows.clone())
            .await
        {
            let reason = MaterialiseError::Store {
                topic: topic.clone(),
                source: e,
            }
            .to_string();
            if state.stalled.as_deref() != Some(reason.as_str()) {
                tracing::error!(topic, %reason, "kafka store: a batch cannot be applied; trying again");
                state.stalled = Some(reason);
                applied.send_replace(state.clone());
            }
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.changed() => return,
            }
            wait = (wait * 2).min(RETRY_MAX);
        }
        state.stalled = None;
        state.next = next;
        state.skipped += skipped;
        applied.send_replace(state.clone());
    }
}

/// Raises `sent` (the offsets handed to the applier) to the consumer's position where it is
/// ahead: a Kafka transaction's commit or abort marker takes an offset that no record is
/// delivered for, so after a bulk write the next offset of the last record stays one below
/// the partition's end (and an aborted batch leaves a gap). Called only when nothing arrived
/// for a while, so every record below the position was handed on. Nothing is committed for
/// it: a restart reads past the markers again. Returns whether anything moved.
fn past_markers(
    consumer: &StreamConsumer<ConsumerWatch>,
    topic: &str,
    sent: &mut BTreeMap<i32, i64>,
) -> bool {
    let Ok(position) = consumer.position() else {
        return false;
    };
    let mut moved = false;
    for element in position.elements_for_topic(topic) {
        if let Offset::Offset(at) = element.offset() {
            let next = sent.entry(element.partition()).or_insert(0);
            if at > *next {
                *next = at;
                moved = true;
            }
        }
    }
    moved
}
