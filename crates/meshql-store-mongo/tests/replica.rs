//! `read_url`: the collections as the `read_url` client serves them are readers of their own
//! ([`meshql_core::Database::replica`], what the engine serves the API's reads from), and an
//! entity's own store reads through the primary's client only, so a write path never sees a
//! replica's stale version. The "replica" here is a second FerretDB server of this test's own
//! (same database and collection names) that receives nothing: a replica that has not caught
//! up. The primary is the shared test server (`MESHQL_TEST_MONGO_URL`, or started by
//! `scripts/services/ferretdb.sh`).
//!
//! The `read_url`'s probe ([`meshql_core::Database::replica_probe`]): a server that answers
//! has no lag to tell (not measured on MongoDB), one where nothing listens is unavailable
//! within the URI's `serverSelectionTimeoutMS` (and leaves the primary ready), and a client
//! whose permits are all held is saturated, the probe then answering without waiting.

use meshql_core::replica::ReplicaSettings;
use meshql_core::{
    Database, NewDocument, ReadContext, Store, StoreError, StoreReader, StoreWriter, TokenFilter,
    WriteContext,
};
use meshql_store_mongo::{MongoDatabase, MongoOptions, MongoStore};
use mongodb::bson::{doc, oid::ObjectId, DateTime};
use serde_json::json;
use std::time::{Duration, Instant};

mod common;

const DB: &str = "meshql_replica";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replica_serves_its_own_reads_and_the_primary_store_never_reads_it() {
    let url = meshql_conformance::test_server_url("ferretdb", "MESHQL_TEST_MONGO_URL");
    let lagging = common::Server::start();
    let collection = format!("replica_{}", uuid::Uuid::new_v4().simple());

    let without = MongoDatabase::connect(&MongoOptions::new(url.clone(), DB))
        .await
        .unwrap();
    assert!(!without.has_replica());
    assert!(
        without.clone().replica(&collection).is_none(),
        "no read_url, no replica"
    );
    without.close().await;

    let db = MongoDatabase::connect(&MongoOptions {
        read_url: Some(lagging.uri()),
        ..MongoOptions::new(url.clone(), DB)
    })
    .await
    .unwrap();
    assert!(db.has_replica());
    let primary = MongoStore::new(db.clone(), &collection);
    primary.prepare(&[]).await.unwrap();
    let replica = db
        .clone()
        .replica(&collection)
        .expect("read_url gives a replica");

    let written = primary
        .create(
            NewDocument::new(json!({"name": "new"}).as_object().unwrap().clone()),
            &WriteContext::SYSTEM,
        )
        .await
        .unwrap();
    assert!(
        primary
            .read(&written.id, &ReadContext::LATEST)
            .await
            .unwrap()
            .is_some(),
        "the primary store reads the primary"
    );
    assert!(
        replica
            .read(&written.id, &ReadContext::LATEST)
            .await
            .unwrap()
            .is_none(),
        "the replica store reads the replica, which never received the write"
    );
    assert!(replica.list(&ReadContext::LATEST).await.unwrap().is_empty());
    assert_eq!(primary.list(&ReadContext::LATEST).await.unwrap().len(), 1);

    // a version that reached the replica by other means (as replication would bring it): one
    // document in the store's layout (see the crate docs), inserted into the second server
    let raw = mongodb::Client::with_uri_str(lagging.uri())
        .await
        .expect("a client of the second server");
    let oid = ObjectId::new();
    let created_at = meshql_core::now_millis();
    raw.database(DB)
        .collection(&collection)
        .insert_one(doc! {
            "_id": oid,
            "id": "replicated",
            "payload": {"name": "replicated"},
            "created_at": DateTime::from_millis(created_at),
            "deleted": false,
            "authorized_tokens": [],
            "latest": true,
            "seq": oid,
            "pos": 1_i64,
        })
        .await
        .expect("insert into the second server");
    let found = replica
        .read("replicated", &ReadContext::LATEST)
        .await
        .unwrap()
        .expect("the replica reader finds what the replica holds");
    assert!(found.payload.contains("replicated"), "{}", found.payload);
    assert_eq!(found.created_at, created_at);
    let listed = replica.list(&ReadContext::LATEST).await.unwrap();
    assert_eq!(
        listed.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(),
        ["replicated"]
    );
    let all = TokenFilter::All;
    let at = ReadContext::new(&all, Some(created_at));
    assert!(
        replica.read("replicated", &at).await.unwrap().is_some(),
        "reads at a time go to the replica too"
    );
    assert!(
        primary
            .read("replicated", &ReadContext::LATEST)
            .await
            .unwrap()
            .is_none(),
        "the primary store never reads the replica"
    );

    db.ping().await.expect("the primary answers");
    // closing the database closes both clients
    db.close().await;
    for (which, result) in [
        (
            "primary",
            primary.read(&written.id, &ReadContext::LATEST).await,
        ),
        (
            "replica",
            replica.read("replicated", &ReadContext::LATEST).await,
        ),
    ] {
        assert!(
            matches!(result, Err(StoreError::Unavailable(_))),
            "{which} after close: {result:?}"
        );
    }
    raw.shutdown().await;
}

