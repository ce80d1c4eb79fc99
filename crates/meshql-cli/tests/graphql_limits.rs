//! What one GraphQL request may cost, through the binary: the amplification attacks of
//! issue 11 (thousands of aliased relationships, relationship cycles, results that multiply
//! as they are written, a relationship that never answers) are refused quickly with a coded
//! error, memory stays bounded, and ordinary requests go on being answered.

mod common;

use common::{run_meshql, Server};
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

const COOP_SDL: &str = r#"
type Query {
  getById(id: ID, at: Float): Coop
  getAll(at: Float, limit: Int): [Coop]
}
type Coop { id: ID name: String! hens: [Hen] remote: [Hen] }
type Hen { id: ID name: String! coop_id: ID coop: Coop }
"#;

const HEN_SDL: &str = r#"
type Query {
  getById(id: ID, at: Float): Hen
  getByCoop(id: ID, at: Float): [Hen]
}
type Hen { id: ID name: String! coop_id: ID coop: Coop }
type Coop { id: ID name: String! hens: [Hen] }
"#;

/// Coops and hens with in-process resolvers both ways (a cycle), plus `remote`: a
/// relationship over HTTP to `silent`, a listener that never answers.
fn config(silent: &str, graphql: &str) -> String {
    format!(
        r#"{graphql}

[[entity]]
name = "coop"
[entity.rest]
path = "/coop/api"
[entity.graphql]
path = "/coop/graph"
schema = "coop.graphql"
[[entity.graphql.singletons]]
name = "getById"
query = '{{"id": "{{{{id}}}}"}}'
[[entity.graphql.vectors]]
name = "getAll"
query = '{{}}'
[[entity.graphql.resolvers]]
name = "hens"
query = "getByCoop"
graph = "/hen/graph"
[[entity.graphql.resolvers]]
name = "remote"
query = "getByCoop"
url = "http://{silent}/hen/graph"

[[entity]]
name = "hen"
[entity.rest]
path = "/hen/api"
[entity.graphql]
path = "/hen/graph"
schema = "hen.graphql"
[[entity.graphql.singletons]]
name = "getById"
query = '{{"id": "{{{{id}}}}"}}'
[[entity.graphql.vectors]]
name = "getByCoop"
query = '{{"payload.coop_id": "{{{{id}}}}"}}'
[[entity.graphql.resolvers]]
name = "coop"
key = "coop_id"
query = "getById"
graph = "/coop/graph"
"#
    )
}

