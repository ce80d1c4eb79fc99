//! A processor's `source`: where it reads when not from the service's own change log —
//! Kafka topics ([`kafka`]), a NATS JetStream stream ([`nats`]) or the tables of a PostgreSQL
//! it does not own, by logical replication ([`crate::pgcdc`]). Each is a
//! [`meshql_core::Component`] of the [`Sources`] family, registered with one line in
//! [`registry`]; what a source is to its processor is [`contract`].
//!
//! Every source is exactly once in the same way: its own position (Kafka offsets, the
//! stream's sequence) is a state row of the processor, committed with the batch's outputs in
//! one transaction, and read back when the processor starts; the broker's own record of
//! consumption (group offsets, acknowledgements) is not used.

pub mod conformance;
pub mod contract;
pub mod envelope;
pub mod kafka;
pub mod nats;

pub use contract::{Intake, Source, SourceCounters, SourceKind, SourceRun, SourceType, Sources};

use meshql_core::{Registry, SettingError};
use serde_json::Value;
use std::sync::{Arc, OnceLock};

/// Every source this build reads, by `type`.
pub fn registry() -> &'static Registry<Sources> {
    static REGISTRY: OnceLock<Registry<Sources>> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        Registry::new()
            .register(kafka::KafkaSourceType::new())
            .register(nats::NatsSourceType::new())
            .register(crate::pgcdc::PostgresCdcSourceType::new())
    })
}

/// Checks a processor's `source` block.
pub fn compile(settings: &Value) -> Result<Arc<dyn Source>, SettingError> {
    let known = registry().kinds().join(", ");
    let Some(block) = settings.as_object() else {
        return Err(SettingError::new(
            "source",
            format!(
                "a table: `source = {{ type = \"{}\", … }}`",
                registry().kinds().join("\" | \"")
            ),
        ));
    };
    match block.get("type") {
        Some(Value::String(kind)) => match registry().get(kind) {
            Some(part) => part.configure(settings, &()),
            None => Err(SettingError::new(
                "source.type",
                format!(
                    "unknown source `{kind}` (this build has: {known}; leave `source` out to read \
                     the service's own change log)"
                ),
            )),
        },
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
