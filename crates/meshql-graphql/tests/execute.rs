//! Graphlette execution against real SQLite stores: root queries, nested resolvers in both
//! directions, `at` propagation, batching (counted storage queries), GraphQL error shapes.

use meshql_core::{DynReader, DynStore, NewDocument};
use meshql_graphql::{Graphlette, GraphqlRequest, Registry, RequestContext};
use meshql_store_sqlite::{SqliteDatabase, SqliteOptions, SqliteStore};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

mod common;
use common::{COOP_SDL, FARM_SDL, HEN_SDL};

const CONFIG: &str = r#"
[[entity]]
name = "farm"
[entity.graphql]
schema = "farm.graphql"
[[entity.graphql.singletons]]
name = "getById"
query = '{"id": "{{id}}"}'
[[entity.graphql.vectors]]
name = "getAll"
query = '{}'
[[entity.graphql.vectors]]
name = "getByZone"
sql = "json_extract(payload, '$.zone') = '{{zone}}'"
[[entity.graphql.resolvers]]
name = "coops"
query = "getByFarm"
graph = "/coop/graph"

[[entity]]
name = "coop"
[entity.graphql]
schema = "coop.graphql"
[[entity.graphql.singletons]]
name = "getById"
query = '{"id": "{{id}}"}'
[[entity.graphql.vectors]]
name = "getByFarm"
query = '{"payload.farm_id": "{{id}}"}'
[[entity.graphql.resolvers]]
name = "farm"
key = "farm_id"
query = "getById"
graph = "/farm/graph"
[[entity.graphql.resolvers]]
name = "hens"
query = "getByCoop"
graph = "/hen/graph"

[[entity]]
name = "hen"
[entity.graphql]
schema = "hen.graphql"
[[entity.graphql.singletons]]
name = "getById"
query = '{"id": "{{id}}"}'
[[entity.graphql.vectors]]
name = "getByCoop"
query = '{"payload.coop_id": "{{id}}"}'
[[entity.graphql.vectors]]
name = "getAll"
query = '{}'
[[entity.graphql.resolvers]]
name = "coop"
key = "coop_id"
query = "getById"
graph = "/coop/graph"
"#;

struct World {
    registry: Registry,
    stores: Vec<(String, DynStore)>,
    _dir: tempfile::TempDir,
}

impl World {
    async fn new() -> World {
        World::with_files(&[
            ("farm.graphql", FARM_SDL),
            ("coop.graphql", COOP_SDL),
            ("hen.graphql", HEN_SDL),
            ("meshql.toml", CONFIG),
        ])
        .await
    }

    /// A world from a `meshql.toml` and the SDL files it names.
    async fn with_files(files: &[(&str, &str)]) -> World {
        World::build(files, |_, store| store).await
    }

    /// [`World::new`] with each entity's GraphQL reads going through `reader(entity, store)`.
    async fn with_readers(reader: impl Fn(&str, DynStore) -> DynReader) -> World {
        World::build(
            &[
                ("farm.graphql", FARM_SDL),
                ("coop.graphql", COOP_SDL),
                ("hen.graphql", HEN_SDL),
                ("meshql.toml", CONFIG),
            ],
            reader,
        )
        .await
    }

    async fn build(files: &[(&str, &str)], reader: impl Fn(&str, DynStore) -> DynReader) -> World {
        let dir = tempfile::tempdir().unwrap();
        for (f, s) in files {
            std::fs::write(dir.path().join(f), s).unwrap();
        }
        let config = meshql_config::load(dir.path()).expect("valid test config");
        let db = SqliteDatabase::open(&dir.path().join("data/test.db"), SqliteOptions::default())
            .unwrap();
        let mut graphlettes = Vec::new();
        let mut stores = Vec::new();
        for e in &config.entities {
            let store: DynStore = Arc::new(SqliteStore::new(db.clone(), &e.table));
            let g = e.graph.as_ref().unwrap();
            let templates: Vec<_> = g.queries.iter().map(|q| q.template.clone()).collect();
            store.prepare(&templates).await.unwrap();
            graphlettes.push(Graphlette::new(
                &e.name,
                common::spec(g),
                common::service(&e.name, store.clone(), reader(&e.name, store.clone())),
            ));
            stores.push((e.name.clone(), store));
        }
        let registry =
            Registry::new(graphlettes, Duration::from_secs(1), Duration::from_secs(5)).unwrap();
        World {
            registry,
            stores,
            _dir: dir,
        }
    }

    fn store(&self, entity: &str) -> &DynStore {
        &self.stores.iter().find(|(n, _)| n == entity).unwrap().1
    }

    async fn put(&self, entity: &str, id: &str, payload: Value, at: i64) {
        self.store(entity)
            .create(
                NewDocument::with_id(id, payload.as_object().unwrap().clone()).at(at),
                &meshql_core::WriteContext::SYSTEM,
            )
            .await
            .unwrap();
    }

