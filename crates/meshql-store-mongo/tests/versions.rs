//! MongoDB-specific write semantics (no transactions): a stale `latest` flag, as a failed
//! second write step or a writer in another process leaves it, is invisible to readers and
//! cleared by the next write; two clients updating one id at once end with exactly the
//! newest version flagged; a restart prepares an existing collection again. Against FerretDB
//! like the conformance suite.

use meshql_core::{NewDocument, Store, TokenFilter};
use meshql_core::{StoreReader as _, StoreWriter as _};
use meshql_store_mongo::{MongoDatabase, MongoOptions, MongoStore};
use mongodb::bson::{doc, Document};
use serde_json::json;
use std::sync::Arc;

fn mongo_url() -> String {
    meshql_conformance::test_server_url("ferretdb", "MESHQL_TEST_MONGO_URL")
}

const DB: &str = "meshql_versions";

async fn store_on(collection: &str) -> MongoStore {
    let db = MongoDatabase::connect(&MongoOptions::new(mongo_url(), DB))
        .await
        .expect("client");
    let store = MongoStore::new(db, collection);
    store
        .prepare(&meshql_conformance::templates())
        .await
        .expect("prepare");
    store
}

async fn raw(collection: &str) -> mongodb::Collection<Document> {
    mongodb::Client::with_uri_str(mongo_url())
        .await
        .expect("raw client")
        .database(DB)
        .collection(collection)
}

fn doc_of(v: serde_json::Value) -> NewDocument {
    match v {
        serde_json::Value::Object(m) => NewDocument::new(m),
        other => panic!("not an object: {other}"),
    }
}

fn fresh_name() -> String {
    format!("v_{}", uuid::Uuid::new_v4().simple())
}

#[tokio::test]
async fn a_stale_latest_flag_is_ignored_by_readers_and_cleared_by_the_next_write() {
    let name = fresh_name();
    let store = store_on(&name).await;
    let coll = raw(&name).await;
    let all = TokenFilter::All;
    let a = store
        .create(
            doc_of(json!({"name": "first"})),
            &meshql_core::WriteContext::SYSTEM,
        )
        .await
        .unwrap();
    store
        .update(
            &a.id,
            doc_of(json!({"name": "second"})),
            &meshql_core::WriteContext::SYSTEM,
        )
        .await
        .unwrap()
        .expect("updated");
    // what a failed flag-clearing step leaves behind: the older version still flagged
    let r = coll
        .update_many(doc! {"id": &a.id}, doc! {"$set": {"latest": true}})
        .await
        .unwrap();
    assert_eq!(r.modified_count, 1);

    let read = store
        .read(&a.id, &meshql_core::ReadContext::new(&all, None))
        .await
        .unwrap()
        .unwrap();
    assert!(read.payload.contains("second"), "{}", read.payload);
    let list = store
        .list(&meshql_core::ReadContext::new(&all, None))
        .await
        .unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
    assert!(list[0].payload.contains("second"));
    let many = store
        .read_many(
            std::slice::from_ref(&a.id),
            &meshql_core::ReadContext::new(&all, None),
        )
        .await
        .unwrap();
    assert_eq!(many.len(), 1);
    assert!(many[0].payload.contains("second"));

    // the next write of the id leaves exactly its own version flagged
    store
        .update(
            &a.id,
            doc_of(json!({"name": "third"})),
            &meshql_core::WriteContext::SYSTEM,
        )
        .await
        .unwrap()
        .expect("updated");
    let flagged = coll
        .count_documents(doc! {"id": &a.id, "latest": true})
        .await
        .unwrap();
    assert_eq!(flagged, 1);
    let read = store
        .read(&a.id, &meshql_core::ReadContext::new(&all, None))
        .await
        .unwrap()
        .unwrap();
    assert!(read.payload.contains("third"), "{}", read.payload);
    assert_eq!(store.versions(&a.id).await.unwrap().len(), 3);
}

#[tokio::test]
async fn two_clients_updating_one_id_end_with_the_newest_version_flagged() {
    let name = fresh_name();
    // two clients, as two processes would have: no shared in-process lock
    let one = Arc::new(store_on(&name).await);
    let two = Arc::new(store_on(&name).await);
    let all = TokenFilter::All;
    let id = one
        .create(
            doc_of(json!({"name": "start"})),
            &meshql_core::WriteContext::SYSTEM,
        )
        .await
        .unwrap()
        .id;
    let mut tasks = Vec::new();
    for (w, store) in [one.clone(), two.clone()].into_iter().enumerate() {
        let id = id.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..25 {
                store
                    .update(
                        &id,
                        doc_of(json!({"name": format!("w{w}-{i}")})),
                        &meshql_core::WriteContext::SYSTEM,
                    )
                    .await
                    .expect("update")
                    .expect("found");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let coll = raw(&name).await;
    let flagged: Vec<Document> = {
        use futures::TryStreamExt;
        coll.find(doc! {"id": &id, "latest": true})
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap()
    };
    assert_eq!(flagged.len(), 1, "{flagged:?}");
    let versions = one.versions(&id).await.unwrap();
    assert_eq!(versions.len(), 51, "every update stored");
    let newest = versions.last().unwrap();
    assert_eq!(
        flagged[0]
            .get_datetime("created_at")
            .unwrap()
            .timestamp_millis(),
        newest.created_at
    );
    let read = two
        .read(&id, &meshql_core::ReadContext::new(&all, None))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read.payload, newest.payload);
    assert_eq!(
        one.list(&meshql_core::ReadContext::new(&all, None))
            .await
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test]
async fn a_restart_prepares_an_existing_collection_again() {
    let name = fresh_name();
    let first = store_on(&name).await;
    let kept = first
        .create(
            doc_of(json!({"name": "kept"})),
            &meshql_core::WriteContext::SYSTEM,
        )
        .await
        .unwrap();
    first.shutdown().await;
    // a new process: new client, same collection, indexes already in place
    let second = store_on(&name).await;
    let read = second
        .read(
            &kept.id,
            &meshql_core::ReadContext::new(&TokenFilter::All, None),
        )
        .await
        .unwrap()
        .expect("still there");
    assert_eq!(read.payload, kept.payload);
    let indexes = raw(&name).await.list_index_names().await.unwrap();
    assert!(indexes.len() >= 3, "{indexes:?}");
}
