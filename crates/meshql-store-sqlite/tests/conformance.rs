//! The shared storage conformance suite against embedded SQLite.

use meshql_core::{DynStore, Store};
use meshql_store_sqlite::{SqliteDatabase, SqliteOptions, SqliteStore};
use std::sync::Arc;

async fn fresh_store() -> DynStore {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = SqliteDatabase::open(&dir.path().join("test.db"), SqliteOptions::default())
        .expect("open sqlite");
    // keep the directory for the life of the test process
    std::mem::forget(dir);
    let store = SqliteStore::new(db, "thing");
    store
        .prepare(&meshql_conformance::templates())
        .await
        .expect("prepare");
    Arc::new(store)
}

meshql_conformance::conformance_tests!(fresh_store());
meshql_conformance::operator_tests!(fresh_store());
meshql_conformance::output_tests!(fresh_store());
