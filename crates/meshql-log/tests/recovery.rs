//! Recovery at open: torn and corrupt tails are cut, appends continue after the last good
//! record; damage elsewhere is reported.

mod common;

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::Path;

use common::*;
use meshql_log::{ErrorKind, Log, LogOptions, HEADER_LEN};

/// A log with records 1..=5 in one segment; returns the segment path and frame start positions.
fn five_records(dir: &Path) -> (std::path::PathBuf, Vec<u64>) {
    let log = Log::open(dir, LogOptions::default()).unwrap();
    append_range(&log, 1, 5);
    drop(log);
    let mut starts = vec![0];
    for i in 1..=5 {
        let next = starts[starts.len() - 1] + frame_len(payload(i).len());
        starts.push(next);
    }
    let seg = segments(dir).pop().unwrap();
    assert_eq!(fs::metadata(&seg).unwrap().len(), starts[5]);
    (seg, starts)
}

fn truncate(path: &Path, len: u64) {
    OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

fn flip_byte(path: &Path, at: u64) {
    let mut bytes = fs::read(path).unwrap();
    bytes[at as usize] ^= 0x40;
    fs::write(path, bytes).unwrap();
}

/// Reopens, checks that records 1..=good survived and that appends continue at good + 1.
fn check_recovers_to(dir: &Path, good: u64, cut_at: u64) {
    let log = Log::open(dir, LogOptions::default()).unwrap();
    let rec = log.recovery().expect("recovery reported").clone();
    assert_eq!(rec.position, cut_at);
    assert_eq!(log.last_offset(), good);
    assert_payloads(&read_all(&log), 1, good);
    append_range(&log, good + 1, good + 3);
    assert_payloads(&read_all(&log), 1, good + 3);
    drop(log);
    let log = Log::open(dir, LogOptions::default()).unwrap();
    assert!(log.recovery().is_none(), "the cut is permanent");
    assert_payloads(&read_all(&log), 1, good + 3);
}

#[test]
fn torn_in_the_middle_of_a_record() {
    let dir = tempfile::tempdir().unwrap();
    let (seg, starts) = five_records(dir.path());
    truncate(&seg, starts[4] + HEADER_LEN as u64 + 3);
    check_recovers_to(dir.path(), 4, starts[4]);
}

#[test]
fn torn_in_the_middle_of_a_header() {
    let dir = tempfile::tempdir().unwrap();
    let (seg, starts) = five_records(dir.path());
    truncate(&seg, starts[3] + 10);
    check_recovers_to(dir.path(), 3, starts[3]);
}

#[test]
fn bad_checksum_cuts_that_record_and_everything_after() {
    let dir = tempfile::tempdir().unwrap();
    let (seg, starts) = five_records(dir.path());
    flip_byte(&seg, starts[2] + HEADER_LEN as u64 + 1); // data of record 3
    check_recovers_to(dir.path(), 2, starts[2]);
    let dir = tempfile::tempdir().unwrap();
    let (seg, starts) = five_records(dir.path());
    flip_byte(&seg, starts[4] + 17); // timestamp of record 5
    check_recovers_to(dir.path(), 4, starts[4]);
}

#[test]
fn garbage_and_zeros_after_the_last_record_are_cut() {
    let dir = tempfile::tempdir().unwrap();
    let (seg, starts) = five_records(dir.path());
    let mut f = OpenOptions::new().append(true).open(&seg).unwrap();
    f.write_all(&[0u8; 4096]).unwrap(); // what a crash can leave on some file systems
    drop(f);
    check_recovers_to(dir.path(), 5, starts[5]);
    let dir = tempfile::tempdir().unwrap();
    let (seg, starts) = five_records(dir.path());
    let mut f = OpenOptions::new().append(true).open(&seg).unwrap();
    f.write_all(&Rng::new(9).bytes(1000)).unwrap();
    drop(f);
    check_recovers_to(dir.path(), 5, starts[5]);
}

#[test]
fn a_whole_torn_segment_leaves_an_empty_active_one() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = Log::open(dir.path(), small(500)).unwrap();
        append_range(&log, 1, 30);
    }
    let segs = segments(dir.path());
    assert!(segs.len() >= 3);
    let last = segs.last().unwrap();
    let base: u64 = last.file_name().unwrap().to_str().unwrap()[..20]
        .parse()
        .unwrap();
    truncate(last, 5); // even the first frame is torn
    let log = Log::open(dir.path(), small(500)).unwrap();
    assert_eq!(log.recovery().unwrap().position, 0);
    assert_eq!(log.last_offset(), base - 1);
    assert_eq!(fs::metadata(last).unwrap().len(), 0);
    append_range(&log, base, 40);
    assert_payloads(&read_all(&log), 1, 40);
}

#[test]
fn crash_right_after_a_roll_leaves_an_empty_segment() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = Log::open(dir.path(), small(500)).unwrap();
        append_range(&log, 1, 10);
        let last = log.last_offset();
        // what a crash between creating the next segment and writing to it leaves
        fs::File::create(dir.path().join(format!("{:020}.seg", last + 1))).unwrap();
    }
    let log = Log::open(dir.path(), small(500)).unwrap();
    assert!(log.recovery().is_none());
    assert_eq!(log.last_offset(), 10);
    append_range(&log, 11, 20);
    assert_payloads(&read_all(&log), 1, 20);
    drop(log);
    let log = Log::open(dir.path(), small(500)).unwrap();
    assert_payloads(&read_all(&log), 1, 20);
}

#[test]
fn damage_in_a_closed_segment_is_reported_as_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = Log::open(dir.path(), small(500)).unwrap();
        append_range(&log, 1, 30);
    }
    let first = segments(dir.path())[0].clone();
    flip_byte(&first, HEADER_LEN as u64 + 2);
    let log = Log::open(dir.path(), small(500)).unwrap();
    assert!(
        log.recovery().is_none(),
        "closed segments are not scanned at open"
    );
    let err = log.read(0, 10, usize::MAX).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt);
    // records in the other segments are still readable
    let second_base: u64 = segments(dir.path())[1]
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()[..20]
        .parse()
        .unwrap();
    assert_payloads(
        &log.read(second_base - 1, usize::MAX, usize::MAX).unwrap(),
        second_base,
        30,
    );
    // a closed segment that is too short is reported too
    drop(log);
    flip_byte(&first, HEADER_LEN as u64 + 2); // repaired
    let log = Log::open(dir.path(), small(500)).unwrap();
    assert_payloads(&read_all(&log), 1, 30);
    drop(log);
    truncate(&first, 100); // inside the first frame
    let log = Log::open(dir.path(), small(500)).unwrap();
    let err = log.read(0, 1000, usize::MAX).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
}
