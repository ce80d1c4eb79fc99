//! Copying a prefix of a log (a backup, while the writer appends) and cutting a log's tail
//! (a restore to an earlier moment).
//!
//! A prefix `[first, upto]` is the closed segments it covers, copied whole (they never change
//! again), and the part of the segment holding `upto` that ends with `upto`'s frame: the
//! frames are scanned from the segment's start (each checked as recovery checks it) to find
//! where that frame ends, and only those bytes are copied — what the writer appends after
//! them is not. The log's id comes along (positions stay meaningful: the copy is the same log,
//! shorter), and each consumer group's offset, lowered to `upto` when it went further.
//! Retention may delete the oldest closed segments meanwhile: the copy then starts at the
//! next one, as the log itself would.

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;

use crate::error::{io_at, LogError};
use crate::frame::{Scanner, Step};
use crate::groups::{self, groups_dir};
use crate::segment::{list_segments, segment_path, sync_dir};

/// What [`copy_prefix`] wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrefixCopy {
    /// The first offset copied (0 when nothing was).
    pub first_offset: u64,
    /// The last offset copied (`upto`, or 0 when nothing was).
    pub last_offset: u64,
    /// Bytes of segments written.
    pub bytes: u64,
    /// Consumer groups copied, with their (possibly lowered) offsets.
    pub groups: Vec<(String, u64)>,
}

/// Copies the log in `src` up to and including offset `upto` into the empty or missing
/// directory `dest` (see the module docs). `src` may be served by a writer meanwhile.
pub fn copy_prefix(src: &Path, dest: &Path, upto: u64) -> Result<PrefixCopy, LogError> {
    fs::create_dir_all(dest).map_err(io_at(dest))?;
    let mut copy = PrefixCopy::default();
    let bases = list_segments(src)?;
    for (i, &base) in bases.iter().enumerate() {
        if base > upto {
            break;
        }
        let from = segment_path(src, base);
        let to = segment_path(dest, base);
        let closed_before_upto = bases.get(i + 1).is_some_and(|&next| next - 1 <= upto);
        let written = if closed_before_upto {
            match copy_bytes(&from, &to, None) {
                Ok(n) => n,
                // retention took it meanwhile: the copy starts later, as the log now does
                Err(e) if e.kind() == io::ErrorKind::NotFound && copy.first_offset == 0 => {
                    continue;
                }
                Err(e) => return Err(io_at(&from)(e)),
            }
        } else {
            let end = frame_end(&from, base, upto)?;
            copy_bytes(&from, &to, Some(end)).map_err(io_at(&from))?
        };
        if copy.first_offset == 0 {
            copy.first_offset = base;
        }
        copy.bytes += written;
        copy.last_offset = upto;
    }
    if let Some(id) = crate::identity::read(src)? {
        write_synced(&dest.join("log.id"), format!("{id}\n").as_bytes()).map_err(io_at(dest))?;
    }
    let groups_src = groups_dir(src);
    if groups_src.is_dir() {
        for entry in fs::read_dir(&groups_src).map_err(io_at(&groups_src))? {
            let entry = entry.map_err(io_at(&groups_src))?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if groups::validate(&name).is_err() {
                continue; // a temporary file of a commit in progress
            }
            if let Some(offset) = groups::committed(src, &name)? {
                let offset = offset.min(upto);
                groups::commit(dest, &name, offset)?;
                copy.groups.push((name, offset));
            }
        }
    }
    copy.groups.sort();
    sync_dir(dest).map_err(io_at(dest))?;
    Ok(copy)
}

/// Deletes every record after `after` from the log in `dir`, which no writer may have open
/// (its lock is taken for the duration): later segments are removed, the one holding `after`
/// is cut after its frame, consumer groups are lowered to `after`. `after = 0` empties it.
pub fn truncate_after(dir: &Path, after: u64) -> Result<(), LogError> {
    let _lock = crate::lock::acquire(dir)?;
    let bases = list_segments(dir)?;
    for (i, &base) in bases.iter().enumerate().rev() {
        let path = segment_path(dir, base);
        if base > after {
            fs::remove_file(&path).map_err(io_at(&path))?;
            continue;
        }
        let closed_before = bases.get(i + 1).is_some_and(|&next| next - 1 <= after);
        if !closed_before {
            let end = frame_end(&path, base, after)?;
            let file = fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(io_at(&path))?;
            file.set_len(end).map_err(io_at(&path))?;
            file.sync_all().map_err(io_at(&path))?;
        }
        break;
    }
    let groups = groups_dir(dir);
    if groups.is_dir() {
        for entry in fs::read_dir(&groups).map_err(io_at(&groups))? {
            let entry = entry.map_err(io_at(&groups))?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if groups::validate(&name).is_err() {
                continue;
            }
            if let Some(offset) = groups::committed(dir, &name)? {
                if offset > after {
                    groups::commit(dir, &name, after)?;
                }
            }
        }
    }
    sync_dir(dir).map_err(io_at(dir))
}

