//! `[[changes.relay]]`: names, the change feed they need and the fields every relay has
//! (`batch`, `retry_backoff_max_ms`), checked before a server starts. The fields of a
//! relay's `type` are kept as written, with their lines, for the relay registry (see
//! `meshql_changes::RelayRegistry`), which checks them at `meshql check` and at start-up.

use super::{field_line, Resolver};
use crate::error::line_of;
use crate::model::ChangesConfig;
use std::collections::{BTreeMap, HashSet};
use toml::Spanned;

/// A relay whose common fields passed every check, with their defaults filled in; the
/// fields of its type are unchecked here.
#[derive(Debug, Clone, PartialEq)]
pub struct RelaySpec {
    pub name: String,
    /// The `type`.
    pub kind: String,
    /// Changes per batch at most.
    pub batch: usize,
    /// Longest wait between retries.
    pub retry_backoff_max_ms: u64,
    /// The fields of the relay's type, as JSON.
    pub settings: serde_json::Value,
    /// How errors name the relay: `changes.relay[0] "k1"`.
    pub path: String,
    /// The entry's line in the config file.
    pub line: Option<usize>,
    /// The line of each field (every field included).
    pub field_lines: BTreeMap<String, usize>,
}

impl RelaySpec {
    /// The line of a field (`brokers`, or a path into it such as `options.linger.ms`), else
    /// the entry's.
    pub fn line_of(&self, field: Option<&str>) -> Option<usize> {
        field_line(&self.field_lines, field).or(self.line)
    }
}

