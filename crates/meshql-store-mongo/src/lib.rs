//! MongoDB storage: one document per version in one collection per entity,
//!
//! ```text
//! { _id: ObjectId, id, payload: {...}, created_at: Date, deleted, authorized_tokens: [...],
//!   latest, seq, pos: Int64, correlation_id?, batch?: Int64, batch_n?: Int64 }
//! ```
//!
//! `latest` marks the newest version of each id; `seq` (the `_id` of a document's first
//! version) keeps lists in creation order. `pos` is the version's place in the change feed,
//! `correlation_id` the writer's, and `batch`/`batch_n` (first position and size) tie the
//! versions of one `create_many` together; the feed, drawn from one counter document per
//! collection in `meshql_feed_clock`, is described in [`feed`]. Indexes: `{id, created_at}`
//! (unique), `{latest, deleted, seq}`, `{pos}` (unique, sparse), and one per filtered payload
//! field. Reads at a past time find the ids with a matching version at or before `at`, then
//! those ids' newest version at or before `at`, and filter that in process (FerretDB lacks
//! `$group`/`$first`), so tombstones and moved documents are handled as on every backend
//! ("latest, then filter").
//!
//! A write draws its feed position, then is one `insert_one` of the new version (the commit
//! point: a single-document insert is atomic), then the `latest` flags are settled: older
//! versions of the id lose theirs, and the new version loses its own should another process
//! have inserted a newer one meanwhile. Inserting first means a reader never sees a
//! document vanish; settling by time means two processes writing one id at once end with
//! the newer version flagged, without transactions (which need a replica set, and which
//! FerretDB, the MongoDB-wire server the tests run against, lacks — as it lacks change
//! streams). Should settling fail, the write still succeeded (the version is stored):
//! readers keep the newest of several flagged versions, the flags are settled in the
//! background, and by the next write of the id. Until then a filtered query may still match
//! the older version. Writes of one id are also serialised inside the process (striped
//! locks). A `create_many` is all or nothing without transactions: one ordered
//! `insert_many`, its `latest` flags settled only once it fully succeeded, and what it
//! inserted deleted again should it fail part-way (see [`feed`] for what readers may see
//! meanwhile).
//!
//! With a `read_url` the database has a second client, and each collection a second,
//! read-only store on it ([`MongoStore::replica`], [`meshql_core::Database::replica`]) that
//! the engine serves the API's reads from; the entity's own store, and so every write and
//! what a write depends on, reads through the `uri`'s client only. The `read_url` client reads
//! with `secondaryPreferred` unless its URI names a `readPreference`. Its servers are probed
//! ([`meshql_core::Database::replica_probe`], `replica.rs`) for reachability and saturation
//! only, not for their replication lag (see there).
//!
//! Every operation takes one of `pool_size` permits first, waiting at most `pool_wait`
//! (the driver itself would queue for a connection without a bound), so an exhausted pool
//! answers 503 after a bounded wait.
//!
//! # Processor outputs: not supported
//!
//! [`meshql_core::OutputStore::supports_outputs`] is `false` here, so a processor writing
//! to a MongoDB entity is refused at start-up. A processor's batch — its document versions,
//! state rows, dead letters and input position — must commit in one transaction, or a crash
//! between two of those writes applies inputs twice or loses them; this store has no
//! multi-document transaction to put them in, and faking one would be worse than refusing.
//!
//! What the tests' server, FerretDB v1.24 (`scripts/services/ferretdb.sh`, its PostgreSQL
//! handler), does with a transaction, checked with the driver (mongodb 3) against it:
//!
//! * `hello` has no `setName` (a standalone), and `commitTransaction` and
//!   `abortTransaction` do not exist: `CommandError { code: 59, code_name:
//!   "CommandNotFound", message: "no such command: 'commitTransaction'" }` (the same for
//!   `abortTransaction`);
//! * a transaction whose first command is a write fails on it: `CommandError { code: 9,
//!   code_name: "FailedToParse", message: "insert: unknown field \"startTransaction\"" }`;
//! * a transaction whose first command is a read does not fail at all, and is no
//!   transaction: `find` ignores `startTransaction`, the `update` after it ignores
//!   `txnNumber` and `autocommit` and is applied at once, and `abort_transaction()`
//!   returns `Ok` (drivers ignore an abort's error) while the upserted document stays
//!   stored. The driver does not refuse a transaction on this standalone by itself: it
//!   sends these commands, and FerretDB's answers are the ones above.
//!
//! So support cannot be found out by trying a transaction; it would have to be enabled only
//! on a server that is a replica set member or `mongos` (`hello` has `setName`, or `msg:
//! "isdbgrid"`) and is not FerretDB (`buildInfo` has no `ferretdbVersion`): a real MongoDB
//! replica set (4.0 on) or sharded cluster (4.2 on). There, `apply_output` would be one
//! session transaction: the versions (their feed positions drawn from the counter document
//! in the same transaction, which also lifts the feed's grace-period limit, see [`feed`]),
//! `_meshql_outputs`, `_meshql_output_state` (unique `{consumer, key}`, index `{consumer,
//! grp, key}`) and `_meshql_dead_letters`, with the driver's retries on
//! `TransientTransactionError` and `UnknownTransactionCommitResult`. It is not written
//! because it could not be tested: no real MongoDB can be installed on these machines
//! (`scripts/services/ferretdb.sh`).
//!
//! Without transactions, exactly once would need a redo log rather than per-write
//! idempotency: making each write idempotent on its own (an idempotency key per output
//! version derived from the input's `change_id`, state rows tagged with the batch position,
//! dead letters unique on `(consumer, change_id)`) is not enough, because a projection's
//! group rows are deltas computed from its contribution rows — a crash after a contribution
//! row but before its group row, then a replay, would see the contribution as already
//! counted and never add it to the group. The batch would instead be written first as one
//! journal document (`{consumer, position, writes, state, dead_letters}`: a single-document
//! insert is atomic; at most 16 MiB, so the processor's batches would have to stay under
//! it), then applied with every step
//! idempotent (versions keyed by `(consumer, position, id)`, upserts, letters keyed by
//! `change_id`), then the position advanced and the journal removed; on start-up and before
//! each batch a leftover journal is applied again first. Readers of the entity would still see
//! a batch's versions appear one by one, unlike on the SQL backends.

mod database;
mod db;
mod document;
mod error;
pub mod feed;
mod filter;
mod replica;
mod settings;
mod store;

pub use db::{MongoDatabase, MongoOptions};
pub use feed::DEFAULT_FEED_GRACE;
pub use settings::{MongoBackend, MongoSettings};
pub use store::MongoStore;
