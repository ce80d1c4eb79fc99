//! One SQLite file: the group-committing writer thread and the pool of read connections.

use crate::checkpoint::{self, CheckpointPolicy, Nudger, Signal};
use meshql_core::StoreError;
use parking_lot::Mutex;
use rusqlite::{Connection, OpenFlags};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use tokio::sync::oneshot;

/// The most jobs committed in one transaction.
const MAX_GROUP: usize = 512;

/// Tuning of one database file.
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    /// `PRAGMA synchronous`: NORMAL (default; durable against process crashes, in WAL mode a
    /// power loss may drop the last commits) or FULL.
    pub synchronous_full: bool,
    /// How long a reader waits on a locked database before failing (the writer and the
    /// checkpointer have busy handlers of their own, see checkpoint.rs).
    pub busy_timeout_ms: u32,
    /// Prepared statements cached per connection.
    pub statement_cache: usize,
    /// When WAL checkpoints run.
    pub checkpoints: CheckpointPolicy,
    /// Whole-table reads running at once (each holds a blocking thread and a connection);
    /// more wait their turn.
    pub concurrent_scans: usize,
    /// Read connections kept open between reads; one returned beyond this is closed.
    pub idle_readers: usize,
    /// A GraphQL search and its relationships to tables of this file are read in one read
    /// transaction on one connection (`StoreReader::find_nested`), not one per level.
    pub nested_reads: bool,
    /// Page cache of each connection (the writer, each reader, the checkpointer), in KiB.
    /// Pages beyond it are read again from the OS page cache.
    pub page_cache_kib: u32,
    /// The file is open to this process alone ([`open_file`]).
    pub exclusive: bool,
}

/// Page cache per connection by default: a quarter of SQLite's own 2,000 KiB. Writes append
/// to the right edges of their B-trees and reads are indexed lookups, so the pages they use
/// again fit in far less; pages beyond it are read again from the operating system's page
/// cache (a system call, not a disk read). Measured in docs/BENCHMARKS.md ("Footprint").
pub(crate) const DEFAULT_PAGE_CACHE_KIB: u32 = 512;

/// Sets a connection's page cache to `kib` KiB.
fn set_page_cache(conn: &Connection, kib: u32) -> rusqlite::Result<()> {
    conn.pragma_update(None, "cache_size", -i64::from(kib))
}

/// A connection to `path`; with `exclusive`, through SQLite's `unix-excl` VFS (on Unix).
///
/// In WAL mode every read transaction takes a read lock on the WAL index. With the default
/// VFS the index is a memory-mapped `-shm` file shared between processes: the lock goes
/// through a mutex every connection to the file shares and, whenever the process's first
/// reader arrives or its last leaves, an `fcntl` system call made while holding it — so a
/// second reader thread sleeps on the mutex meanwhile. `unix-excl` locks the database file
/// once for the process and keeps the WAL index in the process's memory: the read locks
/// are in-memory bookkeeping. Every connection to a file must use the same VFS; other
/// processes then get `SQLITE_BUSY` ("database is locked").
fn open_file(path: &Path, flags: OpenFlags, exclusive: bool) -> rusqlite::Result<Connection> {
    if exclusive && cfg!(unix) {
        Connection::open_with_flags_and_vfs(path, flags, "unix-excl")
    } else {
        Connection::open_with_flags(path, flags)
    }
}

/// The machine's cores (at least 2): the default number of concurrent scans.
fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .max(2)
}

impl Default for SqliteOptions {
    fn default() -> Self {
        let cores = cores();
        Self {
            synchronous_full: false,
            busy_timeout_ms: 5_000,
            statement_cache: 256,
            checkpoints: CheckpointPolicy::default(),
            concurrent_scans: cores,
            // inline reads run on the async workers (one per core), scans beside them
            idle_readers: 2 * cores,
            nested_reads: true,
            page_cache_kib: DEFAULT_PAGE_CACHE_KIB,
            exclusive: true,
        }
    }
}

/// What a job tells the writer after running: whether to keep its changes, and how to
/// answer once the transaction's fate is known.
pub(crate) struct JobOutcome {
    keep: bool,
    reply: Reply,
}

/// Answers a job's caller once the commit's outcome (an error, or none) is known.
type Reply = Box<dyn FnOnce(Option<&StoreError>) + Send>;

/// A job runs on the connection (`Ok`), or is refused with an error (`Err`) and only
/// answers.
type JobFn = Box<dyn FnOnce(Result<&Connection, StoreError>) -> JobOutcome + Send>;

