//! A durable, embedded, append-only log: a single-node, single-partition log stored in local
//! files, used by meshql for its change feed.
//!
//! One process writes ([`Log`]); any number of threads in that process and any number of other
//! processes on the same machine read ([`Log::read`], [`LogReader`]). Records are opaque bytes
//! to the log; each gets a dense offset (the first record ever is 1) and an append timestamp.
//! Consumer groups keep a committed offset each ([`Log::commit`], [`Log::committed`]).
//!
//! # Directory layout
//!
//! ```text
//! dir/
//!   LOCK                          flock(2)ed by the writer; holds its pid (for humans)
//!   00000000000000000001.seg      segments, named by base offset (first offset they hold),
//!   00000000000000052817.seg      20 digits zero-padded so names sort like offsets
//!   groups/<group>                committed offset of a consumer group, decimal text
//! ```
//!
//! # Segment and frame format
//!
//! A segment is a sequence of frames with nothing before, between or after them. A frame is
//! a 24-byte header followed by the record bytes, all integers little-endian:
//!
//! ```text
//! 0..4    length      u32  number of record bytes that follow the header (at most 1 GiB)
//! 4..8    crc         u32  CRC-32 (IEEE, crc32fast) of length, offset and timestamp_ms
//!                          (in that order, as encoded here) followed by the record bytes
//! 8..16   offset      u64  the record's offset; frame i of a segment has offset base + i
//! 16..24  timestamp   i64  milliseconds since the Unix epoch, taken at append
//! 24..    data        length bytes
//! ```
//!
//! Segments are contiguous: a segment's last offset is the next segment's base minus one, so
//! the next segment's name is always predictable. The newest segment is the *active* one; an
//! append that would grow a non-empty active segment past `segment_bytes` first *rolls*: a new
//! segment named by the next offset is created and becomes active (a single batch is never
//! split, so one larger than `segment_bytes` gets a segment to itself). Closed segments never
//! change again, except that retention deletes whole ones, oldest first, never the active one.
//!
//! # Reading
//!
//! Each segment has an in-memory sparse index (an entry every 4 KiB of frames: offset → file
//! position) built as frames are appended or first scanned, so a read from offset P seeks to
//! the nearest entry at or before P and scans at most ~4 KiB before it finds P. A small cache
//! remembers where recent reads ended, so a consumer that tails the log continues exactly where
//! it stopped. Reads run through their own read-only file handles (`pread`), outside the
//! writer's lock, so they never wait for an append's write or fsync.
//!
//! # Recovery
//!
//! [`Log::open`] lists the segments and scans the active (last) one from the start, checking
//! each frame: the header and data must lie inside the file, the CRC must match and the offset
//! must be the expected next one. The file is truncated (and fsynced) at the first frame that
//! fails — a frame torn by a crash in the middle of a write, or corrupted bytes — and appends
//! continue right after the last good record. A crash during a roll can leave an empty active
//! segment; its name is the next offset, so that case needs nothing special. Closed segments
//! are not scanned at open (they are indexed lazily when first read); damage found in them
//! later is reported as [`LogError::Corrupt`].
//!
//! [`LogReader`] (other processes) takes no lock and never modifies files. It treats the end of
//! the newest segment the same way but without truncating: it stops before a frame that is not
//! complete or not valid yet (the writer may be in the middle of writing it) and picks it up
//! on a later call. It notices a roll by checking whether the segment named by its next
//! expected offset exists, so tailing costs a couple of `stat`s, not a directory listing.
//!
//! # Locking
//!
//! The writer takes an exclusive, non-blocking `flock(2)` on `dir/LOCK` for as long as the
//! [`Log`] (all its clones) lives; a second writer — another process, or a second
//! [`Log::open`] in the same process, since `flock` locks belong to open file descriptions —
//! gets [`LogError::Locked`]. The kernel drops the lock when the process dies, so a crash never
//! leaves a stale lock. Readers take no lock. (On non-Unix targets the lock is not enforced.)
//!
//! # Durability (fsync policies)
//!
//! Every append is one `pwrite` of all its frames; once `append` returns, the records are in
//! the OS page cache and visible to readers in any process, and survive a crash of the writer
//! process. What survives a crash of the *machine* depends on [`FsyncPolicy`]:
//!
//! * [`FsyncPolicy::Always`]: `append` fsyncs (`fdatasync`) before it returns; an append that
//!   returned is durable.
//! * [`FsyncPolicy::Interval`] (default, 1 s): a background thread fsyncs the active segment
//!   when it has unsynced appends; a machine crash loses at most about one interval.
//! * [`FsyncPolicy::Never`]: the log never fsyncs on its own (the OS writes back when it
//!   likes); only [`Log::flush`] does. A machine crash can lose or damage any unsynced data,
//!   even in closed segments, which would then read as corrupt.
//!
//! With `Always` and `Interval` a segment is fsynced when it is closed by a roll, and the
//! directory is fsynced when a segment is created. Consumer-group commits are always durable
//! and atomic (temporary file, fsync, rename, fsync of the directory), whatever the policy.
#![warn(missing_docs)]

