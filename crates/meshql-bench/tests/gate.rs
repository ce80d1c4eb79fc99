//! The validation gate rejects servers that answer without real data, and nothing is
//! measured for them (seed 000 once measured "404 performance"; never again).

use axum::extract::Path;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use meshql_bench::report::Status;
use meshql_bench::Options;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

fn options(url: String, scenarios: &[&str]) -> Options {
    let mut o = Options::new(
        PathBuf::from("/nonexistent/meshql"),
        PathBuf::from("/nonexistent"),
    );
    o.url = Some(url);
    o.scenarios = scenarios.iter().map(|s| s.to_string()).collect();
    o.products = 20;
    o.duration = Some(std::time::Duration::from_millis(300));
    o.quiet = true;
    o
}

fn empty_data() -> Value {
    json!({"data": {"getById": null, "getAll": [], "getByZone": []}})
}

/// Accepts every write and hands out ids, but stores nothing: reads are empty and GraphQL
/// answers `graph`.
fn forgetful(graph: Value) -> Router {
    let created = || async {
        (
            StatusCode::CREATED,
            Json(json!({"id": uuid::Uuid::new_v4().to_string()})),
        )
    };
    let bulk = |Json(items): Json<Vec<Value>>| async move {
        let out: Vec<Value> = items
            .iter()
            .map(|_| json!({"id": uuid::Uuid::new_v4().to_string()}))
            .collect();
        (StatusCode::CREATED, Json(out))
    };
    let mut app = Router::new();
    for e in [
        "farm",
        "coop",
        "hen",
        "farm_output",
        "hen_productivity",
        "lay_report",
        "products",
    ] {
        app = app
            .route(&format!("/{e}/api"), post(created))
            .route(&format!("/{e}/api/bulk"), post(bulk))
            .route(
                &format!("/{e}/api/{{id}}"),
                get(|Path(_id): Path<String>| async { Json(json!({})) }),
            )
            .route(
                &format!("/{e}/graph"),
                post({
                    let graph = graph.clone();
                    || async move { Json(graph) }
                }),
            );
    }
    app
}

fn status_of(report: &meshql_bench::report::Report, name: &str) -> Status {
    report
        .scenarios
        .iter()
        .find(|s| s.name == name)
        .unwrap()
        .status
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_forgets_what_it_was_given_fails_every_gate() {
    let url = serve(forgetful(empty_data())).await;
    let names = [
        "throughput",
        "rest-crud",
        "graphql-queries",
        "federation-depth",
        "mixed-workload",
        "farm-graph",
        "products",
        "fan-out",
    ];
    let report = meshql_bench::run(options(url, &names)).await.unwrap();
    assert_eq!(report.scenarios.len(), names.len());
    for s in &report.scenarios {
        assert!(
            matches!(s.status, Status::GateFailed { .. }),
            "{}: {:?}",
            s.name,
            s.status
        );
        assert!(
            s.runs.is_empty(),
            "{} measured despite a failed gate",
            s.name
        );
        assert!(s.status.is_failure());
    }
    let Status::GateFailed { reason } = status_of(&report, "throughput") else {
        unreachable!()
    };
    assert!(reason.contains("expected name"), "{reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_honest_rest_but_empty_graphql_fails_the_graphql_gates() {
    let url = serve(honest_rest(empty_data())).await;
    let report = meshql_bench::run(options(url, &["graphql-queries", "farm-graph"]))
        .await
        .unwrap();
    for s in &report.scenarios {
        let Status::GateFailed { reason } = &s.status else {
            panic!("{}: {:?}", s.name, s.status)
        };
        assert!(
            reason.contains("no data") || reason.contains("expected"),
            "{reason}"
        );
        assert!(s.runs.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_answers_404_measures_nothing() {
    let url = serve(Router::new()).await;
    let report = meshql_bench::run(options(url, &["throughput", "products", "farm-graph"]))
        .await
        .unwrap();
    for s in &report.scenarios {
        let Status::GateFailed { reason } = &s.status else {
            panic!("{}: {:?}", s.name, s.status)
        };
        assert!(reason.contains("404"), "{reason}");
        assert!(s.runs.is_empty());
    }
}

/// REST that keeps what it is given (one flat map for every entity); GraphQL answers `graph`.
fn honest_rest(graph: Value) -> Router {
    type Docs = Arc<Mutex<HashMap<String, Value>>>;
    let docs: Docs = Arc::default();
    let store = |docs: &Docs, mut doc: Value| {
        let id = uuid::Uuid::new_v4().to_string();
        doc["id"] = json!(id);
        docs.lock().unwrap().insert(id, doc.clone());
        doc
    };
    let mut app = Router::new();
    for e in ["farm", "coop", "hen"] {
        let (d1, d2, d3) = (docs.clone(), docs.clone(), docs.clone());
        app = app
            .route(
                &format!("/{e}/api"),
                post(move |Json(doc): Json<Value>| async move {
                    (StatusCode::CREATED, Json(store(&d1, doc)))
                }),
            )
            .route(
                &format!("/{e}/api/bulk"),
                post(move |Json(items): Json<Vec<Value>>| async move {
                    let out: Vec<Value> = items.into_iter().map(|d| store(&d2, d)).collect();
                    (StatusCode::CREATED, Json(out))
                }),
            )
            .route(
                &format!("/{e}/api/{{id}}"),
                get(move |Path(id): Path<String>| async move {
                    match d3.lock().unwrap().get(&id) {
                        Some(d) => Ok(Json(d.clone())),
                        None => Err(StatusCode::NOT_FOUND),
                    }
                }),
            )
            .route(
                &format!("/{e}/graph"),
                post({
                    let graph = graph.clone();
                    || async move { Json(graph) }
                }),
            );
    }
    app
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graphql_errors_fail_the_gate() {
    let app = honest_rest(json!({"data": null, "errors": [{"message": "boom"}]}));
    let url = serve(app).await;
    let report = meshql_bench::run(options(url, &["graphql-queries", "throughput"]))
        .await
        .unwrap();
    for name in ["graphql-queries", "throughput"] {
        let Status::GateFailed { reason } = status_of(&report, name) else {
            panic!("{name}: {:?}", status_of(&report, name))
        };
        assert!(reason.contains("boom"), "{reason}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_a_setup_failure_and_core_scaling_needs_a_local_server() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let report = meshql_bench::run(options(url, &["throughput", "core-scaling"]))
        .await
        .unwrap();
    assert!(matches!(
        status_of(&report, "throughput"),
        Status::Failed { .. }
    ));
    assert!(matches!(
        status_of(&report, "core-scaling"),
        Status::Skipped { .. }
    ));
}

#[tokio::test]
async fn unknown_scenarios_are_named() {
    let err = meshql_bench::run(options("http://127.0.0.1:1".into(), &["nope"]))
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("nope") && err.to_string().contains("throughput"));
}
