//! The relay conformance suite: what every relay (`[[changes.relay]]` kind) must do, run
//! against its real destination, as the store suite is run against every backend.
//!
//! A relay crate's test calls [`relay_conformance`] with its registered component, the
//! entry's settings and a way to read back what the destination holds (the change ids, in
//! the order the destination keeps them). The suite relays a log of creates, updates and
//! deletes of two entities, stops, appends more, starts again, and checks:
//!
//! - every change is delivered (at least once), and once its batch is confirmed the
//!   relay's committed position covers it;
//! - each document's changes arrive in the log's order;
//! - after a clean stop nothing committed is sent again, and the changes appended while it
//!   was stopped are sent after the restart;
//! - the registry builds the relay from settings alone (nothing connects before `sink()`).

use meshql_changes::{Relay, RelayContext, RelayEntity, RelayOptions, RelayRegistry};
use meshql_log::{Log, LogOptions};
use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant};

/// How long the relay may take to deliver what the suite appended.
const DELIVERY: Duration = Duration::from_secs(60);

/// The entities the suite's changes are of.
pub const RELAY_ENTITIES: &[RelayEntity<'static>] = &[
    RelayEntity {
        name: "hen",
        table: "hen",
    },
    RelayEntity {
        name: "coop",
        table: "coops",
    },
];

/// A published change as the log holds it.
fn change(n: u64, entity: &str, id: &str, op: &str) -> Vec<u8> {
    let created_at = 1_700_000_000_000 + n as i64;
    serde_json::to_vec(&serde_json::json!({
        "change_id": format!("{entity}:{id}:{created_at}"),
        "entity": entity,
        "id": id,
        "created_at": created_at,
        "op": op,
        "authorized_tokens": [],
        "correlation_id": null,
        "source": "0.1",
        "payload": {"id": id, "n": n},
    }))
    .expect("JSON serialises")
}

/// Appends changes `from..to`: per document, a create, updates, and a delete of every
/// fifth document at its last change.
fn append(log: &Log, from: u64, to: u64) -> Vec<String> {
    let mut ids = Vec::new();
    let records: Vec<Vec<u8>> = (from..to)
        .map(|n| {
            let entity = if n % 3 == 0 { "coop" } else { "hen" };
            let doc = format!("{entity}{}", n % 7);
            let op = match n {
                n if n < 7 => "create",
                n if n % 5 == 0 => "delete",
                _ => "update",
            };
            let created_at = 1_700_000_000_000 + n as i64;
            ids.push(format!("{entity}:{doc}:{created_at}"));
            change(n, entity, &doc, op)
        })
        .collect();
    let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
    log.append(&refs).expect("the log appends");
    ids
}

async fn until_committed(relay: &Relay, last: u64) {
    let deadline = Instant::now() + DELIVERY;
    loop {
        let stats = relay.stats();
        if stats.committed >= last {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the relay committed {} of {last} in {DELIVERY:?} ({} errors)",
            stats.committed,
            stats.errors
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Runs the suite on the relay `kind` of `registry` with the entry's `settings`;
/// `read_back` returns the change ids the destination holds, in its order.
pub async fn relay_conformance<F, Fut>(
    registry: &RelayRegistry,
    kind: &str,
    name: &str,
    settings: serde_json::Value,
    read_back: F,
) where
    F: Fn() -> Fut,
    Fut: Future<Output = Vec<String>>,
{
    let dir = tempfile_dir();
    let log = Log::open(&dir, LogOptions::default()).expect("the log opens");
    let context = RelayContext {
        name,
        entities: RELAY_ENTITIES,
        data_dir: &dir,
    };
    let target = registry
        .configure(kind, &settings, &context)
        .unwrap_or_else(|e| panic!("the {kind} relay refuses the suite's settings: {e}"));
    let options = RelayOptions {
        batch: 7,
        ..RelayOptions::default()
    };

    // a first run: everything delivered, the position committed
    let mut sent = append(&log, 0, 30);
    let sink = target.sink().await.expect("the sink builds");
    let relay = Relay::start(name, log.clone(), sink, options.clone()).expect("the relay starts");
    until_committed(&relay, log.last_offset()).await;
    relay.stop().await;
    let first = read_back().await;
    assert_delivered(&sent, &first, "the first run");

    // appended while stopped: sent after the restart, and nothing committed is sent again
    sent.extend(append(&log, 30, 45));
    let sink = target.sink().await.expect("the sink builds again");
    let relay = Relay::start(name, log.clone(), sink, options).expect("the relay restarts");
    until_committed(&relay, log.last_offset()).await;
    relay.stop().await;
    let second = read_back().await;
    assert_delivered(&sent, &second, "after the restart");
    assert_eq!(
        second.len() - first.len(),
        15,
        "after a clean stop the restart sends only what was appended since"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every sent id is held, none more than once, and each document's in the log's order.
fn assert_delivered(sent: &[String], held: &[String], when: &str) {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for id in held {
        *counts.entry(id.as_str()).or_default() += 1;
    }
    for id in sent {
        assert_eq!(
            counts.get(id.as_str()),
            Some(&1),
            "{when}: change {id} should be held once"
        );
    }
    assert_eq!(
        held.len(),
        sent.len(),
        "{when}: only the sent changes are held"
    );
    // per document, the order of the log
    let doc = |id: &str| {
        id.rsplit_once(':')
            .map(|(d, _)| d.to_owned())
            .unwrap_or_default()
    };
    let mut last: HashMap<String, usize> = HashMap::new();
    for id in held {
        let i = sent.iter().position(|s| s == id).expect("sent");
        if let Some(prev) = last.insert(doc(id), i) {
            assert!(
                prev < i,
                "{when}: {id} arrived before an earlier change of its document"
            );
        }
    }
}

/// A fresh directory for the suite's log.
fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "meshql-relay-conformance-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
    ));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    dir
}
