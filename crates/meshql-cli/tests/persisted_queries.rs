//! `[server.persisted_queries]` through the binary: Apollo's Automatic Persisted Queries
//! (not found → sent with its query → found by hash; POST and GET), the allow-list of a
//! manifest, `off`, and the config errors.

mod common;

use common::{check_error_line, Server};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

const SDL: &str = r#"
type Query {
  getById(id: ID, at: Float): Farm
  getAll(at: Float, limit: Int): [Farm]
}
type Farm { id: ID name: String }
"#;

fn service(dir: &Path, extra: &str) -> PathBuf {
    std::fs::write(dir.join("farm.graphql"), SDL).unwrap();
    let file = dir.join("meshql.toml");
    std::fs::write(
        &file,
        format!(
            r#"{extra}

[storage.m]
type = "memory"

[[entity]]
name = "farm"
storage = "m"
[entity.rest]
path = "/farm/api"
[entity.graphql]
path = "/farm/graph"
schema = "farm.graphql"
[[entity.graphql.singletons]]
name = "getById"
query = '{{"id": "{{{{id}}}}"}}'
[[entity.graphql.vectors]]
name = "getAll"
query = '{{}}'
"#
        ),
    )
    .unwrap();
    file
}

/// The SHA-256 of `text` in hex, as Apollo clients compute it (here: `sha256sum`, an
/// implementation independent of the server's).
fn sha256(text: &str) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("sha256sum");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_owned()
}

fn extensions(hash: &str) -> Value {
    json!({"persistedQuery": {"version": 1, "sha256Hash": hash}})
}

/// POST of `body`: status and JSON.
async fn post(server: &Server, body: &Value) -> (u16, Value) {
    let r = server.client().post_json("/farm/graph", body).await;
    (r.status, r.json())
}

