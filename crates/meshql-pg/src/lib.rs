//! PostgreSQL client pieces that meshql's PostgreSQL store, the `postgres_cdc` capture of
//! `meshql-process` and the command line (`meshql init`, `meshql cdc`) share, so that none of
//! them depends on another to reach a database:
//!
//! - [`tls`]: a connection URL read as libpq reads it, `sslmode` and `sslrootcert` included,
//!   into a tokio-postgres config and the rustls settings it needs;
//! - [`tunnel`]: a TLS tunnel for connections made by a client that only speaks plain
//!   PostgreSQL (the replication client).

pub mod tls;
pub mod tunnel;

pub use tls::{read_url, tls_failure, Connection, SslMode};
