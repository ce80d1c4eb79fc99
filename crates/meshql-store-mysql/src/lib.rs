//! MySQL / MariaDB storage.
//!
//! One table per entity, one row per version (`_id`, `id`, `payload JSON`, `created_at`
//! ms, `deleted`, `authorized_tokens JSON`, `latest`, `seq`), `UNIQUE(id, created_at)`.
//! Every payload field a template filters on gets a virtual generated column with an
//! index (`f_<field>`), because MariaDB cannot index JSON expressions directly; templates
//! are compiled against those columns. Writes of one id are serialised with a named lock;
//! fresh server-generated ids take none. Batched lookups pass their keys as one JSON array
//! through `JSON_TABLE`.
//!
//! With `nested_sql` (off by default) a GraphQL search and its relationships into tables of
//! the same database are one statement ([`meshql_core::StoreReader::find_nested`]), as on
//! PostgreSQL; over loopback MariaDB answered it slower than a batched lookup per level
//! (docs/BENCHMARKS.md), so it is kept for databases whose round trips cost more.
//!
//! With a `read_url` (a replica) the database has a second pool, and each table a second,
//! read-only store on it ([`meshql_core::Database::replica`]) that the engine serves the API's
//! reads from; the table's own store reads the primary only. The replica is probed
//! ([`meshql_core::Database::replica_probe`], `replica.rs`): its lag as the server reports it
//! (`SHOW REPLICA STATUS`, `Seconds_Behind_Master`/`Seconds_Behind_Source`), whether it
//! answers, and whether its pool has a connection left, so that reads leave it in time.
//!
//! Processor outputs ([`meshql_core::OutputStore`]) are supported: a batch's document
//! versions, state rows, dead letters and input position are one transaction, beside the
//! entity tables in `_meshql_outputs`, `_meshql_output_state` and `_meshql_dead_letters`
//! (`store/outputs.rs`).

mod database;
mod db;
mod dialect;
mod replica;
mod settings;
mod sql;
mod store;
mod tls;

pub use db::{MysqlDatabase, MysqlOptions};
pub use settings::{MysqlBackend, MysqlSettings};
pub use store::MysqlStore;
pub use tls::SslMode;
