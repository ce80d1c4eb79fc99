//! The shared storage conformance suite against a real PostgreSQL, started by
//! `scripts/services/postgres.sh` (or reached through `MESHQL_TEST_POSTGRES_URL`). The tests
//! fail, loudly, when no server can be started.

use meshql_core::{DynStore, Store};
use meshql_store_postgres::{PostgresDatabase, PostgresOptions, PostgresStore};
use std::sync::{Arc, OnceLock};

fn postgres_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        if let Ok(url) = std::env::var("MESHQL_TEST_POSTGRES_URL") {
            return url;
        }
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/services/postgres.sh"
        );
        let out = std::process::Command::new("bash")
            .arg(script)
            .arg("start")
            .output()
            .expect("run scripts/services/postgres.sh");
        assert!(
            out.status.success(),
            "PostgreSQL could not be started for the tests:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    })
    .clone()
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
