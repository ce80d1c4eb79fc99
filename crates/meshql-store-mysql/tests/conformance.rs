//! The shared storage conformance suite against a real MariaDB, started by
//! `scripts/services/mariadb.sh` (or reached through `MESHQL_TEST_MYSQL_URL`). The tests fail,
//! loudly, when no server can be started.

use meshql_core::{DynStore, Store};
use meshql_store_mysql::{MysqlDatabase, MysqlOptions, MysqlStore};
use std::sync::{Arc, OnceLock};

fn mysql_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        if let Ok(url) = std::env::var("MESHQL_TEST_MYSQL_URL") {
            return url;
        }
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/services/mariadb.sh"
        );
        let out = std::process::Command::new("bash")
            .arg(script)
            .arg("start")
            .output()
            .expect("run scripts/services/mariadb.sh");
        assert!(
            out.status.success(),
            "MariaDB could not be started for the tests:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    })
    .clone()
}

async fn fresh_store() -> DynStore {
    let db = MysqlDatabase::connect(&MysqlOptions::new(mysql_url())).expect("pool");
    let table = format!("conf_{}", uuid::Uuid::new_v4().simple());
    let store = MysqlStore::new(db, &table);
    store
        .prepare(&meshql_conformance::templates())
        .await
        .expect("prepare a fresh table");
    Arc::new(store)
}

meshql_conformance::conformance_tests!(fresh_store());
