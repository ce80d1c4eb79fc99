//! MongoDB storage: one document per version in one collection per entity,
//!
//! ```text
//! { _id: ObjectId, id, payload: {...}, created_at: Date, deleted, authorized_tokens: [...],
//!   latest, seq }
//! ```
//!
//! `latest` marks the newest version of each id; `seq` (the `_id` of a document's first
//! version) keeps lists in creation order. Indexes: `{id, created_at}` (unique),
//! `{latest, deleted, seq}`, and one per filtered payload field. Reads at a past time use an
//! aggregation (`$match created_at ≤ at` → newest per id → filter), so tombstones and moved
//! documents are handled as on every backend ("latest, then filter").
//!
//! Writes of one id are serialised inside the process (striped locks) and insert the new
//! version before clearing the old `latest` flag, so a reader never sees a document vanish.
//! Across several writer processes, updates of the *same* id need MongoDB transactions
//! (replica sets), which this backend does not use yet; FerretDB, the MongoDB-wire server
//! the tests run against, has neither transactions nor change streams.

mod store;

pub use store::{MongoDatabase, MongoStore};
