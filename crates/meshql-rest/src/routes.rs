//! The restlette's routes and handlers.

use crate::error::RestError;
use crate::validate::PayloadValidator;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, MethodRouter};
use axum::Router;
use meshql_core::{
    Authorizer, Credentials, DynStore, Envelope, NewDocument, RemoveOutcome, WriteContext,
};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::sync::Arc;

/// One entity's REST API.
pub struct Restlette {
    pub path: String,
    pub entity: String,
    pub store: DynStore,
    pub validator: Option<PayloadValidator>,
    /// Tokens stamped on writes (when empty: the writer's credentials).
    pub tokens: Vec<String>,
    pub authorizer: Arc<dyn Authorizer>,
    /// The OpenAPI document, serialised once.
    pub openapi: Bytes,
    /// The Swagger UI page, when the server serves one.
    pub docs_page: Option<Bytes>,
    pub body_limit: usize,
}

type Shared = State<Arc<Restlette>>;

fn json_response(status: StatusCode, body: impl Into<axum::body::Body>) -> Response {
    let mut r = Response::new(body.into());
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// `[p1,p2,...]` from stored payload texts, without re-serialising them.
fn array_of(envelopes: &[Envelope]) -> Vec<u8> {
    let len = envelopes.iter().map(|e| e.payload.len() + 1).sum::<usize>() + 2;
    let mut out = Vec::with_capacity(len);
    out.push(b'[');
    for (i, e) in envelopes.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(e.payload.as_bytes());
    }
    out.push(b']');
    out
}

impl Restlette {
    fn credentials(&self, headers: &HeaderMap) -> Credentials {
        let auth = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        self.authorizer.credentials(auth)
    }

    fn write_tokens(&self, creds: &Credentials) -> Vec<String> {
        if self.tokens.is_empty() {
            creds.write_tokens()
        } else {
            self.tokens.clone()
        }
    }

    /// What a write by this request carries: who may change what, the tokens stamped on new
    /// documents, and the correlation id its changes are tagged with in the feed (the
    /// caller's `X-Correlation-Id` or `X-Request-Id`, else a fresh one).
    fn write_context(&self, headers: &HeaderMap, creating: bool) -> WriteContext {
        let creds = self.credentials(headers);
        let tokens = if creating {
            Some(self.write_tokens(&creds))
        } else {
            // configured tokens are stamped on every write; otherwise the owner stays
            (!self.tokens.is_empty()).then(|| self.tokens.clone())
        };
        WriteContext {
            tokens,
            filter: creds.filter(),
            correlation_id: Some(correlation_id(headers)),
        }
    }

    fn body(&self, body: Result<Bytes, BytesRejection>) -> Result<Value, RestError> {
        let bytes = body.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                RestError::TooLarge(self.body_limit)
            } else {
                RestError::Body(e.body_text())
            }
        })?;
        serde_json::from_slice(&bytes).map_err(|e| RestError::MalformedJson(e.to_string()))
    }

    fn document(&self, value: Value) -> Result<Map<String, Value>, RestError> {
        if !value.is_object() {
            return Err(RestError::WrongShape("object"));
        }
        if let Some(v) = &self.validator {
            let violations = v.violations(&value);
            if !violations.is_empty() {
                return Err(RestError::Invalid(violations));
            }
        }
        let Value::Object(map) = value else {
            unreachable!("checked to be an object above")
        };
        Ok(map)
    }

    fn location(&self, id: &str) -> HeaderValue {
        HeaderValue::from_str(&format!("{}/{}", self.path, id))
            .unwrap_or_else(|_| HeaderValue::from_static("/"))
    }
}

/// The correlation id of a request: the caller's, when it sent a usable one.
fn correlation_id(headers: &HeaderMap) -> String {
    ["x-correlation-id", "x-request-id"]
        .iter()
        .filter_map(|name| headers.get(*name)?.to_str().ok())
        .map(str::trim)
        .find(|v| !v.is_empty() && v.len() <= 200)
        .map(str::to_owned)
        .unwrap_or_else(|| uuid::Uuid::now_v7().to_string())
}

