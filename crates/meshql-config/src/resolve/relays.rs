//! `[[changes.relay]]`: names, the change feed they need, the fields of their type, and
//! the names they derive (Kafka topics, NATS subjects and streams), all checked before a
//! server starts.

use super::{ResolvedEntity, Resolver};
use crate::error::line_of;
use crate::model::{ChangesConfig, KafkaFormat, OptionValue, RelayConfig, RelayKind, TopicNaming};
use std::collections::{BTreeMap, HashSet};
use toml::Spanned;

/// A relay that passed every check, with its defaults filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct RelaySpec {
    pub name: String,
    /// Changes per batch at most.
    pub batch: usize,
    /// Longest wait between retries.
    pub retry_backoff_max_ms: u64,
    pub sink: RelaySinkSpec,
}

/// What a relay sends to.
#[derive(Debug, Clone, PartialEq)]
pub enum RelaySinkSpec {
    Kafka {
        brokers: String,
        topic_prefix: String,
        topic_naming: TopicNaming,
        db: String,
        format: KafkaFormat,
        /// librdkafka settings, as text.
        options: BTreeMap<String, String>,
    },
    Nats {
        url: String,
        subject_prefix: String,
        stream: String,
        duplicate_window_secs: u64,
    },
}

impl RelaySpec {
    /// The `type`.
    pub fn kind(&self) -> &'static str {
        match self.sink {
            RelaySinkSpec::Kafka { .. } => "kafka",
            RelaySinkSpec::Nats { .. } => "nats",
        }
    }
}

/// The Kafka topic of an entity's changes (`table` is the entity's table or collection).
pub fn kafka_topic(
    naming: TopicNaming,
    prefix: &str,
    db: &str,
    entity: &str,
    table: &str,
) -> String {
    match naming {
        TopicNaming::Entity => format!("{prefix}{entity}"),
        TopicNaming::Debezium => format!("{prefix}.{db}.{table}"),
    }
}

/// The default `topic_prefix` of a topic naming.
pub fn default_topic_prefix(naming: TopicNaming) -> &'static str {
    match naming {
        TopicNaming::Entity => "meshql.",
        TopicNaming::Debezium => "meshql",
    }
}

