//! Writes against the real broker: acknowledged once applied here, so the writer's next read
//! sees them; a batch is one transaction; an unreachable broker fails the write as unavailable
//! within the write timeout.

use meshql_core::{BackendContext, Envelope, ReadContext, Store, StoreError, StoreReader};
use meshql_store_kafka::health::{Brokers, Health};
use meshql_store_kafka::materialise::{run, Applied, Reader};
use meshql_store_kafka::produce::{producer, Writer};
use meshql_store_kafka::settings::{configure, KafkaStorage};
use meshql_store_kafka::topics::ensure;
use meshql_store_sqlite::{LogVersion, SqliteDatabase, SqliteOptions, SqliteStore};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

fn storage(brokers: &str, timeout_ms: u64) -> KafkaStorage {
    let run = uuid::Uuid::new_v4().simple().to_string();
    configure(
        &json!({"brokers": brokers, "topic": format!("meshql-p{}-{{entity}}", &run[..12]),
                "partitions": 3, "write_timeout_ms": timeout_ms}),
        &BackendContext {
            block: "events",
            data_dir: std::path::Path::new("/tmp"),
        },
    )
    .unwrap()
}

fn version(id: &str, name: &str) -> Envelope {
    Envelope {
        id: id.into(),
        payload: json!({"id": id, "name": name}).to_string(),
        created_at: meshql_core::now_millis(),
        deleted: false,
        authorized_tokens: vec!["alice".into()],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_is_readable_here_as_soon_as_it_is_acknowledged() {
    let brokers = meshql_conformance::test_server_url("kafka", "MESHQL_TEST_KAFKA_BROKERS");
    let s = storage(&brokers, 10_000);
    let topic = s.topic_of("hen");
    let partitions = ensure(&s, &["hen".to_owned()]).await.unwrap()[&topic];
    let dir = tempfile::tempdir().unwrap();
    let db = SqliteDatabase::open(&dir.path().join("m.db"), SqliteOptions::default()).unwrap();
    let store = SqliteStore::new(db, "hen");
    store.prepare(&[]).await.unwrap();
    let store = Arc::new(store);
    let (tx, rx) = watch::channel(Applied::default());
    let (stop, stopped) = watch::channel(false);
    let task = {
        let (s, topic, store) = (s.clone(), topic.clone(), store.clone());
        tokio::spawn(async move {
            run(
                &Reader::new(&s, Brokers::new()).unwrap(),
                &topic,
                partitions,
                store,
                tx,
                Health::new(&topic, Brokers::new()),
                stopped,
            )
            .await
        })
    };
    let writer = Writer::new(
        &s,
        &producer(&s).unwrap(),
        &topic,
        &format!("meshql-test-{topic}"),
        rx,
        Brokers::new(),
    );

    // each single write is readable at once, 50 in a row
    for n in 0..50 {
        let id = format!("h{n}");
        writer.write(&version(&id, "Greta").into()).await.unwrap();
        let read = store.read(&id, &ReadContext::LATEST).await.unwrap();
        assert!(read.is_some(), "{id} read right after its write");
    }
    // a batch: one transaction, every version readable once it returns
    let batch: Vec<LogVersion> = (0..20)
        .map(|n| version(&format!("b{n}"), "Berta").into())
        .collect();
    writer.write_all(&batch).await.unwrap();
    for v in &batch {
        let read = store
            .read(&v.envelope.id, &ReadContext::LATEST)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(read.authorized_tokens, ["alice"]);
    }
    // a second batch on the same transactional producer
    writer
        .write_all(&[
            version("b0", "Berta II").into(),
            version("c", "Clara").into(),
        ])
        .await
        .unwrap();
    assert!(store
        .read("b0", &ReadContext::LATEST)
        .await
        .unwrap()
        .unwrap()
        .payload
        .contains("Berta II"));
    stop.send(true).unwrap();
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_broker_unreachable_a_write_fails_within_its_timeout() {
    let s = storage("127.0.0.1:1", 2_000);
    let (_tx, rx) = watch::channel(Applied::default());
    let writer = Writer::new(
        &s,
        &producer(&s).unwrap(),
        &s.topic_of("hen"),
        "meshql-test-unreachable",
        rx,
        Brokers::new(),
    );
    let started = Instant::now();
    let e = writer.write(&version("a", "x").into()).await.unwrap_err();
    assert!(matches!(e, StoreError::Unavailable(_)), "{e:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}
