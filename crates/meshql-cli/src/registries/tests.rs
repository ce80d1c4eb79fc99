//! The checks `meshql check` and `serve` run, with every backend and relay of this build.

use super::registries;
use meshql_config::ResolvedConfig;

fn preflight(config: &ResolvedConfig) -> Vec<String> {
    meshql_server::preflight(config, registries())
}

#[test]
fn invalid_json_schemas_and_sql_on_memory_are_found() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.json"), r#"{"type": "objekt"}"#).unwrap();
    std::fs::write(
        dir.path().join("t.graphql"),
        "type Query { all: [T] } type T { id: ID }",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("meshql.toml"),
        "cors_origin = \"a\\u0001b\"\n[storage.m]\ntype = \"memory\"\n[[entity]]\nname = \"t\"\nstorage = \"m\"\n[entity.rest]\nschema = \"s.json\"\n[entity.graphql]\nschema = \"t.graphql\"\n[[entity.graphql.vectors]]\nname = \"all\"\nsql = \"1 = 1\"\n",
    )
    .unwrap();
    let config = meshql_config::load(dir.path()).expect("the config itself is valid");
    let problems = preflight(&config);
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(problems[0].contains("cors_origin"));
    assert!(problems[1].contains("s.json"));
    assert!(problems[2].contains("SQL fragments need a SQL storage"));
}

fn config_with_storage(block: &str) -> (tempfile::TempDir, ResolvedConfig) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("meshql.toml"),
        format!(
            "[storage.x]\n{block}\n\n[[entity]]\nname = \"t\"\nstorage = \"x\"\n[entity.rest]\n"
        ),
    )
    .unwrap();
    let config = meshql_config::load(dir.path()).expect("the config itself is valid");
    (dir, config)
}

#[test]
fn an_unknown_storage_type_is_named_with_the_known_ones() {
    let (_dir, config) = config_with_storage("type = \"cassandra\"\nfile = \"a\"");
    let problems = preflight(&config);
    assert_eq!(problems.len(), 1, "{problems:#?}");
    let p = &problems[0];
    assert!(p.contains("meshql.toml:2: storage.x.type:"), "{p}");
    assert!(p.contains("`cassandra`"), "{p}");
    assert!(p.contains("sqlite, memory, postgres, mysql, mongo"), "{p}");
}

#[test]
fn each_backend_checks_its_own_fields() {
    for (block, field, words) in [
        (
            "type = \"postgres\"\nurl = \"postgres://h/db\"\npool_size = 0",
            "storage.x.pool_size",
            "at least 1",
        ),
        (
            "type = \"mysql\"\nurl = \"mysql://u:p@h/db\"\npool_size = 0",
            "storage.x.pool_size",
            "at least 1",
        ),
        (
            "type = \"mongo\"\nuri = \"mongodb://h/\"\ndb = \"d\"\npool_size = 0",
            "storage.x.pool_size",
            "at least 1",
        ),
        (
            "type = \"postgres\"\nurl = \"postgres://h/db\"\npool_size = \"many\"",
            "storage.x.pool_size",
            "invalid type",
        ),
        (
            "type = \"sqlite\"\nfile = \"a.db\"\nfsync = true",
            "storage.x.fsync",
            "unknown field `fsync`",
        ),
        ("type = \"sqlite\"", "storage.x", "missing field `file`"),
        (
            "type = \"memory\"\nfile = \"a\"",
            "storage.x.file",
            "applies to `type = \"sqlite\"` and `type = \"kafka\"` storage blocks only",
        ),
    ] {
        let (_dir, config) = config_with_storage(block);
        let problems = preflight(&config);
        assert_eq!(problems.len(), 1, "{block}: {problems:#?}");
        let p = &problems[0];
        // the field's own line when it names one, else the block's
        let line = block
            .lines()
            .position(|l| field.ends_with(l.split(' ').next().unwrap()))
            .map_or(1, |i| i + 2);
        assert!(
            p.contains(&format!("meshql.toml:{line}: {field}: ")),
            "{block}: {p}"
        );
        assert!(p.contains(words), "{block}: {p}");
    }
}