async fn create(
    State(r): Shared,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, RestError> {
    let doc = r.document(r.body(body)?)?;
    let env = r
        .store
        .create(NewDocument::new(doc), &r.write_context(&headers, true))
        .await?;
    let mut resp = json_response(StatusCode::CREATED, env.payload);
    resp.headers_mut()
        .insert(header::LOCATION, r.location(&env.id));
    Ok(resp)
}

async fn list(State(r): Shared, headers: HeaderMap) -> Result<Response, RestError> {
    let envs = r
        .store
        .list(&r.credentials(&headers).filter(), None)
        .await?;
    Ok(json_response(StatusCode::OK, array_of(&envs)))
}

async fn read(
    State(r): Shared,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, RestError> {
    let env = r
        .store
        .read(&id, &r.credentials(&headers).filter(), None)
        .await?
        .ok_or(RestError::NotFound)?;
    let mut resp = json_response(StatusCode::OK, env.payload);
    if let Ok(v) = HeaderValue::from_str(&env.id) {
        resp.headers_mut().insert("x-canonical-id", v);
    }
    Ok(resp)
}

async fn update(
    State(r): Shared,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, RestError> {
    let doc = r.document(r.body(body)?)?;
    let env = r
        .store
        .update(
            &id,
            NewDocument::new(doc),
            &r.write_context(&headers, false),
        )
        .await?
        .ok_or(RestError::NotFound)?;
    Ok(json_response(StatusCode::OK, env.payload))
}

async fn delete(
    State(r): Shared,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, RestError> {
    match r
        .store
        .remove(&id, &r.write_context(&headers, false))
        .await?
    {
        RemoveOutcome::Removed | RemoveOutcome::AlreadyDeleted => Ok(json_response(
            StatusCode::OK,
            serde_json::json!({"id": id, "status": "deleted"}).to_string(),
        )),
        RemoveOutcome::NotFound => Err(RestError::NotDeleted),
    }
}

async fn bulk_create(
    State(r): Shared,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, RestError> {
    let Value::Array(items) = r.body(body)? else {
        return Err(RestError::WrongShape("array"));
    };
    let mut docs = Vec::with_capacity(items.len());
    let mut problems = Vec::new();
    for (index, item) in items.into_iter().enumerate() {
        match r.document(item) {
            Ok(d) => docs.push(NewDocument::new(d)),
            Err(RestError::Invalid(v)) => {
                problems.push(serde_json::json!({"index": index, "errors": v}))
            }
            Err(RestError::WrongShape(_)) => problems.push(
                serde_json::json!({"index": index, "errors": [{"path": "/", "message": "not a JSON object"}]}),
            ),
            Err(e) => return Err(e),
        }
    }
    if !problems.is_empty() {
        return Err(RestError::InvalidBatch(problems));
    }
    let envs = r
        .store
        .create_many(docs, &r.write_context(&headers, true))
        .await?;
    Ok(json_response(StatusCode::CREATED, array_of(&envs)))
}

#[derive(Deserialize)]
struct BulkQuery {
    ids: Option<String>,
}

async fn bulk_read(
    State(r): Shared,
    Query(q): Query<BulkQuery>,
    headers: HeaderMap,
) -> Result<Response, RestError> {
    let ids: Vec<String> = q
        .ids
        .as_deref()
        .map(|s| {
            s.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    if ids.is_empty() {
        return Err(RestError::MissingIds);
    }
    let envs = r
        .store
        .read_many(&ids, &r.credentials(&headers).filter(), None)
        .await?;
    Ok(json_response(StatusCode::OK, array_of(&envs)))
}

async fn openapi(State(r): Shared, headers: HeaderMap) -> Response {
    let text = |name| {
        headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    let https = text("x-forwarded-proto").is_some_and(|p| p.eq_ignore_ascii_case("https"));
    let host = text("x-forwarded-host").or(text(header::HOST.as_str()));
    match host.and_then(|h| crate::openapi::for_host(&r.openapi, h, https)) {
        Some(doc) => json_response(StatusCode::OK, Bytes::from(doc)),
        None => json_response(StatusCode::OK, r.openapi.clone()),
    }
}

async fn docs(State(r): Shared) -> Response {
    match &r.docs_page {
        Some(page) => {
            let mut resp = Response::new(axum::body::Body::from(page.clone()));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            );
            resp
        }
        None => RestError::NotFound.into_response(),
    }
}

async fn health() -> Response {
    json_response(StatusCode::OK, r#"{"status":"ok"}"#)
}

async fn ready(State(r): Shared) -> Response {
    match r.store.ready().await {
        Ok(()) => json_response(StatusCode::OK, r#"{"status":"ok"}"#),
        Err(e) => json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            serde_json::json!({"status": "error", "message": e.to_string()}).to_string(),
        ),
    }
}

fn not_allowed(allow: &'static str) -> impl Fn(Method) -> std::future::Ready<Response> + Clone {
    move |method: Method| {
        std::future::ready(RestError::MethodNotAllowed(method.to_string(), allow).into_response())
    }
}

fn with_fallback(
    m: MethodRouter<Arc<Restlette>>,
    allow: &'static str,
) -> MethodRouter<Arc<Restlette>> {
    m.fallback(not_allowed(allow))
}

/// The routes of a restlette, with its body limit applied.
pub fn router(restlette: Arc<Restlette>) -> Router {
    let p = restlette.path.clone();
    let collection = with_fallback(get(list).post(create), "GET, POST, OPTIONS");
    Router::new()
        .route(&p, collection.clone())
        .route(&format!("{p}/"), collection)
        .route(
            &format!("{p}/bulk"),
            with_fallback(get(bulk_read).post(bulk_create), "GET, POST, OPTIONS"),
        )
        .route(
            &format!("{p}/api-docs"),
            with_fallback(get(docs), "GET, OPTIONS"),
        )
        .route(
            &format!("{p}/api-docs/swagger.json"),
            with_fallback(get(openapi), "GET, OPTIONS"),
        )
        .route(
            &format!("{p}/health"),
            with_fallback(get(health), "GET, OPTIONS"),
        )
        .route(
            &format!("{p}/ready"),
            with_fallback(get(ready), "GET, OPTIONS"),
        )
        .route(
            &format!("{p}/{{id}}"),
            with_fallback(
                get(read).put(update).delete(delete),
                "GET, PUT, DELETE, OPTIONS",
            ),
        )
        .layer(axum::extract::DefaultBodyLimit::max(restlette.body_limit))
        .with_state(restlette)
}
