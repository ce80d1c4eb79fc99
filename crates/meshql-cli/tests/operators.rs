//! Query operators and sorting through the binary (issue 12 §1): GraphQL arguments bind
//! operator templates by their JSON type (a Float compares numerically, a `[String]` list
//! feeds `$in`), `sort` orders the answers before `limit`, on every storage type (PostgreSQL,
//! MariaDB and FerretDB through the test servers of scripts/services).

mod common;

use common::{Client, Server};
use serde_json::{json, Value};

const SDL: &str = "type Query {
  cheaperThan(max: Float, at: Float): [Item]
  priceBetween(min: Float, max: Float, at: Float, limit: Int): [Item]
  named(names: [String], at: Float): [Item]
  search(text: String, at: Float): [Item]
  noColour(at: Float): [Item]
  byPrice(at: Float, limit: Int): [Item]
}
type Item { id: ID, name: String, price: Float, colour: String }
";

fn config(storage: &str) -> String {
    format!(
        r#"[storage.s]
{storage}

[[entity]]
name = "item"
storage = "s"

[entity.rest]

[entity.graphql]
schema = "item.graphql"

[[entity.graphql.vectors]]
name = "cheaperThan"
query = '{{"payload.price": {{"$lt": "{{{{max}}}}"}}}}'

[[entity.graphql.vectors]]
name = "priceBetween"
query = '{{"payload.price": {{"$gte": "{{{{min}}}}", "$lte": "{{{{max}}}}"}}}}'
sort = '{{"payload.price": -1}}'

[[entity.graphql.vectors]]
name = "named"
query = '{{"payload.name": {{"$in": "{{{{names}}}}"}}}}'

[[entity.graphql.vectors]]
name = "search"
query = '{{"$or": [{{"payload.name": {{"$regex": "{{{{text}}}}", "$options": "i"}}}}, {{"payload.colour": "{{{{text}}}}"}}]}}'

[[entity.graphql.vectors]]
name = "noColour"
query = '{{"payload.colour": {{"$exists": false}}}}'

[[entity.graphql.vectors]]
name = "byPrice"
query = '{{}}'
sort = '{{"payload.price": 1, "payload.name": 1}}'
"#
    )
}

fn serve(storage: &str) -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("item.graphql"), SDL).unwrap();
    std::fs::write(dir.path().join("meshql.toml"), config(storage)).unwrap();
    let server = Server::start(dir.path(), &[]);
    (dir, server)
}

async fn gql(c: &Client, query: &str) -> Value {
    let r = c.post_json("/item/graph", &json!({ "query": query })).await;
    r.expect_status(200);
    let body = r.json();
    assert!(body.get("errors").is_none(), "{query}\n→ {body}");
    body["data"].clone()
}

fn names(list: &Value) -> Vec<&str> {
    list.as_array()
        .unwrap_or_else(|| panic!("a list: {list}"))
        .iter()
        .map(|o| o["name"].as_str().unwrap_or_default())
        .collect()
}

async fn operators_answer(storage: &str) {
    let (_dir, server) = serve(storage);
    let c = server.client();
    for item in [
        json!({"name": "Lamp", "price": 25.5, "colour": "red"}),
        json!({"name": "desk lamp", "price": 40}),
        json!({"name": "Chair", "price": 12, "colour": "blue"}),
        json!({"name": "Table", "price": 99.99, "colour": "red"}),
        json!({"name": "Stool", "price": 12}),
    ] {
        c.post_json("/item/api", &item).await.expect_status(201);
    }
    let d = gql(
        &c,
        r#"{ cheap: cheaperThan(max: 25.5) { name }
             between: priceBetween(min: 12, max: 40.0) { name price }
             top2: priceBetween(min: 0, max: 1000, limit: 2) { name }
             named: named(names: ["Chair", "Table", "Sofa"]) { name }
             one: named(names: "Stool") { name }
             lamps: search(text: "LAMP") { name }
             red: search(text: "red") { name }
             plain: noColour { name }
             cheapest: byPrice(limit: 3) { name } }"#,
    )
    .await;
    let mut cheap = names(&d["cheap"]);
    cheap.sort();
    assert_eq!(cheap, ["Chair", "Stool"], "$lt with a Float argument");
    assert_eq!(
        names(&d["between"]),
        ["desk lamp", "Lamp", "Chair", "Stool"],
        "$gte/$lte, sorted by price descending, ties in creation order"
    );
    assert_eq!(d["between"][0]["price"].as_f64(), Some(40.0));
    assert_eq!(
        names(&d["top2"]),
        ["Table", "desk lamp"],
        "limit after sort"
    );
    assert_eq!(
        names(&d["named"]),
        ["Chair", "Table"],
        "$in with a list argument"
    );
    assert_eq!(
        names(&d["one"]),
        ["Stool"],
        "a single value is a list of one"
    );
    assert_eq!(names(&d["lamps"]), ["Lamp", "desk lamp"], "$regex with i");
    assert_eq!(names(&d["red"]), ["Lamp", "Table"], "$or");
    assert_eq!(names(&d["plain"]), ["desk lamp", "Stool"], "$exists false");
    assert_eq!(
        names(&d["cheapest"]),
        ["Chair", "Stool", "Lamp"],
        "two sort keys"
    );
}

#[tokio::test]
async fn operators_answer_on_sqlite() {
    operators_answer("type = \"sqlite\"\nfile = \"items.db\"").await;
}

#[tokio::test]
async fn operators_answer_on_memory() {
    operators_answer("type = \"memory\"").await;
}

#[tokio::test]
async fn operators_answer_on_postgres() {
    let url = common::fresh_postgres_database();
    operators_answer(&format!("type = \"postgres\"\nurl = \"{url}\"")).await;
}

#[tokio::test]
async fn operators_answer_on_mariadb() {
    let url = common::fresh_mysql_database();
    operators_answer(&format!("type = \"mysql\"\nurl = \"{url}\"")).await;
}

#[tokio::test]
async fn operators_answer_on_mongodb_wire() {
    let uri = common::mongo_url();
    let db = common::fresh_mongo_database();
    operators_answer(&format!("type = \"mongo\"\nuri = \"{uri}\"\ndb = \"{db}\"")).await;
}
