//! The `meshql` command line: `check`, `serve` on a broken config, `config-schema`, what
//! `serve` tells (colour, the port relationships follow), `projections` without a server.

mod common;

use common::{example_copy, examples_dir, free_port, gql, run_meshql, Server};
use serde_json::Value;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(30);

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn check(config: &Path) -> Output {
    run_meshql(&["check", config.to_str().expect("UTF-8 path")], TIMEOUT)
}

/// The 1-based line of the first line of `text` containing `needle`.
fn line_containing(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line contains {needle:?}"))
        + 1
}

/// Replaces the first occurrence of `from` (which must exist).
fn replace_first(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "the example has no {from:?}");
    text.replacen(from, to, 1)
}

/// Asserts that `meshql check` rejects `dir`'s config and that stderr names the config file
/// at `line`, and contains every one of `mentions` (the field, the bad value, ...).
#[track_caller]
fn assert_rejected(dir: &Path, line: usize, mentions: &[&str]) -> String {
    let out = check(dir);
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success(),
        "check accepted a broken config; stdout: {}",
        text(&out.stdout)
    );
    assert!(!text(&out.stdout).contains(": ok"), "{}", text(&out.stdout));
    let at = format!("{}:{line}:", dir.join("meshql.toml").display());
    assert!(stderr.contains(&at), "expected {at:?} in stderr:\n{stderr}");
    for m in mentions {
        assert!(stderr.contains(m), "expected {m:?} in stderr:\n{stderr}");
    }
    assert!(stderr.contains("error(s)"), "{stderr}");
    stderr
}

#[test]
fn check_accepts_the_egg_economy_example() {
    let out = check(&examples_dir().join("egg-economy"));
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("13 entities, 19 resolvers"), "{stdout}");
    assert!(stdout.contains("meshql.toml: ok"), "{stdout}");
}

#[test]
fn check_accepts_the_farm_example_by_dir_and_by_file() {
    let out = check(&examples_dir().join("farm"));
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("4 entities"),
        "{}",
        text(&out.stdout)
    );
    let out = check(&examples_dir().join("farm/meshql.toml"));
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
}

