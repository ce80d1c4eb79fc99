//! Reads on a replica that cannot collapse.
//!
//! Seed 004 saw PostgreSQL read replicas turn a p95 of 9 ms into 97 ms at 900 requests/s:
//! reads queued for the replica's connections while the primary had room. Here every read
//! meant for a replica is routed, one by one, by what is known of the replica right now:
//!
//! - a probe ([`ReplicaProbe::lag`]) measures it every `probe_every`: unreachable, or
//!   further behind than `max_lag`, and reads go to the primary until a later probe finds it
//!   back within bounds;
//! - a replica whose connections are all busy ([`ReplicaProbe::saturated`]) sheds the read to
//!   the primary instead of queueing it;
//! - a read the replica fails as unavailable (a connection refused or lost between two
//!   probes) is answered by the primary, and the replica is left until the next probe.
//!
//! None of it is an error to the client. [`ReplicaHealth::stats`] gives the state, the last
//! lag and how many reads went where (for `/metrics`).

use async_trait::async_trait;
use meshql_core::replica::{Lag, ReplicaProbe, ReplicaSettings};
use meshql_core::{
    BatchSearch, DynReader, Envelope, KeyedRows, Nested, NestedRow, ReadContext, Relation, Row,
    Search, StoreError, StoreReader,
};
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// What the last probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaState {
    /// Reachable and within `max_lag` (or not measured yet).
    Usable,
    /// Further behind than `max_lag`.
    Behind,
    /// Unreachable (the probe failed or timed out, or a read failed as unavailable).
    Down,
}

impl ReplicaState {
    pub fn as_str(self) -> &'static str {
        match self {
            ReplicaState::Usable => "usable",
            ReplicaState::Behind => "behind",
            ReplicaState::Down => "down",
        }
    }

    fn from_u8(v: u8) -> Self {
        match v {
            1 => ReplicaState::Behind,
            2 => ReplicaState::Down,
            _ => ReplicaState::Usable,
        }
    }
}

/// Why a read meant for the replica went to the primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detour {
    Behind,
    Down,
    Saturated,
    /// The replica failed the read itself as unavailable.
    Failed,
}

impl Detour {
    pub const ALL: [Detour; 4] = [
        Detour::Behind,
        Detour::Down,
        Detour::Saturated,
        Detour::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Detour::Behind => "behind",
            Detour::Down => "down",
            Detour::Saturated => "saturated",
            Detour::Failed => "failed",
        }
    }
}

/// A snapshot of [`ReplicaHealth`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaStats {
    pub state: ReplicaState,
    /// The last measured lag (`None`: never measured, or the replica cannot tell).
    pub lag: Option<Lag>,
    pub settings: ReplicaSettings,
    /// Reads the replica answered.
    pub on_replica: u64,
    /// Reads sent to the primary instead, by reason (in [`Detour::ALL`] order).
    pub detoured: [(Detour, u64); 4],
}

const NO_LAG: u64 = u64::MAX;

/// One replica's state, shared by the readers of every table on it.
pub struct ReplicaHealth {
    probe: Arc<dyn ReplicaProbe>,
    settings: ReplicaSettings,
    state: AtomicU8,
    lag_ms: AtomicU64,
    lag_bytes: AtomicU64,
    /// The last probe's [`Lag::applied_through`] (0: it could not tell).
    applied_at: AtomicI64,
    on_replica: AtomicU64,
    detoured: [AtomicU64; 4],
    monitor: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// For log lines.
    name: String,
}

impl ReplicaHealth {
    /// The health of the replica `probe` measures; `name` (the storage block) labels logs.
    pub fn new(name: &str, probe: Arc<dyn ReplicaProbe>) -> Arc<Self> {
        let settings = probe.settings();
        Arc::new(Self {
            probe,
            settings,
            state: AtomicU8::new(0),
            lag_ms: AtomicU64::new(NO_LAG),
            lag_bytes: AtomicU64::new(NO_LAG),
            applied_at: AtomicI64::new(0),
            on_replica: AtomicU64::new(0),
            detoured: Default::default(),
            monitor: Mutex::new(None),
            name: name.to_owned(),
        })
    }

