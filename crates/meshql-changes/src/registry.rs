//! Kinds of relay, as a `[[changes.relay]]` entry's `type` names them. Each relay crate
//! implements [`RelayBackend`] once and the server registers it once (`meshql-server`'s
//! `relays.rs`); the config crate keeps an entry's kind-specific fields opaque and hands them
//! here, so a relay owns its settings: their parsing, defaults, checks and JSON Schema. The
//! fields every relay has (`name`, `type`, `batch`, `retry_backoff_max_ms`) stay with the
//! config crate and become [`crate::RelayOptions`].

use crate::relay::Sink;
use async_trait::async_trait;
use meshql_core::SettingError;
use std::sync::Arc;

/// A kind of relay (`kafka`, `nats`…).
pub trait RelayBackend: Send + Sync + 'static {
    /// The `type` value that selects this relay.
    fn kind(&self) -> &'static str;

    /// The JSON Schema of an entry's own fields: all but `type` and the fields every relay
    /// has (for `meshql config-schema`).
    fn schema(&self) -> serde_json::Value;

    /// Checks an entry's own fields and returns what builds its sink. Nothing is connected.
    fn configure(
        &self,
        settings: &serde_json::Value,
        context: &RelayContext<'_>,
    ) -> Result<Box<dyn RelayTarget>, SettingError>;
}

/// What a relay may need besides its entry's own fields.
#[derive(Debug, Clone, Copy)]
pub struct RelayContext<'a> {
    /// The relay's name, unique among the relays (its consumer group in the log is
    /// `relay-<name>`; clients name their connection after it).
    pub name: &'a str,
    /// Every entity of the service: the changes a relay will send (topic or subject names
    /// are derived from them).
    pub entities: &'a [RelayEntity<'a>],
}

/// An entity whose changes a relay sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayEntity<'a> {
    pub name: &'a str,
    /// Its table or collection in its storage.
    pub table: &'a str,
}

/// A checked relay entry, ready to start.
#[async_trait]
pub trait RelayTarget: std::fmt::Debug + Send + Sync {
    /// Creates the sink. Clients connect in the background: a broker that is down now is not
    /// an error (the relay retries), only settings the client library rejects are.
    async fn sink(&self) -> Result<Arc<dyn Sink>, Box<dyn std::error::Error + Send + Sync>>;
}

impl meshql_core::registry::Kind for dyn RelayBackend {
    fn kind(&self) -> &'static str {
        RelayBackend::kind(self)
    }
    fn schema(&self) -> serde_json::Value {
        RelayBackend::schema(self)
    }
}

/// The relays a binary knows, by `type`.
#[derive(Default, Clone, Debug)]
pub struct RelayRegistry {
    backends: meshql_core::registry::Registry<dyn RelayBackend>,
}

