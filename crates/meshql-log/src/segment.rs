//! Segment files: names, listing, positioned I/O and the validating tail scan used by
//! recovery and by readers following the writer.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use crate::error::{io_at, LogError};
use crate::frame::{Scanner, Step};
use crate::index::SparseIndex;

const SUFFIX: &str = ".seg";
const DIGITS: usize = 20;

/// `dir/<base, 20 digits>.seg`
pub(crate) fn segment_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:0DIGITS$}{SUFFIX}"))
}

/// The base offset in a segment file name, if it is one (base 0 is never valid).
pub(crate) fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(SUFFIX)?;
    if digits.len() != DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|&base| base > 0)
}

/// Base offsets of the segments in `dir`, ascending. Other files are ignored.
pub(crate) fn list_segments(dir: &Path) -> Result<Vec<u64>, LogError> {
    let mut bases = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_at(dir))? {
        let entry = entry.map_err(io_at(dir))?;
        if let Some(base) = entry.file_name().to_str().and_then(parse_segment_name) {
            bases.push(base);
        }
    }
    bases.sort_unstable();
    Ok(bases)
}

/// Fsyncs a directory, so that files created, renamed or deleted in it stay so after a crash.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}

/// Why a tail scan stopped.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// At the limit, after a whole frame (or at an empty segment's start).
    End,
    /// At a frame that does not fit before the limit.
    Torn,
    /// At bytes that are not a valid next frame.
    Bad(&'static str),
}

/// Result of [`scan_tail`].
#[derive(Debug)]
pub(crate) struct TailScan {
    /// Position after the last good frame.
    pub end_pos: u64,
    /// Offset after the last good frame.
    pub next_offset: u64,
    /// Largest timestamp among the frames scanned, if any.
    pub max_timestamp_ms: Option<i64>,
    pub stop: Stop,
}

/// Scans frames from the index frontier up to `limit`, adding them to the index, and stops at
/// the first frame that is torn, fails its checksum or does not carry the next offset.
pub(crate) fn scan_tail(file: &File, index: &mut SparseIndex, limit: u64) -> io::Result<TailScan> {
    let (mut next_offset, start) = index.frontier();
    let mut scanner = Scanner::new(file, start, limit);
    let mut max_timestamp_ms = None;
    let stop = loop {
        match scanner.next()? {
            Step::End => break Stop::End,
            Step::Torn => break Stop::Torn,
            Step::Bad(why) => break Stop::Bad(why),
            Step::Frame(f) if f.offset != next_offset => break Stop::Bad("offset out of sequence"),
            Step::Frame(f) => {
                index.push(f.offset, f.pos, f.len());
                max_timestamp_ms = max_timestamp_ms.max(Some(f.timestamp_ms));
                next_offset += 1;
            }
        }
    };
    Ok(TailScan {
        end_pos: index.frontier().1,
        next_offset,
        max_timestamp_ms,
        stop,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sort_like_offsets() {
        let p = segment_path(Path::new("/x"), 42);
        assert_eq!(p, Path::new("/x/00000000000000000042.seg"));
        assert_eq!(parse_segment_name("00000000000000000042.seg"), Some(42));
        assert_eq!(
            parse_segment_name("18446744073709551615.seg"),
            Some(u64::MAX)
        );
        for bad in [
            "00000000000000000000.seg",
            "0000000000000000042.seg",
            "00000000000000000042.seg.tmp",
            "0000000000000000004x.seg",
            "+0000000000000000042.seg",
            "99999999999999999999.seg",
            "LOCK",
        ] {
            assert_eq!(parse_segment_name(bad), None, "{bad}");
        }
    }
}