/// Relay names are consumer groups in the log and client names at the broker.
fn name_chars(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl Resolver {
    fn relay_error<T>(
        &mut self,
        at: &Spanned<T>,
        field: &str,
        key: &str,
        message: impl Into<String>,
    ) {
        self.error(Some(at), format!("{field}.{key}"), message);
    }

    /// Checks every relay's name and common fields.
    pub(super) fn resolve_relays(&mut self, changes: &ChangesConfig) -> Vec<RelaySpec> {
        let mut names = HashSet::new();
        let mut resolved = Vec::new();
        for (index, block) in changes.relay.iter().enumerate() {
            let r = block.get_ref();
            let name = r.name.get_ref().clone();
            let field = format!("changes.relay[{index}] \"{name}\"");
            if name.is_empty() || name.len() > 94 || !name_chars(&name) {
                self.relay_error(
                    &r.name,
                    &field,
                    "name",
                    "use 1 to 94 letters, digits, `.`, `_` or `-`",
                );
            } else if !names.insert(name.clone()) {
                self.relay_error(&r.name, &field, "name", "duplicate relay name");
            }
            if !changes.enabled {
                self.error(
                    Some(block),
                    field,
                    "a relay sends the change feed on: it needs `[changes] enabled = true`",
                );
                continue;
            }
            let batch = r.batch.as_ref().map_or(500, |b| *b.get_ref());
            if let Some(b) = &r.batch {
                if !(1..=10_000).contains(b.get_ref()) {
                    self.relay_error(b, &field, "batch", "must be between 1 and 10000");
                }
            }
            let retry_backoff_max_ms = r
                .retry_backoff_max_ms
                .as_ref()
                .map_or(10_000, |b| *b.get_ref());
            if let Some(b) = &r.retry_backoff_max_ms {
                if *b.get_ref() < 100 {
                    self.relay_error(b, &field, "retry_backoff_max_ms", "must be at least 100");
                }
            }
            resolved.push(RelaySpec {
                name,
                kind: r.kind.get_ref().clone(),
                batch,
                retry_backoff_max_ms,
                settings: serde_json::Value::Object(r.settings.clone()),
                path: field,
                line: Some(line_of(&self.text, block.span().start)),
                field_lines: r
                    .offsets
                    .iter()
                    .map(|(k, offset)| (k.clone(), line_of(&self.text, *offset)))
                    .collect(),
            });
        }
        resolved
    }
}

#[cfg(test)]
mod tests {
    use crate::resolve::{load_with_env, ResolvedConfig};
    use crate::{ConfigError, ConfigErrors};

    // nine lines, as the line numbers of the tests below expect
    const ENTITIES: &str = "entity = [\n  { name = \"hen\", rest = {} },\n  { name = \"coop\", table = \"coops\", rest = {} },\n]\n\n\n\n[storage.default]\ntype = \"memory\"\n";

    fn load(toml: &str) -> Result<ResolvedConfig, ConfigErrors> {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("meshql.toml");
        std::fs::write(&f, toml).unwrap();
        load_with_env(&f, |_| None)
    }

    fn one_error(toml: &str) -> ConfigError {
        let errs = load(toml).expect_err("config must be rejected").0;
        assert_eq!(errs.len(), 1, "{errs:?}");
        errs.into_iter().next().unwrap()
    }

    // the same relays as meshql-server's preflight tests (which check the fields of their
    // types with the registered relays)
    const TWO: &str = r#"
[[changes.relay]]
name = "k1"
type = "kafka"
brokers = "127.0.0.1:9092"
topic_naming = "debezium"
db = "eggs_development"
format = "debezium"
options = { "linger.ms" = 20, "compression.type" = "zstd" }

[[changes.relay]]
type = "nats"
name = "n1"
url = "nats://127.0.0.1:4222"
"#;

    #[test]
    fn relays_resolve_with_their_defaults_and_keep_their_type_s_fields() {
        let c = load(&format!("{ENTITIES}{TWO}")).unwrap();
        let relays = &c.changes.relays;
        assert_eq!(relays.len(), 2);
        let k = &relays[0];
        assert_eq!((k.batch, k.retry_backoff_max_ms), (500, 10_000));
        assert_eq!((k.name.as_str(), k.kind.as_str()), ("k1", "kafka"));
        assert_eq!(k.path, "changes.relay[0] \"k1\"");
        assert_eq!(
            k.settings,
            serde_json::json!({
                "brokers": "127.0.0.1:9092",
                "topic_naming": "debezium",
                "db": "eggs_development",
                "format": "debezium",
                "options": { "linger.ms": 20, "compression.type": "zstd" },
            })
        );
        assert_eq!(k.line, Some(11));
        assert_eq!(k.line_of(Some("brokers")), Some(14));
        assert_eq!(k.line_of(Some("options.linger.ms")), Some(18));
        assert_eq!(k.line_of(Some("type")), Some(13));
        assert_eq!(k.line_of(None), Some(11));
        let n = &relays[1];
        assert_eq!((n.name.as_str(), n.kind.as_str()), ("n1", "nats"));
        assert_eq!(
            n.settings,
            serde_json::json!({ "url": "nats://127.0.0.1:4222" })
        );
        assert_eq!(n.line_of(Some("url")), Some(23));
        assert_eq!(n.line_of(Some("stream")), Some(20));

        let c = load(&format!(
            "{ENTITIES}{}",
            TWO.replace(
                "format = \"debezium\"",
                "batch = 20\nretry_backoff_max_ms = 100"
            )
        ))
        .unwrap();
        let k = &c.changes.relays[0];
        assert_eq!((k.batch, k.retry_backoff_max_ms), (20, 100));
        assert!(k.settings.get("batch").is_none(), "{:?}", k.settings);
    }

    #[test]
    fn unknown_types_are_kept_for_the_registry() {
        // the relay registry (meshql-server) names the known types
        let c = load(&format!(
            "{ENTITIES}{}",
            TWO.replace("type = \"nats\"", "type = \"redis\"\ncolour = \"red\"")
        ))
        .unwrap();
        let r = &c.changes.relays[1];
        assert_eq!(r.kind, "redis");
        assert_eq!(r.line_of(Some("type")), Some(21));
        assert_eq!(r.line_of(Some("colour")), Some(22));
    }

    #[test]
    fn duplicate_names_point_at_the_second_name() {
        let e = one_error(&format!("{ENTITIES}{}", TWO.replace("\"n1\"", "\"k1\"")));
        assert_eq!(e.field, "changes.relay[1] \"k1\".name", "{e}");
        assert_eq!(e.line, Some(22), "{e}");
        assert!(e.message.contains("duplicate"), "{e}");
        assert!(e.to_string().contains("meshql.toml:22"), "{e}");
    }

    #[test]
    fn a_relay_needs_the_change_feed() {
        let e = one_error(&format!("{ENTITIES}[changes]\nenabled = false\n{TWO}").replace(
            "[[changes.relay]]\ntype = \"nats\"\nname = \"n1\"\nurl = \"nats://127.0.0.1:4222\"\n",
            "",
        ));
        assert_eq!(e.field, "changes.relay[0] \"k1\"", "{e}");
        assert!(e.message.contains("enabled = true"), "{e}");
        assert_eq!(e.line, Some(13), "{e}");
    }

    #[test]
    fn bad_values_name_the_line_and_field() {
        for (from, to, field, line) in [
            (
                "name = \"k1\"",
                "name = \"k/1\"",
                "changes.relay[0] \"k/1\".name",
                12,
            ),
            (
                "name = \"k1\"",
                "name = \"\"",
                "changes.relay[0] \"\".name",
                12,
            ),
            (
                "format = \"debezium\"",
                "format = \"debezium\"\nbatch = 0",
                "changes.relay[0] \"k1\".batch",
                18,
            ),
            (
                "format = \"debezium\"",
                "format = \"debezium\"\nbatch = 10001",
                "changes.relay[0] \"k1\".batch",
                18,
            ),
            (
                "url = \"nats://127.0.0.1:4222\"",
                "url = \"nats://h:1\"\nretry_backoff_max_ms = 99",
                "changes.relay[1] \"n1\".retry_backoff_max_ms",
                24,
            ),
        ] {
            let e = one_error(&format!("{ENTITIES}{}", TWO.replace(from, to)));
            assert_eq!(e.field, field, "{e}");
            assert_eq!(e.line, Some(line), "{e}");
        }
    }

    #[test]
    fn common_fields_need_their_types_and_name_and_type_are_required() {
        for (from, to, needle, line) in [
            (
                "format = \"debezium\"",
                "batch = \"many\"",
                "invalid type",
                17,
            ),
            ("type = \"nats\"", "type = 3", "invalid type", 21),
            ("name = \"n1\"", "name = [\"n1\"]", "invalid type", 22),
        ] {
            let e = one_error(&format!("{ENTITIES}{}", TWO.replace(from, to)));
            assert!(e.message.contains(needle), "{e}");
            assert!(e.field.starts_with("changes.relay"), "{e}");
            assert_eq!(e.line, Some(line), "{e}");
        }
        for (from, field) in [("type = \"nats\"\n", "type"), ("name = \"n1\"\n", "name")] {
            let e = one_error(&format!("{ENTITIES}{}", TWO.replace(from, "")));
            assert!(e.message.contains(&format!("`{field}`")), "{e}");
            assert!(matches!(e.line, Some(20..=22)), "{e}");
        }
    }
}
