//! The restlette's routes and handlers: HTTP in, [`EntityService`] calls, HTTP out.

use crate::error::RestError;
use crate::response::{array_of, json_response};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, MethodRouter};
use axum::Router;
use meshql_core::{Action, Envelope, RemoveOutcome};
use meshql_engine::consistency::{self, ReadAfter, Token};
use meshql_engine::{EntityService, Session};
use serde_json::Value;
use std::sync::Arc;

/// One entity's REST API.
pub struct Restlette {
    pub path: String,
    pub service: Arc<EntityService>,
    /// The OpenAPI document, serialised once.
    pub openapi: Bytes,
    /// The Swagger UI page, when the server serves one.
    pub docs_page: Option<Bytes>,
    pub body_limit: usize,
    /// Creates and updates answer 303 See Other + `Location`, no body (MeshQL's TypeScript
    /// services), instead of 201/200 with the document.
    pub see_other: bool,
    /// Serve reads only (`meshql serve --role read`): POST, PUT and DELETE answer 405 with a
    /// JSON error that sends the client to the write role.
    pub read_only: bool,
    /// Read-your-writes: a read carrying a consistency token reads the primary until the
    /// replica has the token's version (`None`: tokens are not checked).
    pub read_after: Option<Arc<ReadAfter>>,
}

type Shared = State<Arc<Restlette>>;

fn header_text<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

impl Restlette {
    /// The caller: its `Authorization`, and the correlation id its writes carry into the
    /// change feed (`X-Correlation-Id`, else `X-Request-Id`, else a fresh one). Refused
    /// credentials are a 401 before anything is read or written.
    fn session(&self, headers: &HeaderMap) -> Result<Session, RestError> {
        Ok(self.service.session(
            header_text(headers, header::AUTHORIZATION.as_str()),
            header_text(headers, "x-correlation-id").or(header_text(headers, "x-request-id")),
        )?)
    }

    /// The caller of a read: [`Restlette::session`], reading the primary when it sends a
    /// consistency token the replica has not applied yet.
    async fn read_session(&self, headers: &HeaderMap) -> Result<Session, RestError> {
        let mut session = self.session(headers)?;
        if let (Some(read_after), Some(token)) =
            (&self.read_after, header_text(headers, consistency::HEADER))
        {
            session.from_primary = read_after.needs_primary(token).await?;
        }
        Ok(session)
    }

    /// `resp` with the consistency token of the version written.
    fn with_token(&self, mut resp: Response, stamp: meshql_core::Millis, id: &str) -> Response {
        if let Ok(v) = HeaderValue::from_str(&Token::format(stamp, self.service.name(), id)) {
            let headers = resp.headers_mut();
            headers.insert(consistency::HEADER, v);
            // readable by a page of another origin
            headers.insert(
                header::ACCESS_CONTROL_EXPOSE_HEADERS,
                HeaderValue::from_static(consistency::HEADER),
            );
        }
        resp
    }

