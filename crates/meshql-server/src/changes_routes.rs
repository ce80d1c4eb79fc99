//! `/_changes`: the service's change feed over HTTP, after CouchDB's `_changes`.
//!
//! * `GET /_changes?since=P&limit=N[&entity=a,b][&wait_ms=W]` → `{"changes":[…],"last":L}`:
//!   the changes after position `P` (`since=now`: after the newest), at most `N`; `last` is the
//!   position to pass as the next `since` (it moves past changes the caller may not see).
//!   With `wait_ms`, an empty answer is held until a change arrives or the time is up
//!   (long polling).
//! * `Accept: text/event-stream` (or `feed=eventsource`): the same changes as Server-Sent
//!   Events (`id:` = position, `event: change`), live, resumable with `Last-Event-ID`; a
//!   comment every 15 s keeps proxies from closing an idle stream. The stream reads the log at
//!   the client's pace, so a slow client holds no buffer: it only falls behind.
//!
//! A change is delivered to a caller who could read its document: the authorized tokens filter
//! the feed exactly as they filter reads, and so do permissions: changes of entities the
//! caller may not read are left out (naming one in `entity=` is a 403 `FORBIDDEN`, as is a
//! caller who may read no entity at all), and payloads lose the fields its read mask hides. Refused credentials (a forged or expired token, none
//! where one is required) are a 401 with `WWW-Authenticate`, checked before the parameters.

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use meshql_changes::feed::read_page;
use meshql_changes::{FeedFilter, Page};
use meshql_engine::{Access, EntityService};
use meshql_log::Log;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

/// Changes per page when the caller names no `limit`.
const DEFAULT_LIMIT: usize = 100;
/// The largest `limit` accepted.
const MAX_LIMIT: usize = 10_000;
/// The longest `wait_ms` accepted.
const MAX_WAIT_MS: u64 = 60_000;
/// Event streams served at once; more get 503.
const MAX_STREAMS: usize = 1_000;
/// Changes read per step of an event stream.
const STREAM_PAGE: usize = 256;
const HEARTBEAT: Duration = Duration::from_secs(15);

pub struct ChangesEndpoint {
    pub log: Log,
    /// Every entity's service, in the config's order: who the caller is and what it may read
    /// of each entity are theirs to decide.
    pub services: Vec<Arc<EntityService>>,
    pub entities: Vec<String>,
    /// Set when the server starts shutting down: event streams end.
    pub closing: watch::Receiver<bool>,
    pub streams: Arc<Semaphore>,
}

impl ChangesEndpoint {
    pub fn new(
        log: Log,
        services: Vec<Arc<EntityService>>,
        closing: watch::Receiver<bool>,
    ) -> Self {
        Self {
            log,
            entities: services.iter().map(|s| s.name().to_owned()).collect(),
            services,
            closing,
            streams: Arc::new(Semaphore::new(MAX_STREAMS)),
        }
    }
}