#[test]
fn relative_sqlite_files_resolve_under_the_data_dir() {
    let (dir, mut config) = config_with_storage("type = \"sqlite\"\nfile = \"sub/a.db\"");
    config.set_data_dir(dir.path().join("elsewhere"));
    let targets = meshql_runtime::storage_targets(&config, &registries().storage).unwrap();
    let target = targets["x"].target();
    assert!(target.ends_with("elsewhere/sub/a.db"), "{target}");
}

#[test]
fn sql_templates_are_refused_on_mongo_too() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("t.graphql"),
        "type Query { all: [T] } type T { id: ID }",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("meshql.toml"),
        "[storage.m]\ntype = \"mongo\"\nuri = \"mongodb://h/\"\ndb = \"d\"\n[[entity]]\nname = \"t\"\nstorage = \"m\"\n[entity.graphql]\nschema = \"t.graphql\"\n[[entity.graphql.vectors]]\nname = \"all\"\nsql = \"1 = 1\"\n",
    )
    .unwrap();
    let config = meshql_config::load(dir.path()).unwrap();
    let problems = preflight(&config);
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert!(
        problems[0].contains("storage `m` is mongo"),
        "{}",
        problems[0]
    );
}

// nine lines, as the line numbers of the relay tests below expect
const ENTITIES: &str = "entity = [\n  { name = \"hen\", rest = {} },\n  { name = \"coop\", table = \"coops\", rest = {} },\n]\n\n\n\n[storage.default]\ntype = \"memory\"\n";

// a Kafka relay on lines 11-18, a NATS relay on lines 20-23
const TWO: &str = r#"
[[changes.relay]]
name = "k1"
type = "kafka"
brokers = "127.0.0.1:9092"
topic_naming = "debezium"
db = "eggs_development"
format = "debezium"
options = { "linger.ms" = 20, "compression.type" = "snappy" }

[[changes.relay]]
type = "nats"
name = "n1"
url = "nats://127.0.0.1:4222"
"#;

fn relay_problems(toml: &str) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("meshql.toml"), toml).unwrap();
    let config = meshql_config::load(dir.path()).expect("the config itself is valid");
    preflight(&config)
}

#[test]
fn valid_relays_pass() {
    let problems = relay_problems(&format!("{ENTITIES}{TWO}"));
    assert!(problems.is_empty(), "{problems:#?}");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("meshql.toml"), format!("{ENTITIES}{TWO}")).unwrap();
    let config = meshql_config::load(dir.path()).unwrap();
    let targets = meshql_runtime::relay_targets(&config, &registries().relays).unwrap();
    let names: Vec<&str> = targets.iter().map(|(s, _)| s.name.as_str()).collect();
    assert_eq!(names, ["k1", "n1"]);
}