/// Whether a job runs inside a savepoint of its own. A job of several statements needs one so
/// that its failure undoes only its own changes; a job that writes with a single statement
/// does not (SQLite undoes a failed statement by itself), and skipping the savepoint saves
/// copying every page the job touches into the statement journal.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isolation {
    Savepoint,
    SingleStatement,
}

pub(crate) enum Command {
    Job(JobFn, Isolation),
    Shutdown(oneshot::Sender<()>),
    /// Commit what is queued before it, say so on the first channel, then write nothing
    /// until the second is closed (see `snapshot.rs`).
    Pause(mpsc::SyncSender<()>, mpsc::Receiver<()>),
}

/// A SQLite database file shared by the entity stores that live in it.
pub struct SqliteDatabase {
    path: PathBuf,
    options: SqliteOptions,
    sender: Mutex<Option<mpsc::Sender<Command>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// Stop signal and thread of the checkpointer.
    checkpointer: Mutex<Option<(mpsc::Sender<Signal>, JoinHandle<()>)>>,
    /// Idle read connections, most recently used last.
    readers: Mutex<Vec<Connection>>,
    /// Read connections open (idle or in use).
    open_readers: AtomicUsize,
    /// One permit per whole-table read allowed to run.
    scans: Arc<tokio::sync::Semaphore>,
    /// The runtime the database was opened in, whose blocking threads run the scans: a server
    /// with a runtime per serving thread would otherwise start scan threads in each.
    blocking: Option<tokio::runtime::Handle>,
    commits: AtomicU64,
}

impl std::fmt::Debug for SqliteDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteDatabase")
            .field("path", &self.path)
            .finish()
    }
}

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

/// SQL functions that templates compile to: `meshql_regexp(pattern, value, ignore_case)`,
/// a `$regex` evaluated with the same engine as the memory store (SQLite has no regular
/// expressions built in). It is 1 when `value` is a string matching `pattern`, else 0; the
/// compiled pattern is cached for the statement's run.
pub(crate) fn register_functions(conn: &Connection) -> rusqlite::Result<()> {
    use rusqlite::functions::FunctionFlags;
    conn.create_scalar_function(
        "meshql_regexp",
        3,
        FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC,
        |ctx| {
            if !matches!(ctx.get_raw(0), rusqlite::types::ValueRef::Text(_)) {
                return Ok(0); // a missing pattern argument matches nothing
            }
            let ignore_case = ctx.get::<i64>(2)? != 0;
            let re = ctx.get_or_create_aux(0, |v| -> Result<_, meshql_core::TemplateError> {
                let pattern = v.as_str().unwrap_or_default();
                meshql_core::template::compile_regex(pattern, ignore_case)
            })?;
            Ok(match ctx.get_raw(1) {
                rusqlite::types::ValueRef::Text(t) => {
                    std::str::from_utf8(t).is_ok_and(|s| re.is_match(s)) as i64
                }
                _ => 0,
            })
        },
    )
}

pub(crate) fn query_error(e: rusqlite::Error) -> StoreError {
    StoreError::Query(e.to_string())
}

