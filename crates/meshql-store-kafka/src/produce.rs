//! Writes: versions produced to the entity's topic, acknowledged once the broker has them
//! *and* this process's materialiser applied them (read-your-writes by offset).
//!
//! Single writes go through librdkafka's idempotent producer (`enable.idempotence=true`,
//! `acks=all`: its retries neither duplicate nor reorder a partition's records). A batch is
//! one Kafka transaction on a transactional producer of its own (its `transactional.id`
//! derived from the process's materialisation file, so a restarted process fences its
//! predecessor's unfinished transaction): the materialiser reads `read_committed`, so a batch
//! is applied whole or not at all. Every write waits at most `write_timeout` in all (the
//! broker's acknowledgement, then the local apply); past it, or with the broker unreachable,
//! the write fails as unavailable — a record the broker did take is still applied when it is
//! read, as any record of another writer would be.

use crate::applied::Applied;
use crate::health::Brokers;
use crate::record;
use crate::settings::KafkaStorage;
use meshql_core::StoreError;
use meshql_store_sqlite::LogVersion;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;
use rdkafka::ClientConfig;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The idempotent producer of a storage block, shared by its topics' writers (one set of
/// librdkafka threads and connections per block, as for the consumer).
pub fn producer(storage: &KafkaStorage) -> Result<FutureProducer, StoreError> {
    config(storage).create().map_err(unavailable)
}

/// The producers' settings: the `producer` options, then what a write relies on.
fn config(storage: &KafkaStorage) -> ClientConfig {
    let timeout_ms = storage.write_timeout.as_millis().to_string();
    let mut config = ClientConfig::new();
    // a write waits for its own record: librdkafka's default 5 ms of batching would be
    // added to every acknowledgement (the `producer` options may set it again)
    config.set("linger.ms", "0");
    for (k, v) in &storage.producer {
        config.set(k, v);
    }
    config
        .set("bootstrap.servers", &storage.brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", &timeout_ms);
    config
}

/// The producers of one topic and the materialiser's progress they wait on.
pub struct Writer {
    topic: String,
    timeout: Duration,
    single: FutureProducer,
    /// The transactional producer, made on the first batch (transactions serialise on it).
    batch: tokio::sync::Mutex<Option<FutureProducer>>,
    batch_config: ClientConfig,
    applied: watch::Receiver<Applied>,
    brokers: Arc<Brokers>,
}

fn unavailable(what: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("kafka: {what}"))
}

impl Writer {
    /// The writer of `topic`: single writes through the block's `single` producer ([`producer`]),
    /// batches through a transactional producer named `transactional_id`, made on the first.
    pub fn new(
        storage: &KafkaStorage,
        single: &FutureProducer,
        topic: &str,
        transactional_id: &str,
        applied: watch::Receiver<Applied>,
        brokers: Arc<Brokers>,
    ) -> Writer {
        let timeout_ms = storage.write_timeout.as_millis().to_string();
        let mut batch_config = config(storage);
        batch_config
            .set("transactional.id", transactional_id)
            .set("transaction.timeout.ms", &timeout_ms);
        Writer {
            topic: topic.to_owned(),
            timeout: storage.write_timeout,
            single: single.clone(),
            batch: tokio::sync::Mutex::new(None),
            batch_config,
            applied,
            brokers,
        }
    }

    /// Produces one version; returns once it is applied locally.
    pub async fn write(&self, version: &LogVersion) -> Result<(), StoreError> {
        let started = Instant::now();
        self.reachable()?;
        meshql_core::fault::check(&version.envelope.payload)?;
        let (key, value) = record::encode(version);
        // librdkafka's own message timeout is the write's; this bounds the wait as well
        let send = self.single.send(
            FutureRecord::to(&self.topic).key(&key).payload(&value),
            Timeout::After(self.timeout),
        );
        let delivered = tokio::time::timeout(self.timeout, send)
            .await
            .map_err(|_| self.timed_out())?
            .map_err(|(e, _)| unavailable(e))?;
        self.until_applied(&[(delivered.partition, delivered.offset)], started)
            .await
    }

