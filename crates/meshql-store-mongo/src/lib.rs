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
//! Every operation takes one of `pool_size` permits first, waiting at most `pool_wait`
//! (the driver itself would queue for a connection without a bound), so an exhausted pool
//! answers 503 after a bounded wait.

pub mod feed;
mod settings;
mod store;

pub use feed::DEFAULT_FEED_GRACE;
pub use settings::{MongoBackend, MongoSettings};
pub use store::{MongoDatabase, MongoOptions, MongoStore};
