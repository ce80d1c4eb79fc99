//! The relay registry: the one place that maps a `[[changes.relay]]` `type` to the crate
//! that implements it, builds the sinks and starts a [`Relay`] per entry on the hub's log.
//!
//! A relay never fails a write and never makes the service unready: a broker that is down
//! only makes its relay fall behind (`meshql_relay_lag` in `/metrics`, a warning in the log)
//! until it is back. Only settings the client library rejects stop the service from
//! starting.

use crate::app::BuildError;
use meshql_changes::{Hub, Relay, RelayOptions, RelayStats, Sink};
use meshql_config::{RelaySinkSpec, RelaySpec, ResolvedConfig};
use meshql_relay_kafka::{KafkaSink, KafkaSinkConfig};
use meshql_relay_nats::{NatsSink, NatsSinkConfig};
use std::sync::Arc;
use std::time::Duration;

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

/// The sink of one relay.
async fn sink(config: &ResolvedConfig, spec: &RelaySpec) -> Result<Arc<dyn Sink>, BuildError> {
    Ok(match &spec.sink {
        RelaySinkSpec::Kafka {
            brokers,
            topic_prefix,
            topic_naming,
            db,
            format,
            options,
        } => Arc::new(
            KafkaSink::new(KafkaSinkConfig {
                name: spec.name.clone(),
                brokers: brokers.clone(),
                topic_naming: *topic_naming,
                topic_prefix: topic_prefix.clone(),
                db: db.clone(),
                format: *format,
                tables: config
                    .entities
                    .iter()
                    .map(|e| (e.name.clone(), e.table.clone()))
                    .collect(),
                options: options.clone(),
            })
            .map_err(|e| failed(config, &spec.name, e))?,
        ),
        RelaySinkSpec::Nats {
            url,
            subject_prefix,
            stream,
            duplicate_window_secs,
        } => {
            let mut c = NatsSinkConfig::new(&spec.name, url);
            c.subject_prefix = subject_prefix.clone();
            c.stream = stream.clone();
            c.duplicate_window = Duration::from_secs(*duplicate_window_secs);
            Arc::new(
                NatsSink::connect(c)
                    .await
                    .map_err(|e| failed(config, &spec.name, e))?,
            )
        }
    })
}

/// Builds and starts every configured relay on the hub's log (none without a hub: the
/// config requires the change feed for relays).
pub async fn start(config: &ResolvedConfig, hub: Option<&Hub>) -> Result<Arc<Relays>, BuildError> {
    let Some(hub) = hub else {
        return Ok(Arc::default());
    };
    let mut relays = Vec::new();
    for spec in &config.changes.relays {
        let sink = sink(config, spec).await?;
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
