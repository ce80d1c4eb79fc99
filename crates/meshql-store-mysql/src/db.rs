//! The connection pool, bounded waits and error mapping.

use meshql_core::serving::Split;
use meshql_core::StoreError;
use mysql_async::{Conn, Opts, OptsBuilder, Pool, PoolConstraints, PoolOpts};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How to reach MySQL / MariaDB.
#[derive(Debug, Clone)]
pub struct MysqlOptions {
    /// `mysql://user:password@host:port/database`
    pub url: String,
    /// A replica for the API's reads (the engine serves them from
    /// [`meshql_core::Database::replica`]); a pool of its own, with the same size and wait.
    pub read_url: Option<String>,
    pub pool_size: usize,
    /// How long a request waits for a connection before failing with 503.
    pub pool_wait: Duration,
    /// Answer nested searches with one statement ([`meshql_core::StoreReader::find_nested`]).
    /// Off by default: on MariaDB the statement measured slower than one batched lookup per
    /// level over loopback (see docs/BENCHMARKS.md); it saves round trips, which pays off
    /// when the database is far away.
    pub nested_sql: bool,
    /// Bounds on the replica (with `read_url`; see `replica.rs`).
    pub replica: meshql_core::replica::ReplicaSettings,
    /// Serving threads to give a share of each pool ([`meshql_core::serving`]; 0: none).
    pub serving_threads: usize,
}

impl MysqlOptions {
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            read_url: None,
            pool_size: 16,
            pool_wait: Duration::from_secs(5),
            nested_sql: false,
            replica: Default::default(),
            serving_threads: meshql_core::serving::planned(),
        }
    }
}

/// The connections of one database, split between the serving threads ([`Split`]): a
/// mysql_async pool returns every connection through a recycler task spawned on the thread
/// that first used the pool, so one pool shared by every serving thread would wake another
/// thread for each connection given back, and a request could wait for that thread before
/// its connection is free again. Each serving thread has a share of `pool_size` of its own;
/// the rest is shared by background work, callers off the serving threads and a thread
/// whose share is all lent.
pub struct MysqlDatabase {
    split: Split,
    /// The shared part first, then one share per serving thread.
    shares: Box<[Share]>,
    /// `ssl-mode=PREFERRED` and the server offers no TLS: the shares' `plain` pools only.
    plain_only: AtomicBool,
    wait: Duration,
    pub(crate) nested_sql: bool,
    /// The replica's database (`read_url`): the tables' readers for the API.
    replica: Option<Arc<MysqlDatabase>>,
    /// Bounds on `replica`.
    replica_settings: meshql_core::replica::ReplicaSettings,
}

impl std::fmt::Debug for MysqlDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MysqlDatabase")
    }
}

impl MysqlDatabase {
    /// Builds the pools; no connection is made until first use.
    pub fn connect(o: &MysqlOptions) -> Result<Arc<Self>, StoreError> {
        let crate::tls::Connection { opts, mode } = crate::tls::read_url(&o.url)
            .map_err(|e| StoreError::Invalid(format!("bad MySQL URL: {e}")))?;
        let replica = match &o.read_url {
            Some(url) => Some(MysqlDatabase::connect(&MysqlOptions {
                url: url.clone(),
                read_url: None,
                ..o.clone()
            })?),
            None => None,
        };
        let split = Split::new(o.pool_size, o.serving_threads);
        let share = |size: usize| -> Result<Share, StoreError> {
            Ok(Share {
                pool: pool(opts.clone(), size)?,
                // `ssl-mode=PREFERRED`: the pool without TLS, used from the first time the
                // server turns out to offer none
                plain: match mode {
                    crate::tls::SslMode::Preferred => Some(pool(
                        OptsBuilder::from_opts(opts.clone()).ssl_opts(None).into(),
                        size,
                    )?),
                    _ => None,
                },
                lent: AtomicU64::new(0),
                size: size as u64,
            })
        };
        let shares = std::iter::once(split.shared)
            .chain(std::iter::repeat_n(split.each, split.threads))
            .map(share)
            .collect::<Result<_, _>>()?;
        Ok(Arc::new(Self {
            split,
            shares,
            plain_only: AtomicBool::new(false),
            wait: o.pool_wait,
            nested_sql: o.nested_sql,
            replica,
            replica_settings: o.replica,
        }))
    }

