//! Connection pools (primary and optional read replica) and error mapping.

use crate::pools::Pools;
use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
use meshql_core::StoreError;
use std::sync::Arc;
use std::time::Duration;

/// How to reach PostgreSQL.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// `postgres://user:password@host:port/database`
    pub url: String,
    /// A replica for reads (CQRS / read-replica topologies); reads use `url` when absent.
    pub read_url: Option<String>,
    /// Connections per pool.
    pub pool_size: usize,
    /// How long a request waits for a free connection before failing with 503.
    pub pool_wait: Duration,
    /// Server-side `statement_timeout`.
    pub statement_timeout: Duration,
    /// How long to wait for a new connection.
    pub connect_timeout: Duration,
    /// Answer nested searches with one statement ([`meshql_core::StoreReader::find_nested`]).
    pub nested_sql: bool,
    /// Bounds on the replica (with `read_url`).
    pub replica: meshql_core::replica::ReplicaSettings,
    /// Serving threads to give a share of each pool ([`meshql_core::serving`]; 0: none).
    pub serving_threads: usize,
}

impl PostgresOptions {
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            read_url: None,
            pool_size: 16,
            pool_wait: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            nested_sql: true,
            replica: Default::default(),
            serving_threads: meshql_core::serving::planned(),
        }
    }
}

/// The pools of one PostgreSQL database.
pub struct PostgresDatabase {
    pub(crate) write: Arc<Pools>,
    pub(crate) read: Arc<Pools>,
    /// `read` is a pool of its own (`read_url`), not a clone of `write`.
    read_pool_of_its_own: bool,
    pub(crate) nested_sql: bool,
    pub(crate) replica: meshql_core::replica::ReplicaSettings,
    url_for_logs: String,
}