/// GET with these query parameters (URL-encoded): status and JSON.
async fn get(server: &Server, params: &[(&str, String)]) -> (u16, Value) {
    let r = reqwest::Client::new()
        .get(server.url("/farm/graph"))
        .query(params)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

fn code(body: &Value) -> &str {
    body["errors"][0]["extensions"]["code"]
        .as_str()
        .unwrap_or("")
}

async fn farm(server: &Server, name: &str) {
    server
        .client()
        .post_json("/farm/api", &json!({ "name": name }))
        .await
        .expect_status(201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn automatic_persisted_queries_post_and_get() {
    let dir = tempfile::tempdir().unwrap();
    // APQ is on by default
    let server = Server::start(&service(dir.path(), ""), &[]);
    farm(&server, "Emerdale").await;
    let query = "{ getAll { name } }";
    let hash = sha256(query);

    // 1. the hash alone, unknown: Apollo's PersistedQueryNotFound, HTTP 200
    let (status, body) = post(&server, &json!({"extensions": extensions(&hash)})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["errors"][0]["message"], "PersistedQueryNotFound",
        "{body}"
    );
    assert_eq!(code(&body), "PERSISTED_QUERY_NOT_FOUND");
    // 2. the query with its hash: checked, remembered, run
    let (status, body) = post(
        &server,
        &json!({"query": query, "extensions": extensions(&hash)}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["data"]["getAll"][0]["name"], "Emerdale", "{body}");
    // 3. the hash alone runs it now, with variables and an operation name as usual
    let (status, body) = post(&server, &json!({"extensions": extensions(&hash)})).await;
    assert_eq!(
        (status, &body["data"]["getAll"][0]["name"]),
        (200, &json!("Emerdale")),
        "{body}"
    );
    // a query with another's hash: 400, nothing run
    let (status, body) = post(
        &server,
        &json!({"query": "{ getAll { id } }", "extensions": extensions(&hash)}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        body["errors"][0]["message"],
        "provided sha does not match query"
    );
    assert!(body.get("data").is_none(), "{body}");
    // an unsupported version
    let (status, body) = post(
        &server,
        &json!({"extensions": {"persistedQuery": {"version": 2, "sha256Hash": hash}}}),
    )
    .await;
    assert_eq!(status, 400, "{body}");

    // GET, with `extensions` as a URL-encoded JSON parameter (what Apollo Client sends with
    // useGETForHashedQueries)
    let named = "query Named($id: ID) { getById(id: $id) { name } }";
    let named_hash = sha256(named);
    let ext = extensions(&named_hash).to_string();
    let (status, body) = get(&server, &[("extensions", ext.clone())]).await;
    assert_eq!(
        (status, code(&body)),
        (200, "PERSISTED_QUERY_NOT_FOUND"),
        "{body}"
    );
    let (status, body) = get(
        &server,
        &[
            ("query", named.to_owned()),
            ("extensions", ext.clone()),
            ("variables", r#"{"id": "nope"}"#.to_owned()),
        ],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["data"]["getById"], Value::Null, "{body}");
    let (status, body) = get(
        &server,
        &[
            ("extensions", ext),
            ("operationName", "Named".to_owned()),
            ("variables", r#"{"id": "nope"}"#.to_owned()),
        ],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.get("errors").is_none(), "{body}");
    assert_eq!(body["data"], json!({"getById": null}));
    // a hash registered with POST is found with GET, and the other way round
    let (status, body) = get(&server, &[("extensions", extensions(&hash).to_string())]).await;
    assert_eq!(
        (status, &body["data"]["getAll"][0]["name"]),
        (200, &json!("Emerdale")),
        "{body}"
    );
    let (_, body) = post(
        &server,
        &json!({"extensions": extensions(&named_hash), "variables": {"id": "x"}}),
    )
    .await;
    assert_eq!(body["data"], json!({"getById": null}), "{body}");
    // malformed `extensions`
    let (status, _) = get(&server, &[("extensions", "{not json".to_owned())]).await;
    assert_eq!(status, 400);
    // plain requests are untouched
    let (status, body) = post(&server, &json!({ "query": query })).await;
    assert_eq!(
        (status, &body["data"]["getAll"][0]["name"]),
        (200, &json!("Emerdale"))
    );
}

const MANIFEST_QUERY: &str = "query AllFarms { getAll { name } }";

fn manifest() -> String {
    json!({
        "format": "apollo-persisted-query-manifest",
        "version": 1,
        "operations": [
            {"id": "all-farms-v1", "name": "AllFarms", "type": "query", "body": MANIFEST_QUERY},
            {"id": sha256("query One($id: ID) { getById(id: $id) { name } }"), "name": "One",
             "type": "query", "body": "query One($id: ID) { getById(id: $id) { name } }"}
        ]
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowlist_serves_listed_operations_only() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("operations.json"), manifest()).unwrap();
    let server = Server::start(
        &service(
            dir.path(),
            "[server.persisted_queries]\nmode = \"allowlist\"\nmanifest = \"operations.json\"\n",
        ),
        &[],
    );
    farm(&server, "Emerdale").await;
    // by id (POST and GET), and by its exact text
    let (status, body) = post(&server, &json!({"extensions": extensions("all-farms-v1")})).await;
    assert_eq!(
        (status, &body["data"]["getAll"][0]["name"]),
        (200, &json!("Emerdale")),
        "{body}"
    );
    let (status, body) = get(
        &server,
        &[("extensions", extensions("all-farms-v1").to_string())],
    )
    .await;
    assert_eq!(
        (status, &body["data"]["getAll"][0]["name"]),
        (200, &json!("Emerdale")),
        "{body}"
    );
    let (status, body) = post(&server, &json!({ "query": MANIFEST_QUERY })).await;
    assert_eq!(
        (status, &body["data"]["getAll"][0]["name"]),
        (200, &json!("Emerdale")),
        "{body}"
    );
    let one = "query One($id: ID) { getById(id: $id) { name } }";
    let (status, body) = post(
        &server,
        &json!({"extensions": extensions(&sha256(one)), "variables": {"id": "x"}}),
    )
    .await;
    assert_eq!(
        (status, &body["data"]),
        (200, &json!({"getById": null})),
        "{body}"
    );

    // anything else is refused, and nothing runs
    let other = "{ getAll { id name } }";
    for (request, message) in [
        (
            json!({ "query": other }),
            "runs only the operations of its persisted-query list",
        ),
        (
            json!({"extensions": extensions("nope")}),
            "`nope` is not in this service's persisted-query list",
        ),
        // an APQ registration is no way in
        (
            json!({"query": other, "extensions": extensions(&sha256(other))}),
            "is not in this service's persisted-query list",
        ),
    ] {
        let (status, body) = post(&server, &request).await;
        assert_eq!(status, 400, "{request}: {body}");
        assert_eq!(code(&body), "PERSISTED_QUERY_NOT_IN_LIST", "{body}");
        assert!(
            body["errors"][0]["message"]
                .as_str()
                .unwrap()
                .contains(message),
            "{body}"
        );
        assert!(body.get("data").is_none(), "{body}");
    }
    let (status, body) = get(&server, &[("query", other.to_owned())]).await;
    assert_eq!(
        (status, code(&body)),
        (400, "PERSISTED_QUERY_NOT_IN_LIST"),
        "{body}"
    );
    // REST is not GraphQL: untouched
    server.client().get("/farm/api").await.expect_status(200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_refuses_hashes_and_runs_queries() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        &service(dir.path(), "[server.persisted_queries]\nmode = \"off\"\n"),
        &[],
    );
    let query = "{ getAll { name } }";
    let (status, body) = post(&server, &json!({"extensions": extensions(&sha256(query))})).await;
    assert_eq!(
        (status, code(&body)),
        (200, "PERSISTED_QUERY_NOT_SUPPORTED"),
        "{body}"
    );
    assert_eq!(body["errors"][0]["message"], "PersistedQueryNotSupported");
    let (status, body) = post(
        &server,
        &json!({"query": query, "extensions": extensions("anything")}),
    )
    .await;
    assert_eq!(
        (status, &body["data"]),
        (200, &json!({"getAll": []})),
        "{body}"
    );
}

#[test]
fn config_errors_name_the_field_and_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bad.json"), "{\"format\": \"apollo-persisted-query-manifest\",\n\"version\": 1,\n\"operations\": [{\"id\": \"a\"}]}").unwrap();
    std::fs::write(dir.path().join("ok.json"), manifest()).unwrap();
    for (table, needle, line) in [
        (
            "[server.persisted_queries]\nmode = \"allowlist\"\n",
            "server.persisted_queries.manifest: required with mode = \"allowlist\"",
            1,
        ),
        (
            "[server.persisted_queries]\nmode = \"allowlist\"\nmanifest = \"missing.json\"\n",
            "server.persisted_queries.manifest: cannot read",
            3,
        ),
        (
            "[server.persisted_queries]\nmode = \"allowlist\"\nmanifest = \"bad.json\"\n",
            "bad.json:3:",
            3,
        ),
        (
            "[server.persisted_queries]\nmanifest = \"ok.json\"\n",
            "server.persisted_queries.manifest: only with mode = \"allowlist\"",
            2,
        ),
        (
            "[server.persisted_queries]\nmode = \"apq\"\nmax_entries = 0\n",
            "server.persisted_queries.max_entries",
            3,
        ),
        (
            "[server.persisted_queries]\nmode = \"always\"\n",
            "server.persisted_queries.mode",
            2,
        ),
    ] {
        let file = service(dir.path(), table);
        let said = check_error_line(&file, needle);
        assert!(
            said.contains(&format!("meshql.toml:{line}:")),
            "{table}: {said}"
        );
    }
}
