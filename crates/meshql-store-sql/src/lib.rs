//! The SQL core of meshql's relational stores (SQLite, PostgreSQL, MySQL / MariaDB).
//!
//! Pure text and pure rules: this crate produces statement texts, the parameter plans of
//! those statements and the decisions writes share, and depends on no database driver. Each
//! store crate keeps what has to differ per database — connections, pools, TLS, replicas,
//! transactions and locks, the change feed, executing statements and converting values to
//! its driver's — and describes its dialect.
//!
//! The statement model every store shares: one table per entity, one row per version
//! (`_id`, `id`, `payload`, `created_at`, `deleted`, `authorized_tokens`, `latest`, `seq`);
//! the visible version of a document is its `latest` one (or, `at` a moment, its newest no
//! later than the moment) unless that is a tombstone; a caller holding tokens sees the rows
//! whose tokens are empty or share one with it; a batch reads the rows of several keys in one
//! statement; documents are listed in creation order (`COALESCE(seq, _id)`).

pub mod cond;
pub mod dialect;
pub mod names;
pub mod nested;
pub mod outputs;
pub mod param;
pub mod rules;
pub mod search;
pub mod table;
pub mod table_core;

#[cfg(feature = "golden")]
#[doc(hidden)]
pub mod golden;
