//! A storage block of `type = "kafka"` opened: its brokers, and the local SQLite file its
//! entities' topics are materialised into. Each entity's store starts, at `prepare`, its
//! topic (made or checked), its materialiser and its writer, and waits until the
//! materialisation has caught up with the end the topic had then: a process serves nothing
//! older than the log it starts on.

use crate::health::{Brokers, Health};
use crate::materialise::{self, Applied, Reader};
use crate::produce::{self, Writer};
use crate::settings::KafkaStorage;
use crate::topics;
use meshql_core::{Database, OutputStore, StateWrite, StoreError};
use meshql_store_sqlite::{SqliteDatabase, SqliteStore};
use parking_lot::Mutex;
use rdkafka::producer::FutureProducer;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// When a SQLite file was last written, its write-ahead log included (now, for a new file).
pub(crate) fn last_written(file: &std::path::Path) -> std::time::SystemTime {
    let mut wal = file.as_os_str().to_owned();
    wal.push("-wal");
    [file.to_path_buf(), std::path::PathBuf::from(wal)]
        .iter()
        .filter_map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .max()
        .unwrap_or_else(std::time::SystemTime::now)
}

/// The state rows this process keeps about itself.
const IDENTITY_CONSUMER: &str = "kafka:process";
const IDENTITY_KEY: &str = "id";

/// How long the first store of a block waits for a broker to answer before the block starts
/// without one.
const START_PROBE: Duration = Duration::from_secs(3);

/// How long a probe that found no broker is believed.
const PROBE_KEPT: Duration = Duration::from_secs(5);

/// How often a store catching up at start logs its progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// An opened `kafka` block.
pub struct KafkaDatabase {
    storage: KafkaStorage,
    local: Arc<SqliteDatabase>,
    /// This materialisation's identity, made once and kept in its file: what its
    /// transactional producers are named after, so a restart fences its predecessor's
    /// unfinished transaction and two processes never fence each other.
    identity: tokio::sync::OnceCell<String>,
    stop: watch::Sender<bool>,
    /// Topic → why its materialiser stopped.
    failures: Arc<Mutex<BTreeMap<String, String>>>,
    /// The block's brokers, as its clients see them.
    brokers: Arc<Brokers>,
    /// The block's consumer and producer, made by the first entity that starts.
    clients: tokio::sync::OnceCell<(Arc<Reader>, FutureProducer)>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// When the local file was last written before this process opened it.
    written: std::time::SystemTime,
    /// Whether a broker answered the last probe, and when it was asked.
    probed: tokio::sync::Mutex<Option<(Instant, bool)>>,
}

impl KafkaDatabase {
    pub(crate) fn new(
        storage: KafkaStorage,
        local: Arc<SqliteDatabase>,
        written: std::time::SystemTime,
    ) -> Self {
        KafkaDatabase {
            written,
            probed: tokio::sync::Mutex::new(None),
            storage,
            local,
            identity: tokio::sync::OnceCell::new(),
            stop: watch::channel(false).0,
            failures: Arc::default(),
            brokers: Brokers::new(),
            clients: tokio::sync::OnceCell::new(),
            tasks: Mutex::default(),
        }
    }

    /// The block's consumer and producer (one of each however many topics it has).
    async fn clients(&self) -> Result<&(Arc<Reader>, FutureProducer), StoreError> {
        self.clients
            .get_or_try_init(|| async {
                let reader = Reader::new(&self.storage, self.brokers.clone())
                    .map_err(|e| StoreError::Unavailable(format!("kafka: {e}")))?;
                Ok((reader, produce::producer(&self.storage)?))
            })
            .await
    }

    pub(crate) fn storage(&self) -> &KafkaStorage {
        &self.storage
    }

    pub(crate) fn local(&self) -> Arc<SqliteDatabase> {
        self.local.clone()
    }

    async fn identity(&self, local: &SqliteStore) -> Result<&str, StoreError> {
        self.identity
            .get_or_try_init(|| async {
                let keys = [IDENTITY_KEY.to_owned()];
                let kept = local.output_state(IDENTITY_CONSUMER, &keys).await?;
                if let Some(id) = kept.get(IDENTITY_KEY) {
                    return Ok(id.clone());
                }
                let id = uuid::Uuid::new_v4().simple().to_string();
                local
                    .apply_log(
                        IDENTITY_CONSUMER,
                        Vec::new(),
                        vec![StateWrite {
                            key: IDENTITY_KEY.to_owned(),
                            group: None,
                            value: Some(id.clone()),
                        }],
                    )
                    .await?;
                Ok(id)
            })
            .await
            .map(String::as_str)
    }

