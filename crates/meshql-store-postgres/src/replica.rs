//! How far a streaming standby (`read_url`) is behind its primary.
//!
//! A probe reads the standby's replay position (`pg_last_wal_replay_lsn()`) and then the
//! primary's WAL insert position (`pg_current_wal_insert_lsn()`), and keeps the primary
//! positions it has seen with the time it saw them. The lag is the age of the oldest one the standby has not
//! replayed yet: zero while it keeps up, growing by wall-clock time while replay is stuck
//! (and not fooled by a quiet primary, as `now() - pg_last_xact_replay_timestamp()` is after
//! a long pause in writes). The byte lag is the newest primary position minus the replayed
//! one. A `read_url` server that is not in recovery cannot tell its lag (`Ok(None)`).
//!
//! **The insert position, not the write position.** A commit made with
//! `synchronous_commit = off` is acknowledged while its record is still in the primary's WAL
//! buffers: `pg_current_wal_lsn()` (what has been written out) does not cover it until the WAL
//! writer runs (up to three `wal_writer_delay`s later, 600 ms by default), so a probe reading
//! it would call a standby without that commit caught up, and say so for longer than
//! `read_max_lag_ms`. The insert position covers every record inserted, hence every
//! acknowledged commit. It has one artefact: when the last record ends exactly at a page's
//! end, the insert position is after the next page's header, which the standby's replay
//! position (the end of the last record) never reaches while the primary is quiet; a position
//! no further than a page header past a replayed page boundary is therefore replayed.
//!
//! **Applied through.** Each primary position is kept with the wall-clock moment taken just
//! *before* it was read: every transaction committed by that moment is at or below it. Once
//! the standby has replayed a position, it has applied every commit up to that moment, which
//! the probe reports as [`Lag::applied_through`] (the newest such moment). A cache in front
//! of the standby compares it with when its tags were advanced, after their writes
//! committed.

