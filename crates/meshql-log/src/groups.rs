//! Consumer-group offsets: one small file per group under `dir/groups/`, replaced atomically.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{io_at, LogError};
use crate::segment::sync_dir;

/// `dir/groups`
pub(crate) fn groups_dir(log_dir: &Path) -> PathBuf {
    log_dir.join("groups")
}

/// Group names are `[A-Za-z0-9._-]{1,100}`, except `.` and `..`.
pub(crate) fn validate(name: &str) -> Result<(), LogError> {
    let ok = (1..=100).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && name != "."
        && name != "..";
    if ok {
        Ok(())
    } else {
        Err(LogError::InvalidGroup(name.to_string()))
    }
}

/// Durably sets the group's offset: writes a temporary file (a name no group can have, unique
/// per process and call), fsyncs it, renames it over the group file and fsyncs the directory.
pub(crate) fn commit(log_dir: &Path, name: &str, offset: u64) -> Result<(), LogError> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    validate(name)?;
    let dir = groups_dir(log_dir);
    fs::create_dir_all(&dir).map_err(io_at(&dir))?;
    let target = dir.join(name);
    let tmp = dir.join(format!(
        "{name}.{}.{}.tmp~",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let written = (|| -> io::Result<()> {
        let mut f = File::create(&tmp)?;
        writeln!(f, "{offset}")?;
        f.sync_all()?;
        fs::rename(&tmp, &target)
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(io_at(&target)(e));
    }
    sync_dir(&dir).map_err(io_at(&dir))
}

/// The group's committed offset; `None` if it never committed.
pub(crate) fn committed(log_dir: &Path, name: &str) -> Result<Option<u64>, LogError> {
    validate(name)?;
    let path = groups_dir(log_dir).join(name);
    match fs::read_to_string(&path) {
        Ok(text) => match text.trim().parse() {
            Ok(offset) => Ok(Some(offset)),
            Err(_) => Err(LogError::corrupt(
                &path,
                0,
                "group file does not hold an offset",
            )),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_at(&path)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_names() {
        for good in [
            "a",
            "relay.kafka",
            "sse_1",
            "A-b.C_9",
            "...",
            ".x",
            &"x".repeat(100),
        ] {
            assert!(validate(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a b",
            "é",
            "a\0",
            "x~",
            &"x".repeat(101),
        ] {
            assert!(
                matches!(validate(bad), Err(LogError::InvalidGroup(_))),
                "{bad:?}"
            );
        }
    }
}