    /// Produces `versions` as one transaction; returns once all are applied locally.
    pub async fn write_all(&self, versions: &[LogVersion]) -> Result<(), StoreError> {
        if versions.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        self.reachable()?;
        let mut slot = self.batch.lock().await;
        if slot.is_none() {
            let producer: FutureProducer = self.batch_config.create().map_err(unavailable)?;
            let p = producer.clone();
            let timeout = self.timeout;
            tokio::task::spawn_blocking(move || p.init_transactions(timeout))
                .await
                .map_err(unavailable)?
                .map_err(unavailable)?;
            *slot = Some(producer);
        }
        let producer = slot.as_ref().expect("made above").clone();
        producer.begin_transaction().map_err(unavailable)?;
        let encoded: Vec<(Vec<u8>, Vec<u8>)> = versions.iter().map(record::encode).collect();
        let mut sends = Vec::with_capacity(encoded.len());
        // a version that cannot be stored fails the batch after those before it were sent:
        // the transaction is aborted and a read_committed reader never sees them
        let mut failed: Option<StoreError> = None;
        for ((key, value), version) in encoded.iter().zip(versions) {
            if let Err(e) = meshql_core::fault::check(&version.envelope.payload) {
                failed = Some(e);
                break;
            }
            sends.push(producer.send(
                FutureRecord::to(&self.topic).key(key).payload(value),
                Timeout::After(self.timeout),
            ));
        }
        let mut at = Vec::with_capacity(sends.len());
        match tokio::time::timeout(self.timeout, futures::future::join_all(sends)).await {
            Ok(sent) => {
                for s in sent {
                    match s {
                        Ok(d) => at.push((d.partition, d.offset)),
                        Err((e, _)) => failed = Some(unavailable(e)),
                    }
                }
            }
            // the transaction is aborted below: nothing of it is ever read
            Err(_) => failed = Some(self.timed_out()),
        }
        let timeout = self.timeout;
        // (the outcome, whether the producer is still in a known state)
        let (outcome, usable) = tokio::task::spawn_blocking(move || match failed {
            None => match producer.commit_transaction(timeout) {
                Ok(()) => (Ok(()), true),
                Err(e) => (Err(unavailable(e)), false),
            },
            Some(e) => {
                let aborted = producer.abort_transaction(timeout).is_ok();
                (Err(e), aborted)
            }
        })
        .await
        .map_err(unavailable)?;
        if let Err(e) = outcome {
            if !usable {
                // a producer in an unknown state is made again for the next batch
                *slot = None;
            }
            return Err(e);
        }
        drop(slot);
        self.until_applied(&at, started).await
    }

    /// A write the broker did not confirm within its time. It may still be written (its
    /// record may have reached the broker before the connection broke), as a commit whose
    /// acknowledgement is lost may be on any database.
    fn timed_out(&self) -> StoreError {
        unavailable(format!(
            "the broker did not confirm the write within {} ms",
            self.timeout.as_millis()
        ))
    }

    /// Fails at once when no broker is seen up.
    fn reachable(&self) -> Result<(), StoreError> {
        self.brokers.writable().map_err(|since| {
            unavailable(match since {
                Some(d) => format!(
                    "no broker of {} is reachable (for {} ms)",
                    self.topic,
                    d.as_millis()
                ),
                None => format!("no broker of {} is reachable", self.topic),
            })
        })
    }

    /// Waits until every `(partition, offset)` is applied, within the write's time.
    async fn until_applied(&self, at: &[(i32, i64)], started: Instant) -> Result<(), StoreError> {
        let mut applied = self.applied.clone();
        let left = self.timeout.saturating_sub(started.elapsed());
        tokio::time::timeout(left, async {
            loop {
                if at
                    .iter()
                    .all(|(p, o)| applied.borrow_and_update().covers(*p, *o))
                {
                    return Ok(());
                }
                if applied.changed().await.is_err() {
                    return Err(unavailable("the materialiser stopped"));
                }
            }
        })
        .await
        .map_err(|_| {
            unavailable(format!(
                "the write was not applied locally within {} ms",
                self.timeout.as_millis()
            ))
        })?
    }
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("topic", &self.topic)
            .finish()
    }
}

/// Shared by the store's handles.
pub type SharedWriter = Arc<Writer>;
