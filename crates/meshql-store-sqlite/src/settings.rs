//! `[storage.<name>] type = "sqlite"`: the block's fields and their registration.

use crate::{SqliteDatabase, SqliteOptions};
use async_trait::async_trait;
use meshql_core::{
    BackendContext, Component, DynDatabase, SettingError, Storage, StorageTarget, StoreError,
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
    /// Whole-table reads (REST lists, GraphQL queries of every document) running at once,
    /// each on a thread and a connection of its own; more wait. Default: the machine's
    /// cores (at least 2).
    #[serde(default)]
    pub concurrent_scans: Option<usize>,
    /// Read connections kept open between requests (each holds up to `page_cache_kib`);
    /// more are opened under load and closed after it. Default: twice the cores.
    #[serde(default)]
    pub idle_read_connections: Option<usize>,
    /// Read a GraphQL query's relationships to entities of this file in the same read
    /// transaction as the query itself (one per request instead of one per level; the
    /// statements are the same). Default: true.
    #[serde(default = "default_true")]
    pub nested_reads: bool,
    /// Page cache of each connection to the file (the writer, each reader, the
    /// checkpointer), in KiB; pages beyond it are read again from the operating system's
    /// page cache. Default: 512 (SQLite's own is 2000).
    #[serde(default)]
    pub page_cache_kib: Option<u32>,
    /// Open the file for this process alone (SQLite's `unix-excl` VFS, on Unix): no other
    /// process can read or write it while meshql serves it, and read transactions take no
    /// file locks (the WAL index lives in memory instead of a `-shm` file). `false` lets
    /// other processes open it (the `sqlite3` shell, a backup tool) at the cost of a lock
    /// system call and a shared mutex per read (docs/BENCHMARKS.md). Default: true.
    #[serde(default = "default_true")]
    pub exclusive: bool,
}

/// A cache of 16 pages or fewer makes nearly every lookup read its pages again: refused as a
/// mistake.
const MIN_PAGE_CACHE_KIB: u32 = 64;

fn default_true() -> bool {
    true
}

fn default_checkpoint_pages() -> u32 {
    crate::CheckpointPolicy::default().pages
}

/// Registers SQLite with a backend registry.
#[derive(Debug, Default, Clone, Copy)]
pub struct SqliteBackend;

impl Component<Storage> for SqliteBackend {
    const KIND: &'static str = "sqlite";
    type Settings = SqliteSettings;

    fn build(
        &self,
        settings: SqliteSettings,
        context: &BackendContext<'_>,
    ) -> Result<Box<dyn StorageTarget>, SettingError> {
        if settings.file.is_empty() {
            return Err(SettingError::new("file", "must name a file"));
        }
        if settings.checkpoint_pages == 0 {
            return Err(SettingError::new("checkpoint_pages", "must be at least 1"));
        }
        if settings.concurrent_scans == Some(0) {
            return Err(SettingError::new("concurrent_scans", "must be at least 1"));
        }
        if settings
            .page_cache_kib
            .is_some_and(|k| k < MIN_PAGE_CACHE_KIB)
        {
            return Err(SettingError::new(
                "page_cache_kib",
                format!("must be at least {MIN_PAGE_CACHE_KIB}"),
            ));
        }
        if settings.idle_read_connections == Some(0) {
            return Err(SettingError::new(
                "idle_read_connections",
                "must be at least 1",
            ));
        }
        let defaults = SqliteOptions::default();
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
                concurrent_scans: settings
                    .concurrent_scans
                    .unwrap_or(defaults.concurrent_scans),
                idle_readers: settings
                    .idle_read_connections
                    .unwrap_or(defaults.idle_readers),
                nested_reads: settings.nested_reads,
                page_cache_kib: settings.page_cache_kib.unwrap_or(defaults.page_cache_kib),
                exclusive: settings.exclusive,
                ..defaults
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

#[cfg(test)]
mod tests {
    use super::*;

    fn configure(settings: serde_json::Value) -> Result<Box<dyn StorageTarget>, SettingError> {
        meshql_core::registry::Part::<Storage>::configure(
            &SqliteBackend,
            &settings,
            &BackendContext {
                block: "farm",
                data_dir: std::path::Path::new("/tmp"),
            },
        )
    }

    #[test]
    fn read_bounds_of_zero_are_refused_naming_the_field() {
        for field in ["concurrent_scans", "idle_read_connections"] {
            let e = configure(serde_json::json!({"file": "f.db", field: 0}))
                .err()
                .unwrap_or_else(|| panic!("{field} = 0 accepted"));
            assert_eq!(e.field.as_deref(), Some(field));
            assert_eq!(e.message, "must be at least 1");
        }
        let Err(e) = configure(serde_json::json!({"file": "f.db", "concurrent_scans": -1})) else {
            panic!("a negative count is accepted");
        };
        assert!(e.message.contains("invalid"), "{}", e.message);
        assert!(configure(
            serde_json::json!({"file": "f.db", "concurrent_scans": 3, "idle_read_connections": 5})
        )
        .is_ok());
    }

    #[test]
    fn a_page_cache_below_64_kib_is_refused_naming_the_field() {
        let Err(e) = configure(serde_json::json!({"file": "f.db", "page_cache_kib": 10})) else {
            panic!("a 10 KiB page cache is accepted");
        };
        assert_eq!(e.field.as_deref(), Some("page_cache_kib"));
        assert_eq!(e.message, "must be at least 64");
        assert!(configure(serde_json::json!({"file": "f.db", "page_cache_kib": 64})).is_ok());
        let Err(e) = configure(serde_json::json!({"file": "f.db", "page_cache_kib": "big"})) else {
            panic!("a string is accepted");
        };
        assert!(e.message.contains("invalid"), "{}", e.message);
    }
}
