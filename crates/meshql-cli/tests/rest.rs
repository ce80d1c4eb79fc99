//! REST behaviour of `meshql serve` against examples/egg-economy (CONTRACT §2), through the
//! real binary and HTTP.

mod common;

use common::{example_copy, examples_dir, feed, gql, is_rfc4122_uuid, Client, Response, Server};
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

fn egg_economy() -> PathBuf {
    examples_dir().join("egg-economy")
}

fn start() -> Server {
    Server::start(&egg_economy(), &[])
}

fn farm(name: &str) -> Value {
    json!({"name": name, "farm_type": "homestead", "zone": "north", "owner": "ada"})
}

/// `payload` plus `"id": id`.
fn with_id(payload: &Value, id: &str) -> Value {
    let mut v = payload.clone();
    v.as_object_mut()
        .expect("payload is an object")
        .insert("id".into(), json!(id));
    v
}

/// POSTs `payload` to `path`, asserting 201; returns the new id.
async fn create(c: &Client, path: &str, payload: &Value) -> String {
    let r = c.post_json(path, payload).await;
    r.expect_status(201);
    let id = r.json()["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no id in {}", r.text))
        .to_owned();
    assert!(is_rfc4122_uuid(&id), "{id} is not an RFC-4122 UUID");
    id
}

#[track_caller]
fn assert_json_error(r: &Response, status: u16) -> Value {
    r.expect_status(status);
    assert_eq!(r.content_type(), "application/json", "{r:?}");
    let body = r.json();
    assert!(body["error"].is_string(), "no `error` string in {body}");
    body
}

/// The `details` of a 400 "Invalid payload" answer, asserting its shape.
#[track_caller]
fn invalid_details(r: &Response) -> Vec<Value> {
    let body = assert_json_error(r, 400);
    assert_eq!(body["error"], "Invalid payload", "{body}");
    let details = body["details"]
        .as_array()
        .unwrap_or_else(|| panic!("no details array in {body}"))
        .clone();
    assert!(!details.is_empty(), "{body}");
    for d in &details {
        assert!(d["path"].is_string() && d["message"].is_string(), "{d}");
    }
    details
}

/// True when some detail has `path` and a message containing `word`.
fn names(details: &[Value], path: &str, word: &str) -> bool {
    details
        .iter()
        .any(|d| d["path"] == path && d["message"].as_str().unwrap_or("").contains(word))
}

fn ids_of(items: &[Value]) -> BTreeSet<String> {
    items
        .iter()
        .map(|v| {
            v["id"]
                .as_str()
                .expect("every listed item has an id")
                .to_owned()
        })
        .collect()
}

// ------------------------------------------------------------------------------------------
// create / read / list
// ------------------------------------------------------------------------------------------

#[tokio::test]
async fn post_creates_and_get_reads_it_back() {
    let s = start();
    let c = s.client();
    let payload = farm("farm-1");

    let r = c.post_json("/farm/api", &payload).await;
    r.expect_status(201);
    assert_eq!(r.content_type(), "application/json");
    let body = r.json();
    let id = body["id"].as_str().expect("id string").to_owned();
    assert!(is_rfc4122_uuid(&id), "{id}");
    assert_eq!(body, with_id(&payload, &id));
    assert_eq!(
        r.header("location"),
        Some(format!("/farm/api/{id}").as_str())
    );

    let r = c.get(&format!("/farm/api/{id}")).await;
    r.expect_status(200);
    assert_eq!(r.content_type(), "application/json");
    assert_eq!(r.json(), with_id(&payload, &id));
    assert_eq!(r.header("x-canonical-id"), Some(id.as_str()));

    let list = c.list("/farm/api").await;
    assert_eq!(list, vec![with_id(&payload, &id)]);
}

#[tokio::test]
async fn post_to_the_trailing_slash_path_creates_too() {
    let s = start();
    let c = s.client();
    let id = create(&c, "/farm/api/", &farm("slash")).await;
    c.get(&format!("/farm/api/{id}")).await.expect_status(200);
}

#[tokio::test]
async fn ids_are_distinct_uuids() {
    let s = start();
    let c = s.client();
    let mut ids = BTreeSet::new();
    for i in 0..5 {
        ids.insert(create(&c, "/farm/api", &farm(&format!("f{i}"))).await);
    }
    assert_eq!(ids.len(), 5);
    assert_eq!(ids_of(&c.list("/farm/api").await), ids);
}

#[tokio::test]
async fn get_unknown_id_is_404_resource_not_found() {
    let s = start();
    let c = s.client();
    for id in ["3f1c9a52-7d0e-4c1b-9a0e-5b8f2f6d4e11", "not-a-uuid"] {
        let r = c.get(&format!("/farm/api/{id}")).await;
        let body = assert_json_error(&r, 404);
        assert_eq!(body, json!({"error": "Resource not found"}));
    }
}

#[tokio::test]
async fn entities_are_separate() {
    let s = start();
    let c = s.client();
    let farm_id = create(&c, "/farm/api", &farm("sep")).await;
    let coop = json!({"name": "c1", "farm_id": farm_id, "capacity": 10, "coop_type": "barn"});
    let coop_id = create(&c, "/coop/api", &coop).await;
    assert_eq!(c.list("/coop/api").await, vec![with_id(&coop, &coop_id)]);
    assert_eq!(
        ids_of(&c.list("/farm/api").await),
        BTreeSet::from([farm_id])
    );
    // a farm id is not a coop
    c.get(&format!(
        "/coop/api/{}",
        ids_of(&c.list("/farm/api").await).first().unwrap()
    ))
    .await
    .expect_status(404);
}

// ------------------------------------------------------------------------------------------
// update / delete
// ------------------------------------------------------------------------------------------

