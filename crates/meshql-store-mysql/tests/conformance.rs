//! The shared storage conformance suite against a real MariaDB, started by
//! `scripts/services/mariadb.sh` (or reached through `MESHQL_TEST_MYSQL_URL`). The tests fail,
//! loudly, when no server can be started.

use meshql_core::{DynStore, Store};
use meshql_store_mysql::{MysqlDatabase, MysqlOptions, MysqlStore};
use std::sync::Arc;

fn mysql_url() -> String {
    meshql_conformance::test_server_url("mariadb", "MESHQL_TEST_MYSQL_URL")
}

async fn fresh_store() -> DynStore {
    // with nested statements, so that the suite checks them against level by level
    let mut options = MysqlOptions::new(mysql_url());
    options.nested_sql = true;
    let db = MysqlDatabase::connect(&options).expect("pool");
    let table = format!("conf_{}", uuid::Uuid::new_v4().simple());
    let store = MysqlStore::new(db, &table);
    store
        .prepare(&meshql_conformance::templates())
        .await
        .expect("prepare a fresh table");
    Arc::new(store)
}

meshql_conformance::conformance_tests!(fresh_store());
meshql_conformance::operator_tests!(fresh_store());
meshql_conformance::output_tests!(fresh_store());
