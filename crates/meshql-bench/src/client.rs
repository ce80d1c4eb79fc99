//! The HTTP side of a virtual user: one keep-alive HTTP/1.1 connection per user (as k6 and
//! wrk do), requests timed to the last byte read from when they were due (open model, see
//! [`Session::due_at`]) or from just before their first byte is written. The connection
//! itself is [`crate::http1`].

use crate::http1::{Connection, Http1Error};
use crate::stats::{Outcome, Recorder};
use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::Value;
use std::borrow::Cow;
use std::time::{Duration, Instant};

/// Where requests go: an `http://host:port` base URL (an optional path prefix is kept).
#[derive(Debug, Clone)]
pub struct Target {
    pub base: String,
    authority: String,
    prefix: String,
    /// Where reads go when they go elsewhere (a CQRS pair: GETs and GraphQL to the read
    /// service, the other requests to this one).
    reads: Option<Box<Target>>,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("unsupported target URL {0:?}: use http://host:port[/prefix] (TLS is not supported)")]
    BadUrl(String),
    #[error("cannot connect to {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("HTTP: {0}")]
    Http(#[from] Http1Error),
    #[error("no response within {0:?}")]
    Timeout(Duration),
}

impl Target {
    /// `host:port`.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// `path` under the target's prefix, as sent on the wire.
    pub fn path(&self, path: &str) -> String {
        format!("{}{path}", self.prefix)
    }

    pub fn parse(url: &str) -> Result<Self, ClientError> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| ClientError::BadUrl(url.to_string()))?;
        let (authority, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if authority.is_empty() {
            return Err(ClientError::BadUrl(url.to_string()));
        }
        let authority = if authority.contains(':') {
            authority.to_string()
        } else {
            format!("{authority}:80")
        };
        Ok(Self {
            base: format!("http://{authority}{prefix}"),
            authority,
            prefix: prefix.to_string(),
            reads: None,
        })
    }

    /// This target for writes and `reads` for reads: GET requests and POSTs to a GraphQL
    /// endpoint (a path ending in `/graph`).
    pub fn with_reads(mut self, reads: Target) -> Self {
        self.reads = Some(Box::new(reads));
        self
    }

    /// The target `method path` goes to.
    fn route(&self, method: &Method, path: &str) -> &Target {
        match &self.reads {
            Some(reads) if *method == Method::GET || path.ends_with("/graph") => reads,
            _ => self,
        }
    }
}

/// A response, fully read.
pub struct Reply {
    pub status: StatusCode,
    pub body: Bytes,
    /// The `Location` header, when present (servers that answer a create with a redirect).
    pub location: Option<String>,
}

impl Reply {
    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }
}

/// Per-request deadline; a request that takes longer counts as an HTTP error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// One virtual user's connection and recorder.
pub struct Session {
    target: Target,
    conn: Option<Connection>,
    /// The connection to the target's read service, when it has one.
    read_conn: Option<Connection>,
    pub recorder: Recorder,
    /// When the next recorded request was due (open model): its latency counts from then.
    due: Option<Instant>,
}

impl Session {
    pub fn new(target: Target) -> Self {
        Self {
            target,
            conn: None,
            read_conn: None,
            recorder: Recorder::default(),
            due: None,
        }
    }

    /// The next recorded request was due at `due` (the open model's schedule): its latency
    /// is counted from then, not from when it was sent, so time the request spent waiting to
    /// be sent (a late generator, a busy worker) is charged to the request instead of hidden.
    /// Later requests of the same iteration are timed from their send, as they are only due
    /// once the one before them answered.
    pub fn due_at(&mut self, due: Instant) {
        self.due = Some(due);
    }

    /// When the request about to be sent started counting.
    fn start_clock(&mut self) -> Instant {
        let now = Instant::now();
        self.due.take().map_or(now, |due| due.min(now))
    }

    /// Opens the connection ahead of the first request (pre-allocated open-model workers).
    pub async fn warm(&mut self) {
        if self.conn.is_none() {
            self.conn = Connection::connect(&self.target.authority).await.ok();
        }
    }

    /// Sends one request without recording it (setup and validation use this). A request
    /// that meets a keep-alive connection the server has closed meanwhile is sent once more
    /// on a new connection.
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<Reply, ClientError> {
        self.send_with(method, path, &[], body).await
    }