#[tokio::test]
async fn put_replaces_the_whole_document() {
    let s = start();
    let c = s.client();
    let id = create(&c, "/farm/api", &farm("before")).await;
    // `owner` is omitted: it must be gone afterwards (replacement, not merge)
    let replacement = json!({"name": "after", "farm_type": "megafarm", "zone": "central"});

    let r = c.put_json(&format!("/farm/api/{id}"), &replacement).await;
    r.expect_status(200);
    assert_eq!(r.content_type(), "application/json");
    assert_eq!(r.json(), with_id(&replacement, &id));

    let got = c.get(&format!("/farm/api/{id}")).await;
    got.expect_status(200);
    assert_eq!(got.json(), with_id(&replacement, &id));
    assert!(got.json().get("owner").is_none());
    assert_eq!(c.list("/farm/api").await, vec![with_id(&replacement, &id)]);
}

#[tokio::test]
async fn put_unknown_id_is_404_and_creates_nothing() {
    let s = start();
    let c = s.client();
    create(&c, "/farm/api", &farm("existing")).await;
    let before = c.list("/farm/api").await;

    let unknown = "0b7e3f9c-2a41-4d6e-8f13-7c5a9e2d1b40";
    let r = c
        .put_json(&format!("/farm/api/{unknown}"), &farm("ghost"))
        .await;
    assert_json_error(&r, 404);

    assert_eq!(c.list("/farm/api").await, before);
    c.get(&format!("/farm/api/{unknown}"))
        .await
        .expect_status(404);
}

#[tokio::test]
async fn delete_tombstones_and_is_idempotent() {
    let s = start();
    let c = s.client();
    let keep = create(&c, "/farm/api", &farm("keep")).await;
    let gone = create(&c, "/farm/api", &farm("gone")).await;
    let path = format!("/farm/api/{gone}");

    let r = c.delete(&path).await;
    r.expect_status(200);
    assert_eq!(r.content_type(), "application/json");
    assert_eq!(r.json(), json!({"id": gone, "status": "deleted"}));

    assert_eq!(
        assert_json_error(&c.get(&path).await, 404),
        json!({"error": "Resource not found"})
    );
    assert_eq!(
        ids_of(&c.list("/farm/api").await),
        BTreeSet::from([keep.clone()])
    );

    // again: still 200 (the id was seen)
    let r = c.delete(&path).await;
    r.expect_status(200);
    assert_eq!(r.json(), json!({"id": gone, "status": "deleted"}));

    // an id never seen: 404
    let never = c
        .delete("/farm/api/6a2d8c1e-9b3f-4e57-a0c4-1d9e8f7b6a52")
        .await;
    assert_json_error(&never, 404);

    // a PUT on a deleted id does not resurrect it
    assert_json_error(&c.put_json(&path, &farm("zombie")).await, 404);
    assert_eq!(ids_of(&c.list("/farm/api").await), BTreeSet::from([keep]));
}

// ------------------------------------------------------------------------------------------
// validation
// ------------------------------------------------------------------------------------------

#[tokio::test]
async fn schema_violations_are_400_with_details_and_store_nothing() {
    let s = start();
    let c = s.client();
    let farm_id = create(&c, "/farm/api", &farm("valid")).await;
    let coop = json!({"name": "c", "farm_id": farm_id, "capacity": 5, "coop_type": "barn"});
    let coop_id = create(&c, "/coop/api", &coop).await;

    // (entity path, body, detail path, word the message must contain)
    let cases: Vec<(&str, Value, &str, &str)> = vec![
        (
            "/farm/api",
            json!({"name": "x", "farm_type": "homestead"}),
            "/",
            "zone",
        ),
        (
            "/farm/api",
            json!({"name": "x", "farm_type": "barn", "zone": "z"}),
            "/farm_type",
            "barn",
        ),
        (
            "/farm/api",
            json!({"name": "x", "farm_type": "homestead", "zone": "z", "colour": "red"}),
            "/",
            "colour",
        ),
        (
            "/farm/api",
            json!({"name": 42, "farm_type": "homestead", "zone": "z"}),
            "/name",
            "string",
        ),
        (
            "/coop/api",
            json!({"name": "c", "farm_id": "not-a-uuid", "capacity": 5, "coop_type": "barn"}),
            "/farm_id",
            "uuid",
        ),
        (
            "/coop/api",
            json!({"name": "c", "farm_id": farm_id, "capacity": 0, "coop_type": "barn"}),
            "/capacity",
            "minimum",
        ),
        (
            "/hen/api",
            json!({"name": "h", "coop_id": coop_id, "breed": "leghorn", "dob": "2024-13-45"}),
            "/dob",
            "date",
        ),
        (
            "/hen/api",
            json!({"name": "h", "coop_id": coop_id, "breed": "leghorn", "status": "flying"}),
            "/status",
            "flying",
        ),
    ];

    for (path, body, detail_path, word) in cases {
        let before = c.list(path).await;
        let r = c.post_json(path, &body).await;
        let details = invalid_details(&r);
        assert!(
            names(&details, detail_path, word),
            "POST {path} {body}: expected a detail at {detail_path} mentioning {word:?}, got {details:?}"
        );
        assert_eq!(
            c.list(path).await,
            before,
            "POST {path} {body} stored something"
        );
    }
}

#[tokio::test]
async fn every_violation_is_reported() {
    let s = start();
    let c = s.client();
    let r = c
        .post_json(
            "/farm/api",
            &json!({"farm_type": "barn", "zone": 7, "extra": true}),
        )
        .await;
    let details = invalid_details(&r);
    assert!(names(&details, "/", "name"), "{details:?}");
    assert!(names(&details, "/farm_type", "barn"), "{details:?}");
    assert!(names(&details, "/zone", "string"), "{details:?}");
    assert!(names(&details, "/", "extra"), "{details:?}");
    assert!(c.list("/farm/api").await.is_empty());
}

#[tokio::test]
async fn malformed_json_is_400() {
    let s = start();
    let c = s.client();
    for body in [&b"{\"name\": \"x\""[..], b"{name: x}", b"", b"\xff\xfe"] {
        let r = c.post_raw("/farm/api", body).await;
        let err = assert_json_error(&r, 400);
        assert!(
            err["error"].as_str().unwrap().contains("JSON"),
            "{:?}: {err}",
            String::from_utf8_lossy(body)
        );
    }
    assert!(c.list("/farm/api").await.is_empty());
}

