//! The subscription transports of a graphlette (`/<entity>/graph`):
//!
//! * **graphql-transport-ws** over a WebSocket (`GET` with `Upgrade: websocket`, subprotocol
//!   `graphql-transport-ws`): `connection_init` (its payload may carry `Authorization`, for
//!   browsers that cannot set headers on a WebSocket) → `connection_ack`; `subscribe` →
//!   `next`… (`complete` when the client sends `complete` or the operation was a query);
//!   `ping` → `pong`. At most [`MAX_OPERATIONS`] operations per connection; a connection
//!   not initialised within [`INIT_WAIT`] is closed with 4408, a repeated id with 4409, a
//!   bad message with 4400, an unauthorised init with 4403 (the protocol's codes).
//! * **graphql-sse**, distinct connections mode: `POST` (or `GET` with the query in
//!   parameters) with `Accept: text/event-stream` → `event: next` per event (its `id:` is the
//!   change's log position), `event: complete` at the end. `Last-Event-ID` (or
//!   `extensions.since` in the request, or `since` in a WebSocket subscribe's `extensions`)
//!   resumes after that position.
//!
//! A subscriber that stops reading is dropped when its queue is full: the stream ends with an
//! error event (`SLOW_SUBSCRIBER`). Every event is computed by [`Subscriptions`] once per
//! cohort.

use crate::graph_endpoint::{json_ok, GraphEndpoint};
use axum::body::{Body, Bytes};
use axum::extract::ws::{CloseFrame, Message, WebSocket};
use axum::http::{header, HeaderValue};
use axum::response::Response;
use futures::{SinkExt, StreamExt};
use meshql_graphql::{GraphqlRequest, RequestContext, Subscribed};
use meshql_runtime::subscriptions::{Event, Membership, Subscriptions};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Operations one WebSocket may run at once.
pub const MAX_OPERATIONS: usize = 100;
/// How long a WebSocket may wait before `connection_init`.
pub const INIT_WAIT: Duration = Duration::from_secs(5);
/// A comment on an idle event stream, so that proxies keep it open.
const HEARTBEAT: Duration = Duration::from_secs(15);
/// The error event of a subscriber dropped for not reading.
const SLOW: &str = r#"{"errors":[{"message":"the subscriber did not read its events in time and was dropped; resume with the last event's id","extensions":{"code":"SLOW_SUBSCRIBER"}}]}"#;
/// The error event of a subscription ended by the server's shutdown.
const CLOSING: &str = r#"{"errors":[{"message":"the server is shutting down; resume with the last event's id","extensions":{"code":"UNAVAILABLE"}}]}"#;
/// The error of a subscription refused for lack of room: `max` subscriptions are open.
fn full(max: u64) -> Vec<u8> {
    json!({"errors": [{
        "message": format!(
            "too many subscriptions open on this server (server.max_subscriptions = {max}); try again later"
        ),
        "extensions": {"code": "UNAVAILABLE"},
    }]})
    .to_string()
    .into_bytes()
}

/// Where a subscription resumes: `Last-Event-ID`, else `extensions.since`.
pub fn since(
    last_event_id: Option<&str>,
    extensions: Option<&Value>,
) -> Result<Option<u64>, String> {
    if let Some(id) = last_event_id {
        return id
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| format!("`Last-Event-ID` must be a change position, not `{id}`"));
    }
    match extensions.and_then(|e| e.get("since")) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("`extensions.since` must be a change position, not {v}")),
    }
}

/// The events of `membership`: its catch-up from the log, then the live ones; `Err` when it
/// was dropped for being slow or the log could not be read.
pub struct Events {
    hub: Arc<Subscriptions>,
    membership: Membership,
    pending: std::collections::VecDeque<Event>,
}

impl Events {
    pub fn new(hub: Arc<Subscriptions>, membership: Membership) -> Self {
        Events {
            hub,
            membership,
            pending: Default::default(),
        }
    }