impl std::fmt::Debug for PostgresDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresDatabase")
            .field("url", &self.url_for_logs)
            .finish()
    }
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.find(':') {
                Some(c) => format!("{}{}:***{}", &url[..s + 3], &creds[..c], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

fn pools(url: &str, o: &PostgresOptions) -> Result<Arc<Pools>, StoreError> {
    let meshql_pg::tls::Connection {
        mut config,
        mode,
        tls,
        ..
    } = meshql_pg::tls::read_url(url)
        .map_err(|e| StoreError::Invalid(format!("bad PostgreSQL URL {}: {e}", redact(url))))?;
    config.connect_timeout(o.connect_timeout);
    config.options(format!(
        "-c statement_timeout={}",
        o.statement_timeout.as_millis()
    ));
    let (wait, connect) = (o.pool_wait, o.connect_timeout);
    let build = |max_size: usize| {
        let manager = Manager::from_connect(
            config.clone(),
            crate::connector::Connector {
                tls: tls.clone(),
                fall_back_to_plain: mode == meshql_pg::tls::SslMode::Prefer,
            },
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        Pool::builder(manager)
            .max_size(max_size.max(1))
            .wait_timeout(Some(wait))
            .create_timeout(Some(connect))
            .recycle_timeout(Some(connect))
            .runtime(Runtime::Tokio1)
            .build()
    };
    let pools = Pools::new(o.pool_size.max(1), o.serving_threads, build)
        .map_err(|e| StoreError::Invalid(format!("cannot build the PostgreSQL pool: {e}")))?;
    Ok(Arc::new(pools))
}

impl PostgresDatabase {
    /// Builds the pools; no connection is made until first use, so a server can start while
    /// the database is down (and report it through `/ready`).
    pub fn connect(options: &PostgresOptions) -> Result<Arc<Self>, StoreError> {
        let write = pools(&options.url, options)?;
        let read = match &options.read_url {
            Some(u) => pools(u, options)?,
            None => write.clone(),
        };
        Ok(Arc::new(Self {
            write,
            read,
            read_pool_of_its_own: options.read_url.is_some(),
            nested_sql: options.nested_sql,
            replica: options.replica,
            url_for_logs: redact(&options.url),
        }))
    }

    /// Whether reads may go to a replica of their own (`read_url`).
    pub fn has_replica(&self) -> bool {
        self.read_pool_of_its_own
    }

    /// Whether the primary answers. A replica does not make the database unready: reads
    /// leave it while it is down ([`crate::replica::PostgresReplicaProbe`] measures it).
    pub async fn ping(&self) -> Result<(), StoreError> {
        let client = self.write.get().await.map_err(pool_error)?;
        client.simple_query("SELECT 1").await.map_err(pg_error)?;
        Ok(())
    }

    /// Whether the server sees this pool's connections as encrypted (`pg_stat_ssl`), for the
    /// primary and then the read pool.
    pub async fn tls_in_use(&self) -> Result<(bool, bool), StoreError> {
        let mut seen = [false; 2];
        for (i, pool) in [&self.write, &self.read].into_iter().enumerate() {
            let client = pool.get().await.map_err(pool_error)?;
            let row = client
                .query_one(
                    "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                    &[],
                )
                .await
                .map_err(pg_error)?;
            seen[i] = row.get(0);
        }
        Ok((seen[0], seen[1]))
    }

    /// Connections lent to an operation right now, over both pools when reads have their own.
    pub(crate) fn connections_in_use(&self) -> u64 {
        let lent = match self.read_pool_of_its_own {
            true => self.write.lent() + self.read.lent(),
            false => self.write.lent(),
        };
        lent as u64
    }

    pub fn close(&self) {
        self.write.close();
        self.read.close();
    }
}

pub(crate) fn pool_error(e: PoolError) -> StoreError {
    match e {
        PoolError::Timeout(_) => StoreError::Unavailable(
            "no PostgreSQL connection became free in time (pool exhausted)".into(),
        ),
        PoolError::Backend(e) => pg_error(e),
        PoolError::Closed => StoreError::Unavailable("the PostgreSQL pool is closed".into()),
        other => StoreError::Unavailable(format!("PostgreSQL unavailable: {other}")),
    }
}

pub(crate) fn pg_error(e: tokio_postgres::Error) -> StoreError {
    if let Some(reason) = meshql_pg::tls::tls_failure(&e) {
        return StoreError::Unavailable(format!(
            "PostgreSQL unavailable: the TLS handshake failed: {reason}"
        ));
    }
    if e.is_closed() || e.as_db_error().is_none() {
        // connection refused, reset, closed: the database is unreachable right now
        let cause = std::error::Error::source(&e)
            .map(|s| format!(" ({s})"))
            .unwrap_or_default();
        return StoreError::Unavailable(format!("PostgreSQL unavailable: {e}{cause}"));
    }
    let db = e.as_db_error().expect("checked above");
    match db.code().code() {
        // admin shutdown, crash shutdown, cannot connect now, too many connections
        "57P01" | "57P02" | "57P03" | "53300" => {
            StoreError::Unavailable(format!("PostgreSQL unavailable: {}", db.message()))
        }
        // query canceled (statement_timeout)
        "57014" => {
            StoreError::Unavailable(format!("PostgreSQL statement timed out: {}", db.message()))
        }
        // serialization failure, deadlock: the same write may succeed when retried
        "40001" | "40P01" => {
            StoreError::Conflict(format!("{}: {}", db.code().code(), db.message()))
        }
        _ => StoreError::Query(format!("{}: {}", db.code().code(), db.message())),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn passwords_stay_out_of_messages() {
        assert_eq!(
            super::redact("postgres://u:secret@h:5/db"),
            "postgres://u:***@h:5/db"
        );
        assert_eq!(super::redact("postgres://u@h/db"), "postgres://u@h/db");
    }

    /// Against the real server (`MESHQL_TEST_POSTGRES_URL`, or started by the services
    /// script): connections held count once, in whichever pool they were taken from.
    #[tokio::test]
    async fn connections_in_use_counts_both_pools_once() {
        let url = meshql_conformance::test_server_url("postgres", "MESHQL_TEST_POSTGRES_URL");
        let shared = super::PostgresDatabase::connect(&super::PostgresOptions::new(&url)).unwrap();
        let held = shared.write.get().await.unwrap();
        assert_eq!(
            shared.connections_in_use(),
            1,
            "reads share the writers' pool"
        );
        let also = shared.read.get().await.unwrap();
        assert_eq!(shared.connections_in_use(), 2);
        drop((held, also));
        assert_eq!(shared.connections_in_use(), 0);

        let options = super::PostgresOptions {
            read_url: Some(url.clone()),
            ..super::PostgresOptions::new(&url)
        };
        let split = super::PostgresDatabase::connect(&options).unwrap();
        let held = split.write.get().await.unwrap();
        let read = split.read.get().await.unwrap();
        assert_eq!(
            split.connections_in_use(),
            2,
            "a read pool of its own counts too"
        );
        drop(read);
        assert_eq!(split.connections_in_use(), 1);
        drop(held);
        assert_eq!(split.connections_in_use(), 0);
    }

    /// Against the real server: on serving threads the pool is split, each thread taking its
    /// own share first, then the shared pool, then an idle connection of another thread's
    /// share; all together never more than `pool_size`, and past that a request waits
    /// `pool_wait` and fails.
    #[test]
    fn serving_threads_take_their_own_connections_first_and_the_pool_stays_bounded() {
        let url = meshql_conformance::test_server_url("postgres", "MESHQL_TEST_POSTGRES_URL");
        let options = super::PostgresOptions {
            pool_size: 4,
            serving_threads: 2,
            pool_wait: std::time::Duration::from_millis(200),
            ..super::PostgresOptions::new(&url)
        };
        let db = super::PostgresDatabase::connect(&options).unwrap();
        // takes `n` connections on serving thread `index`: the pools' sizes after each, the
        // error of one more (if `more`), the connections lent at the end
        let serve =
            |db: &std::sync::Arc<super::PostgresDatabase>, index: usize, n: usize, more: bool| {
                let db = db.clone();
                std::thread::spawn(move || {
                    meshql_core::serving::enter(index, 2);
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    rt.block_on(async move {
                        let mut held = Vec::new();
                        let mut sizes = Vec::new();
                        for _ in 0..n {
                            held.push(db.write.get().await.unwrap());
                            sizes.push(db.write.all().map(|p| p.status().size).collect::<Vec<_>>());
                        }
                        let refused = match more {
                            true => db.write.get().await.err().map(|e| e.to_string()),
                            false => None,
                        };
                        (sizes, refused, db.connections_in_use())
                    })
                })
                .join()
                .unwrap()
            };
        // pools in order: shared (4 - 1 - 1 = 2), thread 0's (1), thread 1's (1)
        let (sizes, _, _) = serve(&db, 1, 1, false);
        assert_eq!(sizes, vec![vec![0, 0, 1]], "thread 1 opens its own");
        assert_eq!(db.connections_in_use(), 0);
        let (sizes, refused, lent) = serve(&db, 0, 4, true);
        assert_eq!(
            sizes,
            vec![vec![0, 1, 1], vec![1, 1, 1], vec![2, 1, 1], vec![2, 1, 1]],
            "its own share, then the shared pool, then thread 1's idle connection"
        );
        assert!(refused.is_some(), "a fifth waits `pool_wait`, then fails");
        assert_eq!(lent, 4, "never more than pool_size");
        assert_eq!(db.connections_in_use(), 0);
        // it never opens a connection in another thread's share (that thread's queries would
        // cross threads on it for good): with thread 1's share unopened, thread 0 has 3
        let fresh = super::PostgresDatabase::connect(&options).unwrap();
        let (sizes, refused, _) = serve(&fresh, 0, 3, true);
        assert_eq!(sizes.last(), Some(&vec![2, 1, 0]));
        assert!(
            refused.is_some(),
            "thread 1's share is not opened by thread 0"
        );
        // off the serving threads: the shared pool, then idle connections of the shares
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let held: Vec<_> = futures_held(&db, 4).await;
            assert_eq!(held.len(), 4);
            assert!(db.write.get().await.is_err());
        });
    }

    async fn futures_held(
        db: &super::PostgresDatabase,
        n: usize,
    ) -> Vec<deadpool_postgres::Object> {
        let mut held = Vec::new();
        for _ in 0..n {
            held.push(db.write.get().await.unwrap());
        }
        held
    }
}