#[tokio::test]
async fn non_object_bodies_are_400() {
    let s = start();
    let c = s.client();
    for body in [
        json!([farm("in-an-array")]),
        json!("a string"),
        json!(42),
        json!(null),
    ] {
        let r = c.post_json("/farm/api", &body).await;
        let err = assert_json_error(&r, 400);
        assert!(
            err["error"].as_str().unwrap().contains("object"),
            "{body}: {err}"
        );
    }
    assert!(c.list("/farm/api").await.is_empty());
}

#[tokio::test]
async fn invalid_put_leaves_the_document_unchanged() {
    let s = start();
    let c = s.client();
    let payload = farm("stable");
    let id = create(&c, "/farm/api", &payload).await;
    let path = format!("/farm/api/{id}");

    let r = c
        .put_json(
            &path,
            &json!({"name": "x", "farm_type": "castle", "zone": "z"}),
        )
        .await;
    assert!(names(&invalid_details(&r), "/farm_type", "castle"));
    assert_json_error(&c.put_raw(&path, b"{not json").await, 400);
    assert_json_error(&c.put_json(&path, &json!(["x"])).await, 400);

    assert_eq!(c.get(&path).await.json(), with_id(&payload, &id));
    assert_eq!(c.list("/farm/api").await, vec![with_id(&payload, &id)]);
}

#[tokio::test]
async fn bodies_over_the_configured_limit_are_413() {
    let dir = example_copy("egg-economy", |toml| {
        format!("body_limit_bytes = 2048\n{toml}")
    });
    let s = Server::start(dir.path(), &[]);
    let c = s.client();

    let big = json!({"name": "x".repeat(10 * 1024), "farm_type": "homestead", "zone": "z"});
    let r = c.post_json("/farm/api", &big).await;
    let err = assert_json_error(&r, 413);
    assert!(err["error"].as_str().unwrap().contains("2048"), "{err}");

    // under the limit still works, and nothing was stored by the rejected request
    let id = create(&c, "/farm/api", &farm("small")).await;
    assert_eq!(ids_of(&c.list("/farm/api").await), BTreeSet::from([id]));
}

// ------------------------------------------------------------------------------------------
// methods, bulk
// ------------------------------------------------------------------------------------------

#[tokio::test]
async fn wrong_methods_are_405_with_allow() {
    let s = start();
    let c = s.client();
    let id = create(&c, "/farm/api", &farm("m")).await;

    let r = c
        .request("PATCH", "/farm/api", Some(b"{}".to_vec()), &[])
        .await;
    let err = assert_json_error(&r, 405);
    assert!(err["error"].as_str().unwrap().contains("PATCH"), "{err}");
    let allow = r.header("allow").expect("Allow header");
    for m in ["GET", "POST"] {
        assert!(allow.contains(m), "{allow}");
    }
    assert!(!allow.contains("PUT"), "{allow}");

    let r = c
        .request(
            "PATCH",
            &format!("/farm/api/{id}"),
            Some(b"{}".to_vec()),
            &[],
        )
        .await;
    assert_json_error(&r, 405);
    let allow = r.header("allow").expect("Allow header");
    for m in ["GET", "PUT", "DELETE"] {
        assert!(allow.contains(m), "{allow}");
    }

    // DELETE on the collection is not a thing either
    let r = c.delete("/farm/api").await;
    assert_json_error(&r, 405);
    assert!(r.header("allow").is_some());
    // nothing changed
    assert_eq!(c.list("/farm/api").await.len(), 1);
}

#[tokio::test]
async fn bulk_create_is_all_or_nothing() {
    let s = start();
    let c = s.client();
    let items = vec![farm("b1"), farm("b2"), farm("b3")];

    let r = c.post_json("/farm/api/bulk", &json!(items)).await;
    r.expect_status(201);
    assert_eq!(r.content_type(), "application/json");
    let created = r.json().as_array().expect("array").clone();
    assert_eq!(created.len(), 3);
    for (item, sent) in created.iter().zip(&items) {
        let id = item["id"].as_str().expect("id");
        assert!(is_rfc4122_uuid(id), "{id}");
        assert_eq!(item, &with_id(sent, id));
    }
    let list = c.list("/farm/api").await;
    assert_eq!(ids_of(&list), ids_of(&created));

    // one invalid item: 400 naming its index, nothing written
    let batch = json!([farm("ok-1"), {"name": "bad", "farm_type": "homestead"}, farm("ok-2")]);
    let r = c.post_json("/farm/api/bulk", &batch).await;
    let err = assert_json_error(&r, 400);
    assert_eq!(err["error"], "Invalid payload in batch");
    let details = err["details"].as_array().expect("details");
    assert_eq!(details.len(), 1, "{err}");
    assert_eq!(details[0]["index"], 1, "{err}");
    assert!(err.to_string().contains("zone"), "{err}");
    assert_eq!(c.list("/farm/api").await, list);

    // a non-object item is reported by index too
    let r = c
        .post_json("/farm/api/bulk", &json!([farm("ok"), "nope"]))
        .await;
    let err = assert_json_error(&r, 400);
    assert_eq!(err["details"][0]["index"], 1, "{err}");
    // a non-array body
    assert_json_error(&c.post_json("/farm/api/bulk", &farm("solo")).await, 400);
    assert_eq!(c.list("/farm/api").await, list);
}