fn json(status: StatusCode, body: impl Into<Body>) -> Response {
    let mut r = Response::new(body.into());
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn bad_request(message: String) -> Response {
    json(
        StatusCode::BAD_REQUEST,
        serde_json::json!({ "error": message }).to_string(),
    )
}

fn forbidden(message: String) -> Response {
    json(
        StatusCode::FORBIDDEN,
        serde_json::json!({ "error": message, "code": "FORBIDDEN" }).to_string(),
    )
}

/// Why a request's parameters were refused.
enum Refusal {
    /// 400
    Bad(String),
    /// 403: an entity the caller may not read.
    Forbidden(String),
}

impl From<String> for Refusal {
    fn from(message: String) -> Self {
        Refusal::Bad(message)
    }
}

impl From<&str> for Refusal {
    fn from(message: &str) -> Self {
        Refusal::Bad(message.to_owned())
    }
}

/// A request's parameters, checked.
#[derive(Debug)]
struct Request {
    since: Option<u64>,
    limit: usize,
    wait: Duration,
    filter: FeedFilter,
    stream: bool,
}

fn parse(
    endpoint: &ChangesEndpoint,
    params: &HashMap<String, String>,
    headers: &HeaderMap,
    access: &Access,
) -> Result<Request, Refusal> {
    const KNOWN: [&str; 5] = ["since", "limit", "entity", "wait_ms", "feed"];
    if let Some(unknown) = params.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(meshql_core::suggest::unknown_parameter(unknown, &KNOWN).into());
    }
    let number = |name: &str| -> Result<Option<u64>, String> {
        params
            .get(name)
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| format!("`{name}` must be a non-negative integer, not `{v}`"))
            })
            .transpose()
    };
    let since = match params.get("since").map(String::as_str) {
        Some("now") => None,
        _ => Some(number("since")?.unwrap_or(0)),
    };
    let limit = match number("limit")? {
        None => DEFAULT_LIMIT,
        Some(0) => return Err("`limit` must be at least 1".into()),
        Some(n) if n as usize > MAX_LIMIT => {
            return Err(format!("`limit` must be at most {MAX_LIMIT}").into())
        }
        Some(n) => n as usize,
    };
    let wait_ms = number("wait_ms")?.unwrap_or(0);
    if wait_ms > MAX_WAIT_MS {
        return Err(format!("`wait_ms` must be at most {MAX_WAIT_MS}").into());
    }
    let entities = match params.get("entity") {
        None => None,
        Some(list) => {
            let names: Vec<String> = list
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            if names.is_empty() {
                return Err("`entity` names no entity".into());
            }
            if let Some(unknown) = names.iter().find(|n| !endpoint.entities.contains(n)) {
                return Err(format!(
                    "unknown entity `{unknown}` (this service has: {})",
                    endpoint.entities.join(", ")
                )
                .into());
            }
            Some(names)
        }
    };
    let stream = match params.get("feed").map(String::as_str) {
        None => headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.contains("text/event-stream")),
        Some("eventsource") => true,
        Some("normal") | Some("longpoll") => false,
        Some(other) => {
            return Err(
                format!("`feed` must be normal, longpoll or eventsource, not `{other}`").into(),
            )
        }
    };
    let last_event_id = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.trim()
                .parse::<u64>()
                .map_err(|_| format!("`Last-Event-ID` must be a position, not `{v}`"))
        })
        .transpose()?;
    let filter = meshql_engine::visibility(&endpoint.services, access, entities.as_deref())
        .map_err(|e| Refusal::Forbidden(e.to_string()))?;
    Ok(Request {
        since: if stream {
            last_event_id.or(since)
        } else {
            since
        },
        limit,
        wait: Duration::from_millis(wait_ms),
        filter,
        stream,
    })
}

async fn page(log: &Log, since: u64, limit: usize, filter: &FeedFilter) -> Result<Page, String> {
    let (log, filter) = (log.clone(), filter.clone());
    tokio::task::spawn_blocking(move || read_page(&log, since, limit, &filter))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
}

fn unavailable(message: String) -> Response {
    tracing::error!(error = %message, "reading the change log failed");
    json(
        StatusCode::SERVICE_UNAVAILABLE,
        serde_json::json!({ "error": format!("the change log cannot be read: {message}") })
            .to_string(),
    )
}

