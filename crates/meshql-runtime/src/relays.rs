//! The relays of a config: each `[[changes.relay]]` entry checked by the relay its `type`
//! names (registered in [`crate::Registries`]), its sink built, and a [`Relay`] started per
//! entry on the hub's log. A relay crate owns its
//! entry's fields (parsing, defaults, checks, JSON Schema) and its sink
//! ([`meshql_core::Component`]`<Relays>`); the config crate checks only the fields every relay
//! has. A new relay is its crate and one registration.
//!
//! A relay never fails a write and never makes the service unready: a broker that is down
//! only makes its relay fall behind (`meshql_relay_lag` in `/metrics`, a warning in the log)
//! until it is back. Only settings the client library rejects stop the service from
//! starting.

use crate::error::BuildError;
use meshql_changes::{
    Hub, Relay, RelayContext, RelayEntity, RelayOptions, RelayRegistry, RelayStats, RelayTarget,
};
use meshql_config::{ConfigError, RelaySpec, ResolvedConfig};
use std::fmt::Write;
use std::sync::Arc;
use std::time::Duration;

/// Each relay of a config with what builds its sink, in config order.
pub type RelayTargets<'a> = Vec<(&'a RelaySpec, Box<dyn RelayTarget>)>;

/// Checks every relay's fields with its type and returns what builds each sink; or every
/// problem, naming the file, the field's line and the field.
pub fn configure<'a>(
    config: &'a ResolvedConfig,
    registry: &RelayRegistry,
) -> Result<RelayTargets<'a>, Vec<ConfigError>> {
    let entities: Vec<RelayEntity<'_>> = config
        .entities
        .iter()
        .map(|e| RelayEntity {
            name: &e.name,
            table: &e.table,
        })
        .collect();
    let mut targets = Vec::new();
    let mut problems = Vec::new();
    for spec in &config.changes.relays {
        let context = RelayContext {
            name: &spec.name,
            entities: &entities,
            data_dir: &config.data_dir,
        };
        match registry.configure(&spec.kind, &spec.settings, &context) {
            Ok(target) => targets.push((spec, target)),
            Err(e) => problems.push(ConfigError {
                file: config.file.clone(),
                line: spec.line_of(e.field.as_deref()),
                field: match e.field {
                    Some(field) => format!("{}.{field}", spec.path),
                    None => spec.path.clone(),
                },
                message: e.message,
            }),
        }
    }
    if problems.is_empty() {
        Ok(targets)
    } else {
        Err(problems)
    }
}

/// The running relays of a service (none when it has no `[[changes.relay]]`).
#[derive(Default)]
pub struct Relays {
    relays: Vec<Relay>,
}

impl Relays {
    pub fn stats(&self) -> Vec<RelayStats> {
        self.relays.iter().map(Relay::stats).collect()
    }

    /// Sends what the log still holds (bounded), closes every sink. Call after the hub
    /// stopped, so that the last changes are in the log.
    pub async fn stop(&self) {
        futures::future::join_all(self.relays.iter().map(Relay::stop)).await;
    }
}

fn failed(config: &ResolvedConfig, relay: &str, message: impl std::fmt::Display) -> BuildError {
    BuildError::Changes {
        dir: config.changes.dir.display().to_string(),
        message: format!("relay \"{relay}\": {message}"),
    }
}

/// Builds and starts every configured relay on the hub's log (none without a hub: the
/// config requires the change feed for relays).
pub async fn start(
    config: &ResolvedConfig,
    registry: &RelayRegistry,
    hub: Option<&Hub>,
) -> Result<Arc<Relays>, BuildError> {
    let Some(hub) = hub else {
        return Ok(Arc::default());
    };
    let targets = configure(config, registry)
        .map_err(|errors| BuildError::Preflight(errors.iter().map(|e| e.to_string()).collect()))?;
    let mut relays = Vec::new();
    for (spec, target) in targets {
        let sink = target
            .sink()
            .await
            .map_err(|e| failed(config, &spec.name, e))?;
        let options = RelayOptions {
            batch: spec.batch,
            backoff_max: Duration::from_millis(spec.retry_backoff_max_ms),
            ..RelayOptions::default()
        };
        let relay = Relay::start(&spec.name, hub.log().clone(), sink, options)
            .map_err(|e| failed(config, &spec.name, e))?;
        relays.push(relay);
    }
    Ok(Arc::new(Relays { relays }))
}

impl meshql_core::metrics::Collect for Relays {
    fn collect(&self, out: &mut String) {
        write_relay_metrics(out, &self.stats());
    }
}

fn write_relay_metrics(out: &mut String, stats: &[RelayStats]) {
    if stats.is_empty() {
        return;
    }
    type Series = (
        &'static str,
        &'static str,
        &'static str,
        fn(&RelayStats) -> String,
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