#[tokio::test]
async fn bulk_read_returns_the_visible_ones() {
    let s = start();
    let c = s.client();
    let a = create(&c, "/farm/api", &farm("a")).await;
    let b = create(&c, "/farm/api", &farm("b")).await;
    let d = create(&c, "/farm/api", &farm("d")).await;
    c.delete(&format!("/farm/api/{b}")).await.expect_status(200);
    let unknown = "9d4b2e71-5c3a-4f8e-b1d6-0e7a3c9f2b85";

    let r = c.get(&format!("/farm/api/bulk?ids={a},{d}")).await;
    r.expect_status(200);
    let got = r.json().as_array().expect("array").clone();
    assert_eq!(ids_of(&got), BTreeSet::from([a.clone(), d.clone()]));
    for item in &got {
        let id = item["id"].as_str().unwrap();
        assert_eq!(c.get(&format!("/farm/api/{id}")).await.json(), *item);
    }

    let r = c
        .get(&format!("/farm/api/bulk?ids={a},{b},{unknown},{d}"))
        .await;
    r.expect_status(200);
    assert_eq!(
        ids_of(r.json().as_array().unwrap()),
        BTreeSet::from([a.clone(), d])
    );

    let r = c.get(&format!("/farm/api/bulk?ids={unknown}")).await;
    r.expect_status(200);
    assert_eq!(r.json(), json!([]));

    for path in [
        "/farm/api/bulk",
        "/farm/api/bulk?ids=",
        "/farm/api/bulk?ids=,",
    ] {
        let r = c.get(path).await;
        assert_eq!(
            assert_json_error(&r, 400),
            json!({"error": "Missing ids parameter"}),
            "{path}"
        );
    }
}

// ------------------------------------------------------------------------------------------
// reads as of a moment, and query parameters
// ------------------------------------------------------------------------------------------

/// A moment in milliseconds as RFC 3339 (UTC, milliseconds), percent-encoded for a query.
fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        .replace(':', "%3A")
}

