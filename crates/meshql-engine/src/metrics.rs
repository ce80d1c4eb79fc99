//! The engine's series of `/metrics`: the read cache's counters and the read replicas'
//! health, each written by the part it describes ([`meshql_core::metrics::Collect`]).

use crate::{Cache, ReplicaHealth};
use meshql_core::metrics::Collect;
use std::fmt::Write;
use std::sync::Arc;

impl Collect for Cache {
    fn collect(&self, out: &mut String) {
        write_cache_metrics(out, self);
    }
}

/// The read replicas of a service, by storage block (no series without one).
pub struct ReplicaMetrics(pub Vec<(String, Arc<ReplicaHealth>)>);

impl Collect for ReplicaMetrics {
    fn collect(&self, out: &mut String) {
        write_replica_metrics(out, &self.0);
    }
}

fn write_cache_metrics(out: &mut String, cache: &Cache) {
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

fn write_replica_metrics(out: &mut String, replicas: &[(String, Arc<ReplicaHealth>)]) {
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
            crate::ReplicaState::Usable,
            crate::ReplicaState::Behind,
            crate::ReplicaState::Down,
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
