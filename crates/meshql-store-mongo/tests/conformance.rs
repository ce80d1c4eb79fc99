//! The shared storage conformance suite against a MongoDB-wire server (FerretDB, started by
//! `scripts/services/ferretdb.sh`, or `MESHQL_TEST_MONGO_URL`). The tests fail, loudly, when
//! no server can be started.

use meshql_core::{DynStore, Store};
use meshql_store_mongo::{MongoDatabase, MongoStore};
use std::sync::{Arc, OnceLock};

fn mongo_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        if let Ok(url) = std::env::var("MESHQL_TEST_MONGO_URL") {
            return url;
        }
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/services/ferretdb.sh"
        );
        let out = std::process::Command::new("bash")
            .arg(script)
            .arg("start")
            .output()
            .expect("run scripts/services/ferretdb.sh");
        assert!(
            out.status.success(),
            "FerretDB could not be started for the tests:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    })
    .clone()
}

async fn fresh_store() -> DynStore {
    let db = MongoDatabase::connect(&mongo_url(), "meshql_conformance")
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