impl SqliteDatabase {
    /// Opens (creating if missing) the file and starts its writer thread.
    pub fn open(path: &Path, options: SqliteOptions) -> Result<std::sync::Arc<Self>, StoreError> {
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir).map_err(|e| {
                    unavailable(format!("cannot create directory {}: {e}", dir.display()))
                })?;
            }
        }
        let conn = open_file(path, OpenFlags::default(), options.exclusive)
            .map_err(|e| unavailable(format!("cannot open {}: {e}", path.display())))?;
        // the first statement reads the file: with `exclusive`, where the process takes its
        // lock, and where another process holding the file is found — at once: that process
        // keeps its lock for as long as it runs, so waiting out a busy timeout (rusqlite's
        // default is 5 s) would only delay the same answer
        if options.exclusive {
            conn.busy_timeout(std::time::Duration::ZERO)
                .map_err(query_error)?;
        }
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(|e| match e.sqlite_error_code() {
                // whichever side opened it exclusively, the setting is what shares it
                Some(rusqlite::ErrorCode::DatabaseBusy) => unavailable(format!(
                    "cannot open {}: another process has it open (meshql opens its SQLite \
                     files for itself alone unless their storage block says `exclusive = false`)",
                    path.display()
                )),
                _ => query_error(e),
            })?;
        register_functions(&conn).map_err(query_error)?;
        conn.pragma_update(
            None,
            "synchronous",
            if options.synchronous_full {
                "FULL"
            } else {
                "NORMAL"
            },
        )
        .map_err(query_error)?;
        conn.set_prepared_statement_cache_capacity(options.statement_cache);
        set_page_cache(&conn, options.page_cache_kib).map_err(query_error)?;
        // a job's statement journal (the pages it changed, to undo it alone) stays in memory:
        // its size is bounded by the job's (a bulk or a processor's batch), and a spill to a
        // temporary file cost a file creation and deletion per commit
        conn.pragma_update(None, "temp_store", "MEMORY")
            .map_err(query_error)?;
        // checkpoints run on the checkpointer thread, not inside a commit (see below)
        conn.pragma_update(None, "wal_autocheckpoint", 0)
            .map_err(query_error)?;
        // the WAL file is not cut back when the log restarts (see checkpoint.rs)
        conn.pragma_update(None, "journal_size_limit", -1)
            .map_err(query_error)?;
        conn.busy_handler(Some(checkpoint::writer_busy))
            .map_err(query_error)?;
        let (checkpoint_tx, checkpoint_rx) = mpsc::channel();
        let nudger = Nudger::install(&conn, options.checkpoints, checkpoint_tx.clone());

        let (tx, rx) = mpsc::channel::<Command>();
        let name = format!(
            "sqlite-writer-{}",
            path.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        );
        let db = std::sync::Arc::new(Self {
            path: path.to_owned(),
            sender: Mutex::new(Some(tx)),
            writer: Mutex::new(None),
            checkpointer: Mutex::new(None),
            readers: Mutex::new(Vec::new()),
            open_readers: AtomicUsize::new(0),
            scans: Arc::new(tokio::sync::Semaphore::new(options.concurrent_scans.max(1))),
            blocking: tokio::runtime::Handle::try_current().ok(),
            options,
            commits: AtomicU64::new(0),
        });
        let weak = std::sync::Arc::downgrade(&db);
        let handle = std::thread::Builder::new()
            .name(name)
            .spawn(move || writer_loop(conn, rx, weak, nudger))
            .map_err(unavailable)?;
        *db.writer.lock() = Some(handle);
        let checkpoint_conn = open_file(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            db.options.exclusive,
        )
        .map_err(|e| unavailable(format!("cannot open {}: {e}", path.display())))?;
        set_page_cache(&checkpoint_conn, db.options.page_cache_kib).map_err(query_error)?;
        let policy = db.options.checkpoints;
        let handle = std::thread::Builder::new()
            .name("sqlite-checkpoint".into())
            .spawn(move || checkpoint::run(checkpoint_conn, policy, checkpoint_rx))
            .map_err(unavailable)?;
        *db.checkpointer.lock() = Some((checkpoint_tx, handle));
        Ok(db)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Transactions committed by the writer.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Runs `job` on the writer thread, inside the next group transaction. The result is
    /// delivered after the commit; if the commit fails the caller gets that error.
    pub(crate) async fn write<T, F>(&self, job: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        self.submit(job, Isolation::Savepoint).await
    }

    /// As [`write`](Self::write), for a job that changes the database with at most one
    /// statement (it may read before): no savepoint is needed to keep its failure its own.
    pub(crate) async fn write_single_statement<T, F>(&self, job: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        self.submit(job, Isolation::SingleStatement).await
    }

    async fn submit<T, F>(&self, job: F, isolation: Isolation) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel::<Result<T, StoreError>>();
        let job: JobFn = Box::new(move |conn| {
            let result = match conn {
                Ok(conn) => job(conn),
                Err(e) => Err(e),
            };
            JobOutcome {
                keep: result.is_ok(),
                reply: Box::new(move |commit_error| {
                    let _ = tx.send(match commit_error {
                        Some(e) if result.is_ok() => Err(e.clone()),
                        _ => result,
                    });
                }),
            }
        });
        {
            let sender = self.sender.lock();
            let Some(sender) = sender.as_ref() else {
                return Err(unavailable("database is shut down"));
            };
            sender
                .send(Command::Job(job, isolation))
                .map_err(|_| unavailable("writer thread stopped"))?;
        }
        rx.await.map_err(|_| unavailable("writer thread stopped"))?
    }

    /// Sends a command to the writer thread.
    pub(crate) fn command(&self, command: Command) -> Result<(), StoreError> {
        let sender = self.sender.lock();
        let Some(sender) = sender.as_ref() else {
            return Err(unavailable("database is shut down"));
        };
        sender
            .send(command)
            .map_err(|_| unavailable("writer thread stopped"))
    }

    /// A read connection of its own (not pooled), for a snapshot held across calls.
    pub(crate) fn dedicated_reader(&self) -> Result<Connection, StoreError> {
        let conn = self.open_reader()?;
        // counted while pooled connections are; this one is not returned to the pool
        self.open_readers.fetch_sub(1, Ordering::Relaxed);
        Ok(conn)
    }

    /// Runs `f` with a pooled read connection on the calling thread.
    ///
    /// Reads are short indexed lookups (microseconds); running them inline avoids a thread
    /// hand-off per request, which costs more than the lookup itself. A connection is opened
    /// when none is idle (at most one per thread reading at once: the async workers and the
    /// [`scan`](Self::scan) threads); one returned while `idle_readers` are already idle is
    /// closed, so a burst does not leave its connections (and their page caches) behind.
    pub(crate) fn read<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let conn = match self.readers.lock().pop() {
            Some(c) => c,
            None => self.open_reader()?,
        };
        let result = f(&conn);
        let surplus = {
            let mut idle = self.readers.lock();
            // a connection still inside a transaction would serve every later read from
            // that transaction's snapshot: closed, never pooled
            if idle.len() < self.options.idle_readers && conn.is_autocommit() {
                idle.push(conn);
                None
            } else {
                Some(conn)
            }
        };
        if let Some(conn) = surplus {
            drop(conn);
            self.open_readers.fetch_sub(1, Ordering::Relaxed);
        }
        result
    }

    /// Runs a read that may visit many rows (a whole-table scan) on a blocking thread, at
    /// most `concurrent_scans` at once. The permit travels with the thread, not with the
    /// caller: a caller that gives up (a request timeout, a client gone) does not free a
    /// slot while its scan still runs. It does interrupt the scan, though, at its next
    /// batch of SQLite instructions, so the slot frees quickly.
    pub(crate) async fn scan<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let permit = self
            .scans
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| unavailable("database is shut down"))?;
        let abandoned = Arc::new(AtomicBool::new(false));
        let _on_drop = SetOnDrop(abandoned.clone());
        let db = self.clone();
        let scan = move || {
            let _permit = permit;
            db.read(|conn| {
                conn.progress_handler(
                    SCAN_CHECK_INSTRUCTIONS,
                    Some(move || abandoned.load(Ordering::Relaxed)),
                );
                let result = f(conn);
                conn.progress_handler(0, None::<fn() -> bool>);
                result
            })
        };
        match &self.blocking {
            Some(runtime) => runtime.spawn_blocking(scan),
            None => tokio::task::spawn_blocking(scan),
        }
        .await
        .map_err(|e| unavailable(format!("reader task failed: {e}")))?
    }

    /// Whether relationships to tables of this file are read with their search
    /// ([`SqliteOptions::nested_reads`]).
    pub(crate) fn nested_reads(&self) -> bool {
        self.options.nested_reads
    }

    /// Read connections open now (idle or in use).
    pub fn open_readers(&self) -> usize {
        self.open_readers.load(Ordering::Relaxed)
    }

    fn open_reader(&self) -> Result<Connection, StoreError> {
        let conn = open_file(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_URI,
            self.options.exclusive,
        )
        .map_err(|e| unavailable(format!("cannot open {}: {e}", self.path.display())))?;
        conn.busy_timeout(std::time::Duration::from_millis(
            self.options.busy_timeout_ms as u64,
        ))
        .map_err(query_error)?;
        conn.pragma_update(None, "query_only", "ON")
            .map_err(query_error)?;
        set_page_cache(&conn, self.options.page_cache_kib).map_err(query_error)?;
        register_functions(&conn).map_err(query_error)?;
        conn.set_prepared_statement_cache_capacity(self.options.statement_cache);
        self.open_readers.fetch_add(1, Ordering::Relaxed);
        Ok(conn)
    }

    /// Whether the file can be read now.
    pub fn ping(&self) -> Result<(), StoreError> {
        if self.sender.lock().is_none() {
            return Err(unavailable("database is shut down"));
        }
        self.read(|c| c.query_row("SELECT 1", [], |_| Ok(())).map_err(query_error))
    }

    /// Commits what is queued, stops the writer and closes the readers. Idempotent.
    pub async fn shutdown(&self) {
        let sender = self.sender.lock().take();
        if let Some(sender) = sender {
            let (tx, rx) = oneshot::channel();
            if sender.send(Command::Shutdown(tx)).is_ok() {
                let _ = rx.await;
            }
        }
        if let Some(handle) = self.writer.lock().take() {
            let _ = handle.join();
        }
        if let Some((stop, handle)) = self.checkpointer.lock().take() {
            let _ = stop.send(Signal::Stop);
            let _ = handle.join();
        }
        let closed = std::mem::take(&mut *self.readers.lock());
        self.open_readers.fetch_sub(closed.len(), Ordering::Relaxed);
        self.scans.close();
    }
}

