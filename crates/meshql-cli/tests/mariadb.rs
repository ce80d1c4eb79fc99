//! meshql on a real MariaDB through the binary: REST round trips and an unreachable database.

mod common;

use common::{examples_dir, Server};
use serde_json::json;

fn egg_economy_on(url: String) -> Server {
    Server::start_with_env(
        &examples_dir().join("egg-economy/meshql-mysql.toml"),
        &[("DATABASE_URL", url)],
        None,
    )
}

#[tokio::test]
async fn rest_round_trip_on_mariadb() {
    let server = egg_economy_on(common::fresh_mysql_database());
    let c = server.client();
    let r = c
        .post_json(
            "/farm/api",
            &json!({"name": "Emerdale", "farm_type": "megafarm", "zone": "north"}),
        )
        .await;
    r.expect_status(201);
    let id = r.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(
        c.get(&format!("/farm/api/{id}")).await.json()["name"],
        "Emerdale"
    );
    c.put_json(
        &format!("/farm/api/{id}"),
        &json!({"name": "Renamed", "farm_type": "megafarm", "zone": "south"}),
    )
    .await
    .expect_status(200);
    let list = c.list("/farm/api").await;
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["name"], "Renamed");
    c.post_json("/farm/api", &json!({"name": "x"}))
        .await
        .expect_status(400);
    assert_eq!(c.list("/farm/api").await.len(), 1);
    c.delete(&format!("/farm/api/{id}"))
        .await
        .expect_status(200);
    c.get(&format!("/farm/api/{id}")).await.expect_status(404);
    let r = c
        .post_json(
            "/farm/graph",
            &json!({"query": "{ getByZone(zone: \"south\") { name } }"}),
        )
        .await;
    assert_eq!(r.json(), json!({"data": {"getByZone": []}}));
}

#[tokio::test]
async fn unreachable_database_answers_503() {
    let port = common::free_port();
    let server = egg_economy_on(format!("mysql://meshql:meshql@127.0.0.1:{port}/nowhere"));
    let c = server.client();
    c.get("/ready").await.expect_status(503);
    let r = c.get("/farm/api").await;
    r.expect_status(503);
    assert!(
        r.json()["error"].as_str().unwrap().contains("MySQL"),
        "{}",
        r.text
    );
}
