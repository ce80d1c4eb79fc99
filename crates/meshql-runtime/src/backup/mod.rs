//! Online backups of a service's own data: its embedded databases and its change log.
//!
//! **One moment for every file.** A backup pauses every embedded database's writer between
//! two group commits (their writes queue; none fails), reads the change hub's checkpoint and
//! the log's last offset P, takes a read snapshot of each database, and releases them all —
//! a pause as long as the commits in progress, measured and written in the manifest. Only
//! then are the snapshots copied (SQLite's online backup API, from the held snapshots) and the
//! log's prefix up to P. The result is consistent: every log record up to P describes a
//! version the copied databases hold (the hub appends a change after its commit), and a
//! change committed before the pause but not yet in the log at P is copied into the log by
//! the hub after a restore (it resumes from the cursor of the last record it finds).
//! Processors commit their log position with their outputs, in a paused database, so no
//! copied position is beyond P. Every write acknowledged before the backup began is in it.
//!
//! **No half backup.** Everything is written under `<dir>/.partial-<name>-<pid>`; the
//! manifest (sizes and SHA-256 of every file) is written last, then the directory is renamed
//! to `<dir>/<name>`. A backup killed midway leaves only a `.partial-…` directory, which has
//! no manifest (a restore refuses it) and which the next backup removes.
//!
//! Databases a server keeps (PostgreSQL, MySQL, MongoDB) are not copied: their own tools
//! back them up (the manifest lists them); the change log, which is meshql's own, is.

use meshql_config::ResolvedConfig;
use meshql_core::{DynDatabase, FileSnapshots, StoreError};
use meshql_log::{Log, LogError};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

mod keep;
pub mod s3;
mod service;

pub use keep::prune;
pub use service::Backups;

/// The manifest's format version.
pub const FORMAT: u32 = 1;
/// The manifest's file name in a backup.
pub const MANIFEST: &str = "manifest.json";
/// The change log's directory inside a backup.
pub const LOG_DIR: &str = "changes";

/// Why a backup failed.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("a backup is already running")]
    Busy,
    #[error("no space left on the device of {}", path.display())]
    DiskFull { path: PathBuf },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("change log: {0}")]
    Log(#[from] LogError),
}

/// What kind of failure a [`BackupError`] is (what HTTP answers with).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackupErrorKind {
    /// Another backup runs: try again later.
    Busy,
    /// The destination's disk is full.
    DiskFull,
    /// Anything else.
    Failed,
}

impl BackupError {
    pub fn kind(&self) -> BackupErrorKind {
        match self {
            BackupError::Busy => BackupErrorKind::Busy,
            BackupError::DiskFull { .. } => BackupErrorKind::DiskFull,
            _ => BackupErrorKind::Failed,
        }
    }
}

/// An I/O error at `path`, a full disk named as such.
pub(crate) fn io_at(path: &Path) -> impl FnOnce(io::Error) -> BackupError + '_ {
    move |source| {
        if source.raw_os_error() == Some(28) || source.kind() == io::ErrorKind::StorageFull {
            BackupError::DiskFull {
                path: path.to_owned(),
            }
        } else {
            BackupError::Io {
                path: path.to_owned(),
                source,
            }
        }
    }
}

/// One entity of the config a backup was taken of: what a restore compares with the config
/// it restores for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutEntry {
    pub entity: String,
    pub storage: String,
    /// The storage block's `type`.
    pub backend: String,
    pub table: String,
}

/// What a service needs to back itself up, taken from its config.
#[derive(Debug, Clone)]
pub struct BackupSpec {
    pub data_dir: PathBuf,
    pub config_file: PathBuf,
    /// SHA-256 of the config file's text.
    pub config_sha256: String,
    pub layout: Vec<LayoutEntry>,
    /// Where backups are written by default (`[backup] dir`, `<data_dir>/backups`).
    pub dir: PathBuf,
    /// How many to keep there (0: all).
    pub keep: u32,
    /// The bucket each is uploaded to.
    pub s3: Option<meshql_config::model::S3Config>,
    /// When one is taken on its own.
    pub schedule: Option<String>,
    /// The change log's directory, when the service has one.
    pub log_dir: Option<PathBuf>,
}

