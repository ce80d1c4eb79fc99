//! Roles and permissions through the binary (issue 11 item 5): roles from a JWT claim and
//! `[entity.permissions.<role>]` tables, a Casbin policy's `p` lines, and HTTP federation
//! with the caller's token forwarded. A refused action is a 403 JSON body with
//! `"code":"FORBIDDEN"` on REST and `/_changes`, and a GraphQL error with
//! `extensions.code = "FORBIDDEN"` on roots, on in-process relationships and across HTTP
//! federation; masked fields are absent from REST bodies and the change feed, and null with
//! a `FORBIDDEN` error when selected in GraphQL. Authorized tokens still filter rows.

mod common;

use common::{bearer_with, examples_dir, Client, Response, Server};
use serde_json::{json, Value};

/// A token for `sub` with these roles in its `roles` claim.
fn token(sub: &str, roles: &[&str]) -> String {
    bearer_with(&json!({"sub": sub, "roles": roles}))
}

async fn call(c: &Client, method: &str, path: &str, body: Option<&Value>, auth: &str) -> Response {
    let headers: Vec<(&str, &str)> = if auth.is_empty() {
        Vec::new()
    } else {
        vec![("authorization", auth)]
    };
    c.request(
        method,
        path,
        body.map(|b| b.to_string().into_bytes()),
        &headers,
    )
    .await
}

async fn graphql(c: &Client, path: &str, query: &str, auth: &str) -> Value {
    let r = call(c, "POST", path, Some(&json!({ "query": query })), auth).await;
    r.expect_status(200);
    r.json()
}

#[track_caller]
fn forbidden(r: &Response) {
    r.expect_status(403);
    assert_eq!(r.json()["code"], "FORBIDDEN", "{}", r.text);
    assert!(r.json()["error"].as_str().is_some(), "{}", r.text);
}