fn write_service(dir: &Path, silent: &str, graphql: &str) -> std::path::PathBuf {
    std::fs::write(dir.join("coop.graphql"), COOP_SDL).unwrap();
    std::fs::write(dir.join("hen.graphql"), HEN_SDL).unwrap();
    let file = dir.join("meshql.toml");
    std::fs::write(&file, config(silent, graphql)).unwrap();
    file
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

async fn graphql(server: &Server, path: &str, query: &str) -> (Value, Duration) {
    let started = Instant::now();
    let r = server
        .client()
        .post_json(path, &json!({ "query": query }))
        .await;
    r.expect_status(200);
    (r.json(), started.elapsed())
}

/// `hens { coop { hens { … { name } } } }`, `levels` relationships deep, from a coop.
fn cycle(levels: usize) -> String {
    let mut text = "name".to_owned();
    for level in (0..levels).rev() {
        let field = if level % 2 == 0 { "hens" } else { "coop" };
        text = format!("{field} {{ {text} }}");
    }
    text
}

fn code(r: &Value) -> &str {
    assert!(
        r.get("data").is_none_or(Value::is_null),
        "refused requests carry no data: {r}"
    );
    r["errors"][0]["extensions"]["code"].as_str().unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amplifying_queries_are_refused_and_the_server_stays_small_and_responsive() {
    // a listener that accepts and never answers (the relationship `remote` points at it)
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let file = write_service(
        dir.path(),
        &silent_addr,
        "[graphql]\nmax_objects = 1000\ntimeout_ms = 1000\n",
    );
    let server = Server::start(&file, &[]);
    let client = server.client();
    // one coop with five hens
    let coop = client
        .post_json("/coop/api", &json!({"name": "red"}))
        .await
        .json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    for i in 0..5 {
        client
            .post_json(
                "/hen/api",
                &json!({"name": format!("h{i}"), "coop_id": coop}),
            )
            .await
            .expect_status(201);
    }
    let ordinary = format!(r#"{{ getById(id: "{coop}") {{ name hens {{ name }} }} }}"#);
    let (ok, _) = graphql(&server, "/coop/graph", &ordinary).await;
    assert_eq!(
        ok["data"]["getById"]["hens"].as_array().unwrap().len(),
        5,
        "{ok}"
    );
    let before = rss_kib(server.pid());

    // 3,000 aliases of a relationship under one root (issue 11: +2.8 GiB, 12 s)
    let aliases: String = (0..3000)
        .map(|i| format!(" h{i}: hens {{ coop {{ name }} }}"))
        .collect();
    let (r, took) = graphql(
        &server,
        "/coop/graph",
        &format!("{{ getAll {{ name{aliases} }} }}"),
    )
    .await;
    assert_eq!(code(&r), "QUERY_TOO_COMPLEX", "{r}");
    eprintln!("3,000 aliased relationships: refused in {took:?}");

    // a relationship cycle twelve levels deep (issue 11: 6.8 GB after 68 s)
    let (r, took) = graphql(
        &server,
        "/coop/graph",
        &format!(r#"{{ getById(id: "{coop}") {{ {} }} }}"#, cycle(12)),
    )
    .await;
    assert_eq!(code(&r), "QUERY_TOO_COMPLEX", "{r}");
    eprintln!("twelve-level cycle: refused in {took:?}");

    // within the relationship depth limit (8), a cycle whose result multiplies as it is
    // written: 5 hens, 5 coops, 25 hens, … 625 coops: 1,560 objects, over max_objects
    let (r, took) = graphql(
        &server,
        "/coop/graph",
        &format!(r#"{{ getById(id: "{coop}") {{ {} }} }}"#, cycle(8)),
    )
    .await;
    assert_eq!(code(&r), "RESPONSE_TOO_LARGE", "{r}");
    eprintln!("multiplying cycle: refused in {took:?}");

    // a relationship whose service never answers: the request ends at timeout_ms
    let (r, took) = graphql(
        &server,
        "/coop/graph",
        &format!(r#"{{ getById(id: "{coop}") {{ name remote {{ name }} }} }}"#),
    )
    .await;
    assert_eq!(code(&r), "TIMEOUT", "{r}");
    eprintln!("silent relationship: timed out after {took:?}");

    // attackers looping while an ordinary client reads
    let attack = format!("{{ getAll {{ name{aliases} }} }}");
    let mut attackers = Vec::new();
    for _ in 0..4 {
        let client = server.client();
        let attack = attack.clone();
        attackers.push(tokio::spawn(async move {
            for _ in 0..25 {
                client
                    .post_json("/coop/graph", &json!({ "query": attack }))
                    .await;
            }
        }));
    }
    let mut slowest = Duration::ZERO;
    for _ in 0..50 {
        let (r, took) = graphql(&server, "/coop/graph", &ordinary).await;
        assert!(r.get("errors").is_none(), "{r}");
        slowest = slowest.max(took);
    }
    for a in attackers {
        a.await.unwrap();
    }
    let after = rss_kib(server.pid());
    eprintln!(
        "ordinary reads under attack: slowest {slowest:?}; RSS {before} KiB before the attacks, {after} KiB after"
    );
    assert!(
        after < before + 200 * 1024,
        "RSS grew from {before} KiB to {after} KiB"
    );
    drop(silent);
}

#[test]
fn a_zero_limit_is_a_config_error_naming_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_service(dir.path(), "127.0.0.1:9", "[graphql]\nmax_depth = 0\n");
    let out = run_meshql(&["check", file.to_str().unwrap()], Duration::from_secs(30));
    assert!(!out.status.success());
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    // the file, the line of `max_depth = 0` (the second) and the field
    assert!(text.contains("meshql.toml"), "{text}");
    assert!(text.contains(":2"), "{text}");
    assert!(text.contains("max_depth"), "{text}");
}
