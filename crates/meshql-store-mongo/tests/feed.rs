//! The MongoDB change feed where the conformance suite cannot reach: what another process
//! leaves (a position drawn and never written, a batch inserted part-way), versions written
//! before the feed existed, and two clients drawing positions at once (FerretDB's
//! `findAndModify` is not atomic). Other processes are simulated with raw driver calls.
//! Against FerretDB like the conformance suite.

use futures::TryStreamExt;
use meshql_core::ChangeFeed as _;
use meshql_core::StoreWriter as _;
use meshql_core::{ChangeOp, Cursor, NewDocument, Store, StoreChange, WriteContext};
use meshql_store_mongo::{MongoDatabase, MongoOptions, MongoStore};
use mongodb::bson::{doc, oid::ObjectId, DateTime, Document};
use serde_json::json;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

const DB: &str = "meshql_feed";
const GRACE: Duration = Duration::from_millis(400);

fn mongo_url() -> String {
    meshql_conformance::test_server_url("ferretdb", "MESHQL_TEST_MONGO_URL")
}

async fn store_on(collection: &str, grace: Duration) -> MongoStore {
    let mut options = MongoOptions::new(mongo_url(), DB);
    options.feed_grace = grace;
    let db = MongoDatabase::connect(&options).await.expect("client");
    let store = MongoStore::new(db, collection);
    store
        .prepare(&meshql_conformance::templates())
        .await
        .expect("prepare");
    store
}

async fn database() -> mongodb::Database {
    mongodb::Client::with_uri_str(mongo_url())
        .await
        .expect("raw client")
        .database(DB)
}

fn fresh_name() -> String {
    format!("f_{}", uuid::Uuid::new_v4().simple())
}

fn doc_of(v: serde_json::Value) -> NewDocument {
    match v {
        serde_json::Value::Object(m) => NewDocument::new(m),
        other => panic!("not an object: {other}"),
    }
}

