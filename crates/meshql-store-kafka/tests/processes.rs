//! The conformance suite's concurrency cases across processes: two stores on the same topics,
//! each with a materialisation file of its own (as two meshql processes have), written at
//! once; both end with every acknowledged write, the same versions in the same order, and
//! one latest version per document.

use meshql_core::{BackendContext, DynStore, NewDocument, ReadContext, Storage, WriteContext};
use meshql_store_kafka::KafkaBackend;
use serde_json::json;
use std::time::{Duration, Instant};

async fn open(topic: &str, dir: &std::path::Path) -> DynStore {
    let brokers = meshql_conformance::test_server_url("kafka", "MESHQL_TEST_KAFKA_BROKERS");
    let target = meshql_core::registry::Part::<Storage>::configure(
        &KafkaBackend,
        &json!({"brokers": brokers, "topic": topic, "partitions": 3}),
        &BackendContext {
            block: "processes",
            data_dir: dir,
        },
    )
    .unwrap();
    let store = target.open().await.unwrap().store("thing");
    store
        .prepare(&meshql_conformance::templates())
        .await
        .unwrap();
    store
}

fn doc(name: &str) -> NewDocument {
    NewDocument::new(json!({ "name": name }).as_object().unwrap().clone())
}

/// Two stores ("processes") on fresh topics.
async fn two() -> (DynStore, DynStore, tempfile::TempDir, tempfile::TempDir) {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let topic = format!("meshql-x{}-{{entity}}", &run[..12]);
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = open(&topic, da.path()).await;
    let b = open(&topic, db.path()).await;
    (a, b, da, db)
}

/// Waits until `check` holds (panics after 20 s, naming `what`).
async fn until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check().await {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_from_two_processes_all_land_on_both() {
    let (a, b, _da, _db) = two().await;
    let mut tasks = Vec::new();
    for (side, store) in [("a", a.clone()), ("b", b.clone())] {
        for w in 0..10 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let mut ids = Vec::new();
                for n in 0..20 {
                    let env = store
                        .create(doc(&format!("{side}{w}.{n}")), &WriteContext::default())
                        .await
                        .expect("create");
                    ids.push(env.id);
                }
                ids
            }));
        }
    }
    let mut ids = std::collections::BTreeSet::new();
    for t in tasks {
        ids.extend(t.await.unwrap());
    }
    assert_eq!(ids.len(), 400);
    for store in [&a, &b] {
        until("both processes have every acknowledged write", || async {
            let listed: std::collections::BTreeSet<String> = store
                .list(&ReadContext::LATEST)
                .await
                .unwrap()
                .into_iter()
                .map(|e| e.id)
                .collect();
            listed == ids
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_updates_of_one_id_from_two_processes_keep_one_latest_on_both() {
    let (a, b, _da, _db) = two().await;
    let id = a
        .create(doc("start"), &WriteContext::default())
        .await
        .unwrap()
        .id;
    until("b has the document", || async {
        b.read(&id, &ReadContext::LATEST).await.unwrap().is_some()
    })
    .await;
    let mut tasks = Vec::new();
    for (side, store) in [("a", a.clone()), ("b", b.clone())] {
        for w in 0..10 {
            let (store, id) = (store.clone(), id.clone());
            tasks.push(tokio::spawn(async move {
                for n in 0..5 {
                    store
                        .update(
                            &id,
                            doc(&format!("{side}{w}.{n}")),
                            &WriteContext::default(),
                        )
                        .await
                        .expect("update")
                        .expect("the document is there");
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    // 1 create + 100 updates, each once, in the same order and with the same times on both
    until("both processes have every version", || async {
        a.versions(&id).await.unwrap().len() == 101 && b.versions(&id).await.unwrap().len() == 101
    })
    .await;
    let (va, vb) = (
        a.versions(&id).await.unwrap(),
        b.versions(&id).await.unwrap(),
    );
    assert_eq!(va, vb, "the same history on both");
    assert!(
        va.windows(2).all(|w| w[0].created_at < w[1].created_at),
        "every version has a time of its own"
    );
    let latest = va.last().unwrap();
    for store in [&a, &b] {
        let read = store
            .read(&id, &ReadContext::LATEST)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            read.payload, latest.payload,
            "one latest version, the last in the log"
        );
        assert_eq!(
            store.list(&ReadContext::LATEST).await.unwrap().len(),
            1,
            "one document, listed once"
        );
    }
}
