//! A log's identity: `log.id` in its directory, a random id written once when the log is
//! created (see [`crate::Log::id`]).

use crate::error::io_at;
use crate::LogError;
use std::fs;
use std::io;
use std::path::Path;

const FILE: &str = "log.id";

/// The id of the log in `dir`, if it has one.
pub(crate) fn read(dir: &Path) -> Result<Option<String>, LogError> {
    let path = dir.join(FILE);
    match fs::read_to_string(&path) {
        Ok(text) if !text.trim().is_empty() => Ok(Some(text.trim().to_owned())),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_at(&path)(e)),
    }
}

/// The id of the log in `dir`, written first when it has none (under the writer's lock: a
/// new log, or one written before logs had ids). Written to a temporary file and renamed, so
/// a crash leaves either no id or the whole one.
pub(crate) fn ensure(dir: &Path) -> Result<String, LogError> {
    if let Some(id) = read(dir)? {
        return Ok(id);
    }
    let id = uuid::Uuid::new_v4().to_string();
    let tmp = dir.join(format!("{FILE}.tmp"));
    fs::write(&tmp, format!("{id}\n")).map_err(io_at(&tmp))?;
    fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(io_at(&tmp))?;
    let path = dir.join(FILE);
    fs::rename(&tmp, &path).map_err(io_at(&path))?;
    crate::segment::sync_dir(dir).map_err(io_at(dir))?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_written_once_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), None);
        let id = ensure(dir.path()).unwrap();
        assert_eq!(id.len(), 36);
        assert_eq!(ensure(dir.path()).unwrap(), id, "the same on every open");
        assert_eq!(read(dir.path()).unwrap(), Some(id.clone()));
        let other = tempfile::tempdir().unwrap();
        assert_ne!(ensure(other.path()).unwrap(), id, "another log, another id");
    }
}
