//! The console: the page a browser opens first (`[console] path`, `/` by default), to browse
//! the service's entities, their documents, each document's history through time, and the
//! change feed as it happens.
//!
//! **Front end.** Plain modern JavaScript (ES modules) and CSS, no framework and no build step:
//! three small files (`assets/console/`), embedded here with `include_str!` and served under
//! `/_meshql/console/assets/`. A framework would add a vendored bundle several times larger
//! than the console itself, and a build step would need tools (npm) the project does not use;
//! what the console renders — tables, forms from a JSON Schema, a diff, a time control — is
//! small enough for the DOM API. Nothing is loaded from elsewhere, so it works offline.
//!
//! **What it reads.** Everything a user sees comes through the service's own APIs, sent with
//! the bearer token the user gives (kept in the tab's `sessionStorage`): REST for writes and
//! validation errors, GraphQL (`getById` with `at`) for a document and its relationships as of
//! a moment, `/_changes` (Server-Sent Events read with `fetch`, which can send the
//! `Authorization` header an `EventSource` cannot) for live updates. Three JSON endpoints
//! here fill what those APIs lack, with the same session, permissions, token filter and field
//! mask as REST:
//!
//! * `GET /_meshql/console/api/service`: the entities (name, storage and its backend, REST and
//!   GraphQL paths, JSON Schema, root queries, relationships) and each one's document count
//!   as the caller sees it. Stores have no count operation, so the count walks the list in
//!   pages of ids and stops at [`COUNT_CAP`] (`count_capped: true` then).
//! * `GET /_meshql/console/api/entities/{entity}/documents?at=&limit=&after=`: one page of
//!   the documents visible at `at` (ms since the epoch; now when absent) — REST lists have no
//!   `at` — each with its version's `created_at`.
//! * `GET /_meshql/console/api/entities/{entity}/documents/{id}/versions`: every stored
//!   version of a document, oldest first, tombstones included, those the caller may not see
//!   left out.

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use meshql_config::{ResolvedConfig, ResolvedEntity, ResolverTarget};
use meshql_core::{Envelope, Millis};
use meshql_engine::{EngineError, EntityService, Session};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;

/// Where the console's assets and JSON endpoints live.
pub const PREFIX: &str = "/_meshql/console";
/// Documents counted at most per entity on the landing page.
pub const COUNT_CAP: usize = 10_000;
/// Ids read per step while counting.
const COUNT_PAGE: usize = 1_000;
/// The largest page of documents the console asks for.
const MAX_LIMIT: usize = 1_000;

const INDEX: &str = include_str!("../assets/console/index.html");
/// The page's Content-Security-Policy.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";
const FILES: &[(&str, &str, &str)] = &[
    (
        "console.js",
        "text/javascript; charset=utf-8",
        include_str!("../assets/console/console.js"),
    ),
    (
        "console.css",
        "text/css; charset=utf-8",
        include_str!("../assets/console/console.css"),
    ),
];

/// One entity as the console describes it.
struct Entity {
    name: String,
    /// The static part of its description (everything but the count).
    info: Value,
    service: Arc<EntityService>,
}

/// The console's state: what the server knows about its entities, built once.
pub struct Console {
    path: String,
    changes: bool,
    entities: Vec<Entity>,
    /// The processors of the change feed, with their lag and dead letters on the landing page.
    processors: Arc<meshql_process::Processors>,
}

