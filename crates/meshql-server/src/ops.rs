//! Operational endpoints: `/health` (the process answers), `/ready` (every store answers),
//! `/metrics` (Prometheus text: every part of the service writes its own series — storage
//! counters per entity, replicas, the change feed, relays, processors, subscriptions, the
//! cache, connections, and request latency per route — see [`meshql_core::metrics`]).

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use meshql_core::DynStore;
use std::sync::Arc;

pub struct Ops {
    /// (entity, store): `/ready` asks each.
    pub stores: Vec<(String, DynStore)>,
    /// Every part's series, the runtime's then the server's.
    pub metrics: Arc<meshql_core::metrics::Metrics>,
}

fn respond(status: StatusCode, content_type: &'static str, body: String) -> Response {
    let mut r = Response::new(axum::body::Body::from(body));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

pub async fn health() -> Response {
    respond(
        StatusCode::OK,
        "application/json",
        r#"{"status":"ok"}"#.to_owned(),
    )
}

pub async fn ready(State(ops): State<Arc<Ops>>) -> Response {
    let mut failures = serde_json::Map::new();
    for (entity, store) in &ops.stores {
        if let Err(e) = store.ready().await {
            failures.insert(entity.clone(), serde_json::Value::String(e.to_string()));
        }
    }
    if failures.is_empty() {
        respond(
            StatusCode::OK,
            "application/json",
            r#"{"status":"ok"}"#.to_owned(),
        )
    } else {
        respond(
            StatusCode::SERVICE_UNAVAILABLE,
            "application/json",
            serde_json::json!({"status": "unavailable", "failures": failures}).to_string(),
        )
    }
}

pub async fn metrics(State(ops): State<Arc<Ops>>) -> Response {
    respond(
        StatusCode::OK,
        "text/plain; version=0.0.4",
        ops.metrics.render(),
    )
}
