//! What a process knows of the brokers and of its distance from the end of a topic, from
//! librdkafka's statistics (every [`STATS_INTERVAL_MS`]) of the clients of a storage block.
//!
//! - **Reachable** ([`Brokers`], one per storage block: its topics live on one cluster): the
//!   newest statistics of the block's consumer that tell (a broker `UP`, or none up and some
//!   being connected to) decide. While the brokers are not reachable, a
//!   write fails at once as unavailable instead of waiting out its timeout, and `/ready` says
//!   so. The consumer fetches all the time, so it notices first; producers are not asked (an
//!   idle one connects only when it has a record to send, and cannot tell).
//! - **Behind** ([`Health`], one per topic): the consumer's statistics carry each partition's
//!   last stable offset (the end a `read_committed` reader reads to) as of its last fetch.
//!   `records_behind` is what is not applied of it; `behind_ms` is 0 while the brokers are
//!   reachable and everything up to that end is applied, and otherwise the time since that
//!   was last true: how old the answers of the local state may be. Reads go on meanwhile;
//!   both are in `/metrics` and `behind_ms` in a response header.

use crate::applied::Applied;
use parking_lot::Mutex;
use rdkafka::consumer::ConsumerContext;
use rdkafka::ClientContext;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How often librdkafka reports statistics (`statistics.interval.ms`).
pub const STATS_INTERVAL_MS: u64 = 1000;

/// Statistics older than this are not trusted to say the brokers are down (clients whose
/// statistics stopped coming are not known to be cut off).
const FRESH: Duration = Duration::from_millis(3 * STATS_INTERVAL_MS);

/// What a client's statistics say of the brokers: `Some(true)` when one is up, `Some(false)`
/// when none is and some are being connected to (after a connection broke, librdkafka lists
/// the learned broker as `INIT` and retries through its bootstrap address), `None` when it
/// has not tried.
fn reach(stats: &Brief) -> Option<bool> {
    let states = || stats.brokers.values().map(|b| b.state.as_str());
    if states().any(|s| s == "UP") {
        Some(true)
    } else if states().any(|s| matches!(s, "DOWN" | "TRY_CONNECT" | "CONNECT")) {
        Some(false)
    } else {
        None
    }
}

/// The brokers of a storage block, as its clients see them.
#[derive(Default)]
pub struct Brokers {
    state: Mutex<BrokerState>,
}

#[derive(Default)]
struct BrokerState {
    /// The newest statistics that told, and what they told.
    last: Option<(Instant, bool)>,
    /// The last moment a broker was seen up.
    last_up: Option<Instant>,
}

impl Brokers {
    pub fn new() -> Arc<Brokers> {
        Arc::default()
    }

    fn record(&self, stats: &Brief) -> bool {
        let now = Instant::now();
        let reach = reach(stats);
        let mut state = self.state.lock();
        if let Some(up) = reach {
            state.last = Some((now, up));
            if up {
                state.last_up = Some(now);
            }
        }
        !state.down()
    }

    /// `Err` (for how long, when they were ever seen up) while the brokers are not reachable.
    pub fn writable(&self) -> Result<(), Option<Duration>> {
        let state = self.state.lock();
        if state.down() {
            Err(state.last_up.map(|t| t.elapsed()))
        } else {
            Ok(())
        }
    }

    /// Whether the brokers are reachable, as far as the fresh statistics tell.
    pub fn reachable(&self) -> bool {
        !self.state.lock().down()
    }

    /// When a broker was last seen up.
    fn last_up(&self) -> Option<Instant> {
        self.state.lock().last_up
    }
}

impl BrokerState {
    fn down(&self) -> bool {
        matches!(self.last, Some((at, false)) if at.elapsed() < FRESH)
    }
}

/// One topic's distance from the end of its log.
pub struct Health {
    topic: String,
    brokers: Arc<Brokers>,
    state: Mutex<State>,
    applied: OnceLock<watch::Receiver<Applied>>,
}

#[derive(Default)]
struct State {
    /// Partition → its last stable offset, from the consumer's last statistics.
    ends: BTreeMap<i32, i64>,
    /// The last statistics at which everything up to `ends` was applied.
    caught_up_at: Option<Instant>,
}