    /// Starts probing every `probe_every` (inside a tokio runtime); the task ends with
    /// [`ReplicaHealth::stop`] or when the last handle is dropped.
    pub fn start(self: &Arc<Self>) {
        let mut slot = self.monitor.lock().expect("monitor lock");
        if slot.is_some() {
            return;
        }
        let weak: Weak<Self> = Arc::downgrade(self);
        let every = self.settings.probe_every;
        *slot = Some(tokio::spawn(async move {
            loop {
                match weak.upgrade() {
                    Some(health) => health.probe_once().await,
                    None => return,
                }
                tokio::time::sleep(every).await;
            }
        }));
    }

    pub fn stop(&self) {
        if let Some(task) = self.monitor.lock().expect("monitor lock").take() {
            task.abort();
        }
    }

    /// Measures the replica once and updates the state (a probe that takes longer than
    /// four periods, at least a second, counts as unreachable).
    pub async fn probe_once(&self) {
        let wait = (self.settings.probe_every * 4).max(Duration::from_secs(1));
        let next = match tokio::time::timeout(wait, self.probe.lag()).await {
            Ok(Ok(lag)) => {
                self.applied_at.store(
                    lag.and_then(|l| l.applied_through).unwrap_or(0),
                    Ordering::Relaxed,
                );
                match lag {
                    Some(l) => {
                        self.lag_ms
                            // saturating: a stopped replica may report a huge lag
                            .store(
                                u64::try_from(l.time.as_millis())
                                    .unwrap_or(NO_LAG - 1)
                                    .min(NO_LAG - 1),
                                Ordering::Relaxed,
                            );
                        self.lag_bytes
                            .store(l.bytes.unwrap_or(NO_LAG), Ordering::Relaxed);
                    }
                    None => {
                        self.lag_ms.store(NO_LAG, Ordering::Relaxed);
                        self.lag_bytes.store(NO_LAG, Ordering::Relaxed);
                    }
                }
                match lag {
                    Some(l) if l.time > self.settings.max_lag => ReplicaState::Behind,
                    _ => ReplicaState::Usable,
                }
            }
            Ok(Err(e)) => {
                self.set(ReplicaState::Down, Some(&e.to_string()));
                return;
            }
            Err(_) => {
                self.set(
                    ReplicaState::Down,
                    Some(&format!("the probe took longer than {wait:?}")),
                );
                return;
            }
        };
        self.set(next, None);
    }

    fn set(&self, next: ReplicaState, why: Option<&str>) {
        let before = ReplicaState::from_u8(self.state.swap(next as u8, Ordering::Relaxed));
        if before == next {
            return;
        }
        let lag_ms = self.lag_ms.load(Ordering::Relaxed);
        match next {
            ReplicaState::Usable => tracing::info!(
                storage = %self.name,
                lag_ms = (lag_ms != NO_LAG).then_some(lag_ms),
                "read replica usable again: reads go back to it"
            ),
            ReplicaState::Behind => tracing::warn!(
                storage = %self.name,
                lag_ms,
                max_lag_ms = self.settings.max_lag.as_millis() as u64,
                "read replica too far behind: reads go to the primary until it catches up"
            ),
            ReplicaState::Down => tracing::warn!(
                storage = %self.name,
                error = why.unwrap_or(""),
                "read replica unreachable: reads go to the primary until it answers again"
            ),
        }
    }

    /// A moment up to which the replica has applied every commit: what the last probe could
    /// tell ([`Lag::applied_through`]) less one probe period, a margin for the clocks of the
    /// other processes whose writes it is compared with. `0` when the probe cannot tell
    /// (a lag alone cannot: it is a duration measured to the probe's precision, and says
    /// nothing of a transaction stamped before the probe that commits after it).
    pub fn applied_through(&self) -> meshql_core::Millis {
        match self.applied_at.load(Ordering::Relaxed) {
            0 => 0,
            at => (at - self.settings.probe_every.as_millis() as i64).max(0),
        }
    }

