//! The change feed's visibility horizon on a real PostgreSQL: a transaction that wrote first
//! and commits last is not skipped by a reader that read in between (the outbox pitfall).

use meshql_core::{ChangeFeed, Cursor, NewDocument, Store, StoreWriter, WriteContext};
use meshql_store_postgres::{PostgresDatabase, PostgresOptions, PostgresStore};
use serde_json::json;
use std::time::{Duration, Instant};

fn postgres_url() -> String {
    meshql_conformance::test_server_url("postgres", "MESHQL_TEST_POSTGRES_URL")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_that_commits_late_is_not_skipped() {
    let url = postgres_url();
    let db = PostgresDatabase::connect(&PostgresOptions::new(url.clone())).expect("pool");
    let table = format!("horizon_{}", uuid::Uuid::new_v4().simple());
    let store = PostgresStore::new(db, &table);
    store.prepare(&[]).await.expect("prepare");

    // a slow writer: its transaction takes its id and writes a version first...
    let (slow, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    slow.batch_execute(&format!(
        "BEGIN; INSERT INTO \"{table}\" (id, payload, created_at) \
         VALUES ('slow', '{{\"id\": \"slow\", \"name\": \"slow\"}}', 1)"
    ))
    .await
    .expect("slow transaction writes");

    // ...then a fast writer commits, and a reader reads
    let payload = json!({"name": "fast"}).as_object().unwrap().clone();
    store
        .create(NewDocument::new(payload), &WriteContext::SYSTEM)
        .await
        .expect("fast write");
    let early = store.changes(Cursor::START, 100).await.unwrap();
    assert!(
        early.is_empty(),
        "handing out the fast change now would let the reader resume past the slow one: {early:?}"
    );

    // the slow transaction commits: a reader resuming from where it was sees both, in order
    slow.batch_execute("COMMIT").await.expect("commit");
    let deadline = Instant::now() + Duration::from_secs(20);
    let feed = loop {
        let feed = store.changes(Cursor::START, 100).await.unwrap();
        if feed.len() >= 2 || Instant::now() > deadline {
            break feed;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let ids: Vec<&str> = feed.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids.len(), 2, "{feed:?}");
    assert_eq!(ids[0], "slow");
    assert!(feed[0].cursor < feed[1].cursor);
    store.shutdown().await;
}
