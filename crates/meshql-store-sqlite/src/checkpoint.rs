//! WAL checkpoints, off the commit path and sized so that they rarely stall it.
//!
//! In WAL mode a commit appends pages to the `-wal` file; a checkpoint copies them into the
//! database file. SQLite's automatic checkpoint runs inside the commit that crosses 1000
//! WAL pages, while every writer waits. Here the writer connection has automatic checkpoints
//! off and a WAL hook that tells the writer thread how many pages the log holds after each
//! commit; the writer nudges a checkpointer thread, with a connection of its own, every
//! [`CheckpointPolicy::pages`] new pages. The checkpointer then runs a `PASSIVE` checkpoint,
//! which copies what no reader still needs and never blocks the writer, and also wakes on a
//! timer so that a quiet database is checkpointed too.
//!
//! What stalls a commit, measured (docs/BENCHMARKS.md "Tail latency"; `perf trace` of the
//! server under one writer):
//!
//! - every checkpoint `fsync`s the WAL before copying, and a commit appending to the WAL
//!   while that runs can wait for it; the `fsync` takes longer the more the log grew since the
//!   last one (4,000-page checkpoints: 10–15 ms, and p99 17 ms), so checkpoints are asked for
//!   every [`CheckpointPolicy::pages`] (500 by default) rather than on a timer that lets the
//!   log grow with the write rate;
//! - truncating the WAL file when the log restarts (`journal_size_limit`) took the writer
//!   10–20 ms of `ftruncate`; the file is no longer cut back while serving (it stays at its
//!   high-water mark, about `restart_pages` × 4 KiB) and is truncated at a clean shutdown;
//! - during a `RESTART` the writer found the database locked and slept in SQLite's default
//!   busy handler (1, 2, 5… ms); both connections now retry every 50 µs.
//!
//! Under a steady stream of reads and writes the log never gets a moment to restart by
//! itself (readers keep using its frames), so once it holds more than
//! [`CheckpointPolicy::restart_pages`] the checkpointer runs a `RESTART` checkpoint right after
//! the `PASSIVE` one (little is left to copy), which holds the writer back until readers have
//! moved to the newest snapshot, or gives up after ~2 ms and tries again later.

use rusqlite::hooks::Wal;
use rusqlite::Connection;
use std::cell::Cell;
use std::os::raw::c_int;
use std::sync::mpsc;
use std::time::Duration;

/// The writer's busy handler. SQLite's own sleeps 1, 2, 5, 10… ms between tries, so a lock
/// held for 100 µs (a `RESTART` checkpoint) cost the waiting commit a millisecond or more.
/// This one tries every 50 µs, for up to 5 s.
pub(crate) fn writer_busy(tries: c_int) -> bool {
    if tries >= 100_000 {
        return false;
    }
    std::thread::sleep(Duration::from_micros(50));
    true
}

/// The checkpointer's busy handler, used only by `RESTART` (a `PASSIVE` checkpoint never
/// waits): it holds the writer lock while it waits for readers, so it gives up after ~2 ms
/// and tries again at the next checkpoint.
fn checkpointer_busy(tries: c_int) -> bool {
    if tries >= 40 {
        return false;
    }
    std::thread::sleep(Duration::from_micros(50));
    true
}

/// When checkpoints run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointPolicy {
    /// New WAL pages (of 4 KiB) after which the writer asks for a checkpoint.
    pub pages: u32,
    /// A checkpoint runs at least this often while there is anything to copy.
    pub interval: Duration,
    /// WAL length (pages) beyond which the log is restarted from its beginning.
    pub restart_pages: u32,
}

impl Default for CheckpointPolicy {
    fn default() -> Self {
        Self {
            pages: 500,
            interval: Duration::from_secs(1),
            restart_pages: 4096,
        }
    }
}

pub(crate) enum Signal {
    /// The WAL grew by [`CheckpointPolicy::pages`].
    Nudge,
    Stop,
}

thread_local! {
    /// Pages in the WAL after the last commit of the writer connection on this thread.
    static WAL_PAGES: Cell<c_int> = const { Cell::new(0) };
}

fn record_wal_pages(_: &Wal, pages: c_int) -> rusqlite::Result<()> {
    WAL_PAGES.with(|p| p.set(pages));
    Ok(())
}

/// The writer's side: installed on the writer connection, consulted after each commit.
pub(crate) struct Nudger {
    signal: mpsc::Sender<Signal>,
    every: c_int,
    next: c_int,
}

impl Nudger {
    /// Installs the WAL hook on `conn` (after `wal_autocheckpoint` was set: that pragma
    /// replaces the hook).
    pub(crate) fn install(
        conn: &Connection,
        policy: CheckpointPolicy,
        signal: mpsc::Sender<Signal>,
    ) -> Self {
        conn.wal_hook(Some(record_wal_pages));
        let every = policy.pages.max(1) as c_int;
        Self {
            signal,
            every,
            next: every,
        }
    }

    /// After a commit: asks for a checkpoint when the log grew by `pages` since the last ask.
    pub(crate) fn after_commit(&mut self) {
        let pages = WAL_PAGES.with(Cell::get);
        if pages < self.next - self.every {
            // the log restarted
            self.next = pages + self.every;
        }
        if pages >= self.next {
            self.next = pages + self.every;
            let _ = self.signal.send(Signal::Nudge);
        }
    }
}

/// The checkpointer thread's loop, until [`Signal::Stop`] or every sender is gone.
pub(crate) fn run(conn: Connection, policy: CheckpointPolicy, signals: mpsc::Receiver<Signal>) {
    if let Err(e) = conn.busy_handler(Some(checkpointer_busy)) {
        tracing::warn!(error = %e, "sqlite checkpointer keeps the default busy handler");
    }
    loop {
        match signals.recv_timeout(policy.interval) {
            Ok(Signal::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
            Ok(Signal::Nudge) | Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        // nudges that queued up meanwhile are served by this one checkpoint
        loop {
            match signals.try_recv() {
                Ok(Signal::Nudge) => continue,
                Ok(Signal::Stop) | Err(mpsc::TryRecvError::Disconnected) => return,
                Err(mpsc::TryRecvError::Empty) => break,
            }
        }
        let passive = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i64>(1));
        let result = match passive {
            Ok(pages) if pages > i64::from(policy.restart_pages) => conn
                .query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(()))
                .map(|_| ()),
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            tracing::debug!(error = %e, "sqlite checkpoint deferred");
        }
    }
}