    fn reads(&self) -> u64 {
        self.stores.iter().map(|(_, s)| s.stats().reads).sum()
    }

    async fn query_with(&self, path: &str, query: &str, variables: Option<Value>) -> Value {
        let (index, _) = self.registry.by_path(path).unwrap();
        let request = GraphqlRequest {
            query: Some(query.to_owned()),
            operation_name: None,
            variables,
        };
        let body = self
            .registry
            .execute(index, &request, &RequestContext::default())
            .await;
        serde_json::from_slice(&body).unwrap_or_else(|e| {
            panic!(
                "invalid JSON response {e}: {}",
                String::from_utf8_lossy(&body)
            )
        })
    }

    async fn query(&self, path: &str, query: &str) -> Value {
        self.query_with(path, query, None).await
    }
}

const T0: i64 = 1_700_000_000_000;

/// Emerdale with coops red (2 hens) and yellow (1 hen); red renamed purple at T0+1000.
async fn farm_world() -> World {
    let w = World::new().await;
    w.put(
        "farm",
        "F1",
        json!({"name": "Emerdale", "zone": "north", "details": {"acres": 40, "tags": ["a", "b"]}}),
        T0,
    )
    .await;
    w.put("farm", "F2", json!({"name": "Dale", "zone": "south"}), T0)
        .await;
    w.put("coop", "C1", json!({"name": "red", "farm_id": "F1"}), T0)
        .await;
    w.put("coop", "C2", json!({"name": "yellow", "farm_id": "F1"}), T0)
        .await;
    w.put("coop", "C3", json!({"name": "blue", "farm_id": "F2"}), T0)
        .await;
    w.put(
        "hen",
        "H1",
        json!({"name": "chuck", "eggs": 2, "coop_id": "C1"}),
        T0,
    )
    .await;
    w.put(
        "hen",
        "H2",
        json!({"name": "duck", "eggs": 1, "coop_id": "C1"}),
        T0,
    )
    .await;
    w.put(
        "hen",
        "H3",
        json!({"name": "euck", "eggs": 3, "coop_id": "C2"}),
        T0,
    )
    .await;
    w.put(
        "coop",
        "C1",
        json!({"name": "purple", "farm_id": "F1"}),
        T0 + 1000,
    )
    .await;
    w
}