    /// [`Session::send`] with extra request headers.
    pub async fn send_with(
        &mut self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Bytes>,
    ) -> Result<Reply, ClientError> {
        let to_reads = !std::ptr::eq(self.target.route(&method, path), &self.target);
        let target = self.target.route(&method, path);
        let path: Cow<'_, str> = if target.prefix.is_empty() {
            Cow::Borrowed(path)
        } else {
            Cow::Owned(format!("{}{}", target.prefix, path))
        };
        let slot = if to_reads {
            &mut self.read_conn
        } else {
            &mut self.conn
        };
        for attempt in 0..2 {
            let reused = slot.is_some();
            let conn = match slot {
                Some(c) => c,
                None => slot.insert(
                    Connection::connect(&target.authority)
                        .await
                        .map_err(|e| ClientError::Connect(target.authority.clone(), e))?,
                ),
            };
            let exchange =
                conn.exchange(&method, &path, &target.authority, headers, body.as_deref());
            match tokio::time::timeout(REQUEST_TIMEOUT, exchange).await {
                Ok(Ok(r)) => {
                    if conn.closed {
                        *slot = None;
                    }
                    return Ok(Reply {
                        status: r.status,
                        body: r.body,
                        location: r.location,
                    });
                }
                Ok(Err(Http1Error::Closed)) if reused && attempt == 0 => {
                    *slot = None;
                }
                Ok(Err(e)) => {
                    *slot = None;
                    return Err(e.into());
                }
                Err(_) => {
                    *slot = None;
                    return Err(ClientError::Timeout(REQUEST_TIMEOUT));
                }
            }
        }
        Err(Http1Error::Closed.into())
    }

    /// Sends one request and records it under `kind`, timed from when it was due (see
    /// [`Session::due_at`]; otherwise from just before its first byte is written) to the last
    /// byte read; `None` when no response came back (recorded as an HTTP error). A
    /// status ≥ 400 is recorded as an HTTP error but returned.
    pub async fn call(
        &mut self,
        kind: &'static str,
        method: Method,
        path: &str,
        body: Option<Bytes>,
    ) -> Option<Reply> {
        self.call_with(kind, method, path, &[], body).await
    }

    /// [`Session::call`] with extra request headers (e.g. `x-correlation-id`).
    pub async fn call_with(
        &mut self,
        kind: &'static str,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Bytes>,
    ) -> Option<Reply> {
        let started = self.start_clock();
        let result = self.send_with(method, path, headers, body).await;
        let latency = started.elapsed();
        match result {
            Ok(reply) => {
                let outcome = if reply.status.as_u16() >= 400 {
                    Outcome::HttpError
                } else {
                    Outcome::Ok
                };
                self.recorder.kind(kind).record(latency, outcome);
                Some(reply)
            }
            Err(_) => {
                self.recorder.kind(kind).record(latency, Outcome::HttpError);
                None
            }
        }
    }

    /// Posts a GraphQL query and records it under `kind`; returns the `data` member when the
    /// response is a 2xx without `errors`.
    pub async fn graphql(&mut self, kind: &'static str, path: &str, query: &str) -> Option<Value> {
        let body = graphql_body(query);
        let started = self.start_clock();
        let result = self.send(Method::POST, path, Some(body)).await;
        let latency = started.elapsed();
        let (outcome, data) = match result {
            Ok(reply) if reply.status.is_success() => match reply.json() {
                Some(mut v) => {
                    let has_errors = v
                        .get("errors")
                        .and_then(Value::as_array)
                        .is_some_and(|e| !e.is_empty());
                    if has_errors {
                        (Outcome::GraphqlError, None)
                    } else {
                        (Outcome::Ok, v.get_mut("data").map(Value::take))
                    }
                }
                None => (Outcome::GraphqlError, None),
            },
            _ => (Outcome::HttpError, None),
        };
        self.recorder.kind(kind).record(latency, outcome);
        data
    }

    /// Records a check on `kind` (a response that came back but was wrong).
    pub fn check(&mut self, kind: &'static str, passed: bool) -> bool {
        self.recorder.kind(kind).check(passed);
        passed
    }
}

/// `{"query": …}` as bytes.
pub fn graphql_body(query: &str) -> Bytes {
    Bytes::from(serde_json::to_vec(&serde_json::json!({ "query": query })).expect("serialises"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_and_reject() {
        let t = Target::parse("http://127.0.0.1:5088").unwrap();
        assert_eq!(t.base, "http://127.0.0.1:5088");
        let t = Target::parse("http://localhost/base/").unwrap();
        assert_eq!(t.authority, "localhost:80");
        assert_eq!(t.base, "http://localhost:80/base");
        assert_eq!(t.prefix, "/base");
        assert!(Target::parse("https://x:1").is_err());
        assert!(Target::parse("http://").is_err());
        assert!(Target::parse("localhost:5088").is_err());
    }
}
