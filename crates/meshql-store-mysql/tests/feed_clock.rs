//! The change feed's commit order on a real MariaDB: a writer holding the table's feed clock
//! (between taking its position and committing) makes the next writer wait for its commit,
//! so positions never commit out of order and a reader can never skip one.

use meshql_core::{ChangeFeed, Cursor, NewDocument, Store, StoreWriter, WriteContext};
use meshql_store_mysql::{MysqlDatabase, MysqlOptions, MysqlStore};
use mysql_async::prelude::Queryable;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

fn mysql_url() -> String {
    meshql_conformance::test_server_url("mariadb", "MESHQL_TEST_MYSQL_URL")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn positions_are_taken_in_commit_order() {
    let url = mysql_url();
    let db = MysqlDatabase::connect(&MysqlOptions::new(url.clone())).expect("pool");
    let table = format!("clock_{}", uuid::Uuid::new_v4().simple());
    let store = Arc::new(MysqlStore::new(db, &table));
    store.prepare(&[]).await.expect("prepare");

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
