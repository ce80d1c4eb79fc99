//! Authorization through the binary: JWT `sub` tokens stamped on writes, filtering REST and
//! GraphQL reads, and forwarded on HTTP resolver calls (every token signed with the configs'
//! HS256 secret and verified; verification failures are tested in jwt.rs).

mod common;

use common::{bearer, examples_dir, Client, Server};
use serde_json::{json, Value};

async fn as_user(
    c: &Client,
    method: &str,
    path: &str,
    body: Option<&Value>,
    user: Option<&str>,
) -> common::Response {
    let header = user.map(bearer);
    let headers: Vec<(&str, &str)> = header
        .iter()
        .map(|h| ("authorization", h.as_str()))
        .collect();
    c.request(
        method,
        path,
        body.map(|b| b.to_string().into_bytes()),
        &headers,
    )
    .await
}

fn jwt_services() -> (Server, Server) {
    let dir = examples_dir().join("farm-federated");
    let hen_port = common::free_port();
    let farm = Server::start_with_env(
        &dir.join("farm-service.toml"),
        &[
            ("MESHQL_AUTH", "jwt".into()),
            ("MESHQL_JWT_SECRET", common::JWT_SECRET.into()),
            ("HEN_SERVICE_URL", format!("http://127.0.0.1:{hen_port}")),
        ],
        None,
    );
    let hen = Server::start_with_env(
        &dir.join("hen-service.toml"),
        &[
            ("MESHQL_AUTH", "jwt".into()),
            ("MESHQL_JWT_SECRET", common::JWT_SECRET.into()),
            (
                "FARM_SERVICE_URL",
                format!("http://127.0.0.1:{}", farm.port()),
            ),
        ],
        Some(hen_port),
    );
    (farm, hen)
}

#[tokio::test]
async fn jwt_subjects_own_what_they_write() {
    let (farm, _hen) = jwt_services();
    let c = farm.client();
    let r = as_user(
        &c,
        "POST",
        "/farm/api",
        Some(&json!({"name": "alices"})),
        Some("alice"),
    )
    .await;
    r.expect_status(201);
    let id = r.json()["id"].as_str().unwrap().to_owned();
    let path = format!("/farm/api/{id}");
    as_user(&c, "GET", &path, None, Some("alice"))
        .await
        .expect_status(200);
    as_user(&c, "GET", &path, None, Some("bob"))
        .await
        .expect_status(404);
    as_user(&c, "GET", &path, None, None)
        .await
        .expect_status(404);
    // bob can neither change nor delete it, and learns nothing about it
    let put = as_user(
        &c,
        "PUT",
        &path,
        Some(&json!({"name": "bobs"})),
        Some("bob"),
    )
    .await;
    put.expect_status(404);
    as_user(&c, "DELETE", &path, None, Some("bob"))
        .await
        .expect_status(404);
    let mine = as_user(&c, "GET", &path, None, Some("alice")).await;
    assert_eq!(mine.json()["name"], "alices");
    // lists are filtered
    let list = as_user(&c, "GET", "/farm/api", None, Some("bob"))
        .await
        .json();
    assert_eq!(list, json!([]));
    let list = as_user(&c, "GET", "/farm/api", None, Some("alice"))
        .await
        .json();
    assert_eq!(list.as_array().unwrap().len(), 1);
    // GraphQL reads use the caller's header too
    let q = json!({"query": "{ getAll { name } }"});
    let r = as_user(&c, "POST", "/farm/graph", Some(&q), Some("bob"))
        .await
        .json();
    assert_eq!(r, json!({"data": {"getAll": []}}));
    let r = as_user(&c, "POST", "/farm/graph", Some(&q), Some("alice"))
        .await
        .json();
    assert_eq!(r, json!({"data": {"getAll": [{"name": "alices"}]}}));
}

