//! A NATS JetStream stream as a processor's input (`source = { type = "nats", … }`): for
//! instance the stream another meshql's NATS relay fills with its change feed.
//!
//! ```toml
//! [[processor]]
//! name = "events-processor"
//! type = "rust"
//! function = "events.enrich"
//! inputs = ["event"]
//! output = "processedevent"
//! source = { type = "nats", url = "nats://127.0.0.1:4222", stream = "MESHQL_CHANGES", subjects = ["meshql.changes.event"] }
//! ```
//!
//! Settings: `url` (several servers separated by commas), `stream` (it must exist: the
//! processor waits for it), `subjects` (optional: only messages on these subjects, `*` and
//! `>` wildcards allowed; default every message of the stream), `format` (`meshql`, the
//! default: the change as a meshql NATS relay publishes it; or `debezium`, see
//! [`crate::envelope`]) and `entities = { "<subject>" = "<entity>" }` (else the envelope's
//! entity, else the subject's last token).
//!
//! **Exactly once.** The stream sequence to read next is a state row of the processor
//! (`nats/<stream>`), committed with the batch's outputs in one transaction. At start — and
//! after any failure — the processor creates an ephemeral pull consumer (no acknowledgements)
//! delivering from that sequence (from the start of the stream when there is none), so a
//! restart after `kill -9` reads on exactly where the outputs stopped; JetStream's own
//! acknowledgements play no part. A message the consumer skips (a gap in its delivery
//! sequence) makes the processor start again from the committed sequence. A server that is
//! down or a stream that does not exist yet is retried with backoff (100 ms doubling up to
//! 12.8 s) and counted in the processor's `errors`; the service meanwhile serves as usual.
//!
//! A committed sequence past the stream's end means the stream was replaced: the processor
//! warns and reads the new stream from its start. A stream whose first message is past the
//! committed sequence lost messages to its limits: the processor warns and goes on.

use crate::plan::Item;
use crate::source::contract::{Intake, SourceKind, SourceRun, SourceType};
use crate::source::envelope::{self, Format, Origin};
use async_nats::jetstream::{self, consumer};
use futures::StreamExt as _;
use meshql_core::{SettingError, StateWrite};
use schemars::JsonSchema;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

fn meshql() -> Format {
    Format::Meshql
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    url: String,
    stream: String,
    #[serde(default)]
    subjects: Vec<String>,
    #[serde(default = "meshql")]
    format: Format,
    #[serde(default)]
    entities: BTreeMap<String, String>,
}

/// A checked NATS source.
#[derive(Debug, Clone, PartialEq)]
pub struct NatsSource {
    /// Server URL(s), comma-separated.
    pub url: String,
    pub stream: String,
    /// Subject filters (empty: the whole stream).
    pub subjects: Vec<String>,
    pub format: Format,
    /// Subject → entity.
    pub entities: BTreeMap<String, String>,
}

/// A subject filter: `.`-separated tokens, `*` a whole token, `>` a whole last token.
fn filter_ok(s: &str) -> bool {
    let tokens: Vec<&str> = s.split('.').collect();
    tokens.iter().enumerate().all(|(i, t)| {
        !t.is_empty()
            && t.chars().all(|c| !c.is_whitespace() && !c.is_control())
            && (!t.contains('*') || *t == "*")
            && (!t.contains('>') || (*t == ">" && i == tokens.len() - 1))
    })
}

fn stream_name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.chars().all(|c| {
            !c.is_whitespace() && !c.is_control() && !matches!(c, '.' | '*' | '>' | '/' | '\\')
        })
}

/// Whether `subject` matches the filter `filter`.
fn matches(filter: &str, subject: &str) -> bool {
    let mut subject = subject.split('.');
    for f in filter.split('.') {
        match f {
            ">" => return subject.next().is_some(),
            "*" => {
                if subject.next().is_none() {
                    return false;
                }
            }
            token => {
                if subject.next() != Some(token) {
                    return false;
                }
            }
        }
    }
    subject.next().is_none()
}

fn servers(url: &str) -> Result<Vec<async_nats::ServerAddr>, String> {
    url.split(',')
        .map(|u| {
            u.trim()
                .parse::<async_nats::ServerAddr>()
                .map_err(|e| format!("`{}`: {e}", u.trim()))
        })
        .collect()
}

