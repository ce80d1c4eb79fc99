//! A processor's `source`: where it reads when not from the service's own change log —
//! Kafka topics ([`crate::kafka`]), a NATS JetStream stream ([`crate::nats`]) or the tables of
//! a PostgreSQL it does not own, by logical replication ([`crate::pgcdc`]).
//!
//! Every source is exactly once in the same way: its own position (Kafka offsets, the
//! stream's sequence) is a state row of the processor, committed with the batch's outputs in
//! one transaction, and read back when the processor starts; the broker's own record of
//! consumption (group offsets, acknowledgements) is not used.

use crate::kafka::KafkaSource;
use crate::nats::NatsSource;
use crate::pgcdc::PostgresCdcSource;
use crate::runtime::ProcessorHandler;
use meshql_core::SettingError;
use serde_json::Value;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use tokio::sync::watch;

/// The `type`s of `source` this build reads.
pub const SOURCE_TYPES: &[&str] = &["kafka", "nats", "postgres_cdc"];

/// A checked `source`.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    Kafka(KafkaSource),
    Nats(NatsSource),
    PostgresCdc(PostgresCdcSource),
}

impl Source {
    /// Its `type`.
    pub fn kind(&self) -> &'static str {
        match self {
            Source::Kafka(_) => "kafka",
            Source::Nats(_) => "nats",
            Source::PostgresCdc(_) => "postgres_cdc",
        }
    }
}

/// A settings error of the source's block, its field under `source`.
pub(crate) fn scoped(e: SettingError) -> SettingError {
    SettingError {
        field: Some(match e.field {
            Some(f) => format!("source.{f}"),
            None => "source".into(),
        }),
        message: e.message,
    }
}

/// Checks a processor's `source` block.
pub fn compile(settings: &Value) -> Result<Source, SettingError> {
    let Some(block) = settings.as_object() else {
        return Err(SettingError::new(
            "source",
            "a table: `source = { type = \"kafka\" | \"nats\" | \"postgres_cdc\", … }`",
        ));
    };
    let known = SOURCE_TYPES.join(", ");
    match block.get("type") {
        Some(Value::String(kind)) if kind == "kafka" => {
            crate::kafka::compile(settings).map(Source::Kafka)
        }
        Some(Value::String(kind)) if kind == "nats" => {
            crate::nats::compile(settings).map(Source::Nats)
        }
        Some(Value::String(kind)) if kind == "postgres_cdc" => {
            crate::pgcdc::compile(settings).map(Source::PostgresCdc)
        }
        Some(Value::String(other)) => Err(SettingError::new(
            "source.type",
            format!(
                "unknown source `{other}` (this build has: {known}; leave `source` out to read \
                 the service's own change log)"
            ),
        )),
        Some(_) => Err(SettingError::new(
            "source.type",
            format!("a string, one of: {known}"),
        )),
        None => Err(SettingError::new(
            "source.type",
            format!("name the source's type: one of {known}"),
        )),
    }
}

/// What a source's runner shares with the processor's stats.
#[derive(Default)]
pub(crate) struct SourceCounters {
    /// Failures to connect, read or commit (each retried with backoff).
    pub errors: AtomicU64,
    /// Messages in the source after the last one read.
    pub lag: AtomicU64,
}

/// Waits before the next attempt after `failures` failures in a row (none after none; 100 ms
/// doubling up to 12.8 s); `false` when `stop` came first.
pub(crate) async fn back_off(failures: u32, stop: &mut watch::Receiver<bool>) -> bool {
    if failures == 0 {
        return true;
    }
    let delay = std::time::Duration::from_millis(100 * (1u64 << failures.min(7)));
    tokio::select! {
        _ = tokio::time::sleep(delay) => true,
        _ = stop.changed() => false,
    }
}

/// Reads `source` into `handler` until `stop`.
pub(crate) async fn run(
    name: String,
    source: Source,
    inputs: Vec<String>,
    batch: usize,
    handler: Arc<ProcessorHandler>,
    counters: Arc<SourceCounters>,
    stop: watch::Receiver<bool>,
) {
    match source {
        Source::Kafka(s) => {
            crate::kafka::run(name, s, inputs, batch, handler, counters, stop).await
        }
        Source::Nats(s) => crate::nats::run(name, s, inputs, batch, handler, counters, stop).await,
        Source::PostgresCdc(s) => {
            crate::pgcdc::run(name, s, inputs, batch, handler, counters, stop).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_type_picks_the_source_and_an_unknown_one_is_named() {
        let k = compile(&json!({"type": "kafka", "brokers": "h:1", "topics": ["t"]})).unwrap();
        assert_eq!(k.kind(), "kafka");
        let n = compile(&json!({"type": "nats", "url": "nats://h:4222", "stream": "S"})).unwrap();
        assert_eq!(n.kind(), "nats");
        let e = compile(&json!({"type": "pulsar", "url": "x"})).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("source.type"));
        assert!(
            e.message.contains("unknown source `pulsar`")
                && e.message.contains("kafka, nats, postgres_cdc"),
            "{e:?}"
        );
        let e = compile(&json!({"url": "x"})).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("source.type"));
        assert!(e.message.contains("kafka, nats"), "{e:?}");
        let e = compile(&json!({"type": 3})).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("source.type"));
        let e = compile(&json!("kafka")).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("source"));
    }
}
