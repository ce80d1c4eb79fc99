//! Micro-benchmarks of a graphlette request, on the egg-economy service built the way
//! `meshql-server` builds it (config loaded by `meshql-config`, one store per entity,
//! `Graphlette::new`, `Registry::new`), over in-memory stores so that storage costs little
//! and the GraphQL work dominates. The farmyard is the one `meshql bench` seeds: 3 farms,
//! 3 coops per farm, 5 hens per coop.
//!
//! * **plan/cold**: parse + validate + plan ([`meshql_graphql::plan::plan`], bypassing the
//!   plan cache) of a getById query and of a depth-3 farm → coops → hens query: what a
//!   query text costs the first time it is seen.
//! * **execute**: whole requests through [`Registry::execute`] with a warm plan cache:
//!   `{ __typename }` (plan-cache hit and response envelope, no storage), getById (one
//!   store read + response writing) and depth 3 (three store reads, two of them batched,
//!   and a 1-farm / 3-coop / 15-hen response). The response writer is crate-private: these
//!   requests are its nearest public entry point.
//!
//! Run: `cargo bench -p meshql-graphql --bench graphql`

use criterion::{criterion_group, criterion_main, Criterion};
use meshql_core::{DynStore, NewDocument};
use meshql_graphql::{plan, Graphlette, GraphqlRequest, Registry, RequestContext};
use meshql_store_memory::MemoryStore;
use serde_json::{json, Value};
use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const CONFIG: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../examples/egg-economy/meshql-memory.toml"
);

struct Service {
    registry: Registry,
    farm_graph: usize,
    farm_id: String,
}

fn payload(v: Value) -> serde_json::Map<String, Value> {
    v.as_object().expect("an object").clone()
}

/// The egg-economy service on memory stores, seeded with 3 farms × 3 coops × 5 hens.
async fn service() -> Service {
    let config = meshql_config::load(Path::new(CONFIG)).expect("egg-economy config loads");
    let mut stores: Vec<(String, DynStore)> = Vec::new();
    let mut graphlettes = Vec::new();
    for e in &config.entities {
        let store: DynStore = Arc::new(MemoryStore::new());
        if let Some(g) = &e.graph {
            let templates: Vec<_> = g.queries.iter().map(|q| q.template.clone()).collect();
            store.prepare(&templates).await.expect("prepare");
            let service = meshql_engine::EntityService::new(
                &e.name,
                store.clone(),
                None,
                vec![],
                Arc::new(meshql_core::NoAuth),
            );
            let spec = meshql_graphql::GraphletteSpec {
                path: g.path.clone(),
                schema: g.schema.clone(),
                entity_type: g.entity_type.clone(),
                queries: g.queries.clone(),
                resolvers: g.resolvers.clone(),
            };
            graphlettes.push(Graphlette::new(&e.name, spec, Arc::new(service)));
        }
        stores.push((e.name.clone(), store));
    }
    let store = |name: &str| {
        stores
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| s.clone())
            .expect("entity exists")
    };
    let (farms, coops, hens) = (store("farm"), store("coop"), store("hen"));
    let mut first_farm = None;
    for (f, zone) in ["north", "south", "east"].into_iter().enumerate() {
        let farm = farms
            .create(
                NewDocument::new(payload(json!({
                    "name": format!("farm-{f}"), "farm_type": "local_farm",
                    "zone": zone, "owner": "bench"
                }))),
                &meshql_core::WriteContext::SYSTEM,
            )
            .await
            .expect("create farm");
        for c in 0..3 {
            let coop = coops
                .create(
                    NewDocument::new(payload(json!({
                        "name": format!("coop-{f}-{c}"), "farm_id": farm.id,
                        "capacity": 50, "coop_type": "barn"
                    }))),
                    &meshql_core::WriteContext::SYSTEM,
                )
                .await
                .expect("create coop");
            let docs = (0..5)
                .map(|h| {
                    NewDocument::new(payload(json!({
                        "name": format!("hen-{f}-{c}-{h}"), "coop_id": coop.id,
                        "breed": "leghorn", "status": "active"
                    })))
                })
                .collect();
            hens.create_many(docs, &meshql_core::WriteContext::SYSTEM)
                .await
                .expect("create hens");
        }
        first_farm.get_or_insert(farm.id);
    }
    let registry = Registry::new(graphlettes, Duration::from_secs(1), Duration::from_secs(5))
        .expect("registry");
    let (farm_graph, _) = registry.by_path("/farm/graph").expect("farm graphlette");
    Service {
        registry,
        farm_graph,
        farm_id: first_farm.expect("a farm"),
    }
}

fn get_by_id(farm: &str) -> String {
    format!("{{ getById(id: \"{farm}\") {{ id name farm_type zone }} }}")
}

fn depth3(farm: &str) -> String {
    format!("{{ getById(id: \"{farm}\") {{ name coops {{ name hens {{ name breed }} }} }} }}")
}

fn request(query: &str) -> GraphqlRequest {
    GraphqlRequest {
        query: Some(query.to_owned()),
        operation_name: None,
        variables: None,
    }
}

fn graphql(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let s = rt.block_on(service());
    let ctx = RequestContext::default();
    let by_id = get_by_id(&s.farm_id);
    let deep = depth3(&s.farm_id);

    // sanity: the requests answer what they should
    let body = rt.block_on(s.registry.execute(s.farm_graph, &request(&deep), &ctx));
    let v: Value = serde_json::from_slice(&body).expect("JSON response");
    let coops = v["data"]["getById"]["coops"].as_array().expect("coops");
    assert_eq!(coops.len(), 3, "{v}");
    assert!(
        coops
            .iter()
            .all(|c| c["hens"].as_array().map(Vec::len) == Some(5)),
        "{v}"
    );

    let mut g = c.benchmark_group("plan/cold");
    for (name, query) in [("get_by_id", &by_id), ("depth3", &deep)] {
        g.bench_function(name, |b| {
            b.iter(|| {
                plan::plan(
                    &s.registry,
                    s.farm_graph,
                    black_box(query),
                    None,
                    s.registry.limits(),
                )
                .expect("plans")
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("execute");
    for (name, query) in [
        ("typename", "{ __typename }"),
        ("get_by_id", by_id.as_str()),
        ("depth3", deep.as_str()),
    ] {
        let req = request(query);
        let warm = rt.block_on(s.registry.execute(s.farm_graph, &req, &ctx));
        assert!(
            !String::from_utf8_lossy(&warm).contains("\"errors\""),
            "{}",
            String::from_utf8_lossy(&warm)
        );
        g.bench_function(name, |b| {
            b.iter(|| rt.block_on(s.registry.execute(s.farm_graph, black_box(&req), &ctx)))
        });
    }
    g.finish();
}

criterion_group!(benches, graphql);
criterion_main!(benches);