    /// The next event; `Err` with the error body when the subscription ends.
    pub async fn next(&mut self) -> Result<Event, &'static str> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                return Ok(e);
            }
            if let Some((after, until)) = self.membership.catch_up {
                let (changes, last) = self
                    .hub
                    .changes_after(after, until)
                    .await
                    .map_err(|_| r#"{"errors":[{"message":"the change log cannot be read","extensions":{"code":"UNAVAILABLE"}}]}"#)?;
                for change in &changes {
                    if let Some(body) = self
                        .hub
                        .event_of_change(&self.membership.subscription, change)
                        .await
                    {
                        self.pending.push_back((change.position, Arc::new(body)));
                    }
                }
                self.membership.catch_up = (last < until && last > after).then_some((last, until));
                continue;
            }
            return self
                .membership
                .events
                .recv()
                .await
                .ok_or(match self.hub.ended() {
                    meshql_runtime::subscriptions::Ended::Slow => SLOW,
                    meshql_runtime::subscriptions::Ended::Closing => CLOSING,
                });
        }
    }
}

fn sse_frame(out: &mut Vec<u8>, id: Option<u64>, event: &str, data: &[u8]) {
    if let Some(id) = id {
        out.extend_from_slice(format!("id: {id}\n").as_bytes());
    }
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(event.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\n\n");
}

fn event_stream_response(rx: mpsc::Receiver<Bytes>) -> Response {
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, std::io::Error>(b), rx))
    });
    event_stream(Body::from_stream(body))
}