impl Console {
    /// Describes every entity of `config`; `services` are the engine's, by entity name.
    pub fn new(
        config: &ResolvedConfig,
        services: &HashMap<String, Arc<EntityService>>,
        processors: Arc<meshql_process::Processors>,
    ) -> Self {
        let graph_entity: HashMap<&str, &str> = config
            .entities
            .iter()
            .filter_map(|e| e.graph.as_ref().map(|g| (g.path.as_str(), e.name.as_str())))
            .collect();
        let entities = config
            .entities
            .iter()
            .map(|e| {
                let backend = config
                    .storages
                    .get(&e.storage)
                    .map(|s| s.kind.clone())
                    .unwrap_or_default();
                let rest = e.rest.as_ref().map(|r| {
                    json!({
                        "path": r.path,
                        "docs": format!("{}/api-docs", r.path),
                        "schema": r.schema,
                        // a read-role process: the console offers no create, edit or delete
                        "read_only": !config.role.writes(),
                    })
                });
                let graphql = e.graph.as_ref().map(|g| {
                    json!({
                        "path": g.path,
                        "type": g.entity_type,
                        "queries": g.queries.iter().map(|q| json!({
                            "name": q.name,
                            "vector": q.vector,
                        })).collect::<Vec<_>>(),
                        "resolvers": g.resolvers.iter().map(|r| {
                            let (graph, url) = match &r.target {
                                ResolverTarget::InProcess { graph_path } => (Some(graph_path.clone()), None),
                                ResolverTarget::Http { url } => (None, Some(url.clone())),
                            };
                            json!({
                                "field": r.field,
                                "key": r.key,
                                "query": r.query,
                                "vector": r.vector,
                                "graph": graph,
                                "url": url,
                                "entity": graph.as_deref().and_then(|p| graph_entity.get(p).copied()),
                            })
                        }).collect::<Vec<_>>(),
                    })
                });
                Entity {
                    name: e.name.clone(),
                    info: json!({
                        "name": e.name,
                        "storage": e.storage,
                        "backend": backend,
                        "rest": rest,
                        "graphql": graphql,
                    }),
                    service: services[&e.name].clone(),
                }
            })
            .collect();
        Console {
            path: config.console.path.clone(),
            changes: config.changes.config.enabled,
            entities,
            processors,
        }
    }

    /// Each processor whose output the caller may read, with its lag, position and newest
    /// dead letters (those of inputs it may read).
    async fn processors(&self, headers: &HeaderMap) -> Vec<Value> {
        let mut out = Vec::new();
        for p in self.processors.stats() {
            let Some(e) = self.entities.iter().find(|e| e.name == p.output) else {
                continue;
            };
            let Ok(session) = session(e, headers) else {
                continue;
            };
            let letters = match e.service.dead_letters(&session, &p.name, 5).await {
                Ok(letters) => letters,
                Err(EngineError::Forbidden(_)) => continue,
                Err(_) => Vec::new(),
            };
            out.push(json!({
                "name": p.name,
                "type": p.kind,
                "output": p.output,
                "inputs": p.inputs,
                "position": p.position,
                "lag": p.lag,
                "lag_seconds": p.lag_seconds,
                "processed": p.processed,
                "dead_letters": p.dead_letters,
                "errors": p.errors,
                "recent_dead_letters": letters.into_iter().map(|l| json!({
                    "position": l.position,
                    "change_id": l.change_id,
                    "entity": l.entity,
                    "reason": l.reason,
                    "at": l.at,
                })).collect::<Vec<_>>(),
            }));
        }
        out
    }

    fn entity(&self, name: &str) -> Result<&Entity, ApiError> {
        self.entities
            .iter()
            .find(|e| e.name == name)
            .ok_or_else(|| ApiError::not_found(format!("no entity \"{name}\"")))
    }
}

/// The console's routes: the page at its path, assets and JSON endpoints under [`PREFIX`].
pub fn router(console: Arc<Console>) -> Router {
    Router::new()
        .route(&console.path, get(index))
        .route(&format!("{PREFIX}/assets/{{file}}"), get(asset))
        .route(&format!("{PREFIX}/api/service"), get(service))
        .route(
            &format!("{PREFIX}/api/entities/{{entity}}/documents"),
            get(documents),
        )
        .route(
            &format!("{PREFIX}/api/entities/{{entity}}/documents/{{id}}/versions"),
            get(versions),
        )
        .with_state(console)
}

/// A refusal, as the REST API words it: `{"error": …, "code": …}` with the matching status.
struct ApiError {
    status: StatusCode,
    body: Value,
    /// The `WWW-Authenticate` challenge of refused credentials.
    challenge: Option<String>,
}

