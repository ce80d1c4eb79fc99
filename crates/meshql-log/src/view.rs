//! The read side shared by [`Log`](crate::Log) and [`LogReader`](crate::LogReader): what is
//! known about each segment, and reading records with the sparse index and position cache.
//!
//! The state lives behind a mutex that is held only to plan a read of one segment and to
//! record what the read learned; the file I/O in between runs without it.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{io_at, LogError};
use crate::frame::{Scanner, Step};
use crate::index::{PositionCache, SparseIndex};
use crate::segment::segment_path;
use crate::Record;

/// What is known about one segment.
#[derive(Debug)]
pub(crate) struct SegmentState {
    pub base: u64,
    pub path: PathBuf,
    /// Read-only handle, opened on first use. Kept open, a segment deleted by retention stays
    /// readable for reads already planned on it.
    file: Option<Arc<File>>,
    /// Bytes of valid frames: exact for the active segment, the file size (taken on first
    /// use) for a sealed one.
    pub size: Option<u64>,
    /// Offset after the segment's last record: the next segment's base once sealed.
    pub end_offset: u64,
    /// No more frames will be added (a newer segment exists).
    pub sealed: bool,
    pub index: SparseIndex,
    /// Newest record timestamp, when every frame has been seen (for age retention).
    pub max_timestamp_ms: Option<i64>,
}

impl SegmentState {
    /// A sealed segment whose contents have not been looked at.
    pub fn sealed(dir: &Path, base: u64, end_offset: u64) -> Self {
        SegmentState {
            base,
            path: segment_path(dir, base),
            file: None,
            size: None,
            end_offset,
            sealed: true,
            index: SparseIndex::new(base),
            max_timestamp_ms: None,
        }
    }

    /// The newest segment, known to hold valid frames up to the index frontier.
    pub fn active(
        dir: &Path,
        base: u64,
        index: SparseIndex,
        max_timestamp_ms: Option<i64>,
    ) -> Self {
        let (end_offset, size) = index.frontier();
        SegmentState {
            base,
            path: segment_path(dir, base),
            file: None,
            size: Some(size),
            end_offset,
            sealed: false,
            index,
            max_timestamp_ms,
        }
    }

    /// The read handle, opening the file if needed (and taking a sealed segment's size).
    pub fn handle(&mut self) -> Result<Arc<File>, LogError> {
        if let Some(f) = &self.file {
            return Ok(f.clone());
        }
        let file = File::open(&self.path).map_err(io_at(&self.path))?;
        if self.size.is_none() {
            self.size = Some(file.metadata().map_err(io_at(&self.path))?.len());
        }
        let file = Arc::new(file);
        self.file = Some(file.clone());
        Ok(file)
    }

    /// Size in bytes, with a `stat` the first time for a sealed segment.
    pub fn size(&mut self) -> Result<u64, LogError> {
        match self.size {
            Some(s) => Ok(s),
            None => {
                let len = fs::metadata(&self.path).map_err(io_at(&self.path))?.len();
                self.size = Some(len);
                Ok(len)
            }
        }
    }
}

/// All segments known, oldest first, and the position cache.
#[derive(Debug)]
pub(crate) struct View {
    pub dir: PathBuf,
    pub segments: Vec<SegmentState>,
    pub cache: PositionCache,
}

impl View {
    pub fn new(dir: &Path, segments: Vec<SegmentState>) -> Self {
        View {
            dir: dir.to_path_buf(),
            segments,
            cache: PositionCache::default(),
        }
    }

    /// 0 when nothing was ever appended.
    pub fn last_offset(&self) -> u64 {
        self.segments.last().map_or(0, |s| s.end_offset - 1)
    }

    /// Oldest offset kept; 0 when nothing was ever appended. If retention removed every
    /// record, this is `last_offset() + 1` (the base of the empty active segment).
    pub fn first_offset(&self) -> u64 {
        if self.last_offset() == 0 {
            0
        } else {
            self.segments[0].base
        }
    }

    /// Index of the segment that holds (or would hold) `offset`.
    fn segment_for(&self, offset: u64) -> Option<usize> {
        let i = self.segments.partition_point(|s| s.base <= offset);
        i.checked_sub(1)
    }

    pub fn position_of(&self, base: u64) -> Option<usize> {
        self.segments.binary_search_by_key(&base, |s| s.base).ok()
    }
}

