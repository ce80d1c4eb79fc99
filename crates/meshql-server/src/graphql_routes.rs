//! GraphQL over HTTP: POST `{query, variables, operationName}`, GET with the same as query
//! parameters, and GraphiQL for browsers. Every well-formed request answers 200, except one
//! whose credentials the authorizer refuses: that is the transport failing authentication, so
//! it is a 401 with `WWW-Authenticate` (as on REST) and a GraphQL error body whose
//! `extensions.code` is `UNAUTHENTICATED`, before anything is parsed or executed.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::ws::{rejection::WebSocketUpgradeRejection, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use meshql_graphql::{GraphqlRequest, RequestContext};
use std::collections::HashMap;
use std::sync::Arc;

use crate::graph_endpoint::request_error;
pub use crate::graph_endpoint::GraphEndpoint;

/// Whether the client asks for an event stream (graphql-sse).
fn wants_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/event-stream"))
}

impl GraphEndpoint {
    /// A request over graphql-sse: a subscription's events, or a query's answer, as an event
    /// stream.
    async fn stream(
        self: Arc<Self>,
        request: GraphqlRequest,
        context: RequestContext,
        headers: &HeaderMap,
        extensions: Option<serde_json::Value>,
    ) -> Response {
        let Some(hub) = self.subscriptions.get().cloned() else {
            return request_error(
                StatusCode::BAD_REQUEST,
                "subscriptions need the change feed, which this service disables ([changes] enabled = false)".to_owned(),
            );
        };
        let last_event_id = headers.get("last-event-id").and_then(|v| v.to_str().ok());
        let since = match crate::subscription_routes::since(last_event_id, extensions.as_ref()) {
            Ok(s) => s,
            Err(m) => return request_error(StatusCode::BAD_REQUEST, m),
        };
        crate::subscription_routes::sse(self, hub, request, context, since).await
    }
}

/// Why a request's body could not be read.
pub(crate) enum BodyError {
    /// Longer than the body limit.
    TooLarge,
    /// The connection failed (or the body timed out: the answer becomes a 408).
    Unreadable(String),
}

impl GraphEndpoint {
    /// `POST` of a GraphQL request (`body` as read within the body limit). The server also
    /// calls it without going through the router (its direct path).
    pub(crate) async fn answer_post(
        self: Arc<Self>,
        headers: &HeaderMap,
        body: Result<Bytes, BodyError>,
    ) -> Response {
        let context = match self.context_within(headers).await {
            Ok(c) => c,
            Err(response) => return *response,
        };
        let bytes = match body {
            Ok(b) => b,
            Err(BodyError::TooLarge) => {
                return request_error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("request body is larger than {} bytes", self.body_limit),
                )
            }
            Err(BodyError::Unreadable(text)) => {
                return request_error(StatusCode::BAD_REQUEST, text)
            }
        };
        let request: GraphqlRequest = match serde_json::from_slice(&bytes) {
            Ok(r) => r,
            Err(err) => {
                return request_error(
                    StatusCode::BAD_REQUEST,
                    format!("Malformed GraphQL request: {err}"),
                )
            }
        };
        if wants_event_stream(headers) {
            let extensions = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|mut v| v.get_mut("extensions").map(serde_json::Value::take));
            return self.stream(request, context, headers, extensions).await;
        }
        self.run(request, &context).await
    }
}

async fn post(
    State(e): State<Arc<GraphEndpoint>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = body.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            BodyError::TooLarge
        } else {
            BodyError::Unreadable(r.body_text())
        }
    });
    e.answer_post(&headers, body).await
}

async fn get_query(
    State(e): State<Arc<GraphEndpoint>>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    if let Ok(upgrade) = upgrade {
        let authorization = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let hub = e.subscriptions.get().cloned();
        return upgrade
            .protocols(["graphql-transport-ws"])
            .max_message_size(e.body_limit)
            .on_upgrade(move |socket| {
                crate::subscription_routes::websocket(socket, e, hub, authorization)
            });
    }
    let wants_html = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/html"));
    let Some(query) = params.get("query").cloned() else {
        if wants_html {
            let mut r = Response::new(axum::body::Body::from(e.page.clone()));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            );
            return r;
        }
        return request_error(
            StatusCode::BAD_REQUEST,
            "Must provide query string.".to_owned(),
        );
    };
    let context = match e.context_within(&headers).await {
        Ok(c) => c,
        Err(response) => return *response,
    };
    let variables = match params.get("variables").filter(|v| !v.is_empty()) {
        None => None,
        Some(text) => match serde_json::from_str(text) {
            Ok(v) => Some(v),
            Err(err) => {
                return request_error(
                    StatusCode::BAD_REQUEST,
                    format!("`variables` is not valid JSON: {err}"),
                )
            }
        },
    };
    let request = GraphqlRequest {
        query: Some(query),
        operation_name: params.get("operationName").cloned(),
        variables,
    };
    if wants_event_stream(&headers) {
        let extensions = params
            .get("extensions")
            .and_then(|t| serde_json::from_str(t).ok());
        return e.stream(request, context, &headers, extensions).await;
    }
    e.run(request, &context).await
}

async fn not_allowed() -> Response {
    let mut r = request_error(
        StatusCode::METHOD_NOT_ALLOWED,
        "GraphQL endpoints accept GET and POST".to_owned(),
    );
    r.headers_mut().insert(
        header::ALLOW,
        HeaderValue::from_static("GET, POST, OPTIONS"),
    );
    r
}

pub fn router(path: &str, endpoint: Arc<GraphEndpoint>) -> Router {
    let limit = endpoint.body_limit;
    Router::new()
        .route(path, get(get_query).post(post).fallback(not_allowed))
        .layer(axum::extract::DefaultBodyLimit::max(limit))
        .with_state(endpoint)
}
