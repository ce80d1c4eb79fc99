//! The connection: [`MongoOptions`], and [`MongoDatabase`], the client (and the `read_url`'s
//! second one) with the permits every operation takes first; connect, ping, close.

use crate::error::error;
use crate::feed::DEFAULT_FEED_GRACE;
use meshql_core::StoreError;
use mongodb::bson::doc;
use mongodb::options::{ClientOptions, ReadPreference, SelectionCriteria};
use mongodb::Client;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, SemaphorePermit};

/// How a [`MongoDatabase`] connects.
#[derive(Debug, Clone)]
pub struct MongoOptions {
    /// `mongodb://…` with any driver options (`replicaSet`, `readPreference`, `maxPoolSize`).
    pub uri: String,
    /// A second client for the API's reads (a replica set's secondaries, say), the same
    /// database name through it; reads use `uri` when absent. Without a `readPreference` of
    /// its own it reads with `secondaryPreferred` (see [`MongoDatabase::connect`]).
    pub read_url: Option<String>,
    /// Database name.
    pub database: String,
    /// Operations in flight at once; the URI's `maxPoolSize` when `None`, else 16.
    pub pool_size: Option<usize>,
    /// How long an operation waits for a free connection before failing with 503.
    pub pool_wait: Duration,
    /// How long a change-feed reader waits for a position another process drew before
    /// skipping it (see [`crate::feed`]).
    pub feed_grace: Duration,
    /// Bounds on the `read_url` client's servers (see `replica.rs`).
    pub replica: meshql_core::replica::ReplicaSettings,
}

impl MongoOptions {
    pub fn new(uri: impl Into<String>, database: impl Into<String>) -> Self {
        Self {
            uri: uri.into(),
            database: database.into(),
            read_url: None,
            pool_size: None,
            pool_wait: Duration::from_secs(5),
            feed_grace: DEFAULT_FEED_GRACE,
            replica: Default::default(),
        }
    }
}

/// A MongoDB client and database.
///
/// The driver queues operations for a connection without a bound, so every operation first
/// takes one of `pool_size` permits (the driver's `maxPoolSize` is one more: the change feed's
/// reader takes no permit and has that connection to itself),
/// waiting at most `pool_wait`: past that the request is answered 503 instead of queueing
/// for ever.
///
/// With a `read_url`, the database holds a second one for the API's reads: a client of its
/// own with permits of its own (the same `pool_size` and `pool_wait`), whose collections are
/// the readers [`meshql_core::Database::replica`] hands out ([`MongoStore::replica`](crate::MongoStore::replica)). Stores
/// made by [`meshql_core::Database::store`] never read through it.
pub struct MongoDatabase {
    client: Client,
    pub(crate) db: mongodb::Database,
    permits: Arc<Semaphore>,
    /// The permits there are (`pool_size`).
    pool_size: usize,
    pool_wait: Duration,
    pub(crate) feed_grace: Duration,
    /// The client for the API's reads (`read_url`); it has no replica of its own.
    pub(crate) replica: Option<Arc<MongoDatabase>>,
    /// Bounds on `replica`.
    pub(crate) replica_settings: meshql_core::replica::ReplicaSettings,
}

impl std::fmt::Debug for MongoDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MongoDatabase")
    }
}

impl MongoDatabase {
    /// Parses the URI (replicaSet, readPreference, maxPoolSize... are honoured) and builds
    /// the client; connections are made in the background. With a `read_url`, builds its
    /// client too, the same way, except that a `read_url` without a `readPreference` reads
    /// with `secondaryPreferred` (a secondary when one is available, else the primary), not
    /// the driver's default `primary`, which would make the second client pointless on a
    /// replica set.
    pub async fn connect(o: &MongoOptions) -> Result<Arc<Self>, StoreError> {
        let mut primary = Self::client(&o.uri, o, false).await?;
        if let Some(url) = &o.read_url {
            primary.replica = Some(Arc::new(Self::client(url, o, true).await?));
        }
        Ok(Arc::new(primary))
    }

    /// One client, without a replica: the primary's, or (`for_reads`) the `read_url`'s.
    async fn client(uri: &str, o: &MongoOptions, for_reads: bool) -> Result<Self, StoreError> {
        let what = if for_reads { "read_url" } else { "URI" };
        let mut options = ClientOptions::parse(uri)
            .await
            .map_err(|e| StoreError::Invalid(format!("bad MongoDB {what}: {e}")))?;
        if for_reads && options.selection_criteria.is_none() {
            options.selection_criteria = Some(SelectionCriteria::ReadPreference(
                ReadPreference::SecondaryPreferred { options: None },
            ));
        }
        let pool_size = o
            .pool_size
            .or(options.max_pool_size.map(|n| n as usize))
            .unwrap_or(16)
            .max(1);
        // one connection more than request permits: the change feed's reader has its own,
        // so a service tailing its feed never takes a connection a request is waiting for
        options.max_pool_size = Some(pool_size as u32 + 1);
        if options.server_selection_timeout.is_none() {
            options.server_selection_timeout = Some(Duration::from_secs(5));
        }
        if options.app_name.is_none() {
            options.app_name = Some("meshql".into());
        }
        let client = Client::with_options(options).map_err(error)?;
        let db = client.database(&o.database);
        Ok(Self {
            client,
            db,
            permits: Arc::new(Semaphore::new(pool_size)),
            pool_size,
            pool_wait: o.pool_wait,
            feed_grace: o.feed_grace,
            replica: None,
            replica_settings: o.replica,
        })
    }