#[test]
fn each_relay_checks_its_own_fields() {
    for (from, to, field, line, words) in [
        (
            "url = \"nats://127.0.0.1:4222\"",
            "url = \"nats://h:1\"\nsubject_prefix = \"a.*\"",
            "changes.relay[1] \"n1\".subject_prefix",
            24,
            "`a.*` is not a NATS subject",
        ),
        (
            "url = \"nats://127.0.0.1:4222\"",
            "url = \"nats://h:1\"\nstream = \"A.B\"",
            "changes.relay[1] \"n1\".stream",
            24,
            "`A.B` is not a JetStream stream name",
        ),
        (
            "url = \"nats://127.0.0.1:4222\"",
            "url = \"nats://h:1\"\nduplicate_window_secs = 0",
            "changes.relay[1] \"n1\".duplicate_window_secs",
            24,
            "at least 1",
        ),
        (
            "db = \"eggs_development\"",
            "db = \"eggs development\"",
            "changes.relay[0] \"k1\".db",
            16,
            "Kafka topic names use only",
        ),
        (
            "options = {",
            "options = { \"bootstrap.servers\" = \"x:1\",",
            "changes.relay[0] \"k1\".options",
            18,
            "`bootstrap.servers` is set by `brokers`",
        ),
        // unknown types, values and fields
        (
            "type = \"nats\"",
            "type = \"redis\"",
            "changes.relay[1] \"n1\".type",
            21,
            "unknown relay type `redis` (this build has: kafka, nats, jsonl)",
        ),
        (
            "format = \"debezium\"",
            "format = \"avro\"",
            "changes.relay[0] \"k1\".format",
            17,
            "unknown variant `avro`",
        ),
        (
            "url = \"nats",
            "colour = \"red\"\nurl = \"nats",
            "changes.relay[1] \"n1\".colour",
            23,
            "unknown field `colour`",
        ),
        (
            "\"linger.ms\" = 20",
            "\"linger.ms\" = [1]",
            "changes.relay[0] \"k1\".options.linger.ms",
            18,
            "",
        ),
        (
            "brokers = \"127.0.0.1:9092\"",
            "brokers = 9092",
            "changes.relay[0] \"k1\".brokers",
            14,
            "invalid type",
        ),
        // fields of the other type, and missing fields (on the entry's line)
        (
            "url = \"nats://127.0.0.1:4222\"",
            "url = \"nats://h:1\"\nformat = \"meshql\"",
            "changes.relay[1] \"n1\".format",
            24,
            "applies to `type = \"kafka\"` relays only",
        ),
        (
            "brokers = \"127.0.0.1:9092\"\n",
            "",
            "changes.relay[0] \"k1\".brokers",
            11,
            "a kafka relay needs `brokers = \"host:port\"`",
        ),
        (
            "url = \"nats://127.0.0.1:4222\"\n",
            "",
            "changes.relay[1] \"n1\".url",
            20,
            "a nats relay needs `url = \"nats://host:port\"`",
        ),
        (
            "url = \"nats://127.0.0.1:4222\"",
            "url = \" \"",
            "changes.relay[1] \"n1\".url",
            23,
            "name the server",
        ),
    ] {
        let problems = relay_problems(&format!("{ENTITIES}{}", TWO.replace(from, to)));
        assert_eq!(problems.len(), 1, "{to}: {problems:#?}");
        let p = &problems[0];
        assert!(
            p.contains(&format!("meshql.toml:{line}: {field}: ")),
            "{to}: {p}"
        );
        assert!(p.contains(words), "{to}: {p}");
    }
}

#[test]
fn every_relay_s_problem_is_reported() {
    let problems = relay_problems(&format!(
        "{ENTITIES}{}",
        TWO.replace("db = \"eggs_development\"", "db = \"\"")
            .replace("url = \"nats://127.0.0.1:4222\"", "url = 4222")
    ));
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(problems[0].contains(":16: changes.relay[0] \"k1\".db: "));
    assert!(problems[1].contains(":23: changes.relay[1] \"n1\".url: "));
}

#[test]
fn topics_must_be_valid_kafka_names() {
    // a prefix that is not a topic name, on the prefix's line
    let problems = relay_problems(&format!(
        "{ENTITIES}{}",
        TWO.replace(
            "[[changes.relay]]\ntype",
            "[[changes.relay]]\ntopic_prefix = \"a b.\"\ntype"
        )
        .replace("type = \"nats\"", "type = \"kafka\"\nbrokers = \"h:1\"")
        .replace("url = \"nats://127.0.0.1:4222\"", "")
    ));
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert!(
        problems[0].contains("meshql.toml:21: changes.relay[1] \"n1\".topic_prefix: `a b.`"),
        "{}",
        problems[0]
    );
    // a table too long for a Debezium topic name, on `topic_naming`'s line
    let long = "c".repeat(250);
    let problems = relay_problems(&format!(
        "{}{TWO}",
        ENTITIES.replace("\"coops\"", &format!("\"{long}\""))
    ));
    assert_eq!(problems.len(), 1, "{problems:#?}");
    let p = &problems[0];
    assert!(
        p.contains("meshql.toml:15: changes.relay[0] \"k1\".topic_naming: entity \"coop\""),
        "{p}"
    );
    assert!(p.contains("at most 249"), "{p}");
}
