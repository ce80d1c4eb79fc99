//! GraphQL over HTTP: POST `{query, variables, operationName}`, GET with the same as query
//! parameters, and GraphiQL for browsers. Every well-formed request answers 200, except one
//! whose credentials the authorizer refuses: that is the transport failing authentication, so
//! it is a 401 with `WWW-Authenticate` (as on REST) and a GraphQL error body whose
//! `extensions.code` is `UNAUTHENTICATED`, before anything is parsed or executed; one over
//! its caller's rate limit (429 with `Retry-After`, code `RATE_LIMITED`,
//! [`crate::rate_limit`]); and a persisted query that cannot run (400, or 200 for the two
//! errors Apollo clients recover from: [`crate::persisted_queries`]).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::ws::{rejection::WebSocketUpgradeRejection, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use axum::routing::get;
use axum::{Extension, Router};
use meshql_graphql::{GraphqlRequest, RequestContext};
use serde::Deserialize;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

pub use crate::graph_endpoint::GraphEndpoint;
use crate::graph_endpoint::{persisted_query_error, request_error};
use crate::persisted_queries::PersistedQueryError;
use crate::rate_limit::{graphql_refusal, ClientAddr};

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

/// A GraphQL request as sent over HTTP: the GraphQL layer's fields, and `extensions`
/// (persisted queries, where a subscription resumes).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HttpRequest {
    #[serde(default)]
    query: Option<String>,
    #[serde(default)]
    operation_name: Option<String>,
    #[serde(default)]
    variables: Option<serde_json::Value>,
    #[serde(default)]
    extensions: Option<serde_json::Value>,
}

impl GraphEndpoint {
    /// The request to run: its query given, or found from `extensions.persistedQuery`
    /// ([`crate::persisted_queries`]).
    fn persisted(
        &self,
        query: Option<String>,
        operation_name: Option<String>,
        variables: Option<serde_json::Value>,
        extensions: Option<&serde_json::Value>,
    ) -> Result<GraphqlRequest, PersistedQueryError> {
        let query = self.persisted.resolve(query, extensions)?;
        Ok(GraphqlRequest {
            query,
            operation_name,
            variables,
        })
    }

    /// `POST` of a GraphQL request (`body` as read within the body limit) from `client`. The
    /// server also calls it without going through the router (its direct path).
    pub(crate) async fn answer_post(
        self: Arc<Self>,
        headers: &HeaderMap,
        client: Option<IpAddr>,
        body: Result<Bytes, BodyError>,
    ) -> Response {
        let gate = match self.gate(headers, client).await {
            Ok(g) => g,
            Err(refusal) => return graphql_refusal(&refusal),
        };
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
        let sent: HttpRequest = match serde_json::from_slice(&bytes) {
            Ok(r) => r,
            Err(err) => {
                return request_error(
                    StatusCode::BAD_REQUEST,
                    format!("Malformed GraphQL request: {err}"),
                )
            }
        };
        let request = match self.persisted(
            sent.query,
            sent.operation_name,
            sent.variables,
            sent.extensions.as_ref(),
        ) {
            Ok(r) => r,
            Err(e) => return persisted_query_error(&e),
        };
        if wants_event_stream(headers) {
            drop(gate);
            return self
                .stream(request, context, headers, sent.extensions)
                .await;
        }
        self.run(request, &context, gate).await
    }
}

async fn post(
    State(e): State<Arc<GraphEndpoint>>,
    client: Option<Extension<ClientAddr>>,
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
    e.answer_post(&headers, client.map(|c| c.0 .0), body).await
}

async fn get_query(
    State(e): State<Arc<GraphEndpoint>>,
    Query(params): Query<HashMap<String, String>>,
    client: Option<Extension<ClientAddr>>,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let client = client.map(|c| c.0 .0);
    if let Ok(upgrade) = upgrade {
        // a WebSocket counts as one request when it opens
        if let Err(refusal) = e.gate(&headers, client).await {
            return graphql_refusal(&refusal);
        }
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
    let extensions = match params.get("extensions").filter(|t| !t.is_empty()) {
        None => None,
        Some(text) => match serde_json::from_str::<serde_json::Value>(text) {
            Ok(v) => Some(v),
            Err(err) => {
                return request_error(
                    StatusCode::BAD_REQUEST,
                    format!("`extensions` is not valid JSON: {err}"),
                )
            }
        },
    };
    let query = params.get("query").cloned();
    if query.is_none() && extensions.is_none() {
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
    }
    let gate = match e.gate(&headers, client).await {
        Ok(g) => g,
        Err(refusal) => return graphql_refusal(&refusal),
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
    let request = match e.persisted(
        query,
        params.get("operationName").cloned(),
        variables,
        extensions.as_ref(),
    ) {
        Ok(r) => r,
        Err(e) => return persisted_query_error(&e),
    };
    if wants_event_stream(&headers) {
        drop(gate);
        return e.stream(request, context, &headers, extensions).await;
    }
    e.run(request, &context, gate).await
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
