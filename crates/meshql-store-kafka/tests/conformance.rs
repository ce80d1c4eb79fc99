//! The shared storage conformance suite against the Kafka backend and the real broker
//! (`scripts/services/kafka.sh`): each test on topics of its own, read back through the local
//! materialisation. One partition per topic: the suite expects the change feed in write order
//! across documents (a bulk's documents in request order), which Kafka keeps within a
//! partition only; with several, each document's versions keep their order and documents on
//! different partitions interleave (tests/processes.rs and the binary's tests run on 2–3).

use meshql_core::{BackendContext, DynStore, Storage};
use meshql_store_kafka::KafkaBackend;
use serde_json::json;

async fn fresh_store() -> DynStore {
    let brokers = meshql_conformance::test_server_url("kafka", "MESHQL_TEST_KAFKA_BROKERS");
    let dir = tempfile::tempdir().expect("temp dir");
    let run = uuid::Uuid::new_v4().simple().to_string();
    let target = meshql_core::registry::Part::<Storage>::configure(
        &KafkaBackend,
        &json!({"brokers": brokers, "topic": format!("meshql-c{}-{{entity}}", &run[..12]),
                    "partitions": 1}),
        &BackendContext {
            block: "conformance",
            data_dir: dir.path(),
        },
    )
    .expect("settings");
    // keep the directory for the life of the test process
    std::mem::forget(dir);
    let store = target.open().await.expect("open").store("thing");
    store
        .prepare(&meshql_conformance::templates())
        .await
        .expect("prepare");
    store
}

meshql_conformance::conformance_tests!(fresh_store());
meshql_conformance::operator_tests!(fresh_store());

/// The documented exception: the output cases of the suite (`output_tests!`) are not run,
/// because a processor's outputs are not written to a Kafka entity (they would need the
/// outputs and the processor's input position in one Kafka transaction). The store says so,
/// and a batch is refused without writing anything: a processor naming a Kafka entity as its
/// output is refused when the server starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processor_outputs_are_refused_and_write_nothing() {
    use meshql_core::{OutputBatch, OutputWrite, ReadContext, StoreError, WriteContext};
    let store = fresh_store().await;
    assert!(!store.supports_outputs());
    let mut batch = OutputBatch::new("projection", 1);
    batch.writes.push(OutputWrite::Put {
        id: "p-1".into(),
        payload: json!({"name": "out"}).to_string(),
    });
    let refused = store
        .apply_output(batch, &WriteContext::default())
        .await
        .expect_err("outputs refused");
    assert!(matches!(refused, StoreError::Invalid(_)), "{refused:?}");
    assert!(store
        .read("p-1", &ReadContext::LATEST)
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        store.output_position("projection").await.ok().flatten(),
        None
    );
}
