//! The NATS relay: a [`Sink`] that publishes meshql's change feed to a NATS JetStream
//! stream.
//!
//! Each change is published on `<subject_prefix>.<entity>` with the change as `/_changes`
//! publishes it as the body and the headers `Nats-Msg-Id: <change_id>`, `change_id`, `op`,
//! `position` and `correlation_id` (absent when the write had none). JetStream drops a
//! message whose `Nats-Msg-Id` it has stored within the stream's duplicate window, so a batch
//! the relay sends again (after a failure or a crash) is stored once when the resend falls
//! within the window; beyond it, consumers de-duplicate on the `change_id` header.
//!
//! The stream (name configurable, subjects `<subject_prefix>.>`, file storage, the configured
//! duplicate window) is created when missing, on first use and again after a failure (an
//! existing stream is used as it is). [`NatsSink::send`] publishes a batch in order and
//! returns `Ok` only when the stream acknowledged every message.
//!
//! The client connects in the background and reconnects forever, so a server that is down
//! when the service starts, or goes down later, only makes sends fail until it is back.
//!
//! [`NatsBackend`] registers the relay with the server's relay registry: it owns the fields
//! of a `[[changes.relay]] type = "nats"` entry ([`NatsSettings`]: defaults, checks, JSON
//! Schema) and builds the sink from them.

use async_nats::header::NATS_MESSAGE_ID;
use async_nats::jetstream::{self, stream};
use async_nats::HeaderMap;
use async_trait::async_trait;
use bytes::Bytes;
use meshql_changes::{confirmed, Confirmation, RelayChange, Sink, SinkError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use thiserror::Error;

mod settings;
pub use settings::{NatsBackend, NatsSettings};

/// What a NATS relay needs.
#[derive(Debug, Clone)]
pub struct NatsSinkConfig {
    /// The relay's name (the connection's name is `meshql-relay-<name>`).
    pub name: String,
    /// Server URL(s), comma-separated.
    pub url: String,
    /// Subjects are `<subject_prefix>.<entity>`.
    pub subject_prefix: String,
    /// The stream, created when missing.
    pub stream: String,
    /// The duplicate window of a stream the relay creates.
    pub duplicate_window: Duration,
    /// How long the stream may take to acknowledge a publish.
    pub ack_timeout: Duration,
}

impl NatsSinkConfig {
    pub fn new(name: &str, url: &str) -> Self {
        NatsSinkConfig {
            name: name.to_owned(),
            url: url.to_owned(),
            subject_prefix: "meshql.changes".into(),
            stream: "MESHQL_CHANGES".into(),
            duplicate_window: Duration::from_secs(120),
            ack_timeout: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, Error)]
#[error("nats relay \"{name}\": {message}")]
pub struct NatsSinkError {
    pub name: String,
    pub message: String,
}

/// Publishes changes to JetStream (see the crate docs).
pub struct NatsSink {
    config: NatsSinkConfig,
    client: async_nats::Client,
    jetstream: jetstream::Context,
    /// The stream was found or created since the last failure.
    stream_ready: AtomicBool,
}

impl NatsSink {
    /// Starts the client; it connects in the background (a server that is down now is not
    /// an error, an invalid URL is).
    pub async fn connect(config: NatsSinkConfig) -> Result<NatsSink, NatsSinkError> {
        let fail = |message: String| NatsSinkError {
            name: config.name.clone(),
            message,
        };
        let servers = config
            .url
            .split(',')
            .map(|u| u.trim().parse::<async_nats::ServerAddr>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| fail(format!("url `{}`: {e}", config.url)))?;
        let client = async_nats::ConnectOptions::new()
            .name(format!("meshql-relay-{}", config.name))
            .retry_on_initial_connect()
            .max_reconnects(None)
            .connection_timeout(Duration::from_secs(5))
            .connect(servers)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let jetstream = jetstream::ContextBuilder::new()
            .timeout(Duration::from_secs(5))
            .ack_timeout(config.ack_timeout)
            .build(client.clone());
        Ok(NatsSink {
            config,
            client,
            jetstream,
            stream_ready: AtomicBool::new(false),
        })
    }

    /// The subject of an entity's changes.
    pub fn subject(&self, entity: &str) -> String {
        format!("{}.{entity}", self.config.subject_prefix)
    }

    /// The stream's settings when the relay creates it.
    pub fn stream_config(&self) -> stream::Config {
        stream::Config {
            name: self.config.stream.clone(),
            subjects: vec![format!("{}.>", self.config.subject_prefix)],
            storage: stream::StorageType::File,
            duplicate_window: self.config.duplicate_window,
            description: Some("meshql change feed (meshql relay)".into()),
            ..Default::default()
        }
    }

    async fn ensure_stream(&self) -> Result<(), SinkError> {
        if self.stream_ready.load(Ordering::Acquire) {
            return Ok(());
        }
        self.jetstream
            .get_or_create_stream(self.stream_config())
            .await
            .map_err(|e| SinkError::new(format!("stream {}: {e}", self.config.stream)))?;
        self.stream_ready.store(true, Ordering::Release);
        Ok(())
    }

    async fn publish(&self, batch: &[RelayChange]) -> Result<(), SinkError> {
        self.ensure_stream().await?;
        let mut acks = Vec::with_capacity(batch.len());
        for change in batch {
            let ack = self
                .jetstream
                .publish_with_headers(
                    self.subject(&change.entity),
                    headers(change),
                    Bytes::from(change.json.clone()),
                )
                .await
                .map_err(|e| SinkError::new(format!("publishing: {e}")))?;
            acks.push(ack);
        }
        let mut first_error = None;
        for ack in acks {
            if let Err(e) = ack.await {
                first_error.get_or_insert(e.to_string());
            }
        }
        match first_error {
            None => Ok(()),
            Some(e) => Err(SinkError::new(format!(
                "not acknowledged by JetStream: {e}"
            ))),
        }
    }
}

fn headers(change: &RelayChange) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(NATS_MESSAGE_ID, change.change_id.as_str());
    headers.insert("change_id", change.change_id.as_str());
    headers.insert("op", change.op.as_str());
    headers.insert("position", change.position.to_string().as_str());
    if let Some(c) = &change.correlation_id {
        headers.insert("correlation_id", c.as_str());
    }
    headers
}

#[async_trait]
impl Sink for NatsSink {
    fn kind(&self) -> &'static str {
        "nats"
    }

    /// Publishes the batch and awaits every acknowledgement before returning (no batches in
    /// flight: JetStream acknowledges in microseconds on a local server).
    async fn enqueue(&self, batch: &[RelayChange]) -> Result<Confirmation, SinkError> {
        // publishing waits while the client is disconnected: bound the whole batch
        let limit = self.config.ack_timeout + Duration::from_secs(5);
        let outcome = match tokio::time::timeout(limit, self.publish(batch)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(SinkError::new(format!(
                "no acknowledgement within {limit:?} (server unreachable?)"
            ))),
        };
        if outcome.is_err() {
            // the stream may be gone (deleted, or a server that lost its store): look again
            self.stream_ready.store(false, Ordering::Release);
        }
        outcome.map(|()| confirmed())
    }

    async fn close(&self) {
        if let Err(e) = self.client.flush().await {
            tracing::debug!(relay = %self.config.name, error = %e, "nats client not flushed");
        }
    }
}
