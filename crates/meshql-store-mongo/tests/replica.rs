//! `read_url`: the collections as the `read_url` client serves them are readers of their own
//! ([`meshql_core::Database::replica`], what the engine serves the API's reads from), and an
//! entity's own store reads through the primary's client only, so a write path never sees a
//! replica's stale version. The "replica" here is a second FerretDB server of this test's own
//! (same database and collection names) that receives nothing: a replica that has not caught
//! up. The primary is the shared test server (`MESHQL_TEST_MONGO_URL`, or started by
//! `scripts/services/ferretdb.sh`).

use meshql_core::{
    Database, NewDocument, ReadContext, Store, StoreError, StoreReader, StoreWriter, TokenFilter,
    WriteContext,
};
use meshql_store_mongo::{MongoDatabase, MongoOptions, MongoStore};
use mongodb::bson::{doc, oid::ObjectId, DateTime};
use serde_json::json;

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

    db.ping().await.expect("both clients answer");
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
