//! Kinds of relay, as a `[[changes.relay]]` entry's `type` names them. Each relay crate
//! implements [`meshql_core::Component`]`<`[`Relays`]`>` once and the server registers it once (`meshql-server`'s
//! `relays.rs`); the config crate keeps an entry's kind-specific fields opaque and hands them
//! here, so a relay owns its settings: their parsing, defaults, checks and JSON Schema. The
//! fields every relay has (`name`, `type`, `batch`, `retry_backoff_max_ms`) stay with the
//! config crate and become [`crate::RelayOptions`].

use crate::relay::Sink;
use async_trait::async_trait;
#[cfg(test)]
use meshql_core::SettingError;
use std::sync::Arc;

/// Relays, as a `[[changes.relay]]` entry's `type` names them (`kafka`, `nats`…): a relay
/// crate implements [`meshql_core::Component`]`<Relays>`; building an entry checks it and
/// connects nothing.
pub struct Relays;

impl meshql_core::Family for Relays {
    const WHAT: &'static str = "relay";
    type Context<'a> = RelayContext<'a>;
    type Built = Box<dyn RelayTarget>;
}

/// The relays a binary knows, by `type`.
pub type RelayRegistry = meshql_core::Registry<Relays>;

/// What a relay may need besides its entry's own fields.
#[derive(Debug, Clone, Copy)]
pub struct RelayContext<'a> {
    /// The relay's name, unique among the relays (its consumer group in the log is
    /// `relay-<name>`; clients name their connection after it).
    pub name: &'a str,
    /// Every entity of the service: the changes a relay will send (topic or subject names
    /// are derived from them).
    pub entities: &'a [RelayEntity<'a>],
    /// The service's `data_dir`, already absolute: relative file names resolve under it.
    pub data_dir: &'a std::path::Path,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::{confirmed, Confirmation, RelayChange, SinkError};
    use meshql_core::Component;
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

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct NullSettings {
        #[allow(dead_code)]
        url: String,
    }

    struct NullRelay;

    impl Component<Relays> for NullRelay {
        const KIND: &'static str = "null";
        type Settings = NullSettings;
        fn build(
            &self,
            _: NullSettings,
            context: &RelayContext<'_>,
        ) -> Result<Box<dyn RelayTarget>, SettingError> {
            assert_eq!(context.name, "r");
            assert_eq!(context.entities[0].table, "hens");
            Ok(Box::new(Null))
        }
    }

    #[tokio::test]
    async fn a_relay_is_found_by_type_given_its_context_and_others_are_named() {
        let registry = RelayRegistry::new().register(NullRelay);
        let context = RelayContext {
            name: "r",
            entities: &[RelayEntity {
                name: "hen",
                table: "hens",
            }],
            data_dir: std::path::Path::new("/tmp"),
        };
        let target = registry
            .configure("null", &json!({ "url": "x" }), &context)
            .unwrap();
        assert_eq!(target.sink().await.unwrap().kind(), "null");
        let e = registry
            .configure("redis", &json!({}), &context)
            .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("type"));
        assert_eq!(
            e.message,
            "unknown relay type `redis` (this build has: null)"
        );
    }
}
