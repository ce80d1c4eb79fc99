//! The shared storage conformance suite against the in-memory store.

use meshql_core::{DynStore, Store};
use meshql_store_memory::MemoryStore;
use std::sync::Arc;

async fn fresh_store() -> DynStore {
    let store = MemoryStore::new();
    store
        .prepare(&meshql_conformance::templates())
        .await
        .expect("prepare");
    Arc::new(store)
}

meshql_conformance::conformance_tests!(fresh_store());
meshql_conformance::operator_tests!(fresh_store());
meshql_conformance::output_tests!(fresh_store());
