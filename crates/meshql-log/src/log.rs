//! The writer: [`Log`].

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use parking_lot::Mutex;
use tokio::sync::watch;

use crate::error::{io_at, LogError};
use crate::flusher::Flusher;
use crate::frame::{encode, frame_len, MAX_RECORD_BYTES};
use crate::index::SparseIndex;
use crate::lock::{self, DirLock};
use crate::pio::write_all_at;
use crate::retention::{self, SegmentFacts};
use crate::segment::{list_segments, scan_tail, segment_path, sync_dir, Stop};
use crate::view::{self, SegmentState, View};
use crate::{groups, now_ms, FsyncPolicy, LogOptions, Record};

/// The single writer of a log directory (see the crate docs). Cheap to clone; all clones are
/// the same writer, and the directory lock and the fsync thread live until the last is dropped.
#[derive(Clone)]
pub struct Log {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    options: LogOptions,
    /// Appends, rolls and fsyncs. Taken before `view` when both are needed.
    writer: Arc<Mutex<Writer>>,
    /// What readers see; updated by appends after their write.
    view: Mutex<View>,
    notify: watch::Sender<u64>,
    flusher: Option<Flusher>,
    recovery: Option<Recovery>,
    /// See [`Log::id`].
    id: String,
    _lock: DirLock,
}

/// What [`Log::open`] cut off the end of the active segment, if anything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recovery {
    /// The active segment.
    pub segment: PathBuf,
    /// Where the first bad or incomplete frame started (the new end of the file).
    pub position: u64,
    /// How many bytes were discarded.
    pub discarded_bytes: u64,
    /// Why the frame at `position` was rejected.
    pub reason: String,
}

struct Writer {
    /// The active segment, opened for writing; shared with the fsync thread.
    active: Arc<File>,
    base: u64,
    size: u64,
    next_offset: u64,
    /// Appended since the last fsync (Interval policy).
    dirty: bool,
    /// A failed write or fsync left the tail uncertain; appends are refused.
    poisoned: bool,
    /// An fsync of the background thread failed; reported by the next `flush`.
    sync_error: Option<io::Error>,
    /// Segments closed under `FsyncPolicy::Never` that `flush` still has to fsync.
    unsynced: Vec<Arc<File>>,
    /// Reused encoding buffer.
    buf: Vec<u8>,
}

impl Log {
    /// Opens (creating if needed) the log in `dir`, takes the writer lock and recovers the
    /// tail of the active segment (see the crate docs).
    pub fn open(dir: &Path, options: LogOptions) -> Result<Log, LogError> {
        fs::create_dir_all(dir).map_err(io_at(dir))?;
        let lock = lock::acquire(dir)?;
        let groups = groups::groups_dir(dir);
        fs::create_dir_all(&groups).map_err(io_at(&groups))?;
        let id = crate::identity::ensure(dir)?;

        let mut bases = list_segments(dir)?;
        if bases.is_empty() {
            let path = segment_path(dir, 1);
            File::create(&path).map_err(io_at(&path))?;
            sync_dir(dir).map_err(io_at(dir))?;
            bases.push(1);
        }
        let base = bases[bases.len() - 1];
        let path = segment_path(dir, base);
        let active = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io_at(&path))?;
        let len = active.metadata().map_err(io_at(&path))?.len();
        let mut index = SparseIndex::new(base);
        let tail = scan_tail(&active, &mut index, len).map_err(io_at(&path))?;
        let mut recovery = None;
        if tail.end_pos < len {
            // torn or corrupt tail: cut it off for good before appending after it
            active.set_len(tail.end_pos).map_err(io_at(&path))?;
            active.sync_all().map_err(io_at(&path))?;
            recovery = Some(Recovery {
                segment: path.clone(),
                position: tail.end_pos,
                discarded_bytes: len - tail.end_pos,
                reason: match tail.stop {
                    Stop::Torn => "frame cut short".to_string(),
                    Stop::Bad(why) => why.to_string(),
                    Stop::End => "unexpected end".to_string(),
                },
            });
        }

        let mut segments: Vec<SegmentState> = bases
            .windows(2)
            .map(|w| SegmentState::sealed(dir, w[0], w[1]))
            .collect();
        segments.push(SegmentState::active(
            dir,
            base,
            index,
            tail.max_timestamp_ms,
        ));
        let view = View::new(dir, segments);
        let last = view.last_offset();

