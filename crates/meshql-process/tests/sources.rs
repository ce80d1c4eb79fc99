//! The processor sources pass the source conformance suite against their real brokers
//! (`scripts/services/nats.sh`, started if `MESHQL_TEST_NATS_URL` is unset).

use meshql_process::source::conformance::{message, source_conformance};
use std::sync::Arc;

fn nats() -> String {
    meshql_conformance::test_server_url("nats", "MESHQL_TEST_NATS_URL")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nats_source_passes_the_source_suite() {
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let stream = format!("S{run}");
    let subject = format!("s{run}.hen");
    // the stream the source reads, made as a relay would make it
    let client = async_nats::connect(nats()).await.expect("NATS answers");
    let js = async_nats::jetstream::new(client);
    js.create_stream(async_nats::jetstream::stream::Config {
        name: stream.clone(),
        subjects: vec![format!("s{run}.>")],
        ..Default::default()
    })
    .await
    .expect("the stream is made");
    let source = meshql_process::source::compile(&serde_json::json!({
        "type": "nats",
        "url": nats(),
        "stream": stream,
        "format": "meshql",
        "entities": {subject.clone(): "hen"},
    }))
    .expect("the block checks");
    let publish = |from: u64, to: u64| {
        let js = js.clone();
        let subject = subject.clone();
        async move {
            for n in from..to {
                let body = serde_json::to_vec(&message("hen", n)).unwrap();
                js.publish(subject.clone(), body.into())
                    .await
                    .expect("published")
                    .await
                    .expect("stored");
            }
        }
    };
    source_conformance(Arc::clone(&source), publish).await;
    let _ = js.delete_stream(&stream).await;
}

fn kafka() -> String {
    meshql_conformance::test_server_url("kafka", "MESHQL_TEST_KAFKA_BROKERS")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kafka_source_passes_the_source_suite() {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let topic = format!("meshql-source-suite-{run}");
    let mut config = rdkafka::ClientConfig::new();
    config.set("bootstrap.servers", kafka());
    // one partition: the suite checks the order of every message
    let admin: AdminClient<_> = config.create().expect("an admin client");
    admin
        .create_topics(
            &[NewTopic::new(&topic, 1, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await
        .expect("the topic is made");
    let producer: FutureProducer = config.create().expect("a producer");
    let source = meshql_process::source::compile(&serde_json::json!({
        "type": "kafka",
        "brokers": kafka(),
        "topics": [topic],
        "format": "meshql",
        "entities": {topic.clone(): "hen"},
    }))
    .expect("the block checks");
    let publish = |from: u64, to: u64| {
        let producer = producer.clone();
        let topic = topic.clone();
        async move {
            for n in from..to {
                let body = serde_json::to_vec(&message("hen", n)).unwrap();
                producer
                    .send(
                        FutureRecord::<(), _>::to(&topic).payload(&body),
                        std::time::Duration::from_secs(10),
                    )
                    .await
                    .expect("the broker stored it");
            }
        }
    };
    source_conformance(Arc::clone(&source), publish).await;
    let _ = admin.delete_topics(&[&topic], &AdminOptions::new()).await;
}