/// A read of one segment, planned under the lock.
struct Plan {
    base: u64,
    path: PathBuf,
    file: Arc<File>,
    size: u64,
    end_offset: u64,
    /// Frame boundary to start scanning from.
    offset: u64,
    pos: u64,
    /// Set when the scan starts at the index frontier and can extend the index.
    extension: Option<crate::index::Extension>,
}

/// Records with offset > `after`, oldest first, at most `max_records` and `max_bytes` of data
/// (but at least one record if any exists). Starts at the oldest kept record if `after` is
/// older. Reads across segments as needed.
pub(crate) fn read(
    view: &Mutex<View>,
    after: u64,
    max_records: usize,
    max_bytes: usize,
) -> Result<Vec<Record>, LogError> {
    let mut out: Vec<Record> = Vec::new();
    let mut bytes = 0usize;
    let mut next = after.saturating_add(1);
    while out.len() < max_records {
        let Some(mut plan) = plan(view, &mut next)? else {
            break;
        };
        let (resume, full) = scan(
            &mut plan,
            next,
            &mut out,
            &mut bytes,
            max_records,
            max_bytes,
        )?;
        let mut v = view.lock();
        v.cache.put(resume.0, plan.base, resume.1);
        if let (Some(i), Some(ext)) = (v.position_of(plan.base), plan.extension) {
            v.segments[i].index.merge(ext);
        }
        drop(v);
        // Not full means the segment was read to its end: go on with the next one. (No
        // progress would mean a gap between segments; stop rather than spin.)
        if full || resume.0 <= next {
            break;
        }
        next = resume.0;
    }
    Ok(out)
}

fn plan(view: &Mutex<View>, next: &mut u64) -> Result<Option<Plan>, LogError> {
    let mut v = view.lock();
    if v.segments.is_empty() || *next > v.last_offset() {
        return Ok(None);
    }
    *next = (*next).max(v.segments[0].base);
    let i = v.segment_for(*next).expect("next >= first base");
    let cached = v.cache.get(*next, v.segments[i].base);
    let seg = &mut v.segments[i];
    let file = seg.handle()?;
    let size = seg.size()?;
    let (mut offset, mut pos) = seg.index.seek(*next);
    let mut extension = None;
    if let Some(p) = cached.filter(|_| offset < *next) {
        (offset, pos) = (*next, p);
    } else if (offset, pos) == seg.index.frontier() {
        extension = Some(seg.index.extension());
    }
    Ok(Some(Plan {
        base: seg.base,
        path: seg.path.clone(),
        file,
        size,
        end_offset: seg.end_offset,
        offset,
        pos,
        extension,
    }))
}

/// Scans one planned segment, collecting records from `next` on and extending the planned
/// index extension. Returns where it stopped (offset, position) and whether the limits were
/// reached.
fn scan(
    plan: &mut Plan,
    next: u64,
    out: &mut Vec<Record>,
    bytes: &mut usize,
    max_records: usize,
    max_bytes: usize,
) -> Result<((u64, u64), bool), LogError> {
    let path = &plan.path;
    let corrupt = |pos: u64, why: &str| LogError::corrupt(path, pos, why);
    let mut scanner = Scanner::new(&plan.file, plan.pos, plan.size);
    let mut expected = plan.offset;
    loop {
        if out.len() >= max_records {
            return Ok(((expected, scanner.pos()), true));
        }
        let pos = scanner.pos();
        match scanner.next().map_err(io_at(path))? {
            Step::End if expected == plan.end_offset => return Ok(((expected, pos), false)),
            Step::End => {
                let why = format!(
                    "segment ends before offset {expected}, expected {}",
                    plan.end_offset
                );
                return Err(corrupt(pos, &why));
            }
            Step::Torn => return Err(corrupt(pos, "frame cut short")),
            Step::Bad(why) => return Err(corrupt(pos, why)),
            Step::Frame(f) => {
                if f.offset != expected || f.offset >= plan.end_offset {
                    let why = format!("offset {} where {expected} was expected", f.offset);
                    return Err(corrupt(pos, &why));
                }
                if f.offset >= next {
                    if !out.is_empty() && *bytes + f.data.len() > max_bytes {
                        return Ok(((expected, pos), true));
                    }
                    *bytes += f.data.len();
                    out.push(Record {
                        offset: f.offset,
                        timestamp_ms: f.timestamp_ms,
                        data: f.data.to_vec(),
                    });
                }
                if let Some(ext) = plan.extension.as_mut() {
                    ext.push(f.offset, f.pos, f.len());
                }
                expected += 1;
            }
        }
    }
}