    /// Whether the API's reads have a client of their own (`read_url`).
    pub fn has_replica(&self) -> bool {
        self.replica.is_some()
    }

    /// Permits held by operations right now, the reader's (`read_url`) included.
    pub(crate) fn connections_in_use(&self) -> u64 {
        let held = |db: &MongoDatabase| db.pool_size.saturating_sub(db.permits.available_permits());
        let replica = self.replica.as_deref().map_or(0, held);
        (held(self) + replica) as u64
    }

    /// A permit to run one operation: waits at most `pool_wait` for one to be free.
    pub(crate) async fn checkout(&self) -> Result<SemaphorePermit<'_>, StoreError> {
        match tokio::time::timeout(self.pool_wait, self.permits.acquire()).await {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(_)) => Err(StoreError::Unavailable(
                "the MongoDB client is closed".into(),
            )),
            Err(_) => Err(StoreError::Unavailable(
                "no MongoDB connection became free in time (pool exhausted)".into(),
            )),
        }
    }

    /// A permit a write carries into its own task (see the store's `Writer`).
    pub(crate) async fn checkout_owned(&self) -> Result<OwnedSemaphorePermit, StoreError> {
        match tokio::time::timeout(self.pool_wait, self.permits.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(_)) => Err(StoreError::Unavailable(
                "the MongoDB client is closed".into(),
            )),
            Err(_) => Err(StoreError::Unavailable(
                "no MongoDB connection became free in time (pool exhausted)".into(),
            )),
        }
    }

    /// Pings the primary's server. The `read_url`'s does not make the database unready:
    /// reads leave it while it is down (its probe, `replica.rs`, watches it).
    pub async fn ping(&self) -> Result<(), StoreError> {
        let _permit = self.checkout().await?;
        self.db
            .run_command(doc! {"ping": 1})
            .await
            .map(|_| ())
            .map_err(error)
    }

    /// Whether every permit is held, so that the next operation would wait for one (a look
    /// at the semaphore: no I/O).
    pub(crate) fn saturated(&self) -> bool {
        self.permits.available_permits() == 0
    }

    /// Pings a server this client reads from (by its read preference: a `read_url` client's
    /// `secondaryPreferred` picks a secondary where there is one, as its reads do), if a permit
    /// is free right now: `None`, without waiting, when every permit is held.
    pub(crate) async fn ping_reads_if_free(&self) -> Option<Result<(), StoreError>> {
        let _permit = match self.permits.try_acquire() {
            Ok(permit) => permit,
            Err(tokio::sync::TryAcquireError::NoPermits) => return None,
            Err(tokio::sync::TryAcquireError::Closed) => {
                return Some(Err(StoreError::Unavailable(
                    "the MongoDB client is closed".into(),
                )))
            }
        };
        let mut ping = self.db.run_command(doc! {"ping": 1});
        if let Some(criteria) = self.db.selection_criteria() {
            ping = ping.selection_criteria(criteria.clone());
        }
        Some(ping.await.map(|_| ()).map_err(error))
    }

    /// Shuts the client down, and the `read_url`'s when there is one.
    pub async fn close(&self) {
        self.close_own().await;
        if let Some(replica) = &self.replica {
            replica.close_own().await;
        }
    }

    async fn close_own(&self) {
        self.permits.close();
        self.client.clone().shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::{MongoDatabase, MongoOptions};
    use mongodb::options::{ReadPreference, SelectionCriteria};

    fn read_preference(db: &MongoDatabase) -> Option<&'static str> {
        match db.client.selection_criteria() {
            None => None,
            Some(SelectionCriteria::ReadPreference(p)) => Some(match p {
                ReadPreference::Primary => "primary",
                ReadPreference::PrimaryPreferred { .. } => "primaryPreferred",
                ReadPreference::Secondary { .. } => "secondary",
                ReadPreference::SecondaryPreferred { .. } => "secondaryPreferred",
                ReadPreference::Nearest { .. } => "nearest",
                _ => "another",
            }),
            Some(_) => Some("a predicate"),
        }
    }

    /// No server needed: clients connect in the background, at their first operation.
    #[tokio::test]
    async fn the_read_url_client_reads_secondaries_unless_told_otherwise() {
        let primary = "mongodb://127.0.0.1:1/";
        let without = MongoDatabase::connect(&MongoOptions::new(primary, "d"))
            .await
            .unwrap();
        assert!(without.replica.is_none());
        assert_eq!(read_preference(&without), None, "the driver's default");

        for (read_url, expected) in [
            ("mongodb://127.0.0.1:2/", "secondaryPreferred"),
            ("mongodb://127.0.0.1:2/?readPreference=nearest", "nearest"),
            ("mongodb://127.0.0.1:2/?readPreference=primary", "primary"),
        ] {
            let db = MongoDatabase::connect(&MongoOptions {
                read_url: Some(read_url.into()),
                ..MongoOptions::new(primary, "d")
            })
            .await
            .unwrap();
            assert_eq!(read_preference(&db), None, "{read_url}: the primary's own");
            let replica = db.replica.as_deref().expect("a read_url client");
            assert!(replica.replica.is_none());
            assert_eq!(replica.db.name(), "d", "the same database");
            assert_eq!(read_preference(replica), Some(expected), "{read_url}");
            db.close().await;
        }

        let e = MongoDatabase::connect(&MongoOptions {
            read_url: Some("mongodb://127.0.0.1:2/?readPreference=sometimes".into()),
            ..MongoOptions::new(primary, "d")
        })
        .await
        .expect_err("a bad readPreference");
        assert!(e.to_string().contains("read_url"), "{e}");
    }
}
