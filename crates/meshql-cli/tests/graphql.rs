//! GraphQL through the binary: the egg-economy graph in-process, and the farm split over two
//! `meshql serve` processes federating over HTTP (batching, `at`, errors).

mod common;

use common::{examples_dir, Client, Server};
use serde_json::{json, Value};

async fn id_of(c: &Client, path: &str, body: Value) -> String {
    let r = c.post_json(path, &body).await;
    r.expect_status(201);
    r.json()["id"].as_str().unwrap().to_owned()
}

async fn gql(c: &Client, path: &str, query: &str) -> Value {
    let r = c.post_json(path, &json!({ "query": query })).await;
    r.expect_status(200);
    r.json()
}

fn metric(text: &str, name: &str, entity: &str) -> u64 {
    let prefix = format!("{name}{{entity=\"{entity}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no metric {prefix} in\n{text}"))
}

async fn reads(c: &Client, entity: &str) -> u64 {
    metric(
        &c.get("/metrics").await.text,
        "meshql_storage_reads_total",
        entity,
    )
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[tokio::test]
async fn egg_economy_graph_in_process_on_sqlite() {
    egg_economy_graph(
        Server::start(&examples_dir().join("egg-economy"), &[]),
        Nesting::OneTransaction,
    )
    .await;
}

#[tokio::test]
async fn egg_economy_graph_in_process_on_sqlite_level_by_level() {
    let (dir, config) = with_setting("meshql.toml", "sqlite", "nested_reads = false");
    egg_economy_graph(Server::start(&config, &[]), Nesting::PerLevel).await;
    drop(dir);
}

#[tokio::test]
async fn egg_economy_graph_in_process_on_memory() {
    let config = examples_dir().join("egg-economy/meshql-memory.toml");
    egg_economy_graph(Server::start(&config, &[]), Nesting::PerLevel).await;
}

#[tokio::test]
async fn egg_economy_graph_in_process_on_postgres() {
    let config = examples_dir().join("egg-economy/meshql-postgres.toml");
    let url = common::fresh_postgres_database();
    egg_economy_graph(
        Server::start_with_env(&config, &[("DATABASE_URL", url)], None),
        Nesting::OneStatement,
    )
    .await;
}

#[tokio::test]
async fn egg_economy_graph_in_process_on_postgres_level_by_level() {
    let (dir, config) = with_nested_sql("meshql-postgres.toml", "postgres", false);
    let url = common::fresh_postgres_database();
    egg_economy_graph(
        Server::start_with_env(&config, &[("DATABASE_URL", url)], None),
        Nesting::PerLevel,
    )
    .await;
    drop(dir);
}

#[tokio::test]
async fn egg_economy_graph_in_process_on_mariadb() {
    let config = examples_dir().join("egg-economy/meshql-mysql.toml");
    let url = common::fresh_mysql_database();
    egg_economy_graph(
        Server::start_with_env(&config, &[("DATABASE_URL", url)], None),
        Nesting::PerLevel,
    )
    .await;
}

#[tokio::test]
async fn egg_economy_graph_in_process_on_mariadb_in_one_statement() {
    let (dir, config) = with_nested_sql("meshql-mysql.toml", "mysql", true);
    let url = common::fresh_mysql_database();
    egg_economy_graph(
        Server::start_with_env(&config, &[("DATABASE_URL", url)], None),
        Nesting::OneStatement,
    )
    .await;
    drop(dir);
}

/// A copy of the egg-economy example whose `config` has `nested_sql = on` in every
/// storage block of type `kind`.
fn with_nested_sql(config: &str, kind: &str, on: bool) -> (tempfile::TempDir, std::path::PathBuf) {
    with_setting(config, kind, &format!("nested_sql = {on}"))
}

/// A copy of the egg-economy example whose `config` has `setting` in every storage block of
/// type `kind`.
fn with_setting(
    config: &str,
    kind: &str,
    setting: &str,
) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = common::example_copy("egg-economy", |text| text);
    let path = dir.path().join(config);
    let text = std::fs::read_to_string(&path).unwrap();
    let block = format!("type = \"{kind}\"");
    let text = text.replace(&block, &format!("{block}\n{setting}"));
    assert!(text.contains(setting));
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

#[tokio::test]
async fn egg_economy_graph_in_process_on_mongodb_wire() {
    let config = examples_dir().join("egg-economy/meshql-mongo.toml");
    let db = format!("eggs{}", common::free_port());
    egg_economy_graph(
        Server::start_with_env(
            &config,
            &[("MONGO_URI", common::mongo_url()), ("PREFIX", db)],
            None,
        ),
        Nesting::PerLevel,
    )
    .await;
}

/// How a backend answers a nested query.
#[derive(Clone, Copy, PartialEq)]
enum Nesting {
    /// One batched query per level.
    PerLevel,
    /// One statement for the whole tree (PostgreSQL, MariaDB).
    OneStatement,
    /// One batched statement per level, all in one read transaction and counted by the
    /// root's store (SQLite, for relationships to tables of the same file).
    OneTransaction,
}

async fn egg_economy_graph(server: Server, nesting: Nesting) {
    let c = server.client();
    let farm = id_of(
        &c,
        "/farm/api",
        json!({"name": "Emerdale", "farm_type": "megafarm", "zone": "north"}),
    )
    .await;
    let mut coops = Vec::new();
    for i in 0..3 {
        coops.push(
            id_of(&c, "/coop/api", json!({"name": format!("coop{i}"), "farm_id": farm, "capacity": 10, "coop_type": "a"})).await,
        );
    }
    for (i, coop) in coops.iter().enumerate() {
        for h in 0..5 {
            id_of(
                &c,
                "/hen/api",
                json!({"name": format!("hen{i}-{h}"), "coop_id": coop, "breed": "leghorn"}),
            )
            .await;
        }
    }
    let container = id_of(
        &c,
        "/container/api",
        json!({"name": "shelf", "container_type": "fridge", "capacity": 100, "zone": "north"}),
    )
    .await;

    // depth 3: 1 farm → 3 coops → 15 hens, costing one query per level (or one in all)
    let before = (
        reads(&c, "farm").await,
        reads(&c, "coop").await,
        reads(&c, "hen").await,
    );
    let q = format!(
        r#"{{ getById(id: "{farm}") {{ name coops {{ name hens {{ name breed }} }} farmOutput {{ eggs_today }} }} }}"#
    );
    let r = gql(&c, "/farm/graph", &q).await;
    assert!(r.get("errors").is_none(), "{r}");
    let got = &r["data"]["getById"];
    assert_eq!(got["name"], "Emerdale");
    assert_eq!(got["coops"].as_array().unwrap().len(), 3);
    for coop in got["coops"].as_array().unwrap() {
        assert_eq!(coop["hens"].as_array().unwrap().len(), 5, "{r}");
    }
    assert_eq!(
        got["farmOutput"],
        json!([]),
        "vector resolvers are arrays, even empty"
    );
    let after = (
        reads(&c, "farm").await,
        reads(&c, "coop").await,
        reads(&c, "hen").await,
    );
    let expected = match nesting {
        // on SQLite `farmOutput` is in another file (projections.db): level by level
        Nesting::PerLevel | Nesting::OneTransaction => (1, 1, 1),
        Nesting::OneStatement => (1, 0, 0),
    };
    assert_eq!(
        (after.0 - before.0, after.1 - before.1, after.2 - before.2),
        expected
    );

    // the same within one database (file): one read of the tree where the backend can
    let q =
        format!(r#"{{ getById(id: "{farm}") {{ name coops {{ name hens {{ name breed }} }} }} }}"#);
    let before = (
        reads(&c, "farm").await,
        reads(&c, "coop").await,
        reads(&c, "hen").await,
    );
    let r = gql(&c, "/farm/graph", &q).await;
    assert!(r.get("errors").is_none(), "{r}");
    let coops = r["data"]["getById"]["coops"].as_array().unwrap();
    let names: Vec<&str> = coops.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["coop0", "coop1", "coop2"], "creation order");
    for (i, coop) in coops.iter().enumerate() {
        let hens: Vec<&str> = coop["hens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["name"].as_str().unwrap())
            .collect();
        let expected: Vec<String> = (0..5).map(|h| format!("hen{i}-{h}")).collect();
        assert_eq!(hens, expected, "{r}");
    }
    let after = (
        reads(&c, "farm").await,
        reads(&c, "coop").await,
        reads(&c, "hen").await,
    );
    let expected = match nesting {
        Nesting::PerLevel => (1, 1, 1),
        Nesting::OneStatement => (1, 0, 0),
        Nesting::OneTransaction => (3, 0, 0),
    };
    assert_eq!(
        (after.0 - before.0, after.1 - before.1, after.2 - before.2),
        expected
    );

    // upward, and the other direction's vectors
    let r = gql(
        &c,
        "/hen/graph",
        "{ getAll { name coop { name } layReports { id } productivity { total_eggs } } }",
    )
    .await;
    assert!(r.get("errors").is_none(), "{r}");
    let hens = r["data"]["getAll"].as_array().unwrap();
    assert_eq!(hens.len(), 15);
    assert!(hens
        .iter()
        .all(|h| h["coop"]["name"].as_str().unwrap().starts_with("coop")));
    assert!(hens
        .iter()
        .all(|h| h["layReports"] == json!([]) && h["productivity"] == json!([])));
    let r = gql(
        &c,
        "/container/graph",
        &format!(r#"{{ getById(id: "{container}") {{ name inventory {{ current_eggs }} }} }}"#),
    )
    .await;
    assert_eq!(
        r["data"]["getById"],
        json!({"name": "shelf", "inventory": []})
    );

    // filtered root queries
    let r = gql(
        &c,
        "/farm/graph",
        r#"{ getByZone(zone: "north") { name } }"#,
    )
    .await;
    assert_eq!(r["data"]["getByZone"], json!([{"name": "Emerdale"}]));
    let r = gql(
        &c,
        "/coop/graph",
        &format!(r#"{{ getByFarm(id: "{farm}") {{ name farm {{ name }} }} }}"#),
    )
    .await;
    assert_eq!(r["data"]["getByFarm"].as_array().unwrap().len(), 3);
    assert_eq!(r["data"]["getByFarm"][0]["farm"]["name"], "Emerdale");
}

#[tokio::test]
async fn graphql_http_shapes() {
    let server = Server::start(&examples_dir().join("egg-economy"), &[]);
    let c = server.client();
    // errors come back in `errors` with status 200, with locations
    let r = gql(&c, "/farm/graph", "{ getAll { name nosuchfield } }").await;
    assert!(r.get("data").is_none());
    assert!(r["errors"][0]["message"]
        .as_str()
        .unwrap()
        .contains("nosuchfield"));
    assert!(r["errors"][0]["locations"].is_array());
    // GET with query parameters, and variables
    let r = c
        .get("/farm/graph?query=%7B%20getAll%20%7B%20name%20%7D%20%7D")
        .await;
    r.expect_status(200);
    assert_eq!(r.json(), json!({"data": {"getAll": []}}));
    let r = c
        .post_json(
            "/farm/graph",
            &json!({"query": "query Z($z: String) { getByZone(zone: $z) { name } }", "variables": {"z": "x"}, "operationName": "Z"}),
        )
        .await;
    assert_eq!(r.json(), json!({"data": {"getByZone": []}}));
    // malformed request bodies are 400 with a GraphQL-shaped error
    let r = c.post_raw("/farm/graph", b"{nope").await;
    r.expect_status(400);
    assert!(r.json()["errors"][0]["message"].is_string());
    // a 13-digit `at` is accepted
    let r = gql(
        &c,
        "/farm/graph",
        &format!("{{ getAll(at: {}) {{ name }} }}", now_ms()),
    )
    .await;
    assert_eq!(r, json!({"data": {"getAll": []}}));
}

/// Two processes, each owning half of the farm, resolving each other over HTTP.
struct Federation {
    farm: Server,
    hen: Server,
}

fn federation() -> Federation {
    let dir = examples_dir().join("farm-federated");
    let hen_port = common::free_port();
    let farm = Server::start_with_env(
        &dir.join("farm-service.toml"),
        &[("HEN_SERVICE_URL", format!("http://127.0.0.1:{hen_port}"))],
        None,
    );
    let hen = Server::start_with_env(
        &dir.join("hen-service.toml"),
        &[(
            "FARM_SERVICE_URL",
            format!("http://127.0.0.1:{}", farm.port()),
        )],
        Some(hen_port),
    );
    Federation { farm, hen }
}

#[tokio::test]
async fn two_services_federate_over_http_with_at_and_batching() {
    let f = federation();
    let (fc, hc) = (f.farm.client(), f.hen.client());
    let farm = id_of(&fc, "/farm/api", json!({"name": "Emerdale"})).await;
    let red = id_of(&fc, "/coop/api", json!({"name": "red", "farm_id": farm})).await;
    let yellow = id_of(&fc, "/coop/api", json!({"name": "yellow", "farm_id": farm})).await;
    for (name, coop) in [("chuck", &red), ("duck", &red), ("euck", &yellow)] {
        id_of(&hc, "/hen/api", json!({"name": name, "coop_id": coop})).await;
    }
    let first_stamp = now_ms();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    fc.put_json(
        &format!("/coop/api/{red}"),
        &json!({"name": "purple", "farm_id": farm}),
    )
    .await
    .expect_status(200);

    // now: farm-service → (HTTP) hen-service → (HTTP) farm-service
    let q = format!(
        r#"{{ getById(id: "{farm}") {{ name coops {{ name hens {{ name coop {{ name }} }} }} }} }}"#
    );
    let r = gql(&fc, "/farm/graph", &q).await;
    assert!(r.get("errors").is_none(), "{r}");
    assert_eq!(
        r["data"]["getById"],
        json!({"name": "Emerdale", "coops": [
            {"name": "purple", "hens": [{"name": "chuck", "coop": {"name": "purple"}}, {"name": "duck", "coop": {"name": "purple"}}]},
            {"name": "yellow", "hens": [{"name": "euck", "coop": {"name": "yellow"}}]}
        ]})
    );

    // as of first_stamp, through both hops: the old name everywhere
    let q = format!(
        r#"{{ getById(id: "{farm}", at: {first_stamp}) {{ coops {{ name hens {{ name coop {{ name }} }} }} }} }}"#
    );
    let r = gql(&fc, "/farm/graph", &q).await;
    assert!(r.get("errors").is_none(), "{r}");
    let coops = &r["data"]["getById"]["coops"];
    assert_eq!(coops[0]["name"], "red");
    assert_eq!(
        coops[0]["hens"][0]["coop"]["name"], "red",
        "`at` crossed both HTTP hops: {r}"
    );

    // batching over HTTP: 2 coops' hens in one request → one hen-service query; the 3 hens'
    // coops in one request back → one coop query
    let hen_before = reads(&hc, "hen").await;
    let coop_before = reads(&fc, "coop").await;
    let q = format!(r#"{{ getById(id: "{farm}") {{ coops {{ hens {{ coop {{ name }} }} }} }} }}"#);
    gql(&fc, "/farm/graph", &q).await;
    assert_eq!(reads(&hc, "hen").await - hen_before, 1);
    assert_eq!(
        reads(&fc, "coop").await - coop_before,
        2,
        "getByFarm, then the batched getById"
    );

    // the reverse direction
    let r = gql(
        &hc,
        "/hen/graph",
        r#"{ getByName(name: "euck") { name coop { name farm { name } } } }"#,
    )
    .await;
    assert_eq!(
        r["data"]["getByName"],
        json!([{"name": "euck", "coop": {"name": "yellow", "farm": {"name": "Emerdale"}}}])
    );
}

#[tokio::test]
async fn a_remote_failure_is_a_field_error_not_a_failed_request() {
    let f = federation();
    let fc = f.farm.client();
    let farm = id_of(&fc, "/farm/api", json!({"name": "Lonely"})).await;
    id_of(&fc, "/coop/api", json!({"name": "red", "farm_id": farm})).await;
    drop(f.hen); // the hen service goes away
    let q = format!(r#"{{ getById(id: "{farm}") {{ name coops {{ name hens {{ name }} }} }} }}"#);
    let r = gql(&fc, "/farm/graph", &q).await;
    assert_eq!(r["data"]["getById"]["name"], "Lonely");
    assert_eq!(r["data"]["getById"]["coops"][0]["name"], "red");
    assert_eq!(r["data"]["getById"]["coops"][0]["hens"], Value::Null);
    let e = &r["errors"][0];
    assert!(
        e["message"].as_str().unwrap().contains("unreachable"),
        "{r}"
    );
    assert_eq!(e["path"], json!(["getById", "coops", 0, "hens"]));
}

#[tokio::test]
async fn a_failure_two_hops_away_is_a_field_error_not_a_silent_null() {
    // farm-service → (HTTP) hen-service → (HTTP) a farm-service that is not there
    let dir = examples_dir().join("farm-federated");
    let (hen_port, gone) = (common::free_port(), common::free_port());
    let farm = Server::start_with_env(
        &dir.join("farm-service.toml"),
        &[("HEN_SERVICE_URL", format!("http://127.0.0.1:{hen_port}"))],
        None,
    );
    let hen = Server::start_with_env(
        &dir.join("hen-service.toml"),
        &[("FARM_SERVICE_URL", format!("http://127.0.0.1:{gone}"))],
        Some(hen_port),
    );
    let (fc, hc) = (farm.client(), hen.client());
    let farm_id = id_of(&fc, "/farm/api", json!({"name": "Far"})).await;
    let coop = id_of(&fc, "/coop/api", json!({"name": "red", "farm_id": farm_id})).await;
    id_of(&hc, "/hen/api", json!({"name": "chuck", "coop_id": coop})).await;

    // asked directly, the hen service answers its data with the error of its own hop
    let q = format!(r#"{{ getByCoop(id: "{coop}") {{ name coop {{ name }} }} }}"#);
    let r = gql(&hc, "/hen/graph", &q).await;
    assert_eq!(r["data"]["getByCoop"][0]["name"], "chuck", "{r}");
    assert_eq!(
        r["errors"][0]["path"],
        json!(["getByCoop", 0, "coop"]),
        "{r}"
    );

    // one hop further, that error fails the field it came through
    let q = format!(
        r#"{{ getById(id: "{farm_id}") {{ name coops {{ name hens {{ name coop {{ name }} }} }} }} }}"#
    );
    let r = gql(&fc, "/farm/graph", &q).await;
    assert_eq!(r["data"]["getById"]["coops"][0]["name"], "red", "{r}");
    assert_eq!(r["data"]["getById"]["coops"][0]["hens"], Value::Null, "{r}");
    let e = &r["errors"][0];
    assert_eq!(e["path"], json!(["getById", "coops", 0, "hens"]), "{r}");
    let message = e["message"].as_str().unwrap();
    assert!(
        message.starts_with("Remote GraphQL error:") && message.contains("unreachable"),
        "{r}"
    );
    // and keeps the code it had two hops away
    assert_eq!(e["extensions"]["code"], "UNAVAILABLE", "{r}");
}

#[tokio::test]
async fn the_farm_example_federates_with_itself_over_http() {
    farm_example(&examples_dir().join("farm")).await;
}

// The farm example on every other backend, changing nothing but its storage block.

#[tokio::test]
async fn the_farm_example_on_memory() {
    let dir = farm_with_storage(r#"type = "memory""#.into());
    farm_example(dir.path()).await;
}

#[tokio::test]
async fn the_farm_example_on_postgres() {
    let url = common::fresh_postgres_database();
    let dir = farm_with_storage(format!("type = \"postgres\"\nurl = \"{url}\""));
    farm_example(dir.path()).await;
}

#[tokio::test]
async fn the_farm_example_on_mariadb() {
    let url = common::fresh_mysql_database();
    let dir = farm_with_storage(format!("type = \"mysql\"\nurl = \"{url}\""));
    farm_example(dir.path()).await;
}

#[tokio::test]
async fn the_farm_example_on_mongodb_wire() {
    let (uri, db) = (common::mongo_url(), common::fresh_mongo_database());
    let dir = farm_with_storage(format!("type = \"mongo\"\nuri = \"{uri}\"\ndb = \"{db}\""));
    farm_example(dir.path()).await;
}

/// A copy of the farm example whose `[storage.farm]` block is `storage`.
fn farm_with_storage(storage: String) -> tempfile::TempDir {
    common::example_copy("farm", |text| {
        let sqlite = "[storage.farm]\ntype = \"sqlite\"\nfile = \"farm.db\"\n";
        assert!(
            text.contains(sqlite),
            "the farm example's storage block moved"
        );
        text.replace(sqlite, &format!("[storage.farm]\n{storage}\n"))
    })
}

/// Serves the farm example at `config` on a fixed port (its resolvers call back to itself
/// over HTTP) and checks nested queries three levels deep, both ways.
async fn farm_example(config: &std::path::Path) {
    let port = common::free_port();
    let server = Server::start_with_env(
        config,
        &[("PLATFORM_URL", format!("http://127.0.0.1:{port}"))],
        Some(port),
    );
    let c = server.client();
    let farm = id_of(&c, "/farm/api", json!({"name": "Emerdale"})).await;
    let coop = id_of(&c, "/coop/api", json!({"name": "red", "farm_id": farm})).await;
    let hen = id_of(
        &c,
        "/hen/api",
        json!({"name": "chuck", "coop_id": coop, "eggs": 3}),
    )
    .await;
    id_of(
        &c,
        "/lay_report/api",
        json!({"time_of_day": "morning", "hen_id": hen, "eggs": 2}),
    )
    .await;
    let q =
        format!(r#"{{ getById(id: "{farm}") {{ name coops {{ name hens {{ name eggs }} }} }} }}"#);
    let r = gql(&c, "/farm/graph", &q).await;
    assert_eq!(
        r,
        json!({"data": {"getById": {"name": "Emerdale", "coops": [{"name": "red", "hens": [{"name": "chuck", "eggs": 3}]}]}}})
    );
    let r = gql(&c, "/hen/graph", r#"{ getByName(name: "chuck") { layReports { time_of_day eggs } coop { farm { name } } } }"#).await;
    assert_eq!(
        r,
        json!({"data": {"getByName": [{"layReports": [{"time_of_day": "morning", "eggs": 2}], "coop": {"farm": {"name": "Emerdale"}}}]}})
    );
}

#[tokio::test]
async fn wide_levels_over_http_are_sent_in_chunks_of_100_keys() {
    let f = federation();
    let (fc, hc) = (f.farm.client(), f.hen.client());
    let farm = id_of(&fc, "/farm/api", json!({"name": "Wide"})).await;
    let coops: Vec<Value> = (0..150)
        .map(|i| json!({"name": format!("c{i}"), "farm_id": farm}))
        .collect();
    let created = fc.post_json("/coop/api/bulk", &json!(coops)).await;
    created.expect_status(201);
    let last = created.json()[149]["id"].as_str().unwrap().to_owned();
    id_of(&hc, "/hen/api", json!({"name": "lonely", "coop_id": last})).await;
    let before = reads(&hc, "hen").await;
    let r = gql(
        &fc,
        "/farm/graph",
        &format!(r#"{{ getById(id: "{farm}") {{ coops {{ name hens {{ name }} }} }} }}"#),
    )
    .await;
    assert!(r.get("errors").is_none(), "{r}");
    let coops = r["data"]["getById"]["coops"].as_array().unwrap();
    assert_eq!(coops.len(), 150);
    assert_eq!(coops[149]["hens"], json!([{"name": "lonely"}]));
    assert!(coops[..149].iter().all(|c| c["hens"] == json!([])));
    assert_eq!(
        reads(&hc, "hen").await - before,
        2,
        "150 keys: two requests of ≤ 100, one query each"
    );
}

/// Issue 12 §3 through the binary: a writer renames a farm and then its two coops, generation
/// after generation, while readers read farm → coops → hens. At every moment the farm's
/// generation is at least the coops' and the first coop's at least the second's, so any one
/// snapshot satisfies that; every answer must. The relationships are in-process here, and
/// over HTTP in the next test (the remote levels receive the snapshot as `at`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_nested_answer_is_one_snapshot_while_a_writer_renames() {
    let server = Server::start(&examples_dir().join("egg-economy"), &[]);
    one_snapshot_while_a_writer_renames(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_over_http_federation_is_one_snapshot_while_a_writer_renames() {
    let port = common::free_port();
    let dir = common::example_copy("egg-economy", |toml| {
        let remote = |graph: &str| format!("url = \"http://127.0.0.1:{port}{graph}\"");
        toml.replacen(
            "query = \"getByFarm\"\ngraph = \"/coop/graph\"",
            &format!("query = \"getByFarm\"\n{}", remote("/coop/graph")),
            1,
        )
        .replacen(
            "query = \"getByCoop\"\ngraph = \"/hen/graph\"",
            &format!("query = \"getByCoop\"\n{}", remote("/hen/graph")),
            1,
        )
    });
    let config = std::fs::read_to_string(dir.path().join("meshql.toml")).unwrap();
    assert_eq!(
        config.matches("url = \"http://127.0.0.1").count(),
        2,
        "{config}"
    );
    let server = Server::start_with_env(&dir.path().join("meshql.toml"), &[], Some(port));
    one_snapshot_while_a_writer_renames(&server).await;
}

async fn one_snapshot_while_a_writer_renames(server: &Server) {
    let c = server.client();
    let farm = json!({"farm_type": "megafarm", "zone": "north"});
    let named = |base: &Value, name: String| {
        let mut v = base.clone();
        v["name"] = json!(name);
        v
    };
    let farm_id = id_of(&c, "/farm/api", named(&farm, "F-0".into())).await;
    let coop = json!({"farm_id": farm_id, "capacity": 10, "coop_type": "barn"});
    let coops = [
        id_of(&c, "/coop/api", named(&coop, "A-0".into())).await,
        id_of(&c, "/coop/api", named(&coop, "B-0".into())).await,
    ];
    id_of(
        &c,
        "/hen/api",
        json!({"name": "chuck", "coop_id": coops[0], "breed": "leghorn"}),
    )
    .await;
    const GENERATIONS: u64 = 150;
    let writer = {
        let (c, farm, coop, farm_id, coops) = (
            c.clone(),
            farm.clone(),
            coop.clone(),
            farm_id.clone(),
            coops.clone(),
        );
        tokio::spawn(async move {
            for g in 1..=GENERATIONS {
                c.put_json(
                    &format!("/farm/api/{farm_id}"),
                    &named(&farm, format!("F-{g}")),
                )
                .await
                .expect_status(200);
                for (id, letter) in coops.iter().zip(["A", "B"]) {
                    c.put_json(
                        &format!("/coop/api/{id}"),
                        &named(&coop, format!("{letter}-{g}")),
                    )
                    .await
                    .expect_status(200);
                }
            }
        })
    };
    let generation = |name: &str| -> u64 { name[2..].parse().unwrap() };
    let query =
        format!(r#"{{ getById(id: "{farm_id}") {{ name coops {{ name hens {{ name }} }} }} }}"#);
    let mut answers = 0;
    while !writer.is_finished() {
        let d = gql(&c, "/farm/graph", &query).await;
        let f = generation(d["data"]["getById"]["name"].as_str().unwrap());
        let names: Vec<&str> = d["data"]["getById"]["coops"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        let a = generation(names.iter().find(|n| n.starts_with('A')).unwrap());
        let b = generation(names.iter().find(|n| n.starts_with('B')).unwrap());
        assert!(
            f >= a && a >= b && f <= b + 1,
            "not one snapshot: farm F-{f}, coops A-{a} and B-{b}: {d}"
        );
        answers += 1;
    }
    writer.await.unwrap();
    assert!(answers > 0);
}
