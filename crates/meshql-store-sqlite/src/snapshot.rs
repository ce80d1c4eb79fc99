//! Backups of a SQLite file while it serves, and cutting a restored file back to a moment.
//!
//! **A consistent copy without stopping writes.** A backup first pauses the file's writer
//! (a `Pause` command queued behind the writes already submitted: they commit, then the
//! writer waits), opens a read transaction on a connection of its own — in WAL mode that
//! fixes the snapshot the copy will see — and releases the writer. The copy then runs
//! through SQLite's online backup API from that connection: the API only starts a read
//! transaction of its own when the connection has none, so every page comes from the held
//! snapshot while new commits go on in the WAL. Writes wait only for the pause (the commit
//! in progress and a `BEGIN`), never for the copy. Pausing several files at once and reading
//! the change log's position meanwhile gives one moment for all of them (`meshql-runtime`'s
//! backup).
//!
//! **Point-in-time.** Every version of every document stays in its table, so the data as of a
//! moment T is exact: [`cut_at`] deletes the versions created after T and marks, for each
//! document that lost its newest versions, the newest one left as `latest`.

use crate::db::{query_error, Command, SqliteDatabase};
use meshql_core::{FileSnapshot, FileSnapshots, StoreError};
use rusqlite::backup::{Backup, StepResult};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

/// Pages copied per backup step (4 KiB each).
const PAGES_PER_STEP: i32 = 4096;

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

impl FileSnapshots for SqliteDatabase {
    fn file(&self) -> &Path {
        self.path()
    }

    fn pause(&self) -> Result<Box<dyn Send>, StoreError> {
        let (paused_tx, paused_rx) = mpsc::sync_channel(1);
        let (release_tx, release_rx) = mpsc::channel::<()>();
        self.command(Command::Pause(paused_tx, release_rx))?;
        paused_rx
            .recv()
            .map_err(|_| unavailable("the writer thread stopped before pausing"))?;
        // dropping the sender closes the channel: the writer goes on
        Ok(Box::new(release_tx))
    }

    fn snapshot(&self) -> Result<Box<dyn FileSnapshot>, StoreError> {
        let conn = self.dedicated_reader()?;
        conn.execute_batch("BEGIN").map_err(query_error)?;
        // BEGIN is deferred: the first read takes the snapshot
        conn.query_row("SELECT COUNT(*) FROM sqlite_schema", [], |r| {
            r.get::<_, i64>(0)
        })
        .map_err(query_error)?;
        Ok(Box::new(SqliteSnapshot { conn }))
    }
}

/// A read transaction held open on a connection of its own.
struct SqliteSnapshot {
    conn: Connection,
}

impl FileSnapshot for SqliteSnapshot {
    fn copy_to(self: Box<Self>, dest: &Path) -> Result<u64, StoreError> {
        let io = |e: std::io::Error| unavailable(format!("{}: {e}", dest.display()));
        if dest.exists() {
            return Err(unavailable(format!("{} already exists", dest.display())));
        }
        let mut out = Connection::open(dest).map_err(query_error)?;
        {
            let backup = Backup::new(&self.conn, &mut out).map_err(query_error)?;
            loop {
                match backup.step(PAGES_PER_STEP).map_err(copy_error)? {
                    StepResult::Done => break,
                    StepResult::More => {}
                    // the destination is ours alone; the source is read in our snapshot
                    _ => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        }
        // one self-contained file: the copy carries the source's WAL mode in its header
        out.pragma_update(None, "journal_mode", "DELETE")
            .map_err(query_error)?;
        out.close().map_err(|(_, e)| query_error(e))?;
        let _ = self.conn.execute_batch("COMMIT");
        let file = std::fs::File::open(dest).map_err(io)?;
        file.sync_all().map_err(io)?;
        Ok(file.metadata().map_err(io)?.len())
    }
}

/// A full disk or a failed write names itself; other failures are the query's.
fn copy_error(e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DiskFull) => unavailable("no space left on the backup's disk"),
        _ => query_error(e),
    }
}

