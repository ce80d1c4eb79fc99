//! The NATS sink against a real JetStream server (`scripts/services/nats.sh`, started if
//! `MESHQL_TEST_NATS_URL` is unset).

use meshql_changes::{RelayChange, Sink};
use meshql_relay_nats::{NatsSink, NatsSinkConfig};
use serde_json::Value;
use std::time::Duration;

fn url() -> String {
    meshql_conformance::test_server_url("nats", "MESHQL_TEST_NATS_URL")
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

/// Every message of `stream`: (subject, headers, body).
async fn stored(url: &str, stream: &str) -> Vec<(String, async_nats::HeaderMap, Value)> {
    let client = async_nats::connect(url).await.expect("connect");
    let js = async_nats::jetstream::new(client);
    let mut s = js
        .get_stream(stream)
        .await
        .expect("the relay created the stream");
    let last = s.info().await.unwrap().state.last_sequence;
    let mut out = Vec::new();
    for seq in 1..=last {
        let m = s.get_raw_message(seq).await.expect("message");
        out.push((
            m.subject.to_string(),
            m.headers,
            serde_json::from_slice(&m.payload).unwrap(),
        ));
    }
    out
}

fn header(h: &async_nats::HeaderMap, name: &str) -> Option<String> {
    h.get(name).map(|v| v.as_str().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_are_published_in_order_with_headers_and_deduplicated() {
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let mut config = NatsSinkConfig::new(&format!("t{run}"), &url());
    config.subject_prefix = format!("t{run}.changes");
    config.stream = format!("T{run}");
    let sink = NatsSink::connect(config).await.unwrap();
    let batch = vec![
        change(1, "hen", "h1", "create", Some("req-1")),
        change(2, "coop", "c1", "create", None),
        change(3, "hen", "h1", "delete", None),
    ];
    sink.send(&batch).await.expect("acknowledged");
    // a redelivery (as after a crash before the commit) is dropped by JetStream
    sink.send(&batch).await.expect("acknowledged again");
    sink.close().await;

    let got = stored(&url(), &format!("T{run}")).await;
    assert_eq!(got.len(), 3, "one message per change: {got:?}");
    let subjects: Vec<&str> = got.iter().map(|g| g.0.as_str()).collect();
    assert_eq!(
        subjects,
        [
            format!("t{run}.changes.hen"),
            format!("t{run}.changes.coop"),
            format!("t{run}.changes.hen")
        ]
    );
    let (_, headers, body) = &got[0];
    assert_eq!(
        headers
            .get(async_nats::header::NATS_MESSAGE_ID)
            .map(|v| v.as_str()),
        Some("hen:h1:1700000000001")
    );
    assert_eq!(
        header(headers, "change_id").as_deref(),
        Some("hen:h1:1700000000001")
    );
    assert_eq!(header(headers, "op").as_deref(), Some("create"));
    assert_eq!(header(headers, "position").as_deref(), Some("1"));
    assert_eq!(header(headers, "correlation_id").as_deref(), Some("req-1"));
    assert_eq!(body["payload"]["name"], "v1");
    assert_eq!(body["position"], 1);
    assert_eq!(header(&got[1].1, "correlation_id"), None);
    assert_eq!(header(&got[2].1, "op").as_deref(), Some("delete"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_fails_the_batch_without_blocking() {
    let mut config = NatsSinkConfig::new("down", "nats://127.0.0.1:1");
    config.ack_timeout = Duration::from_millis(500);
    let sink = NatsSink::connect(config)
        .await
        .expect("connects in the background");
    let started = std::time::Instant::now();
    let e = sink
        .send(&[change(1, "hen", "h1", "create", None)])
        .await
        .expect_err("nothing can be published");
    assert!(started.elapsed() < Duration::from_secs(20), "{e}");
    let e = NatsSink::connect(NatsSinkConfig::new("bad", "not a url:x:y"))
        .await
        .err()
        .expect("an invalid URL is an error");
    assert!(e.to_string().contains("not a url"), "{e}");
}

/// The NATS relay passes the relay conformance suite against the real server, reading back
/// the stream it published to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nats_relay_passes_the_relay_suite() {
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let registry = meshql_changes::RelayRegistry::new().register(meshql_relay_nats::NatsBackend);
    let stream = format!("C{run}");
    let settings = serde_json::json!({
        "url": url(),
        "subject_prefix": format!("c{run}.changes"),
        "stream": stream,
    });
    meshql_conformance::relay_conformance(&registry, "nats", &format!("c{run}"), settings, || {
        let stream = stream.clone();
        async move {
            stored(&url(), &stream)
                .await
                .into_iter()
                .map(|(_, _, body)| body["change_id"].as_str().expect("a change id").to_owned())
                .collect()
        }
    })
    .await;
}