#[test]
fn check_accepts_the_farm_cqrs_example() {
    let out = check(&examples_dir().join("farm-cqrs"));
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("3 entities"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn check_rejects_a_missing_config() {
    let dir = tempfile::tempdir().unwrap();
    let out = check(dir.path());
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("meshql.toml"), "{stderr}");
    assert!(stderr.contains("cannot read config"), "{stderr}");
}

#[test]
fn check_names_an_unknown_field() {
    let mut line = 0;
    let dir = example_copy("egg-economy", |t| {
        let t = replace_first(&t, "\nport = ", "\nbogus_field = 1\nport = ");
        line = line_containing(&t, "bogus_field");
        t
    });
    assert_rejected(dir.path(), line, &["unknown field `bogus_field`"]);
}

#[test]
fn check_names_an_unknown_storage_type() {
    let mut line = 0;
    let dir = example_copy("egg-economy", |t| {
        let t = replace_first(&t, "type = \"sqlite\"", "type = \"cassandra\"");
        line = line_containing(&t, "cassandra");
        t
    });
    assert_rejected(dir.path(), line, &["storage.actors.type", "`cassandra`"]);
}

/// The egg-economy example with a NATS relay whose `field = value` line is `bad`.
fn with_a_relay(bad: &str, line: &mut usize) -> tempfile::TempDir {
    example_copy("egg-economy", |t| {
        let relay = format!(
            "\n[[changes.relay]]\nname = \"eggs\"\ntype = \"nats\"\nurl = \"nats://127.0.0.1:4222\"\n{bad}\n"
        );
        let t = replace_first(
            &t,
            "enabled = ${MESHQL_CHANGES:-true}\n",
            &format!("enabled = ${{MESHQL_CHANGES:-true}}\n{relay}"),
        );
        *line = line_containing(&t, bad);
        t
    })
}

#[test]
fn check_names_a_relay_field_of_its_type() {
    let mut line = 0;
    let dir = with_a_relay("stream = \"A.B\"", &mut line);
    assert_rejected(
        dir.path(),
        line,
        &[
            "changes.relay[0] \"eggs\".stream",
            "not a JetStream stream name",
        ],
    );
    // a field of the other type says so
    let dir = with_a_relay("topic_naming = \"debezium\"", &mut line);
    assert_rejected(
        dir.path(),
        line,
        &[
            "changes.relay[0] \"eggs\".topic_naming",
            "applies to `type = \"kafka\"` relays only",
        ],
    );
}

#[test]
fn check_names_an_unknown_relay_type() {
    let mut line = 0;
    let dir = example_copy("egg-economy", |t| {
        let t = replace_first(
            &t,
            "enabled = ${MESHQL_CHANGES:-true}\n",
            "enabled = ${MESHQL_CHANGES:-true}\n\n[[changes.relay]]\nname = \"eggs\"\ntype = \"redis\"\n",
        );
        line = line_containing(&t, "redis");
        t
    });
    assert_rejected(
        dir.path(),
        line,
        &[
            "changes.relay[0] \"eggs\".type",
            "unknown relay type `redis` (this build has: kafka, nats, jsonl)",
        ],
    );
}

#[test]
fn check_names_a_missing_sdl_file() {
    let dir = example_copy("egg-economy", |t| t);
    std::fs::remove_file(dir.path().join("graph/hen.graphql")).unwrap();
    let toml = std::fs::read_to_string(dir.path().join("meshql.toml")).unwrap();
    let line = line_containing(&toml, "schema = \"graph/hen.graphql\"");
    assert_rejected(
        dir.path(),
        line,
        &["entity[2] \"hen\".graphql.schema", "graph/hen.graphql"],
    );
}

#[test]
fn check_names_a_missing_json_schema_file() {
    let dir = example_copy("egg-economy", |t| t);
    std::fs::remove_file(dir.path().join("schema/coop.schema.json")).unwrap();
    let toml = std::fs::read_to_string(dir.path().join("meshql.toml")).unwrap();
    let line = line_containing(&toml, "schema = \"schema/coop.schema.json\"");
    assert_rejected(
        dir.path(),
        line,
        &["entity[1] \"coop\".rest.schema", "schema/coop.schema.json"],
    );
}

#[test]
fn check_names_a_resolver_to_a_missing_graph_path() {
    let mut line = 0;
    let dir = example_copy("egg-economy", |t| {
        // the first in-process resolver is farm's `coops`
        let t = replace_first(&t, "graph = \"/coop/graph\"", "graph = \"/nowhere/graph\"");
        line = line_containing(&t, "/nowhere/graph");
        t
    });
    assert_rejected(
        dir.path(),
        line,
        &[
            "entity[0] \"farm\".graphql.resolvers[0].graph",
            "/nowhere/graph",
        ],
    );
}

#[test]
fn check_names_a_template_placeholder_that_is_not_an_argument() {
    let mut line = 0;
    let dir = example_copy("egg-economy", |t| {
        let t = replace_first(&t, "{{zone}}", "{{region}}");
        line = line_containing(&t, "{{region}}");
        t
    });
    assert_rejected(
        dir.path(),
        line,
        &["entity[0] \"farm\".graphql.vectors[1].query", "region"],
    );
}

#[test]
fn check_names_the_sdl_file_and_line_of_an_sdl_error() {
    let dir = example_copy("egg-economy", |t| t);
    let sdl = dir.path().join("graph/farm.graphql");
    let text_before = std::fs::read_to_string(&sdl).unwrap();
    let broken = replace_first(&text_before, "  zone: String!\n", "  zone: Strung!\n");
    std::fs::write(&sdl, &broken).unwrap();
    let line = line_containing(&broken, "Strung");
    let out = check(dir.path());
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    let at = format!("{}:{line}:", sdl.display());
    assert!(stderr.contains(&at), "expected {at:?} in:\n{stderr}");
    assert!(stderr.contains("Strung"), "{stderr}");
    assert!(
        stderr.contains("entity[0] \"farm\".graphql.schema"),
        "{stderr}"
    );
}

#[test]
fn serve_refuses_a_broken_config() {
    let mut line = 0;
    let dir = example_copy("egg-economy", |t| {
        let t = replace_first(&t, "{{zone}}", "{{region}}");
        line = line_containing(&t, "{{region}}");
        t
    });
    let data = dir.path().join("never-created");
    let port = free_port().to_string();
    let out = run_meshql(
        &[
            "serve",
            dir.path().to_str().unwrap(),
            "--port",
            &port,
            "--data-dir",
            data.to_str().unwrap(),
            "--log-level",
            "warn",
        ],
        TIMEOUT,
    );
    assert!(!out.status.success(), "serve exited with {}", out.status);
    let stderr = text(&out.stderr);
    let at = format!("{}:{line}:", dir.path().join("meshql.toml").display());
    assert!(stderr.contains(&at), "expected {at:?} in:\n{stderr}");
    assert!(stderr.contains("region"), "{stderr}");
    assert!(
        !data.exists(),
        "serve created its data dir from a broken config"
    );
}

#[test]
fn serve_refuses_a_relay_with_a_bad_field() {
    let mut line = 0;
    let dir = with_a_relay("duplicate_window_secs = 0", &mut line);
    let data = dir.path().join("never-created");
    let port = free_port().to_string();
    let out = run_meshql(
        &[
            "serve",
            dir.path().to_str().unwrap(),
            "--port",
            &port,
            "--data-dir",
            data.to_str().unwrap(),
            "--log-level",
            "warn",
        ],
        TIMEOUT,
    );
    assert!(!out.status.success(), "serve exited with {}", out.status);
    let stderr = text(&out.stderr);
    let at = format!(
        "{}:{line}: changes.relay[0] \"eggs\".duplicate_window_secs: must be at least 1",
        dir.path().join("meshql.toml").display()
    );
    assert!(stderr.contains(&at), "expected {at:?} in:\n{stderr}");
}

#[test]
fn config_schema_is_json_describing_entities() {
    let out = run_meshql(&["config-schema"], TIMEOUT);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let schema: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&out.stdout)));
    assert!(schema.is_object());
    assert!(text(&out.stdout).contains("entity"));
    assert!(schema["properties"]["entity"].is_object(), "{schema}");
    assert!(schema["properties"]["body_limit_bytes"].is_object());
    // one alternative per registered storage backend, with its own fields
    let kinds: Vec<&str> = schema["$defs"]["StorageConfig"]["oneOf"]
        .as_array()
        .expect("storage alternatives")
        .iter()
        .map(|b| b["properties"]["type"]["const"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["sqlite", "memory", "postgres", "mysql", "mongo", "kafka"]
    );
    assert!(schema["$defs"]["StorageConfig"]["oneOf"][2]["properties"]["pool_size"].is_object());
    let kafka = &schema["$defs"]["StorageConfig"]["oneOf"][5]["properties"];
    assert!(kafka["brokers"]["description"].is_string(), "{kafka}");
    assert!(kafka["write_timeout_ms"].is_object(), "{kafka}");
    // one alternative per registered relay type: the fields every relay has, then its own
    let relays = schema["$defs"]["RelayConfig"]["oneOf"]
        .as_array()
        .expect("relay alternatives");
    let kinds: Vec<&str> = relays
        .iter()
        .map(|r| r["properties"]["type"]["const"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["kafka", "nats", "jsonl"]);
    for r in relays {
        assert!(r["properties"]["name"].is_object(), "{r}");
        assert!(r["properties"]["batch"].is_object(), "{r}");
    }
    assert!(relays[0]["properties"]["brokers"]["description"].is_string());
    assert!(relays[1]["properties"]["stream"]["description"].is_string());
    assert!(
        schema["$defs"]["TopicNaming"].is_object(),
        "the definitions a relay's fields refer to are kept"
    );
}

/// The line and the `entity[..].graphql.vectors[..]` field of logistics' getByRecipient.
const RECIPIENT_TEMPLATE: &str =
    r#"query = '{"payload.recipient": {"$regex": "{{recipient}}", "$options": "i"}}'"#;
const RECIPIENT_FIELD: &str = "entity[2] \"package\".graphql.vectors[";

#[test]
fn check_names_an_unsupported_query_operator() {
    for (replacement, mentions) in [
        (
            r#"query = '{"$where": "this.recipient == 1"}'"#,
            &["unsupported operator `$where`"][..],
        ),
        (
            r#"query = '{"payload.recipient": {"$text": {"$search": "{{recipient}}"}}}'"#,
            &["unsupported operator `$text`", "payload.recipient"][..],
        ),
        (
            r#"query = '{"payload.recipient": {"$regex": "{{recipient}}", "$options": "s"}}'"#,
            &["$options", "payload.recipient"][..],
        ),
        (
            r#"query = '{"payload.recipient": {"$in": 3}}'"#,
            &["bad operand of `$in`", "payload.recipient"][..],
        ),
        (
            r#"query = '{"payload.recipient": {"$regex": "\\d+"}}'"#,
            &["regular expression"][..],
        ),
    ] {
        let mut line = 0;
        let dir = example_copy("logistics", |t| {
            let t = replace_first(&t, RECIPIENT_TEMPLATE, replacement);
            line = line_containing(&t, replacement);
            t
        });
        let stderr = assert_rejected(dir.path(), line, mentions);
        assert!(stderr.contains(RECIPIENT_FIELD), "{stderr}");
        assert!(stderr.contains("].query"), "{stderr}");
    }
}

#[test]
fn check_names_a_bad_sort() {
    let mut line = 0;
    let dir = example_copy("logistics", |t| {
        let t = replace_first(
            &t,
            RECIPIENT_TEMPLATE,
            &format!("{RECIPIENT_TEMPLATE}\nsort = '{{\"payload.weight\": \"desc\"}}'"),
        );
        line = line_containing(&t, "\"desc\"");
        t
    });
    let stderr = assert_rejected(dir.path(), line, &["bad sort", "1 or -1"]);
    assert!(stderr.contains("].sort"), "{stderr}");
}

/// A root query the SDL declares but no template answers would answer `null` with no error:
/// `check` refuses it, naming the SDL file and line and what to add.
#[test]
fn check_refuses_a_root_query_bound_to_no_template() {
    let dir = example_copy("farm", |t| t);
    let sdl = dir.path().join("graph/farm.graphql");
    let sdl_text = std::fs::read_to_string(&sdl).unwrap();
    std::fs::write(
        &sdl,
        replace_first(
            &sdl_text,
            "  getAll(at: Float, limit: Int): [Farm]\n",
            "  getAll(at: Float, limit: Int): [Farm]\n  getByZone(zone: String, at: Float): [Farm]\n",
        ),
    )
    .unwrap();
    let out = check(dir.path());
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("{}:6:", sdl.display()))
            && stderr.contains("`getByZone` is declared in the SDL but bound to no template")
            && stderr.contains("[[entity.graphql.vectors]]"),
        "{stderr}"
    );
}

