//! The source conformance suite: what every processor source must do, run against its real
//! broker or database, as stores have their suite and relays theirs.
//!
//! A source's test calls [`source_conformance`] with the checked source and a way to put
//! `n` messages into its broker, each a change of the suite's documents in meshql's message
//! format (see [`message`]). The suite runs the source into a recording [`Intake`] — the
//! processor's side of the contract — and checks:
//!
//! - every message becomes one input, in order, with its entity, id and operation;
//! - the source commits its own position with each batch (state rows handed to
//!   [`Intake::apply`]), and, started again on what was committed, reads only what came
//!   after it: nothing delivered twice, nothing skipped;
//! - it stops when told to, mid-stream.

use super::contract::{Intake, Source, SourceCounters, SourceRun};
use crate::plan::Item;
use async_trait::async_trait;
use meshql_changes::HandlerError;
use meshql_core::{DeadLetter, StateWrite, StoreError};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the source may take to read what the suite published.
const READING: Duration = Duration::from_secs(60);

/// The suite's `n`-th message, in meshql's format: a change of document `d<n % 5>` of
/// `entity` (a create for the first five, updates after).
pub fn message(entity: &str, n: u64) -> serde_json::Value {
    let id = format!("d{}", n % 5);
    let created_at = 1_700_000_000_000 + n as i64;
    serde_json::json!({
        "change_id": format!("{entity}:{id}:{created_at}"),
        "entity": entity,
        "id": id,
        "created_at": created_at,
        "op": if n < 5 { "create" } else { "update" },
        "authorized_tokens": [],
        "correlation_id": null,
        "payload": {"id": id, "n": n},
    })
}

/// The processor's side, recording what it is given and keeping the committed state.
#[derive(Default)]
struct Recording {
    /// Each input's `n` (from its payload), in the order applied.
    got: Mutex<Vec<u64>>,
    state: Mutex<HashMap<String, String>>,
    position: AtomicU64,
}

#[async_trait]
impl Intake for Recording {
    fn processor(&self) -> &str {
        "conformance"
    }

    fn position(&self) -> u64 {
        self.position.load(Ordering::Acquire)
    }

    async fn ensure_loaded(&self) -> Result<(), HandlerError> {
        Ok(())
    }

    async fn state(&self, keys: &[String]) -> Result<HashMap<String, String>, StoreError> {
        let state = self.state.lock();
        Ok(keys
            .iter()
            .filter_map(|k| state.get(k).map(|v| (k.clone(), v.clone())))
            .collect())
    }

    async fn apply(
        &self,
        items: Vec<Item<'_>>,
        letters: Vec<DeadLetter>,
        last: u64,
        extra: Vec<StateWrite>,
    ) -> Result<(), HandlerError> {
        assert!(
            letters.is_empty(),
            "the suite's messages are all readable: {letters:?}"
        );
        // one transaction: the inputs, the source's positions and the processor's position
        let mut got = self.got.lock();
        for item in &items {
            got.push(
                item.input.payload["n"]
                    .as_u64()
                    .expect("the suite's payload"),
            );
        }
        let mut state = self.state.lock();
        for w in extra {
            match w.value {
                Some(v) => state.insert(w.key, v),
                None => state.remove(&w.key),
            };
        }
        self.position.store(last, Ordering::Release);
        Ok(())
    }
}

/// Runs `source` into `intake` until it has applied `count` inputs, then stops it.
async fn read_until(source: &Arc<dyn Source>, intake: &Arc<Recording>, count: usize) {
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let run = SourceRun {
        name: "conformance".into(),
        inputs: vec!["hen".into()],
        batch: 4,
        intake: intake.clone(),
        counters: Arc::new(SourceCounters::default()),
        stop: stop_rx,
    };
    let task = tokio::spawn(source.clone().run(run));
    let deadline = Instant::now() + READING;
    while intake.got.lock().len() < count {
        assert!(
            Instant::now() < deadline,
            "the source applied {} of {count} inputs in {READING:?}",
            intake.got.lock().len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.send_replace(true);
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("the source stops when told to")
        .expect("the source's task ends cleanly");
}

/// Runs the suite on `source`; `publish(from, to)` puts the suite's messages `from..to` of
/// entity `hen` ([`message`]) into the source's broker, in order.
pub async fn source_conformance<P, F>(source: Arc<dyn Source>, publish: P)
where
    P: Fn(u64, u64) -> F,
    F: Future<Output = ()>,
{
    let intake = Arc::new(Recording::default());
    publish(0, 12).await;
    read_until(&source, &intake, 12).await;
    assert_eq!(
        *intake.got.lock(),
        (0..12).collect::<Vec<_>>(),
        "every message one input, in order"
    );
    assert!(
        !intake.state.lock().is_empty(),
        "the source commits its position with the batches"
    );

    // started again on what was committed: only what came after
    publish(12, 20).await;
    read_until(&source, &intake, 20).await;
    // a moment for a repeat to show, were the source to repeat
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        *intake.got.lock(),
        (0..20).collect::<Vec<_>>(),
        "after a restart nothing is read twice and nothing skipped"
    );
}
