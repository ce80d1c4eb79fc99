//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};

use meshql_log::{FsyncPolicy, Log, LogOptions, Record, Retention, HEADER_LEN};

/// Options with small segments and no background fsync thread.
pub fn small(segment_bytes: u64) -> LogOptions {
    LogOptions {
        segment_bytes,
        fsync: FsyncPolicy::Never,
        retention: Retention::default(),
    }
}

/// Deterministic record contents of varying length for offset `i`.
pub fn payload(i: u64) -> Vec<u8> {
    let len = (i * 7919 % 200) as usize;
    let mut v = format!("record-{i}-").into_bytes();
    v.extend((0..len).map(|k| (i as usize + k) as u8));
    v
}

/// Appends records `payload(from..=to)` one call per record.
pub fn append_range(log: &Log, from: u64, to: u64) {
    for i in from..=to {
        let p = payload(i);
        assert_eq!(log.append(&[&p]).unwrap(), i);
    }
}

pub fn read_all(log: &Log) -> Vec<Record> {
    log.read(0, usize::MAX, usize::MAX).unwrap()
}

/// Asserts that `records` are exactly offsets `from..=to` with `payload` contents.
pub fn assert_payloads(records: &[Record], from: u64, to: u64) {
    let offsets: Vec<u64> = records.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, (from..=to).collect::<Vec<_>>());
    for r in records {
        assert_eq!(r.data, payload(r.offset), "contents of offset {}", r.offset);
    }
}

/// Segment files in `dir`, sorted.
pub fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    v.sort();
    v
}

pub fn frame_len(data_len: usize) -> u64 {
    (HEADER_LEN + data_len) as u64
}

/// Total size of the segment files.
pub fn total_bytes(dir: &Path) -> u64 {
    segments(dir)
        .iter()
        .map(|p| fs::metadata(p).unwrap().len())
        .sum()
}

/// Small deterministic PRNG (xorshift64*), for the randomized tests.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}