    /// Starts `topic`: made or checked, materialised into `local` from where it left off,
    /// caught up with the topic's end, and a writer for it.
    pub(crate) async fn start(
        &self,
        topic: &str,
        local: Arc<SqliteStore>,
    ) -> Result<(Writer, watch::Receiver<Applied>, Arc<Health>), StoreError> {
        let unavailable = |e: topics::TopicError| StoreError::Unavailable(e.to_string());
        let entity = local.table().to_owned();
        let partitions = topics::ensure(&self.storage, std::slice::from_ref(&entity))
            .await
            .map_err(unavailable)?[topic];
        let ends = topics::end_offsets(&self.storage, topic, partitions)
            .await
            .map_err(unavailable)?;
        let identity = self.identity(&local).await?.to_owned();
        let (reader, producer) = self.clients().await?;

        let (tx, mut applied) = watch::channel(Applied::default());
        let health = Health::new(topic, self.brokers.clone());
        let task = {
            let (reader, topic, local) = (reader.clone(), topic.to_owned(), local.clone());
            let (stop, failures) = (self.stop.subscribe(), self.failures.clone());
            let health = health.clone();
            tokio::spawn(async move {
                if let Err(e) =
                    materialise::run(&reader, &topic, partitions, local, tx, health, stop).await
                {
                    tracing::error!(topic, error = %e, "kafka store: the materialiser stopped");
                    failures.lock().insert(topic, e.to_string());
                }
            })
        };
        self.tasks.lock().push(task);
        let writer = Writer::new(
            &self.storage,
            producer,
            topic,
            &format!("meshql-{identity}-{topic}"),
            applied.clone(),
            self.brokers.clone(),
        );

        let started = Instant::now();
        let mut logged = started;
        loop {
            let behind = applied
                .borrow_and_update()
                .behind(ends.iter().enumerate().map(|(p, e)| (p as i32, *e)));
            if behind == 0 {
                break;
            }
            if logged.elapsed() >= PROGRESS_EVERY {
                tracing::info!(topic, behind, "kafka store: catching up with the topic");
                logged = Instant::now();
            }
            match tokio::time::timeout(PROGRESS_EVERY, applied.changed()).await {
                Ok(Ok(())) | Err(_) => {}
                Ok(Err(_)) => {
                    let why = self.failures.lock().get(topic).cloned();
                    return Err(StoreError::Unavailable(format!(
                        "kafka: the materialiser of {topic} stopped: {}",
                        why.unwrap_or_default()
                    )));
                }
            }
        }
        materialise::mark_started(&local, topic).await?;
        let total: i64 = ends.iter().sum();
        if total > 0 {
            tracing::info!(
                topic,
                offsets = total,
                ms = started.elapsed().as_millis() as u64,
                "kafka store: caught up with the topic"
            );
        }
        Ok((writer, applied, health))
    }

    /// Whether `topic`'s materialiser is running.
    pub(crate) fn health(&self, topic: &str) -> Result<(), StoreError> {
        match self.failures.lock().get(topic) {
            Some(why) => Err(StoreError::Unavailable(format!(
                "kafka: the materialiser of {topic} stopped: {why}"
            ))),
            None => Ok(()),
        }
    }

    pub(crate) fn stop(&self) {
        self.stop.send_replace(true);
    }

    /// Whether a broker answers (within [`START_PROBE`]), before a store starts: once one
    /// did, always; a "no" is kept for [`PROBE_KEPT`], so the block's other stores starting
    /// at the same time do not each wait for it again.
    pub(crate) async fn reachable(&self) -> bool {
        let mut probed = self.probed.lock().await;
        match *probed {
            Some((_, true)) => return true,
            Some((at, false)) if at.elapsed() < PROBE_KEPT => return false,
            _ => {}
        }
        let up = topics::reachable(&self.storage, START_PROBE).await;
        *probed = Some((Instant::now(), up));
        up
    }

    /// Turns true when the block stops.
    pub(crate) fn stopped(&self) -> watch::Receiver<bool> {
        self.stop.subscribe()
    }

    /// When the local file was last written before this process opened it: how old a copy
    /// served without the brokers is.
    pub(crate) fn last_written(&self) -> std::time::SystemTime {
        self.written
    }

    /// Stops the materialisers and writers, waits for them, and closes the local file.
    pub(crate) async fn close(&self) {
        self.stop();
        let tasks = std::mem::take(&mut *self.tasks.lock());
        for task in tasks {
            let _ = task.await;
        }
        Database::close(self.local.as_ref()).await;
    }
}
