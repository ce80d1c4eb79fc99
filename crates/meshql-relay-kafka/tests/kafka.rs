//! The Kafka sink against a real broker (`scripts/services/kafka.sh`, started if
//! `MESHQL_TEST_KAFKA_BROKERS` is unset).

use meshql_changes::{RelayChange, Sink};
use meshql_relay_kafka::{Format, KafkaSink, KafkaSinkConfig, TopicNaming};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::ClientConfig;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

fn brokers() -> String {
    meshql_conformance::test_server_url("kafka", "MESHQL_TEST_KAFKA_BROKERS")
}

/// A received message: topic, key, headers, value.
#[derive(Debug)]
struct Received {
    topic: String,
    key: String,
    headers: BTreeMap<String, String>,
    value: Value,
    timestamp: Option<i64>,
}

/// Reads `n` messages from the start of `topics` (panics after 60 s).
fn consume(brokers: &str, topics: &[&str], n: usize) -> Vec<Received> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("test-{}", uuid::Uuid::new_v4()))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    consumer.subscribe(topics).expect("subscribe");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut out = Vec::new();
    while out.len() < n {
        assert!(
            Instant::now() < deadline,
            "only {} of {n} messages arrived: {out:?}",
            out.len()
        );
        let Some(m) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = m.expect("a message");
        let mut headers = BTreeMap::new();
        if let Some(h) = m.headers() {
            for header in h.iter() {
                headers.insert(
                    header.key.to_owned(),
                    String::from_utf8(header.value.unwrap_or_default().to_vec()).unwrap(),
                );
            }
        }
        out.push(Received {
            topic: m.topic().to_owned(),
            key: String::from_utf8(m.key().unwrap_or_default().to_vec()).unwrap(),
            headers,
            value: serde_json::from_slice(m.payload().unwrap_or(b"null")).unwrap(),
            timestamp: m.timestamp().to_millis(),
        });
    }
    out
}

fn change(
    position: u64,
    entity: &str,
    id: &str,
    op: &str,
    correlation: Option<&str>,
) -> RelayChange {
    let created_at = 1_700_000_000_000 + position as i64;
    let json = serde_json::json!({
        "position": position,
        "change_id": format!("{entity}:{id}:{created_at}"),
        "entity": entity,
        "id": id,
        "created_at": created_at,
        "op": op,
        "authorized_tokens": [],
        "correlation_id": correlation,
        "source": "0.1",
        "payload": {"name": format!("v{position}"), "id": id},
    });
    RelayChange::parse(position, created_at, serde_json::to_vec(&json).unwrap()).unwrap()
}

