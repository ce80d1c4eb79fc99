//! The probe of the `read_url` client: whether its servers answer, and whether its permits
//! are all taken. Not how far behind they are.
//!
//! A probe pings (`{ping: 1}` on the database) a server the client reads from, chosen by its
//! read preference as its reads are: a failure (no server selectable in time, a refused or
//! lost connection) is `StoreError::Unavailable`, and an answer is `Ok(None)`, a lag it cannot
//! tell. Replication lag is not measured: `replSetGetStatus`, which reports every member's
//! optime, needs a user with the `clusterMonitor` role on `admin`, and FerretDB, the server the
//! tests run against, has no such command. So a MongoDB `read_url` leaves the API's reads
//! while its servers are unreachable or its permits all taken, never because of lag, and
//! `read_max_lag_ms` has no effect. On a replica set, the driver's own bound does that part:
//! `maxStalenessSeconds` in the `read_url` (90 at least) keeps reads off secondaries further
//! behind than that.
//!
//! The probe takes one of the client's permits like any operation, but does not wait for one:
//! while every permit is held it repeats its last answer (reads are shed to the primary
//! meanwhile anyway).

use crate::MongoDatabase;
use async_trait::async_trait;
use meshql_core::replica::{Lag, ReplicaProbe, ReplicaSettings};
use meshql_core::StoreError;
use std::sync::{Arc, Mutex};

/// The probe of one database's `read_url` client.
pub(crate) struct MongoReplicaProbe {
    replica: Arc<MongoDatabase>,
    settings: ReplicaSettings,
    /// The last answer, repeated while every permit is held.
    last: Mutex<Result<(), StoreError>>,
}

impl MongoReplicaProbe {
    pub(crate) fn new(replica: Arc<MongoDatabase>, settings: ReplicaSettings) -> Self {
        Self {
            replica,
            settings,
            last: Mutex::new(Ok(())),
        }
    }
}

#[async_trait]
impl ReplicaProbe for MongoReplicaProbe {
    async fn lag(&self) -> Result<Option<Lag>, StoreError> {
        let answer = match self.replica.ping_reads_if_free().await {
            Some(answer) => {
                *self.last.lock().expect("probe lock") = answer.clone();
                answer
            }
            None => self.last.lock().expect("probe lock").clone(),
        };
        answer.map(|()| None)
    }

    fn saturated(&self) -> bool {
        self.replica.saturated()
    }

    fn settings(&self) -> ReplicaSettings {
        self.settings
    }
}