        let writer = Arc::new(Mutex::new(Writer {
            active: Arc::new(active),
            base,
            size: tail.end_pos,
            next_offset: tail.next_offset,
            dirty: false,
            poisoned: false,
            sync_error: None,
            unsynced: Vec::new(),
            buf: Vec::new(),
        }));
        let flusher = match options.fsync {
            FsyncPolicy::Interval(every) => {
                let w = writer.clone();
                let f = Flusher::start(every, move || sync_if_dirty(&w)).map_err(io_at(dir))?;
                Some(f)
            }
            FsyncPolicy::Always | FsyncPolicy::Never => None,
        };
        let log = Log {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                options,
                writer,
                view: Mutex::new(view),
                notify: watch::channel(last).0,
                flusher,
                recovery,
                id,
                _lock: lock,
            }),
        };
        log.apply_retention()?;
        Ok(log)
    }

    /// What opening the log cut off a torn or corrupt end of the active segment, if it had
    /// to (for the caller to log).
    pub fn recovery(&self) -> Option<&Recovery> {
        self.inner.recovery.as_ref()
    }

    /// The log directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// This log's identity: a random id written when the log was created (`log.id`). A log
    /// created again in a new directory has another, so a position kept elsewhere (a
    /// processor's, committed with its outputs) can tell that it belongs to a log that is
    /// gone: positions are only meaningful within one log.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// The options the log was opened with.
    pub fn options(&self) -> &LogOptions {
        &self.inner.options
    }

    /// Appends `records` in order with one write (rolling to a new segment first if the active
    /// one would grow past `segment_bytes`), and returns the offset of the last one (of the
    /// last record in the log if `records` is empty). On return the records are readable in
    /// every process; durability follows the [`FsyncPolicy`].
    pub fn append(&self, records: &[&[u8]]) -> Result<u64, LogError> {
        if let Some(r) = records.iter().find(|r| r.len() > MAX_RECORD_BYTES) {
            return Err(LogError::RecordTooLarge(r.len()));
        }
        if records.is_empty() {
            return Ok(self.last_offset());
        }
        let inner = &*self.inner;
        let batch: u64 = records.iter().map(|r| frame_len(r.len())).sum();
        let mut guard = inner.writer.lock();
        let w = &mut *guard;
        if w.poisoned {
            return Err(LogError::Poisoned);
        }
        let rolled = w.size > 0 && w.size + batch > inner.options.segment_bytes;
        if rolled {
            self.roll(w)?;
        }

        let timestamp_ms = now_ms();
        let first = w.next_offset;
        w.buf.clear();
        for (i, r) in records.iter().enumerate() {
            encode(&mut w.buf, first + i as u64, timestamp_ms, r);
        }
        let path = segment_path(&inner.dir, w.base);
        if let Err(e) = write_all_at(&w.active, &w.buf, w.size) {
            // Cut off whatever part was written, so the next append starts clean.
            if w.active.set_len(w.size).is_err() {
                w.poisoned = true;
            }
            return Err(io_at(&path)(e));
        }
        match inner.options.fsync {
            FsyncPolicy::Always => {
                if let Err(e) = w.active.sync_data() {
                    // After a failed fsync the state of the written pages is unknown.
                    w.poisoned = true;
                    return Err(io_at(&path)(e));
                }
            }
            FsyncPolicy::Interval(_) => w.dirty = true,
            FsyncPolicy::Never => {}
        }

        let last = first + records.len() as u64 - 1;
        {
            let mut v = inner.view.lock();
            let seg = v.segments.last_mut().expect("active segment");
            debug_assert_eq!(seg.base, w.base);
            let mut pos = w.size;
            for (i, r) in records.iter().enumerate() {
                let len = frame_len(r.len());
                seg.index.push(first + i as u64, pos, len);
                pos += len;
            }
            seg.size = Some(pos);
            seg.end_offset = last + 1;
            seg.max_timestamp_ms = seg.max_timestamp_ms.max(Some(timestamp_ms));
        }
        w.size += batch;
        w.next_offset = last + 1;
        // Sent under the writer lock, so subscribers see offsets only grow.
        inner.notify.send_replace(last);
        drop(guard);

        if rolled {
            self.apply_retention()?;
        }
        Ok(last)
    }

    /// Appends one record; see [`Log::append`].
    pub fn append_one(&self, record: &[u8]) -> Result<u64, LogError> {
        self.append(&[record])
    }

    /// Closes the active segment (fsynced unless the policy is `Never`) and starts a new one
    /// named by the next offset.
    fn roll(&self, w: &mut Writer) -> Result<(), LogError> {
        let inner = &*self.inner;
        let sync = inner.options.fsync != FsyncPolicy::Never;
        let old = segment_path(&inner.dir, w.base);
        if sync {
            w.active.sync_data().map_err(io_at(&old))?;
        }
        let base = w.next_offset;
        let path = segment_path(&inner.dir, base);
        // No file can already hold records under this name: it would have been the active
        // segment at open. One left empty by a failed roll is simply reused.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(io_at(&path))?;
        if sync {
            sync_dir(&inner.dir).map_err(io_at(&inner.dir))?;
        }
        let previous = std::mem::replace(&mut w.active, Arc::new(file));
        if !sync {
            w.unsynced.push(previous);
        }
        w.base = base;
        w.size = 0;
        w.dirty = false;
        let mut v = inner.view.lock();
        if let Some(seg) = v.segments.last_mut() {
            seg.sealed = true;
        }
        v.segments.push(SegmentState::active(
            &inner.dir,
            base,
            SparseIndex::new(base),
            None,
        ));
        Ok(())
    }

    /// Records with offset greater than `after`, oldest first: at most `max_records`
    /// (none if 0) and at most `max_bytes` of record data, except that at least one record is
    /// returned if any exists. If `after` is older than what retention kept, reading starts at
    /// [`first_offset`](Log::first_offset). Empty when there is nothing after `after`.
    pub fn read(
        &self,
        after: u64,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Vec<Record>, LogError> {
        view::read(&self.inner.view, after, max_records, max_bytes)
    }

    /// The oldest offset still kept; 0 when nothing was ever appended. When retention has
    /// removed every record (only possible with an empty active segment) it is
    /// `last_offset() + 1`.
    pub fn first_offset(&self) -> u64 {
        self.inner.view.lock().first_offset()
    }

    /// The newest offset; 0 when nothing was ever appended.
    pub fn last_offset(&self) -> u64 {
        self.inner.view.lock().last_offset()
    }

    /// A receiver of the last offset, updated after every append (for long-polling and SSE).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.notify.subscribe()
    }

    /// Durably records `offset` as consumer group `group`'s committed offset (see the crate
    /// docs). Group names: `[A-Za-z0-9._-]{1,100}`, not `.` or `..`.
    pub fn commit(&self, group: &str, offset: u64) -> Result<(), LogError> {
        groups::commit(&self.inner.dir, group, offset)
    }

    /// The group's committed offset, `None` if it never committed.
    pub fn committed(&self, group: &str) -> Result<Option<u64>, LogError> {
        groups::committed(&self.inner.dir, group)
    }

    /// Fsyncs everything appended so far (whatever the policy). Also reports a failure of
    /// the background fsync thread since the last `flush`.
    pub fn flush(&self) -> Result<(), LogError> {
        let (active, unsynced, base, failed) = {
            let mut w = self.inner.writer.lock();
            if w.poisoned {
                return Err(LogError::Poisoned);
            }
            w.dirty = false;
            (
                w.active.clone(),
                std::mem::take(&mut w.unsynced),
                w.base,
                w.sync_error.take(),
            )
        };
        // The fsyncs run without the writer lock, so appends go on meanwhile.
        let path = segment_path(&self.inner.dir, base);
        let mut error = failed.map(io_at(&path));
        let mut still_unsynced = Vec::new();
        for f in unsynced {
            if let Err(e) = f.sync_data() {
                error.get_or_insert(io_at(&self.inner.dir)(e));
                still_unsynced.push(f);
            }
        }
        if let Err(e) = active.sync_data() {
            error.get_or_insert(io_at(&path)(e));
        }
        match error {
            None => Ok(()),
            Some(e) => {
                let mut w = self.inner.writer.lock();
                w.dirty = true;
                w.unsynced.extend(still_unsynced);
                Err(e)
            }
        }
    }

    /// Deletes whole closed segments, oldest first, while the log is larger than
    /// `retention.max_bytes` or their newest record is older than `retention.max_age`; never
    /// the active segment. Also runs at open and after every roll.
    pub fn apply_retention(&self) -> Result<(), LogError> {
        let retention = &self.inner.options.retention;
        if retention.max_bytes.is_none() && retention.max_age.is_none() {
            return Ok(());
        }
        let doomed = {
            let mut v = self.inner.view.lock();
            let mut facts = Vec::with_capacity(v.segments.len());
            for seg in v.segments.iter_mut() {
                let size = seg.size()?;
                let newest_ms = match seg.max_timestamp_ms {
                    Some(t) => Some(t),
                    None if seg.sealed => modified_ms(&seg.path),
                    None => None,
                };
                facts.push(SegmentFacts { size, newest_ms });
            }
            let n = retention::select(&facts, retention, now_ms());
            let doomed: Vec<SegmentState> = v.segments.drain(..n).collect();
            doomed
        };
        // Out of the view, no new read can start on them; reads already planned keep their
        // open handles.
        for seg in doomed {
            match fs::remove_file(&seg.path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_at(&seg.path)(e)),
            }
        }
        Ok(())
    }
}

/// Modification time of a file in ms since the epoch (the age of a sealed segment whose
/// records have not been read).
fn modified_ms(path: &Path) -> Option<i64> {
    let t = fs::metadata(path).ok()?.modified().ok()?;
    let d = t.duration_since(UNIX_EPOCH).ok()?;
    i64::try_from(d.as_millis()).ok()
}

/// The fsync thread's tick: fsyncs the active segment if appends happened since the last one,
/// without holding the writer lock during the fsync.
fn sync_if_dirty(writer: &Mutex<Writer>) {
    let file = {
        let mut w = writer.lock();
        if !w.dirty || w.poisoned {
            return;
        }
        w.dirty = false;
        w.active.clone()
    };
    if let Err(e) = file.sync_data() {
        let mut w = writer.lock();
        w.dirty = true;
        w.sync_error = Some(e);
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Stop the fsync thread first, then make the last appends durable (best effort).
        self.flusher.take();
        if self.options.fsync != FsyncPolicy::Never {
            let w = self.writer.lock();
            if w.dirty {
                let _ = w.active.sync_data();
            }
        }
    }
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log")
            .field("dir", &self.inner.dir)
            .field("first_offset", &self.first_offset())
            .field("last_offset", &self.last_offset())
            .finish()
    }
}