impl SourceKind for NatsSource {
    const KIND: &'static str = "nats";
    type Settings = Settings;

    fn check(s: Settings) -> Result<Self, SettingError> {
        if s.url.trim().is_empty() {
            return Err(SettingError::new(
                "source.url",
                "name the server, e.g. nats://127.0.0.1:4222",
            ));
        }
        servers(&s.url).map_err(|e| SettingError::new("source.url", e))?;
        if !stream_name_ok(&s.stream) {
            return Err(SettingError::new(
                "source.stream",
                format!(
                    "`{}` is not a stream name (no spaces, `.`, `*`, `>`, `/` or `\\`)",
                    s.stream
                ),
            ));
        }
        if let Some((i, bad)) = s.subjects.iter().enumerate().find(|(_, f)| !filter_ok(f)) {
            return Err(SettingError::new(
                format!("source.subjects[{i}]"),
                format!(
                    "`{bad}` is not a subject filter (`.`-separated tokens; `*` for one token, \
                     `>` for the rest)"
                ),
            ));
        }
        Ok(NatsSource {
            url: s.url,
            stream: s.stream,
            subjects: s.subjects,
            format: s.format,
            entities: s.entities,
        })
    }

    async fn read(self, run: SourceRun) {
        read(self, run).await
    }
}

/// Registers the source (`type = "nats"`).
pub type NatsSourceType = SourceType<NatsSource>;

/// The state row holding the stream sequence to read next.
fn sequence_key(stream: &str) -> String {
    format!("nats/{stream}")
}

/// One JetStream message, owned.
struct Received {
    subject: String,
    payload: Vec<u8>,
    stream_sequence: u64,
    consumer_sequence: u64,
    pending: u64,
    published_ms: i64,
}

impl Received {
    fn of(m: &jetstream::Message) -> Result<Received, String> {
        let info = m
            .info()
            .map_err(|e| format!("a message without its metadata: {e}"))?;
        Ok(Received {
            subject: m.subject.to_string(),
            payload: m.payload.to_vec(),
            stream_sequence: info.stream_sequence,
            consumer_sequence: info.consumer_sequence,
            pending: info.pending,
            published_ms: (info.published.unix_timestamp_nanos() / 1_000_000) as i64,
        })
    }
}

/// A message as an input (`Err`: why it cannot be read).
fn input_of(
    source: &NatsSource,
    m: &Received,
    position: u64,
) -> Result<crate::plan::Input, String> {
    envelope::input_of(
        source.format,
        &source.entities,
        Origin {
            channel: &m.subject,
            at: format!("{}:{}", source.stream, m.stream_sequence),
            timestamp: Some(m.published_ms),
            position,
        },
        &m.payload,
    )
}

