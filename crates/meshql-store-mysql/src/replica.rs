//! How far a replica (`read_url`) is behind its source, as the server itself reports it.
//!
//! A probe asks the replica `SHOW REPLICA STATUS` (MariaDB 10.5 and MySQL 8.0.22 on; an older
//! server rejects it as a syntax error and is asked `SHOW SLAVE STATUS` from then on) and
//! reads `Seconds_Behind_Master` (MariaDB, and MySQL's older statement) or
//! `Seconds_Behind_Source` (MySQL's newer one). That figure is the server's estimate, in whole
//! seconds: how old the event the replica is applying is, by the replica's clock corrected for
//! the skew it saw on connecting. It counts only what the replica has received (a replica that
//! falls behind reading its source's log reads less behind than it is), a `read_max_lag_ms`
//! under 1000 amounts to "any whole second", and there is no byte count (`bytes` is `None`).
//!
//! - No row: the server is not a replica, and cannot tell its lag (`Ok(None)`). A user without
//!   the privilege to ask (MySQL: `REPLICATION CLIENT`; MariaDB: `SLAVE MONITOR`; error 1227)
//!   cannot tell either: a warning names the privilege once, and the probe answers `Ok(None)`.
//! - NULL: replication is not running (stopped, broken by an error, or reconnecting to its
//!   source), so the replica falls further behind with every write: the lag is [`STOPPED`].
//! - Several rows (MySQL's replication channels): the largest lag, [`STOPPED`] if any is NULL.
//! - No connection: `StoreError::Unavailable`, as every operation maps it.
//!
//! The probe takes a connection of the replica's pool, but does not queue for one: while every
//! connection is lent out it repeats its last measurement (reads are shed to the primary
//! meanwhile anyway).

use crate::db::{my_error, MysqlDatabase};
use async_trait::async_trait;
use meshql_core::replica::{Lag, ReplicaProbe, ReplicaSettings};
use meshql_core::StoreError;
use mysql_async::prelude::Queryable;
use mysql_async::Row;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The lag of a replica whose replication is not running (`Seconds_Behind_Master` NULL):
/// about 136 years, beyond any `read_max_lag_ms`, and still a whole number of milliseconds in
/// a `u64` (what `/metrics` shows; `Duration::MAX` is not).
pub(crate) const STOPPED: Duration = Duration::from_secs(u32::MAX as u64);

/// `ER_PARSE_ERROR`: a server older than `SHOW REPLICA STATUS`.
const PARSE_ERROR: u16 = 1064;
/// `ER_SPECIFIC_ACCESS_DENIED_ERROR`: the user lacks the privilege to see replication status.
const ACCESS_DENIED: u16 = 1227;

/// The probe of one database's `read_url` pool.
pub(crate) struct MysqlReplicaProbe {
    replica: Arc<MysqlDatabase>,
    settings: ReplicaSettings,
    /// The server rejected `SHOW REPLICA STATUS`: it is asked `SHOW SLAVE STATUS` instead.
    older_syntax: AtomicBool,
    /// The privilege warning was logged.
    warned: AtomicBool,
    /// The last measurement, repeated while every replica connection is lent out.
    last: Mutex<Result<Option<Lag>, StoreError>>,
}

impl MysqlReplicaProbe {
    pub(crate) fn new(replica: Arc<MysqlDatabase>, settings: ReplicaSettings) -> Self {
        Self {
            replica,
            settings,
            older_syntax: AtomicBool::new(false),
            warned: AtomicBool::new(false),
            last: Mutex::new(Ok(None)),
        }
    }

    async fn measure(&self) -> Result<Option<Lag>, StoreError> {
        let mut conn = self.replica.conn().await?;
        let rows: Vec<Row> = match self.status(&mut conn).await {
            Ok(rows) => rows,
            Err(mysql_async::Error::Server(e)) if e.code == ACCESS_DENIED => {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        error = %e.message,
                        "read replica: its lag cannot be read without the privilege to see \
                         replication status (MySQL: REPLICATION CLIENT; MariaDB: SLAVE \
                         MONITOR); it is probed for reachability and saturation only"
                    );
                }
                return Ok(None);
            }
            Err(e) => return Err(my_error(e)),
        };
        drop(conn);
        let behind = rows
            .iter()
            .map(seconds_behind)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(lag_of(behind))
    }

    /// The rows of `SHOW REPLICA STATUS`, or of `SHOW SLAVE STATUS` on a server that does not
    /// know the first.
    async fn status(&self, conn: &mut mysql_async::Conn) -> Result<Vec<Row>, mysql_async::Error> {
        if !self.older_syntax.load(Ordering::Relaxed) {
            match conn.query("SHOW REPLICA STATUS").await {
                Err(mysql_async::Error::Server(e)) if e.code == PARSE_ERROR => {
                    self.older_syntax.store(true, Ordering::Relaxed);
                }
                other => return other,
            }
        }
        conn.query("SHOW SLAVE STATUS").await
    }
}

/// A status row's seconds behind (`None`: NULL, replication not running).
fn seconds_behind(row: &Row) -> Result<Option<u64>, StoreError> {
    ["Seconds_Behind_Source", "Seconds_Behind_Master"]
        .into_iter()
        .find_map(|column| row.get_opt::<Option<u64>, _>(column))
        .ok_or_else(|| {
            StoreError::Query(
                "the replica's status has neither Seconds_Behind_Source nor \
                 Seconds_Behind_Master"
                    .into(),
            )
        })?
        .map_err(|e| StoreError::Query(format!("the replica's seconds behind: {e}")))
}

/// The lag of a replica whose status rows (one per replication channel) read `behind`.
fn lag_of(behind: Vec<Option<u64>>) -> Option<Lag> {
    if behind.is_empty() {
        return None;
    }
    let time = behind
        .into_iter()
        .try_fold(Duration::ZERO, |most, s| {
            s.map(|s| most.max(Duration::from_secs(s)))
        })
        .unwrap_or(STOPPED);
    // Seconds_Behind_Source counts whole seconds of the relay log's replay only, not what
    // the replica has yet to receive: no moment it has applied everything up to follows
    Some(Lag {
        time,
        bytes: None,
        applied_through: None,
    })
}

#[async_trait]
impl ReplicaProbe for MysqlReplicaProbe {
    async fn lag(&self) -> Result<Option<Lag>, StoreError> {
        if self.saturated() {
            return self.last.lock().expect("probe lock").clone();
        }
        let measured = self.measure().await;
        *self.last.lock().expect("probe lock") = measured.clone();
        measured
    }

    fn saturated(&self) -> bool {
        self.replica.saturated()
    }

    fn settings(&self) -> ReplicaSettings {
        self.settings
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lag_is_the_largest_channel_s_and_null_is_stopped() {
        let s = Duration::from_secs;
        assert_eq!(lag_of(vec![]), None, "not a replica");
        assert_eq!(
            lag_of(vec![Some(0)]),
            Some(Lag {
                time: Duration::ZERO,
                bytes: None,
                applied_through: None
            })
        );
        assert_eq!(lag_of(vec![Some(3), Some(7), Some(1)]).unwrap().time, s(7));
        assert_eq!(lag_of(vec![None]).unwrap().time, STOPPED);
        assert_eq!(lag_of(vec![Some(3), None]).unwrap().time, STOPPED);
        assert!(STOPPED > s(365 * 24 * 3600 * 100));
        assert!(u64::try_from(STOPPED.as_millis()).is_ok(), "fits /metrics");
    }
}
