//! Operational endpoints: `/health` (the process answers), `/ready` (every store answers),
//! `/metrics` (Prometheus text: storage counters per entity, the change feed and relays,
//! connections, and request latency per route).

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use meshql_core::DynStore;
use std::fmt::Write;
use std::sync::Arc;

pub struct Ops {
    /// What this process serves of its config (`meshql serve --role`).
    pub role: meshql_config::Role,
    /// Read replicas, by storage block.
    pub replicas: Vec<(String, Arc<meshql_engine::ReplicaHealth>)>,
    /// (entity, store)
    pub stores: Vec<(String, DynStore)>,
    /// (storage name, a store on it): counters kept per storage, not per entity
    pub storages: Vec<(String, DynStore)>,
    /// The change feed's hub, when the feed is on.
    pub hub: Option<Arc<meshql_changes::Hub>>,
    /// Relays of the change feed (their state is in `/metrics`, never in `/ready`: a broker
    /// that is down does not make the service unready).
    pub relays: Arc<meshql_runtime::Relays>,
    /// Processors of the change feed (their state is in `/metrics` and the console).
    pub processors: Arc<meshql_process::Processors>,
    /// Latency per route, method and status.
    pub requests: Arc<crate::request_metrics::RequestMetrics>,
    /// GraphQL subscriptions, when the change feed is on.
    pub subscriptions: Arc<std::sync::OnceLock<Arc<meshql_runtime::Subscriptions>>>,
    /// The read cache (`[cache]`).
    pub cache: Option<Arc<meshql_engine::Cache>>,
}

fn respond(status: StatusCode, content_type: &'static str, body: String) -> Response {
    let mut r = Response::new(axum::body::Body::from(body));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

pub async fn health() -> Response {
    respond(
        StatusCode::OK,
        "application/json",
        r#"{"status":"ok"}"#.to_owned(),
    )
}

pub async fn ready(State(ops): State<Arc<Ops>>) -> Response {
    let mut failures = serde_json::Map::new();
    for (entity, store) in &ops.stores {
        if let Err(e) = store.ready().await {
            failures.insert(entity.clone(), serde_json::Value::String(e.to_string()));
        }
    }
    if failures.is_empty() {
        respond(
            StatusCode::OK,
            "application/json",
            r#"{"status":"ok"}"#.to_owned(),
        )
    } else {
        respond(
            StatusCode::SERVICE_UNAVAILABLE,
            "application/json",
            serde_json::json!({"status": "unavailable", "failures": failures}).to_string(),
        )
    }
}

/// Whose counters a storage series shows: each entity's store, or each storage's.
#[derive(Clone, Copy)]
enum Per {
    Entity,
    Storage,
}

/// One storage series of `/metrics`: name, help, type, whose, and the value from a store's
/// counters (`None`: the backend does not count it).
type StoreSeries = (
    &'static str,
    &'static str,
    &'static str,
    Per,
    fn(&meshql_core::StoreStats) -> Option<u64>,
);

const STORE_SERIES: [StoreSeries; 9] = [
    (
        "meshql_storage_reads_total",
        "Read statements executed by the entity's store.",
        "counter",
        Per::Entity,
        |s| Some(s.reads),
    ),
    (
        "meshql_storage_writes_total",
        "Document versions written by the entity's store.",
        "counter",
        Per::Entity,
        |s| Some(s.writes),
    ),
    (
        "meshql_storage_commits_total",
        "Transactions committed by the storage (shared by its entities).",
        "counter",
        Per::Storage,
        |s| Some(s.commits),
    ),
    (
        "meshql_storage_read_connections",
        "Connections the storage keeps open for reads (idle or in use).",
        "gauge",
        Per::Storage,
        |s| s.read_connections,
    ),
    (
        "meshql_storage_connections_in_use",
        "Connections of the storage's pool lent to an operation (at pool_size, the next one waits).",
        "gauge",
        Per::Storage,
        |s| s.connections_in_use,
    ),
    (
        "meshql_storage_log_behind_milliseconds",
        "How old the entity's answers may be, for a store materialised from a log (Kafka): 0 while the log is reachable and applied up to the end it last reported, otherwise the time since that was last true.",
        "gauge",
        Per::Entity,
        |s| s.log.map(|l| l.behind_ms),
    ),
    (
        "meshql_storage_log_records_behind",
        "Records of the entity's log (Kafka topic) not applied here yet, as of the end it last reported.",
        "gauge",
        Per::Entity,
        |s| s.log.map(|l| l.records_behind),
    ),
    (
        "meshql_storage_log_skipped_records_total",
        "Records of the entity's log skipped because they were not document versions (each logged with its reason).",
        "counter",
        Per::Entity,
        |s| s.log.map(|l| l.skipped),
    ),
    (
        "meshql_storage_log_reachable",
        "Whether the servers of the entity's log (Kafka brokers) are reachable: 1 or 0.",
        "gauge",
        Per::Entity,
        |s| s.log.map(|l| u64::from(l.reachable)),
    ),
];

pub async fn metrics(State(ops): State<Arc<Ops>>) -> Response {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# HELP meshql_role What this process serves of its config (meshql serve --role).\n# TYPE meshql_role gauge\nmeshql_role{{role=\"{}\"}} 1",
        ops.role
    );
    for (name, help, kind, per, get) in STORE_SERIES {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        let (label, stores) = match per {
            Per::Entity => ("entity", &ops.stores),
            Per::Storage => ("storage", &ops.storages),
        };
        for (key, store) in stores {
            if let Some(n) = get(&store.stats()) {
                let _ = writeln!(out, "{name}{{{label}=\"{key}\"}} {n}");
            }
        }
    }
    write_replica_metrics(&mut out, &ops.replicas);
    if let Some(hub) = &ops.hub {
        write_feed_metrics(&mut out, hub);
    }
    write_relay_metrics(&mut out, &ops.relays.stats());
    meshql_runtime::write_processor_metrics(&mut out, &ops.processors.stats());
    if let Some(subscriptions) = ops.subscriptions.get() {
        subscriptions.write_metrics(&mut out);
    }
    if let Some(cache) = &ops.cache {
        write_cache_metrics(&mut out, cache);
    }
    crate::connection::write_metrics(&mut out);
    ops.requests.write(&mut out);
    respond(StatusCode::OK, "text/plain; version=0.0.4", out)
}

