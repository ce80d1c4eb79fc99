//! What a backend tells about its read replica, so that reads can leave it before it hurts:
//! how far behind it is, whether it answers at all, and whether a read sent to it now would
//! wait for a connection. The engine (`meshql_engine::replica`) routes on it.

use crate::StoreError;
use async_trait::async_trait;
use std::time::Duration;

/// How far a replica is behind its primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lag {
    /// How long the oldest change the primary has and the replica has not applied has been
    /// waiting (zero when it has applied everything).
    pub time: Duration,
    /// How much the replica has still to apply, in the backend's unit (PostgreSQL: WAL
    /// bytes), when it can tell.
    pub bytes: Option<u64>,
    /// A moment (Unix milliseconds, this process's clock) such that every transaction the
    /// primary had committed by then is applied on the replica, when the probe can tell
    /// (PostgreSQL: when it read a primary position the replica has since replayed). A cache
    /// in front of the replica keeps only answers that cover the writes it knows of by it.
    pub applied_through: Option<crate::Millis>,
}

/// A storage block's bounds on its replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaSettings {
    /// Further behind than this, reads go to the primary until it catches up.
    pub max_lag: Duration,
    /// How often the replica's lag and reachability are measured.
    pub probe_every: Duration,
}

impl Default for ReplicaSettings {
    fn default() -> Self {
        Self {
            max_lag: Duration::from_millis(1000),
            probe_every: Duration::from_millis(250),
        }
    }
}

/// A backend's view of its replica (one per database with a `read_url`).
#[async_trait]
pub trait ReplicaProbe: Send + Sync + 'static {
    /// Measures the replica: `Ok(Some(lag))`; `Ok(None)` when it answers but cannot tell
    /// its lag (a server that is not a standby); an error when it cannot be reached.
    async fn lag(&self) -> Result<Option<Lag>, StoreError>;

    /// Whether every connection to the replica is busy, so that a read sent there now would
    /// queue. Called on every read: it must be cheap (a look at the pool's counters).
    fn saturated(&self) -> bool;

    /// The storage block's bounds.
    fn settings(&self) -> ReplicaSettings;
}

/// `read_max_lag_ms`'s default in a storage block (serde's `default = "…"`).
pub fn default_max_lag_ms() -> u64 {
    ReplicaSettings::default().max_lag.as_millis() as u64
}

/// `read_probe_ms`'s default in a storage block.
pub fn default_probe_ms() -> u64 {
    ReplicaSettings::default().probe_every.as_millis() as u64
}

impl ReplicaSettings {
    /// A storage block's `read_max_lag_ms` and `read_probe_ms`, checked: a probe at most every
    /// 10 ms (each is a round trip to the replica).
    pub fn from_block(
        max_lag_ms: u64,
        probe_ms: u64,
    ) -> Result<ReplicaSettings, crate::SettingError> {
        if probe_ms < 10 {
            return Err(crate::SettingError::new(
                "read_probe_ms",
                "must be at least 10 (each probe is a round trip to the replica)",
            ));
        }
        Ok(ReplicaSettings {
            max_lag: Duration::from_millis(max_lag_ms),
            probe_every: Duration::from_millis(probe_ms),
        })
    }
}
