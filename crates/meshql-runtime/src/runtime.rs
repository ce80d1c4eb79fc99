//! The service graph of a config: storage opened and served, the engine's services, the
//! GraphQL registry, the change feed's hub, subscriptions, relays and processors — built in
//! the order each depends on the last, and stopped in the reverse.
//!
//! ```text
//! check ─▶ auth, policy ─▶ storage (a database per target, a served store per entity,
//!          replica probes) ─▶ cache, rate-limit store ─▶ entity services ─▶ GraphQL registry
//!       ─▶ change log + hub ─▶ subscriptions ─▶ relays ─▶ processors
//! ```
//!
//! The first part that fails stops the build with its error; a storage server that is down is
//! not a failure (its entities answer 503 and are retried every second).

use crate::error::BuildError;
use crate::served::Served;
use crate::subscriptions::Subscriptions;
use crate::Registries;
use meshql_changes::{Hub, HubError, HubOptions};
use meshql_config::{ResolvedConfig, Role};
use meshql_core::metrics::Metrics;
use meshql_core::{DynDatabase, DynReader, DynStore, SharedLimiter, StoreError};
use meshql_engine::{EntityService, FallbackReader, PayloadValidator, ReadAfter, ReplicaHealth};
use meshql_graphql::{Graphlette, GraphletteSpec, Registry};
use meshql_process::Processors;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// A running service graph.
pub struct Runtime {
    role: Role,
    /// Every entity's engine service, which every frontend goes through.
    services: HashMap<String, Arc<EntityService>>,
    /// Served stores by entity, in config order.
    stores: Vec<(String, DynStore)>,
    /// Stores whose reads are a materialisation of a log (responses say how far behind).
    log_stores: Vec<DynStore>,
    /// Every open database, each once.
    databases: Vec<DynDatabase>,
    /// The replicas reads are routed over, by storage block (probes stop at shutdown).
    replicas: Vec<(String, Arc<ReplicaHealth>)>,
    read_after: Arc<ReadAfter>,
    graphql: Arc<Registry>,
    hub: Option<Arc<Hub>>,
    subscriptions: Option<Arc<Subscriptions>>,
    relays: Arc<crate::relays::Relays>,
    processors: Arc<Processors>,
    /// Set when the service starts shutting down (ends change streams).
    closing: watch::Sender<bool>,
    /// Every part's series of `/metrics`, in the order they are written.
    metrics: Arc<Metrics>,
    /// The service's backups (on demand and on the schedule).
    backups: Arc<crate::backup::Backups>,
    /// The scheduled backups' task.
    backup_schedule: Option<tokio::task::JoinHandle<()>>,
    /// `[server.rate_limit]`'s shared store (`redis = { … }`), for the server's limiter.
    shared_limiter: Option<Arc<dyn SharedLimiter>>,
}

/// What the storage step opened.
struct Storage {
    databases: HashMap<String, DynDatabase>,
    stores: Vec<(String, DynStore)>,
    log_stores: Vec<DynStore>,
    replicas: HashMap<String, (DynReader, Arc<ReplicaHealth>)>,
    replica_healths: Vec<(String, Arc<ReplicaHealth>)>,
}

