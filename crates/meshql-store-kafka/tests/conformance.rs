//! The shared storage conformance suite against the Kafka backend and the real broker
//! (`scripts/services/kafka.sh`): each test on topics of its own, with three partitions, read
//! back through the local materialisation.

use meshql_core::{BackendContext, DynStore, StorageBackend};
use meshql_store_kafka::KafkaBackend;
use serde_json::json;

async fn fresh_store() -> DynStore {
    let brokers = meshql_conformance::test_server_url("kafka", "MESHQL_TEST_KAFKA_BROKERS");
    let dir = tempfile::tempdir().expect("temp dir");
    let run = uuid::Uuid::new_v4().simple().to_string();
    let target = KafkaBackend
        .configure(
            &json!({"brokers": brokers, "topic": format!("meshql-c{}-{{entity}}", &run[..12]),
                    "partitions": 3}),
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