    /// A connection, waiting at most `pool_wait` for one to be free: from the first share
    /// in [`Split::order`] with one not lent (the caller's own on a serving thread), else
    /// from the first share once one is back.
    pub(crate) async fn conn(&self) -> Result<Lent<'_>, StoreError> {
        let share = self.choose();
        // counted from now: a concurrent caller sees this connection as taken
        share.lent.fetch_add(1, Ordering::Relaxed);
        let mut lent = Lent { conn: None, share };
        match tokio::time::timeout(self.wait, self.get_conn(share)).await {
            Ok(Ok(conn)) => {
                lent.conn = Some(conn);
                Ok(lent)
            }
            Ok(Err(e)) => Err(my_error(e)),
            Err(_) => Err(StoreError::Unavailable(
                "no MySQL connection became free in time (pool exhausted)".into(),
            )),
        }
    }

    fn choose(&self) -> &Share {
        let share = |at: Option<usize>| &self.shares[at.map_or(0, |i| i + 1)];
        let mut order = self.split.order();
        let first = share(order.next().flatten());
        std::iter::once(first)
            .chain(order.map(share))
            .find(|s| s.lent.load(Ordering::Relaxed) < s.size)
            .unwrap_or(first)
    }

    async fn get_conn(&self, share: &Share) -> Result<Conn, mysql_async::Error> {
        let Some(plain) = &share.plain else {
            return share.pool.get_conn().await;
        };
        if self.plain_only.load(Ordering::Relaxed) {
            return plain.get_conn().await;
        }
        match share.pool.get_conn().await {
            Err(e) if crate::tls::server_lacks_tls(&e) => {
                tracing::warn!(
                    "MySQL: the server offers no TLS; ssl-mode=PREFERRED: connecting without it"
                );
                self.plain_only.store(true, Ordering::Relaxed);
                plain.get_conn().await
            }
            other => other,
        }
    }

    /// The TLS cipher of a pooled connection as the server reports it (`Ssl_cipher`); `None`
    /// for a plain connection.
    pub async fn tls_cipher(&self) -> Result<Option<String>, StoreError> {
        use mysql_async::prelude::Queryable;
        let mut c = self.conn().await?;
        let row: Option<(String, String)> = c
            .query_first("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
            .await
            .map_err(my_error)?;
        Ok(row.map(|(_, v)| v).filter(|v| !v.is_empty()))
    }

    /// Whether the primary answers. A replica does not make the database unready: reads
    /// leave it while it is down (the replica's probe, `replica.rs`, watches it).
    pub async fn ping(&self) -> Result<(), StoreError> {
        use mysql_async::prelude::Queryable;
        let mut c = self.conn().await?;
        c.ping().await.map_err(my_error)?;
        Ok(())
    }

    /// Whether the API's reads have a pool of their own (`read_url`).
    pub fn has_replica(&self) -> bool {
        self.replica.is_some()
    }

    /// Whether every connection of the pool is lent out, so that the next operation would
    /// wait for one (a look at the counter: no I/O).
    pub(crate) fn saturated(&self) -> bool {
        self.shares
            .iter()
            .all(|s| s.lent.load(Ordering::Relaxed) >= s.size)
    }

    /// Connections lent to an operation (or waited for) right now, the replica's included.
    pub(crate) fn connections_in_use(&self) -> u64 {
        let lent = |db: &MysqlDatabase| -> u64 {
            db.shares
                .iter()
                .map(|s| s.lent.load(Ordering::Relaxed))
                .sum()
        };
        lent(self) + self.replica.as_deref().map_or(0, lent)
    }

    pub async fn close(&self) {
        let databases = std::iter::once(self).chain(self.replica.as_deref());
        for share in databases.flat_map(|db| db.shares.iter()) {
            let _ = share.pool.clone().disconnect().await;
            if let Some(plain) = &share.plain {
                let _ = plain.clone().disconnect().await;
            }
        }
    }
}

/// One part of a database's connections (see [`MysqlDatabase`]).
struct Share {
    pool: Pool,
    /// `ssl-mode=PREFERRED`: the same without TLS.
    plain: Option<Pool>,
    /// Connections lent to an operation or being waited for (see [`Lent`]).
    lent: AtomicU64,
    /// The connections it has at most.
    size: u64,
}

/// A pooled connection, counted in [`MysqlDatabase::connections_in_use`] until it goes back.
pub(crate) struct Lent<'a> {
    /// Always there once lent (`None` only while it is being waited for).
    conn: Option<Conn>,
    share: &'a Share,
}

impl std::ops::Deref for Lent<'_> {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        self.conn.as_ref().expect("a lent connection")
    }
}

