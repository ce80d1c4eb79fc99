//! The writer: appends and reads, reopening, segments, retention, groups, locking, policies.

mod common;

use std::fs;
use std::time::Duration;

use common::*;
use meshql_log::{ErrorKind, FsyncPolicy, Log, LogError, LogOptions, LogReader, Retention};

#[test]
fn empty_log() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), LogOptions::default()).unwrap();
    assert_eq!(log.first_offset(), 0);
    assert_eq!(log.last_offset(), 0);
    assert!(read_all(&log).is_empty());
    assert_eq!(log.append(&[]).unwrap(), 0);
    assert_eq!(
        segments(dir.path())
            .iter()
            .map(|p| p.file_name().unwrap().to_str().unwrap().to_string())
            .collect::<Vec<_>>(),
        ["00000000000000000001.seg"]
    );
    assert!(log.recovery().is_none());
}

#[test]
fn round_trip_many_small_and_some_large_records() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), LogOptions::default()).unwrap();
    let mut expected: Vec<Vec<u8>> = Vec::new();
    let mut rng = Rng::new(1);
    for round in 0..300 {
        let n = 1 + rng.below(20) as usize;
        let batch: Vec<Vec<u8>> = (0..n)
            .map(|k| {
                let len = if round % 50 == 7 && k == 0 {
                    1 << 20 | rng.below(1000) as usize // ~1 MiB
                } else {
                    rng.below(120) as usize
                };
                rng.bytes(len)
            })
            .collect();
        let refs: Vec<&[u8]> = batch.iter().map(|b| b.as_slice()).collect();
        let last = log.append(&refs).unwrap();
        expected.extend(batch);
        assert_eq!(last, expected.len() as u64);
    }
    assert_eq!(log.first_offset(), 1);
    assert_eq!(log.last_offset(), expected.len() as u64);

    // read everything in pages of 97 records
    let mut after = 0;
    let mut previous_ts = i64::MIN;
    loop {
        let page = log.read(after, 97, usize::MAX).unwrap();
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 97);
        for r in &page {
            assert_eq!(r.offset, after + 1);
            assert_eq!(r.data, expected[(r.offset - 1) as usize]);
            assert!(r.timestamp_ms >= previous_ts && r.timestamp_ms > 0);
            previous_ts = r.timestamp_ms;
            after = r.offset;
        }
    }
    assert_eq!(after, expected.len() as u64);
}

#[test]
fn reopen_continues_offsets() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = Log::open(dir.path(), LogOptions::default()).unwrap();
        append_range(&log, 1, 10);
    }
    let log = Log::open(dir.path(), LogOptions::default()).unwrap();
    assert!(log.recovery().is_none());
    assert_eq!(log.last_offset(), 10);
    append_range(&log, 11, 15);
    assert_payloads(&read_all(&log), 1, 15);
    drop(log);
    let log = Log::open(dir.path(), small(300)).unwrap();
    append_range(&log, 16, 40);
    assert!(segments(dir.path()).len() > 2);
    drop(log);
    let log = Log::open(dir.path(), LogOptions::default()).unwrap();
    assert_eq!(log.last_offset(), 40);
    assert_payloads(&read_all(&log), 1, 40);
}

#[test]
fn read_limits() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), LogOptions::default()).unwrap();
    let sizes = [10usize, 20, 30, 0, 40, 1000, 5];
    let data: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![n as u8; n]).collect();
    let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    assert_eq!(log.append(&refs).unwrap(), 7);

    let offsets = |v: Vec<meshql_log::Record>| v.iter().map(|r| r.offset).collect::<Vec<_>>();
    assert_eq!(
        offsets(log.read(0, 0, usize::MAX).unwrap()),
        Vec::<u64>::new()
    );
    assert_eq!(offsets(log.read(0, 2, usize::MAX).unwrap()), [1, 2]);
    assert_eq!(offsets(log.read(0, 100, 30).unwrap()), [1, 2]);
    assert_eq!(offsets(log.read(0, 100, 29).unwrap()), [1]);
    // the empty record fits even when the budget is used up
    assert_eq!(offsets(log.read(2, 100, 30).unwrap()), [3, 4]);
    // at least one record, even over the byte limit
    assert_eq!(offsets(log.read(5, 100, 10).unwrap()), [6]);
    assert_eq!(offsets(log.read(0, 100, 0).unwrap()), [1]);
    assert_eq!(offsets(log.read(5, 100, 1005).unwrap()), [6, 7]);
}

#[test]
fn read_from_the_middle_the_end_and_beyond() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), small(2000)).unwrap();
    append_range(&log, 1, 200);
    for after in [0, 1, 17, 99, 150, 198, 199] {
        assert_payloads(
            &log.read(after, usize::MAX, usize::MAX).unwrap(),
            after + 1,
            200,
        );
        assert_payloads(
            &log.read(after, 3, usize::MAX).unwrap(),
            after + 1,
            (after + 3).min(200),
        );
    }
    assert!(log.read(200, 10, usize::MAX).unwrap().is_empty());
    assert!(log.read(201, 10, usize::MAX).unwrap().is_empty());
    assert!(log.read(u64::MAX, 10, usize::MAX).unwrap().is_empty());
}