/// Reads the stream into `handler` until `stop`.
async fn read(source: NatsSource, run: SourceRun) {
    let SourceRun {
        name,
        inputs,
        batch,
        intake: handler,
        counters,
        mut stop,
    } = run;
    let batch = batch.max(1);
    let mut failures: u32 = 0;
    let mut client: Option<async_nats::Client> = None;
    'connect: loop {
        if *stop.borrow() {
            return;
        }
        if !crate::source::contract::back_off(failures, &mut stop).await {
            return;
        }
        let attempt = async {
            if client.is_none() {
                client = Some(connect_client(&name, &source).await?);
            }
            let js = jetstream::ContextBuilder::new()
                .timeout(Duration::from_secs(5))
                .build(client.clone().expect("connected above"));
            open(&name, &source, handler.as_ref(), &js, batch).await
        };
        let opened = tokio::select! {
            o = attempt => o,
            _ = stop.changed() => return,
        };
        let mut messages = match opened {
            Ok(m) => m,
            Err(e) => {
                failures += 1;
                counters.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(processor = %name, error = %e, "nats source cannot start; retrying");
                continue;
            }
        };
        let mut position = handler.position();
        // the consumer's deliveries are numbered from 1: a gap is a message lost on the way
        let mut delivered: u64 = 0;
        loop {
            let first = tokio::select! {
                m = messages.next() => m,
                _ = stop.changed() => return,
            };
            let mut received: Vec<Received> = Vec::with_capacity(batch);
            let failed = |e: String| {
                counters.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(processor = %name, error = %e, "nats source: receiving failed; starting again from the committed sequence");
            };
            match first {
                Some(Ok(m)) => match Received::of(&m) {
                    Ok(r) => received.push(r),
                    Err(e) => {
                        failures += 1;
                        failed(e);
                        continue 'connect;
                    }
                },
                Some(Err(e)) => {
                    failures += 1;
                    failed(e.to_string());
                    continue 'connect;
                }
                None => {
                    failures += 1;
                    failed("the consumer's messages ended".into());
                    continue 'connect;
                }
            }
            while received.len() < batch {
                match tokio::time::timeout(Duration::from_millis(2), messages.next()).await {
                    Ok(Some(Ok(m))) => match Received::of(&m) {
                        Ok(r) => received.push(r),
                        Err(_) => break, // the next read fails on its own
                    },
                    _ => break,
                }
            }
            // keep what arrived in order; from a gap on, start again at the committed sequence
            let mut gap = None;
            for (i, r) in received.iter().enumerate() {
                if r.consumer_sequence != delivered + 1 {
                    gap = Some((i, r.consumer_sequence));
                    break;
                }
                delivered = r.consumer_sequence;
            }
            if let Some((i, got)) = gap {
                received.truncate(i);
                tracing::debug!(processor = %name, expected = delivered + 1, got, "nats source: delivery gap");
            }
            let Some(last) = received.last() else {
                failures += 1;
                failed("a message of the stream did not arrive".into());
                continue 'connect;
            };
            let next = last.stream_sequence + 1;
            let pending = last.pending;
            let mut items = Vec::with_capacity(received.len());
            let mut letters = Vec::new();
            for r in &received {
                position += 1;
                if !source.subjects.is_empty()
                    && !source.subjects.iter().any(|f| matches(f, &r.subject))
                {
                    continue; // another subject of the stream
                }
                if r.payload.is_empty() {
                    continue; // nothing to read (a marker, not a change)
                }
                // the message's text, copied only for a dead letter
                let raw = String::from_utf8_lossy(&r.payload);
                match input_of(&source, r, position) {
                    Ok(input) if inputs.contains(&input.entity) => items.push(Item { input, raw }),
                    Ok(_) => {} // another entity's change on the stream
                    Err(reason) => letters.push(meshql_core::DeadLetter {
                        position,
                        change_id: format!("{}:{}", source.stream, r.stream_sequence),
                        entity: source
                            .entities
                            .get(&r.subject)
                            .cloned()
                            .unwrap_or_else(|| r.subject.clone()),
                        reason,
                        input: raw.into_owned(),
                        at: meshql_core::now_millis(),
                    }),
                }
            }
            let extra = vec![StateWrite {
                key: sequence_key(&source.stream),
                group: None,
                value: Some(next.to_string()),
            }];
            if let Err(e) = handler.apply(items, letters, position, extra).await {
                failures += 1;
                counters.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(processor = %name, error = %e.0, "nats source: a batch failed; reading it again");
                // the store did not take the batch: start again from its sequence
                continue 'connect;
            }
            failures = 0;
            counters.lag.store(pending, Ordering::Relaxed);
            if gap.is_some() {
                failures += 1;
                failed("a message of the stream did not arrive".into());
                continue 'connect;
            }
        }
    }
}

/// The client: it connects in the background and reconnects forever, so that a server that
/// is down only makes the reads fail until it is back.
async fn connect_client(name: &str, source: &NatsSource) -> Result<async_nats::Client, String> {
    async_nats::ConnectOptions::new()
        .name(format!("meshql-processor-{name}"))
        .retry_on_initial_connect()
        .max_reconnects(None)
        .connection_timeout(Duration::from_secs(5))
        .connect(servers(&source.url)?)
        .await
        .map_err(|e| e.to_string())
}

