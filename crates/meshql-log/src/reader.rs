//! [`LogReader`]: a read-only view of a log for other processes.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use crate::error::{io_at, LogError};
use crate::groups;
use crate::index::SparseIndex;
use crate::segment::{list_segments, scan_tail, segment_path};
use crate::view::{self, SegmentState, View};
use crate::Record;

/// A read-only view of a log directory written by a [`Log`](crate::Log) in another process
/// (or this one). Takes no lock and never modifies segment files. Each call looks at the files
/// again, so it sees records appended and segments created or deleted after it was opened.
/// It stops before a frame at the end of the newest segment that is not complete (or not
/// valid) yet, and returns it once the writer has finished it.
///
/// Calls on one `LogReader` are serialized while they re-check the files; use one reader per
/// consumer thread for parallel reads.
#[derive(Debug)]
pub struct LogReader {
    dir: PathBuf,
    view: Mutex<View>,
}

impl LogReader {
    /// Opens the log in `dir` for reading. The directory must exist; it may hold no segment
    /// yet (an empty log).
    pub fn open(dir: &Path) -> Result<LogReader, LogError> {
        let meta = fs::metadata(dir).map_err(io_at(dir))?;
        if !meta.is_dir() {
            return Err(io_at(dir)(std::io::Error::new(
                std::io::ErrorKind::NotADirectory,
                "not a directory",
            )));
        }
        let reader = LogReader {
            dir: dir.to_path_buf(),
            view: Mutex::new(View::new(dir, Vec::new())),
        };
        {
            let mut v = reader.view.lock();
            relist(&mut v)?;
            refresh_tail(&mut v)?;
        }
        Ok(reader)
    }

    /// The log directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The log's identity ([`Log::id`](crate::Log::id)); `None` until its writer created it.
    pub fn id(&self) -> Option<String> {
        crate::identity::read(&self.dir).ok().flatten()
    }

    /// Like [`Log::read`](crate::Log::read), after looking for new records.
    pub fn read(
        &self,
        after: u64,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Vec<Record>, LogError> {
        {
            let mut v = self.view.lock();
            refresh_tail(&mut v)?;
            // Reading behind the newest segment (catching up): list the segments again, so
            // ones retention deleted meanwhile are skipped rather than read through old
            // handles. Tailing reads skip this.
            if v.segments.len() > 1
                && after.saturating_add(1) < v.segments[v.segments.len() - 1].base
            {
                relist(&mut v)?;
            }
        }
        match view::read(&self.view, after, max_records, max_bytes) {
            // a segment was deleted by retention since we last listed them
            Err(e) if e.is_not_found() => {
                relist(&mut self.view.lock())?;
                view::read(&self.view, after, max_records, max_bytes)
            }
            other => other,
        }
    }

    /// The newest offset (0 if none), after looking for new records.
    pub fn last_offset(&self) -> Result<u64, LogError> {
        let mut v = self.view.lock();
        refresh_tail(&mut v)?;
        Ok(v.last_offset())
    }

    /// The oldest offset still kept (0 if none was ever appended), after listing the segments.
    pub fn first_offset(&self) -> Result<u64, LogError> {
        let mut v = self.view.lock();
        relist(&mut v)?;
        refresh_tail(&mut v)?;
        Ok(v.first_offset())
    }

    /// The group's committed offset, `None` if it never committed.
    pub fn committed(&self, group: &str) -> Result<Option<u64>, LogError> {
        groups::committed(&self.dir, group)
    }

    /// Durably records a group's offset, like [`Log::commit`](crate::Log::commit) (the group
    /// files are replaced atomically, so this is safe while the writer runs; the last commit
    /// wins).
    pub fn commit(&self, group: &str, offset: u64) -> Result<(), LogError> {
        groups::commit(&self.dir, group, offset)
    }
}

/// Lists the segment files again: keeps what is known about segments still there, adds new
/// ones and forgets deleted ones. Every segment but the newest is sealed.
fn relist(v: &mut View) -> Result<(), LogError> {
    let bases = list_segments(&v.dir)?;
    let mut known: HashMap<u64, SegmentState> = v.segments.drain(..).map(|s| (s.base, s)).collect();
    for (i, &base) in bases.iter().enumerate() {
        let seg = match bases.get(i + 1) {
            Some(&next) => {
                let mut seg = known
                    .remove(&base)
                    .unwrap_or_else(|| SegmentState::sealed(&v.dir, base, next));
                if !seg.sealed {
                    // It was the newest; the writer has moved on, so it is complete now. Its
                    // size is taken from the file again; the index stays valid.
                    seg.sealed = true;
                    seg.size = None;
                }
                seg.end_offset = next;
                seg
            }
            None => known.remove(&base).unwrap_or_else(|| {
                SegmentState::active(&v.dir, base, SparseIndex::new(base), None)
            }),
        };
        v.segments.push(seg);
    }
    Ok(())
}

/// Reads whatever the writer appended to the newest segment since the last look, and follows
/// it to newer segments: a roll creates the segment named by the next offset.
fn refresh_tail(v: &mut View) -> Result<(), LogError> {
    let mut relisted = false;
    loop {
        if v.segments.is_empty() {
            if relisted {
                return Ok(());
            }
            relist(v)?;
            relisted = true;
            continue;
        }
        let dir = v.dir.clone();
        let seg = v.segments.last_mut().expect("not empty");
        let scanned = seg.handle().and_then(|file| {
            let meta = file.metadata().map_err(io_at(&seg.path))?;
            let len = meta.len();
            if len > seg.index.frontier().1 {
                let tail = scan_tail(&file, &mut seg.index, len).map_err(io_at(&seg.path))?;
                seg.end_offset = tail.next_offset;
                seg.size = Some(tail.end_pos);
            }
            Ok(is_deleted(&meta, &seg.path))
        });
        match scanned {
            // Retention deletes oldest first: if our newest segment is gone, so are the ones
            // after it up to the writer's oldest; only a listing finds where it is now.
            Ok(true) if !relisted => {
                relist(v)?;
                relisted = true;
                continue;
            }
            Ok(_) => {}
            // deleted or not created yet as we look: list again, once
            Err(e) if e.is_not_found() && !relisted => {
                relist(v)?;
                relisted = true;
                continue;
            }
            Err(e) => return Err(e),
        }
        let base = seg.base;
        if !segment_path(&dir, seg.end_offset).exists() {
            return Ok(());
        }
        relist(v)?;
        if v.segments.last().map(|s| s.base) == Some(base) {
            return Ok(()); // vanished again; look next time
        }
    }
}

/// Whether an open segment file has been deleted (unlinked).
fn is_deleted(meta: &fs::Metadata, path: &Path) -> bool {
    #[cfg(unix)]
    {
        let _ = path;
        std::os::unix::fs::MetadataExt::nlink(meta) == 0
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        !path.exists()
    }
}
