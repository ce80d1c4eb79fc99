//! `[[changes.relay]] type = "nats"`: the entry's fields and their registration.

use crate::{NatsSink, NatsSinkConfig};
use async_trait::async_trait;
use meshql_changes::{RelayContext, RelayTarget, Relays, Sink};
use meshql_core::Component;
use meshql_core::SettingError;
use schemars::JsonSchema;
use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;

/// NATS JetStream: subject `<subject_prefix>.<entity>`, header `Nats-Msg-Id: <change_id>`
/// (JetStream drops a redelivery within the stream's duplicate window); every publish is
/// acknowledged by the stream before the position is committed.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NatsSettings {
    /// Server URL, e.g. `nats://127.0.0.1:4222` (several separated by commas).
    pub url: String,
    /// Subjects are `<subject_prefix>.<entity>` (default `meshql.changes`).
    #[serde(default = "default_subject_prefix")]
    pub subject_prefix: String,
    /// The JetStream stream, created when missing with file storage and subjects
    /// `<subject_prefix>.>` (default `MESHQL_CHANGES`).
    #[serde(default = "default_stream")]
    pub stream: String,
    /// The duplicate window of a stream the relay creates, in seconds (default 120).
    #[serde(default = "default_duplicate_window_secs")]
    pub duplicate_window_secs: u64,
}

fn default_subject_prefix() -> String {
    "meshql.changes".into()
}
fn default_stream() -> String {
    "MESHQL_CHANGES".into()
}
fn default_duplicate_window_secs() -> u64 {
    120
}

/// A NATS subject (dot-separated tokens): no wildcards, spaces or empty tokens.
fn subject_ok(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').all(|t| {
            !t.is_empty()
                && t.chars()
                    .all(|c| !c.is_whitespace() && !c.is_control() && c != '*' && c != '>')
        })
}

fn stream_name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.chars().all(|c| {
            !c.is_whitespace() && !c.is_control() && !matches!(c, '.' | '*' | '>' | '/' | '\\')
        })
}

/// Registers the NATS relay with a relay registry.
#[derive(Debug, Default, Clone, Copy)]
pub struct NatsBackend;

impl Component<Relays> for NatsBackend {
    const KIND: &'static str = "nats";
    type Settings = NatsSettings;

    const REQUIRED: &'static [(&'static str, &'static str)] =
        &[("url", "a nats relay needs `url = \"nats://host:port\"`")];

    fn build(
        &self,
        settings: NatsSettings,
        context: &RelayContext<'_>,
    ) -> Result<Box<dyn RelayTarget>, SettingError> {
        Ok(Box::new(NatsTarget(sink_config(settings, context)?)))
    }
}

/// Checks an entry's fields into what the sink needs.
fn sink_config(
    settings: NatsSettings,
    context: &RelayContext<'_>,
) -> Result<NatsSinkConfig, SettingError> {
    if settings.url.trim().is_empty() {
        return Err(SettingError::new(
            "url",
            "name the server, e.g. `nats://127.0.0.1:4222`",
        ));
    }
    if !subject_ok(&settings.subject_prefix) {
        return Err(SettingError::new(
            "subject_prefix",
            format!(
                "`{}` is not a NATS subject (dot-separated tokens, no spaces, `*` or `>`)",
                settings.subject_prefix
            ),
        ));
    }
    if !stream_name_ok(&settings.stream) {
        return Err(SettingError::new(
            "stream",
            format!(
                "`{}` is not a JetStream stream name (no spaces, `.`, `*`, `>`, `/` or `\\`)",
                settings.stream
            ),
        ));
    }
    if settings.duplicate_window_secs == 0 {
        return Err(SettingError::new(
            "duplicate_window_secs",
            "must be at least 1",
        ));
    }
    let mut config = NatsSinkConfig::new(context.name, &settings.url);
    config.subject_prefix = settings.subject_prefix;
    config.stream = settings.stream;
    config.duplicate_window = Duration::from_secs(settings.duplicate_window_secs);
    Ok(config)
}

#[derive(Debug)]
struct NatsTarget(NatsSinkConfig);

#[async_trait]
impl RelayTarget for NatsTarget {
    async fn sink(&self) -> Result<Arc<dyn Sink>, Box<dyn std::error::Error + Send + Sync>> {
        Ok(Arc::new(NatsSink::connect(self.0.clone()).await?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(settings: serde_json::Value) -> Result<NatsSinkConfig, SettingError> {
        sink_config(
            NatsBackend.parse(&settings)?,
            &RelayContext {
                name: "n1",
                entities: &[],
                data_dir: std::path::Path::new("/tmp"),
            },
        )
    }

    #[test]
    fn settings_resolve_with_their_defaults() {
        let c = check(json!({ "url": "nats://127.0.0.1:4222" })).unwrap();
        assert_eq!(c.name, "n1");
        assert_eq!(c.url, "nats://127.0.0.1:4222");
        assert_eq!(c.subject_prefix, "meshql.changes");
        assert_eq!(c.stream, "MESHQL_CHANGES");
        assert_eq!(c.duplicate_window, Duration::from_secs(120));
        assert_eq!(c.ack_timeout, NatsSinkConfig::new("n1", "x").ack_timeout);

        let c = check(json!({
            "url": "nats://h:1,nats://h:2",
            "subject_prefix": "eggs.changes",
            "stream": "EGGS",
            "duplicate_window_secs": 30,
        }))
        .unwrap();
        assert_eq!(c.subject_prefix, "eggs.changes");
        assert_eq!(c.stream, "EGGS");
        assert_eq!(c.duplicate_window, Duration::from_secs(30));
    }

    #[test]
    fn bad_values_name_the_field() {
        for (settings, field, words) in [
            (json!({}), "url", "needs `url = \"nats://host:port\"`"),
            (json!({ "url": "" }), "url", "name the server"),
            (
                json!({ "url": "nats://h:1", "subject_prefix": "a.*" }),
                "subject_prefix",
                "`a.*` is not a NATS subject",
            ),
            (
                json!({ "url": "nats://h:1", "subject_prefix": "a..b" }),
                "subject_prefix",
                "not a NATS subject",
            ),
            (
                json!({ "url": "nats://h:1", "stream": "A.B" }),
                "stream",
                "`A.B` is not a JetStream stream name",
            ),
            (
                json!({ "url": "nats://h:1", "duplicate_window_secs": 0 }),
                "duplicate_window_secs",
                "at least 1",
            ),
            (
                json!({ "url": "nats://h:1", "format": "meshql" }),
                "format",
                "unknown field `format`",
            ),
        ] {
            let e = check(settings.clone()).expect_err("rejected");
            assert_eq!(e.field.as_deref(), Some(field), "{settings}: {e}");
            assert!(e.message.contains(words), "{settings}: {e}");
        }
    }

    #[test]
    fn the_schema_describes_the_fields() {
        let s = Component::<Relays>::schema(&NatsBackend);
        assert_eq!(s["required"], json!(["url"]));
        assert!(s["properties"]["stream"].is_object(), "{s}");
        assert!(s["description"].as_str().unwrap().contains("JetStream"));
    }
}