#[tokio::test]
async fn rest_reads_as_of_a_moment_answer_what_graphql_answers() {
    let s = start();
    let c = s.client();
    let f = create(&c, "/farm/api", &farm("Emerdale")).await;
    let coop =
        |name: &str| json!({"name": name, "farm_id": f, "capacity": 12, "coop_type": "a-frame"});
    let id = create(&c, "/coop/api", &coop("red")).await;
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    c.put_json(&format!("/coop/api/{id}"), &coop("purple"))
        .await
        .expect_status(200);
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    c.delete(&format!("/coop/api/{id}"))
        .await
        .expect_status(200);

    // the three versions' stamps, from the change feed
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let stamps: Vec<i64> = loop {
        let of_coop: Vec<i64> = feed(&c)
            .await
            .iter()
            .filter(|ch| ch["entity"] == "coop" && ch["id"] == id.as_str())
            .map(|ch| ch["created_at"].as_i64().unwrap())
            .collect();
        if of_coop.len() == 3 {
            break of_coop;
        }
        assert!(std::time::Instant::now() < deadline, "{of_coop:?}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let (created, renamed, deleted) = (stamps[0], stamps[1], stamps[2]);
    // each moment, and the name the coop had then (None: not there)
    let moments = [
        (created - 1, None),
        (created, Some("red")),
        (renamed - 1, Some("red")),
        (renamed, Some("purple")),
        (deleted - 1, Some("purple")),
        (deleted, None),
        (deleted + 60_000, None),
    ];
    for (at, expected) in moments {
        let graph = gql(
            &s,
            "/coop/graph",
            &format!(r#"{{ one: getById(id: "{id}", at: {at}) {{ name }} all: getAll(at: {at}) {{ id name }} }}"#),
        )
        .await;
        let graph_one = graph["one"]["name"].as_str();
        let graph_all: Vec<&str> = graph["all"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["id"] == id.as_str())
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(graph_one, expected, "GraphQL getById at {at}");
        assert_eq!(
            graph_all,
            Vec::from_iter(expected),
            "GraphQL getAll at {at}"
        );

        for moment in [at.to_string(), rfc3339(at)] {
            let r = c.get(&format!("/coop/api/{id}?at={moment}")).await;
            match expected {
                Some(name) => {
                    r.expect_status(200);
                    assert_eq!(r.json()["name"], name, "REST by id at {moment}");
                }
                None => {
                    let body = assert_json_error(&r, 404);
                    assert!(body.get("hint").is_none(), "{body}");
                }
            }
            for list in [
                format!("/coop/api?at={moment}"),
                format!("/coop/api?at={moment}&limit=5"),
                format!("/coop/api/bulk?ids={id}&at={moment}"),
            ] {
                let names: Vec<String> = c
                    .list(&list)
                    .await
                    .iter()
                    .filter(|c| c["id"] == id.as_str())
                    .map(|c| c["name"].as_str().unwrap().to_owned())
                    .collect();
                assert_eq!(names, Vec::from_iter(expected.map(str::to_owned)), "{list}");
            }
        }
    }
    // the farm's GraphQL relationship and REST agree at the coop's first moment too
    let graph = gql(
        &s,
        "/farm/graph",
        &format!(r#"{{ getById(id: "{f}", at: {created}) {{ coops {{ id name }} }} }}"#),
    )
    .await;
    assert_eq!(
        graph["getById"]["coops"],
        json!([{"id": id, "name": "red"}])
    );

    // a moment in seconds is read as milliseconds, and the 404 says so
    let seconds = created / 1000;
    let body = assert_json_error(&c.get(&format!("/coop/api/{id}?at={seconds}")).await, 404);
    let hint = body["hint"].as_str().expect("a hint");
    assert!(
        hint.contains("milliseconds") && hint.contains(&(seconds * 1000).to_string()),
        "{hint}"
    );
    // a moment that is not one
    let body = assert_json_error(&c.get(&format!("/coop/api/{id}?at=yesterday")).await, 400);
    assert_eq!(body["parameter"], "at", "{body}");
}

#[tokio::test]
async fn every_rest_route_refuses_a_query_parameter_it_does_not_take() {
    let s = start();
    let c = s.client();
    let f = create(&c, "/farm/api", &farm("Emerdale")).await;
    let one = format!("/farm/api/{f}");
    let routes: Vec<(&str, String, &str)> = vec![
        ("GET", "/farm/api?lmit=1".into(), "limit, after, at"),
        ("GET", "/farm/api/?lmit=1".into(), "limit, after, at"),
        ("GET", format!("{one}?as_of=1"), "at"),
        ("GET", format!("/farm/api/bulk?ids={f}&idz=1"), "ids, at"),
        ("POST", "/farm/api?dry_run=1".into(), ""),
        ("POST", "/farm/api/bulk?x=1".into(), ""),
        ("PUT", format!("{one}?x=1"), ""),
        ("DELETE", format!("{one}?x=1"), ""),
        ("GET", "/farm/api/api-docs?x=1".into(), ""),
        ("GET", "/farm/api/api-docs/swagger.json?x=1".into(), ""),
        ("GET", "/farm/api/health?x=1".into(), ""),
        ("GET", "/farm/api/ready?x=1".into(), ""),
    ];
    for (method, path, known) in routes {
        let body = match method {
            "POST" if path.contains("bulk") => Some(json!([farm("x")]).to_string().into_bytes()),
            "POST" | "PUT" => Some(farm("x").to_string().into_bytes()),
            _ => None,
        };
        let r = c
            .request(method, &path, body, &[("content-type", "application/json")])
            .await;
        let e = assert_json_error(&r, 400);
        let name = path.rsplit_once('?').unwrap().1.rsplit('&').next().unwrap();
        let name = name.split('=').next().unwrap();
        assert_eq!(e["parameter"], name, "{method} {path}: {e}");
        let message = e["error"].as_str().unwrap();
        if known.is_empty() {
            assert!(
                message.contains("takes no query parameters"),
                "{method} {path}: {message}"
            );
        } else {
            assert!(
                message.contains(&format!("(this route takes: {known})")),
                "{method} {path}: {message}"
            );
        }
    }
    // the misspelling is recognised
    let e = c.get("/farm/api?lmit=1").await.json();
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .contains("did you mean `limit`?"),
        "{e}"
    );
    // nothing was written by the refused writes
    assert_eq!(c.list("/farm/api").await.len(), 1);
    assert_eq!(c.get(&one).await.json()["name"], "Emerdale");
}

// ------------------------------------------------------------------------------------------
// docs, CORS, ops
// ------------------------------------------------------------------------------------------

#[tokio::test]
async fn openapi_document_describes_the_restlette() {
    let s = start();
    let c = s.client();
    let r = c.get("/farm/api/api-docs/swagger.json").await;
    r.expect_status(200);
    assert_eq!(r.content_type(), "application/json");
    let doc = r.json();
    assert!(
        doc["openapi"].as_str().unwrap_or("").starts_with("3."),
        "{}",
        doc["openapi"]
    );
    // an absolute server URL for the host asked, which generated clients need
    assert_eq!(
        doc["servers"],
        json!([{"url": format!("http://127.0.0.1:{}", s.port())}])
    );
    let paths = doc["paths"].as_object().expect("paths");
    assert_eq!(paths.keys().next().map(String::as_str), Some("/farm/api"));
    assert!(paths.contains_key("/farm/api/{id}"));
    assert!(paths.contains_key("/farm/api/bulk"));
    let ops: BTreeSet<&str> = paths
        .values()
        .flat_map(|p| p.as_object().unwrap().values())
        .filter_map(|op| op.get("operationId").and_then(Value::as_str))
        .collect();
    assert_eq!(
        ops,
        BTreeSet::from([
            "list",
            "create",
            "read",
            "update",
            "delete",
            "bulk_read",
            "bulk_create"
        ])
    );

    let schema_file = egg_economy().join("schema/farm.schema.json");
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(schema_file).unwrap()).unwrap();
    let state = &doc["components"]["schemas"]["State"];
    assert_eq!(state["properties"], schema["properties"]);
    assert_eq!(state["required"], schema["required"]);
    assert!(state.get("$schema").is_none(), "{state}");
    assert!(doc["components"]["schemas"]["OperationStatus"].is_object());

    // every entity has its own document
    let hen = c.get("/hen/api/api-docs/swagger.json").await.json();
    assert_eq!(
        hen["paths"].as_object().unwrap().keys().next().unwrap(),
        "/hen/api"
    );
}

#[tokio::test]
async fn swagger_ui_and_graphiql_pages_are_served() {
    let s = start();
    let c = s.client();

    let r = c.get("/farm/api/api-docs").await;
    r.expect_status(200);
    assert_eq!(r.content_type(), "text/html");
    assert!(r.text.contains("swagger"), "{}", r.text);
    assert!(r.text.contains("/farm/api/api-docs/swagger.json"));

    let r = c.get("/_meshql/assets/swagger-ui-bundle.js").await;
    r.expect_status(200);
    assert!(r.content_type().contains("javascript"), "{r:?}");
    assert!(r.text.len() > 1000);
    assert_json_error(&c.get("/_meshql/assets/nothing.js").await, 404);

    let r = c
        .request("GET", "/farm/graph", None, &[("accept", "text/html")])
        .await;
    r.expect_status(200);
    assert_eq!(r.content_type(), "text/html");
    assert!(r.text.contains("GraphiQL"), "{}", r.text);
    assert!(r.text.contains("/farm/graph"));
}

#[tokio::test]
async fn cors_headers_are_on_every_response() {
    let s = start();
    let c = s.client();
    let id = create(&c, "/farm/api", &farm("cors")).await;
    let responses: Vec<Response> = vec![
        c.post_json("/farm/api", &farm("cors-2")).await,
        c.get("/farm/api").await,
        c.get(&format!("/farm/api/{id}")).await,
        c.get("/farm/api/fb3a1c5e-0000-4000-8000-000000000000")
            .await,
        c.post_json("/farm/api", &json!({})).await,
        c.request("PATCH", "/farm/api", None, &[]).await,
        c.get("/health").await,
        c.get("/no/such/route").await,
        c.get("/farm/api/api-docs/swagger.json").await,
        c.post_json("/farm/graph", &json!({"query": "{ getAll { id } }"}))
            .await,
    ];
    for r in &responses {
        assert_eq!(r.header("access-control-allow-origin"), Some("*"), "{r:?}");
    }

    for path in ["/farm/api", &format!("/farm/api/{id}"), "/farm/graph"] {
        let r = c
            .request(
                "OPTIONS",
                path,
                None,
                &[
                    ("origin", "http://example.com"),
                    ("access-control-request-method", "POST"),
                ],
            )
            .await;
        r.expect_status(200);
        assert_eq!(r.header("access-control-allow-origin"), Some("*"));
        let methods = r
            .header("access-control-allow-methods")
            .expect("allow-methods");
        for m in ["GET", "POST", "PUT", "DELETE", "OPTIONS"] {
            assert!(methods.contains(m), "{methods}");
        }
        let headers = r
            .header("access-control-allow-headers")
            .expect("allow-headers");
        assert!(headers.contains("Content-Type"), "{headers}");
        assert!(headers.contains("Authorization"), "{headers}");
    }
    // OPTIONS wrote nothing
    assert_eq!(c.list("/farm/api").await.len(), 2);
}

#[tokio::test]
async fn health_ready_and_unknown_routes() {
    let s = start();
    let c = s.client();

    let r = c.get("/health").await;
    r.expect_status(200);
    assert_eq!(r.content_type(), "application/json");
    assert_eq!(r.json(), json!({"status": "ok"}));

    let r = c.get("/ready").await;
    r.expect_status(200);
    assert_eq!(r.json(), json!({"status": "ok"}));

    let r = c.get("/farm/api/health").await;
    r.expect_status(200);
    assert_eq!(r.json(), json!({"status": "ok"}));

    for path in ["/nope", "/farm", "/farm/api/x/y"] {
        let r = c.get(path).await;
        let err = assert_json_error(&r, 404);
        assert!(!err["error"].as_str().unwrap().is_empty(), "{path}: {err}");
    }
}

// ------------------------------------------------------------------------------------------
// persistence, concurrency
// ------------------------------------------------------------------------------------------

#[tokio::test]
async fn documents_survive_a_graceful_restart() {
    let data = tempfile::tempdir().unwrap();
    let config = egg_economy();

    let s = Server::start_with_data_dir(&config, data.path(), &[]);
    let c = s.client();
    let mut expected: HashMap<String, (String, Value)> = HashMap::new();
    let farm_id = create(&c, "/farm/api", &farm("durable")).await;
    expected.insert(
        farm_id.clone(),
        ("/farm/api".into(), with_id(&farm("durable"), &farm_id)),
    );
    let coop = json!({"name": "c", "farm_id": farm_id, "capacity": 3, "coop_type": "ark"});
    let coop_id = create(&c, "/coop/api", &coop).await;
    expected.insert(
        coop_id.clone(),
        ("/coop/api".into(), with_id(&coop, &coop_id)),
    );
    let report = json!({"hen_id": coop_id, "coop_id": coop_id, "farm_id": farm_id,
                        "eggs": 2, "timestamp": "2024-05-01T08:00:00Z", "quality": "grade_a"});
    let report_id = create(&c, "/lay_report/api", &report).await;
    expected.insert(
        report_id.clone(),
        ("/lay_report/api".into(), with_id(&report, &report_id)),
    );
    // an update and a delete must survive too
    let renamed = json!({"name": "renamed", "farm_type": "megafarm", "zone": "south"});
    c.put_json(&format!("/farm/api/{farm_id}"), &renamed)
        .await
        .expect_status(200);
    expected.insert(
        farm_id.clone(),
        ("/farm/api".into(), with_id(&renamed, &farm_id)),
    );
    let doomed = create(&c, "/farm/api", &farm("doomed")).await;
    c.delete(&format!("/farm/api/{doomed}"))
        .await
        .expect_status(200);

    let status = s.stop_gracefully();
    assert!(status.success(), "meshql exited with {status}");

    let s = Server::start_with_data_dir(&config, data.path(), &[]);
    let c = s.client();
    for (id, (path, body)) in &expected {
        let r = c.get(&format!("{path}/{id}")).await;
        r.expect_status(200);
        assert_eq!(&r.json(), body);
    }
    c.get(&format!("/farm/api/{doomed}"))
        .await
        .expect_status(404);
    assert_eq!(
        ids_of(&c.list("/farm/api").await),
        BTreeSet::from([farm_id])
    );
    // deleting again after the restart is still idempotent
    c.delete(&format!("/farm/api/{doomed}"))
        .await
        .expect_status(200);
    let status = s.stop_gracefully();
    assert!(status.success(), "meshql exited with {status}");
}

fn not_2xx(what: &str, r: &Response) -> Option<String> {
    (!(200..300).contains(&r.status)).then(|| format!("{what}: {} {}", r.status, r.text))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_see_their_writes() {
    const CLIENTS: usize = 50;
    const ITERATIONS: usize = 10;
    let s = start();
    let c = s.client();
    let prefix = format!("conc-{}-", std::process::id());

    let mut tasks = Vec::new();
    for t in 0..CLIENTS {
        let c = c.clone();
        let prefix = prefix.clone();
        tasks.push(tokio::spawn(async move {
            let mut failures: Vec<String> = Vec::new();
            let mut ids = Vec::new();
            for i in 0..ITERATIONS {
                let name = format!("{prefix}{t}-{i}");
                let payload =
                    json!({"name": name, "farm_type": "local_farm", "zone": format!("z{t}")});
                let r = c.post_json("/farm/api", &payload).await;
                if let Some(p) = not_2xx(&format!("POST {name}"), &r) {
                    failures.push(p);
                    continue;
                }
                let id = r.json()["id"].as_str().unwrap_or_default().to_owned();
                let path = format!("/farm/api/{id}");

                let r = c.get(&path).await;
                match not_2xx(&format!("GET {id}"), &r) {
                    Some(p) => failures.push(p),
                    None if r.json() != with_id(&payload, &id) => {
                        failures.push(format!("GET {id} returned {}", r.text))
                    }
                    None => {}
                }

                let updated = json!({"name": name, "farm_type": "megafarm",
                                     "zone": format!("z{t}"), "owner": format!("put-{t}-{i}")});
                let r = c.put_json(&path, &updated).await;
                match not_2xx(&format!("PUT {id}"), &r) {
                    Some(p) => failures.push(p),
                    None if r.json() != with_id(&updated, &id) => {
                        failures.push(format!("PUT {id} returned {}", r.text))
                    }
                    None => {}
                }

                let r = c.get("/farm/api").await;
                match not_2xx("GET list", &r) {
                    Some(p) => failures.push(p),
                    None if !r
                        .json()
                        .as_array()
                        .is_some_and(|l| l.iter().any(|f| f["id"] == id.as_str())) =>
                    {
                        failures.push(format!("the list lacks {id} right after its PUT"))
                    }
                    None => {}
                }
                ids.push(id);
            }
            (failures, ids)
        }));
    }

    let mut failures = Vec::new();
    let mut all_ids = BTreeSet::new();
    for task in tasks {
        let (f, ids) = task.await.expect("client task");
        failures.extend(f);
        all_ids.extend(ids);
    }
    assert!(
        failures.is_empty(),
        "{} failures, first: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert_eq!(all_ids.len(), CLIENTS * ITERATIONS);

    let list = c.list("/farm/api").await;
    let mine: Vec<&Value> = list
        .iter()
        .filter(|f| f["name"].as_str().is_some_and(|n| n.starts_with(&prefix)))
        .collect();
    assert_eq!(mine.len(), CLIENTS * ITERATIONS);
    assert_eq!(
        mine.iter()
            .map(|f| f["id"].as_str().unwrap().to_owned())
            .collect::<BTreeSet<_>>(),
        all_ids
    );
    for f in mine {
        let name = f["name"].as_str().unwrap();
        let suffix = name.strip_prefix(&prefix).unwrap();
        assert_eq!(f["farm_type"], "megafarm", "PUT not visible: {f}");
        assert_eq!(f["owner"], format!("put-{suffix}"), "PUT not visible: {f}");
    }
}

/// `meshql_http_request_duration_seconds{route,method,status}` from `/metrics`: the count of
/// one series (0 when absent).
fn request_count(metrics: &str, route: &str, method: &str, status: u16) -> u64 {
    let prefix = format!(
        "meshql_http_request_duration_seconds_count{{route=\"{route}\",method=\"{method}\",status=\"{status}\"}} "
    );
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse().expect("a count"))
}

#[tokio::test]
async fn metrics_time_requests_per_route_pattern_method_and_status() {
    let s = start();
    let c = s.client();
    let id = create(&c, "/farm/api", &farm("timed")).await;
    for _ in 0..3 {
        c.get(&format!("/farm/api/{id}")).await.expect_status(200);
    }
    c.get("/farm/api/no-such-id").await.expect_status(404);
    let r = c
        .post_json(
            "/farm/graph",
            &json!({"query": format!("{{ getById(id: \"{id}\") {{ name }} }}")}),
        )
        .await;
    r.expect_status(200);
    let metrics = c.get("/metrics").await.text;
    // the pattern, never the id: one series for every document
    let by_id = "/farm/api/{id}";
    assert_eq!(request_count(&metrics, by_id, "GET", 200), 3, "{metrics}");
    assert_eq!(request_count(&metrics, by_id, "GET", 404), 1);
    assert_eq!(request_count(&metrics, "/farm/api", "POST", 201), 1);
    assert_eq!(request_count(&metrics, "/farm/graph", "POST", 200), 1);
    assert!(!metrics.contains(&id), "an id leaked into a label");
    // buckets are cumulative and end at +Inf with the count
    let inf = format!(
        "meshql_http_request_duration_seconds_bucket{{route=\"{by_id}\",method=\"GET\",status=\"200\",le=\"+Inf\"}} 3"
    );
    assert!(metrics.contains(&inf), "{metrics}");
    assert!(metrics.contains("# TYPE meshql_http_request_duration_seconds histogram"));
}

#[tokio::test]
async fn debug_logs_time_each_stage_of_a_request() {
    let s = Server::start(
        &egg_economy(),
        &[
            "--log-format",
            "json",
            "--log-level",
            "info,meshql_server=debug,meshql_graphql=debug",
        ],
    );
    let c = s.client();
    let farm = c
        .post_json(
            "/farm/api",
            &json!({"name": "Staged", "farm_type": "megafarm", "zone": "north"}),
        )
        .await;
    farm.expect_status(201);
    let id = farm.json()["id"].as_str().unwrap().to_owned();
    // `farmOutput` is in another SQLite file: the tree is read level by level
    let query = format!(
        r#"{{ getById(id: "{id}") {{ name coops {{ name }} farmOutput {{ eggs_today }} }} }}"#
    );
    c.post_json("/farm/graph", &json!({ "query": query }))
        .await
        .expect_status(200);
    // within one file: one storage call reads the tree
    let query = format!(r#"{{ getById(id: "{id}") {{ name coops {{ name }} }} }}"#);
    c.post_json("/farm/graph", &json!({ "query": query }))
        .await
        .expect_status(200);
    // `close` lines of the spans, each with its busy and idle time and its parents
    let closed = |v: &Value, name: &str| {
        v["fields"]["message"] == "close"
            && v["span"]["name"] == name
            && v["fields"]["time.busy"].is_string()
            && v["fields"]["time.idle"].is_string()
    };
    let parents = |v: &Value| -> Vec<String> {
        v["spans"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|s| s["name"].as_str().unwrap_or("").to_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    type Wanted<'a> = (&'a str, &'a dyn Fn(&Value) -> bool);
    let wanted: [Wanted; 5] = [
        ("the create's storage call inside its POST", &|v| {
            closed(v, "storage")
                && v["span"]["entity"] == "farm"
                && v["span"]["op"] == "create"
                && parents(v) == ["request"]
        }),
        ("the GraphQL plan inside its request", &|v| {
            closed(v, "graphql_plan") && parents(v) == ["request"]
        }),
        ("the farm's storage read inside graphql_execute", &|v| {
            closed(v, "storage")
                && v["span"]["entity"] == "farm"
                && parents(v) == ["request", "graphql_execute"]
        }),
        ("the coops' batched read inside graphql_execute", &|v| {
            closed(v, "storage")
                && v["span"]["entity"] == "coop"
                && v["span"]["op"] == "find_batch"
                && parents(v) == ["request", "graphql_execute"]
        }),
        ("the farm's tree read inside graphql_execute", &|v| {
            closed(v, "storage")
                && v["span"]["entity"] == "farm"
                && v["span"]["op"] == "find_nested"
                && parents(v) == ["request", "graphql_execute"]
        }),
    ];
    for (what, matches) in wanted {
        let mut found = false;
        for _ in 0..200 {
            found = s
                .log()
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .any(|v| matches(&v));
            if found {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        assert!(found, "no log line for {what}:\n{}", s.log());
    }
}

#[tokio::test]
async fn json_logs_carry_the_request_span() {
    let s = Server::start(
        &egg_economy(),
        &[
            "--log-format",
            "json",
            "--log-level",
            "info,meshql_server=debug",
        ],
    );
    let c = s.client();
    c.get("/farm/api/no-such-id").await.expect_status(404);
    // the line is written when the response is; poll the log rather than assume
    let mut answered = None;
    for _ in 0..200 {
        answered = s
            .log()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["fields"]["message"] == "answered" && v["fields"]["status"] == 404);
        if answered.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let line = answered.unwrap_or_else(|| panic!("no JSON `answered` line:\n{}", s.log()));
    assert_eq!(line["level"], "DEBUG");
    assert_eq!(line["span"]["name"], "request");
    assert_eq!(line["span"]["route"], "/farm/api/{id}");
    assert_eq!(line["span"]["method"], "GET");
    // every line is JSON, the start-up line included
    let log = s.log();
    // (processors and consumers log their start too)
    log.lines()
        .filter(|l| l.starts_with('{'))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| {
            v["level"] == "INFO"
                && v["fields"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("serving"))
        })
        .unwrap_or_else(|| panic!("no JSON INFO `serving` line:\n{log}"));
}

/// `write_response = "see_other"`: creates and updates answer as MeshQL's TypeScript services
/// do, 303 + `Location`, no body; the document is where the `Location` says.
#[tokio::test]
async fn see_other_mode_answers_creates_and_updates_with_303_and_location() {
    let dir = example_copy("egg-economy", |c| {
        format!("write_response = \"see_other\"\n{c}")
    });
    let s = Server::start(dir.path(), &[]);
    let c = s.client();
    let created = c
        .post_json(
            "/farm/api",
            &json!({"name": "Redirected", "farm_type": "megafarm", "zone": "north"}),
        )
        .await;
    created.expect_status(303);
    assert_eq!(created.text, "", "a 303 has no body");
    let location = created.header("location").expect("Location").to_owned();
    let id = location
        .strip_prefix("/farm/api/")
        .unwrap_or_else(|| panic!("Location {location}"));
    // MeshQL's TypeScript suites take the id as the Location's last 36 characters
    assert!(
        is_rfc4122_uuid(&location[location.len() - 36..]),
        "{location}"
    );
    let read = c.get(&location).await;
    read.expect_status(200);
    assert_eq!(read.json()["name"], "Redirected");
    assert_eq!(read.json()["id"], id);

    let updated = c
        .put_json(
            &location,
            &json!({"name": "Redirected again", "farm_type": "megafarm", "zone": "north"}),
        )
        .await;
    updated.expect_status(303);
    assert_eq!(updated.header("location"), Some(location.as_str()));
    assert_eq!(updated.text, "");
    assert_eq!(c.get(&location).await.json()["name"], "Redirected again");
    // errors are unchanged: a PUT of nothing is a 404, a bad body a 400
    c.put_json(
        "/farm/api/no-such-id",
        &json!({"name": "x", "farm_type": "megafarm", "zone": "north"}),
    )
    .await
    .expect_status(404);
    c.post_json("/farm/api", &json!({"name": 7}))
        .await
        .expect_status(400);
    // the OpenAPI document says so
    let doc = c.get("/farm/api/api-docs/swagger.json").await.json();
    assert!(doc["paths"]["/farm/api"]["post"]["responses"]["303"].is_object());
    assert!(doc["paths"]["/farm/api/{id}"]["put"]["responses"]["303"].is_object());
}

#[tokio::test]
async fn default_write_answers_are_201_and_200_with_the_document() {
    let s = start();
    let c = s.client();
    let created = c
        .post_json(
            "/farm/api",
            &json!({"name": "Plain", "farm_type": "megafarm", "zone": "north"}),
        )
        .await;
    created.expect_status(201);
    let id = created.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(
        created.header("location"),
        Some(format!("/farm/api/{id}").as_str())
    );
    let updated = c
        .put_json(
            &format!("/farm/api/{id}"),
            &json!({"name": "Plain again", "farm_type": "megafarm", "zone": "north"}),
        )
        .await;
    updated.expect_status(200);
    assert_eq!(updated.json()["name"], "Plain again");
}

#[test]
fn an_unknown_write_response_is_a_config_error_with_its_line() {
    let dir = example_copy("egg-economy", |c| {
        format!("write_response = \"redirect\"\n{c}")
    });
    let config = dir.path().join("meshql.toml");
    let out = common::run_meshql(
        &["check", config.to_str().unwrap()],
        std::time::Duration::from_secs(30),
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("meshql.toml:1") && stderr.contains("see_other"),
        "{stderr}"
    );
}
