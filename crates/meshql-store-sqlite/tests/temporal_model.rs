//! The model-based temporal test (shared with the memory store, whose tests/model/mod.rs
//! holds the model and the operations) against embedded SQLite.

#[path = "../../meshql-store-memory/tests/model/mod.rs"]
mod model;

use meshql_core::{DynStore, Store};
use meshql_store_sqlite::{SqliteDatabase, SqliteOptions, SqliteStore};
use proptest::prelude::*;
use std::sync::Arc;

async fn fresh_store() -> (DynStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = SqliteDatabase::open(&dir.path().join("test.db"), SqliteOptions::default())
        .expect("open sqlite");
    let store = SqliteStore::new(db, "thing");
    store
        .prepare(&meshql_conformance::templates())
        .await
        .expect("prepare");
    // the directory outlives the store: model::run shuts the store down first
    (Arc::new(store), dir)
}

proptest! {
    // each case opens a database: fewer cases than the memory store's
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn sqlite_store_agrees_with_the_model(ops in prop::collection::vec(model::op(), 1..40)) {
        model::run(fresh_store, &ops)?;
    }
}