impl BackupSpec {
    pub fn of(config: &ResolvedConfig) -> BackupSpec {
        let text = fs::read(&config.file).unwrap_or_default();
        BackupSpec {
            data_dir: config.data_dir.clone(),
            config_file: config.file.clone(),
            config_sha256: hex(&Sha256::digest(&text)),
            layout: layout_of(config),
            dir: config.backup.dir.clone(),
            keep: config.backup.keep,
            s3: config.backup.s3.clone(),
            schedule: config.backup.schedule.clone(),
            log_dir: config
                .changes
                .config
                .enabled
                .then(|| config.changes.dir.clone()),
        }
    }
}

/// The entities of `config` and where they are stored, in config order.
pub fn layout_of(config: &ResolvedConfig) -> Vec<LayoutEntry> {
    config
        .entities
        .iter()
        .map(|e| LayoutEntry {
            entity: e.name.clone(),
            storage: e.storage.clone(),
            backend: config
                .storages
                .get(&e.storage)
                .map(|s| s.kind.clone())
                .unwrap_or_default(),
            table: e.table.clone(),
        })
        .collect()
}

/// A file of a backup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Path inside the backup (and, restored, inside the data directory), `/`-separated.
    pub path: String,
    /// `sqlite` or `log`.
    pub kind: String,
    pub bytes: u64,
    pub sha256: String,
}

/// The change log's part of a backup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    pub id: String,
    pub first_offset: u64,
    pub last_offset: u64,
    /// Consumer groups and their offsets (lowered to `last_offset`).
    pub groups: Vec<(String, u64)>,
}

/// `manifest.json`: what a backup holds and how to check it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub meshql_version: String,
    /// The backup's moment, ms since the epoch: it holds every write acknowledged before.
    pub taken_at_ms: i64,
    /// The same moment, RFC 3339 (for people).
    pub taken_at: String,
    pub config_file: String,
    pub config_sha256: String,
    pub layout: Vec<LayoutEntry>,
    pub files: Vec<FileEntry>,
    pub log: Option<LogEntry>,
    /// How long writes were held back, in milliseconds.
    pub pause_ms: f64,
    /// How long the whole backup took, in seconds.
    pub seconds: f64,
    /// Storage not in the backup and why (databases their own servers keep).
    pub not_included: Vec<String>,
}

impl Manifest {
    /// Bytes of every file.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }
}

/// What a backup takes: the databases that keep files and the change log.
pub struct Parts {
    pub spec: BackupSpec,
    pub files: Vec<Arc<dyn FileSnapshots>>,
    /// Storage kept elsewhere, and how to back it up.
    pub not_included: Vec<String>,
    pub log: Option<Log>,
}

impl Parts {
    /// The parts of a service with these open databases and this change log.
    pub fn of(spec: BackupSpec, databases: &[DynDatabase], log: Option<Log>) -> Parts {
        let mut files = Vec::new();
        let mut not_included: Vec<String> = Vec::new();
        for db in databases {
            match db.clone().file_snapshots() {
                Some(f) => files.push(f),
                None => {
                    let note = elsewhere(db.backend());
                    if !not_included.contains(&note) {
                        not_included.push(note);
                    }
                }
            }
        }
        files.sort_by(|a, b| a.file().cmp(b.file()));
        Parts {
            spec,
            files,
            not_included,
            log,
        }
    }
}

/// Where the data of a backend that keeps no file of the service's own is backed up.
fn elsewhere(backend: &str) -> String {
    let how = match backend {
        "postgres" => "back it up with PostgreSQL's own tools (pg_dump, or base backups with WAL archiving for point-in-time recovery)",
        "mysql" => "back it up with MySQL's or MariaDB's own tools (mysqldump, mariadb-backup)",
        "mongodb" | "mongo" => "back it up with MongoDB's own tools (mongodump)",
        "memory" => "kept in memory only: nothing outlives the process",
        "kafka" => "its topics are the data: back up the Kafka cluster",
        _ => "kept outside the data directory: back it up with its own tools",
    };
    format!("{backend} storage: {how}")
}

