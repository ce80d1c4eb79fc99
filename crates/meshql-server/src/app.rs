//! The HTTP side of a service: every route over a built [`Runtime`] — REST and GraphQL per
//! entity, `/_changes`, the console, processors, health, readiness and metrics — with the
//! edge (CORS, timing, the log-behind header) and the direct path for reads by id.

use crate::assets;
use crate::changes_routes::{self, ChangesEndpoint};
use crate::cors::{cors, Cors};
use crate::direct::Direct;
use crate::graphql_routes::{self, GraphEndpoint};
use crate::ops::{self, Ops};
use crate::persisted_queries::PersistedQueries;
use crate::rate_limit::{limit_rest, RateLimiter, RestLimit};
use axum::body::Bytes;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use meshql_config::ResolvedConfig;
use meshql_graphql::Registry;
use meshql_rest::{openapi_document, Restlette};
use meshql_runtime::{Registries, Runtime};
use std::sync::Arc;
use thiserror::Error;

/// Why a service could not be built: the runtime's reasons, or the server's own checks.
#[derive(Debug, Error)]
pub enum BuildError {
    #[error(transparent)]
    Runtime(#[from] meshql_runtime::BuildError),
    #[error("{}", .0.join("\n"))]
    Preflight(Vec<String>),
    #[error("cors_origin `{0}` is not a valid header value")]
    Cors(String),
}

/// A built service: its router and the runtime it serves.
pub struct App {
    pub router: Router,
    pub registry: Arc<Registry>,
    runtime: Arc<Runtime>,
    /// REST reads by id and GraphQL POSTs answered without the router (`None`: every request
    /// is routed).
    pub(crate) direct: Option<Arc<Direct>>,
    /// `[server.rate_limit]` is on: the listener tags each request with its client's address.
    pub(crate) limits_rates: bool,
}

impl App {
    /// The service graph behind the routes.
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    /// Stores by entity name.
    pub fn stores(&self) -> &[(String, meshql_core::DynStore)] {
        self.runtime.stores()
    }

    /// The change feed's hub, when the feed is on.
    pub fn hub(&self) -> Option<&Arc<meshql_changes::Hub>> {
        self.runtime.hub()
    }