impl ApiError {
    fn not_found(message: String) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            body: json!({"error": message, "code": "NOT_FOUND"}),
            challenge: None,
        }
    }

    fn bad(message: String) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            body: json!({"error": message, "code": "BAD_REQUEST"}),
            challenge: None,
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        let kind = e.kind();
        let challenge = match &e {
            EngineError::Auth(refused) => meshql_rest::edge::www_authenticate(refused),
            _ => None,
        };
        ApiError {
            status: meshql_rest::edge::status(kind),
            body: json!({"error": e.to_string(), "code": kind.code()}),
            challenge,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            let challenge = self
                .challenge
                .and_then(|c| HeaderValue::from_str(&c).ok())
                .unwrap_or(HeaderValue::from_static("Bearer"));
            r.headers_mut().insert(header::WWW_AUTHENTICATE, challenge);
        }
        r
    }
}

fn no_store(mut r: Response) -> Response {
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn session(entity: &Entity, headers: &HeaderMap) -> Result<Session, ApiError> {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    Ok(entity.service.session(authorization, None)?)
}

async fn index(State(console): State<Arc<Console>>) -> Response {
    let page = INDEX.replace("{{PREFIX}}", PREFIX).replace(
        "{{CHANGES}}",
        if console.changes { "true" } else { "false" },
    );
    let mut r = Response::new(axum::body::Body::from(page));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    // everything from this server, nothing inline, never in another site's frame
    r.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    no_store(r)
}

async fn asset(Path(name): Path<String>) -> Response {
    match FILES.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, text)) => {
            let mut r = Response::new(axum::body::Body::from(*text));
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
            no_store(r)
        }
        None => ApiError::not_found(format!("no console asset {name}")).into_response(),
    }
}

/// How many documents `session` sees in `entity`, counting at most [`COUNT_CAP`]; `None`
/// with the refusal when it may not read them.
async fn count(entity: &Entity, session: &Session) -> Result<(usize, bool), EngineError> {
    let at = meshql_core::now_millis();
    let mut counted = 0;
    let mut after: Option<String> = None;
    loop {
        let page = entity
            .service
            .list_page(session, after.as_deref(), COUNT_PAGE, Some(at))
            .await?;
        counted += page.len();
        if page.len() < COUNT_PAGE {
            return Ok((counted, false));
        }
        if counted >= COUNT_CAP {
            return Ok((counted, true));
        }
        after = page.last().map(|e| e.id.clone());
    }
}

async fn service(State(console): State<Arc<Console>>, headers: HeaderMap) -> Response {
    // refused credentials are a 401, as on every other endpoint (not a page of refusals)
    if let Some(first) = console.entities.first() {
        if let Err(e) = session(first, &headers) {
            return e.into_response();
        }
    }
    let mut entities = Vec::with_capacity(console.entities.len());
    for entity in &console.entities {
        let mut info = entity.info.clone();
        let counted = match session(entity, &headers) {
            Ok(s) => count(entity, &s).await.map_err(ApiError::from),
            Err(e) => Err(e),
        };
        match counted {
            Ok((n, capped)) => {
                info["count"] = json!(n);
                info["count_capped"] = json!(capped);
            }
            Err(e) => {
                info["count"] = Value::Null;
                info["count_error"] = e.body["error"].clone();
                info["count_code"] = e.body["code"].clone();
            }
        }
        entities.push(info);
    }
    no_store(
        axum::Json(json!({
            "console": {"path": console.path, "prefix": PREFIX},
            "changes": if console.changes { json!("/_changes") } else { Value::Null },
            "health": "/health",
            "ready": "/ready",
            "entities": entities,
            "processors": console.processors(&headers).await,
        }))
        .into_response(),
    )
}

/// A document for the console: its id, its version's time and its payload.
fn document(e: Envelope) -> Value {
    let payload: Value = serde_json::from_str(&e.payload).unwrap_or(Value::Null);
    json!({"id": e.id, "created_at": e.created_at, "deleted": e.deleted, "payload": payload})
}

fn parse_at(params: &HashMap<String, String>) -> Result<Option<Millis>, ApiError> {
    params
        .get("at")
        .filter(|v| !v.is_empty())
        .map(|v| {
            v.parse::<Millis>().map_err(|_| {
                ApiError::bad(format!(
                    "`at` must be milliseconds since the epoch, not `{v}`"
                ))
            })
        })
        .transpose()
}

