//! How many backups a directory keeps: after each new one, the oldest beyond `keep` go.

use super::list;
use std::path::{Path, PathBuf};

/// Deletes the oldest backups in `dir` beyond the newest `keep` (0 keeps all); returns
/// those deleted. The manifest goes first, so one deleted halfway is not taken for whole.
pub fn prune(dir: &Path, keep: u32) -> Vec<PathBuf> {
    if keep == 0 {
        return Vec::new();
    }
    let mut deleted = Vec::new();
    for old in list(dir).into_iter().skip(keep as usize) {
        let _ = std::fs::remove_file(old.path.join(super::MANIFEST));
        if std::fs::remove_dir_all(&old.path).is_ok() {
            deleted.push(old.path);
        }
    }
    deleted
}