/// A backup written.
#[derive(Debug, Clone)]
pub struct Written {
    pub path: PathBuf,
    pub manifest: Manifest,
}

/// Takes a backup of `parts` into a new directory under `into` (see the module docs).
/// Blocking: run it off the async workers.
pub fn take(parts: Parts, into: &Path) -> Result<Written, BackupError> {
    let started = Instant::now();
    fs::create_dir_all(into).map_err(io_at(into))?;
    remove_abandoned(into);
    let spec = &parts.spec;

    // the moment: every writer paused, the log's end read, a snapshot of each file
    let pause_started = Instant::now();
    let mut guards = Vec::with_capacity(parts.files.len());
    for f in &parts.files {
        guards.push(f.pause()?);
    }
    let taken_at_ms = meshql_core::time::now_millis();
    let hub_checkpoint = spec
        .log_dir
        .as_ref()
        .and_then(|d| fs::read(d.join("hub.json")).ok());
    let upto = parts.log.as_ref().map(|l| l.last_offset());
    let mut snapshots = Vec::with_capacity(parts.files.len());
    for f in &parts.files {
        snapshots.push((f.file().to_owned(), f.snapshot()?));
    }
    drop(guards);
    let pause_ms = pause_started.elapsed().as_secs_f64() * 1000.0;

    let name = backup_name(taken_at_ms);
    let partial = into.join(format!(".partial-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&partial);
    fs::create_dir_all(&partial).map_err(io_at(&partial))?;
    let result = (|| {
        let mut files = Vec::new();
        for (source, snapshot) in snapshots {
            let rel = relative_name(&spec.data_dir, &source);
            let dest = partial.join(&rel);
            if let Some(parent) = dest.parent() {
                fs::create_dir_all(parent).map_err(io_at(parent))?;
            }
            snapshot
                .copy_to(&dest)
                .map_err(|e| disk_full_or(e, &dest))?;
            files.push(entry(&partial, &rel, "sqlite")?);
        }
        let mut log = None;
        if let (Some(log_src), Some(upto), Some(live)) = (&spec.log_dir, upto, &parts.log) {
            let dest = partial.join(LOG_DIR);
            let copy = meshql_log::copy_prefix(log_src, &dest, upto).map_err(|e| match &e {
                LogError::Io { source, .. } if source.raw_os_error() == Some(28) => {
                    BackupError::DiskFull { path: dest.clone() }
                }
                _ => BackupError::Log(e),
            })?;
            if let Some(checkpoint) = &hub_checkpoint {
                let path = dest.join("hub.json");
                write_synced(&path, checkpoint)?;
            }
            let mut names: Vec<String> = Vec::new();
            collect_files(&dest, &mut names, "")?;
            names.sort();
            for n in names {
                files.push(entry(&partial, &format!("{LOG_DIR}/{n}"), "log")?);
            }
            log = Some(LogEntry {
                id: live.id().to_owned(),
                first_offset: copy.first_offset,
                last_offset: copy.last_offset,
                groups: copy.groups,
            });
        }
        let manifest = Manifest {
            format: FORMAT,
            meshql_version: env!("CARGO_PKG_VERSION").to_owned(),
            taken_at_ms,
            taken_at: rfc3339(taken_at_ms),
            config_file: spec.config_file.display().to_string(),
            config_sha256: spec.config_sha256.clone(),
            layout: spec.layout.clone(),
            files,
            log,
            pause_ms,
            seconds: started.elapsed().as_secs_f64(),
            not_included: parts.not_included.clone(),
        };
        let text = serde_json::to_vec_pretty(&manifest).expect("a manifest serialises");
        write_synced(&partial.join(MANIFEST), &text)?;
        sync_dir(&partial)?;
        Ok(manifest)
    })();
    let manifest = match result {
        Ok(m) => m,
        Err(e) => {
            let _ = fs::remove_dir_all(&partial);
            return Err(e);
        }
    };
    let path = into.join(&name);
    fs::rename(&partial, &path).map_err(io_at(&path))?;
    sync_dir(into)?;
    Ok(Written { path, manifest })
}

fn disk_full_or(e: StoreError, path: &Path) -> BackupError {
    if e.to_string().contains("no space left") {
        BackupError::DiskFull {
            path: path.to_owned(),
        }
    } else {
        BackupError::Store(e)
    }
}

/// `meshql-20261207T101500.123Z`: sorts by time.
pub fn backup_name(ms: i64) -> String {
    let t = chrono::DateTime::from_timestamp_millis(ms).unwrap_or_default();
    format!("meshql-{}", t.format("%Y%m%dT%H%M%S%.3fZ"))
}

/// A moment: RFC 3339, or milliseconds since the epoch.
pub fn parse_moment(text: &str) -> Result<i64, String> {
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(ms);
    }
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.timestamp_millis())
        .map_err(|e| {
            format!("{text:?} is not a moment: give RFC 3339 (2026-12-07T10:15:00Z) or milliseconds since the epoch ({e})")
        })
}

