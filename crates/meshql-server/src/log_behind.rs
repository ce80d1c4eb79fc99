//! The `x-meshql-log-behind-ms` response header of a service with stores materialised from a
//! log (the Kafka backend): how old its answers may be, the largest of its stores' (see
//! `meshql_core::LogLag::behind_ms`). 0 while every log is reachable and applied up to the end
//! it last reported; with a broker down, reads go on from the local state and this says for
//! how long it has not been able to tell. Installed only when such a store is served.

use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use meshql_core::DynStore;
use std::sync::Arc;

/// The header's name.
pub const HEADER: &str = "x-meshql-log-behind-ms";

pub async fn header(
    State(stores): State<Arc<Vec<DynStore>>>,
    request: Request,
    next: Next,
) -> Response {
    let mut response = next.run(request).await;
    let behind = stores
        .iter()
        .filter_map(|s| s.stats().log.map(|l| l.behind_ms))
        .max()
        .unwrap_or(0);
    response
        .headers_mut()
        .insert(HEADER, HeaderValue::from(behind));
    response
}