/// A pull consumer of the stream delivering from the sequence the output committed.
async fn open(
    name: &str,
    source: &NatsSource,
    handler: &dyn Intake,
    js: &jetstream::Context,
    batch: usize,
) -> Result<consumer::pull::Stream, String> {
    handler.ensure_loaded().await.map_err(|e| e.0)?;
    let key = sequence_key(&source.stream);
    let stored = handler
        .state(std::slice::from_ref(&key))
        .await
        .map_err(|e| e.to_string())?
        .get(&key)
        .and_then(|s| s.parse::<u64>().ok());
    let mut stream = js
        .get_stream(&source.stream)
        .await
        .map_err(|e| format!("stream {}: {e}", source.stream))?;
    let state = stream
        .info()
        .await
        .map_err(|e| format!("stream {}: {e}", source.stream))?
        .state
        .clone();
    let start = match stored {
        Some(next) if next > state.last_sequence + 1 => {
            tracing::warn!(processor = %name, stream = %source.stream, next, last = state.last_sequence,
                "the stream ends before the sequence this processor committed: it was replaced; reading it from its start");
            1
        }
        Some(next) => {
            if state.messages > 0 && next < state.first_sequence {
                tracing::warn!(processor = %name, stream = %source.stream, next, first = state.first_sequence,
                    "the stream no longer holds the messages from the sequence this processor committed (its limits removed them): they are lost to it");
            }
            next
        }
        None => 1,
    };
    let config = consumer::pull::Config {
        description: Some(format!("meshql processor {name}")),
        deliver_policy: consumer::DeliverPolicy::ByStartSequence {
            start_sequence: start.max(1),
        },
        ack_policy: consumer::AckPolicy::None,
        // one filter on the server (several need a 2.10 server): the rest on this side
        filter_subject: match source.subjects.as_slice() {
            [one] => one.clone(),
            _ => String::new(),
        },
        inactive_threshold: Duration::from_secs(60),
        memory_storage: true,
        num_replicas: 1,
        ..Default::default()
    };
    let consumer = stream
        .create_consumer(config)
        .await
        .map_err(|e| format!("a consumer of stream {}: {e}", source.stream))?;
    consumer
        .stream()
        .max_messages_per_batch(batch)
        .heartbeat(Duration::from_secs(2))
        .expires(Duration::from_secs(10))
        .messages()
        .await
        .map_err(|e| format!("reading stream {}: {e}", source.stream))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    fn compile(v: &serde_json::Value) -> Result<NatsSource, SettingError> {
        crate::source::contract::compile(v)
    }
    use meshql_core::ChangeOp;
    use serde_json::json;

    fn source(format: Format) -> NatsSource {
        compile(
            &json!({"type": "nats", "url": "nats://127.0.0.1:4222", "stream": "S",
            "format": format.as_str()}),
        )
        .unwrap()
    }

    fn received(subject: &str, seq: u64, payload: &Value) -> Received {
        Received {
            subject: subject.into(),
            payload: payload.to_string().into_bytes(),
            stream_sequence: seq,
            consumer_sequence: seq,
            pending: 0,
            published_ms: 77,
        }
    }

    #[test]
    fn settings_are_checked_and_default_to_the_relays_format() {
        let s = compile(
            &json!({"type": "nats", "url": "nats://h:4222, nats://g:4222",
            "stream": "MESHQL_CHANGES", "subjects": ["meshql.changes.event", "x.*.y", "z.>"],
            "entities": {"meshql.changes.event": "event"}}),
        )
        .unwrap();
        assert_eq!(s.format, Format::Meshql);
        assert_eq!(s.subjects.len(), 3);
        assert_eq!(s.entities["meshql.changes.event"], "event");
        let d =
            compile(&json!({"type": "nats", "url": "h:4222", "stream": "S", "format": "debezium"}))
                .unwrap();
        assert_eq!(d.format, Format::Debezium);
        for (bad, field) in [
            (json!({"type": "nats", "stream": "S"}), "source"),
            (
                json!({"type": "nats", "url": "", "stream": "S"}),
                "source.url",
            ),
            (
                json!({"type": "nats", "url": "nats://h:notaport", "stream": "S"}),
                "source.url",
            ),
            (
                json!({"type": "nats", "url": "h:1", "stream": "a.b"}),
                "source.stream",
            ),
            (
                json!({"type": "nats", "url": "h:1", "stream": ""}),
                "source.stream",
            ),
            (
                json!({"type": "nats", "url": "h:1", "stream": "S", "subjects": ["a", "b.>.c"]}),
                "source.subjects[1]",
            ),
            (
                json!({"type": "nats", "url": "h:1", "stream": "S", "subjects": ["a*"]}),
                "source.subjects[0]",
            ),
            (
                json!({"type": "nats", "url": "h:1", "stream": "S", "format": "avro"}),
                "source.format",
            ),
            (
                json!({"type": "nats", "url": "h:1", "stream": "S", "topics": ["t"]}),
                "source",
            ),
        ] {
            let e = compile(&bad).unwrap_err();
            assert!(
                e.field.as_deref().is_some_and(|f| f.starts_with(field)),
                "{bad}: {e:?}"
            );
        }
    }

    #[test]
    fn subject_filters_match_as_nats_does() {
        assert!(matches("a.b", "a.b"));
        assert!(!matches("a.b", "a.b.c"));
        assert!(!matches("a.b.c", "a.b"));
        assert!(matches("a.*.c", "a.x.c"));
        assert!(!matches("a.*", "a"));
        assert!(matches("a.>", "a.b.c"));
        assert!(!matches("a.>", "a"));
        assert!(matches(">", "a"));
    }

    #[test]
    fn relay_changes_read_as_published() {
        let body = json!({"position": 7, "change_id": "event:e1:5", "entity": "event", "id": "e1",
            "created_at": 5, "op": "create", "authorized_tokens": [], "correlation_id": "c-1",
            "source": "0.1", "payload": {"name": "signup", "id": "e1"}});
        let mut s = source(Format::Meshql);
        let i = input_of(&s, &received("meshql.changes.event", 3, &body), 9).unwrap();
        assert_eq!(
            (i.entity.as_str(), i.id.as_str(), i.op, i.change_id.as_str()),
            ("event", "e1", ChangeOp::Create, "event:e1:5")
        );
        assert_eq!((i.position, i.created_at), (9, 5));
        assert_eq!(i.correlation_id.as_deref(), Some("c-1"));
        assert_eq!(i.payload["name"], "signup");
        assert!(!i.fresh, "a stream may hold a change twice");
        // the entity named by subject; the time from the stream when the body has none
        s.entities
            .insert("meshql.changes.event".into(), "happening".into());
        let mut bare = body.clone();
        bare.as_object_mut().unwrap().remove("created_at");
        bare.as_object_mut().unwrap().remove("change_id");
        let i = input_of(&s, &received("meshql.changes.event", 3, &bare), 9).unwrap();
        assert_eq!(i.entity, "happening");
        assert_eq!(i.created_at, 77);
        assert_eq!(
            i.change_id, "S:3",
            "the stream and sequence when the body has no id"
        );
        let e = input_of(
            &s,
            &received("x", 4, &json!({"entity": "event", "op": "upsert"})),
            1,
        )
        .unwrap_err();
        assert!(e.contains("`op`"), "{e}");
    }

    #[test]
    fn debezium_events_read_as_from_kafka() {
        let after = json!({"id": "e1", "payload": {"name": "signup"}, "created_at": 5}).to_string();
        let msg = json!({"before": null, "after": after, "op": "c",
            "source": {"collection": "event", "change_id": "event:e1:5"}});
        let i = input_of(
            &source(Format::Debezium),
            &received("cdc.db.event", 2, &msg),
            1,
        )
        .unwrap();
        assert_eq!(
            (i.entity.as_str(), i.id.as_str(), i.op, i.change_id.as_str()),
            ("event", "e1", ChangeOp::Create, "event:e1:5")
        );
        assert_eq!(i.payload["name"], "signup");
        let row = json!({"after": {"name": "x"}, "op": "r"});
        let i = input_of(
            &source(Format::Debezium),
            &received("cdc.db.thing", 8, &row),
            2,
        )
        .unwrap();
        assert_eq!(
            (i.entity.as_str(), i.id.as_str(), i.created_at),
            ("thing", "S:8", 77)
        );
    }
}