impl Health {
    pub fn new(topic: &str, brokers: Arc<Brokers>) -> Arc<Health> {
        Arc::new(Health {
            topic: topic.to_owned(),
            brokers,
            state: Mutex::default(),
            applied: OnceLock::new(),
        })
    }

    /// The brokers this topic lives on.
    pub fn brokers(&self) -> &Brokers {
        &self.brokers
    }

    /// What the materialiser applies (set once it runs).
    pub fn watch_applied(&self, applied: watch::Receiver<Applied>) {
        let _ = self.applied.set(applied);
    }

    /// Records before `ends` that are not applied (`None` before the materialiser runs).
    fn behind(&self, ends: &BTreeMap<i32, i64>) -> Option<i64> {
        self.applied
            .get()
            .map(|a| a.borrow().behind(ends.iter().map(|(p, e)| (*p, *e))))
    }

    /// The consumer's statistics (`up`: whether the brokers are reachable, as they tell).
    fn consumer_stats(&self, stats: &Brief, up: bool) {
        let mut ends = BTreeMap::new();
        if let Some(topic) = stats.topics.get(&self.topic) {
            for partition in topic.partitions.values() {
                // librdkafka's internal "UA" partition is -1; an offset unknown yet is < 0
                if partition.partition >= 0 && partition.ls_offset >= 0 {
                    ends.insert(partition.partition, partition.ls_offset);
                }
            }
        }
        let mut state = self.state.lock();
        if !ends.is_empty() {
            state.ends = ends;
        }
        if up && self.behind(&state.ends) == Some(0) {
            state.caught_up_at = Some(Instant::now());
        }
    }

    /// Records of the topic not applied here, as of the consumer's last statistics.
    pub fn records_behind(&self) -> u64 {
        let state = self.state.lock();
        self.behind(&state.ends).map_or(0, |b| b as u64)
    }

    /// How old the local state's answers may be, in ms (see the module's documentation).
    pub fn behind_ms(&self) -> u64 {
        let up = self.brokers.reachable();
        let state = self.state.lock();
        if up && self.behind(&state.ends) == Some(0) {
            return 0;
        }
        state
            .caught_up_at
            .or(self.brokers.last_up())
            .map_or(0, |t| t.elapsed().as_millis() as u64)
    }
}

/// The context of a storage block's consumer: its statistics, read once into the few fields
/// used, tell the block's [`Brokers`] and every topic's [`Health`]. ([`Statistics`] holds
/// every counter librdkafka reports, and decoding it on the async worker that polls the
/// consumer showed in the p99 of reads.)
///
/// [`Statistics`]: rdkafka::statistics::Statistics
pub struct ConsumerWatch {
    brokers: Arc<Brokers>,
    topics: Mutex<Vec<Arc<Health>>>,
}

impl ConsumerWatch {
    pub fn new(brokers: Arc<Brokers>) -> ConsumerWatch {
        ConsumerWatch {
            brokers,
            topics: Mutex::default(),
        }
    }

    /// Reports the statistics of `health`'s topic to it from now on.
    pub fn watch(&self, health: Arc<Health>) {
        self.topics.lock().push(health);
    }

    fn statistics(&self, brief: &Brief) {
        let up = self.brokers.record(brief);
        let topics = self.topics.lock().clone();
        for health in topics {
            health.consumer_stats(brief, up);
        }
    }
}

impl ClientContext for ConsumerWatch {
    fn stats_raw(&self, statistics: &[u8]) {
        match serde_json::from_slice::<Brief>(statistics) {
            Ok(brief) => self.statistics(&brief),
            Err(e) => tracing::warn!(error = %e, "kafka store: unreadable librdkafka statistics"),
        }
    }
}

impl ConsumerContext for ConsumerWatch {}

/// The parts of librdkafka's statistics that are read.
#[derive(serde::Deserialize)]
struct Brief {
    #[serde(default)]
    brokers: HashMap<String, BriefBroker>,
    #[serde(default)]
    topics: HashMap<String, BriefTopic>,
}

#[derive(serde::Deserialize)]
struct BriefBroker {
    state: String,
}

#[derive(serde::Deserialize)]
struct BriefTopic {
    #[serde(default)]
    partitions: HashMap<String, BriefPartition>,
}

#[derive(serde::Deserialize)]
struct BriefPartition {
    partition: i32,
    #[serde(default = "unknown")]
    ls_offset: i64,
}

fn unknown() -> i64 {
    -1
}