    /// Copies the last changes into the log, then flushes and closes every storage backend.
    pub async fn shutdown(&self) {
        self.runtime.shutdown().await;
    }
}

async fn not_found(uri: axum::http::Uri, method: axum::http::Method) -> Response {
    (
        StatusCode::NOT_FOUND,
        axum::Json(serde_json::json!({"error": format!("no route for {method} {}", uri.path())})),
    )
        .into_response()
}

/// The server's checks, then the runtime's: every problem found, as messages naming the
/// file and the field (what `meshql check` prints).
pub fn preflight(config: &ResolvedConfig, registries: &Registries) -> Vec<String> {
    let mut problems = Vec::new();
    if HeaderValue::from_str(&config.cors_origin).is_err() {
        problems.push(format!(
            "{}: cors_origin: `{}` is not a valid header value",
            config.file.display(),
            config.cors_origin
        ));
    }
    if let Some(tls) = &config.server.tls {
        // the files are PEM (checked with the config); the key must match the certificate
        if let Err(e) = crate::tls::load_pair(tls) {
            problems.push(format!("{}: server.tls: {e}", config.file.display()));
        }
    }
    problems.extend(meshql_runtime::check(config, registries));
    problems
}

/// Checks the config, builds its runtime (storage opened, tables and indexes prepared, the
/// feed and its consumers started) and assembles every route over it.
pub async fn build(config: &ResolvedConfig, registries: &Registries) -> Result<App, BuildError> {
    let problems = preflight(config, registries);
    if !problems.is_empty() {
        return Err(BuildError::Preflight(problems));
    }
    let runtime = Runtime::build(config, registries).await?;
    App::new(config, runtime)
}

impl App {
    /// Every route over `runtime`.
    pub fn new(config: &ResolvedConfig, runtime: Runtime) -> Result<App, BuildError> {
        let runtime = Arc::new(runtime);
        let role = runtime.role();
        let services = runtime.services().clone();
        let registry = runtime.graphql().clone();
        let read_after = runtime.read_after().clone();
        let subscriptions = Arc::new(std::sync::OnceLock::new());
        if let Some(s) = runtime.subscriptions() {
            let _ = subscriptions.set(s.clone());
        }
        let mut router = Router::new();
        // `[server.rate_limit]`: callers known by the subject of a token the service's own
        // authorizer accepts (every entity service shares it)
        let limiter = config.server.rate_limit.as_ref().map(|spec| {
            let authorizer = services
                .values()
                .next()
                .map(|s| s.authorizer().clone())
                .unwrap_or_else(|| Arc::new(meshql_core::NoAuth));
            Arc::new(RateLimiter::new(
                spec,
                authorizer,
                runtime.shared_limiter().cloned(),
            ))
        });
        let persisted = Arc::new(PersistedQueries::new(&config.server.persisted_queries));
        // what reads by id and GraphQL POSTs skip the router for, and the fixed routes that stay
        // routed
        let mut restlettes = Vec::new();
        let mut graphs = Vec::new();
        let mut fixed_paths = Vec::new();
        for entity in &config.entities {
            if let Some(rest) = &entity.rest {
                let see_other = config.write_response == meshql_config::WriteResponse::SeeOther;
                let mut openapi =
                    openapi_document(&rest.path, &entity.name, rest.schema.as_ref(), see_other);
                if !role.writes() {
                    openapi = meshql_rest::read_only_openapi(openapi);
                }
                let restlette = Arc::new(Restlette {
                    path: rest.path.clone(),
                    service: services[&entity.name].clone(),
                    openapi: Bytes::from(serde_json::to_vec(&openapi).expect("JSON serialises")),
                    docs_page: Some(Bytes::from(assets::swagger_page(
                        &format!("{} API", rest.path),
                        &format!("{}/api-docs/swagger.json", rest.path),
                    ))),
                    body_limit: config.body_limit_bytes,
                    see_other,
                    read_only: !role.writes(),
                    read_after: Some(read_after.clone()),
                });
                let limit = limiter
                    .as_ref()
                    .map(|l| RestLimit::new(l.clone(), &rest.path));
                let routes = meshql_rest::router(restlette.clone());
                router = router.merge(match &limit {
                    Some(limit) => routes.layer(axum::middleware::from_fn_with_state(
                        limit.clone(),
                        limit_rest,
                    )),
                    None => routes,
                });
                restlettes.push((restlette, limit));
            }
            if let Some(g) = entity.graph.as_ref().filter(|_| role.reads()) {
                let (index, _) = registry
                    .by_path(&g.path)
                    .expect("graphlettes were registered above");
                let endpoint = Arc::new(GraphEndpoint {
                    registry: registry.clone(),
                    index,
                    service: services[&entity.name].clone(),
                    page: Bytes::from(assets::graphiql_page(
                        &g.path,
                        &g.path,
                        crate::console::example_query(entity).as_deref(),
                    )),
                    body_limit: config.body_limit_bytes,
                    subscriptions: subscriptions.clone(),
                    read_after: Some(read_after.clone()),
                    limiter: limiter.clone(),
                    persisted: persisted.clone(),
                });
                graphs.push((g.path.clone(), endpoint.clone()));
                router = router.merge(graphql_routes::router(&g.path, endpoint));
            }
        }

        // the change feed, served at /_changes
        match runtime.hub() {
            Some(hub) => {
                let endpoint = Arc::new(ChangesEndpoint::new(
                    hub.log().clone(),
                    config
                        .entities
                        .iter()
                        .map(|e| services[&e.name].clone())
                        .collect(),
                    runtime.closing(),
                ));
                router = router.route(
                    "/_changes",
                    get(changes_routes::changes).with_state(endpoint),
                );
            }
            None => router = router.route("/_changes", get(changes_routes::disabled)),
        }
        let processors = runtime.processors().clone();
        let log_stores = runtime.log_stores().to_vec();
        let requests = Arc::new(crate::request_metrics::RequestMetrics::default());
        // the server's own series follow the runtime's
        let metrics = runtime.metrics().clone();
        metrics.register(Arc::new(crate::connection::ConnectionMetrics));
        metrics.register(requests.clone());
        if let Some(limiter) = &limiter {
            metrics.register(limiter.clone());
        }
        let ops = Arc::new(Ops {
            stores: runtime.stores().to_vec(),
            metrics,
        });
        let ops_router = Router::new()
            .route("/health", get(ops::health))
            .route("/ready", get(ops::ready))
            .route("/metrics", get(ops::metrics))
            .with_state(ops);
        let origin = HeaderValue::from_str(&config.cors_origin)
            .map_err(|_| BuildError::Cors(config.cors_origin.clone()))?;
        router = router.merge(crate::processors_routes::router(Arc::new(
            crate::processors_routes::ProcessorsEndpoint {
                processors: processors.clone(),
                services: services.clone(),
            },
        )));
        router = router.merge(crate::backup_routes::router(Arc::new(
            crate::backup_routes::BackupEndpoint {
                runtime: runtime.clone(),
                services: services.clone(),
                config_file: config.file.display().to_string(),
                data_dir: config.data_dir.display().to_string(),
                validators: Arc::new(
                    meshql_runtime::import::Importer::validators(config)
                        .map_err(|e| BuildError::Preflight(vec![e]))?,
                ),
            },
        )));
        if config.console.enabled && role.reads() {
            let console = Arc::new(crate::console::Console::new(
                config,
                &services,
                processors.clone(),
            ));
            fixed_paths.push(config.console.path.clone());
            router = router.merge(crate::console::router(console));
        }
        let router = router
            .merge(ops_router)
            .route(
                &format!("{}/{{file}}", assets::PREFIX),
                get(assets::serve_asset),
            )
            // every matched route, timed under its pattern (`route_layer`: MatchedPath is known)
            .route_layer(axum::middleware::from_fn_with_state(
                requests.clone(),
                crate::request_metrics::measure,
            ))
            .fallback(not_found);
        let edge = Cors {
            origin,
            require_json: config.require_json_content_type,
        };
        // the log-behind header is the router's alone: with it, every request is routed
        let direct = log_stores.is_empty().then(|| {
            let mut direct = Direct::new(edge.clone(), requests);
            for (restlette, limit) in restlettes {
                direct.add_rest(restlette, limit);
            }
            for (path, endpoint) in graphs {
                direct.add_graph(&path, endpoint);
            }
            for path in &fixed_paths {
                direct.add_fixed(path);
            }
            Arc::new(direct)
        });
        let router = if log_stores.is_empty() {
            router
        } else {
            router.layer(axum::middleware::from_fn_with_state(
                crate::log_behind::LogBehind::new(log_stores),
                crate::log_behind::header,
            ))
        };
        let router = router.layer(axum::middleware::from_fn_with_state(edge, cors));

        Ok(App {
            router,
            registry,
            runtime,
            direct,
            limits_rates: limiter.is_some(),
        })
    }
}
