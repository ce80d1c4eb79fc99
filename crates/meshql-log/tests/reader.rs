//! LogReader: a lock-free read-only view that follows the writer.

mod common;

use std::fs::{self, OpenOptions};
use std::io::Write;

use common::*;
use meshql_log::{ErrorKind, Log, LogOptions, LogReader, Retention};

#[test]
fn a_reader_opened_first_sees_later_appends_and_new_segments() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), small(800)).unwrap();
    let reader = LogReader::open(dir.path()).unwrap();
    assert_eq!(reader.last_offset().unwrap(), 0);
    assert_eq!(reader.first_offset().unwrap(), 0);
    assert!(reader.read(0, 10, usize::MAX).unwrap().is_empty());

    append_range(&log, 1, 3);
    assert_eq!(reader.last_offset().unwrap(), 3);
    assert_payloads(&reader.read(0, 10, usize::MAX).unwrap(), 1, 3);

    // tail the log while it rolls through many segments
    let segments_before = segments(dir.path()).len();
    let mut after = 3;
    for i in 4..=200 {
        append_range(&log, i, i);
        if i % 3 == 0 {
            let got = reader.read(after, usize::MAX, usize::MAX).unwrap();
            assert_payloads(&got, after + 1, i);
            after = i;
        }
    }
    assert!(segments(dir.path()).len() > segments_before + 10);
    assert_eq!(reader.last_offset().unwrap(), 200);
    assert_payloads(
        &reader.read(after, usize::MAX, usize::MAX).unwrap(),
        after + 1,
        200,
    );
    assert_payloads(&reader.read(0, usize::MAX, usize::MAX).unwrap(), 1, 200);
    // reads from the middle use the same paging rules as the writer
    for after in [0, 5, 77, 150, 199] {
        assert_eq!(
            reader.read(after, 7, 500).unwrap(),
            log.read(after, 7, 500).unwrap()
        );
    }
    assert!(reader.read(200, 10, usize::MAX).unwrap().is_empty());
}

#[test]
fn a_reader_opened_on_an_existing_log_reads_everything() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = Log::open(dir.path(), small(1000)).unwrap();
        append_range(&log, 1, 100);
    }
    let reader = LogReader::open(dir.path()).unwrap();
    assert_eq!(reader.first_offset().unwrap(), 1);
    assert_eq!(reader.last_offset().unwrap(), 100);
    for after in (0..100).rev() {
        assert_payloads(
            &reader.read(after, 3, usize::MAX).unwrap(),
            after + 1,
            (after + 3).min(100),
        );
    }
    // the writer can open while readers exist
    let log = Log::open(dir.path(), small(1000)).unwrap();
    append_range(&log, 101, 110);
    assert_payloads(&reader.read(95, 100, usize::MAX).unwrap(), 96, 110);
}

#[test]
fn a_partially_written_last_frame_is_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = Log::open(dir.path(), LogOptions::default()).unwrap();
        append_range(&log, 1, 6);
    }
    let seg = segments(dir.path()).pop().unwrap();
    let bytes = fs::read(&seg).unwrap();
    let last_frame = frame_len(payload(6).len()) as usize;
    let cut = bytes.len() - last_frame + 30; // header and a little of record 6
    fs::write(&seg, &bytes[..cut]).unwrap();

    let reader = LogReader::open(dir.path()).unwrap();
    assert_eq!(reader.last_offset().unwrap(), 5);
    assert_payloads(&reader.read(0, usize::MAX, usize::MAX).unwrap(), 1, 5);
    assert!(reader.read(5, 10, usize::MAX).unwrap().is_empty());
    // the "writer" finishes the frame
    let mut f = OpenOptions::new().append(true).open(&seg).unwrap();
    f.write_all(&bytes[cut..]).unwrap();
    drop(f);
    assert_eq!(reader.last_offset().unwrap(), 6);
    assert_payloads(&reader.read(4, usize::MAX, usize::MAX).unwrap(), 5, 6);
}

#[test]
fn a_reader_follows_a_writer_that_recovered_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = Log::open(dir.path(), LogOptions::default()).unwrap();
        append_range(&log, 1, 6);
    }
    let seg = segments(dir.path()).pop().unwrap();
    let len = fs::metadata(&seg).unwrap().len();
    OpenOptions::new()
        .write(true)
        .open(&seg)
        .unwrap()
        .set_len(len - 5)
        .unwrap();
    let reader = LogReader::open(dir.path()).unwrap();
    assert_eq!(reader.last_offset().unwrap(), 5);
    // the writer restarts, cuts the torn record 6 and appends a new record 6 and more
    let log = Log::open(dir.path(), LogOptions::default()).unwrap();
    append_range(&log, 6, 9);
    assert_payloads(&reader.read(0, usize::MAX, usize::MAX).unwrap(), 1, 9);
}

#[test]
fn a_reader_skips_segments_deleted_by_retention() {
    let dir = tempfile::tempdir().unwrap();
    let options = LogOptions {
        retention: Retention {
            max_bytes: Some(2500),
            max_age: None,
        },
        ..small(1000)
    };
    let log = Log::open(dir.path(), options).unwrap();
    append_range(&log, 1, 20);
    let reader = LogReader::open(dir.path()).unwrap();
    assert_eq!(reader.first_offset().unwrap(), log.first_offset());
    append_range(&log, 21, 300);
    let first = log.first_offset();
    assert!(first > 20);
    assert_eq!(reader.first_offset().unwrap(), first);
    assert_payloads(&reader.read(0, usize::MAX, usize::MAX).unwrap(), first, 300);
    append_range(&log, 301, 400);
    // without asking for first_offset: a read of deleted segments starts at what is kept
    let got = reader.read(0, usize::MAX, usize::MAX).unwrap();
    assert_payloads(&got, log.first_offset(), 400);
}

#[test]
fn a_reader_needs_an_existing_directory() {
    let dir = tempfile::tempdir().unwrap();
    let err = LogReader::open(&dir.path().join("missing")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io);
    // a directory without segments is an empty log that fills later
    let reader = LogReader::open(dir.path()).unwrap();
    assert_eq!(reader.last_offset().unwrap(), 0);
    let log = Log::open(dir.path(), LogOptions::default()).unwrap();
    append_range(&log, 1, 2);
    assert_payloads(&reader.read(0, 10, usize::MAX).unwrap(), 1, 2);
}
