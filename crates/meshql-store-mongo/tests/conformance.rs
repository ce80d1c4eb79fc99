//! The shared storage conformance suite against a MongoDB-wire server (FerretDB, started by
//! `scripts/services/ferretdb.sh`, or `MESHQL_TEST_MONGO_URL`). The tests fail, loudly, when
//! no server can be started.

use meshql_core::{DynStore, Store};
use meshql_store_mongo::{MongoDatabase, MongoOptions, MongoStore};
use std::sync::Arc;

fn mongo_url() -> String {
    meshql_conformance::test_server_url("ferretdb", "MESHQL_TEST_MONGO_URL")
}

async fn fresh_store() -> DynStore {
    let db = MongoDatabase::connect(&MongoOptions::new(mongo_url(), "meshql_conformance"))
        .await
        .expect("client");
    let collection = format!("conf_{}", uuid::Uuid::new_v4().simple());
    let store = MongoStore::new(db, &collection);
    store
        .prepare(&meshql_conformance::templates())
        .await
        .expect("prepare a fresh collection");
    Arc::new(store)
}

meshql_conformance::conformance_tests!(fresh_store());
meshql_conformance::operator_tests!(fresh_store());
meshql_conformance::output_tests!(fresh_store());
