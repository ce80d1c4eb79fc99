//! Reads by id and GraphQL POSTs answered without the router.
//!
//! `GET P/{id}` of a REST path and `POST` to a GraphQL path are the hottest requests a data
//! service gets. Through axum they pay for the router's clone, its path match, the
//! matched-path extension, two `from_fn` layers (each boxing a future and cloning the next
//! service) and the boxed handler: on the memory backend about a fifth of a read by id's time
//! (docs/BENCHMARKS.md, "Reads by id and GraphQL POSTs without the router").
//!
//! Here the request line is matched against two tables instead, and the answer comes from
//! the same code the router would run: [`Restlette::read_one`] and
//! [`GraphEndpoint::answer_post`] for the handlers (a GraphQL body read within the same
//! limit), [`timed`] for the request metrics and [`cors::finish`] for the CORS edge.
//! Anything else goes to the router, and so does every request the router could answer
//! differently:
//!
//! - another method, a `GET` with a body, or a `POST` whose body the CORS edge refuses (not
//!   declared JSON);
//! - a path the router serves as a fixed route (`P/bulk`, `P/api-docs`, `P/health`,
//!   `P/ready`, a GraphQL path or the console under a REST path): fixed routes win over
//!   `P/{id}` there;
//! - an id with a percent sign (the router decodes it) or an empty one (`P/` is the list).
//!
//! Servers whose responses carry a log-behind header (a Kafka store) route every request.
//! With `[server.rate_limit]`, a read by id takes its token here as the router's gate would
//! (a GraphQL POST takes it in [`GraphEndpoint::answer_post`], either way).

use crate::cors::{self, Cors};
use crate::graphql_routes::{BodyError, GraphEndpoint};
use crate::rate_limit::{caller_from, rest_refusal, RestLimit};
use crate::request_metrics::{timed, RequestMetrics};
use axum::http::{Method, Request};
use axum::response::Response;
use bytes::Bytes;
use futures::future::BoxFuture;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use meshql_rest::Restlette;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The requests a server answers without its router.
pub(crate) struct Direct {
    /// By REST path.
    reads: HashMap<String, Read>,
    /// By GraphQL path.
    graphs: HashMap<String, Arc<GraphEndpoint>>,
    /// Every path the router serves as a fixed route.
    fixed: HashSet<String>,
    cors: Cors,
    metrics: Arc<RequestMetrics>,
}

struct Read {
    restlette: Arc<Restlette>,
    /// `P/{id}`: the route the metrics record it under, as the router would.
    pattern: Arc<str>,
    /// `[server.rate_limit]` reads, as the router's gate counts them.
    limit: Option<RestLimit>,
}

/// A direct answer in progress.
pub(crate) type DirectFuture = BoxFuture<'static, Response>;

impl Direct {
    pub(crate) fn new(cors: Cors, metrics: Arc<RequestMetrics>) -> Self {
        Self {
            reads: HashMap::new(),
            graphs: HashMap::new(),
            fixed: HashSet::new(),
            cors,
            metrics,
        }
    }

    /// Answers `GET P/{id}` of `restlette` directly (through `limit` when reads are
    /// limited), and keeps its fixed routes routed.
    pub(crate) fn add_rest(&mut self, restlette: Arc<Restlette>, limit: Option<RestLimit>) {
        let p = restlette.path.clone();
        // its list route is fixed too (a REST path may sit under another one)
        self.fixed.insert(p.clone());
        for name in meshql_rest::NOT_IDS {
            self.fixed.insert(format!("{p}/{name}"));
        }
        let pattern = Arc::from(format!("{p}/{{id}}"));
        self.reads.insert(
            p,
            Read {
                restlette,
                pattern,
                limit,
            },
        );
    }

    /// Answers `POST` to the GraphQL `path` directly (a fixed route for REST reads).
    pub(crate) fn add_graph(&mut self, path: &str, endpoint: Arc<GraphEndpoint>) {
        self.fixed.insert(path.to_owned());
        self.graphs.insert(path.to_owned(), endpoint);
    }

    /// A path the router serves as a fixed route (the console).
    pub(crate) fn add_fixed(&mut self, path: &str) {
        self.fixed.insert(path.to_owned());
    }