use crate::db::{pg_error, pool_error, PostgresDatabase};
use async_trait::async_trait;
use deadpool_postgres::{PoolError, TimeoutType};
use meshql_core::replica::{Lag, ReplicaProbe, ReplicaSettings};
use meshql_core::{Millis, StoreError};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Primary positions kept while the standby does not replay them (at the default probe
/// period, about 40 minutes); past it, the oldest is kept and the ones after it are dropped,
/// so the lag never reads shorter than it is.
const HISTORY: usize = 10_000;

/// The longest WAL page header (the first page of a segment): an insert position at most this
/// far past a page boundary holds no record beyond the boundary (a record's own header is 24
/// bytes).
const LONG_PAGE_HEADER: u64 = 40;

/// PostgreSQL's WAL page size unless the server says otherwise (`wal_block_size`).
const DEFAULT_WAL_BLOCK: u64 = 8192;

pub struct PostgresReplicaProbe {
    db: Arc<PostgresDatabase>,
    settings: ReplicaSettings,
    /// Primary positions seen, oldest first, each larger than the one before, and the newest
    /// moment up to which the standby is known to have applied every commit.
    seen: Mutex<Seen>,
    /// The last measurement, repeated while every replica connection is busy (the probe does
    /// not queue for one: waiting would read as a timeout, and reads are shed to the primary
    /// meanwhile anyway).
    last: Mutex<Option<Lag>>,
    /// The standby's `wal_block_size`.
    wal_block: std::sync::atomic::AtomicU64,
}

/// Whether a standby that has replayed up to `replayed` has every record the primary had
/// inserted when its insert position was `position` (see the module's docs for the page
/// header).
fn replayed_through(replayed: u64, position: u64, wal_block: u64) -> bool {
    replayed >= position
        || (replayed > 0
            && replayed.is_multiple_of(wal_block)
            && position - replayed <= LONG_PAGE_HEADER)
}

/// A primary position and when it was read.
#[derive(Debug, Clone, Copy)]
struct Position {
    /// When it was seen (for the lag).
    seen: Instant,
    /// Just before it was read (Unix milliseconds): every commit by then is at or below it.
    read_from: Millis,
    lsn: u64,
}

#[derive(Default)]
struct Seen {
    positions: VecDeque<Position>,
    /// The `read_from` of the newest position replayed (0: none yet).
    applied_through: Millis,
}

impl PostgresReplicaProbe {
    pub fn new(db: Arc<PostgresDatabase>, settings: ReplicaSettings) -> Self {
        Self {
            db,
            settings,
            seen: Mutex::new(Seen::default()),
            last: Mutex::new(None),
            wal_block: std::sync::atomic::AtomicU64::new(DEFAULT_WAL_BLOCK),
        }
    }

    /// The lag once the standby has replayed `replayed` and the primary is at `current`
    /// (read from the moment `read_from`).
    fn account(&self, now: Instant, replayed: u64, current: Option<(Millis, u64)>) -> Lag {
        let mut seen = self.seen.lock().expect("probe history lock");
        if let Some((read_from, lsn)) = current {
            if seen.positions.back().is_none_or(|last| lsn > last.lsn) {
                if seen.positions.len() >= HISTORY {
                    seen.positions.remove(1);
                }
                seen.positions.push_back(Position {
                    seen: now,
                    read_from,
                    lsn,
                });
            } else if let Some(last) = seen.positions.back_mut() {
                // the primary has not moved: its position holds every commit by now
                last.read_from = last.read_from.max(read_from);
            }
        }
        let wal_block = self.wal_block.load(std::sync::atomic::Ordering::Relaxed);
        while let Some(oldest) = seen.positions.front().copied() {
            if !replayed_through(replayed, oldest.lsn, wal_block) {
                break;
            }
            seen.applied_through = seen.applied_through.max(oldest.read_from);
            seen.positions.pop_front();
        }
        Lag {
            time: seen
                .positions
                .front()
                .map(|p| now.saturating_duration_since(p.seen))
                .unwrap_or_default(),
            bytes: current.map(|(_, p)| {
                if replayed_through(replayed, p, wal_block) {
                    0
                } else {
                    p - replayed
                }
            }),
            applied_through: Some(seen.applied_through).filter(|&t| t > 0),
        }
    }
}

#[async_trait]
impl ReplicaProbe for PostgresReplicaProbe {
    async fn lag(&self) -> Result<Option<Lag>, StoreError> {
        // never wait for a connection: while reads hold them all, the last measurement
        // stands (and reads are shed to the primary meanwhile anyway)
        let mut now = self.db.read.shared().timeouts();
        now.wait = Some(Duration::ZERO);
        let replica = match self.db.read.shared().timeout_get(&now).await {
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
        self.db.read.saturated()
    }

    fn settings(&self) -> ReplicaSettings {
        self.settings
    }
}

impl PostgresReplicaProbe {
    async fn measure(&self, replica: deadpool_postgres::Object) -> Result<Option<Lag>, StoreError> {
        let row = replica
            .query_one(
                "SELECT pg_is_in_recovery(), (pg_last_wal_replay_lsn() - '0/0'::pg_lsn)::bigint, \
                 current_setting('wal_block_size')::bigint",
                &[],
            )
            .await
            .map_err(pg_error)?;
        drop(replica);
        let (in_recovery, replayed): (bool, Option<i64>) = (row.get(0), row.get(1));
        if let Ok(block) = u64::try_from(row.get::<_, i64>(2)) {
            if block > 0 {
                self.wal_block
                    .store(block, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let Some(replayed) = replayed.filter(|_| in_recovery) else {
            return Ok(None);
        };
        // the primary being unreachable says nothing about the replica: the lag is then
        // measured against what was seen before
        let current = match self.db.write.get().await {
            Ok(primary) => {
                let read_from = meshql_core::time::now_millis();
                primary
                    .query_one(
                        "SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint",
                        &[],
                    )
                    .await
                    .ok()
                    .map(|row| (read_from, row.get::<_, i64>(0) as u64))
            }
            Err(_) => None,
        };
        Ok(Some(self.account(Instant::now(), replayed as u64, current)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A primary position read from the moment `lsn` (for these tests, the same number).
    fn at(lsn: u64) -> Option<(Millis, u64)> {
        Some((lsn as Millis * 10, lsn))
    }

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
        assert_eq!(p.account(t0, 100, at(100)).time, Duration::ZERO);
        // the primary moves on, replay stops at 100
        assert_eq!(p.account(t0 + s, 100, at(150)).time, Duration::ZERO);
        assert_eq!(
            p.account(t0 + 3 * s, 100, at(180)),
            Lag {
                time: 2 * s,
                bytes: Some(80),
                applied_through: Some(1_000)
            }
        );
        // replay reaches 150 (seen at t0+1s) but not 180 (seen at t0+3s)
        assert_eq!(p.account(t0 + 4 * s, 150, at(180)).time, s);
        // a quiet primary: caught up means no lag, however long since the last write
        assert_eq!(p.account(t0 + 100 * s, 180, at(180)).time, Duration::ZERO);
        // the primary unreachable: measured against what was seen
        assert_eq!(p.account(t0 + 101 * s, 180, at(200)).time, Duration::ZERO);
        assert_eq!(
            p.account(t0 + 105 * s, 180, None),
            Lag {
                time: 4 * s,
                bytes: None,
                applied_through: Some(1_800)
            }
        );
    }

    #[test]
    fn an_insert_position_just_past_a_page_header_is_replayed_at_the_page_boundary() {
        let block = DEFAULT_WAL_BLOCK;
        let page = 7 * block;
        // the last record ended at the page's end: the insert position is after the next
        // page's header (short, or long at a segment's start)
        assert!(replayed_through(page, page + 24, block));
        assert!(replayed_through(page, page + 40, block));
        // a record on the new page (its own header is 24 bytes) is not replayed
        assert!(!replayed_through(page, page + 48, block));
        // only at a boundary
        assert!(!replayed_through(page - 8, page + 24, block));
        assert!(replayed_through(page + 100, page + 100, block));
        // the probe: a quiet primary whose insert position sits past a page header is caught up
        let p = probe();
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        p.account(t0, page, Some((1_000, page + 24)));
        let lag = p.account(t0 + 10 * s, page, Some((2_000, page + 24)));
        assert_eq!(lag.time, Duration::ZERO);
        assert_eq!(lag.bytes, Some(0));
    }

    #[test]
    fn a_long_stall_keeps_its_oldest_position() {
        let p = probe();
        let t0 = Instant::now();
        for i in 0..(HISTORY as u64 + 50) {
            p.account(t0 + Duration::from_millis(i), 0, Some((1, i + 1)));
        }
        let lag = p.account(t0 + Duration::from_secs(60), 0, Some((2, 1_000_000)));
        assert_eq!(lag.time, Duration::from_secs(60));
        assert_eq!(lag.applied_through, None, "nothing replayed");
        assert!(p.seen.lock().unwrap().positions.len() <= HISTORY);
    }

    #[test]
    fn applied_through_is_when_the_newest_replayed_position_was_read() {
        let p = probe();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // never a replayed position yet: it cannot tell
        assert_eq!(p.account(t0, 5, Some((1_000, 10))).applied_through, None);
        // read at 1,000 and 1,300; replay reaches the first: everything committed by 1,000
        assert_eq!(
            p.account(t0 + ms(300), 10, Some((1_300, 20)))
                .applied_through,
            Some(1_000)
        );
        // the primary has not moved since 1,300 when read again at 1,600: once replayed,
        // everything committed by 1,600 is applied
        assert_eq!(
            p.account(t0 + ms(600), 15, Some((1_600, 20)))
                .applied_through,
            Some(1_000)
        );
        assert_eq!(
            p.account(t0 + ms(900), 20, Some((1_900, 20)))
                .applied_through,
            Some(1_900)
        );
        // a transaction stamped before 1,900 that commits at 2,000 is above the position
        // read at 1,900: not covered until a later position is replayed
        assert_eq!(
            p.account(t0 + ms(1_200), 20, Some((2_200, 30)))
                .applied_through,
            Some(1_900)
        );
        assert_eq!(
            p.account(t0 + ms(1_500), 30, Some((2_500, 30)))
                .applied_through,
            Some(2_500)
        );
    }
}
