//! The materialiser against the real broker: records produced to a topic are applied to the
//! entity's SQLite table in the log's order; a record that is not an envelope is skipped and
//! counted; a restart resumes from the committed positions and applies nothing twice.

use meshql_core::{BackendContext, Envelope, ReadContext, Store, StoreReader};
use meshql_store_kafka::health::{Brokers, Health};
use meshql_store_kafka::materialise::{run, Applied, Reader};
use meshql_store_kafka::record::encode;
use meshql_store_kafka::settings::{configure, KafkaStorage};
use meshql_store_kafka::topics::ensure;
use meshql_store_sqlite::{LogVersion, SqliteDatabase, SqliteOptions, SqliteStore};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

fn storage() -> KafkaStorage {
    let brokers = meshql_conformance::test_server_url("kafka", "MESHQL_TEST_KAFKA_BROKERS");
    let run = uuid::Uuid::new_v4().simple().to_string();
    configure(
        &json!({"brokers": brokers, "topic": format!("meshql-m{}-{{entity}}", &run[..12]), "partitions": 2}),
        &BackendContext {
            block: "events",
            data_dir: std::path::Path::new("/tmp"),
        },
    )
    .unwrap()
}

fn version(id: &str, at: i64, deleted: bool, name: &str) -> Envelope {
    Envelope {
        id: id.into(),
        payload: json!({"id": id, "name": name}).to_string(),
        created_at: at,
        deleted,
        authorized_tokens: vec![],
    }
}

/// Produces `records` (key, value) in order; their (partition, offset)s.
async fn produce(
    s: &KafkaStorage,
    topic: &str,
    records: Vec<(Vec<u8>, Vec<u8>)>,
) -> Vec<(i32, i64)> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &s.brokers)
        .set("enable.idempotence", "true")
        .create()
        .unwrap();
    let mut at = Vec::new();
    for (key, value) in records {
        let delivered = producer
            .send(
                FutureRecord::to(topic).key(&key).payload(&value),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
        at.push((delivered.partition, delivered.offset));
    }
    at
}

/// Waits until `applied` covers every record of `at`.
async fn until_applied(applied: &mut watch::Receiver<Applied>, at: &[(i32, i64)]) -> Applied {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let now = applied.borrow_and_update().clone();
            if at.iter().all(|(p, o)| now.covers(*p, *o)) {
                return now;
            }
            applied.changed().await.unwrap();
        }
    })
    .await
    .expect("applied within 30 s")
}

async fn open(dir: &std::path::Path) -> Arc<SqliteStore> {
    let db = SqliteDatabase::open(&dir.join("m.db"), SqliteOptions::default()).unwrap();
    let store = SqliteStore::new(db, "hen");
    store.prepare(&[]).await.unwrap();
    Arc::new(store)
}

fn name_of(e: &Envelope) -> String {
    serde_json::from_str::<Value>(&e.payload).unwrap()["name"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_is_applied_in_order_skips_what_is_not_a_version_and_resumes() {
    let s = storage();
    let partitions = ensure(&s, &["hen".to_owned()]).await.unwrap()[&s.topic_of("hen")];
    let topic = s.topic_of("hen");
    let dir = tempfile::tempdir().unwrap();

    let mut records: Vec<(Vec<u8>, Vec<u8>)> = vec![
        encode(&LogVersion::from(version("a", 1_000, false, "Greta"))),
        encode(&LogVersion::from(version("b", 1_000, false, "Berta"))),
        encode(&LogVersion::from(version("a", 2_000, false, "Greta II"))),
        (b"x".to_vec(), b"not an envelope".to_vec()),
        encode(&LogVersion::from(version("a", 1_500, false, "Greta III"))),
        encode(&LogVersion::from(version("b", 3_000, true, "Berta"))),
    ];
    let at = produce(&s, &topic, std::mem::take(&mut records)).await;

    let store = open(dir.path()).await;
    let (tx, mut rx) = watch::channel(Applied::default());
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
    let applied = until_applied(&mut rx, &at).await;
    assert_eq!(applied.skipped, 1);
    let a = store
        .read("a", &ReadContext::LATEST)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        name_of(&a),
        "Greta III",
        "the log's last version is the newest"
    );
    assert_eq!(a.created_at, 2_001);
    assert!(store
        .read("b", &ReadContext::LATEST)
        .await
        .unwrap()
        .is_none());
    assert_eq!(store.versions("a").await.unwrap().len(), 3);
    stop.send(true).unwrap();
    task.await.unwrap().unwrap();

    // a restart on the same file resumes from the committed positions: nothing twice
    let store = open(dir.path()).await;
    let (tx, mut rx) = watch::channel(Applied::default());
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
    let more = produce(
        &s,
        &topic,
        vec![encode(&LogVersion::from(version(
            "c", 4_000, false, "Clara",
        )))],
    )
    .await;
    let resumed = until_applied(&mut rx, &more).await;
    assert_eq!(resumed.skipped, 0, "the skipped record is not read again");
    assert_eq!(store.versions("a").await.unwrap().len(), 3);
    assert_eq!(store.versions("b").await.unwrap().len(), 2);
    assert_eq!(
        name_of(
            &store
                .read("c", &ReadContext::LATEST)
                .await
                .unwrap()
                .unwrap()
        ),
        "Clara"
    );
    stop.send(true).unwrap();
    task.await.unwrap().unwrap();
}
