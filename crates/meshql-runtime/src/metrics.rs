//! The runtime's own series of `/metrics`: the role this process serves, and the storage
//! counters per entity and per storage block (the grouping is the runtime's knowledge; the
//! counters are each store's).

use meshql_config::Role;
use meshql_core::metrics::Collect;
use meshql_core::DynStore;
use std::fmt::Write;

/// The role and the storage series.
pub(crate) struct StoreMetrics {
    pub role: Role,
    /// (entity, store)
    pub stores: Vec<(String, DynStore)>,
    /// (storage name, a store on it): counters kept per storage, not per entity
    pub storages: Vec<(String, DynStore)>,
}

impl Collect for StoreMetrics {
    fn collect(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "# HELP meshql_role What this process serves of its config (meshql serve --role).\n# TYPE meshql_role gauge\nmeshql_role{{role=\"{}\"}} 1",
            self.role
        );
        for (name, help, kind, per, get) in STORE_SERIES {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            let (label, stores) = match per {
                Per::Entity => ("entity", &self.stores),
                Per::Storage => ("storage", &self.storages),
            };
            for (key, store) in stores {
                if let Some(n) = get(&store.stats()) {
                    let _ = writeln!(out, "{name}{{{label}=\"{key}\"}} {n}");
                }
            }
        }
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