fn config(run: &str, naming: TopicNaming, format: Format) -> KafkaSinkConfig {
    KafkaSinkConfig {
        name: format!("test-{run}"),
        brokers: brokers(),
        topic_naming: naming,
        topic_prefix: match naming {
            TopicNaming::Entity => format!("t{run}."),
            TopicNaming::Debezium => format!("events{run}"),
        },
        db: "events_development".into(),
        format,
        tables: HashMap::from([
            ("hen".to_owned(), "hens".to_owned()),
            ("coop".to_owned(), "coop".to_owned()),
        ]),
        options: BTreeMap::new(),
        create_topics: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meshql_format_one_topic_per_entity_key_headers_and_order() {
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let sink = KafkaSink::new(config(&run, TopicNaming::Entity, Format::Meshql)).unwrap();
    let batch = vec![
        change(1, "hen", "h1", "create", Some("req-1")),
        change(2, "coop", "c1", "create", None),
        change(3, "hen", "h1", "update", Some("req-2")),
        change(4, "hen", "h2", "create", None),
        change(5, "hen", "h1", "delete", None),
    ];
    sink.send(&batch).await.expect("delivered");
    sink.close().await;

    let hens = format!("t{run}.hen");
    let coops = format!("t{run}.coop");
    let got = consume(&brokers(), &[&hens, &coops], 5);
    let on_hens: Vec<&Received> = got.iter().filter(|r| r.topic == hens).collect();
    assert_eq!(on_hens.len(), 4);
    let positions: Vec<&str> = on_hens
        .iter()
        .map(|r| r.headers["position"].as_str())
        .collect();
    assert_eq!(
        positions,
        ["1", "3", "4", "5"],
        "a topic keeps the log's order"
    );
    let first = on_hens[0];
    assert_eq!(first.key, "h1");
    assert_eq!(first.headers["change_id"], "hen:h1:1700000000001");
    assert_eq!(first.headers["op"], "create");
    assert_eq!(first.headers["correlation_id"], "req-1");
    assert_eq!(first.timestamp, Some(1_700_000_000_001));
    assert_eq!(first.value["position"], 1);
    assert_eq!(first.value["payload"]["name"], "v1");
    assert_eq!(first.value["change_id"], "hen:h1:1700000000001");
    assert_eq!(on_hens[3].headers["op"], "delete");
    let coop = got.iter().find(|r| r.topic == coops).unwrap();
    assert_eq!(coop.key, "c1");
    assert!(!coop.headers.contains_key("correlation_id"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_format_and_topic_names() {
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let sink = KafkaSink::new(config(&run, TopicNaming::Debezium, Format::Debezium)).unwrap();
    let batch = vec![
        change(10, "hen", "h1", "create", None),
        change(11, "hen", "h1", "update", None),
        change(12, "hen", "h1", "delete", None),
    ];
    sink.send(&batch).await.expect("delivered");
    sink.close().await;

    let topic = format!("events{run}.events_development.hens");
    let got = consume(&brokers(), &[&topic], 3);
    let ops: Vec<&str> = got
        .iter()
        .map(|r| r.value["op"].as_str().unwrap())
        .collect();
    assert_eq!(ops, ["c", "u", "d"]);
    for r in &got {
        assert_eq!(r.key, "h1");
        assert_eq!(r.value["source"]["connector"], "meshql");
        assert_eq!(r.value["source"]["name"], format!("events{run}"));
        assert_eq!(r.value["source"]["db"], "events_development");
        assert_eq!(r.value["source"]["collection"], "hens");
    }
    // what MeshQL's CDC processors do: parse `after` (a JSON string), read `.payload`
    let after: Value = serde_json::from_str(got[0].value["after"].as_str().unwrap()).unwrap();
    assert_eq!(after["id"], "h1");
    assert_eq!(after["payload"]["name"], "v10");
    assert!(got[2].value["after"].is_null());
    let before: Value = serde_json::from_str(got[2].value["before"].as_str().unwrap()).unwrap();
    assert_eq!(before["payload"]["name"], "v12");
    assert_eq!(got[2].headers["change_id"], "hen:h1:1700000000012");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_broker_fails_the_batch() {
    let mut config = config("down", TopicNaming::Entity, Format::Meshql);
    // nothing listens there
    config.brokers = "127.0.0.1:1".into();
    config
        .options
        .insert("message.timeout.ms".into(), "1500".into());
    let sink = KafkaSink::new(config).unwrap();
    let e = sink
        .send(&[change(1, "hen", "h1", "create", None)])
        .await
        .expect_err("nothing can be delivered");
    assert!(e.to_string().contains("Kafka"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_an_unreachable_broker_creating_topics_gives_up_and_readying_returns() {
    let mut config = config("down", TopicNaming::Entity, Format::Meshql);
    config.brokers = "127.0.0.1:1".into();
    config.create_topics = true;
    let sink = KafkaSink::new(config).unwrap();
    // the admin request times out: nothing is created, nothing panics
    assert!(sink.create_topics().await.is_empty());
    // creation and the first metadata request fail, and readying ends there
    sink.prepare().await;
}

/// The partitions of `topic` the broker reports (0 when it does not know the topic).
fn partitions(brokers: &str, topic: &str) -> usize {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("allow.auto.create.topics", "false")
        .create()
        .expect("consumer");
    let md = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    md.topics()
        .iter()
        .filter(|t| t.name() == topic && t.error().is_none())
        .map(|t| t.partitions().len())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_entities_topics_are_created_before_the_first_change() {
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let mut cfg = config(&run, TopicNaming::Debezium, Format::Debezium);
    cfg.create_topics = true;
    let sink = KafkaSink::new(cfg).unwrap();
    let hens = format!("events{run}.events_development.hens");
    let coops = format!("events{run}.events_development.coop");
    assert_eq!(partitions(&brokers(), &hens), 0, "a fresh run's topic");
    let mut created = sink.create_topics().await;
    created.sort();
    assert_eq!(created, vec![coops.clone(), hens.clone()]);
    assert!(partitions(&brokers(), &hens) >= 1);
    assert!(partitions(&brokers(), &coops) >= 1);
    // again: both exist, nothing created, no error
    assert!(sink.create_topics().await.is_empty());
    // and the first change goes to the existing topic
    sink.send(&[change(1, "hen", "h1", "create", None)])
        .await
        .expect("delivered");
    sink.close().await;
    let got = consume(&brokers(), &[&hens], 1);
    assert_eq!(got[0].key, "h1");
}