    pub fn state(&self) -> ReplicaState {
        ReplicaState::from_u8(self.state.load(Ordering::Relaxed))
    }

    /// Where the next read goes: the replica, or the primary and why.
    fn route(&self) -> Result<(), Detour> {
        match self.state() {
            ReplicaState::Behind => Err(Detour::Behind),
            ReplicaState::Down => Err(Detour::Down),
            ReplicaState::Usable if self.probe.saturated() => Err(Detour::Saturated),
            ReplicaState::Usable => Ok(()),
        }
    }

    fn count(&self, detour: Detour) {
        self.detoured[detour as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn stats(&self) -> ReplicaStats {
        let lag_ms = self.lag_ms.load(Ordering::Relaxed);
        let bytes = self.lag_bytes.load(Ordering::Relaxed);
        ReplicaStats {
            state: self.state(),
            lag: (lag_ms != NO_LAG).then(|| Lag {
                time: Duration::from_millis(lag_ms),
                bytes: (bytes != NO_LAG).then_some(bytes),
                applied_through: match self.applied_at.load(Ordering::Relaxed) {
                    0 => None,
                    at => Some(at),
                },
            }),
            settings: self.settings,
            on_replica: self.on_replica.load(Ordering::Relaxed),
            detoured: Detour::ALL.map(|d| (d, self.detoured[d as usize].load(Ordering::Relaxed))),
        }
    }
}

impl Drop for ReplicaHealth {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A table's reader on a replica, with the primary to fall back on (see the module docs).
pub struct FallbackReader {
    replica: DynReader,
    primary: DynReader,
    health: Arc<ReplicaHealth>,
}

impl FallbackReader {
    pub fn new(replica: DynReader, primary: DynReader, health: Arc<ReplicaHealth>) -> Self {
        Self {
            replica,
            primary,
            health,
        }
    }
}

/// Runs `$call` with `$reader` bound to the replica or, as routed or after the replica failed
/// it as unavailable, the primary.
macro_rules! routed {
    ($self:ident, $reader:ident => $call:expr) => {{
        match $self.health.route() {
            Ok(()) => {
                let $reader = &$self.replica;
                match $call {
                    Err(StoreError::Unavailable(why)) => {
                        $self.health.count(Detour::Failed);
                        $self.health.set(ReplicaState::Down, Some(&why));
                        let $reader = &$self.primary;
                        $call
                    }
                    answered => {
                        $self.health.on_replica.fetch_add(1, Ordering::Relaxed);
                        answered
                    }
                }
            }
            Err(detour) => {
                $self.health.count(detour);
                let $reader = &$self.primary;
                $call
            }
        }
    }};
}

#[async_trait]
impl StoreReader for FallbackReader {
    async fn read(&self, id: &str, ctx: &ReadContext<'_>) -> Result<Option<Envelope>, StoreError> {
        routed!(self, r => r.read(id, ctx).await)
    }

    async fn read_many(
        &self,
        ids: &[String],
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Envelope>, StoreError> {
        routed!(self, r => r.read_many(ids, ctx).await)
    }

    async fn list(&self, ctx: &ReadContext<'_>) -> Result<Vec<Envelope>, StoreError> {
        routed!(self, r => r.list(ctx).await)
    }

    async fn list_page(
        &self,
        after: Option<&str>,
        limit: usize,
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Envelope>, StoreError> {
        routed!(self, r => r.list_page(after, limit, ctx).await)
    }

    async fn versions(&self, id: &str) -> Result<Vec<Envelope>, StoreError> {
        routed!(self, r => r.versions(id).await)
    }

    async fn find(
        &self,
        search: &Search<'_>,
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Row>, StoreError> {
        routed!(self, r => r.find(search, ctx).await)
    }

    async fn find_batch(
        &self,
        batch: &BatchSearch<'_>,
        ctx: &ReadContext<'_>,
    ) -> Result<KeyedRows, StoreError> {
        routed!(self, r => r.find_batch(batch, ctx).await)
    }

    async fn find_nested(
        &self,
        search: &Search<'_>,
        nested: &[Nested],
        ctx: &ReadContext<'_>,
    ) -> Result<Option<Vec<NestedRow>>, StoreError> {
        routed!(self, r => r.find_nested(search, nested, ctx).await)
    }

    fn relation(&self) -> Option<Relation> {
        self.replica.relation()
    }

    fn applied_through(&self) -> Option<meshql_core::Millis> {
        Some(self.health.applied_through())
    }

    /// Asks the replica itself, whatever the routing: a read that needs a write the replica
    /// has not applied must go to the primary even if the replica is otherwise usable.
    async fn has_version(&self, id: &str, stamp: meshql_core::Millis) -> Result<bool, StoreError> {
        self.replica.has_version(id, stamp).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshql_core::{DynStore, NewDocument, WriteContext};
    use meshql_store_memory::MemoryStore;
    use std::sync::atomic::AtomicBool;
    use std::sync::Mutex as StdMutex;

    /// A replica whose measurements the test sets.
    #[derive(Default)]
    struct Dial {
        lag: StdMutex<Option<Result<Option<Lag>, StoreError>>>,
        saturated: AtomicBool,
    }

    #[async_trait]
    impl ReplicaProbe for Dial {
        async fn lag(&self) -> Result<Option<Lag>, StoreError> {
            self.lag.lock().unwrap().clone().unwrap_or(Ok(None))
        }
        fn saturated(&self) -> bool {
            self.saturated.load(Ordering::Relaxed)
        }
        fn settings(&self) -> ReplicaSettings {
            ReplicaSettings {
                max_lag: Duration::from_millis(500),
                probe_every: Duration::from_millis(50),
            }
        }
    }

    /// A reader that fails every read as unavailable (a replica gone between two probes).
    struct Gone;

    #[async_trait]
    impl StoreReader for Gone {
        async fn read(&self, _: &str, _: &ReadContext<'_>) -> Result<Option<Envelope>, StoreError> {
            Err(StoreError::Unavailable("connection refused".into()))
        }
        async fn read_many(
            &self,
            _: &[String],
            _: &ReadContext<'_>,
        ) -> Result<Vec<Envelope>, StoreError> {
            Err(StoreError::Unavailable("connection refused".into()))
        }
        async fn list(&self, _: &ReadContext<'_>) -> Result<Vec<Envelope>, StoreError> {
            Err(StoreError::Unavailable("connection refused".into()))
        }
        async fn list_page(
            &self,
            _: Option<&str>,
            _: usize,
            _: &ReadContext<'_>,
        ) -> Result<Vec<Envelope>, StoreError> {
            Err(StoreError::Unavailable("connection refused".into()))
        }
        async fn versions(&self, _: &str) -> Result<Vec<Envelope>, StoreError> {
            Err(StoreError::Unavailable("connection refused".into()))
        }
        async fn find(&self, _: &Search<'_>, _: &ReadContext<'_>) -> Result<Vec<Row>, StoreError> {
            Err(StoreError::Unavailable("connection refused".into()))
        }
        async fn find_batch(
            &self,
            _: &BatchSearch<'_>,
            _: &ReadContext<'_>,
        ) -> Result<KeyedRows, StoreError> {
            Err(StoreError::Unavailable("connection refused".into()))
        }
    }

    async fn doc(store: &DynStore, name: &str) -> String {
        store
            .create(
                NewDocument::new(
                    serde_json::json!({ "name": name })
                        .as_object()
                        .unwrap()
                        .clone(),
                ),
                &WriteContext::SYSTEM,
            )
            .await
            .unwrap()
            .id
    }

    /// Primary and replica are two stores: a document only the primary has tells which one
    /// answered.
    async fn pair() -> (DynStore, DynStore, String) {
        let primary: DynStore = Arc::new(MemoryStore::new());
        let replica: DynStore = Arc::new(MemoryStore::new());
        let id = doc(&primary, "only on the primary").await;
        (primary, replica, id)
    }

    fn served_by_primary(found: Option<Envelope>) -> bool {
        found.is_some()
    }

    #[tokio::test]
    async fn reads_leave_a_replica_that_is_behind_down_or_saturated_and_come_back() {
        let (primary, replica, id) = pair().await;
        let dial = Arc::new(Dial::default());
        let health = ReplicaHealth::new("db", dial.clone());
        let reader = FallbackReader::new(replica, primary, health.clone());
        let read = || reader.read(&id, &ReadContext::LATEST);

        // not measured yet, then measured within bounds: the replica answers
        assert!(!served_by_primary(read().await.unwrap()));
        *dial.lag.lock().unwrap() = Some(Ok(Some(Lag {
            time: Duration::from_millis(100),
            bytes: Some(10),
            ..Lag::default()
        })));
        health.probe_once().await;
        assert_eq!(health.state(), ReplicaState::Usable);
        assert!(!served_by_primary(read().await.unwrap()));

        // further behind than max_lag: the primary
        *dial.lag.lock().unwrap() = Some(Ok(Some(Lag {
            time: Duration::from_secs(2),
            bytes: None,
            ..Lag::default()
        })));
        health.probe_once().await;
        assert_eq!(health.state(), ReplicaState::Behind);
        assert!(served_by_primary(read().await.unwrap()));

        // unreachable: the primary
        *dial.lag.lock().unwrap() = Some(Err(StoreError::Unavailable("refused".into())));
        health.probe_once().await;
        assert_eq!(health.state(), ReplicaState::Down);
        assert!(served_by_primary(read().await.unwrap()));

        // back: the replica again, except while its connections are all busy
        *dial.lag.lock().unwrap() = Some(Ok(Some(Lag::default())));
        health.probe_once().await;
        assert_eq!(health.state(), ReplicaState::Usable);
        assert!(!served_by_primary(read().await.unwrap()));
        dial.saturated.store(true, Ordering::Relaxed);
        assert!(served_by_primary(read().await.unwrap()));
        dial.saturated.store(false, Ordering::Relaxed);

        let stats = health.stats();
        assert_eq!(stats.on_replica, 3);
        assert_eq!(
            stats.detoured,
            [
                (Detour::Behind, 1),
                (Detour::Down, 1),
                (Detour::Saturated, 1),
                (Detour::Failed, 0)
            ]
        );
        assert_eq!(stats.lag, Some(Lag::default()));
    }

    #[tokio::test]
    async fn a_read_the_replica_fails_is_answered_by_the_primary_and_the_replica_left() {
        let primary: DynStore = Arc::new(MemoryStore::new());
        let id = doc(&primary, "kept").await;
        let dial = Arc::new(Dial::default());
        let health = ReplicaHealth::new("db", dial.clone());
        let reader = FallbackReader::new(Arc::new(Gone), primary, health.clone());
        let found = reader.read(&id, &ReadContext::LATEST).await.unwrap();
        assert!(found.is_some(), "no error reaches the caller");
        assert_eq!(health.state(), ReplicaState::Down);
        assert_eq!(reader.list(&ReadContext::LATEST).await.unwrap().len(), 1);
        let stats = health.stats();
        assert_eq!(stats.detoured[3], (Detour::Failed, 1));
        assert_eq!(stats.detoured[1], (Detour::Down, 1));
    }

    #[tokio::test]
    async fn the_monitor_probes_until_stopped() {
        let dial = Arc::new(Dial::default());
        *dial.lag.lock().unwrap() = Some(Ok(Some(Lag {
            time: Duration::from_secs(3),
            bytes: None,
            ..Lag::default()
        })));
        let health = ReplicaHealth::new("db", dial.clone());
        health.start();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while health.state() != ReplicaState::Behind {
            assert!(tokio::time::Instant::now() < deadline, "the monitor probed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        health.stop();
        *dial.lag.lock().unwrap() = Some(Ok(Some(Lag::default())));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            health.state(),
            ReplicaState::Behind,
            "stopped: no more probes"
        );
    }
}