/// Where offset `upto`'s frame ends in the segment at `path` (whose first offset is `base`):
/// the frames before it are scanned and checked.
fn frame_end(path: &Path, base: u64, upto: u64) -> Result<u64, LogError> {
    let file = File::open(path).map_err(io_at(path))?;
    let len = file.metadata().map_err(io_at(path))?.len();
    let mut scanner = Scanner::new(&file, 0, len);
    let mut expected = base;
    loop {
        match scanner.next().map_err(io_at(path))? {
            Step::Frame(f) if f.offset == expected => {
                if f.offset == upto {
                    return Ok(f.pos + f.len());
                }
                expected += 1;
            }
            Step::Frame(f) => {
                return Err(LogError::corrupt(path, f.pos, "offset out of sequence"));
            }
            Step::End | Step::Torn => {
                return Err(LogError::corrupt(
                    path,
                    scanner.pos(),
                    format!("the segment ends before offset {upto}"),
                ));
            }
            Step::Bad(why) => return Err(LogError::corrupt(path, scanner.pos(), why)),
        }
    }
}

/// Copies `from` (its first `limit` bytes, or all of it) into the new file `to`, synced.
fn copy_bytes(from: &Path, to: &Path, limit: Option<u64>) -> io::Result<u64> {
    let mut src = File::open(from)?;
    src.seek(SeekFrom::Start(0))?;
    let mut out = File::create(to)?;
    let n = match limit {
        Some(limit) => io::copy(&mut src.take(limit), &mut out)?,
        None => io::copy(&mut src, &mut out)?,
    };
    out.sync_all()?;
    Ok(n)
}

fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut f = File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Log, LogOptions};

    fn opts() -> LogOptions {
        LogOptions {
            segment_bytes: 1 << 20,
            ..LogOptions::default()
        }
    }

    /// A prefix copied from a live log opens as that log, cut at `upto`, with its id and
    /// its groups (lowered to `upto`); appends after the copy started are not in it.
    #[test]
    fn a_prefix_opens_as_the_same_log_cut_there() {
        let src = tempfile::tempdir().unwrap();
        let dest = tempfile::tempdir().unwrap();
        let log = Log::open(src.path(), opts()).unwrap();
        let big = vec![7u8; 64 * 1024];
        for _ in 0..40 {
            log.append(&[&big[..]]).unwrap(); // several segments of 1 MiB
        }
        log.commit("relay-a", 10).unwrap();
        log.commit("relay-b", 39).unwrap();
        let copy = copy_prefix(src.path(), dest.path(), 33).unwrap();
        log.append(&[b"later"]).unwrap();
        assert_eq!(copy.first_offset, 1);
        assert_eq!(copy.last_offset, 33);
        assert_eq!(
            copy.groups,
            vec![("relay-a".to_owned(), 10), ("relay-b".to_owned(), 33)]
        );
        drop(log);
        let copied = Log::open(dest.path(), opts()).unwrap();
        assert_eq!(copied.last_offset(), 33);
        assert_eq!(copied.id(), Log::open(src.path(), opts()).unwrap().id());
        let records = copied.read(0, 100, usize::MAX).unwrap();
        assert_eq!(records.len(), 33);
        assert_eq!(copied.committed("relay-b").unwrap(), Some(33));
        // appends continue right after the copy's end
        assert_eq!(copied.append(&[b"next"]).unwrap(), 34);
    }

    #[test]
    fn truncating_cuts_records_and_groups() {
        let dir = tempfile::tempdir().unwrap();
        {
            let log = Log::open(dir.path(), opts()).unwrap();
            let big = vec![1u8; 100 * 1024];
            for _ in 0..30 {
                log.append(&[&big[..]]).unwrap();
            }
            log.commit("processor-x", 25).unwrap();
        }
        truncate_after(dir.path(), 12).unwrap();
        let log = Log::open(dir.path(), opts()).unwrap();
        assert_eq!(log.last_offset(), 12);
        assert_eq!(log.committed("processor-x").unwrap(), Some(12));
        assert_eq!(log.append(&[b"x"]).unwrap(), 13);
    }
}
