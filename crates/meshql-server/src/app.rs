//! Building a service from a resolved config.

use crate::assets;
use crate::backends;
use crate::changes_routes::{self, ChangesEndpoint};
use crate::cors::{cors, Cors};
use crate::direct::Direct;
use crate::graphql_routes::{self, GraphEndpoint};
use crate::ops::{self, Ops};
use crate::served::Served;
use axum::body::Bytes;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use meshql_auth::permissions::{CasbinPolicy, RolePolicy};
use meshql_auth::JwtAuthorizer;
use meshql_changes::{Hub, HubError, HubOptions};
use meshql_config::model::FsyncConfig;
use meshql_config::resolve::{AuthSpec, PermissionsSpec};
use meshql_config::{ChangesSpec, ResolvedConfig};
use meshql_core::{AllowAll, Authorizer, DynDatabase, DynStore, NoAuth, Policy, StoreError};
use meshql_engine::{EntityService, FallbackReader, PayloadValidator, ReplicaHealth};
use meshql_graphql::{Graphlette, Registry, RegistryError};
use meshql_log::{FsyncPolicy, Log, LogOptions, Retention};
use meshql_rest::{openapi_document, Restlette};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum BuildError {
    #[error("{}", .0.join("\n"))]
    Preflight(Vec<String>),
    /// (The store's error is part of the message, not a `source`: printed with its chain,
    /// it would be said twice.)
    #[error("entity \"{entity}\": storage: {error}")]
    Storage { entity: String, error: StoreError },
    #[error("entity \"{entity}\": JSON Schema {file}: {message}")]
    Schema {
        entity: String,
        file: String,
        message: String,
    },
    #[error("cors_origin `{0}` is not a valid header value")]
    Cors(String),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("change feed ({dir}): {message}")]
    Changes { dir: String, message: String },
    #[error("auth: {0}")]
    Auth(String),
}

/// A built service: its router and what must be closed on shutdown.
pub struct App {
    pub router: Router,
    pub registry: Arc<Registry>,
    stores: Vec<(String, DynStore)>,
    /// Every open database, each once.
    databases: Vec<DynDatabase>,
    hub: Option<Arc<Hub>>,
    /// Relays of the change feed to Kafka / NATS (stopped after the hub).
    relays: Arc<crate::relays::Relays>,
    /// Processors of the change feed (stopped after the hub, before the relays).
    processors: Arc<meshql_process::Processors>,
    /// Set when the server starts shutting down (ends change streams).
    pub(crate) closing: tokio::sync::watch::Sender<bool>,
    /// The replicas reads are routed over, by storage block (probes stop at shutdown).
    replicas: Vec<(String, Arc<ReplicaHealth>)>,
    /// REST reads by id and GraphQL POSTs answered without the router (`None`: every request
    /// is routed).
    pub(crate) direct: Option<Arc<Direct>>,
}

impl App {
    /// Stores by entity name.
    pub fn stores(&self) -> &[(String, DynStore)] {
        &self.stores
    }

    /// The change feed's hub, when the feed is on.
    pub fn hub(&self) -> Option<&Arc<Hub>> {
        self.hub.as_ref()
    }

    /// Copies the last changes into the log, then flushes and closes every storage backend.
    pub async fn shutdown(&self) {
        self.closing.send_replace(true);
        if let Some(hub) = &self.hub {
            hub.stop().await;
        }
        self.processors.stop().await;
        self.relays.stop().await;
        for (_, health) in &self.replicas {
            health.stop();
        }
        for db in &self.databases {
            db.close().await;
        }
        tracing::info!("storage flushed; bye");
    }
}

async fn not_found(uri: axum::http::Uri, method: axum::http::Method) -> Response {
    (
        StatusCode::NOT_FOUND,
        axum::Json(serde_json::json!({"error": format!("no route for {method} {}", uri.path())})),
    )
        .into_response()
}