mod copy;
mod error;
mod flusher;
mod frame;
mod groups;
mod identity;
mod index;
mod lock;
mod log;
mod pio;
mod reader;
mod retention;
mod segment;
mod view;

use std::time::Duration;

pub use crate::copy::{copy_prefix, truncate_after, PrefixCopy};
pub use crate::error::{ErrorKind, LogError};
pub use crate::frame::{HEADER_LEN, MAX_RECORD_BYTES};
pub use crate::log::{Log, Recovery};
pub use crate::reader::LogReader;

/// An exclusive advisory lock (`flock`) on a file, held until dropped or the process ends:
/// what lets one process, of several on a machine, own a task (a processor of the log).
#[derive(Debug)]
pub struct FileLock {
    _lock: lock::DirLock,
}

impl FileLock {
    /// Takes the lock on `path` (created if missing) without waiting;
    /// [`LogError::Locked`] with the holder's pid when another process has it.
    pub fn acquire(path: &std::path::Path) -> Result<FileLock, LogError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(crate::error::io_at(dir))?;
        }
        Ok(FileLock {
            _lock: lock::acquire_file(path, path)?,
        })
    }
}

/// When the writer fsyncs appended data (see the crate docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// Fsync before every `append` returns.
    Always,
    /// Fsync from a background thread at this interval, when there is unsynced data.
    Interval(Duration),
    /// Never fsync except on [`Log::flush`].
    Never,
}

impl Default for FsyncPolicy {
    fn default() -> Self {
        FsyncPolicy::Interval(Duration::from_secs(1))
    }
}

/// How much of the log to keep. Retention deletes whole closed segments, oldest first; the
/// active segment is always kept, so the log can hold more than `max_bytes` (up to about one
/// segment more) and records older than `max_age`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Retention {
    /// Delete the oldest closed segments while all segments together are larger than this.
    pub max_bytes: Option<u64>,
    /// Delete the oldest closed segments whose newest record is older than this.
    pub max_age: Option<Duration>,
}

/// Options for [`Log::open`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogOptions {
    /// Roll to a new segment when an append would make the active one larger than this
    /// (default 64 MiB).
    pub segment_bytes: u64,
    /// When to fsync (default: every second).
    pub fsync: FsyncPolicy,
    /// What to keep (default: everything).
    pub retention: Retention,
}

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            segment_bytes: 64 * 1024 * 1024,
            fsync: FsyncPolicy::default(),
            retention: Retention::default(),
        }
    }
}

/// One record read from the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Dense, starting at 1.
    pub offset: u64,
    /// Milliseconds since the Unix epoch when the record was appended.
    pub timestamp_ms: i64,
    /// The record bytes, as appended.
    pub data: Vec<u8>,
}

/// Milliseconds since the Unix epoch (negative before it).
pub(crate) fn now_ms() -> i64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
    }
}