/// RFC 3339 in UTC with milliseconds.
pub fn rfc3339(ms: i64) -> String {
    let t = chrono::DateTime::from_timestamp_millis(ms).unwrap_or_default();
    t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

/// A database file's name inside the backup: its path under the data directory, or its file
/// name when it lives elsewhere.
fn relative_name(data_dir: &Path, file: &Path) -> String {
    let rel = file
        .strip_prefix(data_dir)
        .ok()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(file.file_name().unwrap_or_default()));
    rel.components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

/// A file's entry: size and SHA-256, read back from the backup.
fn entry(root: &Path, rel: &str, kind: &str) -> Result<FileEntry, BackupError> {
    let path = root.join(rel);
    let (bytes, sha256) = sha256_file(&path).map_err(io_at(&path))?;
    Ok(FileEntry {
        path: rel.to_owned(),
        kind: kind.to_owned(),
        bytes,
        sha256,
    })
}

/// Size and SHA-256 (hex) of a file.
pub fn sha256_file(path: &Path) -> io::Result<(u64, String)> {
    let mut f = fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut n = 0u64;
    loop {
        let read = f.read(&mut buf)?;
        if read == 0 {
            break;
        }
        hasher.update(&buf[..read]);
        n += read as u64;
    }
    Ok((n, hex(&hasher.finalize())))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Every file under `dir`, as `/`-separated paths relative to it.
fn collect_files(dir: &Path, out: &mut Vec<String>, prefix: &str) -> Result<(), BackupError> {
    for e in fs::read_dir(dir).map_err(io_at(dir))? {
        let e = e.map_err(io_at(dir))?;
        let name = e.file_name().to_string_lossy().into_owned();
        let rel = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        if e.file_type().map_err(io_at(dir))?.is_dir() {
            collect_files(&e.path(), out, &rel)?;
        } else {
            out.push(rel);
        }
    }
    Ok(())
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), BackupError> {
    (|| {
        let mut f = fs::File::create(path)?;
        f.write_all(bytes)?;
        f.sync_all()
    })()
    .map_err(io_at(path))
}

fn sync_dir(dir: &Path) -> Result<(), BackupError> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_at(dir))
}

/// Removes `.partial-…` directories left by backups whose process is gone (killed midway).
fn remove_abandoned(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(".partial-") else {
            continue;
        };
        let pid = rest.rsplit('-').next().and_then(|p| p.parse::<u32>().ok());
        let alive = pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists());
        if !alive || pid == Some(std::process::id()) {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

/// The backups in `dir` (those with a manifest), newest first.
pub fn list(dir: &Path) -> Vec<Written> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<Written> = entries
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|e| {
            let text = fs::read(e.path().join(MANIFEST)).ok()?;
            let manifest: Manifest = serde_json::from_slice(&text).ok()?;
            Some(Written {
                path: e.path(),
                manifest,
            })
        })
        .collect();
    found.sort_by_key(|w| std::cmp::Reverse(w.manifest.taken_at_ms));
    found
}
