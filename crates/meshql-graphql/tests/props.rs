//! Property tests for the GraphQL front end (issue 11, item 10): arbitrary query text,
//! mutations of valid queries, deep nesting, many aliases, odd string escapes and arbitrary
//! variables, executed against a real schema (farm → coop → hen, in-process resolvers, memory
//! stores), are always answered with a GraphQL response — a JSON object with `data` and/or
//! `errors`, every error with a message — never a panic.

use meshql_core::{DynStore, NewDocument, WriteContext};
use meshql_graphql::{Graphlette, GraphqlRequest, Registry, RequestContext};
use meshql_store_memory::MemoryStore;
use proptest::prelude::*;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Duration;

mod common;
use common::{COOP_SDL, FARM_SDL, HEN_SDL};

const CONFIG: &str = r#"
[[entity]]
name = "farm"
storage = "mem"
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
query = '{"payload.zone": "{{zone}}"}'
[[entity.graphql.resolvers]]
name = "coops"
query = "getByFarm"
graph = "/coop/graph"

[[entity]]
name = "coop"
storage = "mem"
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
storage = "mem"
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

[storage.mem]
type = "memory"
"#;

const T0: i64 = 1_700_000_000_000;

struct World {
    rt: tokio::runtime::Runtime,
    registry: Registry,
}

impl World {
    fn new() -> World {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let registry = rt.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            for (f, s) in [
                ("farm.graphql", FARM_SDL),
                ("coop.graphql", COOP_SDL),
                ("hen.graphql", HEN_SDL),
                ("meshql.toml", CONFIG),
            ] {
                std::fs::write(dir.path().join(f), s).unwrap();
            }
            let config = meshql_config::load(dir.path()).expect("valid test config");
            let mut graphlettes = Vec::new();
            for e in &config.entities {
                let store: DynStore = Arc::new(MemoryStore::new());
                let g = e.graph.as_ref().unwrap();
                let templates: Vec<_> = g.queries.iter().map(|q| q.template.clone()).collect();
                store.prepare(&templates).await.unwrap();
                let docs: &[(&str, Value)] = match e.name.as_str() {
                    "farm" => &[
                        ("F1", json!({"name": "Emerdale", "zone": "north", "details": {"acres": 40, "tags": ["a"]}})),
                        ("F2", json!({"name": "Dale", "zone": "south"})),
                    ],
                    "coop" => &[
                        ("C1", json!({"name": "red", "farm_id": "F1"})),
                        ("C2", json!({"name": "yellow", "farm_id": "F1"})),
                    ],
                    _ => &[
                        ("H1", json!({"name": "chuck", "eggs": 2, "coop_id": "C1"})),
                        ("H2", json!({"name": "duck", "eggs": 9007199254740993i64, "coop_id": "C1"})),
                        ("H3", json!({"name": "euck", "eggs": 3.5, "coop_id": "C2"})),
                    ],
                };
                for (id, p) in docs {
                    store
                        .create(
                            NewDocument::with_id(*id, p.as_object().unwrap().clone()).at(T0),
                            &WriteContext::SYSTEM,
                        )
                        .await
                        .unwrap();
                }
                graphlettes.push(Graphlette::new(&e.name, common::spec(g), common::service(&e.name, store.clone(), store)));
            }
            Registry::new(graphlettes, Duration::from_secs(1), Duration::from_secs(5)).unwrap()
        });
        World { rt, registry }
    }

    /// Runs a request and checks the response's shape; returns the response.
    fn ask(
        &self,
        path: &str,
        query: Option<String>,
        operation_name: Option<String>,
        variables: Option<Value>,
    ) -> Result<Value, TestCaseError> {
        let (index, _) = self.registry.by_path(path).unwrap();
        let request = GraphqlRequest {
            query,
            operation_name,
            variables,
        };
        let body = self.rt.block_on(self.registry.execute(
            index,
            &request,
            &RequestContext::default(),
        ));
        let r: Value = serde_json::from_slice(&body).map_err(|e| {
            TestCaseError::fail(format!(
                "not JSON ({e}): {}",
                String::from_utf8_lossy(&body[..body.len().min(500)])
            ))
        })?;
        let Value::Object(top) = &r else {
            return Err(TestCaseError::fail(format!("not an object: {r}")));
        };
        prop_assert!(
            top.contains_key("data") || top.contains_key("errors"),
            "neither data nor errors: {r}"
        );
        prop_assert!(
            top.keys()
                .all(|k| ["data", "errors", "extensions"].contains(&k.as_str())),
            "unexpected top-level key: {r}"
        );
        if let Some(errors) = top.get("errors") {
            let errors = errors
                .as_array()
                .ok_or_else(|| TestCaseError::fail(format!("errors not a list: {r}")))?;
            prop_assert!(!errors.is_empty(), "an empty errors list: {r}");
            for e in errors {
                prop_assert!(
                    e["message"].as_str().is_some_and(|m| !m.is_empty()),
                    "an error without a message: {e}"
                );
            }
        }
        Ok(r)
    }
}