impl Runtime {
    /// Checks `config` with `registries` (every problem at once), then opens and starts
    /// every part of the service.
    pub async fn build(
        config: &ResolvedConfig,
        registries: &Registries,
    ) -> Result<Runtime, BuildError> {
        let problems = crate::check(config, registries);
        if !problems.is_empty() {
            return Err(BuildError::Preflight(problems));
        }
        let authorizer = crate::auth::authorizer(config).await?;
        let policy = crate::auth::permission_policy(config).await?;
        let role = config.role;

        // backends size what they keep per serving thread by this (PostgreSQL's pools)
        meshql_core::serving::plan(config.server.serve_threads);
        let Storage {
            databases,
            stores,
            log_stores,
            mut replicas,
            replica_healths,
        } = open_storage(config, registries, role).await?;
        let store_of = |name: &str| -> DynStore {
            stores
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, s)| s.clone())
                .expect("every entity has a store")
        };

        // the engine: one service per entity, which every frontend goes through; one record
        // of acknowledged writes for all of them (what read snapshots cover)
        let acknowledged = Arc::new(meshql_core::time::Acknowledged::new());
        // the read cache, in front of each entity's reader (the primary or its replica)
        let cache = crate::caches::build(config, &registries.caches).await?;
        // the rate limits' shared store (the limiter is the server's)
        let shared_limiter = crate::rate_limits::connect(config, &registries.limits).await?;
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

        // declared migrations: run by a process that writes, before anything is served (a
        // process that only reads waits for them), so no read sees a half-migrated entity
        crate::migrations::at_start(config, store_of, role.writes()).await?;

        // read-your-writes: a read carrying the token of a write its replica has not applied
        // yet reads the primary (after a bounded wait); only entities with a replica are
        // checked
        let read_after = Arc::new(ReadAfter::new(
            services.clone(),
            Duration::from_millis(config.server.read_your_writes_wait_ms),
        ));

        // graphlettes (the write role serves none)
        let mut graphlettes = Vec::new();
        for entity in config.entities.iter().filter(|_| role.reads()) {
            if let Some(g) = &entity.graph {
                graphlettes.push(Graphlette::new(
                    &entity.name,
                    graphlette_spec(g),
                    services[&entity.name].clone(),
                ));
            }
        }
        let graphql = Arc::new(
            Registry::new(
                graphlettes,
                Duration::from_millis(config.http_client.connect_timeout_ms),
                Duration::from_millis(config.http_client.request_timeout_ms),
            )?
            .with_limits(config.graphql),
        );

        // the change feed: every store's feed copied into the log
        let (closing, closing_rx) = watch::channel(false);
        let mut subscriptions = None;
        let hub = if config.changes.config.enabled {
            let log = crate::feed::open_log(&config.changes)?;
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
            if role.reads() {
                subscriptions = Some(Subscriptions::start(
                    log,
                    graphql.clone(),
                    config.server.max_subscriptions,
                    closing_rx,
                ));
            }
            Some(Arc::new(hub))
        } else {
            None
        };
        let relays = crate::relays::start(config, &registries.relays, hub.as_deref()).await?;
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
            None => Processors::default(),
        });
        processors.rebuild_if_log_replaced();

        let mut storages: Vec<(String, DynStore)> = Vec::new();
        for entity in &config.entities {
            if !storages.iter().any(|(s, _)| *s == entity.storage) {
                storages.push((entity.storage.clone(), store_of(&entity.name)));
            }
        }
        // each part writes its own series; the order is the exposition's
        let metrics = Arc::new(Metrics::new());
        metrics.register(Arc::new(crate::metrics::StoreMetrics {
            role,
            stores: stores.clone(),
            storages: storages.clone(),
        }));
        metrics.register(Arc::new(meshql_engine::metrics::ReplicaMetrics(
            replica_healths.clone(),
        )));
        if let Some(hub) = &hub {
            metrics.register(hub.clone());
        }
        metrics.register(relays.clone());
        metrics.register(processors.clone());
        if let Some(subscriptions) = &subscriptions {
            metrics.register(subscriptions.clone());
        }
        if let Some(cache) = &cache {
            metrics.register(cache.clone());
        }
        let databases: Vec<DynDatabase> = databases.into_values().collect();
        let backups = crate::backup::Backups::new(
            crate::backup::BackupSpec::of(config),
            databases.clone(),
            hub.as_ref().map(|h| h.log().clone()),
        );
        metrics.register(backups.clone());
        // scheduled backups where the data is written (not on read replicas)
        let backup_schedule = if role.writes() {
            backups.start_schedule(closing.subscribe())
        } else {
            None
        };
        Ok(Runtime {
            role,
            services,
            stores,
            log_stores,
            databases,
            replicas: replica_healths,
            read_after,
            graphql,
            hub,
            subscriptions,
            relays,
            processors,
            closing,
            metrics,
            backups,
            backup_schedule,
            shared_limiter,
        })
    }

    /// The store `[server.rate_limit]` keeps its buckets in, when it names one.
    pub fn shared_limiter(&self) -> Option<&Arc<dyn SharedLimiter>> {
        self.shared_limiter.as_ref()
    }

    /// The service's backups: see [`crate::backup`].
    pub fn backups(&self) -> &Arc<crate::backup::Backups> {
        &self.backups
    }

    pub fn role(&self) -> Role {
        self.role
    }

    /// Every entity's service, by entity name.
    pub fn services(&self) -> &HashMap<String, Arc<EntityService>> {
        &self.services
    }

    /// Served stores by entity name, in config order.
    pub fn stores(&self) -> &[(String, DynStore)] {
        &self.stores
    }

    /// Stores whose reads are a materialisation of a log (Kafka as the database).
    pub fn log_stores(&self) -> &[DynStore] {
        &self.log_stores
    }

    pub fn read_after(&self) -> &Arc<ReadAfter> {
        &self.read_after
    }

    /// The GraphQL registry (no graphlettes in the write role).
    pub fn graphql(&self) -> &Arc<Registry> {
        &self.graphql
    }

    /// The change feed's hub, when the feed is on.
    pub fn hub(&self) -> Option<&Arc<Hub>> {
        self.hub.as_ref()
    }

    /// The subscription dispatcher, when the feed is on and the role reads.
    pub fn subscriptions(&self) -> Option<&Arc<Subscriptions>> {
        self.subscriptions.as_ref()
    }

    pub fn processors(&self) -> &Arc<Processors> {
        &self.processors
    }

    /// Every part's series of `/metrics`; frontends register theirs after the runtime's.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Becomes `true` when the service starts shutting down.
    pub fn closing(&self) -> watch::Receiver<bool> {
        self.closing.subscribe()
    }

    /// Tells change streams and subscriptions the service is closing.
    pub fn begin_closing(&self) {
        self.closing.send_replace(true);
    }

    /// Copies the last changes into the log, stops processors and relays after it, then
    /// flushes and closes every storage backend.
    pub async fn shutdown(&self) {
        self.begin_closing();
        if let Some(schedule) = &self.backup_schedule {
            // a backup in progress finishes on its blocking thread; its files are its own
            schedule.abort();
        }
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

/// One database per storage target (file, server), one served store per entity; the
/// replicas of the read roles with one probe per database.
async fn open_storage(
    config: &ResolvedConfig,
    registries: &Registries,
    role: Role,
) -> Result<Storage, BuildError> {
    let mut databases: HashMap<String, DynDatabase> = HashMap::new();
    let mut stores: Vec<(String, DynStore)> = Vec::new();
    let mut log_stores: Vec<DynStore> = Vec::new();
    // the entities whose storage has a read replica: the engine serves their reads there
    // while the replica is reachable, close enough and not saturated (one health per
    // database)
    let mut replicas: HashMap<String, (DynReader, Arc<ReplicaHealth>)> = HashMap::new();
    let mut healths: HashMap<String, Arc<ReplicaHealth>> = HashMap::new();
    let mut replica_healths: Vec<(String, Arc<ReplicaHealth>)> = Vec::new();
    // targets found unreachable at start-up: their other entities skip the attempt (each
    // would wait out the driver's timeout again) and start deferred straight away
    let mut unreachable: HashMap<String, StoreError> = HashMap::new();
    let targets = crate::storage::configure(config, &registries.storage)
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
    Ok(Storage {
        databases,
        stores,
        log_stores,
        replicas,
        replica_healths,
    })
}

/// A graphlette's declaration as the GraphQL engine takes it.
fn graphlette_spec(g: &meshql_config::ResolvedGraph) -> GraphletteSpec {
    GraphletteSpec {
        path: g.path.clone(),
        schema: g.schema.clone(),
        entity_type: g.entity_type.clone(),
        queries: g.queries.clone(),
        resolvers: g.resolvers.clone(),
    }
}
