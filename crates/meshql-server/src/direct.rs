//! Reads by id answered without the router.
//!
//! `GET P/{id}` of a REST path is the hottest request a data service gets. Through axum it
//! pays for the router's clone, its path match, the matched-path extension, two `from_fn`
//! layers (each boxing a future and cloning the next service) and the boxed handler: on the
//! memory backend about a tenth of a request's time (docs/BENCHMARKS.md, "The ceiling").
//!
//! Here the request line is matched against a table of REST paths instead, and the answer
//! comes from the same code the router would run: [`Restlette::read_one`] for the handler,
//! [`timed`] for the request metrics and [`cors::finish`] for the CORS edge. Anything else
//! goes to the router, and so does every request that the router could answer differently:
//!
//! - a method other than `GET`, or a request with a body (the CORS edge may refuse it);
//! - a path that the router serves statically (`P/bulk`, `P/api-docs`, `P/health`,
//!   `P/ready`, a GraphQL path or the console under a REST path): static routes win over
//!   `P/{id}` there;
//! - an id with a percent sign (the router decodes it) or an empty one (`P/` is the list).
//!
//! Servers whose responses carry a log-behind header (a Kafka store) route every request.

use crate::cors::{self, Cors};
use crate::request_metrics::{timed, RequestMetrics};
use axum::http::{Method, Request};
use axum::response::Response;
use futures::future::BoxFuture;
use meshql_rest::Restlette;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// The reads by id a server answers without its router.
pub(crate) struct Direct {
    /// By REST path.
    reads: HashMap<String, Read>,
    /// Every path the router serves as a fixed route.
    fixed: HashSet<String>,
    cors: Cors,
    metrics: Arc<RequestMetrics>,
}

struct Read {
    restlette: Arc<Restlette>,
    /// `P/{id}`: the route the metrics record it under, as the router would.
    pattern: Arc<str>,
}

/// A direct answer in progress.
pub(crate) type DirectFuture = BoxFuture<'static, Response>;

impl Direct {
    pub(crate) fn new(cors: Cors, metrics: Arc<RequestMetrics>) -> Self {
        Self {
            reads: HashMap::new(),
            fixed: HashSet::new(),
            cors,
            metrics,
        }
    }

    /// Answers `GET P/{id}` of `restlette` directly, and keeps its fixed routes routed.
    pub(crate) fn add_rest(&mut self, restlette: Arc<Restlette>) {
        let p = restlette.path.clone();
        // its list route is fixed too (a REST path may sit under another one)
        self.fixed.insert(p.clone());
        for name in meshql_rest::NOT_IDS {
            self.fixed.insert(format!("{p}/{name}"));
        }
        let pattern = Arc::from(format!("{p}/{{id}}"));
        self.reads.insert(p, Read { restlette, pattern });
    }

    /// A path the router serves as a fixed route (a GraphQL endpoint, the console).
    pub(crate) fn add_fixed(&mut self, path: &str) {
        self.fixed.insert(path.to_owned());
    }

    /// The answer to `request` when it is a read by id; otherwise the request, for the
    /// router.
    // the request goes back by value: the router takes it by value next
    #[allow(clippy::result_large_err)]
    pub(crate) fn answer<B: http_body::Body>(
        &self,
        request: Request<B>,
    ) -> Result<DirectFuture, Request<B>> {
        let Some((read, id)) = self.read_of(&request) else {
            return Err(request);
        };
        let restlette = read.restlette.clone();
        let pattern = read.pattern.clone();
        let id = id.to_owned();
        let metrics = self.metrics.clone();
        let cors = self.cors.clone();
        let (parts, _empty) = request.into_parts();
        Ok(Box::pin(async move {
            let response = timed(
                &metrics,
                Some(&pattern),
                &Method::GET,
                restlette.read_one(&id, &parts.headers),
            )
            .await;
            cors::finish(&cors, response, false).await
        }))
    }

