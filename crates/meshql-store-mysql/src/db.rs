//! The connection pool, bounded waits and error mapping.

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
        }
    }
}

pub struct MysqlDatabase {
    pool: Pool,
    /// `ssl-mode=PREFERRED`: the pool without TLS, used from the first time the server
    /// turns out to offer none.
    plain: Option<Pool>,
    plain_only: AtomicBool,
    /// Connections lent to an operation right now (see [`Lent`]).
    lent: AtomicU64,
    /// The connections there are (`pool_size`, at least 1).
    size: usize,
    wait: Duration,
    pub(crate) nested_sql: bool,
    /// The replica's database (`read_url`): the tables' readers for the API.
    pub(crate) replica: Option<Arc<MysqlDatabase>>,
    /// Bounds on `replica`.
    pub(crate) replica_settings: meshql_core::replica::ReplicaSettings,
}

impl std::fmt::Debug for MysqlDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MysqlDatabase")
    }
}

impl MysqlDatabase {
    /// Builds the pool; no connection is made until first use.
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
        let plain = match mode {
            crate::tls::SslMode::Preferred => Some(pool(
                OptsBuilder::from_opts(opts.clone()).ssl_opts(None).into(),
                o.pool_size,
            )?),
            _ => None,
        };
        Ok(Arc::new(Self {
            pool: pool(opts, o.pool_size)?,
            plain,
            plain_only: AtomicBool::new(false),
            lent: AtomicU64::new(0),
            size: o.pool_size.max(1),
            wait: o.pool_wait,
            nested_sql: o.nested_sql,
            replica,
            replica_settings: o.replica,
        }))
    }

    /// A connection of the pool, waiting at most `pool_wait` for one to be free.
    pub(crate) async fn conn(&self) -> Result<Lent<'_>, StoreError> {
        match tokio::time::timeout(self.wait, self.get_conn()).await {
            Ok(Ok(conn)) => {
                self.lent.fetch_add(1, Ordering::Relaxed);
                Ok(Lent { conn, db: self })
            }
            Ok(Err(e)) => Err(my_error(e)),
            Err(_) => Err(StoreError::Unavailable(
                "no MySQL connection became free in time (pool exhausted)".into(),
            )),
        }
    }

    async fn get_conn(&self) -> Result<Conn, mysql_async::Error> {
        let Some(plain) = &self.plain else {
            return self.pool.get_conn().await;
        };
        if self.plain_only.load(Ordering::Relaxed) {
            return plain.get_conn().await;
        }
        match self.pool.get_conn().await {
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
        self.lent.load(Ordering::Relaxed) >= self.size as u64
    }

    /// Connections lent to an operation right now (the replica's included).
    pub(crate) fn connections_in_use(&self) -> u64 {
        self.lent.load(Ordering::Relaxed)
            + self
                .replica
                .as_ref()
                .map_or(0, |r| r.lent.load(Ordering::Relaxed))
    }

    pub async fn close(&self) {
        if let Some(replica) = &self.replica {
            let _ = replica.pool.clone().disconnect().await;
        }
        let _ = self.pool.clone().disconnect().await;
        if let Some(plain) = &self.plain {
            let _ = plain.clone().disconnect().await;
        }
    }
}

/// A pooled connection, counted in [`MysqlDatabase::connections_in_use`] until it goes back.
pub(crate) struct Lent<'a> {
    conn: Conn,
    db: &'a MysqlDatabase,
}

impl std::ops::Deref for Lent<'_> {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        &self.conn
    }
}

impl std::ops::DerefMut for Lent<'_> {
    fn deref_mut(&mut self) -> &mut Conn {
        &mut self.conn
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        self.db.lent.fetch_sub(1, Ordering::Relaxed);
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