/// An event stream response (`text/event-stream`, never cached, never buffered by a proxy)
/// of `body`: subscriptions' and `/_changes`'.
pub(crate) fn event_stream(body: Body) -> Response {
    let mut response = Response::new(body);
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// A subscription (or a query) over graphql-sse.
pub async fn sse(
    endpoint: Arc<GraphEndpoint>,
    hub: Arc<Subscriptions>,
    request: GraphqlRequest,
    context: RequestContext,
    since: Option<u64>,
) -> Response {
    let subscribed = endpoint
        .registry
        .subscribe(endpoint.index, &request, context)
        .await;
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    match subscribed {
        Err(body) => return json_ok(body),
        Ok(Subscribed::Once(body)) => {
            let mut out = Vec::new();
            sse_frame(&mut out, None, "next", &body);
            sse_frame(&mut out, None, "complete", b"");
            let _ = tx.try_send(Bytes::from(out));
        }
        Ok(Subscribed::Live(subscription)) => {
            let Some(membership) = hub.join(*subscription, since) else {
                let mut r = json_ok(full(hub.max()));
                *r.status_mut() = axum::http::StatusCode::SERVICE_UNAVAILABLE;
                return r;
            };
            let mut events = Events::new(hub, membership);
            tokio::spawn(async move {
                if tx
                    .send(Bytes::from_static(b": subscribed\n\n"))
                    .await
                    .is_err()
                {
                    return;
                }
                loop {
                    let next = tokio::select! {
                        // the client left: dropping `events` leaves the cohort at once
                        _ = tx.closed() => return,
                        next = tokio::time::timeout(HEARTBEAT, events.next()) => next,
                    };
                    let mut out = Vec::new();
                    match next {
                        Err(_) => out.extend_from_slice(b": heartbeat\n\n"),
                        Ok(Ok((position, body))) => {
                            sse_frame(&mut out, Some(position), "next", &body)
                        }
                        Ok(Err(error)) => {
                            sse_frame(&mut out, None, "next", error.as_bytes());
                            sse_frame(&mut out, None, "complete", b"");
                            let _ = tx.send(Bytes::from(out)).await;
                            return;
                        }
                    }
                    if tx.send(Bytes::from(out)).await.is_err() {
                        return; // the client left: dropping `events` leaves the cohort
                    }
                }
            });
        }
    }
    event_stream_response(rx)
}

/// What a WebSocket's writer sends.
enum Out {
    Text(String),
    Close(u16, &'static str),
}

/// Serves one graphql-transport-ws connection. `authorization` is the upgrade request's
/// `Authorization` header; a `connection_init` payload may give one instead.
pub async fn websocket(
    socket: WebSocket,
    endpoint: Arc<GraphEndpoint>,
    hub: Option<Arc<Subscriptions>>,
    authorization: Option<String>,
) {
    let (mut sink, mut stream) = socket.split();
    let (out_tx, mut out_rx) = mpsc::channel::<Out>(64);
    let writer = tokio::spawn(async move {
        while let Some(out) = out_rx.recv().await {
            let message = match out {
                Out::Text(t) => Message::Text(t.into()),
                Out::Close(code, reason) => {
                    let _ = sink
                        .send(Message::Close(Some(CloseFrame {
                            code,
                            reason: reason.into(),
                        })))
                        .await;
                    return;
                }
            };
            if sink.send(message).await.is_err() {
                return;
            }
        }
    });
    let close = |code: u16, reason: &'static str| {
        let out_tx = out_tx.clone();
        async move {
            let _ = out_tx.send(Out::Close(code, reason)).await;
        }
    };
    // connection_init first
    let init = tokio::time::timeout(INIT_WAIT, stream.next()).await;
    let Ok(Some(Ok(Message::Text(text)))) = init else {
        close(4408, "Connection initialisation timeout").await;
        drop(out_tx);
        let _ = writer.await;
        return;
    };
    let init: Value = serde_json::from_str(text.as_str()).unwrap_or(Value::Null);
    if init["type"] != "connection_init" {
        close(4400, "expected connection_init").await;
        drop(out_tx);
        let _ = writer.await;
        return;
    }
    let from_payload = ["Authorization", "authorization"]
        .iter()
        .find_map(|k| init["payload"][k].as_str())
        .or_else(|| init["payload"]["headers"]["Authorization"].as_str())
        .map(str::to_owned);
    let authorization = authorization.or(from_payload);
    let context = match endpoint.context_for(authorization) {
        Ok(c) => c,
        Err(_) => {
            close(4403, "Forbidden").await;
            drop(out_tx);
            let _ = writer.await;
            return;
        }
    };
    let _ = out_tx
        .send(Out::Text(r#"{"type":"connection_ack"}"#.to_owned()))
        .await;
    let mut operations: HashMap<String, tokio::task::JoinHandle<()>> = HashMap::new();
    while let Some(message) = stream.next().await {
        let text = match message {
            Ok(Message::Text(t)) => t,
            Ok(Message::Close(_)) | Err(_) => break,
            Ok(_) => continue,
        };
        let Ok(msg) = serde_json::from_str::<Value>(text.as_str()) else {
            close(4400, "Invalid message").await;
            break;
        };
        operations.retain(|_, task| !task.is_finished());
        match msg["type"].as_str() {
            Some("ping") => {
                let _ = out_tx
                    .send(Out::Text(r#"{"type":"pong"}"#.to_owned()))
                    .await;
            }
            Some("pong") => {}
            Some("connection_init") => {
                close(4429, "Too many initialisation requests").await;
                break;
            }
            Some("complete") => {
                if let Some(task) = msg["id"].as_str().and_then(|id| operations.remove(id)) {
                    task.abort();
                }
            }
            Some("subscribe") => {
                let Some(id) = msg["id"].as_str().map(str::to_owned) else {
                    close(4400, "subscribe without an id").await;
                    break;
                };
                if operations.contains_key(&id) {
                    close(4409, "Subscriber for this id already exists").await;
                    break;
                }
                let error = |payload: Value| {
                    json!({"id": id, "type": "error", "payload": payload}).to_string()
                };
                if operations.len() >= MAX_OPERATIONS {
                    let _ = out_tx
                        .send(Out::Text(error(json!([{"message": format!("at most {MAX_OPERATIONS} operations per connection")}]))))
                        .await;
                    continue;
                }
                let mut request: GraphqlRequest =
                    match serde_json::from_value(msg["payload"].clone()) {
                        Ok(r) => r,
                        Err(e) => {
                            let _ = out_tx
                            .send(Out::Text(error(
                                json!([{"message": format!("malformed subscribe payload: {e}")}]),
                            )))
                            .await;
                            continue;
                        }
                    };
                // a persisted query (and, with an allow-list, only a listed one)
                match endpoint
                    .persisted
                    .resolve(request.query.take(), msg["payload"].get("extensions"))
                {
                    Ok(query) => request.query = query,
                    Err(e) => {
                        let payload =
                            json!([{"message": e.to_string(), "extensions": {"code": e.code()}}]);
                        let _ = out_tx.send(Out::Text(error(payload))).await;
                        continue;
                    }
                }
                let resume = match since(None, msg["payload"].get("extensions")) {
                    Ok(s) => s,
                    Err(m) => {
                        let _ = out_tx.send(Out::Text(error(json!([{"message": m}])))).await;
                        continue;
                    }
                };
                let task = tokio::spawn(operation(
                    endpoint.clone(),
                    hub.clone(),
                    context.clone(),
                    id.clone(),
                    request,
                    resume,
                    out_tx.clone(),
                ));
                operations.insert(id, task);
            }
            _ => {
                close(4400, "Unknown message type").await;
                break;
            }
        }
    }
    for (_, task) in operations {
        task.abort();
    }
    drop(out_tx);
    let _ = writer.await;
}

/// One `subscribe` of a WebSocket: its events as `next`, then `complete` (or `error`).
async fn operation(
    endpoint: Arc<GraphEndpoint>,
    hub: Option<Arc<Subscriptions>>,
    context: RequestContext,
    id: String,
    request: GraphqlRequest,
    since: Option<u64>,
    out: mpsc::Sender<Out>,
) {
    // what this operation reads as of: now, not when the connection was opened
    let mut context = context;
    context.snapshot = endpoint.service.read_snapshot();
    let next = |body: &[u8]| {
        let payload = String::from_utf8_lossy(body);
        format!(
            r#"{{"id":{},"type":"next","payload":{payload}}}"#,
            json!(id)
        )
    };
    let complete = format!(r#"{{"id":{},"type":"complete"}}"#, json!(id));
    let error = |body: &[u8]| {
        let errors = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|v| v.get("errors").cloned())
            .unwrap_or_else(|| json!([{"message": "invalid operation"}]));
        json!({"id": id, "type": "error", "payload": errors}).to_string()
    };
    match endpoint
        .registry
        .subscribe(endpoint.index, &request, context)
        .await
    {
        Err(body) => {
            let _ = out.send(Out::Text(error(&body))).await;
        }
        Ok(Subscribed::Once(body)) => {
            let _ = out.send(Out::Text(next(&body))).await;
            let _ = out.send(Out::Text(complete)).await;
        }
        Ok(Subscribed::Live(subscription)) => {
            let Some(hub) = hub else {
                let _ = out
                    .send(Out::Text(error(br#"{"errors":[{"message":"subscriptions need the change feed, which this service disables ([changes] enabled = false)"}]}"#)))
                    .await;
                return;
            };
            let Some(membership) = hub.join(*subscription, since) else {
                let _ = out.send(Out::Text(error(&full(hub.max())))).await;
                return;
            };
            let mut events = Events::new(hub, membership);
            loop {
                match events.next().await {
                    Ok((_, body)) => {
                        if out.send(Out::Text(next(&body))).await.is_err() {
                            return;
                        }
                    }
                    Err(body) => {
                        let _ = out.send(Out::Text(next(body.as_bytes()))).await;
                        let _ = out.send(Out::Text(complete)).await;
                        return;
                    }
                }
            }
        }
    }
}