#[tokio::test]
async fn root_singleton_and_vector_queries() {
    let w = farm_world().await;
    let r = w
        .query("/farm/graph", r#"{ getById(id: "F1") { id name zone } }"#)
        .await;
    assert_eq!(
        r,
        json!({"data": {"getById": {"id": "F1", "name": "Emerdale", "zone": "north"}}})
    );
    let r = w.query("/farm/graph", "{ getAll { name } }").await;
    assert_eq!(
        r,
        json!({"data": {"getAll": [{"name": "Emerdale"}, {"name": "Dale"}]}})
    );
    let r = w
        .query("/farm/graph", r#"{ getByZone(zone: "south") { name } }"#)
        .await;
    assert_eq!(r, json!({"data": {"getByZone": [{"name": "Dale"}]}}));
    let r = w
        .query("/farm/graph", "{ getAll(limit: 1) { name } }")
        .await;
    assert_eq!(r["data"]["getAll"].as_array().unwrap().len(), 1);
    let r = w
        .query("/farm/graph", r#"{ getById(id: "nope") { name } }"#)
        .await;
    assert_eq!(r, json!({"data": {"getById": null}}), "not found is null");
}

#[tokio::test]
async fn nested_resolvers_three_levels_down_and_up() {
    let w = farm_world().await;
    let r = w
        .query(
            "/farm/graph",
            r#"{ getById(id: "F1") { name coops { name hens { name eggs } } } }"#,
        )
        .await;
    assert_eq!(
        r,
        json!({"data": {"getById": {"name": "Emerdale", "coops": [
            {"name": "purple", "hens": [{"name": "chuck", "eggs": 2}, {"name": "duck", "eggs": 1}]},
            {"name": "yellow", "hens": [{"name": "euck", "eggs": 3}]}
        ]}}})
    );
    let r = w
        .query(
            "/hen/graph",
            r#"{ getById(id: "H3") { name coop { name farm { name } } } }"#,
        )
        .await;
    assert_eq!(
        r,
        json!({"data": {"getById": {"name": "euck", "coop": {"name": "yellow", "farm": {"name": "Emerdale"}}}}})
    );
    // a vector relationship with no match is [] (never null)
    let r = w
        .query(
            "/farm/graph",
            r#"{ getById(id: "F2") { coops { hens { name } } } }"#,
        )
        .await;
    assert_eq!(r, json!({"data": {"getById": {"coops": [{"hens": []}]}}}));
}

#[tokio::test]
async fn at_is_propagated_to_every_level() {
    let w = farm_world().await;
    let q = format!(
        r#"{{ getById(id: "F1", at: {}) {{ coops {{ name hens {{ coop {{ name }} }} }} }} }}"#,
        T0 + 500
    );
    let r = w.query("/farm/graph", &q).await;
    assert_eq!(
        r,
        json!({"data": {"getById": {"coops": [
            {"name": "red", "hens": [{"coop": {"name": "red"}}, {"coop": {"name": "red"}}]},
            {"name": "yellow", "hens": [{"coop": {"name": "yellow"}}]}
        ]}}}),
        "old names at an old `at`, at every depth"
    );
    // before creation: nothing
    let q = format!(r#"{{ getById(id: "F1", at: {}) {{ name }} }}"#, T0 - 1);
    assert_eq!(
        w.query("/farm/graph", &q).await,
        json!({"data": {"getById": null}})
    );
    // `at: Int` in the coop SDL still takes 13-digit milliseconds
    let q = format!(r#"{{ getById(id: "C1", at: {}) {{ name }} }}"#, T0 + 500);
    assert_eq!(
        w.query("/coop/graph", &q).await,
        json!({"data": {"getById": {"name": "red"}}})
    );
}

#[tokio::test]
async fn an_at_variable_declared_int_works_where_the_sdl_says_at_int() {
    // MeshQL clients write `query($at: Int)` against `at: Int` schemas (issue 12)
    let w = farm_world().await;
    let q = r#"query Old($at: Int!) { getById(id: "C1", at: $at) { name } }"#;
    assert_eq!(
        w.query_with("/coop/graph", q, Some(json!({"at": T0 + 500})))
            .await,
        json!({"data": {"getById": {"name": "red"}}})
    );
    let q = r#"query Old($at: Int) { getByFarm(id: "F1", at: $at) { name } }"#;
    let r = w
        .query_with("/coop/graph", q, Some(json!({"at": T0 - 1})))
        .await;
    assert_eq!(r, json!({"data": {"getByFarm": []}}));
    // where the schema says Float, an Int variable is read as Float too
    let q = r#"query($at: Int) { getById(id: "F1", at: $at) { name } }"#;
    let r = w
        .query_with("/farm/graph", q, Some(json!({"at": T0 - 1})))
        .await;
    assert_eq!(r, json!({"data": {"getById": null}}));
    // an Int variable elsewhere is untouched: `limit` stays Int, and a String `at` variable
    // is still refused
    let q = r#"query($n: Int, $at: String) { getAll(limit: $n, at: $at) { name } }"#;
    let r = w
        .query_with("/farm/graph", q, Some(json!({"n": 1, "at": "x"})))
        .await;
    assert!(r["data"].is_null(), "{r}");
    let message = r["errors"][0]["message"].as_str().unwrap();
    assert!(message.contains("$at"), "{message}");
}

#[tokio::test]
async fn one_storage_query_per_level_whatever_the_fan_out() {
    let w = World::new().await;
    for f in 0..5 {
        w.put(
            "farm",
            &format!("F{f}"),
            json!({"name": format!("farm{f}")}),
            T0,
        )
        .await;
        for c in 0..4 {
            let coop = format!("C{f}-{c}");
            w.put(
                "coop",
                &coop,
                json!({"name": coop.clone(), "farm_id": format!("F{f}")}),
                T0,
            )
            .await;
            for h in 0..3 {
                w.put(
                    "hen",
                    &format!("H{f}-{c}-{h}"),
                    json!({"name": "hen", "coop_id": coop.clone()}),
                    T0,
                )
                .await;
            }
        }
    }
    let before = w.reads();
    let r = w
        .query(
            "/farm/graph",
            "{ getAll { name coops { name hens { name coop { name } } } } }",
        )
        .await;
    assert!(r.get("errors").is_none(), "{r}");
    let farms = r["data"]["getAll"].as_array().unwrap();
    assert_eq!(farms.len(), 5);
    let hens: usize = farms
        .iter()
        .flat_map(|f| f["coops"].as_array().unwrap())
        .map(|c| c["hens"].as_array().unwrap().len())
        .sum();
    assert_eq!(hens, 60);
    // farms, coops, hens, hens' coops: four levels, four queries (not 1 + 5 + 20 + 60)
    assert_eq!(w.reads() - before, 4);
}

#[tokio::test]
async fn aliases_fragments_variables_and_directives() {
    let w = farm_world().await;
    let q = r#"
        query Q($id: ID, $withCoops: Boolean!, $zone: String) {
          a: getById(id: $id) { ...F coops @include(if: $withCoops) { n: name } }
          b: getByZone(zone: $zone) { name __typename }
          __typename
        }
        fragment F on Farm { title: name details { acres tags } }
    "#;
    let r = w
        .query_with(
            "/farm/graph",
            q,
            Some(json!({"id": "F1", "withCoops": false, "zone": "south"})),
        )
        .await;
    assert_eq!(
        r,
        json!({"data": {
            "a": {"title": "Emerdale", "details": {"acres": 40, "tags": ["a", "b"]}},
            "b": [{"name": "Dale", "__typename": "Farm"}],
            "__typename": "Query"
        }})
    );
    let r = w
        .query_with(
            "/farm/graph",
            q,
            Some(json!({"id": "F1", "withCoops": true, "zone": "x"})),
        )
        .await;
    assert_eq!(
        r["data"]["a"]["coops"],
        json!([{"n": "purple"}, {"n": "yellow"}])
    );
    // a variable of the wrong type is a request error
    let r = w
        .query_with(
            "/farm/graph",
            q,
            Some(json!({"id": "F1", "withCoops": "yes"})),
        )
        .await;
    assert!(r.get("data").is_none(), "{r}");
    assert!(
        r["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("withCoops"),
        "{r}"
    );
}

#[tokio::test]
async fn validation_errors_have_locations_and_no_data() {
    let w = farm_world().await;
    let r = w
        .query("/farm/graph", "{ getById(id: \"F1\") { name colour } }")
        .await;
    assert!(r.get("data").is_none(), "{r}");
    let e = &r["errors"][0];
    assert!(e["message"].as_str().unwrap().contains("colour"), "{r}");
    assert_eq!(e["locations"][0]["line"], 1);
    let r = w
        .query("/farm/graph", "{ getById(idx: \"F1\") { name } }")
        .await;
    assert!(
        r["errors"][0]["message"].as_str().unwrap().contains("idx"),
        "{r}"
    );
    let r = w.query("/farm/graph", "{ getById(id: ").await;
    assert!(r["errors"][0]["message"].is_string(), "{r}");
    let r = w.query("/farm/graph", "mutation { x }").await;
    assert!(r.get("data").is_none(), "{r}");
}

#[tokio::test]
async fn an_unknown_field_is_one_error_that_names_the_fields_and_the_likely_one() {
    let w = farm_world().await;
    // `nme` inside a relationship: the only error, not a "missing subselection" at `coops`
    let r = w.query("/farm/graph", "{ getAll { coops { nme } } }").await;
    let errors = r["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{r}");
    let message = errors[0]["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "type `Coop` does not have a field `nme`; did you mean `name`? (fields of `Coop`: "
        ),
        "{message}"
    );
    for field in ["id", "name", "hens"] {
        assert!(message.contains(field), "{message}");
    }
    assert_eq!(errors[0]["locations"][0]["line"], 1, "{r}");
    // nothing close: the fields, no guess
    let r = w
        .query("/farm/graph", r#"{ getById(id: "F1") { zzzz } }"#)
        .await;
    let message = r["errors"][0]["message"].as_str().unwrap();
    assert!(!message.contains("did you mean"), "{message}");
    assert!(message.contains("(fields of `Farm`: "), "{message}");
    // a genuinely missing subselection is still reported
    let r = w
        .query("/farm/graph", r#"{ getById(id: "F1") { coops } }"#)
        .await;
    assert!(
        r["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("subselection"),
        "{r}"
    );
}

#[tokio::test]
async fn an_at_in_seconds_gets_a_hint() {
    let w = farm_world().await;
    let seconds = T0 / 1000 + 1;
    let q = format!(r#"{{ getById(id: "F1", at: {seconds}) {{ name }} }}"#);
    let r = w.query("/farm/graph", &q).await;
    assert_eq!(
        r["data"],
        json!({"getById": null}),
        "still read as milliseconds: {r}"
    );
    let hints = r["extensions"]["hints"].as_array().expect("a hint");
    let hint = hints[0].as_str().unwrap();
    assert!(hint.contains("milliseconds"), "{hint}");
    assert!(hint.contains(&(seconds * 1000).to_string()), "{hint}");
    // through a variable too
    let r = w
        .query_with(
            "/farm/graph",
            r#"query($at: Float) { getById(id: "F1", at: $at) { name } }"#,
            Some(json!({"at": seconds})),
        )
        .await;
    assert!(r["extensions"]["hints"][0].is_string(), "{r}");
    // milliseconds: no hint
    let q = format!(r#"{{ getById(id: "F1", at: {}) {{ name }} }}"#, T0 + 1);
    let r = w.query("/farm/graph", &q).await;
    assert_eq!(r, json!({"data": {"getById": {"name": "Emerdale"}}}));
}

#[tokio::test]
async fn non_null_violations_propagate_to_the_nearest_nullable_parent() {
    let w = farm_world().await;
    // a hen without a name, in a coop whose `hens` items are non-null (`[Hen!]`)
    w.put("hen", "H9", json!({"eggs": 1, "coop_id": "C2"}), T0)
        .await;
    let r = w
        .query(
            "/farm/graph",
            r#"{ getById(id: "F1") { name coops { name hens { name } } } }"#,
        )
        .await;
    assert_eq!(
        r["data"]["getById"]["coops"][0]["hens"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(r["data"]["getById"]["coops"][1]["hens"], Value::Null, "{r}");
    let e = &r["errors"][0];
    assert!(e["message"].as_str().unwrap().contains("Hen.name"), "{r}");
    assert_eq!(e["path"], json!(["getById", "coops", 1, "hens", 1, "name"]));
}

#[tokio::test]
async fn introspection_works() {
    let w = farm_world().await;
    let r = w
        .query("/farm/graph", "{ __schema { queryType { name } types { name } } __type(name: \"Farm\") { fields { name } } }")
        .await;
    assert_eq!(r["data"]["__schema"]["queryType"]["name"], "Query");
    let fields: Vec<&str> = r["data"]["__type"]["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert!(fields.contains(&"coops"), "{r}");
}

#[tokio::test]
async fn plans_are_cached_and_results_stay_correct() {
    let w = farm_world().await;
    let q = r#"{ getById(id: "F1") { name } }"#;
    let first = w.query("/farm/graph", q).await;
    w.put("farm", "F1", json!({"name": "Renamed"}), T0 + 5000)
        .await;
    let second = w.query("/farm/graph", q).await;
    assert_eq!(first["data"]["getById"]["name"], "Emerdale");
    assert_eq!(second["data"]["getById"]["name"], "Renamed");
}

#[tokio::test]
async fn aliased_root_fields_differing_only_in_id_share_one_query() {
    let w = farm_world().await;
    let before = w.reads();
    let r = w
        .query(
            "/coop/graph",
            r#"{ item_0: getByFarm(id: "F1") { name hens { name } } item_1: getByFarm(id: "F2") { name hens { name } } item_2: getByFarm(id: "F1") { name hens { name } } item_3: getByFarm(id: "none") { name hens { name } } }"#,
        )
        .await;
    assert!(r.get("errors").is_none(), "{r}");
    assert_eq!(r["data"]["item_0"], r["data"]["item_2"]);
    assert_eq!(r["data"]["item_0"].as_array().unwrap().len(), 2);
    assert_eq!(r["data"]["item_1"], json!([{"name": "blue", "hens": []}]));
    assert_eq!(r["data"]["item_3"], json!([]));
    assert_eq!(
        w.reads() - before,
        2,
        "one query for the coops, one for their hens"
    );
    let r = w
        .query("/farm/graph", r#"{ a: getById(id: "F1") { name } b: getById(id: "F2") { name } c: getById(id: "F9") { name } }"#)
        .await;
    assert_eq!(
        r,
        json!({"data": {"a": {"name": "Emerdale"}, "b": {"name": "Dale"}, "c": null}})
    );
}

#[tokio::test]
async fn repeated_fragment_spreads_are_expanded_once() {
    let w = farm_world().await;
    // 2^30 expansions if every spread were expanded: must plan instantly instead
    let mut q = String::from("{ getById(id: \"F1\") { ...F0 } }");
    for i in 0..30 {
        q.push_str(&format!(
            " fragment F{i} on Farm {{ name ...F{n} ...F{n} }}",
            n = i + 1
        ));
    }
    q.push_str(" fragment F30 on Farm { name }");
    let r = w.query("/farm/graph", &q).await;
    assert_eq!(r, json!({"data": {"getById": {"name": "Emerdale"}}}));
}

#[tokio::test]
async fn oversized_operations_are_refused() {
    let w = farm_world().await;
    let q: String = std::iter::once("{".to_owned())
        .chain((0..1001).map(|i| format!(" a{i}: getById(id: \"F1\") {{ name }}")))
        .chain(std::iter::once(" }".to_owned()))
        .collect();
    let r = w.query("/farm/graph", &q).await;
    assert!(r.get("data").is_none(), "{r}");
    assert!(
        r["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("root fields"),
        "{r}"
    );
}

#[tokio::test]
async fn limit_must_be_positive_and_ids_may_be_integers() {
    let w = farm_world().await;
    let r = w
        .query("/farm/graph", "{ getAll(limit: 0) { name } }")
        .await;
    assert_eq!(r["data"]["getAll"], Value::Null);
    assert!(
        r["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("limit"),
        "{r}"
    );
    assert_eq!(
        r["errors"][0]["extensions"]["code"], "BAD_REQUEST",
        "errors carry the code of their kind: {r}"
    );
    w.put("farm", "42", json!({"name": "Numbered"}), T0).await;
    let r = w
        .query("/farm/graph", "{ getById(id: 42) { id name } }")
        .await;
    assert_eq!(
        r,
        json!({"data": {"getById": {"id": "42", "name": "Numbered"}}})
    );
    let r = w
        .query_with(
            "/farm/graph",
            "query($i: ID) { getById(id: $i) { name } }",
            Some(json!({"i": 42})),
        )
        .await;
    assert_eq!(r, json!({"data": {"getById": {"name": "Numbered"}}}));
}

/// The code of the first error of a response refused as a whole (no data).
fn refused_with(r: &Value) -> &str {
    assert!(
        r.get("data").is_none_or(Value::is_null),
        "a refused request has no data: {r}"
    );
    r["errors"][0]["extensions"]["code"].as_str().unwrap_or("")
}

fn limits(f: impl FnOnce(&mut meshql_config::GraphqlLimits)) -> meshql_config::GraphqlLimits {
    let mut l = meshql_config::GraphqlLimits::default();
    f(&mut l);
    l
}

fn n(v: usize) -> std::num::NonZeroUsize {
    std::num::NonZeroUsize::new(v).unwrap()
}

async fn limited_world(l: meshql_config::GraphqlLimits) -> World {
    let w = farm_world().await;
    World {
        registry: w.registry.with_limits(l),
        ..w
    }
}

#[tokio::test]
async fn relationship_cycles_stop_at_the_relationship_depth() {
    let w = limited_world(limits(|l| l.max_relationship_depth = n(4))).await;
    // farm → coops → hens → coop: three relationship levels, allowed
    let ok = w
        .query(
            "/farm/graph",
            r#"{ getById(id: "F1") { coops { hens { coop { name } } } } }"#,
        )
        .await;
    assert!(ok.get("errors").is_none(), "{ok}");
    // the cycle hens { coop { hens ... } } five levels deep: refused before anything is read
    let reads = w.reads();
    let r = w
        .query(
            "/coop/graph",
            r#"{ getById(id: "C1") { hens { coop { hens { coop { hens { name } } } } } } }"#,
        )
        .await;
    assert_eq!(refused_with(&r), "QUERY_TOO_COMPLEX", "{r}");
    assert!(
        r["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("relationships deeper than 4"),
        "{r}"
    );
    assert_eq!(w.reads(), reads, "nothing was read");
}

#[tokio::test]
async fn aliased_relationships_are_counted() {
    let w = limited_world(limits(|l| l.max_relationships = n(10))).await;
    let q: String = std::iter::once(r#"{ getAll { "#.to_owned())
        .chain((0..6).map(|i| format!(" c{i}: coops {{ hens {{ name }} }}")))
        .chain(std::iter::once(" } }".to_owned()))
        .collect();
    let r = w.query("/farm/graph", &q).await;
    assert_eq!(refused_with(&r), "QUERY_TOO_COMPLEX", "{r}");
    assert!(
        r["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("more than 10 relationship fields"),
        "{r}"
    );
}

#[tokio::test]
async fn depth_and_field_limits_are_configurable() {
    let w = limited_world(limits(|l| {
        l.max_depth = n(3);
        l.max_fields = n(5);
    }))
    .await;
    let ok = w
        .query("/farm/graph", r#"{ getById(id: "F1") { coops { name } } }"#)
        .await;
    assert!(ok.get("errors").is_none(), "{ok}");
    let deep = w
        .query(
            "/farm/graph",
            r#"{ getById(id: "F1") { coops { hens { name } } } }"#,
        )
        .await;
    assert_eq!(refused_with(&deep), "QUERY_TOO_COMPLEX", "{deep}");
    let wide = w
        .query(
            "/farm/graph",
            r#"{ getById(id: "F1") { a: name b: name c: name d: name e: name f: name } }"#,
        )
        .await;
    assert_eq!(refused_with(&wide), "QUERY_TOO_COMPLEX", "{wide}");
}

#[tokio::test]
async fn a_vector_query_over_the_object_budget_is_refused_not_cut_short() {
    let w = limited_world(limits(|l| l.max_objects = n(1))).await;
    let ok = w
        .query("/farm/graph", "{ getAll(limit: 1) { name } }")
        .await;
    assert_eq!(ok["data"]["getAll"].as_array().unwrap().len(), 1, "{ok}");
    // two farms match
    let r = w.query("/farm/graph", "{ getAll { name } }").await;
    assert_eq!(refused_with(&r), "RESPONSE_TOO_LARGE", "{r}");
    // relationships count too: one farm, two coops
    let r = w
        .query("/farm/graph", r#"{ getById(id: "F1") { coops { name } } }"#)
        .await;
    assert_eq!(refused_with(&r), "RESPONSE_TOO_LARGE", "{r}");
}

#[tokio::test]
async fn objects_written_count_once_per_parent() {
    // every hen links back to its coop, which lists its hens: 3 documents fetched per
    // level, but written once per parent; the writer stops at the budget
    let w = limited_world(limits(|l| l.max_objects = n(12))).await;
    let small = w
        .query(
            "/coop/graph",
            r#"{ getById(id: "C1") { hens { coop { name } } } }"#,
        )
        .await;
    assert!(small.get("errors").is_none(), "{small}");
    let r = w
        .query(
            "/coop/graph",
            r#"{ getById(id: "C1") { hens { coop { hens { coop { hens { coop { hens { name } } } } } } } } }"#,
        )
        .await;
    assert_eq!(refused_with(&r), "RESPONSE_TOO_LARGE", "{r}");
}

#[tokio::test]
async fn the_response_size_is_capped() {
    let w = limited_world(limits(|l| l.max_response_bytes = n(60))).await;
    let ok = w
        .query("/farm/graph", r#"{ getById(id: "F1") { name } }"#)
        .await;
    assert!(ok.get("errors").is_none(), "{ok}");
    let r = w
        .query(
            "/farm/graph",
            "{ getAll { id name zone coops { id name } } }",
        )
        .await;
    assert_eq!(refused_with(&r), "RESPONSE_TOO_LARGE", "{r}");
}

#[tokio::test]
async fn int_is_served_up_to_two_to_the_53_and_refused_beyond() {
    let w = farm_world().await;
    w.put(
        "hen",
        "H8",
        json!({"name": "wide", "eggs": 4_294_967_296_000i64, "coop_id": "C2"}),
        T0,
    )
    .await;
    w.put(
        "hen",
        "H9",
        json!({"name": "edge", "eggs": 9_007_199_254_740_991i64, "coop_id": "C2"}),
        T0,
    )
    .await;
    w.put(
        "hen",
        "H10",
        json!({"name": "over", "eggs": 9_007_199_254_740_993i64, "coop_id": "C2"}),
        T0,
    )
    .await;
    let r = w
        .query(
            "/hen/graph",
            r#"{ a: getById(id: "H8") { eggs } b: getById(id: "H9") { eggs } c: getById(id: "H10") { name eggs } }"#,
        )
        .await;
    assert_eq!(r["data"]["a"]["eggs"], json!(4_294_967_296_000i64), "{r}");
    assert_eq!(
        r["data"]["b"]["eggs"],
        json!(9_007_199_254_740_991i64),
        "{r}"
    );
    assert_eq!(r["data"]["c"]["eggs"], Value::Null, "{r}");
    assert!(
        r["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("9007199254740993"),
        "{r}"
    );
}

#[tokio::test]
async fn a_syntax_error_is_reported_once() {
    let w = farm_world().await;
    let r = w
        .query("/farm/graph", r#"{ getById(id: "x" { name }"#)
        .await;
    let errors = r["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{r}");
    assert!(
        errors[0]["message"]
            .as_str()
            .unwrap()
            .starts_with("syntax error"),
        "{r}"
    );
    assert!(r.get("data").is_none(), "{r}");
}

/// Interface and union return types answer as the object type of the documents: the
/// entity's own type (named after it), or the one object type an abstract type has.
#[tokio::test]
async fn interface_and_union_fields_resolve_to_the_documents_type() {
    const CONFIG: &str = r#"
[[entity]]
name = "farm"
[entity.graphql]
schema = "farm.graphql"
[[entity.graphql.singletons]]
name = "node"
query = '{"id": "{{id}}"}'
[[entity.graphql.vectors]]
name = "search"
query = '{}'
[[entity.graphql.resolvers]]
name = "coops"
query = "getByFarm"
graph = "/coop/graph"

[[entity]]
name = "coop"
[entity.graphql]
schema = "coop.graphql"
[[entity.graphql.singletons]]
name = "getById"
query = '{"id": "{{id}}"}'
[[entity.graphql.vectors]]
name = "getByFarm"
query = '{"payload.farm_id": "{{id}}"}'
"#;
    const FARM: &str = r#"
interface Node { id: ID }
type Query { node(id: ID, at: Float): Node  search(at: Float): [Thing] }
union Thing = Farm | Barn
type Farm implements Node { id: ID name: String coops: [Shelter] }
type Barn implements Node { id: ID size: Int }
union Shelter = Coop
type Coop { id: ID name: String }
"#;
    const COOP: &str = r#"
type Query { getById(id: ID, at: Float): Coop  getByFarm(id: ID, at: Float): [Coop] }
type Coop { id: ID name: String farm_id: ID }
"#;
    let w = World::with_files(&[
        ("meshql.toml", CONFIG),
        ("farm.graphql", FARM),
        ("coop.graphql", COOP),
    ])
    .await;
    w.put("farm", "F1", json!({"name": "Emerdale"}), T0).await;
    w.put("coop", "C1", json!({"name": "red", "farm_id": "F1"}), T0)
        .await;
    let got = w
        .query(
            "/farm/graph",
            r#"{ node(id: "F1") { __typename id ... on Farm { name coops { __typename ... on Coop { name } } } ... on Barn { size } }
                 search { __typename ... on Farm { name } ... on Barn { size } } }"#,
        )
        .await;
    assert_eq!(
        got,
        json!({"data": {
            "node": {"__typename": "Farm", "id": "F1", "name": "Emerdale",
                     "coops": [{"__typename": "Coop", "name": "red"}]},
            "search": [{"__typename": "Farm", "name": "Emerdale"}]
        }})
    );
}

/// An interface root type whose object types do not tell which one the entity's documents
/// are is a config error naming the query and the candidates.
#[test]
fn an_abstract_root_type_that_leaves_the_entity_type_open_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("meshql.toml"),
        r#"
[[entity]]
name = "stable"
[entity.graphql]
schema = "stable.graphql"
[[entity.graphql.singletons]]
name = "node"
query = '{"id": "{{id}}"}'
"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("stable.graphql"),
        "interface Node { id: ID }\ntype Query { node(id: ID, at: Float): Node }\n\
         type Farm implements Node { id: ID }\ntype Barn implements Node { id: ID }\n",
    )
    .unwrap();
    let errors = meshql_config::load(dir.path()).expect_err("the entity type is open");
    let text = errors.to_string();
    assert!(
        text.contains("`node` returns `Node`, which is any of `Farm`, `Barn`")
            || text.contains("`node` returns `Node`, which is any of `Barn`, `Farm`"),
        "{text}"
    );
    assert!(
        text.contains("entity.graphql.schema") || text.contains("graphql.schema"),
        "{text}"
    );
}

/// A coop reader that, when the first batch of coops is asked for (after the farm level was
/// read), lets a writer rename coop C1 first: a write landing between two levels of one
/// request.
struct RenameBetweenLevels {
    inner: DynStore,
    done: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl meshql_core::StoreReader for RenameBetweenLevels {
    async fn read(
        &self,
        id: &str,
        ctx: &meshql_core::ReadContext<'_>,
    ) -> Result<Option<meshql_core::Envelope>, meshql_core::StoreError> {
        self.inner.read(id, ctx).await
    }
    async fn read_many(
        &self,
        ids: &[String],
        ctx: &meshql_core::ReadContext<'_>,
    ) -> Result<Vec<meshql_core::Envelope>, meshql_core::StoreError> {
        self.inner.read_many(ids, ctx).await
    }
    async fn list(
        &self,
        ctx: &meshql_core::ReadContext<'_>,
    ) -> Result<Vec<meshql_core::Envelope>, meshql_core::StoreError> {
        self.inner.list(ctx).await
    }
    async fn list_page(
        &self,
        after: Option<&str>,
        limit: usize,
        ctx: &meshql_core::ReadContext<'_>,
    ) -> Result<Vec<meshql_core::Envelope>, meshql_core::StoreError> {
        self.inner.list_page(after, limit, ctx).await
    }
    async fn versions(
        &self,
        id: &str,
    ) -> Result<Vec<meshql_core::Envelope>, meshql_core::StoreError> {
        self.inner.versions(id).await
    }
    async fn find(
        &self,
        search: &meshql_core::Search<'_>,
        ctx: &meshql_core::ReadContext<'_>,
    ) -> Result<Vec<meshql_core::Row>, meshql_core::StoreError> {
        self.inner.find(search, ctx).await
    }
    async fn find_batch(
        &self,
        batch: &meshql_core::BatchSearch<'_>,
        ctx: &meshql_core::ReadContext<'_>,
    ) -> Result<meshql_core::KeyedRows, meshql_core::StoreError> {
        if !self.done.swap(true, std::sync::atomic::Ordering::SeqCst) {
            // stamped after the request began, as any write committed while it runs
            let later = meshql_core::time::now_millis() + 5;
            self.inner
                .create(
                    NewDocument::with_id(
                        "C1",
                        json!({"name": "purple", "farm_id": "F1"})
                            .as_object()
                            .unwrap()
                            .clone(),
                    )
                    .at(later),
                    &meshql_core::WriteContext::SYSTEM,
                )
                .await
                .unwrap();
        }
        self.inner.find_batch(batch, ctx).await
    }
}

/// Issue 12 §3: a request without `at` reads every level as of its start, so a write landing
/// between its levels is in none of them (as MeshQL, whose resolvers pass the root's time
/// on); the next request sees it.
#[tokio::test]
async fn one_request_reads_one_snapshot_even_when_a_write_lands_between_its_levels() {
    let w = World::with_readers(|entity, store| -> DynReader {
        if entity == "coop" {
            Arc::new(RenameBetweenLevels {
                inner: store,
                done: std::sync::atomic::AtomicBool::new(false),
            })
        } else {
            store
        }
    })
    .await;
    let now = meshql_core::time::now_millis();
    w.put("farm", "F1", json!({"name": "Emerdale"}), now - 1000)
        .await;
    w.put(
        "coop",
        "C1",
        json!({"name": "red", "farm_id": "F1"}),
        now - 1000,
    )
    .await;
    let query = r#"{ getById(id: "F1") { name coops { name } } }"#;
    assert_eq!(
        w.query("/farm/graph", query).await,
        json!({"data": {"getById": {"name": "Emerdale", "coops": [{"name": "red"}]}}})
    );
    // the rename is there for the next request (once its stamp has passed)
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        w.query("/farm/graph", query).await,
        json!({"data": {"getById": {"name": "Emerdale", "coops": [{"name": "purple"}]}}})
    );
}