/// SQLite virtual-machine instructions between two checks of whether a scan's caller is
/// still waiting (a check is one atomic load).
const SCAN_CHECK_INSTRUCTIONS: std::ffi::c_int = 10_000;

/// Sets its flag when dropped: tells a scan its caller stopped waiting.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The writer: take one command (blocking), then everything already queued, and commit the
/// lot in one transaction.
fn writer_loop(
    conn: Connection,
    rx: mpsc::Receiver<Command>,
    db: std::sync::Weak<SqliteDatabase>,
    mut checkpoints: Nudger,
) {
    let mut batch: Vec<(JobFn, Isolation)> = Vec::with_capacity(MAX_GROUP);
    let mut stop: Option<oneshot::Sender<()>> = None;
    while stop.is_none() {
        let first = match rx.recv() {
            Ok(c) => c,
            Err(_) => break,
        };
        let mut next = Some(first);
        let mut pause = None;
        while let Some(cmd) = next.take() {
            match cmd {
                Command::Job(j, isolation) => batch.push((j, isolation)),
                Command::Shutdown(s) => {
                    stop = Some(s);
                    break;
                }
                Command::Pause(paused, release) => {
                    pause = Some((paused, release));
                    break;
                }
            }
            if batch.len() >= MAX_GROUP {
                break;
            }
            next = rx.try_recv().ok();
        }
        if !batch.is_empty() {
            commit_group(&conn, &mut batch);
            checkpoints.after_commit();
            if let Some(db) = db.upgrade() {
                db.commits.fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Some((paused, release)) = pause {
            // every write queued before the pause is committed; the next ones wait here
            if paused.send(()).is_ok() {
                let _ = release.recv();
            }
        }
    }
    let _ = conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE); PRAGMA optimize");
    drop(conn);
    if let Some(s) = stop {
        let _ = s.send(());
    }
}

/// Runs one transaction-control statement from the statement cache: `execute_batch` would
/// parse it again for every job of every group.
fn run(conn: &Connection, sql: &str) -> rusqlite::Result<usize> {
    conn.prepare_cached(sql)?.execute([])
}

/// Runs a group of jobs in one transaction, each in its own savepoint. If SQLite abandons the
/// transaction itself (disk full, I/O error), the remaining jobs are refused, not run, and
/// every caller of the group learns that nothing was committed.
///
/// A job alone in its group needs no savepoint: the transaction is its own, so a failure
/// rolls the whole of it back. That spares copying every page the job changes into the
/// statement journal (a processor's batch changes hundreds of rows: its journal outgrew
/// memory and SQLite created and deleted a temporary file for it on every commit).
fn commit_group(conn: &Connection, batch: &mut Vec<(JobFn, Isolation)>) {
    let alone = batch.len() == 1;
    if let Err(e) = run(conn, "BEGIN IMMEDIATE") {
        let err = query_error(e);
        tracing::error!(error = %err, "sqlite writer cannot begin a transaction");
        for (job, _) in batch.drain(..) {
            (job(Err(err.clone())).reply)(None);
        }
        return;
    }
    let mut replies = Vec::with_capacity(batch.len());
    let mut lost: Option<StoreError> = None;
    for (job, isolation) in batch.drain(..) {
        if let Some(err) = &lost {
            replies.push(job(Err(err.clone())).reply);
            continue;
        }
        let savepoint = isolation == Isolation::Savepoint && !alone;
        if savepoint {
            if let Err(e) = run(conn, "SAVEPOINT job") {
                replies.push(job(Err(query_error(e))).reply);
                continue;
            }
        }
        let outcome = job(Ok(conn));
        if conn.is_autocommit() {
            // SQLite rolled the whole transaction back
            lost = Some(StoreError::Query(
                "the write transaction was rolled back by SQLite; nothing was stored".into(),
            ));
        } else if alone && isolation == Isolation::Savepoint {
            if !outcome.keep {
                // nothing else is in the transaction: undo all of it, commit nothing
                let _ = run(conn, "ROLLBACK");
            }
        } else if !savepoint {
            // a failed single statement was undone by SQLite itself
        } else if outcome.keep {
            let _ = run(conn, "RELEASE job");
        } else {
            let _ = run(conn, "ROLLBACK TO job").and_then(|_| run(conn, "RELEASE job"));
        }
        replies.push(outcome.reply);
    }
    let result = match lost {
        Some(err) => Err(err),
        // a lone job that failed was rolled back above
        None if conn.is_autocommit() => Ok(0),
        None => run(conn, "COMMIT").map_err(query_error),
    };
    match result {
        Ok(_) => replies.into_iter().for_each(|r| r(None)),
        Err(err) => {
            tracing::error!(error = %err, "sqlite group commit failed");
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            replies.into_iter().for_each(|r| r(Some(&err)));
        }
    }
}

#[async_trait::async_trait]
impl meshql_core::Database for SqliteDatabase {
    fn backend(&self) -> &'static str {
        "sqlite"
    }
    fn store(self: std::sync::Arc<Self>, table: &str) -> meshql_core::DynStore {
        std::sync::Arc::new(crate::SqliteStore::new(self, table))
    }
    fn file_snapshots(
        self: std::sync::Arc<Self>,
    ) -> Option<std::sync::Arc<dyn meshql_core::FileSnapshots>> {
        Some(self)
    }
    async fn close(&self) {
        self.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn rows(db: &SqliteDatabase) -> i64 {
        db.write(|c| {
            c.query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
                .map_err(query_error)
        })
        .await
        .unwrap()
    }

    /// A job that inserts `n` rows, then fails when `fail`.
    async fn insert_then(db: &SqliteDatabase, n: usize, fail: bool) -> Result<(), StoreError> {
        db.write(move |c| {
            for _ in 0..n {
                c.execute("INSERT INTO t VALUES (zeroblob(1000))", [])
                    .map_err(query_error)?;
            }
            if fail {
                return Err(StoreError::Query("failed on purpose".into()));
            }
            Ok(())
        })
        .await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_job_leaves_nothing_and_concurrent_jobs_keep_theirs() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f.db");
        let db = SqliteDatabase::open(&file, SqliteOptions::default()).unwrap();
        blob_table(&db, &file).await;
        // alone in its transaction (no savepoint): large enough to have spilled a statement
        // journal to a file before
        assert!(insert_then(&db, 200, true).await.is_err());
        assert_eq!(rows(&db).await, 0);
        insert_then(&db, 3, false).await.unwrap();
        assert_eq!(rows(&db).await, 3);
        // concurrent jobs (queued together they share a transaction, though this does not force
        // them to): each failed one undoes only its own
        let mut jobs = tokio::task::JoinSet::new();
        for i in 0..8 {
            let db = db.clone();
            jobs.spawn(async move { insert_then(&db, 50, i % 2 == 1).await.is_ok() });
        }
        let kept = jobs.join_all().await.into_iter().filter(|ok| *ok).count() as i64;
        assert_eq!(kept, 4);
        assert_eq!(rows(&db).await, 3 + kept * 50);
        db.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_checkpointer_moves_commits_into_the_database_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.db");
        let db = SqliteDatabase::open(&file, SqliteOptions::default()).unwrap();
        let before = blob_table(&db, &file).await;
        for _ in 0..20 {
            db.write(|c| {
                for _ in 0..100 {
                    c.execute("INSERT INTO t VALUES (zeroblob(1000))", [])
                        .map_err(query_error)?;
                }
                Ok(())
            })
            .await
            .unwrap();
        }
        // commits land in the WAL; only a checkpoint grows the database file itself, and the
        // writer no longer runs any (wal_autocheckpoint = 0)
        grows_past(&file, before + 1_500_000).await;
        db.shutdown().await;
        // a clean shutdown leaves an empty WAL
        let wal = std::fs::metadata(dir.path().join("c.db-wal")).map_or(0, |m| m.len());
        assert_eq!(wal, 0);
    }

    /// Creates the table `t (b BLOB)` the checkpoint tests fill; returns the file's length.
    async fn blob_table(db: &SqliteDatabase, file: &Path) -> u64 {
        db.write(|c| {
            c.execute_batch("CREATE TABLE t (b BLOB)")
                .map_err(query_error)
        })
        .await
        .unwrap();
        std::fs::metadata(file).unwrap().len()
    }

    /// Waits until `file` is at least `len` bytes long (a checkpoint copied pages into it).
    async fn grows_past(file: &Path, len: u64) {
        // a bound only so that a lost checkpoint fails instead of hanging
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::fs::metadata(file).unwrap().len() < len {
            assert!(std::time::Instant::now() < deadline, "no checkpoint");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    async fn insert_kib(db: &SqliteDatabase, kib: usize) {
        db.write(move |c| {
            for _ in 0..kib {
                c.execute("INSERT INTO t VALUES (zeroblob(1000))", [])
                    .map_err(query_error)?;
            }
            Ok(())
        })
        .await
        .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_writer_asks_for_a_checkpoint_once_the_wal_grew_by_the_policy_pages() {
        // the timer never fires here: only the writer's nudges can start a checkpoint
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("n.db");
        let options = SqliteOptions {
            checkpoints: CheckpointPolicy {
                pages: 64,
                interval: std::time::Duration::from_secs(3600),
                restart_pages: 1 << 20,
            },
            ..SqliteOptions::default()
        };
        let db = SqliteDatabase::open(&file, options).unwrap();
        let before = blob_table(&db, &file).await;
        // 40 commits of ~100 KiB: ~1,000 pages, so ~15 nudges
        for _ in 0..40 {
            insert_kib(&db, 100).await;
        }
        grows_past(&file, before + 2_000_000).await;
        db.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_quiet_database_is_checkpointed_by_the_timer() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("q.db");
        let options = SqliteOptions {
            checkpoints: CheckpointPolicy {
                pages: 1 << 20,
                interval: std::time::Duration::from_millis(50),
                restart_pages: 1 << 20,
            },
            ..SqliteOptions::default()
        };
        let db = SqliteDatabase::open(&file, options).unwrap();
        let before = blob_table(&db, &file).await;
        insert_kib(&db, 50).await;
        grows_past(&file, before + 40_000).await;
        db.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failing_single_statement_job_needs_no_savepoint_to_stay_alone() {
        let dir = tempfile::tempdir().unwrap();
        let db = SqliteDatabase::open(&dir.path().join("s.db"), SqliteOptions::default()).unwrap();
        db.write(|c| {
            c.execute_batch(
                "CREATE TABLE t (n INTEGER UNIQUE, m INTEGER); INSERT INTO t VALUES (0, 0)",
            )
            .map_err(query_error)
        })
        .await
        .unwrap();
        let mut tasks = Vec::new();
        for n in 0..40i64 {
            let db = db.clone();
            tasks.push(tokio::spawn(async move {
                // every fourth job collides on the UNIQUE column: a multi-row statement whose
                // second row fails, so SQLite must undo its first row by itself
                let first = if n % 4 == 0 { 1000 + n } else { 100 + n };
                let second = if n % 4 == 0 { 0 } else { 200 + n };
                db.write_single_statement(move |c| {
                    c.execute("INSERT INTO t VALUES (?1, 1), (?2, 1)", [first, second])
                        .map_err(query_error)
                })
                .await
            }));
        }
        let mut failed = 0;
        for t in tasks {
            if t.await.unwrap().is_err() {
                failed += 1;
            }
        }
        assert_eq!(failed, 10);
        let (kept, undone): (i64, i64) = db
            .read(|c| {
                c.query_row(
                    "SELECT (SELECT COUNT(*) FROM t WHERE m = 1), (SELECT COUNT(*) FROM t WHERE n >= 1000)",
                    [],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .map_err(query_error)
            })
            .unwrap();
        assert_eq!((kept, undone), (60, 0));
        db.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failing_job_does_not_undo_the_others_in_its_group() {
        let dir = tempfile::tempdir().unwrap();
        let db = SqliteDatabase::open(&dir.path().join("g.db"), SqliteOptions::default()).unwrap();
        db.write(|c| {
            c.execute_batch("CREATE TABLE t (n INTEGER)")
                .map_err(query_error)
        })
        .await
        .unwrap();
        let mut tasks = Vec::new();
        for n in 0..40i64 {
            let db = db.clone();
            tasks.push(tokio::spawn(async move {
                db.write(move |c| {
                    c.execute("INSERT INTO t VALUES (?1)", [n])
                        .map_err(query_error)?;
                    if n % 4 == 0 {
                        // fails after writing: its insert must be undone, and only its own
                        c.execute("INSERT INTO missing VALUES (1)", [])
                            .map_err(query_error)?;
                    }
                    Ok(n)
                })
                .await
            }));
        }
        let mut failed = 0;
        for t in tasks {
            if t.await.unwrap().is_err() {
                failed += 1;
            }
        }
        assert_eq!(failed, 10);
        let count: i64 = db
            .read(|c| {
                c.query_row("SELECT COUNT(*) FROM t WHERE n % 4 != 0", [], |r| r.get(0))
                    .map_err(query_error)
            })
            .unwrap();
        let undone: i64 = db
            .read(|c| {
                c.query_row("SELECT COUNT(*) FROM t WHERE n % 4 = 0", [], |r| r.get(0))
                    .map_err(query_error)
            })
            .unwrap();
        assert_eq!((count, undone), (30, 0));
        db.shutdown().await;
    }

    fn bounded(scans: usize, idle: usize) -> SqliteOptions {
        SqliteOptions {
            concurrent_scans: scans,
            idle_readers: idle,
            ..SqliteOptions::default()
        }
    }

    /// Every connection to the file gets the configured page cache: the readers, the
    /// writer (through a job), and the default is 512 KiB.
    #[tokio::test]
    async fn connections_get_the_configured_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let cache = |c: &Connection| -> Result<i64, StoreError> {
            c.query_row("PRAGMA cache_size", [], |r| r.get(0))
                .map_err(query_error)
        };
        let db = SqliteDatabase::open(
            &dir.path().join("c.db"),
            SqliteOptions {
                page_cache_kib: 300,
                ..SqliteOptions::default()
            },
        )
        .unwrap();
        assert_eq!(db.read(cache).unwrap(), -300);
        assert_eq!(db.write(move |c| cache(c)).await.unwrap(), -300);
        let db = SqliteDatabase::open(&dir.path().join("d.db"), SqliteOptions::default()).unwrap();
        assert_eq!(db.read(cache).unwrap(), -512);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_more_scans_run_at_once_than_permitted() {
        let dir = tempfile::tempdir().unwrap();
        let db = SqliteDatabase::open(&dir.path().join("s.db"), bounded(2, 4)).unwrap();
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let scans: Vec<_> = (0..24)
            .map(|_| {
                let (db, running, most) = (db.clone(), running.clone(), most.clone());
                tokio::spawn(async move {
                    db.scan(move |c| {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(10));
                        let one: i64 = c
                            .query_row("SELECT 1", [], |r| r.get(0))
                            .map_err(query_error)?;
                        running.fetch_sub(1, Ordering::SeqCst);
                        Ok(one)
                    })
                    .await
                })
            })
            .collect();
        for s in scans {
            assert_eq!(s.await.unwrap().unwrap(), 1);
        }
        assert_eq!(
            most.load(Ordering::SeqCst),
            2,
            "two scans at once, never more"
        );
        assert!(db.open_readers() <= 4, "{} readers open", db.open_readers());
        db.shutdown().await;
        assert_eq!(db.open_readers(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_opened_for_a_burst_are_closed_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let db = SqliteDatabase::open(&dir.path().join("b.db"), bounded(2, 3)).unwrap();
        let burst = 12;
        let inside = Arc::new(std::sync::Barrier::new(burst + 1));
        let leave = Arc::new(std::sync::Barrier::new(burst + 1));
        let readers: Vec<_> = (0..burst)
            .map(|_| {
                let (db, inside, leave) = (db.clone(), inside.clone(), leave.clone());
                std::thread::spawn(move || {
                    db.read(|c| {
                        inside.wait();
                        leave.wait();
                        c.query_row("SELECT 1", [], |r| r.get::<_, i64>(0))
                            .map_err(query_error)
                    })
                })
            })
            .collect();
        inside.wait();
        // every thread holds a connection of its own at once
        assert_eq!(db.open_readers(), burst);
        leave.wait();
        for r in readers {
            assert_eq!(r.join().unwrap().unwrap(), 1);
        }
        assert_eq!(db.open_readers(), 3, "the idle ones beyond 3 are closed");
        assert_eq!(db.readers.lock().len(), 3);
        db.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_scan_whose_caller_gave_up_stops_and_frees_its_slot() {
        let dir = tempfile::tempdir().unwrap();
        let db = SqliteDatabase::open(&dir.path().join("a.db"), bounded(1, 2)).unwrap();
        // counts to 10^12: hours of work unless interrupted
        let endless = db.scan(|c| {
            c.query_row(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000000000000) \
                 SELECT count(*) FROM n",
                [],
                |r| r.get::<_, i64>(0),
            )
            .map_err(query_error)
        });
        let gave_up = tokio::time::timeout(std::time::Duration::from_millis(50), endless).await;
        assert!(gave_up.is_err(), "the endless scan cannot have finished");
        // the only slot is free again once the abandoned scan is interrupted (a hang guard,
        // not a timing requirement: uninterrupted, the scan would hold the slot for hours)
        let next = tokio::time::timeout(
            std::time::Duration::from_secs(60),
            db.scan(|c| {
                c.query_row("SELECT 7", [], |r| r.get::<_, i64>(0))
                    .map_err(query_error)
            }),
        )
        .await
        .expect("the abandoned scan still holds the only slot")
        .unwrap();
        assert_eq!(next, 7);
        db.shutdown().await;
    }
}