thread_local! {
    static WORLD: World = World::new();
}

const PATHS: &[&str] = &["/farm/graph", "/coop/graph", "/hen/graph"];

const VALID: &[&str] = &[
    r#"{ getById(id: "F1") { id name zone details { acres tags } coops { name hens { name eggs coop { name } } } } }"#,
    r#"{ getAll(limit: 1) { name } }"#,
    r#"query Q($id: ID, $at: Float) { getById(id: $id, at: $at) { name coops { name } } }"#,
    r#"{ a: getAll { ...F } b: getByZone(zone: "north") { name } } fragment F on Farm { id name }"#,
    r#"{ getAll { __typename coops { ... on Coop { hens { name } } } } }"#,
    r#"{ __schema { types { name fields { name } } } }"#,
    r#"mutation { getAll { name } }"#,
    r#"{ getById(id: "F1", at: 1.7e12) { name } }"#,
];

/// Tokens a mutation splices into a valid query.
const TOKENS: &[&str] = &[
    "{",
    "}",
    "(",
    ")",
    "[",
    "]",
    ":",
    "$",
    "...",
    "@skip(if: true)",
    "@include(if: $x)",
    "fragment F on Farm { name }",
    "...F",
    "on",
    "query",
    "mutation",
    "subscription",
    "getAll",
    "getById",
    "coops",
    "hens",
    "coop",
    "farm",
    "__typename",
    "__schema",
    "__type(name: \"Farm\")",
    "id:",
    "at: -1e400",
    "limit: -1",
    "limit: 2147483648",
    "limit: 99999999999999999999",
    "\"",
    "\"\"\"",
    "\"\\u{1F600}\"",
    "\"\\uD800\"",
    "\"\\uDC00\\uD800\"",
    "\"\\x\"",
    "\"\\",
    "#",
    "\n",
    "\u{feff}",
    "é",
    "\u{0}",
    "null",
    "true",
    "1.5",
    "$id",
    "a: getAll",
    "alias: name",
    ",",
    "=",
    "!",
    "&",
    "|",
];

#[derive(Debug, Clone)]
enum Edit {
    Insert(usize, usize),
    Delete(usize, usize),
    Replace(usize, usize),
}

fn edits() -> impl Strategy<Value = Vec<Edit>> {
    prop::collection::vec(
        prop_oneof![
            (any::<usize>(), 0..TOKENS.len()).prop_map(|(a, t)| Edit::Insert(a, t)),
            (any::<usize>(), 1usize..12).prop_map(|(a, n)| Edit::Delete(a, n)),
            (any::<usize>(), 0..TOKENS.len()).prop_map(|(a, t)| Edit::Replace(a, t)),
        ],
        1..6,
    )
}

