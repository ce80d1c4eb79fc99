//! In-memory sparse offset index of a segment, and a small cache of where recent reads ended.

/// A new index entry is added when a frame starts at least this many bytes after the
/// previous entry, so finding an offset scans at most about this much of the segment.
pub(crate) const INDEX_INTERVAL: u64 = 4096;

/// Offset → file position for some frames of one segment, complete up to a *frontier*:
/// every frame before the frontier has been seen (so the frontier itself is a known frame
/// boundary), and entries are at most [`INDEX_INTERVAL`] bytes apart up to it.
#[derive(Clone, Debug)]
pub(crate) struct SparseIndex {
    /// (offset, position), ascending; the first is always (base, 0).
    entries: Vec<(u64, u64)>,
    /// (offset of the next unseen frame, its position).
    frontier: (u64, u64),
}

impl SparseIndex {
    pub fn new(base: u64) -> Self {
        SparseIndex {
            entries: vec![(base, 0)],
            frontier: (base, 0),
        }
    }

    pub fn frontier(&self) -> (u64, u64) {
        self.frontier
    }

    /// The known frame boundary (offset, position) closest at or before `offset`.
    pub fn seek(&self, offset: u64) -> (u64, u64) {
        if offset >= self.frontier.0 {
            return self.frontier;
        }
        let i = self.entries.partition_point(|e| e.0 <= offset);
        self.entries[i.saturating_sub(1)]
    }

    /// Records the frame at the frontier; it must be exactly there.
    pub fn push(&mut self, offset: u64, pos: u64, len: u64) {
        debug_assert_eq!((offset, pos), self.frontier);
        let last = self.entries[self.entries.len() - 1].1;
        if pos >= last + INDEX_INTERVAL {
            self.entries.push((offset, pos));
        }
        self.frontier = (offset + 1, pos + len);
    }

    /// An extension that can be filled without holding the index (outside a lock) by
    /// scanning frames from the current frontier, and merged back with [`Self::merge`].
    pub fn extension(&self) -> Extension {
        Extension {
            start: self.frontier,
            last_entry: self.entries[self.entries.len() - 1].1,
            entries: Vec::new(),
            frontier: self.frontier,
        }
    }

    /// Adds what `ext` learned, unless the frontier moved since it was taken.
    pub fn merge(&mut self, ext: Extension) {
        if ext.start == self.frontier && ext.frontier.0 > self.frontier.0 {
            self.entries.extend(ext.entries);
            self.frontier = ext.frontier;
        }
    }

    #[cfg(test)]
    pub fn entry_count(&self) -> usize {
        self.entries.len()
    }
}

/// Index entries found by a scan that started at an index frontier; see
/// [`SparseIndex::extension`].
#[derive(Debug)]
pub(crate) struct Extension {
    start: (u64, u64),
    last_entry: u64,
    entries: Vec<(u64, u64)>,
    frontier: (u64, u64),
}

impl Extension {
    /// Records the next frame of the scan; frames must come in order from the start.
    pub fn push(&mut self, offset: u64, pos: u64, len: u64) {
        debug_assert_eq!((offset, pos), self.frontier);
        if pos >= self.last_entry + INDEX_INTERVAL {
            self.entries.push((offset, pos));
            self.last_entry = pos;
        }
        self.frontier = (offset + 1, pos + len);
    }
}

const CACHE_SLOTS: usize = 16;

/// Where the last few reads ended: (next offset, segment base, position). A consumer that
/// reads on from where it stopped finds its position here without scanning.
#[derive(Debug, Default)]
pub(crate) struct PositionCache {
    slots: [Option<(u64, u64, u64)>; CACHE_SLOTS],
    next: usize,
}

impl PositionCache {
    /// Position of `offset` in segment `base`, if a recent read ended there.
    pub fn get(&self, offset: u64, base: u64) -> Option<u64> {
        self.slots
            .iter()
            .flatten()
            .find(|s| s.0 == offset && s.1 == base)
            .map(|s| s.2)
    }

    pub fn put(&mut self, offset: u64, base: u64, pos: u64) {
        if let Some(slot) = self
            .slots
            .iter_mut()
            .find(|s| matches!(s, Some((o, b, _)) if *o == offset && *b == base))
        {
            *slot = Some((offset, base, pos));
            return;
        }
        self.slots[self.next] = Some((offset, base, pos));
        self.next = (self.next + 1) % CACHE_SLOTS;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seek_finds_the_closest_entry_at_or_before() {
        let mut ix = SparseIndex::new(10);
        // 100 frames of 1000 bytes: an entry every 5 frames (5000 >= 4096)
        for i in 0..100u64 {
            ix.push(10 + i, i * 1000, 1000);
        }
        assert_eq!(ix.frontier(), (110, 100_000));
        assert_eq!(ix.seek(10), (10, 0));
        assert_eq!(ix.seek(14), (10, 0));
        let (o, p) = ix.seek(57);
        assert!(o <= 57 && 57 - o < 5, "{o}");
        assert_eq!(p, (o - 10) * 1000);
        assert_eq!(ix.seek(110), (110, 100_000));
        assert_eq!(ix.seek(500), (110, 100_000));
        assert_eq!(ix.seek(3), (10, 0));
        assert!(ix.entry_count() <= 100_000 / INDEX_INTERVAL as usize + 1);
    }

    #[test]
    fn extensions_merge_only_onto_an_unchanged_frontier() {
        let mut ix = SparseIndex::new(1);
        let mut a = ix.extension();
        let mut b = ix.extension();
        for i in 0..10u64 {
            a.push(1 + i, i * 5000, 5000);
        }
        for i in 0..3u64 {
            b.push(1 + i, i * 5000, 5000);
        }
        ix.merge(a);
        assert_eq!(ix.frontier(), (11, 50_000));
        ix.merge(b); // stale: ignored
        assert_eq!(ix.frontier(), (11, 50_000));
        assert_eq!(ix.seek(7), (7, 30_000));
    }

    #[test]
    fn cache_remembers_recent_positions() {
        let mut c = PositionCache::default();
        c.put(5, 1, 500);
        assert_eq!(c.get(5, 1), Some(500));
        assert_eq!(c.get(5, 2), None);
        c.put(5, 1, 600);
        assert_eq!(c.get(5, 1), Some(600));
        for i in 0..CACHE_SLOTS as u64 {
            c.put(100 + i, 1, i);
        }
        assert_eq!(c.get(5, 1), None);
        assert_eq!(
            c.get(100 + CACHE_SLOTS as u64 - 1, 1),
            Some(CACHE_SLOTS as u64 - 1)
        );
    }
}
