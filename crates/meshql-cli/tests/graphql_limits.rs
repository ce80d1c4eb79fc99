//! What one GraphQL request may cost, through the binary: the amplification attacks of
//! issue 11 (thousands of aliased relationships, relationship cycles, results that multiply
//! as they are written, a relationship that never answers) are refused quickly with a coded
//! error, memory stays bounded, and ordinary requests go on being answered.

mod common;

use common::{free_port, run_meshql, Server};
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

/// One coop with five hens; the coop's id.
async fn coop_with_five_hens(server: &Server) -> String {
    let client = server.client();
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
    coop
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
    let coop = coop_with_five_hens(&server).await;
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

/// Every error's `extensions.code` in a response.
fn codes(r: &Value) -> Vec<String> {
    r["errors"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["extensions"]["code"].as_str().map(str::to_owned))
        .collect()
}

/// Relationship cycles through `url` resolvers (issue 22: each hop started again at depth 0
/// with a whole object budget, and a 299-byte query reached +175 MB): every hop receives what
/// the caller left of its bounds (`x-meshql-budget`), so a cycle deeper than the relationship
/// bound is refused however many services it crosses, and one that multiplies past
/// `max_objects` is refused by the service the client called, counting the objects remote
/// services answered. Meanwhile the server stays small, and a caller that sends a budget can
/// only lower the bounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn federated_cycles_are_bounded_across_hops() {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let file = write_service(
        dir.path(),
        "127.0.0.1:9",
        "[graphql]\nmax_objects = 1000\ntimeout_ms = 10000\n",
    );
    // the same service, its relationships over HTTP to itself (as examples/farm)
    let text = std::fs::read_to_string(&file).unwrap();
    let text = text
        .replace(
            "graph = \"/hen/graph\"",
            &format!("url = \"http://127.0.0.1:{port}/hen/graph\""),
        )
        .replace(
            "graph = \"/coop/graph\"",
            &format!("url = \"http://127.0.0.1:{port}/coop/graph\""),
        );
    std::fs::write(&file, text).unwrap();
    let server = Server::start_with_env(&file, &[], Some(port));
    let coop = coop_with_five_hens(&server).await;
    // an ordinary federated read works, and says nothing about budgets
    let (ok, _) = graphql(
        &server,
        "/coop/graph",
        &format!(r#"{{ getById(id: "{coop}") {{ name hens {{ name coop {{ name }} }} }} }}"#),
    )
    .await;
    assert!(ok.get("errors").is_none(), "{ok}");
    assert_eq!(
        ok["data"]["getById"]["hens"][4]["coop"]["name"], "red",
        "{ok}"
    );
    let before = rss_kib(server.pid());

    // twelve relationships deep, each one a hop: past the bound of 8 on the way down
    let (r, took) = graphql(
        &server,
        "/coop/graph",
        &format!(r#"{{ getById(id: "{coop}") {{ {} }} }}"#, cycle(12)),
    )
    .await;
    assert!(
        codes(&r).iter().any(|c| c == "QUERY_TOO_COMPLEX"),
        "a hop refuses what is left of the relationship depth: {r}"
    );
    eprintln!("twelve-hop cycle: refused in {took:?}");

    // within the depth bound, a cycle that multiplies (1,560 objects) past max_objects
    // (1,000): the remote services' answers count against the caller's budget
    let (r, took) = graphql(
        &server,
        "/coop/graph",
        &format!(r#"{{ getById(id: "{coop}") {{ {} }} }}"#, cycle(8)),
    )
    .await;
    assert!(
        codes(&r).iter().any(|c| c == "RESPONSE_TOO_LARGE"),
        "the multiplying cycle is refused: {r}"
    );
    eprintln!("multiplying cycle across hops: refused in {took:?}");

    // a budget sent by a caller lowers the bounds, never raises them; a malformed one is a 400
    let send = |budget: &'static str, query: String| {
        let client = reqwest::Client::new();
        let url = format!("http://127.0.0.1:{port}/coop/graph");
        async move {
            client
                .post(url)
                .header("x-meshql-budget", budget)
                .json(&json!({ "query": query }))
                .send()
                .await
                .unwrap()
        }
    };
    let one_level = format!(r#"{{ getById(id: "{coop}") {{ name hens {{ name }} }} }}"#);
    let r: Value = send("relationships=0", one_level.clone())
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(code(&r), "QUERY_TOO_COMPLEX", "{r}");
    let r: Value = send("depth=1", one_level.clone())
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(code(&r), "QUERY_TOO_COMPLEX", "{r}");
    // the coop is one object; the two left are passed on, and the hop finds five hens
    let r: Value = send("objects=3", one_level.clone())
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(codes(&r), ["RESPONSE_TOO_LARGE"], "{r}");
    assert_eq!(r["errors"][0]["path"], json!(["getById", "hens"]), "{r}");
    let r: Value = send(
        "depth=99, relationships=99, objects=999999",
        cycle_query(&coop, 12),
    )
    .await
    .json()
    .await
    .unwrap();
    assert!(
        codes(&r).iter().any(|c| c == "QUERY_TOO_COMPLEX"),
        "a generous budget does not raise the service's own bounds: {r}"
    );
    let bad = send("depth=lots", one_level).await;
    assert_eq!(bad.status(), 400);
    let body: Value = bad.json().await.unwrap();
    assert!(
        body["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("x-meshql-budget"),
        "{body}"
    );

    let after = rss_kib(server.pid());
    eprintln!("RSS {before} KiB before the cycles, {after} KiB after");
    assert!(
        after < before + 100 * 1024,
        "RSS grew from {before} KiB to {after} KiB"
    );
}

fn cycle_query(coop: &str, levels: usize) -> String {
    format!(r#"{{ getById(id: "{coop}") {{ {} }} }}"#, cycle(levels))
}