/// Applies edits on char boundaries.
fn apply(query: &str, edits: &[Edit]) -> String {
    let mut chars: Vec<char> = query.chars().collect();
    for e in edits {
        let len = chars.len();
        match e {
            Edit::Insert(at, t) => {
                let p = at % (len + 1);
                chars.splice(p..p, TOKENS[*t].chars());
            }
            Edit::Delete(at, n) => {
                let p = at % (len + 1);
                chars.drain(p..(p + n).min(len));
            }
            Edit::Replace(at, t) => {
                let p = at % (len + 1);
                let end = chars[p..]
                    .iter()
                    .position(|c| c.is_whitespace() || "{}()".contains(*c))
                    .map_or(len, |k| p + k.max(1).min(len - p));
                chars.splice(p..end, TOKENS[*t].chars());
            }
        }
    }
    chars.into_iter().collect()
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        Just(serde_json::from_str("18446744073709551616").unwrap()),
        "\\PC{0,10}".prop_map(Value::String),
        Just(json!("F1")),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec(("\\PC{0,5}|id|at|x|limit", inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// A relationship chain `depth` levels deep: farm → coops → hens → coop → hens → ...
fn cyclic(depth: usize) -> String {
    let mut q = String::from("name");
    for i in (0..depth).rev() {
        let field = match i % 2 {
            0 => "hens",
            _ => "coop",
        };
        q = format!("name {field} {{ {q} }}");
    }
    format!(r#"{{ getById(id: "F1") {{ coops {{ {q} }} }} }}"#)
}

#[test]
fn deep_nesting_and_many_aliases_are_answered() {
    WORLD.with(|w| {
        for depth in [1, 5, 20, 100, 1000, 5000] {
            // plain brace nesting (the parser's recursion) and relationship cycles
            let braces = format!("{}{}", "{ getAll ".repeat(depth), "}".repeat(depth));
            w.ask("/farm/graph", Some(braces), None, None).unwrap();
            let r = w
                .ask("/farm/graph", Some(cyclic(depth.min(200))), None, None)
                .unwrap();
            if depth <= 5 {
                assert!(r.get("errors").is_none(), "{r}");
            }
        }
        for n in [10, 1000, 20_000] {
            let aliases: String = (0..n)
                .map(|i| format!("a{i}: getAll {{ coops {{ hens {{ name }} }} }} "))
                .collect();
            w.ask("/farm/graph", Some(format!("{{ {aliases} }}")), None, None)
                .unwrap();
            let fields: String = (0..n).map(|i| format!("f{i}: name ")).collect();
            w.ask(
                "/farm/graph",
                Some(format!("{{ getAll {{ {fields} }} }}")),
                None,
                None,
            )
            .unwrap();
        }
        // the fixture answers for real
        let r = w
            .ask("/farm/graph", Some(VALID[0].into()), None, None)
            .unwrap();
        assert_eq!(r["data"]["getById"]["name"], "Emerdale", "{r}");
        assert_eq!(
            r["data"]["getById"]["coops"][0]["hens"][0]["coop"]["name"], "red",
            "{r}"
        );
        // variables of every type, an operation name naming nothing, an empty query
        w.ask("/farm/graph", None, None, None).unwrap();
        w.ask("/farm/graph", Some("  ".into()), None, None).unwrap();
        w.ask(
            "/farm/graph",
            Some(VALID[2].into()),
            Some("Nope".into()),
            Some(json!([1])),
        )
        .unwrap();
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// Arbitrary text as a query.
    #[test]
    fn arbitrary_text_is_answered(
        path in 0..PATHS.len(),
        query in prop_oneof![
            "\\PC{0,120}",
            "([{}()\\[\\]:$.,!@#\"\\\\ \n]|[a-zA-Z_0-9]{1,8}){0,60}",
        ],
        operation in prop::option::of("\\PC{0,8}|Q"),
    ) {
        WORLD.with(|w| w.ask(PATHS[path], Some(query), operation, None).map(|_| ()))?;
    }

    /// Valid queries with tokens inserted, deleted and replaced, and arbitrary variables.
    #[test]
    fn mutated_queries_are_answered(
        path in 0..PATHS.len(),
        base in 0..VALID.len(),
        edits in edits(),
        variables in prop::option::of(json_value()),
    ) {
        let query = apply(VALID[base], &edits);
        WORLD.with(|w| w.ask(PATHS[path], Some(query), None, variables).map(|_| ()))?;
    }

    /// The valid queries answer without errors except where they are meant to fail, and
    /// their variables take any JSON.
    #[test]
    fn arbitrary_variables_are_answered(
        id in json_value(),
        at in json_value(),
        extra in prop::collection::vec(("\\PC{0,5}", json_value()), 0..3),
    ) {
        let mut vars: Map<String, Value> = extra.into_iter().collect();
        vars.insert("id".into(), id);
        vars.insert("at".into(), at);
        WORLD.with(|w| {
            w.ask("/farm/graph", Some(VALID[2].into()), Some("Q".into()), Some(Value::Object(vars)))
                .map(|_| ())
        })?;
    }

    /// Deep relationship cycles and alias fans of random sizes.
    #[test]
    fn deep_and_wide_queries_are_answered(depth in 0usize..40, aliases in 0usize..300) {
        WORLD.with(|w| {
            w.ask("/farm/graph", Some(cyclic(depth)), None, None)?;
            let q: String = (0..aliases).map(|i| format!("a{i}: getAll {{ coops {{ name }} }} ")).collect();
            w.ask("/farm/graph", Some(format!("{{ {q} }}")), None, None).map(|_| ())
        })?;
    }

    /// String arguments with odd escapes and unicode.
    #[test]
    fn odd_string_arguments_are_answered(
        s in prop_oneof![
            "\\PC{0,20}",
            "(\\\\u[0-9a-fA-F]{4}|\\\\u\\{[0-9a-fA-F]{1,7}\\}|\\\\[\"\\\\/bfnrtx]|[a-z])*",
        ],
        block in any::<bool>(),
    ) {
        let literal = if block { format!("\"\"\"{s}\"\"\"") } else { format!("\"{s}\"") };
        let query = format!("{{ getById(id: {literal}) {{ name }} getByZone(zone: {literal}) {{ name }} }}");
        WORLD.with(|w| w.ask("/farm/graph", Some(query), None, None).map(|_| ()))?;
    }
}
