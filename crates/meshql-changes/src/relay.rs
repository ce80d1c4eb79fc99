//! Relays: the change log copied to an external broker (Kafka, NATS JetStream, ...), at
//! least once.
//!
//! A [`Relay`] is a [`Consumer`] of the log whose consumer group is `relay-<name>`
//! ([`relay_group`]) and whose handler is the broker's client, its [`Sink`]. The consumer
//! loop (batches in flight, confirmations awaited oldest first, commits, backoff, drain on
//! stop) is described in [`crate::consumer`]: the sink's confirmation of a batch is the
//! broker's acknowledgement that it durably accepted every change of it, so a change is
//! delivered *at least once*, and its `change_id`, the same on every delivery, lets a
//! consumer of the broker be exactly once by de-duplicating on it.
//!
//! A relay never touches the write path: a broker that is down only makes its relay fall
//! behind (its lag is in [`RelayStats`]) until it is back.
//!
//! The names here are the consumer's under their relay names: [`Sink`] is
//! [`Handler`](crate::consumer::Handler), [`RelayChange`] is
//! [`Change`](crate::consumer::Change), [`RelayOptions`] is
//! [`ConsumerOptions`](crate::consumer::ConsumerOptions) and so on.

use crate::consumer::Consumer;
use meshql_log::Log;
use std::sync::Arc;

pub use crate::consumer::{
    confirmed, Change as RelayChange, Confirmation, ConsumerError as RelayError,
    ConsumerOptions as RelayOptions, ConsumerStats as RelayStats, Handler as Sink,
    HandlerError as SinkError,
};

/// The consumer group of relay `name` in the log.
pub fn relay_group(name: &str) -> String {
    format!("relay-{name}")
}

/// A running relay: the consumer of group `relay-<name>` handing changes to a [`Sink`].
pub struct Relay {
    consumer: Consumer,
}

impl Relay {
    /// Starts relaying the changes after the group's committed position to `sink`.
    pub fn start(
        name: &str,
        log: Log,
        sink: Arc<dyn Sink>,
        options: RelayOptions,
    ) -> Result<Relay, RelayError> {
        let consumer = Consumer::start(name, &relay_group(name), log, sink, options)?;
        Ok(Relay { consumer })
    }

    pub fn name(&self) -> &str {
        self.consumer.name()
    }

    /// The relay's consumer (its group, its handler's kind).
    pub fn consumer(&self) -> &Consumer {
        &self.consumer
    }

    pub fn stats(&self) -> RelayStats {
        self.consumer.stats()
    }

    /// Sends what the log holds (for at most the drain timeout; what is left is sent after
    /// the next start), closes the sink and returns. Idempotent.
    pub async fn stop(&self) {
        self.consumer.stop().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use meshql_log::LogOptions;
    use parking_lot::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    /// Records the positions it receives.
    #[derive(Default)]
    struct Recording {
        got: Mutex<Vec<u64>>,
        closed: AtomicBool,
    }

    #[async_trait]
    impl Sink for Recording {
        fn kind(&self) -> &'static str {
            "test"
        }
        async fn enqueue(&self, batch: &[RelayChange]) -> Result<Confirmation, SinkError> {
            self.got.lock().extend(batch.iter().map(|c| c.position));
            Ok(confirmed())
        }
        async fn close(&self) {
            self.closed.store(true, Ordering::SeqCst);
        }
    }

    fn append(log: &Log, from: usize, to: usize) {
        let records: Vec<Vec<u8>> = (from..to)
            .map(|i| {
                format!(
                    r#"{{"change_id":"hen:h{i}:{i}","entity":"hen","id":"h{i}","created_at":{i},"op":"create","authorized_tokens":[],"correlation_id":null,"source":"0.{i}","payload":{{"id":"h{i}"}}}}"#
                )
                .into_bytes()
            })
            .collect();
        let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
        log.append(&refs).unwrap();
    }

    async fn until(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn a_relay_is_the_consumer_of_its_group() {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), LogOptions::default()).unwrap();
        append(&log, 0, 12);
        let sink = Arc::new(Recording::default());
        let options = RelayOptions {
            batch: 5,
            ..RelayOptions::default()
        };
        let relay = Relay::start("r1", log.clone(), sink.clone(), options.clone()).unwrap();
        assert_eq!(relay.name(), "r1");
        assert_eq!(relay.consumer().group(), "relay-r1");
        until("the commit", || relay.stats().committed == 12).await;
        let stats = relay.stats();
        assert_eq!((stats.kind, stats.delivered, stats.lag), ("test", 12, 0));
        relay.stop().await;
        assert!(sink.closed.load(Ordering::SeqCst));
        assert_eq!(log.committed("relay-r1").unwrap(), Some(12));
        assert_eq!(*sink.got.lock(), (1..=12).collect::<Vec<u64>>());

        // a relay of the same name resumes after its group's position
        append(&log, 12, 14);
        let again = Arc::new(Recording::default());
        let relay = Relay::start("r1", log.clone(), again.clone(), options).unwrap();
        until("the rest", || again.got.lock().len() == 2).await;
        relay.stop().await;
        assert_eq!(*again.got.lock(), vec![13, 14]);
    }
}
