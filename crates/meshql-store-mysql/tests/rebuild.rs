//! A projection rebuild's swap on a real MariaDB when it stops half-way (a crash): the
//! rename and the consumer's rows cannot share a transaction there, so `prepare` at the next
//! start finishes a swap whose rename happened and abandons one whose rename did not (see
//! the crate's `store::outputs` docs, "Rebuilds").

use meshql_core::{DynStore, OutputBatch, OutputWrite, ReadContext, TokenFilter, WriteContext};
use meshql_store_mysql::{MysqlDatabase, MysqlOptions, MysqlStore};
use mysql_async::prelude::Queryable;
use serde_json::json;
use std::sync::Arc;

fn mysql_url() -> String {
    meshql_conformance::test_server_url("mariadb", "MESHQL_TEST_MYSQL_URL")
}

/// The table's name, its store (prepared), and a connection of its own.
async fn fresh() -> (String, DynStore, mysql_async::Conn) {
    let url = mysql_url();
    let db = MysqlDatabase::connect(&MysqlOptions::new(url.clone())).expect("pool");
    let table = format!("rebuild_{}", uuid::Uuid::new_v4().simple());
    let store: DynStore = Arc::new(MysqlStore::new(db, &table));
    store
        .prepare(&meshql_conformance::templates())
        .await
        .expect("prepare");
    let conn = mysql_async::Conn::from_url(url.as_str())
        .await
        .expect("connect");
    (table, store, conn)
}

fn put(consumer: &str, position: u64, id: &str, name: &str) -> OutputBatch {
    OutputBatch {
        writes: vec![OutputWrite::Put {
            id: id.to_owned(),
            payload: json!({ "name": name }).to_string(),
        }],
        ..OutputBatch::new(consumer, position)
    }
}

async fn names(store: &DynStore) -> Vec<String> {
    let mut out: Vec<String> = store
        .list(&ReadContext::new(&TokenFilter::All, None))
        .await
        .unwrap()
        .iter()
        .map(|e| {
            let v: serde_json::Value = serde_json::from_str(&e.payload).unwrap();
            v["name"].as_str().unwrap().to_owned()
        })
        .collect();
    out.sort();
    out
}

/// A live table written by consumer `c` at position 3, and a rebuild at position 7 written
/// by `c#rebuild`, not swapped yet; the swap's row written (step 1 of a swap).
async fn half_swapped(table: &str, store: &DynStore, conn: &mut mysql_async::Conn) -> String {
    let c = format!("c-{table}");
    let from = format!("{c}#rebuild");
    let w = WriteContext::SYSTEM;
    store
        .apply_output(put(&c, 3, "a", "old"), &w)
        .await
        .unwrap();
    let shadow = store.rebuild_store().await.unwrap();
    shadow
        .apply_output(put(&from, 7, "a", "new"), &w)
        .await
        .unwrap();
    conn.exec_drop(
        "INSERT INTO _meshql_rebuild_swaps (tbl, from_consumer, to_consumer) VALUES (?, ?, ?)",
        (table, &from, &c),
    )
    .await
    .unwrap();
    c
}

async fn swaps_pending(conn: &mut mysql_async::Conn, table: &str) -> i64 {
    conn.exec_first(
        "SELECT COUNT(*) FROM _meshql_rebuild_swaps WHERE tbl = ?",
        (table,),
    )
    .await
    .unwrap()
    .unwrap()
}

#[tokio::test]
async fn a_swap_stopped_after_its_rename_is_finished_at_the_next_start() {
    let (table, store, mut conn) = fresh().await;
    let c = half_swapped(&table, &store, &mut conn).await;
    conn.query_drop(format!(
        "RENAME TABLE `{table}` TO `{table}__old`, `{table}__rebuild` TO `{table}`"
    ))
    .await
    .unwrap();
    // the crash: the rebuilt table is in place, the consumer's rows are the old ones
    assert_eq!(store.output_position(&c).await.unwrap(), Some(3));

    store
        .prepare(&meshql_conformance::templates())
        .await
        .expect("a restart");
    assert_eq!(store.output_position(&c).await.unwrap(), Some(7));
    assert_eq!(
        store
            .output_position(&format!("{c}#rebuild"))
            .await
            .unwrap(),
        None
    );
    assert_eq!(names(&store).await, vec!["new"]);
    assert_eq!(swaps_pending(&mut conn, &table).await, 0);
    let old: Option<i64> = conn
        .exec_first(
            "SELECT COUNT(*) FROM information_schema.tables \
             WHERE table_schema = DATABASE() AND table_name = ?",
            (format!("{table}__old"),),
        )
        .await
        .unwrap();
    assert_eq!(old, Some(0), "the old table is dropped");
}

#[tokio::test]
async fn a_swap_stopped_before_its_rename_is_abandoned_and_can_run_again() {
    let (table, store, mut conn) = fresh().await;
    let c = half_swapped(&table, &store, &mut conn).await;
    store
        .prepare(&meshql_conformance::templates())
        .await
        .expect("a restart");
    assert_eq!(swaps_pending(&mut conn, &table).await, 0);
    assert_eq!(store.output_position(&c).await.unwrap(), Some(3));
    assert_eq!(names(&store).await, vec!["old"]);

    // the rebuild table is still there: swapping it now completes the rebuild
    store
        .swap_rebuilt(&format!("{c}#rebuild"), &c)
        .await
        .expect("swap");
    assert_eq!(store.output_position(&c).await.unwrap(), Some(7));
    assert_eq!(names(&store).await, vec!["new"]);
    assert_eq!(swaps_pending(&mut conn, &table).await, 0);
}
