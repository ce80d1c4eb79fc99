//! The writer's exclusive advisory lock on `dir/LOCK`.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use crate::error::{io_at, LogError};

/// Holds the lock until dropped (closing the file releases it; so does the process dying).
#[derive(Debug)]
pub(crate) struct DirLock {
    _file: File,
}

/// Takes an exclusive `flock` on `dir/LOCK` without waiting, and writes our pid into it.
pub(crate) fn acquire(dir: &Path) -> Result<DirLock, LogError> {
    acquire_file(&dir.join("LOCK"), dir)
}

/// Takes an exclusive `flock` on `path` without waiting (creating it), and writes our pid
/// into it; [`LogError::Locked`] names `owner` when another process holds it.
pub(crate) fn acquire_file(path: &Path, owner: &Path) -> Result<DirLock, LogError> {
    let path = path.to_path_buf();
    let dir = owner;
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io_at(&path))?;
    if !try_lock(&file).map_err(io_at(&path))? {
        let mut text = String::new();
        let holder = file
            .read_to_string(&mut text)
            .ok()
            .and_then(|_| text.trim().parse().ok());
        return Err(LogError::Locked {
            dir: dir.to_path_buf(),
            holder,
        });
    }
    // The pid is only informative; failing to record it does not matter.
    let _ = file
        .set_len(0)
        .and_then(|_| file.seek(SeekFrom::Start(0)))
        .and_then(|_| writeln!(file, "{}", std::process::id()));
    Ok(DirLock { _file: file })
}

/// True if the lock was taken, false if someone else holds it.
#[cfg(unix)]
fn try_lock(file: &File) -> std::io::Result<bool> {
    use std::os::unix::io::AsRawFd;
    loop {
        // SAFETY: flock on a file descriptor we own for the duration of the call.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(true);
        }
        let err = std::io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(code) if code == libc::EWOULDBLOCK || code == libc::EAGAIN => return Ok(false),
            _ => return Err(err),
        }
    }
}

/// Not enforced off Unix (see the crate docs).
#[cfg(not(unix))]
fn try_lock(_file: &File) -> std::io::Result<bool> {
    Ok(true)
}