fn name_of(c: &StoreChange) -> String {
    serde_json::from_str::<serde_json::Value>(&c.payload).unwrap()["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn names(feed: &[StoreChange]) -> Vec<String> {
    feed.iter().map(name_of).collect()
}

/// A version as another process writes it.
fn version(name: &str, pos: Option<i64>, batch: Option<(i64, i64)>) -> Document {
    let oid = ObjectId::new();
    let id = uuid::Uuid::new_v4().to_string();
    let mut d = doc! {
        "_id": oid, "id": &id, "payload": {"id": &id, "name": name},
        "created_at": DateTime::now(), "deleted": false, "authorized_tokens": [],
        "latest": true, "seq": oid,
    };
    if let Some(p) = pos {
        d.insert("pos", p);
    }
    if let Some((first, n)) = batch {
        d.insert("batch", first);
        d.insert("batch_n", n);
    }
    d
}

/// Draws `n` positions as another process would; the first.
async fn draw_elsewhere(db: &mongodb::Database, collection: &str, n: i64) -> i64 {
    let clock = db
        .collection::<Document>("meshql_feed_clock")
        .find_one_and_update(doc! {"_id": collection}, doc! {"$inc": {"pos": n}})
        .return_document(mongodb::options::ReturnDocument::After)
        .await
        .unwrap()
        .expect("the clock exists once prepared");
    clock.get_i64("pos").unwrap() - n + 1
}

async fn drain(store: &MongoStore, mut after: Cursor) -> Vec<StoreChange> {
    let mut out = Vec::new();
    loop {
        let page = store.changes(after, 1000).await.unwrap();
        let Some(last) = page.last() else { return out };
        after = last.cursor;
        out.extend(page);
    }
}

/// The feed once it holds `expect` changes (or after 20 s).
async fn settled(store: &MongoStore, expect: usize) -> Vec<StoreChange> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let feed = drain(store, Cursor::START).await;
        if feed.len() >= expect || Instant::now() > deadline {
            return feed;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_position_drawn_elsewhere_and_never_written_is_waited_for_then_skipped() {
    let name = fresh_name();
    let store = store_on(&name, GRACE).await;
    let db = database().await;
    store
        .create(doc_of(json!({"name": "one"})), &WriteContext::SYSTEM)
        .await
        .unwrap();
    // another process draws a position, then stalls (or dies) before inserting
    let stalled = draw_elsewhere(&db, &name, 1).await;
    store
        .create(doc_of(json!({"name": "two"})), &WriteContext::SYSTEM)
        .await
        .unwrap();
    let started = Instant::now();
    let first = drain(&store, Cursor::START).await;
    assert_eq!(names(&first), vec!["one"], "stops before the gap");
    let feed = settled(&store, 2).await;
    assert!(
        started.elapsed() >= GRACE,
        "skipped only after the grace period"
    );
    assert_eq!(names(&feed), vec!["one", "two"]);
    assert_eq!(feed[1].cursor, Cursor::seq(stalled as u64 + 1));
    // a version arriving later is past the point: this store's feed stays as it was
    db.collection::<Document>(&name)
        .insert_one(version("late", Some(stalled), None))
        .await
        .unwrap();
    assert_eq!(
        names(&drain(&store, Cursor::START).await),
        vec!["one", "two"]
    );
}

#[tokio::test]
async fn a_position_filled_within_the_grace_period_is_delivered_in_its_place() {
    let name = fresh_name();
    let store = store_on(&name, Duration::from_secs(30)).await;
    let db = database().await;
    let slow = draw_elsewhere(&db, &name, 1).await;
    store
        .create(doc_of(json!({"name": "fast"})), &WriteContext::SYSTEM)
        .await
        .unwrap();
    assert!(drain(&store, Cursor::START).await.is_empty());
    db.collection::<Document>(&name)
        .insert_one(version("slow", Some(slow), None))
        .await
        .unwrap();
    let feed = drain(&store, Cursor::START).await;
    assert_eq!(names(&feed), vec!["slow", "fast"]);
    assert_eq!(feed[0].cursor, Cursor::seq(slow as u64));
}

#[tokio::test]
async fn a_batch_is_delivered_only_whole() {
    let name = fresh_name();
    let store = store_on(&name, Duration::from_secs(30)).await;
    let db = database().await;
    let coll = db.collection::<Document>(&name);
    // another process's batch of three, inserted part-way (its second version not yet)
    let first = draw_elsewhere(&db, &name, 3).await;
    let batch = Some((first, 3));
    coll.insert_one(version("b0", Some(first), batch))
        .await
        .unwrap();
    coll.insert_one(version("b2", Some(first + 2), batch))
        .await
        .unwrap();
    store
        .create(doc_of(json!({"name": "after"})), &WriteContext::SYSTEM)
        .await
        .unwrap();
    assert!(
        drain(&store, Cursor::START).await.is_empty(),
        "no part of an incomplete batch"
    );
    coll.insert_one(version("b1", Some(first + 1), batch))
        .await
        .unwrap();
    let feed = drain(&store, Cursor::START).await;
    assert_eq!(names(&feed), vec!["b0", "b1", "b2", "after"]);
    // a reader resuming inside the batch goes on from there
    assert_eq!(
        names(&drain(&store, feed[0].cursor).await),
        vec!["b1", "b2", "after"]
    );
}

#[tokio::test]
async fn a_batch_that_never_completes_is_skipped_whole_after_the_grace_period() {
    let name = fresh_name();
    let store = store_on(&name, GRACE).await;
    let db = database().await;
    let coll = db.collection::<Document>(&name);
    // another process died after inserting the first of two versions
    let first = draw_elsewhere(&db, &name, 2).await;
    coll.insert_one(version("orphan", Some(first), Some((first, 2))))
        .await
        .unwrap();
    store
        .create(doc_of(json!({"name": "after"})), &WriteContext::SYSTEM)
        .await
        .unwrap();
    let started = Instant::now();
    assert!(drain(&store, Cursor::START).await.is_empty());
    let feed = settled(&store, 1).await;
    assert!(started.elapsed() >= GRACE);
    assert_eq!(names(&feed), vec!["after"]);
}

#[tokio::test]
async fn a_failed_batch_is_undone_and_its_positions_skipped_at_once() {
    let name = fresh_name();
    let store = store_on(&name, Duration::from_secs(30)).await;
    let coll = database().await.collection::<Document>(&name);
    let kept = store
        .create(doc_of(json!({"name": "kept"})), &WriteContext::SYSTEM)
        .await
        .unwrap();
    let batch = vec![
        doc_of(json!({"name": "first"})),
        NewDocument::with_id(kept.id.clone(), doc_of(json!({"name": "kept-v2"})).payload),
        doc_of(json!({"name": "third"})),
        doc_of(json!({"name": "poison", "note": meshql_core::fault::POISON})),
    ];
    assert!(store
        .create_many(batch, &WriteContext::SYSTEM)
        .await
        .is_err());
    let left: Vec<Document> = coll
        .find(doc! {})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(
        left.len(),
        1,
        "the versions inserted before the failure are gone"
    );
    store
        .create(doc_of(json!({"name": "after"})), &WriteContext::SYSTEM)
        .await
        .unwrap();
    // the grace period is 30 s: the void positions are skipped without waiting for it
    let started = Instant::now();
    let feed = drain(&store, Cursor::START).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(names(&feed), vec!["kept", "after"]);
    assert_eq!(
        feed[1].cursor,
        Cursor::seq(6),
        "1 kept, 2-5 the batch, 6 after"
    );
}

#[tokio::test]
async fn versions_older_than_the_feed_are_numbered_at_prepare() {
    let name = fresh_name();
    let coll = database().await.collection::<Document>(&name);
    // what an older meshql wrote: versions without positions
    let mut old = version("old-a", None, None);
    let id = old.get_str("id").unwrap().to_owned();
    coll.insert_one(&old).await.unwrap();
    coll.insert_one(version("old-b", None, None)).await.unwrap();
    let seq = old.get_object_id("seq").unwrap();
    old.insert("_id", ObjectId::new());
    old.insert("payload", doc! {"id": &id, "name": "old-a2"});
    old.insert(
        "created_at",
        DateTime::from_millis(DateTime::now().timestamp_millis() + 5),
    );
    old.insert("seq", seq);
    coll.update_one(doc! {"id": &id}, doc! {"$set": {"latest": false}})
        .await
        .unwrap();
    coll.insert_one(&old).await.unwrap();

    let store = store_on(&name, GRACE).await;
    store
        .create(doc_of(json!({"name": "new"})), &WriteContext::SYSTEM)
        .await
        .unwrap();
    let feed = drain(&store, Cursor::START).await;
    assert_eq!(names(&feed), vec!["old-a", "old-b", "old-a2", "new"]);
    let ops: Vec<ChangeOp> = feed.iter().map(|c| c.op).collect();
    assert_eq!(
        ops,
        vec![
            ChangeOp::Create,
            ChangeOp::Create,
            ChangeOp::Update,
            ChangeOp::Create
        ]
    );
    assert_eq!(feed[3].cursor, Cursor::seq(4));
    // a restart numbers nothing again
    let again = store_on(&name, GRACE).await;
    assert_eq!(drain(&again, Cursor::START).await, feed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_writing_at_once_each_see_every_write_once() {
    const TASKS: usize = 8;
    const EACH: usize = 6;
    let name = fresh_name();
    // two clients, as two processes would have: separate clocks, ledgers and locks
    let one = Arc::new(store_on(&name, Duration::from_secs(5)).await);
    let two = Arc::new(store_on(&name, Duration::from_secs(5)).await);
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        for (c, store) in [one.clone(), two.clone()].into_iter().enumerate() {
            tasks.push(tokio::spawn(async move {
                let tag =
                    |i: usize| WriteContext::SYSTEM.with_correlation_id(format!("{c}-{t}-{i}"));
                let id = store
                    .create(doc_of(json!({"name": format!("{c}-{t}"), "n": 0})), &tag(0))
                    .await
                    .expect("create")
                    .id;
                for i in 1..EACH {
                    store
                        .update(
                            &id,
                            doc_of(json!({"name": format!("{c}-{t}"), "n": i})),
                            &tag(i),
                        )
                        .await
                        .expect("update")
                        .expect("found");
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let total = TASKS * 2 * EACH;
    let started = Instant::now();
    let a = settled(&one, total).await;
    let b = settled(&two, total).await;
    assert_eq!(a.len(), total, "every write, once");
    // single writes drawn twice or behind the counter leave no number unwritten, so no
    // reader has a gap to wait the grace period for
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the feed settled in {:?}",
        started.elapsed()
    );
    assert_eq!(a, b, "both clients read the same feed");
    let tags: BTreeSet<_> = a.iter().filter_map(|c| c.correlation_id.clone()).collect();
    assert_eq!(tags.len(), total);
    for c in 0..2 {
        for t in 0..TASKS {
            let ns: Vec<i64> = a
                .iter()
                .filter(|x| name_of(x) == format!("{c}-{t}"))
                .map(|x| {
                    serde_json::from_str::<serde_json::Value>(&x.payload).unwrap()["n"]
                        .as_i64()
                        .unwrap()
                })
                .collect();
            assert_eq!(
                ns,
                (0..EACH as i64).collect::<Vec<_>>(),
                "in order per document"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_writes_neither_stall_the_feed_nor_leave_it_out_of_step() {
    let name = fresh_name();
    // a long grace period: the feed must not rely on it to get past abandoned positions
    let store = Arc::new(store_on(&name, Duration::from_secs(60)).await);
    let mut batch = false;
    for i in 0..40u64 {
        let s = store.clone();
        batch = !batch;
        let task = tokio::spawn(async move {
            if batch {
                let docs = (0..3)
                    .map(|k| doc_of(json!({"name": format!("c{i}-{k}")})))
                    .collect();
                s.create_many(docs, &WriteContext::SYSTEM).await.map(|_| ())
            } else {
                s.create(
                    doc_of(json!({"name": format!("c{i}")})),
                    &WriteContext::SYSTEM,
                )
                .await
                .map(|_| ())
            }
        });
        tokio::time::sleep(Duration::from_micros(i * 150)).await;
        task.abort();
    }
    store
        .create(doc_of(json!({"name": "after"})), &WriteContext::SYSTEM)
        .await
        .unwrap();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(20);
    let feed = loop {
        let feed = drain(&store, Cursor::START).await;
        if feed.iter().any(|c| name_of(c) == "after") || Instant::now() > deadline {
            break feed;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        feed.iter().any(|c| name_of(c) == "after"),
        "the feed got past every abandoned write: {:?}",
        names(&feed)
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    // once the abandoned writes are undone, the data and the feed agree
    let coll = database().await.collection::<Document>(&name);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stored: BTreeSet<String> = coll
            .find(doc! {})
            .await
            .unwrap()
            .try_collect::<Vec<Document>>()
            .await
            .unwrap()
            .iter()
            .map(|d| d.get_str("id").unwrap().to_owned())
            .collect();
        let fed: BTreeSet<String> = drain(&store, Cursor::START)
            .await
            .iter()
            .map(|c| c.id.clone())
            .collect();
        if stored == fed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "stored {} versions, the feed has {}",
            stored.len(),
            fed.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn cursors_past_the_end_answer_nothing() {
    let store = store_on(&fresh_name(), GRACE).await;
    store
        .create(doc_of(json!({"name": "one"})), &WriteContext::SYSTEM)
        .await
        .unwrap();
    assert_eq!(drain(&store, Cursor::START).await.len(), 1);
    for after in [
        Cursor::seq(u64::MAX),
        Cursor::seq(i64::MAX as u64),
        Cursor(1, 0),
    ] {
        assert!(
            store.changes(after, 10).await.unwrap().is_empty(),
            "{after}"
        );
    }
    assert!(store.changes(Cursor::START, 0).await.unwrap().is_empty());
}