/// Opens storage, prepares tables and indexes, and assembles every route.
pub async fn build(config: &ResolvedConfig) -> Result<App, BuildError> {
    let problems = crate::preflight(config);
    if !problems.is_empty() {
        return Err(BuildError::Preflight(problems));
    }
    let roles_claim = match &config.permissions {
        PermissionsSpec::Roles { roles_claim, .. } => roles_claim.as_deref(),
        _ => None,
    };
    let authorizer: Arc<dyn Authorizer> = match &config.auth {
        AuthSpec::None => Arc::new(NoAuth),
        AuthSpec::Jwt(jwt) => Arc::new(
            JwtAuthorizer::start(jwt, None)
                .await
                .map_err(BuildError::Auth)?
                .with_roles_claim(roles_claim),
        ),
        AuthSpec::Casbin { jwt, roles, .. } => Arc::new(
            JwtAuthorizer::start(
                jwt,
                Some(roles.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
            )
            .await
            .map_err(BuildError::Auth)?,
        ),
    };

    let policy = permission_policy(config).await?;
    let role = config.role;

    // backends size what they keep per serving thread by this (PostgreSQL's pools)
    meshql_core::serving::plan(config.server.serve_threads);
    // storage: one database per target (file, server), one store per entity
    let mut databases: HashMap<String, DynDatabase> = HashMap::new();
    let mut stores: Vec<(String, DynStore)> = Vec::new();
    // stores whose reads are a materialisation of a log: responses say how far behind it
    let mut log_stores: Vec<DynStore> = Vec::new();
    // the entities whose storage has a read replica: the engine serves their reads there
    // while the replica is reachable, close enough and not saturated (one health per database)
    let mut replicas: HashMap<String, (meshql_core::DynReader, Arc<ReplicaHealth>)> =
        HashMap::new();
    let mut healths: HashMap<String, Arc<ReplicaHealth>> = HashMap::new();
    let mut replica_healths: Vec<(String, Arc<ReplicaHealth>)> = Vec::new();
    // targets found unreachable at start-up: their other entities skip the attempt (each
    // would wait out the driver's timeout again) and start deferred straight away
    let mut unreachable: HashMap<String, StoreError> = HashMap::new();
    let targets = backends::configure(config)
        .map_err(|errors| BuildError::Preflight(errors.iter().map(|e| e.to_string()).collect()))?;
    for entity in &config.entities {
        let target = &targets[&entity.storage];
        let server = target.target();
        let db = match databases.get(&server) {
            Some(db) => db.clone(),
            None => {
                let db = target.open().await.map_err(|error| BuildError::Storage {
                    entity: entity.name.clone(),
                    error,
                })?;
                databases.insert(server.clone(), db.clone());
                db
            }
        };
        let store = db.clone().store(&entity.table);
        // the write role reads the primary only: no replica, no probe
        if role.reads() {
            if let Some(replica) = db.clone().replica(&entity.table) {
                let health = match healths.get(&server) {
                    Some(h) => Some(h.clone()),
                    None => db.clone().replica_probe().map(|probe| {
                        let health = ReplicaHealth::new(&entity.storage, probe);
                        health.start();
                        healths.insert(server.clone(), health.clone());
                        replica_healths.push((entity.storage.clone(), health.clone()));
                        health
                    }),
                };
                match health {
                    Some(h) => {
                        replicas.insert(entity.name.clone(), (replica, h));
                    }
                    None => tracing::warn!(
                        entity = %entity.name,
                        "the storage's replica cannot be probed: its reads stay on the primary"
                    ),
                }
            }
        }
        let templates: Vec<_> = entity
            .graph
            .iter()
            .flat_map(|g| g.queries.iter().map(|q| q.template.clone()))
            .collect();
        let prepared = match unreachable.get(&server) {
            Some(e) => Err(e.clone()),
            None => store.prepare(&templates).await,
        };
        let store: DynStore = match prepared {
            Ok(()) => Served::ready(&entity.name, store),
            Err(e @ StoreError::Unavailable(_)) => {
                unreachable.insert(server, e.clone());
                tracing::error!(
                    entity = %entity.name,
                    error = %e,
                    "storage unreachable at start-up: serving 503 for this entity and retrying every second"
                );
                Served::deferred(&entity.name, store, templates, e, Duration::from_secs(1))
            }
            Err(error) => {
                return Err(BuildError::Storage {
                    entity: entity.name.clone(),
                    error,
                })
            }
        };
        if db.backend() == "kafka" {
            log_stores.push(store.clone());
        }
        stores.push((entity.name.clone(), store));
    }
    let store_of = |name: &str| -> DynStore {
        stores
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| s.clone())
            .expect("every entity has a store")
    };

    // the engine: one service per entity, which every frontend goes through; one record of
    // acknowledged writes for all of them (what read snapshots cover)
    let acknowledged = Arc::new(meshql_core::time::Acknowledged::new());
    // the read cache, in front of each entity's reader (the primary or its replica)
    let cache = crate::caches::build(config).await?;
    let mut services: HashMap<String, Arc<EntityService>> = HashMap::new();
    for entity in &config.entities {
        let validator = match &entity.rest {
            Some(rest) => rest
                .schema
                .as_ref()
                .map(|s| {
                    PayloadValidator::new(s).map_err(|e| BuildError::Schema {
                        entity: entity.name.clone(),
                        file: rest
                            .schema_file
                            .as_ref()
                            .map(|p| p.display().to_string())
                            .unwrap_or_default(),
                        message: e.0,
                    })
                })
                .transpose()?,
            None => None,
        };
        let mut service = EntityService::new(
            &entity.name,
            store_of(&entity.name),
            validator,
            entity.tokens.clone(),
            authorizer.clone(),
        )
        .with_policy(policy.clone())
        .with_acknowledged(acknowledged.clone());
        if let Some((replica, health)) = replicas.remove(&entity.name) {
            service = service.with_reader(Arc::new(FallbackReader::new(
                replica,
                store_of(&entity.name),
                health,
            )));
        }
        if let Some(cache) = &cache {
            service = service.with_cache(cache.clone());
        }
        services.insert(entity.name.clone(), Arc::new(service));
    }

    // read-your-writes: a read carrying the token of a write its replica has not applied yet
    // reads the primary (after a bounded wait); only entities with a replica are checked
    let read_after = Arc::new(meshql_engine::ReadAfter::new(
        services.clone(),
        Duration::from_millis(config.server.read_your_writes_wait_ms),
    ));

    // graphlettes (the write role serves none)
    let mut graphlettes = Vec::new();
    for entity in config.entities.iter().filter(|_| role.reads()) {
        if let Some(g) = &entity.graph {
            graphlettes.push(Graphlette::new(
                &entity.name,
                g,
                services[&entity.name].clone(),
            ));
        }
    }
    let registry = Arc::new(
        Registry::new(
            graphlettes,
            Duration::from_millis(config.http_client.connect_timeout_ms),
            Duration::from_millis(config.http_client.request_timeout_ms),
        )?
        .with_limits(config.graphql),
    );

    // subscriptions: the hub starts once the change log is open (below)
    let subscriptions = Arc::new(std::sync::OnceLock::new());
    let mut router = Router::new();
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
            restlettes.push(restlette.clone());
            router = router.merge(meshql_rest::router(restlette));
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
            });
            graphs.push((g.path.clone(), endpoint.clone()));
            router = router.merge(graphql_routes::router(&g.path, endpoint));
        }
    }

    // the change feed: every store's feed copied into the log, served at /_changes
    let (closing, closing_rx) = tokio::sync::watch::channel(false);
    let hub = if config.changes.config.enabled {
        let log = open_log(&config.changes)?;
        let options = HubOptions {
            listeners: crate::caches::listeners(cache.as_ref()),
            ..HubOptions::default()
        };
        let hub = Hub::start(log.clone(), stores.clone(), options).map_err(|e: HubError| {
            BuildError::Changes {
                dir: config.changes.dir.display().to_string(),
                message: e.to_string(),
            }
        })?;
        let endpoint = Arc::new(ChangesEndpoint::new(
            log.clone(),
            config
                .entities
                .iter()
                .map(|e| services[&e.name].clone())
                .collect(),
            closing_rx.clone(),
        ));
        router = router.route(
            "/_changes",
            get(changes_routes::changes).with_state(endpoint),
        );
        if role.reads() {
            let _ = subscriptions.set(crate::subscriptions::Subscriptions::start(
                log.clone(),
                registry.clone(),
                config.server.max_subscriptions,
                closing_rx.clone(),
            ));
        }
        Some(Arc::new(hub))
    } else {
        router = router.route("/_changes", get(changes_routes::disabled));
        None
    };
    let relays = crate::relays::start(config, hub.as_deref()).await?;
    let processors = Arc::new(match &hub {
        Some(hub) => {
            crate::processors::start(
                config,
                Arc::new(hub.log().clone()),
                &services,
                meshql_process::StartOptions::default(),
            )
            .await?
        }
        None => meshql_process::Processors::default(),
    });
    processors.rebuild_if_log_replaced();

    let mut storages: Vec<(String, DynStore)> = Vec::new();
    for entity in &config.entities {
        if !storages.iter().any(|(s, _)| *s == entity.storage) {
            storages.push((entity.storage.clone(), store_of(&entity.name)));
        }
    }
    let requests = Arc::new(crate::request_metrics::RequestMetrics::default());
    let ops = Arc::new(Ops {
        role,
        replicas: replica_healths.clone(),
        stores: stores.clone(),
        storages,
        hub: hub.clone(),
        relays: relays.clone(),
        processors: processors.clone(),
        requests: requests.clone(),
        subscriptions: subscriptions.clone(),
        cache: cache.clone(),
    });
    let ops_router = Router::new()
        .route("/health", get(ops::health))
        .route("/ready", get(ops::ready))
        .route("/metrics", get(ops::metrics))
        .with_state(ops);
    let origin = HeaderValue::from_str(&config.cors_origin)
        .map_err(|_| BuildError::Cors(config.cors_origin.clone()))?;
    router = router.merge(crate::processors::router(Arc::new(
        crate::processors::ProcessorsEndpoint {
            processors: processors.clone(),
            services: services.clone(),
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
        for restlette in restlettes {
            direct.add_rest(restlette);
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
        stores,
        databases: databases.into_values().collect(),
        hub,
        relays,
        processors,
        closing,
        replicas: replica_healths,
        direct,
    })
}

/// The policy deciding what callers may do (`AllowAll` without permissions).
async fn permission_policy(config: &ResolvedConfig) -> Result<Arc<dyn Policy>, BuildError> {
    Ok(match &config.permissions {
        PermissionsSpec::None => Arc::new(AllowAll::default()),
        PermissionsSpec::Roles { tables, .. } => Arc::new(RolePolicy::new(tables.clone())),
        PermissionsSpec::Casbin {
            enforce: false,
            masks,
            ..
        } if masks.is_empty() => Arc::new(AllowAll::default()),
        PermissionsSpec::Casbin {
            model,
            policy,
            enforce,
            masks,
        } => Arc::new(
            CasbinPolicy::new(
                model,
                policy,
                config.entities.iter().map(|e| e.name.clone()).collect(),
                masks.clone(),
            )
            .await
            .map_err(BuildError::Auth)?
            .enforcing(*enforce),
        ),
    })
}

/// Opens the change log as the config says.
fn open_log(spec: &ChangesSpec) -> Result<Log, BuildError> {
    let c = &spec.config;
    let options = LogOptions {
        segment_bytes: c.segment_bytes.max(1 << 20),
        fsync: match c.fsync {
            FsyncConfig::Always => FsyncPolicy::Always,
            FsyncConfig::Interval => {
                FsyncPolicy::Interval(Duration::from_millis(c.fsync_interval_ms.max(1)))
            }
            FsyncConfig::Never => FsyncPolicy::Never,
        },
        retention: Retention {
            max_bytes: (c.retention_bytes > 0).then_some(c.retention_bytes),
            max_age: (c.retention_hours > 0).then(|| Duration::from_secs(c.retention_hours * 3600)),
        },
    };
    Log::open(&spec.dir, options).map_err(|e| BuildError::Changes {
        dir: spec.dir.display().to_string(),
        message: match e.kind() {
            meshql_log::ErrorKind::Locked => format!(
                "{e}: another meshql process serves this data directory (give each its own \
                 data_dir, or set [changes] enabled = false)"
            ),
            _ => e.to_string(),
        },
    })
}