/// A `read_url` on a port where nothing listens, giving up server selection after `ms`.
fn dead_read_url(ms: u64) -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("mongodb://127.0.0.1:{port}/?serverSelectionTimeoutMS={ms}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_url_that_answers_is_probed_without_a_lag_to_tell() {
    let url = meshql_conformance::test_server_url("ferretdb", "MESHQL_TEST_MONGO_URL");
    let without = MongoDatabase::connect(&MongoOptions::new(url.clone(), DB))
        .await
        .unwrap();
    assert!(without.replica_probe().is_none(), "no read_url, no probe");

    let settings = ReplicaSettings {
        max_lag: Duration::from_millis(1500),
        probe_every: Duration::from_millis(20),
    };
    let db = MongoDatabase::connect(&MongoOptions {
        read_url: Some(url.clone()),
        replica: settings,
        ..MongoOptions::new(url, DB)
    })
    .await
    .unwrap();
    let probe = db.clone().replica_probe().expect("read_url gives a probe");
    assert_eq!(probe.settings(), settings);
    assert!(!probe.saturated(), "idle");
    for _ in 0..3 {
        assert_eq!(probe.lag().await.expect("the read_url answers"), None);
    }
    assert!(!probe.saturated(), "the probe gave its permit back");
    db.close().await;
    let closed = probe.lag().await;
    assert!(
        matches!(closed, Err(StoreError::Unavailable(_))),
        "{closed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_url_where_nothing_listens_is_unavailable_and_the_primary_stays_ready() {
    let url = meshql_conformance::test_server_url("ferretdb", "MESHQL_TEST_MONGO_URL");
    let db = MongoDatabase::connect(&MongoOptions {
        read_url: Some(dead_read_url(1000)),
        ..MongoOptions::new(url, DB)
    })
    .await
    .unwrap();
    let probe = db.clone().replica_probe().unwrap();
    let started = Instant::now();
    let lag = tokio::time::timeout(Duration::from_secs(10), probe.lag())
        .await
        .expect("the probe ends");
    assert!(matches!(lag, Err(StoreError::Unavailable(_))), "{lag:?}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert!(!probe.saturated(), "the failed ping gave its permit back");
    db.ping()
        .await
        .expect("a dead read_url does not make the database unready");
    db.close().await;
}

/// `pool_size = 1` on a dead `read_url`: a read waiting for a server holds the only permit,
/// the client is saturated meanwhile, and the probe repeats its last answer at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_url_with_every_permit_held_is_saturated_and_the_probe_does_not_wait() {
    let url = meshql_conformance::test_server_url("ferretdb", "MESHQL_TEST_MONGO_URL");
    let db = MongoDatabase::connect(&MongoOptions {
        read_url: Some(dead_read_url(2000)),
        pool_size: Some(1),
        ..MongoOptions::new(url, DB)
    })
    .await
    .unwrap();
    let probe = db.clone().replica_probe().unwrap();
    assert!(!probe.saturated(), "idle");
    let first = probe.lag().await;
    assert!(
        matches!(first, Err(StoreError::Unavailable(_))),
        "{first:?}"
    );

    let replica = db.clone().replica("saturated").unwrap();
    let read = tokio::spawn(async move { replica.list(&ReadContext::LATEST).await });
    let deadline = Instant::now() + Duration::from_secs(5);
    while !probe.saturated() {
        assert!(Instant::now() < deadline, "the read never took the permit");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let started = Instant::now();
    let repeated = probe.lag().await;
    assert!(
        started.elapsed() < Duration::from_millis(200),
        "the probe waited {:?}",
        started.elapsed()
    );
    assert_eq!(
        repeated.unwrap_err().to_string(),
        first.unwrap_err().to_string(),
        "the last answer, repeated"
    );
    assert!(!read.is_finished(), "the read still waits for a server");
    let read = read.await.unwrap();
    assert!(matches!(read, Err(StoreError::Unavailable(_))), "{read:?}");
    assert!(!probe.saturated(), "the permit went back");
    db.close().await;
}