fn kafka_name_chars(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
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

const KAFKA_ONLY: &str = "applies to `type = \"kafka\"` relays only";
const NATS_ONLY: &str = "applies to `type = \"nats\"` relays only";

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

    /// A field that the relay's type does not have.
    fn not_for<T>(&mut self, value: &Option<Spanned<T>>, field: &str, key: &str, why: &str) {
        if let Some(v) = value {
            self.error(Some(v), format!("{field}.{key}"), why.to_owned());
        }
    }

    /// Checks every relay.
    pub(super) fn resolve_relays(
        &mut self,
        changes: &ChangesConfig,
        entities: &[ResolvedEntity],
    ) -> Vec<RelaySpec> {
        let mut names = HashSet::new();
        let mut resolved = Vec::new();
        for (index, block) in changes.relay.iter().enumerate() {
            let r = block.get_ref();
            let name = r.name.get_ref().clone();
            let field = format!("changes.relay[{index}] \"{name}\"");
            if name.is_empty() || name.len() > 94 || !kafka_name_chars(&name) {
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
            let sink = match r.kind.get_ref() {
                RelayKind::Kafka => self.kafka(r, &field, entities),
                RelayKind::Nats => self.nats(r, &field),
            };
            if let Some(sink) = sink {
                resolved.push(RelaySpec {
                    name,
                    batch,
                    retry_backoff_max_ms,
                    sink,
                });
            }
        }
        resolved
    }

    fn kafka(
        &mut self,
        r: &RelayConfig,
        field: &str,
        entities: &[ResolvedEntity],
    ) -> Option<RelaySinkSpec> {
        self.not_for(&r.url, field, "url", NATS_ONLY);
        self.not_for(&r.subject_prefix, field, "subject_prefix", NATS_ONLY);
        self.not_for(&r.stream, field, "stream", NATS_ONLY);
        self.not_for(
            &r.duplicate_window_secs,
            field,
            "duplicate_window_secs",
            NATS_ONLY,
        );
        let brokers = match &r.brokers {
            Some(b) if !b.get_ref().trim().is_empty() => b.get_ref().clone(),
            Some(b) => {
                self.relay_error(b, field, "brokers", "name at least one `host:port`");
                String::new()
            }
            None => {
                self.relay_error(
                    &r.name,
                    field,
                    "brokers",
                    "a kafka relay needs `brokers = \"host:port\"`",
                );
                String::new()
            }
        };
        let naming = r
            .topic_naming
            .as_ref()
            .map_or(TopicNaming::Entity, |n| *n.get_ref());
        let prefix = r.topic_prefix.as_ref().map_or_else(
            || default_topic_prefix(naming).to_owned(),
            |p| p.get_ref().clone(),
        );
        let db =
            r.db.as_ref()
                .map_or_else(|| "meshql".to_owned(), |d| d.get_ref().clone());
        let invalid = "Kafka topic names use only letters, digits, `.`, `_` and `-`";
        match (&r.topic_prefix, &r.db) {
            (Some(p), _) if !kafka_name_chars(&prefix) => {
                self.relay_error(p, field, "topic_prefix", format!("`{prefix}`: {invalid}"));
            }
            (_, Some(d)) if db.is_empty() || !kafka_name_chars(&db) => {
                self.relay_error(d, field, "db", format!("`{db}`: {invalid}"));
            }
            _ => {
                for e in entities {
                    let topic = kafka_topic(naming, &prefix, &db, &e.name, &e.table);
                    if topic.len() > 249 || !kafka_name_chars(&topic) {
                        let at = r
                            .topic_naming
                            .as_ref()
                            .map(|n| n.span())
                            .unwrap_or(r.name.span());
                        self.errors.push(crate::error::ConfigError {
                            file: self.file.clone(),
                            line: Some(line_of(&self.text, at.start)),
                            field: format!("{field}.topic_naming"),
                            message: format!(
                                "entity \"{}\" would publish to `{topic}`, which is not a valid Kafka topic name ({invalid}; at most 249)",
                                e.name
                            ),
                        });
                        break;
                    }
                }
            }
        }
        let mut options = BTreeMap::new();
        if let Some(o) = &r.options {
            for (key, value) in o.get_ref() {
                if matches!(key.as_str(), "bootstrap.servers" | "metadata.broker.list") {
                    self.relay_error(o, field, "options", format!("`{key}` is set by `brokers`"));
                }
                options.insert(key.clone(), OptionValue::to_string(value));
            }
        }
        Some(RelaySinkSpec::Kafka {
            brokers,
            topic_prefix: prefix,
            topic_naming: naming,
            db,
            format: r
                .format
                .as_ref()
                .map_or(KafkaFormat::Meshql, |f| *f.get_ref()),
            options,
        })
    }

    fn nats(&mut self, r: &RelayConfig, field: &str) -> Option<RelaySinkSpec> {
        self.not_for(&r.brokers, field, "brokers", KAFKA_ONLY);
        self.not_for(&r.topic_prefix, field, "topic_prefix", KAFKA_ONLY);
        self.not_for(&r.topic_naming, field, "topic_naming", KAFKA_ONLY);
        self.not_for(&r.db, field, "db", KAFKA_ONLY);
        self.not_for(&r.format, field, "format", KAFKA_ONLY);
        self.not_for(&r.options, field, "options", KAFKA_ONLY);
        let url = match &r.url {
            Some(u) if !u.get_ref().trim().is_empty() => u.get_ref().clone(),
            Some(u) => {
                self.relay_error(
                    u,
                    field,
                    "url",
                    "name the server, e.g. `nats://127.0.0.1:4222`",
                );
                String::new()
            }
            None => {
                self.relay_error(
                    &r.name,
                    field,
                    "url",
                    "a nats relay needs `url = \"nats://host:port\"`",
                );
                String::new()
            }
        };
        let subject_prefix = match &r.subject_prefix {
            Some(p) => {
                if !subject_ok(p.get_ref()) {
                    self.relay_error(
                        p,
                        field,
                        "subject_prefix",
                        format!("`{}` is not a NATS subject (dot-separated tokens, no spaces, `*` or `>`)", p.get_ref()),
                    );
                }
                p.get_ref().clone()
            }
            None => "meshql.changes".to_owned(),
        };
        let stream = match &r.stream {
            Some(s) => {
                if !stream_name_ok(s.get_ref()) {
                    self.relay_error(
                        s,
                        field,
                        "stream",
                        format!("`{}` is not a JetStream stream name (no spaces, `.`, `*`, `>`, `/` or `\\`)", s.get_ref()),
                    );
                }
                s.get_ref().clone()
            }
            None => "MESHQL_CHANGES".to_owned(),
        };
        let duplicate_window_secs = match &r.duplicate_window_secs {
            Some(d) => {
                if *d.get_ref() == 0 {
                    self.relay_error(d, field, "duplicate_window_secs", "must be at least 1");
                }
                *d.get_ref()
            }
            None => 120,
        };
        Some(RelaySinkSpec::Nats {
            url,
            subject_prefix,
            stream,
            duplicate_window_secs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
    fn relays_resolve_with_their_defaults() {
        let c = load(&format!("{ENTITIES}{TWO}")).unwrap();
        let relays = &c.changes.relays;
        assert_eq!(relays.len(), 2);
        assert_eq!(
            (relays[0].batch, relays[0].retry_backoff_max_ms),
            (500, 10_000)
        );
        match &relays[0].sink {
            RelaySinkSpec::Kafka {
                topic_prefix,
                format,
                options,
                topic_naming,
                ..
            } => {
                assert_eq!(topic_prefix, "meshql");
                assert_eq!(*format, KafkaFormat::Debezium);
                assert_eq!(*topic_naming, TopicNaming::Debezium);
                assert_eq!(options["linger.ms"], "20");
                assert_eq!(options["compression.type"], "zstd");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            relays[1].sink,
            RelaySinkSpec::Nats {
                url: "nats://127.0.0.1:4222".into(),
                subject_prefix: "meshql.changes".into(),
                stream: "MESHQL_CHANGES".into(),
                duplicate_window_secs: 120,
            }
        );
        assert_eq!(
            kafka_topic(
                TopicNaming::Debezium,
                "meshql",
                "eggs_development",
                "coop",
                "coops"
            ),
            "meshql.eggs_development.coops"
        );
        assert_eq!(
            kafka_topic(TopicNaming::Entity, "meshql.", "x", "hen", "hen"),
            "meshql.hen"
        );
        let c = load(&format!(
            "{ENTITIES}{}",
            TWO.replace("topic_naming = \"debezium\"\n", "")
        ))
        .unwrap();
        match &c.changes.relays[0].sink {
            RelaySinkSpec::Kafka { topic_prefix, .. } => assert_eq!(topic_prefix, "meshql."),
            other => panic!("{other:?}"),
        }
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
                "url = \"nats://127.0.0.1:4222\"",
                "url = \"nats://h:1\"\nsubject_prefix = \"a.*\"",
                "changes.relay[1] \"n1\".subject_prefix",
                24,
            ),
            (
                "url = \"nats://127.0.0.1:4222\"",
                "url = \"nats://h:1\"\nstream = \"A.B\"",
                "changes.relay[1] \"n1\".stream",
                24,
            ),
            (
                "db = \"eggs_development\"",
                "db = \"eggs development\"",
                "changes.relay[0] \"k1\".db",
                16,
            ),
            (
                "name = \"k1\"",
                "name = \"k/1\"",
                "changes.relay[0] \"k/1\".name",
                12,
            ),
            (
                "format = \"debezium\"",
                "format = \"debezium\"\nbatch = 0",
                "changes.relay[0] \"k1\".batch",
                18,
            ),
            (
                "options = {",
                "options = { \"bootstrap.servers\" = \"x:1\",",
                "changes.relay[0] \"k1\".options",
                18,
            ),
        ] {
            let e = one_error(&format!("{ENTITIES}{}", TWO.replace(from, to)));
            assert_eq!(e.field, field, "{e}");
            assert_eq!(e.line, Some(line), "{e}");
        }
    }

    #[test]
    fn unknown_types_values_and_fields_are_rejected_with_line() {
        for (from, to, needle, field, line) in [
            (
                "type = \"nats\"",
                "type = \"redis\"",
                "redis",
                "changes.relay.type",
                21,
            ),
            (
                "format = \"debezium\"",
                "format = \"avro\"",
                "avro",
                "changes.relay.format",
                17,
            ),
            (
                "url = \"nats",
                "colour = \"red\"\nurl = \"nats",
                "colour",
                "changes.relay",
                23,
            ),
            (
                "\"linger.ms\" = 20",
                "\"linger.ms\" = [1]",
                "",
                "changes.relay.options.linger.ms",
                18,
            ),
        ] {
            let e = one_error(&format!("{ENTITIES}{}", TWO.replace(from, to)));
            assert!(e.message.contains(needle), "{e}");
            assert_eq!(e.field, field, "{e}");
            assert_eq!(e.line, Some(line), "{e}");
        }
    }

    #[test]
    fn fields_of_the_other_type_and_missing_fields_are_named() {
        let e = one_error(&format!(
            "{ENTITIES}{}",
            TWO.replace(
                "url = \"nats://127.0.0.1:4222\"",
                "url = \"nats://h:1\"\nformat = \"meshql\""
            )
        ));
        assert_eq!(e.field, "changes.relay[1] \"n1\".format", "{e}");
        assert!(e.message.contains("kafka"), "{e}");
        assert_eq!(e.line, Some(24), "{e}");
        let e = one_error(&format!(
            "{ENTITIES}{}",
            TWO.replace("brokers = \"127.0.0.1:9092\"\n", "")
        ));
        assert_eq!(e.field, "changes.relay[0] \"k1\".brokers", "{e}");
        assert_eq!(e.line, Some(12), "{e}");
    }

    #[test]
    fn topics_must_be_valid_kafka_names() {
        let e = one_error(&format!(
            "{ENTITIES}{}",
            TWO.replace(
                "[[changes.relay]]\ntype",
                "[[changes.relay]]\ntopic_prefix = \"a b.\"\ntype"
            )
            .replace("type = \"nats\"", "type = \"kafka\"\nbrokers = \"h:1\"")
            .replace("url = \"nats://127.0.0.1:4222\"", "")
        ));
        assert_eq!(e.field, "changes.relay[1] \"n1\".topic_prefix", "{e}");
        assert_eq!(e.line, Some(21), "{e}");
        let long = "c".repeat(250);
        let errs = load(&format!(
            "{}{TWO}",
            ENTITIES.replace("\"coops\"", &format!("\"{long}\""))
        ))
        .expect_err("rejected")
        .0;
        let e = errs
            .iter()
            .find(|e| e.field.starts_with("changes.relay"))
            .unwrap_or_else(|| panic!("{errs:?}"));
        assert_eq!(e.field, "changes.relay[0] \"k1\".topic_naming", "{e}");
        assert!(e.message.contains("at most 249"), "{e}");
        assert_eq!(e.line, Some(15), "{e}");
    }
}
