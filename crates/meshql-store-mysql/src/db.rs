//! The connection pool, bounded waits and error mapping.

use meshql_core::StoreError;
use mysql_async::{Conn, Opts, OptsBuilder, Pool, PoolConstraints, PoolOpts};
use std::sync::Arc;
use std::time::Duration;

/// How to reach MySQL / MariaDB.
#[derive(Debug, Clone)]
pub struct MysqlOptions {
    /// `mysql://user:password@host:port/database`
    pub url: String,
    pub pool_size: usize,
    /// How long a request waits for a connection before failing with 503.
    pub pool_wait: Duration,
    /// Answer nested searches with one statement ([`meshql_core::Store::find_nested`]).
    /// Off by default: on MariaDB the statement measured slower than one batched lookup per
    /// level over loopback (see docs/BENCHMARKS.md); it saves round trips, which pays off
    /// when the database is far away.
    pub nested_sql: bool,
}

impl MysqlOptions {
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            pool_size: 16,
            pool_wait: Duration::from_secs(5),
            nested_sql: false,
        }
    }
}

pub struct MysqlDatabase {
    pub(crate) pool: Pool,
    wait: Duration,
    pub(crate) nested_sql: bool,
}

impl std::fmt::Debug for MysqlDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MysqlDatabase")
    }
}

impl MysqlDatabase {
    /// Builds the pool; no connection is made until first use.
    pub fn connect(o: &MysqlOptions) -> Result<Arc<Self>, StoreError> {
        let opts = Opts::from_url(&o.url)
            .map_err(|e| StoreError::Invalid(format!("bad MySQL URL: {e}")))?;
        // min = max: with a lower minimum, mysql_async closes idle connections above it at
        // once, and every request would pay a new connection (TCP, handshake, auth)
        let size = o.pool_size.max(1);
        let constraints = PoolConstraints::new(size, size)
            .ok_or_else(|| StoreError::Invalid("bad pool size".into()))?;
        let opts = OptsBuilder::from_opts(opts).stmt_cache_size(256).pool_opts(
            PoolOpts::default()
                .with_constraints(constraints)
                // COM_RESET_CONNECTION on every return would drop the prepared-statement
                // cache (and cost a round trip); sessions carry no per-request state here
                .with_reset_connection(false),
        );
        Ok(Arc::new(Self {
            pool: Pool::new(opts),
            wait: o.pool_wait,
            nested_sql: o.nested_sql,
        }))
    }

    pub(crate) async fn conn(&self) -> Result<Conn, StoreError> {
        match tokio::time::timeout(self.wait, self.pool.get_conn()).await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(my_error(e)),
            Err(_) => Err(StoreError::Unavailable(
                "no MySQL connection became free in time (pool exhausted)".into(),
            )),
        }
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        use mysql_async::prelude::Queryable;
        let mut c = self.conn().await?;
        c.ping().await.map_err(my_error)
    }

    pub async fn close(&self) {
        let _ = self.pool.clone().disconnect().await;
    }
}

/// Server errors that mean "the database is not there for you right now", not "your statement
/// is wrong": the connection was killed (1927), the server is shutting down (1053), too many
/// connections (1040), the server is read-only for maintenance (1290 `--read-only`).
const UNAVAILABLE_CODES: [u16; 4] = [1927, 1053, 1040, 1290];

pub(crate) fn my_error(e: mysql_async::Error) -> StoreError {
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
    async fn close(&self) {
        MysqlDatabase::close(self).await;
    }
}