#[test]
fn segments_roll_and_reads_span_them() {
    let dir = tempfile::tempdir().unwrap();
    let segment_bytes = 1000;
    let log = Log::open(dir.path(), small(segment_bytes)).unwrap();
    append_range(&log, 1, 300);
    let segs = segments(dir.path());
    assert!(segs.len() > 10, "{} segments", segs.len());
    // names are 20-digit base offsets; the first is 1; each is within the size limit
    let mut bases = Vec::new();
    for p in &segs {
        let name = p.file_name().unwrap().to_str().unwrap();
        assert_eq!(name.len(), 24, "{name}");
        bases.push(name[..20].parse::<u64>().unwrap());
        assert!(fs::metadata(p).unwrap().len() <= segment_bytes, "{name}");
    }
    assert_eq!(bases[0], 1);
    // every base is the offset after the previous segment's records
    let all = read_all(&log);
    assert_payloads(&all, 1, 300);
    for (i, w) in bases.windows(2).enumerate() {
        let bytes: u64 = all
            .iter()
            .filter(|r| r.offset >= w[0] && r.offset < w[1])
            .map(|r| frame_len(r.data.len()))
            .sum();
        assert_eq!(bytes, fs::metadata(&segs[i]).unwrap().len());
    }
    // reads starting in every segment, crossing into the following ones
    for &b in &bases {
        assert_payloads(
            &log.read(b - 1, 50, usize::MAX).unwrap(),
            b,
            (b + 49).min(300),
        );
        assert_payloads(
            &log.read(b, 50, usize::MAX).unwrap(),
            b + 1,
            (b + 50).min(300),
        );
    }
    // after a reopen the closed segments are indexed lazily: read them backwards
    drop(log);
    let log = Log::open(dir.path(), small(segment_bytes)).unwrap();
    for after in (0..300).rev().step_by(7) {
        assert_payloads(
            &log.read(after, 5, usize::MAX).unwrap(),
            after + 1,
            (after + 5).min(300),
        );
    }
    // a batch bigger than a segment goes whole into a fresh one
    let big = [vec![7u8; 700], vec![8u8; 700]];
    let refs: Vec<&[u8]> = big.iter().map(|v| v.as_slice()).collect();
    assert_eq!(log.append(&refs).unwrap(), 302);
    let last = segments(dir.path()).pop().unwrap();
    assert!(last.ends_with("00000000000000000301.seg"));
    assert_eq!(fs::metadata(&last).unwrap().len(), 2 * frame_len(700));
    let tail = log.read(300, 10, usize::MAX).unwrap();
    assert_eq!(tail.len(), 2);
    assert_eq!(tail[1].data, big[1]);
}

#[test]
fn retention_by_bytes_drops_old_segments_but_never_the_active_one() {
    let dir = tempfile::tempdir().unwrap();
    let options = LogOptions {
        retention: Retention {
            max_bytes: Some(3000),
            max_age: None,
        },
        ..small(1000)
    };
    let log = Log::open(dir.path(), options.clone()).unwrap();
    append_range(&log, 1, 400);
    let first = log.first_offset();
    assert!(first > 1, "retention ran on roll");
    assert_eq!(log.last_offset(), 400);
    log.apply_retention().unwrap();
    assert!(total_bytes(dir.path()) <= 3000);
    assert_eq!(log.first_offset(), first, "under the limit already");
    let first_file = segments(dir.path())[0].clone();
    assert!(first_file.ends_with(format!("{first:020}.seg")));
    // reads from before first_offset start at first_offset
    assert_payloads(&read_all(&log), first, 400);
    assert_payloads(
        &log.read(first - 1, 3, usize::MAX).unwrap(),
        first,
        first + 2,
    );
    assert!(log.read(0, 1, 0).unwrap()[0].offset == first);

    // survives reopen
    drop(log);
    let log = Log::open(dir.path(), options).unwrap();
    assert_eq!(log.first_offset(), first);
    assert_payloads(&read_all(&log), first, 400);
    drop(log);

    // a limit of 0 keeps just the active segment
    let options = LogOptions {
        retention: Retention {
            max_bytes: Some(0),
            max_age: None,
        },
        ..small(1000)
    };
    let log = Log::open(dir.path(), options).unwrap();
    assert_eq!(segments(dir.path()).len(), 1);
    append_range(&log, 401, 450);
    log.apply_retention().unwrap();
    let segs = segments(dir.path());
    assert_eq!(segs.len(), 1);
    let base = log.first_offset();
    assert!(segs[0].ends_with(format!("{base:020}.seg")));
    assert_payloads(&read_all(&log), base, 450);
    assert_eq!(log.last_offset(), 450);
}

