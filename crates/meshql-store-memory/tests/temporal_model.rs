//! The model-based temporal test (tests/model/mod.rs) against the in-memory store.

mod model;

use meshql_core::{DynStore, Store};
use meshql_store_memory::MemoryStore;
use proptest::prelude::*;
use std::sync::Arc;

async fn fresh_store() -> (DynStore, ()) {
    let store = MemoryStore::new();
    store
        .prepare(&meshql_conformance::templates())
        .await
        .expect("prepare");
    (Arc::new(store), ())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn memory_store_agrees_with_the_model(ops in prop::collection::vec(model::op(), 1..40)) {
        model::run(fresh_store, &ops)?;
    }
}