/// Log lines carry colour codes only when asked (or when they go to a terminal, which a
/// test's file is not).
#[test]
fn serve_colours_its_log_only_when_asked() {
    let farm = examples_dir().join("farm");
    let plain = Server::start(&farm, &["--log-level", "info"]);
    let log = plain.log();
    assert!(log.contains("meshql serving"), "{log}");
    assert!(!log.contains('\x1b'), "colour codes in a log file: {log:?}");
    drop(plain);
    let coloured = Server::start(&farm, &["--log-level", "info", "--color", "always"]);
    assert!(coloured.log().contains("\x1b["), "{:?}", coloured.log());
    drop(coloured);
    let out = run_meshql(&["serve", "--color", "sometimes"], TIMEOUT);
    let stderr = text(&out.stderr);
    assert!(!out.status.success() && stderr.contains("auto"), "{stderr}");
}

/// examples/farm reaches its graphlettes over HTTP at `PLATFORM_URL`, by default this
/// service at the config's port. Served on another port, those URLs follow it: the
/// relationships answer, and the log says where they now point.
#[tokio::test]
async fn farm_relationships_follow_the_port_it_is_served_on() {
    assert!(
        std::env::var_os("PLATFORM_URL").is_none(),
        "the test needs the default"
    );
    let s = Server::start(&examples_dir().join("farm"), &["--log-level", "info"]);
    assert_ne!(s.port(), 3033);
    let c = s.client();
    let farm = c
        .post_json("/farm/api", &serde_json::json!({"name": "Emerdale"}))
        .await
        .json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    c.post_json(
        "/coop/api",
        &serde_json::json!({"name": "red", "farm_id": farm}),
    )
    .await
    .expect_status(201);
    let data = gql(
        &s,
        "/farm/graph",
        &format!(r#"{{ getById(id: "{farm}") {{ coops {{ name }} }} }}"#),
    )
    .await;
    assert_eq!(
        data,
        serde_json::json!({"getById": {"coops": [{"name": "red"}]}})
    );
    let log = s.log();
    assert!(
        log.contains(&format!(
            "http://localhost:3033/coop/graph is now http://localhost:{}/coop/graph",
            s.port()
        )),
        "{log}"
    );
}

/// `projections rebuild` with no server where the config says: the URL it tried and how to
/// point it elsewhere.
#[test]
fn projections_rebuild_without_a_server_says_where_it_looked() {
    let port = free_port();
    let dir = example_copy("egg-economy", |t| {
        replace_first(&t, "port = ${PORT:-5088}", &format!("port = {port}"))
    });
    let out = run_meshql(
        &[
            "projections",
            "rebuild",
            "farm_output",
            dir.path().to_str().unwrap(),
        ],
        TIMEOUT,
    );
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "no meshql server answers at http://127.0.0.1:{port}"
        )) && stderr.contains("--url http://HOST:PORT"),
        "{stderr}"
    );
    // a URL given: named as given
    let url = format!("http://127.0.0.1:{}", free_port());
    let out = run_meshql(
        &["projections", "rebuild", "farm_output", "--url", &url],
        TIMEOUT,
    );
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("no meshql server answers at {url} (--url)")),
        "{stderr}"
    );
}

/// Output read through a pipe that closes early (`| head`) ends the command quietly, as it
/// ends `cat`: no panic about a broken pipe.
#[test]
fn a_pipe_closed_early_ends_the_output_quietly() {
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "{} config-schema | head -c 20 >/dev/null; echo \"status ${{PIPESTATUS[0]}}\"",
            common::meshql_bin()
        ))
        .output()
        .expect("bash");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(!stderr.contains("panicked"), "{stderr}");
    // 141: ended by SIGPIPE, as a shell expects of a pipeline's writer (0 if it wrote
    // everything before `head` closed the pipe)
    assert!(
        stdout.contains("status 141") || stdout.contains("status 0"),
        "{stdout}"
    );
}