pub async fn changes(
    State(endpoint): State<Arc<ChangesEndpoint>>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let Some(any) = endpoint.services.first() else {
        return bad_request("this service has no entities".into());
    };
    // every service shares the authorizer and the policy: any of them answers who this is
    let access = match any.access(
        headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
    ) {
        Ok(a) => a,
        Err(e) => {
            let body = serde_json::json!({"error": e.to_string(), "code": e.kind().code()});
            return crate::graph_endpoint::refused(&e, body.to_string());
        }
    };
    let request = match parse(&endpoint, &params, &headers, &access) {
        Ok(r) => r,
        Err(Refusal::Bad(message)) => return bad_request(message),
        Err(Refusal::Forbidden(message)) => return forbidden(message),
    };
    let since = request.since.unwrap_or_else(|| endpoint.log.last_offset());
    if request.stream {
        let Ok(permit) = endpoint.streams.clone().try_acquire_owned() else {
            return json(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(r#"{{"error":"too many change streams open (at most {MAX_STREAMS})"}}"#),
            );
        };
        return event_stream(endpoint.clone(), since, request.filter, permit);
    }
    let mut updates = endpoint.log.subscribe();
    let deadline = tokio::time::Instant::now() + request.wait;
    let mut since = since;
    loop {
        let result = match page(&endpoint.log, since, request.limit, &request.filter).await {
            Ok(p) => p,
            Err(message) => return unavailable(message),
        };
        since = result.last;
        let now = tokio::time::Instant::now();
        if !result.changes.is_empty() || now >= deadline {
            return json(StatusCode::OK, result.to_json());
        }
        updates.mark_unchanged();
        if endpoint.log.last_offset() > since {
            continue;
        }
        let mut closing = endpoint.closing.clone();
        tokio::select! {
            _ = updates.changed() => {}
            _ = tokio::time::sleep_until(deadline) => {}
            _ = closing.wait_for(|c| *c) => return json(StatusCode::OK, result.to_json()),
        }
    }
}

/// One step of an event stream: what to send next.
struct Stream {
    endpoint: Arc<ChangesEndpoint>,
    position: u64,
    filter: FeedFilter,
    updates: watch::Receiver<u64>,
    closing: watch::Receiver<bool>,
    _permit: OwnedSemaphorePermit,
}

fn event_stream(
    endpoint: Arc<ChangesEndpoint>,
    since: u64,
    filter: FeedFilter,
    permit: OwnedSemaphorePermit,
) -> Response {
    let state = Stream {
        updates: endpoint.log.subscribe(),
        closing: endpoint.closing.clone(),
        endpoint,
        position: since,
        filter,
        _permit: permit,
    };
    // the first chunk says the stream is open (and where it starts)
    let opening = Bytes::from(format!(": changes after {since}\nretry: 2000\n\n"));
    let body = futures::stream::once(async move { Ok::<_, std::io::Error>(opening) }).chain(
        futures::stream::unfold(Some(state), |state| async move {
            let mut s = state?;
            let chunk = next_events(&mut s).await?;
            Some((Ok::<_, std::io::Error>(chunk), Some(s)))
        }),
    );
    crate::subscription_routes::event_stream(Body::from_stream(body))
}

use futures::StreamExt;

/// The next chunk of events (or a heartbeat); `None` ends the stream.
async fn next_events(s: &mut Stream) -> Option<Bytes> {
    loop {
        if *s.closing.borrow() {
            return None;
        }
        s.updates.mark_unchanged();
        let result = match page(&s.endpoint.log, s.position, STREAM_PAGE, &s.filter).await {
            Ok(p) => p,
            Err(message) => {
                tracing::error!(error = %message, "change stream ends: the log cannot be read");
                return None;
            }
        };
        let moved = result.last > s.position;
        s.position = result.last;
        if !result.changes.is_empty() {
            let mut out = Vec::new();
            for (position, change) in &result.changes {
                out.extend_from_slice(b"id: ");
                out.extend_from_slice(position.to_string().as_bytes());
                out.extend_from_slice(b"\nevent: change\ndata: ");
                out.extend_from_slice(change);
                out.extend_from_slice(b"\n\n");
            }
            if result.last > result.changes.last().map_or(0, |c| c.0) {
                out.extend_from_slice(format!("id: {}\n\n", result.last).as_bytes());
            }
            return Some(Bytes::from(out));
        }
        if moved {
            // only changes this client may not see: move its resume point past them
            return Some(Bytes::from(format!("id: {}\n\n", result.last)));
        }
        if s.endpoint.log.last_offset() > s.position {
            continue;
        }
        tokio::select! {
            _ = s.updates.changed() => {}
            _ = tokio::time::sleep(HEARTBEAT) => return Some(Bytes::from_static(b": keep-alive\n\n")),
            _ = s.closing.wait_for(|c| *c) => return None,
        }
    }
}

/// `/_changes` when the feed is off.
pub async fn disabled() -> Response {
    json(
        StatusCode::NOT_FOUND,
        r#"{"error":"the change feed is off in this service ([changes] enabled = false)"}"#,
    )
}
