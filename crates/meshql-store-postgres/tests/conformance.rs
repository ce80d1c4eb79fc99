//! The shared storage conformance suite against a real PostgreSQL, started by
//! `scripts/services/postgres.sh` (or reached through `MESHQL_TEST_POSTGRES_URL`). The tests
//! fail, loudly, when no server can be started.

use meshql_core::{DynStore, Store};
use meshql_store_postgres::{PostgresDatabase, PostgresOptions, PostgresStore};
use std::sync::Arc;

fn postgres_url() -> String {
    meshql_conformance::test_server_url("postgres", "MESHQL_TEST_POSTGRES_URL")
}

async fn fresh_store() -> DynStore {
    let db = PostgresDatabase::connect(&PostgresOptions::new(postgres_url())).expect("pool");
    let table = format!("conf_{}", uuid::Uuid::new_v4().simple());
    let store = PostgresStore::new(db, &table);
    store
        .prepare(&meshql_conformance::templates())
        .await
        .expect("prepare a fresh table");
    Arc::new(store)
}

meshql_conformance::conformance_tests!(fresh_store());
meshql_conformance::operator_tests!(fresh_store());
meshql_conformance::output_tests!(fresh_store());
