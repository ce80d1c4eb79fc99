//! Embedded SQLite storage.
//!
//! One database file may hold several entity tables. Per file there is exactly one writer:
//! a dedicated thread that drains its queue and commits everything queued in **one
//! transaction** (group commit), each job inside its own savepoint so that one failing job
//! does not undo the others. Readers take a connection from a pool and run prepared,
//! cached statements; WAL mode lets them read while the writer writes. Concurrent writers
//! therefore queue and never fail with `SQLITE_BUSY`.
//!
//! Layout of an entity table:
//!
//! | column | meaning |
//! |---|---|
//! | `_id` | monotonic row id (change-data capture can poll it) |
//! | `id` | document id |
//! | `payload` | JSON object text (including `"id"`) |
//! | `created_at` | version time, ms since the epoch; `UNIQUE(id, created_at)` |
//! | `deleted` | 1 for a tombstone |
//! | `authorized_tokens` | JSON array |
//! | `latest` | 1 on the newest version of each id (kept by the writer) |
//!
//! `latest` turns "now" reads into an indexed lookup; reads at an explicit time pick
//! `MAX(created_at) <= at` per id instead.

mod checkpoint;
mod db;
mod dialect;
mod settings;
mod snapshot;
mod sql;
mod store;

pub use checkpoint::CheckpointPolicy;
pub use db::{SqliteDatabase, SqliteOptions};
pub use settings::{SqliteBackend, SqliteSettings};
pub use snapshot::{cut_at, entity_tables, CutTable};
pub use store::{LogVersion, SqliteStore};
