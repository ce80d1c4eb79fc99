//! `[storage.<name>] type = "sqlite"`: the block's fields and their registration.

use crate::{SqliteDatabase, SqliteOptions};
use async_trait::async_trait;
use meshql_core::{
    parse_settings, BackendContext, DynDatabase, SettingError, StorageBackend, StorageTarget,
    StoreError,
};
use schemars::JsonSchema;
use serde::Deserialize;
use std::path::PathBuf;

/// Embedded SQLite: one file, one table per entity.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SqliteSettings {
    /// File name, relative to `data_dir` (or absolute).
    pub file: String,
    /// `PRAGMA synchronous=FULL` (fsync every commit) instead of NORMAL.
    #[serde(default)]
    pub synchronous_full: bool,
    /// WAL pages (4 KiB each) written between two checkpoints. Smaller: shorter pauses of
    /// the writer while a checkpoint syncs the log, more of them; see docs/BENCHMARKS.md.
    #[serde(default = "default_checkpoint_pages")]
    pub checkpoint_pages: u32,
}

fn default_checkpoint_pages() -> u32 {
    crate::CheckpointPolicy::default().pages
}

/// Registers SQLite with a backend registry.
#[derive(Debug, Default, Clone, Copy)]
pub struct SqliteBackend;

impl StorageBackend for SqliteBackend {
    fn kind(&self) -> &'static str {
        "sqlite"
    }

    fn schema(&self) -> serde_json::Value {
        serde_json::to_value(schemars::schema_for!(SqliteSettings)).expect("schemas serialise")
    }

    fn configure(
        &self,
        settings: &serde_json::Value,
        context: &BackendContext<'_>,
    ) -> Result<Box<dyn StorageTarget>, SettingError> {
        let settings: SqliteSettings = parse_settings(settings)?;
        if settings.file.is_empty() {
            return Err(SettingError::new("file", "must name a file"));
        }
        if settings.checkpoint_pages == 0 {
            return Err(SettingError::new("checkpoint_pages", "must be at least 1"));
        }
        let file = PathBuf::from(&settings.file);
        let path = if file.is_absolute() {
            file
        } else {
            context.data_dir.join(file)
        };
        Ok(Box::new(SqliteTarget {
            path,
            options: SqliteOptions {
                synchronous_full: settings.synchronous_full,
                checkpoints: crate::CheckpointPolicy {
                    pages: settings.checkpoint_pages,
                    ..Default::default()
                },
                ..SqliteOptions::default()
            },
        }))
    }
}

#[derive(Debug)]
struct SqliteTarget {
    path: PathBuf,
    options: SqliteOptions,
}

#[async_trait]
impl StorageTarget for SqliteTarget {
    fn target(&self) -> String {
        format!("sqlite:{}", self.path.display())
    }

    async fn open(&self) -> Result<DynDatabase, StoreError> {
        Ok(SqliteDatabase::open(&self.path, self.options.clone())?)
    }
}