    /// The answer to `request` when it is a read by id or a GraphQL POST; otherwise the
    /// request, for the router. `client` is the connection's address when rates are limited
    /// (given here, not as a request extension: inserting one allocates on every request).
    // the request goes back by value: the router takes it by value next
    #[allow(clippy::result_large_err)]
    pub(crate) fn answer<B>(
        &self,
        request: Request<B>,
        client: Option<std::net::IpAddr>,
    ) -> Result<DirectFuture, Request<B>>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        if request.method() == Method::GET {
            let Some((read, id)) = self.read_of(&request) else {
                return Err(request);
            };
            let restlette = read.restlette.clone();
            let pattern = read.pattern.clone();
            let id = id.to_owned();
            let metrics = self.metrics.clone();
            let cors = self.cors.clone();
            let (parts, _empty) = request.into_parts();
            let Some(limit) = read.limit.clone() else {
                return Ok(Box::pin(async move {
                    let read = restlette.read_one(&id, parts.uri.query(), &parts.headers);
                    let response = timed(&metrics, Some(&pattern), &Method::GET, read).await;
                    cors::finish(&cors, response, false).await
                }));
            };
            return Ok(Box::pin(async move {
                let read = async {
                    let caller = caller_from(&limit.limiter, &parts.headers, client);
                    match limit.admit_read(&caller).await {
                        Ok(()) => {
                            restlette
                                .read_one(&id, parts.uri.query(), &parts.headers)
                                .await
                        }
                        Err(refusal) => rest_refusal(&refusal),
                    }
                };
                let response = timed(&metrics, Some(&pattern), &Method::GET, read).await;
                cors::finish(&cors, response, false).await
            }));
        }
        if request.method() != Method::POST {
            return Err(request);
        }
        // the path first: a POST elsewhere (a REST write) pays no header checks here
        let Some((path, endpoint)) = self.graphs.get_key_value(request.uri().path()) else {
            return Err(request);
        };
        if self.cors.refuses(request.headers()) {
            return Err(request);
        }
        let endpoint = endpoint.clone();
        let path = path.clone();
        let metrics = self.metrics.clone();
        let cors = self.cors.clone();
        let (parts, body) = request.into_parts();
        Ok(Box::pin(async move {
            let post = async {
                let body = read_body(body, endpoint.body_limit).await;
                endpoint.answer_post(&parts.headers, client, body).await
            };
            let response = timed(&metrics, Some(&path), &Method::POST, post).await;
            cors::finish(&cors, response, false).await
        }))
    }

    /// The restlette and id a `GET` reads, if the router would send it to `P/{id}`.
    fn read_of<'r, B: http_body::Body>(&self, request: &'r Request<B>) -> Option<(&Read, &'r str)> {
        if !request.body().is_end_stream() {
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

/// The whole body, up to `limit` bytes (as the router's body limit reads it).
async fn read_body<B>(body: B, limit: usize) -> Result<Bytes, BodyError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(BodyError::TooLarge),
        Err(e) => Err(BodyError::Unreadable(format!(
            "Failed to buffer the request body: {e}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{header, HeaderValue, StatusCode};

    const CONFIG: &str = r#"
port = 0
body_limit_bytes = 1024
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
        let registries = meshql_runtime::Registries {
            storage: meshql_core::BackendRegistry::new()
                .register(meshql_store_memory::MemoryBackend),
            ..Default::default()
        };
        let app = crate::build(&config, &registries).await.expect("builds");
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

    /// Every part writes its own series into the runtime's registry; the exposition keeps
    /// the families and their order of the server that wrote them all itself (the list was
    /// taken from that server's `/metrics` for this config).
    #[tokio::test]
    async fn metrics_keep_their_families_and_order() {
        let (_dir, app) = app().await;
        let response = routed(&app, get("/metrics")).await;
        assert_eq!(response.status(), StatusCode::OK);
        let (_, _, body) = parts(response).await;
        let families: Vec<&str> = body
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        assert_eq!(
            families,
            [
                "meshql_role",
                "meshql_storage_reads_total",
                "meshql_storage_writes_total",
                "meshql_storage_commits_total",
                "meshql_storage_read_connections",
                "meshql_storage_connections_in_use",
                "meshql_storage_log_behind_milliseconds",
                "meshql_storage_log_records_behind",
                "meshql_storage_log_skipped_records_total",
                "meshql_storage_log_reachable",
                "meshql_changes_copied_total",
                "meshql_changes_copy_errors_total",
                "meshql_changes_log_last_position",
                "meshql_changes_log_first_position",
                "meshql_subscriptions",
                "meshql_subscriptions_max",
                "meshql_subscriptions_refused_total",
                "meshql_subscription_cohorts",
                "meshql_subscription_events_total",
                "meshql_subscription_dropped_total",
                "meshql_subscription_position",
                // added with backups (after the list was taken)
                "meshql_backups_total",
                "meshql_backup_uploads_total",
                "meshql_http_connections_open",
                "meshql_http_connections_max",
                "meshql_http_connections_accepted_total",
                "meshql_http_accept_waits_total",
                "meshql_http_tls_handshake_failures_total",
                "meshql_http_connections_timed_out_total",
                "meshql_http_request_duration_seconds",
            ]
        );
        app.shutdown().await;
    }

    #[tokio::test]
    async fn a_direct_answer_is_what_the_router_answers() {
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
        let graphql = |body: String| {
            Request::post("/farm/api/graph")
                .header(header::CONTENT_TYPE, "application/json")
                .body(body)
                .unwrap()
        };
        let query = |q: &str| graphql(serde_json::json!({ "query": q }).to_string());
        let cases = [
            get(&format!("/farm/api/{id}")).map(|_| String::new()),
            // as of a moment (the year 2100), of 1970 (a 404 with a hint), a parameter the
            // read does not take (400)
            get(&format!("/farm/api/{id}?at=4102444800000")).map(|_| String::new()),
            get(&format!("/farm/api/{id}?at=1")).map(|_| String::new()),
            get(&format!("/farm/api/{id}?lmit=1")).map(|_| String::new()),
            get("/farm/api/no-such-id").map(|_| String::new()),
            with_token(&format!("/farm/api/{id}"), "not a token").map(|_| String::new()),
            query(&format!(r#"{{ getById(id: "{id}") {{ id name }} }}"#)),
            query("{ getById(id: \"nope\") { name } }"),
            query("{ nonsense }"),
            graphql("not json".to_owned()),
            graphql(format!(r#"{{"query": "{}"}}"#, " ".repeat(2000))),
        ];
        for request in cases {
            let described = format!(
                "{} {} {:?}",
                request.method(),
                request.uri(),
                request.body()
            );
            let copy = {
                let mut r = Request::new(Body::from(request.body().clone()));
                *r.method_mut() = request.method().clone();
                *r.uri_mut() = request.uri().clone();
                *r.headers_mut() = request.headers().clone();
                r
            };
            let request = request.map(Body::from);
            let Ok(answer) = direct.answer(request, None) else {
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
        assert!(text.contains(r#"route="/farm/api/graph",method="POST",status="413""#));
    }

    /// A GraphQL body the connection fails in the middle of: the same 400 and message both
    /// ways.
    #[tokio::test]
    async fn a_body_cut_off_midway_is_answered_as_the_router_answers_it() {
        let (_dir, app) = app().await;
        let direct = app.direct.clone().expect("GraphQL POSTs are direct");
        let cut_off = || {
            let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
                Ok(Bytes::from_static(br#"{"query": "{ getBy"#)),
                Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "connection reset by peer",
                )),
            ];
            Request::post("/farm/api/graph")
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from_stream(futures::stream::iter(chunks)))
                .unwrap()
        };
        let Ok(answer) = direct.answer(cut_off(), None) else {
            panic!("a GraphQL POST is direct")
        };
        let direct_parts = parts(answer.await).await;
        let routed_parts = parts(routed(&app, cut_off()).await).await;
        assert_eq!(direct_parts.0, StatusCode::BAD_REQUEST);
        assert!(
            direct_parts.2.contains("connection reset by peer"),
            "{}",
            direct_parts.2
        );
        assert_eq!(direct_parts, routed_parts);
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
        let not_json = Request::post("/farm/api/graph")
            .header(header::CONTENT_TYPE, "text/plain")
            .header(header::CONTENT_LENGTH, "2")
            .body(Body::from("{}"))
            .unwrap();
        let graph_get = get("/farm/api/graph?query=%7B__typename%7D");
        let rest_post = Request::post("/farm/api")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from("{}"))
            .unwrap();
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
            not_json,
            graph_get,
            rest_post,
        ] {
            let described = format!("{} {}", request.method(), request.uri());
            assert!(
                direct.answer(request, None).is_err(),
                "{described} is routed"
            );
        }
    }
}