    /// The restlette and id `request` reads, if it is a read by id the router would send
    /// to `P/{id}`.
    fn read_of<'r, B: http_body::Body>(&self, request: &'r Request<B>) -> Option<(&Read, &'r str)> {
        if request.method() != Method::GET || !request.body().is_end_stream() {
            return None;
        }
        let path = request.uri().path();
        let (p, id) = path.rsplit_once('/')?;
        if id.is_empty() || id.contains('%') || self.fixed.contains(path) {
            return None;
        }
        Some((self.reads.get(p)?, id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{header, HeaderValue, StatusCode};

    const CONFIG: &str = r#"
port = 0
[storage.m]
type = "memory"

[[entity]]
name = "farm"
storage = "m"
[entity.rest]
path = "/farm/api"
[entity.graphql]
path = "/farm/api/graph"
schema = "farm.graphql"
[[entity.graphql.singletons]]
name = "getById"
query = '{"id": "{{id}}"}'
"#;

    async fn app() -> (tempfile::TempDir, crate::App) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("meshql.toml"), CONFIG).unwrap();
        std::fs::write(
            dir.path().join("farm.graphql"),
            "type Query { getById(id: ID): Farm } type Farm { id: ID name: String }",
        )
        .unwrap();
        let mut config = meshql_config::load(dir.path()).expect("valid config");
        config.set_data_dir(dir.path().join("data"));
        let app = crate::build(&config).await.expect("builds");
        (dir, app)
    }

    fn get(path: &str) -> Request<Body> {
        Request::get(path).body(Body::empty()).unwrap()
    }

    /// Status, headers (but the date) and body, as the client receives them: hyper sends
    /// `Content-Length` from a body's exact size when the response has none (the router sets
    /// it itself).
    async fn parts(response: Response) -> (StatusCode, Vec<(String, String)>, String) {
        let (mut parts, body) = response.into_parts();
        if let Some(len) = http_body::Body::size_hint(&body).exact() {
            parts
                .headers
                .entry(header::CONTENT_LENGTH)
                .or_insert(HeaderValue::from(len));
        }
        let mut headers: Vec<(String, String)> = parts
            .headers
            .iter()
            .filter(|(name, _)| *name != header::DATE)
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        headers.sort();
        let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
        (
            parts.status,
            headers,
            String::from_utf8(body.to_vec()).unwrap(),
        )
    }

    async fn routed(app: &crate::App, request: Request<Body>) -> Response {
        use tower_service::Service;
        let mut router = app.router.clone();
        router.call(request).await.unwrap()
    }

    #[tokio::test]
    async fn a_direct_read_answers_what_the_router_answers() {
        let (_dir, app) = app().await;
        let direct = app.direct.clone().expect("reads by id are direct");
        let created = routed(
            &app,
            Request::post("/farm/api")
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(r#"{"name":"Emerdale"}"#))
                .unwrap(),
        )
        .await;
        assert_eq!(created.status(), StatusCode::CREATED);
        let (_, _, body) = parts(created).await;
        let id = serde_json::from_str::<serde_json::Value>(&body).unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let with_token = |path: &str, token: &str| {
            let mut r = get(path);
            r.headers_mut().insert(
                "x-meshql-consistency",
                HeaderValue::from_str(token).unwrap(),
            );
            r
        };
        let cases = [
            get(&format!("/farm/api/{id}")),
            get(&format!("/farm/api/{id}?at=1")),
            get("/farm/api/no-such-id"),
            with_token(&format!("/farm/api/{id}"), "not a token"),
        ];
        for request in cases {
            let described = format!("{} {:?}", request.uri(), request.headers());
            let copy = {
                let mut r = get(&request.uri().to_string());
                *r.headers_mut() = request.headers().clone();
                r
            };
            let Ok(answer) = direct.answer(request) else {
                panic!("{described} is a read by id")
            };
            let direct_parts = parts(answer.await).await;
            let routed_parts = parts(routed(&app, copy).await).await;
            assert_eq!(direct_parts, routed_parts, "{described}");
        }
        // the request metrics count both under the route's pattern
        let metrics = routed(&app, get("/metrics")).await;
        let (_, _, text) = parts(metrics).await;
        let found = text
            .lines()
            .find(|l| {
                l.starts_with("meshql_http_request_duration_seconds_count")
                    && l.contains(r#"route="/farm/api/{id}",method="GET",status="200""#)
            })
            .unwrap_or_else(|| panic!("no series for the read in\n{text}"));
        assert!(found.ends_with(" 4"), "{found}");
    }

    #[tokio::test]
    async fn what_the_router_serves_otherwise_is_routed() {
        let (_dir, app) = app().await;
        let direct = app.direct.clone().expect("reads by id are direct");
        let with_body = Request::get("/farm/api/x")
            .header(header::CONTENT_TYPE, "text/plain")
            .header(header::CONTENT_LENGTH, "2")
            .body(Body::from("hi"))
            .unwrap();
        let head = Request::head("/farm/api/x").body(Body::empty()).unwrap();
        for request in [
            get("/farm/api/bulk"),
            get("/farm/api/api-docs"),
            get("/farm/api/health"),
            get("/farm/api/ready"),
            get("/farm/api/graph"),
            get("/farm/api/"),
            get("/farm/api"),
            get("/farm/api/a%20b"),
            get("/farm/api/x/y"),
            get("/other/x"),
            get("/health"),
            with_body,
            head,
        ] {
            let described = format!("{} {}", request.method(), request.uri());
            assert!(direct.answer(request).is_err(), "{described} is routed");
        }
    }
}
