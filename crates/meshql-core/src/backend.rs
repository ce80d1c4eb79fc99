//! An open database of some backend: a SQLite file, a PostgreSQL or MariaDB pool, a MongoDB
//! client. The server opens one per distinct storage target (see `meshql-server`'s backend
//! registry) and asks it for one store per entity table; at shutdown it closes each once.

pub use crate::registry::{parse_settings, SettingError};
use crate::DynStore;
use async_trait::async_trait;
use std::sync::Arc;

#[async_trait]
pub trait Database: Send + Sync + 'static {
    /// The backend's name, as storage blocks spell it (`sqlite`, `postgres`…).
    fn backend(&self) -> &'static str;

    /// A store for one entity's table in this database: the primary, which every write and
    /// every read a write depends on goes to.
    fn store(self: Arc<Self>, table: &str) -> DynStore;

    /// The same table on a read replica the storage block configures (PostgreSQL's
    /// `read_url`), for the engine to serve the API's reads from; `None` without one.
    fn replica(self: Arc<Self>, _table: &str) -> Option<crate::DynReader> {
        None
    }

    /// What the backend can tell about the replica [`Database::replica`] reads (`None`
    /// without one): its lag, reachability and saturation, for reads to leave it in time.
    fn replica_probe(self: Arc<Self>) -> Option<Arc<dyn crate::replica::ReplicaProbe>> {
        None
    }

    /// The database's file, when it keeps its data in a file of the service's own (an
    /// embedded backend): what a backup copies. `None` for a database a server keeps
    /// (PostgreSQL, MySQL, MongoDB: their own tools back them up) or one kept in memory.
    fn file_snapshots(self: Arc<Self>) -> Option<Arc<dyn FileSnapshots>> {
        None
    }

    /// Flushes pending writes and releases connections, files and threads.
    async fn close(&self);
}

/// Consistent copies of an embedded database's file, taken while it serves.
///
/// A backup of several files pauses them all ([`FileSnapshots::pause`]), takes a snapshot of
/// each ([`FileSnapshots::snapshot`]) and the change log's position, releases them, and only
/// then copies: the pause lasts as long as the commits in progress, not as long as the copy.
pub trait FileSnapshots: Send + Sync {
    /// The database file.
    fn file(&self) -> &std::path::Path;

    /// Holds the database's writes back (they queue; none fails) from when the commit in
    /// progress ends until the returned guard is dropped. Blocks until then.
    fn pause(&self) -> Result<Box<dyn Send>, crate::StoreError>;

    /// A read snapshot of the file as it is now, to copy later.
    fn snapshot(&self) -> Result<Box<dyn FileSnapshot>, crate::StoreError>;
}

/// A read snapshot of an embedded database, held until copied or dropped.
pub trait FileSnapshot: Send {
    /// Writes the snapshot to `dest` (a new file, synced) and returns its size in bytes.
    fn copy_to(self: Box<Self>, dest: &std::path::Path) -> Result<u64, crate::StoreError>;
}

/// A shared, dynamically dispatched database.
pub type DynDatabase = Arc<dyn Database>;

/// Storage backends, as a `[storage.<name>]` block's `type` names them: each backend crate
/// implements [`crate::registry::Component`]`<Storage>` once and the server registers it once
/// (`meshql-server`'s `backends.rs`); the config crate keeps a block's other fields opaque and
/// hands them here, so a backend owns its settings: their parsing, defaults, checks and JSON
/// Schema. Building a block checks it; nothing is opened or connected.
pub struct Storage;

impl crate::registry::Family for Storage {
    const WHAT: &'static str = "storage";
    type Context<'a> = BackendContext<'a>;
    type Built = Box<dyn StorageTarget>;
}

/// The storage backends a binary knows, by `type`.
pub type BackendRegistry = crate::registry::Registry<Storage>;

/// What a backend may need besides a block's own fields.
#[derive(Debug, Clone, Copy)]
pub struct BackendContext<'a> {
    /// The block's name (`default` for entities that name none).
    pub block: &'a str,
    /// The service's `data_dir`, already absolute: relative file names resolve under it.
    pub data_dir: &'a std::path::Path,
}

/// A checked storage block, ready to open.
#[async_trait]
pub trait StorageTarget: std::fmt::Debug + Send + Sync {
    /// What the block points at. Blocks with one target share one database (one SQLite
    /// writer, one connection pool) and, at start-up, one reachability check.
    fn target(&self) -> String;

    /// Whether query templates may be SQL fragments (`sql = "…"`); JSON filters always work.
    fn sql_templates(&self) -> bool {
        true
    }

    /// Opens the database (connection pools may connect lazily).
    async fn open(&self) -> Result<DynDatabase, crate::StoreError>;
}

/// A connection-URL parameter name or value, percent-decoded (backends read their TLS
/// parameters out of their URLs with it). A `%` not followed by two hex digits, or bytes that
/// are not UTF-8 once decoded, are an error naming the text.
pub fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad percent-encoding in {s:?}"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{s:?} is not UTF-8 once decoded"))
}

#[cfg(test)]
mod percent_tests {
    use super::percent_decode;

    #[test]
    fn decodes_escapes_and_refuses_bad_ones() {
        assert_eq!(percent_decode("a%2Fb%20c").unwrap(), "a/b c");
        assert!(percent_decode("a%2")
            .unwrap_err()
            .contains("bad percent-encoding"));
        assert!(percent_decode("%zz")
            .unwrap_err()
            .contains("bad percent-encoding"));
        assert!(percent_decode("%ff").unwrap_err().contains("not UTF-8"));
    }
}