#[tokio::test]
async fn the_authorization_header_is_forwarded_to_remote_graphlettes() {
    let (farm, hen) = jwt_services();
    let (fc, hc) = (farm.client(), hen.client());
    let farm_id = as_user(
        &fc,
        "POST",
        "/farm/api",
        Some(&json!({"name": "shared"})),
        Some("alice"),
    )
    .await
    .json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let coop = as_user(
        &fc,
        "POST",
        "/coop/api",
        Some(&json!({"name": "red", "farm_id": farm_id})),
        Some("alice"),
    )
    .await
    .json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // hens live in the other service, written by alice
    as_user(
        &hc,
        "POST",
        "/hen/api",
        Some(&json!({"name": "chuck", "coop_id": coop})),
        Some("alice"),
    )
    .await
    .expect_status(201);
    let q = json!({"query": format!(r#"{{ getById(id: "{farm_id}") {{ coops {{ hens {{ name }} }} }} }}"#)});
    let r = as_user(&fc, "POST", "/farm/graph", Some(&q), Some("alice"))
        .await
        .json();
    assert_eq!(
        r["data"]["getById"]["coops"][0]["hens"],
        json!([{"name": "chuck"}]),
        "{r}"
    );
}

#[tokio::test]
async fn updating_a_public_document_does_not_take_it_over() {
    let (farm, _hen) = jwt_services();
    let c = farm.client();
    let r = as_user(
        &c,
        "POST",
        "/farm/api",
        Some(&json!({"name": "commons"})),
        None,
    )
    .await;
    r.expect_status(201);
    let path = format!("/farm/api/{}", r.json()["id"].as_str().unwrap());
    as_user(
        &c,
        "PUT",
        &path,
        Some(&json!({"name": "commons v2"})),
        Some("bob"),
    )
    .await
    .expect_status(200);
    let seen = as_user(&c, "GET", &path, None, Some("alice")).await;
    seen.expect_status(200);
    assert_eq!(seen.json()["name"], "commons v2");
    as_user(&c, "GET", &path, None, None)
        .await
        .expect_status(200);
}

#[tokio::test]
async fn casbin_roles_are_the_callers_tokens() {
    let dir = common::example_copy("farm", |text| {
        text + &format!("\n[auth]\ntype = \"casbin\"\nsecret = \"{}\"\nmodel = \"rbac_model.conf\"\npolicy = \"rbac_policy.csv\"\n# MeshQL's use of Casbin: roles only, `p` lines not enforced\nenforce_policy = false\n", common::JWT_SECRET)
    });
    std::fs::write(
        dir.path().join("rbac_model.conf"),
        "[request_definition]\nr = sub, obj, act\n[policy_definition]\np = sub, obj, act\n[role_definition]\ng = _, _\n[policy_effect]\ne = some(where (p.eft == allow))\n[matchers]\nm = g(r.sub, p.sub) && r.obj == p.obj && r.act == p.act\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("rbac_policy.csv"),
        "p, admin, data1, read\np, admin, data1, write\np, editor, data1, read\ng, user1, admin\ng, user2, editor\ng, user4, admin\n",
    )
    .unwrap();
    let server = Server::start(&dir.path().join("meshql.toml"), &[]);
    let c = server.client();
    // user1 writes as the admin role: every admin reads it, nobody else does
    let r = as_user(
        &c,
        "POST",
        "/farm/api",
        Some(&json!({"name": "ops"})),
        Some("user1"),
    )
    .await;
    r.expect_status(201);
    let path = format!("/farm/api/{}", r.json()["id"].as_str().unwrap());
    for (user, status) in [
        (Some("user1"), 200),
        (Some("user4"), 200),
        (Some("user2"), 404),
        (Some("stranger"), 404),
        (None, 404),
    ] {
        as_user(&c, "GET", &path, None, user)
            .await
            .expect_status(status);
    }
    let q = json!({"query": "{ getAll { name } }"});
    let r = as_user(&c, "POST", "/farm/graph", Some(&q), Some("user4"))
        .await
        .json();
    assert_eq!(r, json!({"data": {"getAll": [{"name": "ops"}]}}));
    let r = as_user(&c, "POST", "/farm/graph", Some(&q), Some("user2"))
        .await
        .json();
    assert_eq!(r, json!({"data": {"getAll": []}}));
}