    /// `GET P/{id}` (`id` already percent-decoded; `query` the raw query string, whose only
    /// parameter is `at`): 200 with the payload and `X-Canonical-Id`, or the error. The
    /// server also calls it without going through the router (its direct path for reads by
    /// id).
    pub async fn read_one(&self, id: &str, query: Option<&str>, headers: &HeaderMap) -> Response {
        let at = match crate::params::read_one(query) {
            Ok(at) => at,
            Err(e) => return e.into_response(),
        };
        let found = match self.read_session(headers).await {
            Ok(session) => self.service.read(&session, id, at).await,
            Err(e) => return e.into_response(),
        };
        let env = match found {
            Ok(Some(env)) => env,
            Ok(None) => {
                return match at {
                    Some(t) if meshql_core::time::looks_like_seconds(t) => {
                        RestError::NotFoundAt(t).into_response()
                    }
                    _ => RestError::NOT_FOUND.into_response(),
                }
            }
            Err(e) => return RestError::from(e).into_response(),
        };
        let mut resp = json_response(StatusCode::OK, env.payload);
        if let Ok(v) = HeaderValue::from_str(&env.id) {
            resp.headers_mut().insert("x-canonical-id", v);
        }
        resp
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

    fn location(&self, id: &str) -> HeaderValue {
        HeaderValue::from_str(&format!("{}/{}", self.path, id))
            .unwrap_or_else(|_| HeaderValue::from_static("/"))
    }

    /// The answer to a create (`status` 201, with `Location`) or an update (200) of `env`;
    /// 303 with `Location` and no body in see-other mode.
    fn written(&self, status: StatusCode, env: Envelope) -> Response {
        let mut resp = if self.see_other {
            let mut r = Response::new(axum::body::Body::empty());
            *r.status_mut() = StatusCode::SEE_OTHER;
            r
        } else {
            json_response(status, env.payload)
        };
        if self.see_other || status == StatusCode::CREATED {
            resp.headers_mut()
                .insert(header::LOCATION, self.location(&env.id));
        }
        self.with_token(resp, env.created_at, &env.id)
    }
}

async fn create(
    State(r): Shared,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, RestError> {
    crate::params::none(query.as_deref())?;
    let session = r.session(&headers)?;
    // early: a 403 before the body's errors (400, 413); the engine checks again
    r.service.check(&session, Action::Create)?;
    let value = r.body(body)?;
    let env = r.service.create(&session, value).await?;
    Ok(r.written(StatusCode::CREATED, env))
}

/// `GET P`: every current document, streamed, or one page of them (see [`crate::list`]).
async fn list(
    State(r): Shared,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response, RestError> {
    let query = crate::list::ListQuery::parse(&crate::params::pairs(query.as_deref()))?;
    let session = r.read_session(&headers).await?;
    crate::list::respond(&r.service, &r.path, session, query).await
}

async fn read(
    State(r): Shared,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    r.read_one(&id, query.as_deref(), &headers).await
}

async fn update(
    State(r): Shared,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, RestError> {
    crate::params::none(query.as_deref())?;
    let session = r.session(&headers)?;
    // early: a 403 before the body's errors (400, 413); the engine checks again
    r.service.check(&session, Action::Update)?;
    let value = r.body(body)?;
    let env = r.service.update(&session, &id, value).await?;
    Ok(r.written(StatusCode::OK, env))
}

async fn delete(
    State(r): Shared,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response, RestError> {
    crate::params::none(query.as_deref())?;
    // the tombstone is stamped at or after this moment: its token
    let before = meshql_core::now_millis();
    let deleted = || {
        json_response(
            StatusCode::OK,
            serde_json::json!({"id": id, "status": "deleted"}).to_string(),
        )
    };
    match r.service.remove(&r.session(&headers)?, &id).await? {
        RemoveOutcome::Removed => Ok(r.with_token(deleted(), before, &id)),
        RemoveOutcome::AlreadyDeleted => Ok(deleted()),
        RemoveOutcome::NotFound => Err(RestError::NotDeleted),
    }
}

async fn bulk_create(
    State(r): Shared,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, RestError> {
    crate::params::none(query.as_deref())?;
    let session = r.session(&headers)?;
    // early: a 403 before the body's errors (400, 413); the engine checks again
    r.service.check(&session, Action::Create)?;
    let Value::Array(items) = r.body(body)? else {
        return Err(meshql_engine::EngineError::WrongShape("array").into());
    };
    let envs = r.service.create_many(&session, items).await?;
    let resp = json_response(StatusCode::CREATED, array_of(&envs));
    // one transaction: its last version stands for all of them
    Ok(match envs.last() {
        Some(last) => r.with_token(resp, last.created_at, &last.id),
        None => resp,
    })
}

/// `GET P/bulk?ids=a,b[&at=T]`: the visible ones of those documents, as of `T` (default now).
async fn bulk_read(
    State(r): Shared,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response, RestError> {
    let pairs = crate::params::checked(query.as_deref(), crate::params::BULK_READ)?;
    let at = crate::params::at(&pairs)?;
    let ids: Vec<String> = crate::params::single(&pairs, "ids")?
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
        .service
        .read_many(&r.read_session(&headers).await?, &ids, at)
        .await?;
    Ok(json_response(StatusCode::OK, array_of(&envs)))
}

async fn openapi(State(r): Shared, RawQuery(query): RawQuery, headers: HeaderMap) -> Response {
    if let Err(e) = crate::params::none(query.as_deref()) {
        return e.into_response();
    }
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

async fn docs(State(r): Shared, RawQuery(query): RawQuery) -> Response {
    if let Err(e) = crate::params::none(query.as_deref()) {
        return e.into_response();
    }
    match &r.docs_page {
        Some(page) => {
            let mut resp = Response::new(axum::body::Body::from(page.clone()));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            );
            resp
        }
        None => RestError::NOT_FOUND.into_response(),
    }
}

async fn health(RawQuery(query): RawQuery) -> Response {
    if let Err(e) = crate::params::none(query.as_deref()) {
        return e.into_response();
    }
    json_response(StatusCode::OK, r#"{"status":"ok"}"#)
}

async fn ready(State(r): Shared, RawQuery(query): RawQuery) -> Response {
    if let Err(e) = crate::params::none(query.as_deref()) {
        return e.into_response();
    }
    match r.service.writer().ready().await {
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

/// The names under `P/` that are routes of their own, not ids: `GET P/{name}` is never a read
/// by id.
pub const NOT_IDS: [&str; 4] = [BULK, API_DOCS, HEALTH, READY];
const BULK: &str = "bulk";
const API_DOCS: &str = "api-docs";
const HEALTH: &str = "health";
const READY: &str = "ready";

/// The routes of a restlette, with its body limit applied.
pub fn router(restlette: Arc<Restlette>) -> Router {
    let p = restlette.path.clone();
    let read_only = restlette.read_only;
    // every route's methods: GET (and the writes unless read-only), the rest answer 405
    let route = |m: MethodRouter<Arc<Restlette>>, allow: &'static str| {
        if read_only {
            m.fallback(|method: Method| {
                std::future::ready(match method {
                    Method::POST | Method::PUT | Method::DELETE | Method::PATCH => {
                        RestError::ReadRole(method.to_string()).into_response()
                    }
                    other => RestError::MethodNotAllowed(
                        other.to_string(),
                        crate::error::READ_ROLE_ALLOW,
                    )
                    .into_response(),
                })
            })
        } else {
            with_fallback(m, allow)
        }
    };
    let (collection, bulk, one) = if read_only {
        (get(list), get(bulk_read), get(read))
    } else {
        (
            get(list).post(create),
            get(bulk_read).post(bulk_create),
            get(read).put(update).delete(delete),
        )
    };
    let collection = route(collection, "GET, POST, OPTIONS");
    Router::new()
        .route(&p, collection.clone())
        .route(&format!("{p}/"), collection)
        .route(&format!("{p}/{BULK}"), route(bulk, "GET, POST, OPTIONS"))
        .route(&format!("{p}/{API_DOCS}"), route(get(docs), "GET, OPTIONS"))
        .route(
            &format!("{p}/{API_DOCS}/swagger.json"),
            route(get(openapi), "GET, OPTIONS"),
        )
        .route(&format!("{p}/{HEALTH}"), route(get(health), "GET, OPTIONS"))
        .route(&format!("{p}/{READY}"), route(get(ready), "GET, OPTIONS"))
        .route(
            &format!("{p}/{{id}}"),
            route(one, "GET, PUT, DELETE, OPTIONS"),
        )
        .layer(axum::extract::DefaultBodyLimit::max(restlette.body_limit))
        .with_state(restlette)
}