impl std::ops::DerefMut for Lent<'_> {
    fn deref_mut(&mut self) -> &mut Conn {
        self.conn.as_mut().expect("a lent connection")
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        self.share.lent.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Server errors that mean "the database is not there for you right now", not "your statement
/// is wrong": the connection was killed (1927), the server is shutting down (1053), too many
/// connections (1040), the server is read-only for maintenance (1290 `--read-only`).
const UNAVAILABLE_CODES: [u16; 4] = [1927, 1053, 1040, 1290];

/// Prepared statements mysql_async keeps per connection (`stmt_cache_size`), the least
/// recently used closed first: what bounds the statements open on the server per
/// connection, the nested statements of every shape a client sends among them.
pub(crate) const STATEMENTS_PER_CONNECTION: usize = 256;

/// A pool of `size` connections on `opts`.
fn pool(opts: Opts, size: usize) -> Result<Pool, StoreError> {
    // min = max: with a lower minimum, mysql_async closes idle connections above it at
    // once, and every request would pay a new connection (TCP, handshake, auth)
    let size = size.max(1);
    let constraints = PoolConstraints::new(size, size)
        .ok_or_else(|| StoreError::Invalid("bad pool size".into()))?;
    // READ COMMITTED for the write transactions (reads are single statements): a write
    // serialises on the row lock of its id's latest version (`SELECT ... FOR UPDATE`), and
    // under REPEATABLE READ the gap locks around that row, held by concurrent writers of the
    // same id too, made their inserts wait on each other until InnoDB killed one (error 1213;
    // conformance `concurrent_writes_of_one_id_keep_one_latest`)
    let opts = OptsBuilder::from_opts(opts)
        .init(vec![
            "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
        ])
        .stmt_cache_size(STATEMENTS_PER_CONNECTION)
        .pool_opts(
            PoolOpts::default()
                .with_constraints(constraints)
                // COM_RESET_CONNECTION on every return would drop the prepared-statement
                // cache (and cost a round trip); sessions carry no per-request state here
                .with_reset_connection(false),
        );
    Ok(Pool::new(opts))
}

pub(crate) fn my_error(e: mysql_async::Error) -> StoreError {
    if let Some(reason) = crate::tls::tls_failure(&e) {
        return StoreError::Unavailable(format!(
            "MySQL unavailable: the TLS handshake failed: {reason}"
        ));
    }
    match e {
        mysql_async::Error::Server(s) if UNAVAILABLE_CODES.contains(&s.code) => {
            StoreError::Unavailable(format!("MySQL unavailable: {} ({})", s.message, s.code))
        }
        mysql_async::Error::Server(s) => StoreError::Query(format!("{}: {}", s.code, s.message)),
        mysql_async::Error::Url(u) => StoreError::Invalid(format!("bad MySQL URL: {u}")),
        other => StoreError::Unavailable(format!("MySQL unavailable: {other}")),
    }
}

#[async_trait::async_trait]
impl meshql_core::Database for MysqlDatabase {
    fn backend(&self) -> &'static str {
        "mysql"
    }
    fn store(self: Arc<Self>, table: &str) -> meshql_core::DynStore {
        Arc::new(crate::MysqlStore::new(self, table))
    }
    fn replica(self: Arc<Self>, table: &str) -> Option<meshql_core::DynReader> {
        let replica = self.replica.clone()?;
        Some(Arc::new(crate::MysqlStore::new(replica, table)))
    }
    fn replica_probe(self: Arc<Self>) -> Option<Arc<dyn meshql_core::replica::ReplicaProbe>> {
        let replica = self.replica.clone()?;
        Some(Arc::new(crate::replica::MysqlReplicaProbe::new(
            replica,
            self.replica_settings,
        )))
    }
    async fn close(&self) {
        MysqlDatabase::close(self).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mysql_async::prelude::Queryable;

    /// Against the real server: on serving threads the connections are split, each thread
    /// taking from its own share first, then the shared part, then another thread's share;
    /// all together never more than `pool_size`, and past that a request waits `pool_wait`
    /// and fails.
    #[test]
    fn serving_threads_take_their_own_connections_first_and_the_pool_stays_bounded() {
        let url = meshql_conformance::test_server_url("mariadb", "MESHQL_TEST_MYSQL_URL");
        let db = MysqlDatabase::connect(&MysqlOptions {
            pool_size: 4,
            serving_threads: 2,
            pool_wait: Duration::from_millis(200),
            ..MysqlOptions::new(url)
        })
        .unwrap();
        let lent = |db: &MysqlDatabase| -> Vec<u64> {
            db.shares
                .iter()
                .map(|s| s.lent.load(Ordering::Relaxed))
                .collect()
        };
        let seen = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    meshql_core::serving::enter(0, 2);
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    rt.block_on(async {
                        let mut held = Vec::new();
                        let mut seen = Vec::new();
                        for _ in 0..4 {
                            let mut conn = db.conn().await.unwrap();
                            conn.ping().await.unwrap();
                            held.push(conn);
                            seen.push(lent(&db));
                        }
                        let refused = db.conn().await.err();
                        (seen, refused, db.connections_in_use())
                    })
                })
                .join()
                .unwrap()
        });
        let (seen, refused, in_use) = seen;
        // shares in order: shared (4 - 1 - 1 = 2), thread 0's (1), thread 1's (1)
        assert_eq!(
            seen,
            vec![vec![0, 1, 0], vec![1, 1, 0], vec![2, 1, 0], vec![2, 1, 1]],
            "its own share, then the shared part, then thread 1's"
        );
        assert!(
            matches!(refused, Some(StoreError::Unavailable(_))),
            "a fifth waits `pool_wait`, then fails: {refused:?}"
        );
        assert_eq!(in_use, 4, "never more than pool_size");
        assert_eq!(db.connections_in_use(), 0, "all given back");
    }
}
