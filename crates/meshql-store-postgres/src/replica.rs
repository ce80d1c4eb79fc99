//! How far a streaming standby (`read_url`) is behind its primary.
//!
//! A probe reads the standby's replay position (`pg_last_wal_replay_lsn()`) and then the
//! primary's current WAL position (`pg_current_wal_lsn()`), and keeps the primary positions it
//! has seen with the time it saw them. The lag is the age of the oldest one the standby has not
//! replayed yet: zero while it keeps up, growing by wall-clock time while replay is stuck
//! (and not fooled by a quiet primary, as `now() - pg_last_xact_replay_timestamp()` is after
//! a long pause in writes). The byte lag is the newest primary position minus the replayed
//! one. A `read_url` server that is not in recovery cannot tell its lag (`Ok(None)`).

use crate::db::{pg_error, pool_error, PostgresDatabase};
use async_trait::async_trait;
use deadpool_postgres::{PoolError, TimeoutType};
use meshql_core::replica::{Lag, ReplicaProbe, ReplicaSettings};
use meshql_core::StoreError;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Primary positions kept while the standby does not replay them (at the default probe
/// period, about 40 minutes); past it, the oldest is kept and the ones after it are dropped,
/// so the lag never reads shorter than it is.
const HISTORY: usize = 10_000;

pub struct PostgresReplicaProbe {
    db: Arc<PostgresDatabase>,
    settings: ReplicaSettings,
    /// (when seen, primary WAL position), oldest first, each larger than the one before.
    seen: Mutex<VecDeque<(Instant, u64)>>,
    /// The last measurement, repeated while every replica connection is busy (the probe does
    /// not queue for one: waiting would read as a timeout, and reads are shed to the primary
    /// meanwhile anyway).
    last: Mutex<Option<Lag>>,
}

impl PostgresReplicaProbe {
    pub fn new(db: Arc<PostgresDatabase>, settings: ReplicaSettings) -> Self {
        Self {
            db,
            settings,
            seen: Mutex::new(VecDeque::new()),
            last: Mutex::new(None),
        }
    }

    /// The lag once the standby has replayed `replayed` and the primary is at `current`.
    fn account(&self, now: Instant, replayed: u64, current: Option<u64>) -> Lag {
        let mut seen = self.seen.lock().expect("probe history lock");
        if let Some(p) = current {
            if seen.back().is_none_or(|&(_, last)| p > last) {
                if seen.len() >= HISTORY {
                    seen.remove(1);
                }
                seen.push_back((now, p));
            }
        }
        while seen.front().is_some_and(|&(_, p)| p <= replayed) {
            seen.pop_front();
        }
        Lag {
            time: seen
                .front()
                .map(|&(t, _)| now.saturating_duration_since(t))
                .unwrap_or_default(),
            bytes: current.map(|p| p.saturating_sub(replayed)),
        }
    }
}

#[async_trait]
impl ReplicaProbe for PostgresReplicaProbe {
    async fn lag(&self) -> Result<Option<Lag>, StoreError> {
        // never wait for a connection: while reads hold them all, the last measurement
        // stands (and reads are shed to the primary meanwhile anyway)
        let mut now = self.db.read.timeouts();
        now.wait = Some(Duration::ZERO);
        let replica = match self.db.read.timeout_get(&now).await {
            Ok(c) => c,
            Err(PoolError::Timeout(TimeoutType::Wait)) => {
                return Ok(*self.last.lock().expect("probe lock"))
            }
            Err(e) => return Err(pool_error(e)),
        };
        let lag = self.measure(replica).await?;
        *self.last.lock().expect("probe lock") = lag;
        Ok(lag)
    }

    fn saturated(&self) -> bool {
        let s = self.db.read.status();
        s.available == 0 && s.size >= s.max_size
    }

    fn settings(&self) -> ReplicaSettings {
        self.settings
    }
}

impl PostgresReplicaProbe {
    async fn measure(&self, replica: deadpool_postgres::Object) -> Result<Option<Lag>, StoreError> {
        let row = replica
            .query_one(
                "SELECT pg_is_in_recovery(), (pg_last_wal_replay_lsn() - '0/0'::pg_lsn)::bigint",
                &[],
            )
            .await
            .map_err(pg_error)?;
        drop(replica);
        let (in_recovery, replayed): (bool, Option<i64>) = (row.get(0), row.get(1));
        let Some(replayed) = replayed.filter(|_| in_recovery) else {
            return Ok(None);
        };
        // the primary being unreachable says nothing about the replica: the lag is then
        // measured against what was seen before
        let current = match self.db.write.get().await {
            Ok(primary) => primary
                .query_one("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint", &[])
                .await
                .ok()
                .map(|row| row.get::<_, i64>(0) as u64),
            Err(_) => None,
        };
        Ok(Some(self.account(Instant::now(), replayed as u64, current)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe() -> PostgresReplicaProbe {
        let db = PostgresDatabase::connect(&crate::PostgresOptions::new(
            "postgres://nobody@127.0.0.1:1/none",
        ))
        .unwrap();
        PostgresReplicaProbe::new(db, ReplicaSettings::default())
    }

    #[test]
    fn the_lag_is_the_age_of_the_oldest_position_not_replayed() {
        let p = probe();
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        // keeping up: nothing waits
        assert_eq!(p.account(t0, 100, Some(100)).time, Duration::ZERO);
        // the primary moves on, replay stops at 100
        assert_eq!(p.account(t0 + s, 100, Some(150)).time, Duration::ZERO);
        assert_eq!(
            p.account(t0 + 3 * s, 100, Some(180)),
            Lag {
                time: 2 * s,
                bytes: Some(80)
            }
        );
        // replay reaches 150 (seen at t0+1s) but not 180 (seen at t0+3s)
        assert_eq!(p.account(t0 + 4 * s, 150, Some(180)).time, s);
        // a quiet primary: caught up means no lag, however long since the last write
        assert_eq!(p.account(t0 + 100 * s, 180, Some(180)).time, Duration::ZERO);
        // the primary unreachable: measured against what was seen
        assert_eq!(p.account(t0 + 101 * s, 180, Some(200)).time, Duration::ZERO);
        assert_eq!(
            p.account(t0 + 105 * s, 180, None),
            Lag {
                time: 4 * s,
                bytes: None
            }
        );
    }

    #[test]
    fn a_long_stall_keeps_its_oldest_position() {
        let p = probe();
        let t0 = Instant::now();
        for i in 0..(HISTORY as u64 + 50) {
            p.account(t0 + Duration::from_millis(i), 0, Some(i + 1));
        }
        let lag = p.account(t0 + Duration::from_secs(60), 0, Some(1_000_000));
        assert_eq!(lag.time, Duration::from_secs(60));
        assert!(p.seen.lock().unwrap().len() <= HISTORY);
    }
}