async fn documents(
    State(console): State<Arc<Console>>,
    Path(name): Path<String>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    const KNOWN: [&str; 3] = ["at", "limit", "after"];
    if let Some(unknown) = params.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(ApiError::bad(meshql_core::suggest::unknown_parameter(
            unknown, &KNOWN,
        )));
    }
    let entity = console.entity(&name)?;
    let at = parse_at(&params)?.unwrap_or_else(meshql_core::now_millis);
    let limit = match params.get("limit") {
        None => MAX_LIMIT,
        Some(v) => match v.parse::<usize>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => n,
            _ => {
                return Err(ApiError::bad(format!(
                    "`limit` must be an integer from 1 to {MAX_LIMIT}"
                )))
            }
        },
    };
    let after = params.get("after").filter(|a| !a.is_empty());
    let session = session(entity, &headers)?;
    let page = entity
        .service
        .list_page(&session, after.map(String::as_str), limit, Some(at))
        .await?;
    let next = (page.len() == limit)
        .then(|| page.last().map(|e| e.id.clone()))
        .flatten();
    Ok(no_store(
        axum::Json(json!({
            "at": at,
            "documents": page.into_iter().map(document).collect::<Vec<_>>(),
            "next": next,
        }))
        .into_response(),
    ))
}

async fn versions(
    State(console): State<Arc<Console>>,
    Path((name, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let entity = console.entity(&name)?;
    let session = session(entity, &headers)?;
    let versions: Vec<Value> = entity
        .service
        .versions(&session, &id)
        .await?
        .into_iter()
        .map(document)
        .collect();
    if versions.is_empty() {
        return Err(ApiError::not_found(format!(
            "no version of {name} {id} is visible"
        )));
    }
    Ok(no_store(
        axum::Json(json!({"id": id, "versions": versions})).into_response(),
    ))
}

/// The query GraphiQL opens with for `entity` (when the browser has none of its own): its
/// `getById` with the entity type's scalar fields and its first relationship (that type's
/// scalar fields). The console's links replace the placeholder id with a real one.
pub(crate) fn example_query(entity: &ResolvedEntity) -> Option<String> {
    use apollo_compiler::schema::ExtendedType;
    let g = entity.graph.as_ref()?;
    let by_id = g
        .queries
        .iter()
        .find(|q| q.name == "getById" && !q.vector)?;
    let schema = &g.schema;
    let scalars = |type_name: &str| -> Vec<String> {
        schema
            .get_object(type_name)
            .map(|t| {
                t.fields
                    .values()
                    .filter(|f| {
                        matches!(
                            schema.types.get(f.ty.inner_named_type()),
                            Some(ExtendedType::Scalar(_) | ExtendedType::Enum(_))
                        )
                    })
                    .map(|f| f.name.to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    let fields = scalars(&g.entity_type);
    if fields.is_empty() {
        return None;
    }
    let mut text = format!(
        "# {entity}: one document by id, with a relationship.\n\
         # at: <ms since the epoch> reads it as it was then.\n\
         {{\n  {query}(id: \"an id\") {{\n",
        entity = entity.name,
        query = by_id.name,
    );
    for f in &fields {
        text.push_str(&format!("    {f}\n"));
    }
    let relationship = g.resolvers.iter().find_map(|r| {
        let ty = schema
            .get_object(&g.entity_type)?
            .fields
            .get(r.field.as_str())?
            .ty
            .inner_named_type()
            .to_string();
        let sub = scalars(&ty);
        (!sub.is_empty()).then(|| (r.field.clone(), sub))
    });
    if let Some((field, sub)) = relationship {
        text.push_str(&format!("    {field} {{\n"));
        for f in sub.iter().take(4) {
            text.push_str(&format!("      {f}\n"));
        }
        text.push_str("    }\n");
    }
    text.push_str("  }\n}\n");
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_names_the_prefix_and_every_asset_it_loads() {
        for (name, _, _) in FILES {
            assert!(
                INDEX.contains(&format!("{{{{PREFIX}}}}/assets/{name}")),
                "{name}"
            );
        }
    }
}