#[test]
fn retention_by_age() {
    let dir = tempfile::tempdir().unwrap();
    let options = LogOptions {
        retention: Retention {
            max_bytes: None,
            max_age: Some(Duration::from_millis(1)),
        },
        ..small(500)
    };
    let log = Log::open(dir.path(), options).unwrap();
    append_range(&log, 1, 100);
    std::thread::sleep(Duration::from_millis(20));
    log.apply_retention().unwrap();
    let segs = segments(dir.path());
    assert_eq!(segs.len(), 1);
    let first = log.first_offset();
    assert!(first > 1);
    assert_payloads(&read_all(&log), first, 100);
    // no limits: nothing is deleted
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), small(500)).unwrap();
    append_range(&log, 1, 100);
    log.apply_retention().unwrap();
    assert_eq!(log.first_offset(), 1);
}

#[test]
fn consumer_groups() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = Log::open(dir.path(), LogOptions::default()).unwrap();
        append_range(&log, 1, 5);
        assert_eq!(log.committed("relay.kafka").unwrap(), None);
        log.commit("relay.kafka", 3).unwrap();
        log.commit("sse-1_A", 5).unwrap();
        log.commit("relay.kafka", 4).unwrap();
        assert_eq!(log.committed("relay.kafka").unwrap(), Some(4));
        for bad in ["", ".", "..", "a/b", "../x", "a b", "ü", &"g".repeat(101)] {
            let e = log.commit(bad, 1).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidGroup, "{bad:?}");
            assert!(matches!(log.committed(bad), Err(LogError::InvalidGroup(_))));
        }
        log.commit(&"g".repeat(100), 2).unwrap();
    }
    let log = Log::open(dir.path(), LogOptions::default()).unwrap();
    assert_eq!(log.committed("relay.kafka").unwrap(), Some(4));
    assert_eq!(log.committed("sse-1_A").unwrap(), Some(5));
    assert_eq!(log.committed(&"g".repeat(100)).unwrap(), Some(2));
    assert_eq!(log.committed("other").unwrap(), None);
    // readers see them and may commit too
    let reader = LogReader::open(dir.path()).unwrap();
    assert_eq!(reader.committed("relay.kafka").unwrap(), Some(4));
    reader.commit("cli", 2).unwrap();
    assert_eq!(log.committed("cli").unwrap(), Some(2));
    // only the group files are left behind
    let mut names: Vec<String> = fs::read_dir(dir.path().join("groups"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["cli", &"g".repeat(100), "relay.kafka", "sse-1_A"]);
    // a damaged group file is reported, not misread
    fs::write(dir.path().join("groups").join("cli"), "not a number").unwrap();
    assert_eq!(log.committed("cli").unwrap_err().kind(), ErrorKind::Corrupt);
}

#[test]
fn a_second_writer_is_locked_out_until_the_first_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), LogOptions::default()).unwrap();
    append_range(&log, 1, 3);
    let err = Log::open(dir.path(), LogOptions::default()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Locked);
    match &err {
        LogError::Locked { holder, .. } => assert_eq!(*holder, Some(std::process::id())),
        other => panic!("{other:?}"),
    }
    // clones share the lock
    let clone = log.clone();
    drop(log);
    assert_eq!(
        Log::open(dir.path(), LogOptions::default())
            .unwrap_err()
            .kind(),
        ErrorKind::Locked
    );
    // readers take no lock
    let reader = LogReader::open(dir.path()).unwrap();
    assert_eq!(reader.last_offset().unwrap(), 3);
    drop(clone);
    let log = Log::open(dir.path(), LogOptions::default()).unwrap();
    assert_eq!(log.last_offset(), 3);
    append_range(&log, 4, 4);
    assert_eq!(reader.last_offset().unwrap(), 4);
}

#[test]
fn every_fsync_policy_appends_and_reopens() {
    for fsync in [
        FsyncPolicy::Always,
        FsyncPolicy::Never,
        FsyncPolicy::Interval(Duration::from_millis(1)),
        FsyncPolicy::default(),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let options = LogOptions {
            segment_bytes: 600,
            fsync,
            retention: Retention::default(),
        };
        {
            let log = Log::open(dir.path(), options.clone()).unwrap();
            append_range(&log, 1, 30);
            log.flush().unwrap();
            append_range(&log, 31, 40);
        }
        let log = Log::open(dir.path(), options).unwrap();
        assert_eq!(log.last_offset(), 40, "{fsync:?}");
        assert_payloads(&read_all(&log), 1, 40);
        log.flush().unwrap();
    }
}

#[test]
fn oversized_records_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), LogOptions::default()).unwrap();
    // zeroed allocation: the pages are never touched
    let huge = vec![0u8; meshql_log::MAX_RECORD_BYTES + 1];
    let err = log.append(&[b"ok", &huge]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RecordTooLarge);
    assert_eq!(log.last_offset(), 0, "nothing of the batch was written");
    assert_eq!(log.append(&[b"ok"]).unwrap(), 1);
}

#[test]
fn log_is_send_sync_and_clone() {
    fn check<T: Send + Sync + Clone>() {}
    fn check_reader<T: Send + Sync>() {}
    check::<Log>();
    check_reader::<LogReader>();
}
