//! `[[changes.relay]] type = "jsonl"`: every change of the feed appended, one JSON object a
//! line (the change as `/_changes` serves it), to a file — an audit trail on the machine, a
//! feed for tools that read files, and the smallest complete relay: its settings, its sink,
//! one registration.
//!
//! ```toml
//! [[changes.relay]]
//! name = "audit"
//! type = "jsonl"
//! path = "audit/changes.jsonl"   # relative to data_dir
//! max_bytes = 104857600          # then the file becomes changes.jsonl.1 and a new one starts
//! ```
//!
//! A batch is confirmed once its lines are written and, with `fsync = true` (the default),
//! on disk: the relay commits its position after that, so a crash repeats at most the last
//! batch (at least once, like every relay; a line's `change_id` tells a repeat). The file is
//! bounded: past `max_bytes` it is renamed to `<path>.1` (replacing the previous one) and a
//! new file starts, so at most twice `max_bytes` are kept.

use async_trait::async_trait;
use meshql_changes::{confirmed, Confirmation, RelayChange, RelayContext, RelayTarget, Relays};
use meshql_changes::{Sink, SinkError};
use meshql_core::{Component, SettingError};
use parking_lot::Mutex;
use schemars::JsonSchema;
use serde::Deserialize;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

/// A JSON-lines file: each change of the feed one line.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JsonlSettings {
    /// The file; relative to the service's `data_dir`. Its directory is made if missing.
    pub path: String,
    /// Confirm a batch only once its lines are on disk (fsync).
    #[serde(default = "default_true")]
    pub fsync: bool,
    /// Past this size the file becomes `<path>.1` and a new one starts.
    #[serde(default = "default_max_bytes")]
    pub max_bytes: u64,
}

fn default_true() -> bool {
    true
}

fn default_max_bytes() -> u64 {
    1 << 30
}

/// Registers the JSON-lines relay with a relay registry.
#[derive(Debug, Default, Clone, Copy)]
pub struct JsonlBackend;

impl Component<Relays> for JsonlBackend {
    const KIND: &'static str = "jsonl";
    type Settings = JsonlSettings;

    fn build(
        &self,
        s: JsonlSettings,
        context: &RelayContext<'_>,
    ) -> Result<Box<dyn RelayTarget>, SettingError> {
        if s.path.trim().is_empty() {
            return Err(SettingError::new("path", "name the file to append to"));
        }
        if s.max_bytes < 4096 {
            return Err(SettingError::new("max_bytes", "must be at least 4096"));
        }
        let path = context.data_dir.join(s.path.trim());
        Ok(Box::new(JsonlTarget {
            path,
            fsync: s.fsync,
            max_bytes: s.max_bytes,
        }))
    }
}

#[derive(Debug)]
struct JsonlTarget {
    path: PathBuf,
    fsync: bool,
    max_bytes: u64,
}

#[async_trait]
impl RelayTarget for JsonlTarget {
    async fn sink(&self) -> Result<Arc<dyn Sink>, Box<dyn std::error::Error + Send + Sync>> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = open(&self.path)?;
        let size = file.metadata()?.len();
        Ok(Arc::new(JsonlSink(Arc::new(Open {
            path: self.path.clone(),
            fsync: self.fsync,
            max_bytes: self.max_bytes,
            file: Mutex::new(Some((file, size))),
        }))))
    }
}

fn open(path: &std::path::Path) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// The open file and its size.
struct JsonlSink(Arc<Open>);

struct Open {
    path: PathBuf,
    fsync: bool,
    max_bytes: u64,
    file: Mutex<Option<(File, u64)>>,
}

impl Open {
    /// Appends `lines` (blocking I/O: run off the async workers), rolling the file over first
    /// when they would take it past `max_bytes`.
    fn write(&self, lines: &[u8]) -> std::io::Result<()> {
        let mut guard = self.file.lock();
        let (file, size) = match guard.as_mut() {
            Some(open) => open,
            None => return Err(std::io::Error::other("the relay is closed")),
        };
        if *size > 0 && *size + lines.len() as u64 > self.max_bytes {
            file.sync_all()?;
            let mut rolled = self.path.clone().into_os_string();
            rolled.push(".1");
            std::fs::rename(&self.path, rolled)?;
            *file = open(&self.path)?;
            *size = 0;
        }
        file.write_all(lines)?;
        if self.fsync {
            file.sync_data()?;
        }
        *size += lines.len() as u64;
        Ok(())
    }
}

#[async_trait]
impl Sink for JsonlSink {
    fn kind(&self) -> &'static str {
        "jsonl"
    }

    async fn enqueue(&self, batch: &[RelayChange]) -> Result<Confirmation, SinkError> {
        let mut lines = Vec::with_capacity(batch.iter().map(|c| c.json.len() + 1).sum());
        for change in batch {
            lines.extend_from_slice(&change.json);
            lines.push(b'\n');
        }
        let open = self.0.clone();
        let path = open.path.display().to_string();
        tokio::task::spawn_blocking(move || open.write(&lines))
            .await
            .map_err(|e| SinkError::new(format!("{path}: {e}")))?
            .map_err(|e| SinkError::new(format!("{path}: {e}")))?;
        Ok(confirmed())
    }

    async fn close(&self) {
        if let Some((file, _)) = self.0.file.lock().take() {
            let _ = file.sync_all();
        }
    }
}