impl RelayRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a relay kind; a later registration of the same kind replaces the earlier one.
    pub fn register(mut self, backend: impl RelayBackend) -> Self {
        self.backends.insert(Arc::new(backend));
        self
    }

    pub fn get(&self, kind: &str) -> Option<&dyn RelayBackend> {
        self.backends.get(kind)
    }

    /// The registered kinds, in registration order.
    pub fn kinds(&self) -> Vec<&'static str> {
        self.backends.kinds()
    }

    /// Checks an entry of the given kind; an unknown kind is an error on `type`, and a field
    /// the kind does not have but another registered kind does says which kind it is for.
    pub fn configure(
        &self,
        kind: &str,
        settings: &serde_json::Value,
        context: &RelayContext<'_>,
    ) -> Result<Box<dyn RelayTarget>, SettingError> {
        let Some(backend) = self.get(kind) else {
            return Err(self.backends.unknown("relay", kind));
        };
        backend
            .configure(settings, context)
            .map_err(|e| self.other_kinds_field(kind, e))
    }

    /// `unknown field` errors about a field of other kinds name those kinds instead.
    fn other_kinds_field(&self, kind: &str, e: SettingError) -> SettingError {
        let Some(field) = e.field.as_deref() else {
            return e;
        };
        if !e.message.starts_with("unknown field") {
            return e;
        }
        let owners: Vec<String> = self
            .backends
            .iter()
            .filter(|b| b.kind() != kind)
            .filter(|b| b.schema()["properties"].get(field).is_some())
            .map(|b| format!("`type = \"{}\"`", b.kind()))
            .collect();
        if owners.is_empty() {
            return e;
        }
        SettingError::new(
            field,
            format!("applies to {} relays only", owners.join(" and ")),
        )
    }

    /// Each kind with the JSON Schema of its own fields.
    pub fn schemas(&self) -> Vec<(&'static str, serde_json::Value)> {
        self.backends.schemas()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::{confirmed, Confirmation, RelayChange, SinkError};
    use serde_json::json;

    #[derive(Debug)]
    struct Null;

    #[async_trait]
    impl Sink for Null {
        fn kind(&self) -> &'static str {
            "null"
        }
        async fn enqueue(&self, _: &[RelayChange]) -> Result<Confirmation, SinkError> {
            Ok(confirmed())
        }
    }

    #[async_trait]
    impl RelayTarget for Null {
        async fn sink(&self) -> Result<Arc<dyn Sink>, Box<dyn std::error::Error + Send + Sync>> {
            Ok(Arc::new(Null))
        }
    }

    /// A kind with one field of its own, `field`.
    struct Kind(&'static str, &'static str);

    impl RelayBackend for Kind {
        fn kind(&self) -> &'static str {
            self.0
        }
        fn schema(&self) -> serde_json::Value {
            json!({ "type": "object", "properties": { self.1: { "type": "string" } } })
        }
        fn configure(
            &self,
            settings: &serde_json::Value,
            context: &RelayContext<'_>,
        ) -> Result<Box<dyn RelayTarget>, SettingError> {
            assert_eq!(context.name, "r");
            for key in settings.as_object().unwrap().keys() {
                if key != self.1 {
                    return Err(SettingError::new(
                        key.clone(),
                        format!("unknown field `{key}`, expected `{}`", self.1),
                    ));
                }
            }
            Ok(Box::new(Null))
        }
    }

    #[tokio::test]
    async fn kinds_are_found_by_type_and_others_named() {
        let registry = RelayRegistry::new()
            .register(Kind("a", "url"))
            .register(Kind("b", "brokers"))
            .register(Kind("c", "brokers"));
        assert_eq!(registry.kinds(), ["a", "b", "c"]);
        let context = RelayContext {
            name: "r",
            entities: &[RelayEntity {
                name: "hen",
                table: "hens",
            }],
        };
        let target = registry
            .configure("a", &json!({ "url": "x" }), &context)
            .unwrap();
        assert_eq!(target.sink().await.unwrap().kind(), "null");

        let e = registry
            .configure("redis", &json!({}), &context)
            .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("type"));
        assert_eq!(
            e.message,
            "unknown relay type `redis` (this build has: a, b, c)"
        );

        // a field of other kinds names them, a field of none keeps the kind's own message
        let e = registry
            .configure("a", &json!({ "brokers": "h:1" }), &context)
            .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("brokers"));
        assert_eq!(
            e.message,
            "applies to `type = \"b\"` and `type = \"c\"` relays only"
        );
        let e = registry
            .configure("a", &json!({ "colour": "red" }), &context)
            .unwrap_err();
        assert_eq!(e.message, "unknown field `colour`, expected `url`");

        // a later registration of a kind replaces the earlier one
        let registry = registry.register(Kind("a", "servers"));
        assert_eq!(registry.kinds(), ["b", "c", "a"]);
        assert!(registry
            .configure("a", &json!({ "servers": "x" }), &context)
            .is_ok());
    }
}
