//! The error type.

use std::io;
use std::path::{Path, PathBuf};

/// Errors of [`Log`](crate::Log) and [`LogReader`](crate::LogReader).
#[derive(thiserror::Error, Debug)]
pub enum LogError {
    /// A file operation failed.
    #[error("log I/O error on {}: {source}", path.display())]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Stored data is not what the log wrote (bad checksum, impossible length, offsets out of
    /// sequence, a segment shorter than its neighbours say, an unreadable group file).
    #[error("corrupt log data in {} at byte {position}: {reason}", path.display())]
    Corrupt {
        /// The damaged file.
        path: PathBuf,
        /// Byte position of the damage in that file.
        position: u64,
        /// What is wrong.
        reason: String,
    },
    /// Another writer (another process, or another [`Log`](crate::Log) in this one) has the log
    /// open.
    #[error("log {} is locked by another writer{}", dir.display(), holder.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    Locked {
        /// The log directory.
        dir: PathBuf,
        /// The pid recorded in the lock file by the holder, when readable.
        holder: Option<u32>,
    },
    /// A consumer-group name outside `[A-Za-z0-9._-]{1,100}` (or `.` / `..`).
    #[error("invalid consumer group name {0:?}: use 1 to 100 of A-Z a-z 0-9 . _ - (not \".\" or \"..\")")]
    InvalidGroup(String),
    /// A record larger than [`MAX_RECORD_BYTES`](crate::MAX_RECORD_BYTES).
    #[error("record of {0} bytes is larger than the limit of {max} bytes", max = crate::MAX_RECORD_BYTES)]
    RecordTooLarge(usize),
    /// An earlier write or fsync failed in a way that leaves the end of the active segment
    /// uncertain; appends are refused until the log is reopened (which recovers the tail).
    #[error("the log writer stopped after a failed write or fsync; reopen the log")]
    Poisoned,
}

/// The broad category of a [`LogError`], for callers that branch on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// [`LogError::Io`]
    Io,
    /// [`LogError::Corrupt`]
    Corrupt,
    /// [`LogError::Locked`]
    Locked,
    /// [`LogError::InvalidGroup`]
    InvalidGroup,
    /// [`LogError::RecordTooLarge`]
    RecordTooLarge,
    /// [`LogError::Poisoned`]
    Poisoned,
}

impl LogError {
    /// The category of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            LogError::Io { .. } => ErrorKind::Io,
            LogError::Corrupt { .. } => ErrorKind::Corrupt,
            LogError::Locked { .. } => ErrorKind::Locked,
            LogError::InvalidGroup(_) => ErrorKind::InvalidGroup,
            LogError::RecordTooLarge(_) => ErrorKind::RecordTooLarge,
            LogError::Poisoned => ErrorKind::Poisoned,
        }
    }

    /// True for an I/O error saying a file does not exist (a segment deleted by retention).
    pub(crate) fn is_not_found(&self) -> bool {
        matches!(self, LogError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }

    pub(crate) fn corrupt(path: &Path, position: u64, reason: impl Into<String>) -> LogError {
        LogError::Corrupt {
            path: path.to_path_buf(),
            position,
            reason: reason.into(),
        }
    }
}

/// `map_err` helper: attaches a path to an `io::Error`.
pub(crate) fn io_at(path: &Path) -> impl FnOnce(io::Error) -> LogError + '_ {
    move |source| LogError::Io {
        path: path.to_path_buf(),
        source,
    }
}