/// What [`cut_at`] removed from one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CutTable {
    pub table: String,
    /// Versions created after the moment, deleted.
    pub removed: u64,
    /// Versions left.
    pub kept: u64,
}

/// Cuts every entity table of the SQLite file at `path` (not open elsewhere) back to the
/// moment `at_ms`: versions created after it are deleted and each document's newest version
/// left is its `latest`. Processors' dead letters recorded after it go too. One transaction:
/// a failure leaves the file as it was.
pub fn cut_at(path: &Path, at_ms: i64) -> Result<Vec<CutTable>, StoreError> {
    let mut conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE)
        .map_err(|e| unavailable(format!("cannot open {}: {e}", path.display())))?;
    let tables = entity_tables(&conn)?;
    let tx = conn.transaction().map_err(query_error)?;
    let mut cut = Vec::new();
    for table in tables {
        let t = crate::sql::quote_ident(&table);
        let ids: Vec<String> = {
            let mut stmt = tx
                .prepare(&format!(
                    "SELECT DISTINCT id FROM {t} WHERE created_at > ?1"
                ))
                .map_err(query_error)?;
            let rows = stmt
                .query_map(params![at_ms], |r| r.get(0))
                .map_err(query_error)?;
            rows.collect::<Result<_, _>>().map_err(query_error)?
        };
        let removed = tx
            .execute(
                &format!("DELETE FROM {t} WHERE created_at > ?1"),
                params![at_ms],
            )
            .map_err(query_error)? as u64;
        {
            let mut newest = tx
                .prepare(&format!(
                    "UPDATE {t} SET latest = 1 WHERE id = ?1 AND created_at = \
                     (SELECT MAX(created_at) FROM {t} WHERE id = ?1)"
                ))
                .map_err(query_error)?;
            for id in &ids {
                newest.execute(params![id]).map_err(query_error)?;
            }
        }
        let kept: i64 = tx
            .query_row(&format!("SELECT COUNT(*) FROM {t}"), [], |r| r.get(0))
            .map_err(query_error)?;
        cut.push(CutTable {
            table,
            removed,
            kept: kept as u64,
        });
    }
    let has_dead_letters: Option<String> = tx
        .query_row(
            "SELECT name FROM sqlite_schema WHERE type = 'table' AND name = '_meshql_dead_letters'",
            [],
            |r| r.get(0),
        )
        .optional()
        .map_err(query_error)?;
    if has_dead_letters.is_some() {
        tx.execute(
            "DELETE FROM _meshql_dead_letters WHERE at > ?1",
            params![at_ms],
        )
        .map_err(query_error)?;
    }
    tx.commit().map_err(query_error)?;
    conn.execute_batch("VACUUM").map_err(query_error)?;
    Ok(cut)
}

