//! The change feed's commit order on a real MariaDB: a writer holding the table's feed clock
//! (between taking its position and committing) makes the next writer wait for its commit,
//! so positions never commit out of order and a reader can never skip one.

use meshql_core::{ChangeFeed, Cursor, NewDocument, Store, StoreReader, StoreWriter, WriteContext};
use meshql_store_mysql::{MysqlDatabase, MysqlOptions, MysqlStore};
use mysql_async::prelude::Queryable;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

fn mysql_url() -> String {
    meshql_conformance::test_server_url("mariadb", "MESHQL_TEST_MYSQL_URL")
}

/// The server's URL, a fresh table's name, and its store.
async fn fresh_store() -> (String, String, Arc<MysqlStore>) {
    let url = mysql_url();
    let db = MysqlDatabase::connect(&MysqlOptions::new(url.clone())).expect("pool");
    let table = format!("clock_{}", uuid::Uuid::new_v4().simple());
    let store = Arc::new(MysqlStore::new(db, &table));
    store.prepare(&[]).await.expect("prepare");
    (url, table, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn positions_are_taken_in_commit_order() {
    let (url, table, store) = fresh_store().await;

    // a slow writer in its last step: it has taken position 1 and written its version, but
    // not committed
    let mut slow = mysql_async::Conn::from_url(url.as_str())
        .await
        .expect("connect");
    slow.query_drop("BEGIN").await.unwrap();
    slow.exec_drop(
        "UPDATE meshql_feed_clock SET pos = LAST_INSERT_ID(pos + 1) WHERE name = ?",
        (table.as_str(),),
    )
    .await
    .unwrap();
    slow.query_drop(format!(
        "INSERT INTO `{table}` (id, payload, created_at, authorized_tokens, pos) \
         VALUES ('slow', '{{\"id\": \"slow\"}}', 1, '[]', LAST_INSERT_ID())"
    ))
    .await
    .unwrap();

    // a fast writer cannot take a position until the slow one commits
    let fast = {
        let store = store.clone();
        tokio::spawn(async move {
            let payload = json!({"name": "fast"}).as_object().unwrap().clone();
            store
                .create(NewDocument::new(payload), &WriteContext::SYSTEM)
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!fast.is_finished(), "the fast writer waits for the clock");
    assert!(store.changes(Cursor::START, 10).await.unwrap().is_empty());

    slow.query_drop("COMMIT").await.unwrap();
    fast.await.unwrap().expect("fast write");
    let feed = store.changes(Cursor::START, 10).await.unwrap();
    let order: Vec<(&str, Cursor)> = feed.iter().map(|c| (c.id.as_str(), c.cursor)).collect();
    assert_eq!(order.len(), 2);
    assert_eq!(order[0], ("slow", Cursor::seq(1)));
    assert_eq!(order[1].1, Cursor::seq(2));
    drop(slow);
    store.shutdown().await;
}

/// A table whose clock row went missing (an operator deleted it) refuses writes with a clear
/// error and stores nothing: one document (its position taken, stamped and committed in one
/// text query) and a batch (statement by statement) alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_clock_refuses_writes_and_stores_nothing() {
    let (url, table, store) = fresh_store().await;
    let doc = |name: &str| NewDocument::new(json!({"name": name}).as_object().unwrap().clone());
    store
        .create(doc("kept"), &WriteContext::SYSTEM)
        .await
        .expect("a write with its clock");

    let mut admin = mysql_async::Conn::from_url(url.as_str())
        .await
        .expect("connect");
    admin
        .exec_drop(
            "DELETE FROM meshql_feed_clock WHERE name = ?",
            (table.as_str(),),
        )
        .await
        .unwrap();
    let one = store.create(doc("lost"), &WriteContext::SYSTEM).await;
    let many = store
        .create_many(vec![doc("lost 1"), doc("lost 2")], &WriteContext::SYSTEM)
        .await;
    for refused in [one.map(|_| ()), many.map(|_| ())] {
        let e = refused.expect_err("no clock, no write");
        assert!(
            e.to_string().contains("feed clock") && e.to_string().contains(&table),
            "{e}"
        );
    }
    let names: Vec<String> = store
        .list(&meshql_core::ReadContext::LATEST)
        .await
        .unwrap()
        .iter()
        .map(|e| {
            e.payload_map().unwrap()["name"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(names, ["kept"]);
    let feed = store.changes(Cursor::START, 10).await.unwrap();
    assert_eq!(feed.len(), 1);
    drop(admin);
    store.shutdown().await;
}