/// The errors' (path, code) pairs of a GraphQL response.
fn error_paths(body: &Value) -> Vec<(Value, Value)> {
    body["errors"]
        .as_array()
        .map(|errors| {
            errors
                .iter()
                .map(|e| (e["path"].clone(), e["extensions"]["code"].clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// The farm example with in-process relationships, JWT roles from `roles`, and `permissions`
/// inserted into each entity (`(entity, toml)`), plus `auth` lines.
fn farm_with(permissions: &[(&str, &str)], auth: &str) -> tempfile::TempDir {
    let permissions: Vec<(String, String)> = permissions
        .iter()
        .map(|(e, t)| (e.to_string(), t.to_string()))
        .collect();
    let auth = auth.to_owned();
    common::example_copy("farm", move |mut text| {
        for (graph, path) in [
            ("coop", "/coop/graph"),
            ("farm", "/farm/graph"),
            ("hen", "/hen/graph"),
        ] {
            text = text.replace(
                &format!("url = \"${{PLATFORM_URL:-http://localhost:3033}}/{graph}/graph\""),
                &format!("graph = \"{path}\""),
            );
        }
        for (entity, table) in &permissions {
            let anchor = format!("name = \"{entity}\"\nstorage = \"farm\"\n");
            assert!(text.contains(&anchor), "{entity} in the farm example");
            text = text.replace(&anchor, &format!("{anchor}{table}\n"));
        }
        text + "\n[auth]\n" + &auth
    })
}

const READER_EDITOR: [(&str, &str); 3] = [
    (
        "farm",
        "[entity.permissions.reader]\nactions = [\"read\"]\n[entity.permissions.editor]\nactions = [\"read\", \"create\", \"update\", \"delete\"]",
    ),
    (
        "coop",
        "[entity.permissions.reader]\nactions = [\"read\"]\nhidden_fields = [\"farm_id\"]\n[entity.permissions.editor]\nactions = [\"read\", \"create\", \"update\", \"delete\"]",
    ),
    // the reader has no row here: it may not read hens
    (
        "hen",
        "[entity.permissions.editor]\nactions = [\"read\", \"create\", \"update\", \"delete\"]",
    ),
];

fn jwt_roles_auth() -> String {
    format!(
        "type = \"jwt\"\nsecret = \"{}\"\nroles_claim = \"roles\"\n",
        common::JWT_SECRET
    )
}

#[tokio::test]
async fn roles_from_a_claim_decide_rest_graphql_and_the_change_feed() {
    let dir = farm_with(&READER_EDITOR, &jwt_roles_auth());
    // the farm graph's Coop projection gets farm_id, for a mask in a nested relationship
    let sdl = dir.path().join("graph/farm.graphql");
    let text = std::fs::read_to_string(&sdl).unwrap();
    assert!(text.contains("type Coop {\n  id: ID\n"));
    std::fs::write(
        &sdl,
        text.replace(
            "type Coop {\n  id: ID\n",
            "type Coop {\n  id: ID\n  farm_id: ID\n",
        ),
    )
    .unwrap();
    let server = Server::start(&dir.path().join("meshql.toml"), &[]);
    let c = server.client();
    let editor = token("ed", &["editor"]);
    let reader = token("ray", &["reader", "unrelated"]);
    let nobody = token("nobody", &[]);

    // what the editor writes carries its subject as the authorized token, so a reader sees
    // it only with the same subject (rows), whatever its roles (permissions)
    let reader_same_rows = bearer_with(&json!({"sub": "ed", "roles": ["reader"]}));
    let farm = call(
        &c,
        "POST",
        "/farm/api",
        Some(&json!({"name": "Emerdale"})),
        &editor,
    )
    .await;
    farm.expect_status(201);
    let farm_id = farm.json()["id"].as_str().unwrap().to_owned();
    let coop = call(
        &c,
        "POST",
        "/coop/api",
        Some(&json!({"name": "red", "farm_id": farm_id})),
        &editor,
    )
    .await;
    coop.expect_status(201);
    let coop_id = coop.json()["id"].as_str().unwrap().to_owned();
    call(
        &c,
        "POST",
        "/hen/api",
        Some(&json!({"name": "chuck", "coop_id": coop_id, "eggs": 3})),
        &editor,
    )
    .await
    .expect_status(201);

    // a reader reads
    let r = call(
        &c,
        "GET",
        &format!("/farm/api/{farm_id}"),
        None,
        &reader_same_rows,
    )
    .await;
    r.expect_status(200);
    assert_eq!(r.json()["name"], "Emerdale");
    let list = call(&c, "GET", "/farm/api", None, &reader_same_rows).await;
    list.expect_status(200);
    assert_eq!(list.json().as_array().unwrap().len(), 1);
    // ... but writes nothing: 403 JSON, nothing stored
    forbidden(
        &call(
            &c,
            "POST",
            "/farm/api",
            Some(&json!({"name": "x"})),
            &reader,
        )
        .await,
    );
    forbidden(&call(&c, "POST", "/farm/api", Some(&json!({"oops": 1})), &reader).await);
    forbidden(
        &call(
            &c,
            "POST",
            "/farm/api/bulk",
            Some(&json!([{"name": "x"}])),
            &reader,
        )
        .await,
    );
    forbidden(
        &call(
            &c,
            "PUT",
            &format!("/farm/api/{farm_id}"),
            Some(&json!({"name": "renamed"})),
            &reader_same_rows,
        )
        .await,
    );
    forbidden(
        &call(
            &c,
            "DELETE",
            &format!("/farm/api/{farm_id}"),
            None,
            &reader_same_rows,
        )
        .await,
    );
    let r = call(&c, "GET", &format!("/farm/api/{farm_id}"), None, &editor).await;
    assert_eq!(r.json()["name"], "Emerdale", "nothing changed");
    assert_eq!(
        call(&c, "GET", "/farm/api", None, &editor)
            .await
            .json()
            .as_array()
            .unwrap()
            .len(),
        1
    );

    // authorized tokens still filter rows: the reader with its own subject sees nothing
    assert_eq!(
        call(&c, "GET", "/farm/api", None, &reader).await.json(),
        json!([])
    );
    call(&c, "GET", &format!("/farm/api/{farm_id}"), None, &reader)
        .await
        .expect_status(404);

    // a role without read: 403 on REST, FORBIDDEN on a GraphQL root
    forbidden(&call(&c, "GET", "/hen/api", None, &reader_same_rows).await);
    forbidden(&call(&c, "GET", "/farm/api", None, &nobody).await);
    forbidden(&call(&c, "GET", "/farm/api", None, "").await);
    let body = graphql(&c, "/hen/graph", "{ getAll { name } }", &reader_same_rows).await;
    assert_eq!(body["data"]["getAll"], Value::Null, "{body}");
    assert_eq!(
        error_paths(&body),
        vec![(json!(["getAll"]), json!("FORBIDDEN"))]
    );

    // ... and on a nested relationship, in-process: the rest of the answer stands
    let q = format!("{{ getById(id: \"{farm_id}\") {{ name coops {{ name hens {{ name }} }} }} }}");
    let body = graphql(&c, "/farm/graph", &q, &reader_same_rows).await;
    assert_eq!(
        body["data"],
        json!({"getById": {"name": "Emerdale", "coops": [{"name": "red", "hens": null}]}}),
        "{body}"
    );
    assert_eq!(
        error_paths(&body),
        vec![(json!(["getById", "coops", 0, "hens"]), json!("FORBIDDEN"))]
    );
    let body = graphql(&c, "/farm/graph", &q, &editor).await;
    assert_eq!(
        body["data"]["getById"]["coops"][0]["hens"],
        json!([{"name": "chuck"}])
    );
    assert!(body.get("errors").is_none(), "{body}");

    // masked fields: absent from REST, null + FORBIDDEN when selected in GraphQL
    let r = call(
        &c,
        "GET",
        &format!("/coop/api/{coop_id}"),
        None,
        &reader_same_rows,
    )
    .await;
    r.expect_status(200);
    assert_eq!(r.json(), json!({"id": coop_id, "name": "red"}));
    let list = call(&c, "GET", "/coop/api?limit=10", None, &reader_same_rows).await;
    assert_eq!(list.json(), json!([{"id": coop_id, "name": "red"}]));
    let r = call(&c, "GET", &format!("/coop/api/{coop_id}"), None, &editor).await;
    assert_eq!(r.json()["farm_id"], json!(farm_id), "the editor sees it");
    let q = format!("{{ getById(id: \"{coop_id}\") {{ id name farm_id }} }}");
    let body = graphql(&c, "/coop/graph", &q, &reader_same_rows).await;
    assert_eq!(
        body["data"],
        json!({"getById": {"id": coop_id, "name": "red", "farm_id": null}})
    );
    assert_eq!(
        error_paths(&body),
        vec![(json!(["getById", "farm_id"]), json!("FORBIDDEN"))]
    );
    // ... and in a nested in-process relationship
    let q = format!("{{ getById(id: \"{farm_id}\") {{ coops {{ name farm_id }} }} }}");
    let body = graphql(&c, "/farm/graph", &q, &reader_same_rows).await;
    assert_eq!(
        body["data"],
        json!({"getById": {"coops": [{"name": "red", "farm_id": null}]}})
    );
    assert_eq!(
        error_paths(&body),
        vec![(
            json!(["getById", "coops", 0, "farm_id"]),
            json!("FORBIDDEN")
        )]
    );
    let body = graphql(&c, "/farm/graph", &q, &editor).await;
    assert_eq!(
        body["data"]["getById"]["coops"][0]["farm_id"],
        json!(farm_id)
    );
    // a masked key still resolves the relationship (the target's own permission decides)
    let q = format!("{{ getById(id: \"{coop_id}\") {{ name farm {{ name }} }} }}");
    let body = graphql(&c, "/coop/graph", &q, &reader_same_rows).await;
    assert_eq!(
        body["data"]["getById"]["farm"]["name"], "Emerdale",
        "{body}"
    );

    // the change feed: an entity the caller may not read is refused when named, left out
    // otherwise, and masked payloads lose their hidden fields
    forbidden(&call(&c, "GET", "/_changes?entity=hen", None, &reader_same_rows).await);
    forbidden(&call(&c, "GET", "/_changes?entity=farm,lay_report", None, &nobody).await);
    // lay_report has no permissions table: anyone reads it, and only it
    let r = call(&c, "GET", "/_changes?since=0", None, &nobody).await;
    assert_eq!(r.json()["changes"], json!([]), "{}", r.text);
    let feed = call(
        &c,
        "GET",
        "/_changes?since=0&wait_ms=2000",
        None,
        &reader_same_rows,
    )
    .await;
    feed.expect_status(200);
    let changes = feed.json()["changes"].as_array().unwrap().clone();
    let entities: Vec<&str> = changes
        .iter()
        .map(|c| c["entity"].as_str().unwrap())
        .collect();
    assert!(!entities.contains(&"hen"), "{entities:?}");
    assert!(entities.contains(&"farm"), "{entities:?}");
    let coop_change = changes
        .iter()
        .find(|c| c["entity"] == "coop")
        .expect("the coop's change");
    assert_eq!(coop_change["payload"].get("farm_id"), None, "{coop_change}");
    assert_eq!(coop_change["payload"]["name"], "red");
    let all = call(&c, "GET", "/_changes?since=0", None, &editor)
        .await
        .json();
    let all_entities: Vec<&str> = all["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["entity"].as_str().unwrap())
        .collect();
    assert!(all_entities.contains(&"hen"), "{all_entities:?}");
}

#[tokio::test]
async fn an_update_keeps_the_fields_a_role_cannot_see() {
    let dir = farm_with(
        &[(
            "coop",
            "[entity.permissions.keeper]\nactions = [\"read\", \"update\"]\nhidden_fields = [\"farm_id\"]\n[entity.permissions.editor]\nactions = [\"read\", \"create\", \"update\", \"delete\"]",
        )],
        &jwt_roles_auth(),
    );
    let server = Server::start(&dir.path().join("meshql.toml"), &[]);
    let c = server.client();
    let editor = bearer_with(&json!({"sub": "ed", "roles": ["editor"]}));
    let keeper = bearer_with(&json!({"sub": "ed", "roles": ["keeper"]}));
    let farm_id = "0193a0c4-0000-7000-8000-000000000001";
    let coop = call(
        &c,
        "POST",
        "/coop/api",
        Some(&json!({"name": "red", "farm_id": farm_id})),
        &editor,
    )
    .await;
    let id = coop.json()["id"].as_str().unwrap().to_owned();
    // the keeper's PUT has no farm_id (it never saw one): the schema requires it, and it
    // is kept from the current version
    let r = call(
        &c,
        "PUT",
        &format!("/coop/api/{id}"),
        Some(&json!({"name": "blue"})),
        &keeper,
    )
    .await;
    r.expect_status(200);
    assert_eq!(r.json(), json!({"id": id, "name": "blue"}), "masked answer");
    let r = call(&c, "GET", &format!("/coop/api/{id}"), None, &editor).await;
    assert_eq!(r.json()["farm_id"], farm_id, "{}", r.text);
    assert_eq!(r.json()["name"], "blue");
    forbidden(&call(&c, "DELETE", &format!("/coop/api/{id}"), None, &keeper).await);
}

#[tokio::test]
async fn casbin_policy_lines_are_enforced() {
    let auth = format!(
        "type = \"casbin\"\nsecret = \"{}\"\nmodel = \"rbac_model.conf\"\npolicy = \"rbac_policy.csv\"\n",
        common::JWT_SECRET
    );
    let dir = farm_with(
        &[(
            "coop",
            "[entity.permissions.viewer]\nhidden_fields = [\"farm_id\"]",
        )],
        &auth,
    );
    std::fs::write(
        dir.path().join("rbac_model.conf"),
        "[request_definition]\nr = sub, obj, act\n[policy_definition]\np = sub, obj, act\n[role_definition]\ng = _, _\n[policy_effect]\ne = some(where (p.eft == allow))\n[matchers]\nm = g(r.sub, p.sub) && r.obj == p.obj && r.act == p.act\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("rbac_policy.csv"),
        "p, admin, farm, read\np, admin, farm, create\np, admin, coop, read\np, admin, coop, create\np, viewer, farm, read\np, viewer, coop, read\np, anonymous, farm, read\ng, alice, admin\ng, amy, admin\ng, bob, viewer\n",
    )
    .unwrap();
    let server = Server::start(&dir.path().join("meshql.toml"), &[]);
    let c = server.client();
    let alice = common::bearer("alice");
    let amy = common::bearer("amy");
    let bob = common::bearer("bob");
    let carol = common::bearer("carol");

    let farm = call(
        &c,
        "POST",
        "/farm/api",
        Some(&json!({"name": "ops"})),
        &alice,
    )
    .await;
    farm.expect_status(201);
    let farm_id = farm.json()["id"].as_str().unwrap().to_owned();
    let coop = call(
        &c,
        "POST",
        "/coop/api",
        Some(&json!({"name": "red", "farm_id": farm_id})),
        &alice,
    )
    .await;
    coop.expect_status(201);
    // no `p` line lets a viewer create, nor anyone update/delete, nor anyone touch hens
    forbidden(&call(&c, "POST", "/farm/api", Some(&json!({"name": "x"})), &bob).await);
    forbidden(&call(&c, "DELETE", &format!("/farm/api/{farm_id}"), None, &alice).await);
    forbidden(&call(&c, "GET", "/hen/api", None, &alice).await);
    forbidden(&call(&c, "GET", "/farm/api", None, &carol).await);
    // allowed reads are still filtered by tokens (the roles): amy shares alice's role
    let r = call(&c, "GET", &format!("/farm/api/{farm_id}"), None, &amy).await;
    r.expect_status(200);
    call(&c, "GET", &format!("/farm/api/{farm_id}"), None, &bob)
        .await
        .expect_status(404);
    assert_eq!(
        call(&c, "GET", "/farm/api", None, "").await.json(),
        json!([])
    );
    // GraphQL: a root the policy refuses
    let body = graphql(&c, "/hen/graph", "{ getAll { name } }", &alice).await;
    assert_eq!(
        error_paths(&body),
        vec![(json!(["getAll"]), json!("FORBIDDEN"))]
    );
    let body = graphql(&c, "/farm/graph", "{ getAll { name } }", &amy).await;
    assert_eq!(body, json!({"data": {"getAll": [{"name": "ops"}]}}));
    // the change feed follows the same policy
    call(&c, "GET", "/_changes?since=0&entity=farm,coop", None, &bob)
        .await
        .expect_status(200);
    forbidden(&call(&c, "GET", "/_changes?entity=hen", None, &bob).await);
}

/// HTTP federation: farm-service resolves `hens` on hen-service, forwarding the caller's
/// token; hen-service decides with its own permissions.
#[tokio::test]
async fn http_federation_forwards_the_token_and_the_remote_decides() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("farm-federated");
    // the example's schema paths point at ../farm
    common::copy_dir(&examples_dir().join("farm-federated"), &dir);
    common::copy_dir(&examples_dir().join("farm"), &root.path().join("farm"));
    for name in ["farm-service.toml", "hen-service.toml"] {
        let path = dir.join(name);
        let text = std::fs::read_to_string(&path).unwrap().replace(
            "secret = \"${MESHQL_JWT_SECRET:-}\"",
            "secret = \"${MESHQL_JWT_SECRET:-}\"\nroles_claim = \"roles\"",
        );
        let text = if name == "hen-service.toml" {
            text.replacen(
                "name = \"hen\"\nstorage = \"farm\"\n",
                "name = \"hen\"\nstorage = \"farm\"\n[entity.permissions.admin]\nactions = [\"read\", \"create\", \"update\", \"delete\"]\n[entity.permissions.farmer]\nactions = [\"read\"]\nhidden_fields = [\"eggs\"]\n",
                1,
            )
        } else {
            text
        };
        assert!(text.contains("roles_claim"), "{name}");
        std::fs::write(&path, text).unwrap();
    }
    let hen_port = common::free_port();
    let env = |other: (&'static str, String)| -> Vec<(&'static str, String)> {
        vec![
            ("MESHQL_AUTH", "jwt".to_owned()),
            ("MESHQL_JWT_SECRET", common::JWT_SECRET.to_owned()),
            other,
        ]
    };
    let farm = Server::start_with_env(
        &dir.join("farm-service.toml"),
        &env(("HEN_SERVICE_URL", format!("http://127.0.0.1:{hen_port}"))),
        None,
    );
    let hen = Server::start_with_env(
        &dir.join("hen-service.toml"),
        &env((
            "FARM_SERVICE_URL",
            format!("http://127.0.0.1:{}", farm.port()),
        )),
        Some(hen_port),
    );
    let (fc, hc) = (farm.client(), hen.client());
    let admin = bearer_with(&json!({"sub": "u", "roles": ["admin"]}));
    let farmer = bearer_with(&json!({"sub": "u", "roles": ["farmer"]}));
    let guest = bearer_with(&json!({"sub": "u", "roles": ["guest"]}));
    let farm_id = call(
        &fc,
        "POST",
        "/farm/api",
        Some(&json!({"name": "F"})),
        &admin,
    )
    .await
    .json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let coop_id = call(
        &fc,
        "POST",
        "/coop/api",
        Some(&json!({"name": "C", "farm_id": farm_id})),
        &admin,
    )
    .await
    .json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    call(
        &hc,
        "POST",
        "/hen/api",
        Some(&json!({"name": "h", "coop_id": coop_id, "eggs": 2})),
        &admin,
    )
    .await
    .expect_status(201);
    forbidden(
        &call(
            &hc,
            "POST",
            "/hen/api",
            Some(&json!({"name": "h2", "coop_id": coop_id})),
            &farmer,
        )
        .await,
    );

    let q = format!("{{ getById(id: \"{farm_id}\") {{ name coops {{ name hens {{ name }} }} }} }}");
    let body = graphql(&fc, "/farm/graph", &q, &admin).await;
    assert_eq!(
        body["data"]["getById"]["coops"][0]["hens"],
        json!([{"name": "h"}]),
        "{body}"
    );
    let body = graphql(&fc, "/farm/graph", &q, &farmer).await;
    assert_eq!(
        body["data"]["getById"]["coops"][0]["hens"],
        json!([{"name": "h"}]),
        "{body}"
    );
    // the remote refuses a caller without read: FORBIDDEN at the relationship, as in-process
    let body = graphql(&fc, "/farm/graph", &q, &guest).await;
    assert_eq!(
        body["data"]["getById"]["coops"][0]["hens"],
        Value::Null,
        "{body}"
    );
    assert_eq!(
        error_paths(&body),
        vec![(json!(["getById", "coops", 0, "hens"]), json!("FORBIDDEN"))]
    );
    // a masked field selected across the federation: null with FORBIDDEN at its own path,
    // the rest of the relationship served, as in-process
    let q = format!("{{ getById(id: \"{farm_id}\") {{ coops {{ hens {{ name eggs }} }} }} }}");
    let body = graphql(&fc, "/farm/graph", &q, &farmer).await;
    assert_eq!(
        body["data"]["getById"]["coops"][0]["hens"],
        json!([{"name": "h", "eggs": null}]),
        "{body}"
    );
    assert_eq!(
        error_paths(&body),
        vec![(
            json!(["getById", "coops", 0, "hens", 0, "eggs"]),
            json!("FORBIDDEN")
        )],
        "{body}"
    );
    let body = graphql(&fc, "/farm/graph", &q, &admin).await;
    assert_eq!(
        body["data"]["getById"]["coops"][0]["hens"],
        json!([{"name": "h", "eggs": 2}])
    );
    let direct = graphql(&hc, "/hen/graph", "{ getAll { name eggs } }", &farmer).await;
    assert_eq!(
        direct["data"]["getAll"],
        json!([{"name": "h", "eggs": null}])
    );
}