/// The tables of a file that hold an entity's versions (by their columns).
pub fn entity_tables(conn: &Connection) -> Result<Vec<String>, StoreError> {
    let names: Vec<String> = {
        let mut stmt = conn
            .prepare(
                "SELECT name FROM sqlite_schema WHERE type = 'table' \
                 AND name NOT LIKE 'sqlite_%' ORDER BY name",
            )
            .map_err(query_error)?;
        let rows = stmt.query_map([], |r| r.get(0)).map_err(query_error)?;
        rows.collect::<Result<_, _>>().map_err(query_error)?
    };
    let mut tables = Vec::new();
    for name in names {
        let columns: Vec<String> = {
            let mut stmt = conn
                .prepare("SELECT name FROM pragma_table_info(?1)")
                .map_err(query_error)?;
            let rows = stmt
                .query_map(params![name], |r| r.get(0))
                .map_err(query_error)?;
            rows.collect::<Result<_, _>>().map_err(query_error)?
        };
        let has = |c: &str| columns.iter().any(|x| x == c);
        if ["id", "payload", "created_at", "deleted", "latest"]
            .iter()
            .all(|c| has(c))
        {
            tables.push(name);
        }
    }
    Ok(tables)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SqliteOptions, SqliteStore};
    use meshql_core::{
        Database, NewDocument, ReadContext, Store, StoreReader, StoreWriter, TokenFilter,
        WriteContext,
    };
    use std::sync::Arc;

    fn doc(id: &str, name: &str, at: Option<i64>) -> NewDocument {
        let mut payload = serde_json::Map::new();
        payload.insert("name".into(), name.into());
        NewDocument {
            id: Some(id.to_owned()),
            payload,
            created_at: at,
        }
    }

    /// A copy taken while writes keep arriving holds exactly the writes committed before
    /// the snapshot, and the writes after it go on (they waited only for the pause).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn snapshot_holds_what_was_committed_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let db = SqliteDatabase::open(&dir.path().join("a.db"), SqliteOptions::default()).unwrap();
        let store = Arc::new(SqliteStore::new(db.clone(), "hen"));
        store.prepare(&[]).await.unwrap();
        let ctx = WriteContext::SYSTEM;
        for i in 0..100 {
            store
                .create(doc(&format!("h{i}"), "before", None), &ctx)
                .await
                .unwrap();
        }
        let files = db.clone().file_snapshots().unwrap();
        let pause = files.pause().unwrap();
        let snap = files.snapshot().unwrap();
        drop(pause);
        for i in 0..50 {
            store
                .create(doc(&format!("x{i}"), "after", None), &ctx)
                .await
                .unwrap();
        }
        let dest = dir.path().join("copy.db");
        let size = snap.copy_to(&dest).unwrap();
        assert!(size > 0);
        let copy = Connection::open(&dest).unwrap();
        let n: i64 = copy
            .query_row("SELECT COUNT(*) FROM hen", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 100);
        let mode: String = copy
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "delete");
        // the live file went on
        let live = store.list(&ReadContext::LATEST).await.unwrap();
        assert_eq!(live.len(), 150);
        db.shutdown().await;
    }

    /// Cut back to a moment, each document reads as an `at` read of that moment did before.
    #[tokio::test]
    async fn cut_at_keeps_each_documents_version_of_the_moment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        let db = SqliteDatabase::open(&path, SqliteOptions::default()).unwrap();
        let store = SqliteStore::new(db.clone(), "hen");
        store.prepare(&[]).await.unwrap();
        let ctx = WriteContext::SYSTEM;
        store
            .create(doc("a", "a1", Some(1_000)), &ctx)
            .await
            .unwrap();
        store
            .create(doc("a", "a2", Some(2_000)), &ctx)
            .await
            .unwrap();
        store
            .create(doc("a", "a3", Some(3_000)), &ctx)
            .await
            .unwrap();
        store
            .create(doc("b", "b1", Some(2_500)), &ctx)
            .await
            .unwrap();
        store
            .create(doc("c", "c1", Some(1_500)), &ctx)
            .await
            .unwrap();
        let before = store
            .list(&ReadContext::new(&TokenFilter::All, Some(2_200)))
            .await
            .unwrap();
        db.shutdown().await;
        drop(store);
        drop(db);

        let cut = cut_at(&path, 2_200).unwrap();
        assert_eq!(
            cut,
            vec![CutTable {
                table: "hen".into(),
                removed: 2,
                kept: 3
            }]
        );
        let db = SqliteDatabase::open(&path, SqliteOptions::default()).unwrap();
        let store = SqliteStore::new(db.clone(), "hen");
        store.prepare(&[]).await.unwrap();
        let mut now = store.list(&ReadContext::LATEST).await.unwrap();
        let mut then = before;
        now.sort_by(|x, y| x.id.cmp(&y.id));
        then.sort_by(|x, y| x.id.cmp(&y.id));
        assert_eq!(now, then);
        assert_eq!(now.len(), 2);
        assert!(now[0].payload.contains("a2"));
        db.shutdown().await;
    }
}
