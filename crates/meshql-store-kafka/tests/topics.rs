//! The entities' topics against the real broker `scripts/services/kafka.sh` starts: made with
//! the settings that keep every version, checked when they exist, refused by name when an
//! operator turned on compaction or retention.

use meshql_core::BackendContext;
use meshql_store_kafka::settings::{configure, KafkaStorage};
use meshql_store_kafka::topics::{ensure, TopicError};
use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::ClientConfig;
use serde_json::json;
use std::time::Duration;

fn brokers() -> String {
    meshql_conformance::test_server_url("kafka", "MESHQL_TEST_KAFKA_BROKERS")
}

fn storage(extra: serde_json::Value) -> KafkaStorage {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let mut block =
        json!({"brokers": brokers(), "topic": format!("meshql-t{}-{{entity}}", &run[..12])});
    for (k, v) in extra.as_object().unwrap() {
        block[k] = v.clone();
    }
    configure(
        &block,
        &BackendContext {
            block: "events",
            data_dir: std::path::Path::new("/tmp"),
        },
    )
    .unwrap()
}

fn admin(brokers: &str) -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap()
}

async fn config_of(topic: &str) -> std::collections::HashMap<String, String> {
    let options = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
    let described = admin(&brokers())
        .describe_configs(&[ResourceSpecifier::Topic(topic)], &options)
        .await
        .unwrap();
    let resource = described.into_iter().next().unwrap().unwrap();
    resource
        .entries
        .into_iter()
        .filter_map(|e| Some((e.name, e.value?)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_topics_are_made_to_keep_every_version_and_existing_ones_are_checked() {
    let s = storage(json!({"partitions": 2}));
    let entities = vec!["farm".to_owned(), "lay_report".to_owned()];
    let counts = ensure(&s, &entities).await.unwrap();
    assert_eq!(
        counts.into_iter().collect::<Vec<_>>(),
        [(s.topic_of("farm"), 2), (s.topic_of("lay_report"), 2)]
    );
    let made = config_of(&s.topic_of("farm")).await;
    assert_eq!(made["cleanup.policy"], "delete");
    assert_eq!(made["retention.ms"], "-1");
    assert_eq!(made["retention.bytes"], "-1");
    // a second start finds them as they are
    assert_eq!(ensure(&s, &entities).await.unwrap().len(), 2);

    // an operator turns on compaction: refused, naming the topic, the setting and the fix
    let topic = s.topic_of("lay_report");
    let options = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
    let alter = AlterConfig::new(ResourceSpecifier::Topic(&topic))
        .set("cleanup.policy", "compact")
        .set("retention.ms", "-1")
        .set("retention.bytes", "-1");
    admin(&brokers())
        .alter_configs(&[alter], &options)
        .await
        .unwrap()
        .into_iter()
        .for_each(|r| {
            r.unwrap();
        });
    let e = ensure(&s, &entities).await.unwrap_err();
    assert!(
        matches!(&e, TopicError::Loses { topic: t, setting: "cleanup.policy", .. } if *t == topic),
        "{e}"
    );
    assert!(
        e.to_string().contains("--add-config cleanup.policy=delete"),
        "{e}"
    );

    // time retention
    let alter = AlterConfig::new(ResourceSpecifier::Topic(&topic))
        .set("cleanup.policy", "delete")
        .set("retention.ms", "604800000")
        .set("retention.bytes", "-1");
    admin(&brokers())
        .alter_configs(&[alter], &options)
        .await
        .unwrap();
    let e = ensure(&s, &entities).await.unwrap_err();
    assert!(
        matches!(&e, TopicError::Loses { setting: "retention.ms", value, .. } if value == "604800000"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_create_topics_a_missing_topic_is_named() {
    let s = storage(json!({"create_topics": false}));
    let e = ensure(&s, &["farm".to_owned()]).await.unwrap_err();
    assert_eq!(
        e,
        TopicError::Missing {
            topic: s.topic_of("farm")
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brokers_that_cannot_be_reached_are_named() {
    let mut s = storage(json!({}));
    s.brokers = "127.0.0.1:1".into();
    let e = ensure(&s, &["farm".to_owned()]).await.unwrap_err();
    assert!(
        matches!(&e, TopicError::Unreachable { brokers, .. } if brokers == "127.0.0.1:1"),
        "{e}"
    );
}
