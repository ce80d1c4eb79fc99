//! PostgreSQL storage.
//!
//! One table per entity, one row per version:
//!
//! | column | meaning |
//! |---|---|
//! | `_id BIGSERIAL` | monotonic row id |
//! | `id TEXT` | document id; `UNIQUE(id, created_at)` |
//! | `payload JSONB` | the document (including `"id"`) |
//! | `created_at BIGINT` | version time, ms since the epoch |
//! | `deleted BOOLEAN` | tombstone |
//! | `authorized_tokens TEXT[]` | who may read |
//! | `latest BOOLEAN` | newest version of its id |
//! | `seq BIGINT` | `_id` of the document's first version (list order) |
//!
//! Writes of one id are serialised with a transaction-scoped advisory lock (so `latest`
//! stays exact under concurrent updates); a single document with a fresh server-generated id
//! takes no lock and is one `INSERT` in its own transaction, without `BEGIN` and `COMMIT`
//! round trips; other writes pipeline their lock with the read of the latest version, and
//! the flag update with the `INSERT` (`pipeline.rs`; docs/BENCHMARKS.md, "PostgreSQL writes:
//! fewer round trips").
//! With a read URL (a replica), the database has a second pool and each table a second,
//! read-only store on it ([`PostgresStore::replica`], [`meshql_core::Database::replica`]) that
//! the engine serves the API's reads from; the table's own store reads the primary only, so
//! what a write depends on is never read from a replica that lags. Every statement is
//! prepared once per connection; templates filter on `payload->>'field'`, for which
//! expression indexes are created.
//!
//! A GraphQL search whose relationships all resolve in process to tables of the same
//! database is one statement ([`meshql_core::StoreReader::find_nested`]): a CTE per relationship
//! joins the distinct keys of its parent's rows (the batched lookup of each level), and the
//! rows of every level come back together to be put into a tree
//! ([`meshql_core::nested::assemble`]), so a depth-3 query costs one round trip instead of
//! one per level.
//!
//! Processor outputs ([`meshql_core::OutputStore`]) are supported: a batch's document
//! versions, state rows, dead letters and input position are one transaction, beside the
//! entity tables in `_meshql_outputs`, `_meshql_output_state` and `_meshql_dead_letters`
//! (`store/outputs.rs`).

mod connector;
mod database;
mod db;
mod dialect;
mod pipeline;
mod pools;
mod replica;
mod settings;
mod sql;
mod store;

pub use db::{PostgresDatabase, PostgresOptions};
pub use meshql_pg::SslMode;
pub use settings::{PostgresBackend, PostgresSettings};
pub use store::PostgresStore;
