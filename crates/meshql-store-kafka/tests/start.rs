//! A process starting on topics that others wrote: it reads them to their end before it
//! serves, past the markers Kafka transactions leave (offsets no record is delivered for).

use meshql_core::{BackendContext, DynStore, NewDocument, ReadContext, Storage, WriteContext};
use meshql_store_kafka::KafkaBackend;
use serde_json::json;
use std::time::{Duration, Instant};

async fn open(topic: &str, dir: &std::path::Path) -> DynStore {
    let brokers = meshql_conformance::test_server_url("kafka", "MESHQL_TEST_KAFKA_BROKERS");
    let target = meshql_core::registry::Part::<Storage>::configure(
        &KafkaBackend,
        &json!({"brokers": brokers, "topic": topic, "partitions": 2}),
        &BackendContext {
            block: "start",
            data_dir: dir,
        },
    )
    .unwrap();
    let store = target.open().await.unwrap().store("hen");
    store.prepare(&[]).await.unwrap();
    store
}

fn doc(name: &str) -> NewDocument {
    NewDocument::new(json!({ "name": name }).as_object().unwrap().clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_process_reads_to_the_end_past_transaction_markers_before_it_serves() {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let topic = format!("meshql-s{}-{{entity}}", &run[..12]);
    let first = tempfile::tempdir().unwrap();
    let writer = open(&topic, first.path()).await;
    let ctx = WriteContext::default();
    // single writes, then bulk writes (each a transaction, ending in a commit marker) last
    for n in 0..10 {
        writer
            .create(doc(&format!("single {n}")), &ctx)
            .await
            .unwrap();
    }
    for b in 0..3 {
        let batch = (0..5).map(|n| doc(&format!("bulk {b}.{n}"))).collect();
        writer.create_many(batch, &ctx).await.unwrap();
    }
    let written = writer.list(&ReadContext::LATEST).await.unwrap().len();
    assert_eq!(written, 25);

    // a second process on an empty file: prepare returns once all of it is applied
    let second = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let reader = tokio::time::timeout(Duration::from_secs(30), open(&topic, second.path()))
        .await
        .expect("prepare returned: the markers did not hold the start back");
    assert_eq!(
        reader.list(&ReadContext::LATEST).await.unwrap().len(),
        written,
        "everything written before the start is served at once ({:?})",
        started.elapsed()
    );
    // and it reports nothing behind once the topics are quiet
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let lag = reader.stats().log.expect("a log-backed store");
        if lag.records_behind == 0 && lag.behind_ms == 0 && lag.reachable {
            break;
        }
        assert!(Instant::now() < deadline, "still behind: {lag:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
