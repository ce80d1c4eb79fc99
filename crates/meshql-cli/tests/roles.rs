//! One config, two processes (`meshql serve --role write|read`, examples/farm-cqrs): the
//! write process takes REST writes and runs the change feed and serves no GraphQL; the read
//! process serves GraphQL (relationships federating over HTTP to itself), REST reads, the
//! console and subscriptions, refuses writes, and follows the write process's changes.

mod common;

use common::{example_copy, free_port, Server};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

async fn until(what: &str, mut ok: impl AsyncFnMut() -> bool) {
    let started = Instant::now();
    while !ok().await {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{what} within 15 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn post(server: &Server, path: &str, body: Value) -> String {
    let r = server.client().post_json(path, &body).await;
    r.expect_status(201);
    r.json()["id"].as_str().unwrap().to_owned()
}

async fn graphql(server: &Server, path: &str, query: &str) -> Value {
    let r = server
        .client()
        .post_json(path, &json!({ "query": query }))
        .await;
    r.expect_status(200);
    r.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_config_serves_a_write_process_and_a_read_process() {
    let dir = example_copy("farm-cqrs", |t| t);
    let config = dir.path().join("meshql.toml");
    let data = tempfile::tempdir().unwrap();
    let read_port = free_port();
    let envs = [("READ_SERVICE_URL", format!("http://127.0.0.1:{read_port}"))];
    let write = Server::start_sharing(&config, data.path(), &["--role", "write"], &envs, None);
    let read = Server::start_sharing(
        &config,
        data.path(),
        &["--role", "read"],
        &envs,
        Some(read_port),
    );
    let (w, r) = (write.client(), read.client());

    // writes go to the write process
    let farm = post(&write, "/farm/api", json!({"name": "Emerdale"})).await;
    let coop = post(&write, "/coop/api", json!({"name": "red", "farm_id": farm})).await;
    let hen = post(&write, "/hen/api", json!({"name": "v1", "coop_id": coop})).await;

    // the read process refuses them, names the write role, and writes nothing
    let refused = r.post_json("/farm/api", &json!({"name": "nope"})).await;
    refused.expect_status(405);
    assert_eq!(refused.header("allow"), Some("GET, OPTIONS"));
    assert!(
        refused.json()["error"]
            .as_str()
            .unwrap()
            .contains("write role"),
        "{}",
        refused.json()
    );
    r.put_json(
        &format!("/hen/api/{hen}"),
        &json!({"name": "nope", "coop_id": coop}),
    )
    .await
    .expect_status(405);
    r.delete(&format!("/hen/api/{hen}"))
        .await
        .expect_status(405);
    assert_eq!(w.list("/farm/api").await.len(), 1);
    assert_eq!(w.get(&format!("/hen/api/{hen}")).await.json()["name"], "v1");

    // the read process serves REST reads and GraphQL, relationships federating over HTTP
    // to itself
    assert_eq!(r.get(&format!("/hen/api/{hen}")).await.json()["name"], "v1");
    let answer = graphql(
        &read,
        "/farm/graph",
        &format!(r#"{{ getById(id: "{farm}") {{ name coops {{ name hens {{ name }} }} }} }}"#),
    )
    .await;
    assert_eq!(
        answer["data"]["getById"],
        json!({"name": "Emerdale", "coops": [{"name": "red", "hens": [{"name": "v1"}]}]}),
        "{answer}"
    );
    // its OpenAPI documents the reads only; its console is served
    let doc = r.get("/hen/api/api-docs/swagger.json").await.json();
    assert!(doc["paths"]["/hen/api"]["get"].is_object());
    assert!(doc["paths"]["/hen/api"].get("post").is_none(), "{doc}");
    r.get("/").await.expect_status(200);
    let described = r.get("/_meshql/console/api/service").await.json();
    let entities = described["entities"].as_array().expect("entities");
    assert_eq!(entities.len(), 3, "{described}");
    assert!(
        entities.iter().all(|e| e["rest"]["read_only"] == true),
        "the console offers no writes on the read process: {described}"
    );

    // the write process serves neither GraphQL nor the console
    w.post_json("/farm/graph", &json!({"query": "{ getAll { name } }"}))
        .await
        .expect_status(404);
    w.get("/").await.expect_status(404);

    // each says what it serves
    assert!(w
        .get("/metrics")
        .await
        .text
        .contains("meshql_role{role=\"write\"} 1"));
    assert!(r
        .get("/metrics")
        .await
        .text
        .contains("meshql_role{role=\"read\"} 1"));

    // the read process follows the write process's changes: its own change feed has every
    // write, and a subscription on it sees an update made through the write process
    until(
        "the read process's feed has the three creates",
        async || {
            let page = r.get("/_changes?limit=100").await;
            page.status == 200 && page.json()["changes"].as_array().unwrap().len() == 3
        },
    )
    .await;
    let mut stream = reqwest::Client::new()
        .post(read.url("/hen/graph"))
        .header("accept", "text/event-stream")
        .json(&json!({
            "query": format!(r#"subscription {{ getById(id: "{hen}") {{ name coop {{ name }} }} }}"#)
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.headers()["content-type"], "text/event-stream");
    until("the subscription is open", async || {
        r.get("/metrics")
            .await
            .text
            .lines()
            .any(|l| l == "meshql_subscriptions 1")
    })
    .await;
    w.put_json(
        &format!("/hen/api/{hen}"),
        &json!({"name": "v2", "coop_id": coop}),
    )
    .await
    .expect_status(200);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut text = String::new();
    while !text.contains(r#""getById":{"name":"v2","coop":{"name":"red"}}"#) {
        let left = deadline.saturating_duration_since(Instant::now());
        let chunk = tokio::time::timeout(left, stream.chunk())
            .await
            .unwrap_or_else(|_| panic!("the update as an event within 10 s; got {text}"))
            .unwrap()
            .expect("the stream is open");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    // and its reads see the update
    assert_eq!(r.get(&format!("/hen/api/{hen}")).await.json()["name"], "v2");

    // a page of another origin may send the consistency token: a preflight that asks for it
    // is allowed it, any other keeps the contract's header list; writes expose the token
    let preflight = r
        .request(
            "OPTIONS",
            "/farm/graph",
            None,
            &[
                ("origin", "https://app.example"),
                ("access-control-request-method", "POST"),
                (
                    "access-control-request-headers",
                    "content-type,x-meshql-consistency",
                ),
            ],
        )
        .await;
    preflight.expect_status(200);
    assert_eq!(
        preflight.header("access-control-allow-headers"),
        Some("Content-Type, Authorization, X-Meshql-Consistency")
    );
    let plain = r.request("OPTIONS", "/farm/graph", None, &[]).await;
    assert_eq!(
        plain.header("access-control-allow-headers"),
        Some("Content-Type, Authorization")
    );
    let written = w.post_json("/farm/api", &json!({"name": "Exposed"})).await;
    written.expect_status(201);
    assert_eq!(
        written.header("access-control-expose-headers"),
        Some("x-meshql-consistency")
    );
    assert!(written.header("x-meshql-consistency").is_some());
}