fn write_cache_metrics(out: &mut String, cache: &meshql_engine::Cache) {
    let c = cache.counts();
    let kind = cache.kind();
    for (name, help, value) in [
        ("meshql_cache_hits_total", "Reads answered by the cache.", c.hits),
        ("meshql_cache_misses_total", "Reads the cache sent to storage.", c.misses),
        ("meshql_cache_fills_total", "Answers stored in the cache.", c.fills),
        (
            "meshql_cache_unfilled_total",
            "Answers not stored because they might not be current (a newer write, a replica behind).",
            c.unfilled,
        ),
        (
            "meshql_cache_invalidations_total",
            "Tags invalidated (one per written document and one per entity written).",
            c.invalidations,
        ),
        (
            "meshql_cache_errors_total",
            "Failed calls to the shared cache (each read falls through to storage).",
            c.shared_errors,
        ),
        (
            "meshql_cache_bypassed_total",
            "Reads that went around a shared cache that failed or missed an update.",
            c.bypassed,
        ),
        (
            "meshql_cache_skipped_total",
            "Reads sent straight to storage: their operation's recent hit rate in the shared cache was below cache.min_hit_rate.",
            c.skipped,
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{cache=\"{kind}\"}} {value}"
        );
    }
    let _ = writeln!(
        out,
        "# HELP meshql_cache_entries Answers held in the in-process cache.\n# TYPE meshql_cache_entries gauge\nmeshql_cache_entries{{cache=\"{kind}\"}} {}",
        cache.entry_count()
    );
}

fn write_replica_metrics(
    out: &mut String,
    replicas: &[(String, Arc<meshql_engine::ReplicaHealth>)],
) {
    if replicas.is_empty() {
        return;
    }
    let stats: Vec<_> = replicas.iter().map(|(s, h)| (s, h.stats())).collect();
    let _ = writeln!(
        out,
        "# HELP meshql_replica_lag_seconds How long the oldest change the read replica has not applied has waited (absent: it cannot tell).\n# TYPE meshql_replica_lag_seconds gauge"
    );
    for (storage, s) in &stats {
        if let Some(lag) = s.lag {
            let _ = writeln!(
                out,
                "meshql_replica_lag_seconds{{storage=\"{storage}\"}} {}",
                lag.time.as_secs_f64()
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP meshql_replica_lag_bytes What the read replica has still to apply (PostgreSQL: WAL bytes).\n# TYPE meshql_replica_lag_bytes gauge"
    );
    for (storage, s) in &stats {
        if let Some(bytes) = s.lag.and_then(|l| l.bytes) {
            let _ = writeln!(
                out,
                "meshql_replica_lag_bytes{{storage=\"{storage}\"}} {bytes}"
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP meshql_replica_max_lag_seconds Further behind than this, reads go to the primary (read_max_lag_ms).\n# TYPE meshql_replica_max_lag_seconds gauge"
    );
    for (storage, s) in &stats {
        let _ = writeln!(
            out,
            "meshql_replica_max_lag_seconds{{storage=\"{storage}\"}} {}",
            s.settings.max_lag.as_secs_f64()
        );
    }
    let _ = writeln!(
        out,
        "# HELP meshql_replica_state The read replica's state: 1 for the current one of usable, behind, down.\n# TYPE meshql_replica_state gauge"
    );
    for (storage, s) in &stats {
        for state in [
            meshql_engine::ReplicaState::Usable,
            meshql_engine::ReplicaState::Behind,
            meshql_engine::ReplicaState::Down,
        ] {
            let _ = writeln!(
                out,
                "meshql_replica_state{{storage=\"{storage}\",state=\"{}\"}} {}",
                state.as_str(),
                u8::from(s.state == state)
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP meshql_replica_reads_total Reads meant for the read replica, by who answered and why the primary did.\n# TYPE meshql_replica_reads_total counter"
    );
    for (storage, s) in &stats {
        let _ = writeln!(
            out,
            "meshql_replica_reads_total{{storage=\"{storage}\",served_by=\"replica\",reason=\"\"}} {}",
            s.on_replica
        );
        for (detour, n) in s.detoured {
            let _ = writeln!(
                out,
                "meshql_replica_reads_total{{storage=\"{storage}\",served_by=\"primary\",reason=\"{}\"}} {n}",
                detour.as_str()
            );
        }
    }
}

fn write_feed_metrics(out: &mut String, hub: &meshql_changes::Hub) {
    let stats = hub.stats();
    let name = "meshql_changes_copied_total";
    let _ = writeln!(
        out,
        "# HELP {name} Changes copied from the entity's store into the change log.\n# TYPE {name} counter"
    );
    for s in &stats {
        let _ = writeln!(out, "{name}{{entity=\"{}\"}} {}", s.entity, s.copied);
    }
    let name = "meshql_changes_copy_errors_total";
    let _ = writeln!(
        out,
        "# HELP {name} Failed attempts to copy the entity's changes (retried).\n# TYPE {name} counter"
    );
    for s in &stats {
        let _ = writeln!(out, "{name}{{entity=\"{}\"}} {}", s.entity, s.errors);
    }
    let log = hub.log();
    let name = "meshql_changes_log_last_position";
    let _ = writeln!(
        out,
        "# HELP {name} Position of the newest change in the log.\n# TYPE {name} gauge\n{name} {}",
        log.last_offset()
    );
    let name = "meshql_changes_log_first_position";
    let _ = writeln!(
        out,
        "# HELP {name} Position of the oldest change the log still keeps.\n# TYPE {name} gauge\n{name} {}",
        log.first_offset()
    );
}

fn write_relay_metrics(out: &mut String, stats: &[meshql_changes::RelayStats]) {
    if stats.is_empty() {
        return;
    }
    type Series = (
        &'static str,
        &'static str,
        &'static str,
        fn(&meshql_changes::RelayStats) -> String,
    );
    let series: [Series; 5] = [
        (
            "meshql_relay_sent_total",
            "counter",
            "Changes the relay's broker acknowledged (a batch sent again counts again).",
            |s| s.delivered.to_string(),
        ),
        (
            "meshql_relay_errors_total",
            "counter",
            "Failed sends of the relay (each retried with backoff).",
            |s| s.errors.to_string(),
        ),
        (
            "meshql_relay_committed_position",
            "gauge",
            "Log position up to which every change was acknowledged by the relay's broker.",
            |s| s.committed.to_string(),
        ),
        (
            "meshql_relay_lag",
            "gauge",
            "Changes in the log not yet acknowledged by the relay's broker.",
            |s| s.lag.to_string(),
        ),
        (
            "meshql_relay_seconds_since_last_success",
            "gauge",
            "Seconds since the relay last delivered a batch or was caught up (0 while caught up).",
            |s| format!("{:.3}", s.since_success.as_secs_f64()),
        ),
    ];
    for (name, kind, help, get) in series {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for s in stats {
            let _ = writeln!(
                out,
                "{name}{{relay=\"{}\",type=\"{}\"}} {}",
                s.name,
                s.kind,
                get(s)
            );
        }
    }
}
