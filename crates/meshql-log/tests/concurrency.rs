//! Concurrent appends and reads, subscriptions, and a randomized model check.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use common::*;
use meshql_log::{Log, LogOptions, LogReader, Record};

#[tokio::test]
async fn subscribe_wakes_on_append() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), LogOptions::default()).unwrap();
    let mut rx = log.subscribe();
    assert_eq!(*rx.borrow_and_update(), 0);

    let writer = log.clone();
    let task = tokio::task::spawn_blocking(move || {
        append_range(&writer, 1, 1);
    });
    rx.changed().await.unwrap();
    assert_eq!(*rx.borrow_and_update(), 1);
    task.await.unwrap();

    // a waiter parked before a batch sees its last offset; values only grow
    let waiter = tokio::spawn({
        let mut rx = log.subscribe();
        async move {
            let mut seen = vec![*rx.borrow_and_update()];
            while *seen.last().unwrap() < 50 {
                rx.changed().await.unwrap();
                seen.push(*rx.borrow_and_update());
            }
            seen
        }
    });
    let writer = log.clone();
    tokio::task::spawn_blocking(move || append_range(&writer, 2, 50))
        .await
        .unwrap();
    let seen = waiter.await.unwrap();
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    assert_eq!(*seen.last().unwrap(), 50);
    // a long-poll: wait for offsets after 50, then read them
    let writer = log.clone();
    let poll = tokio::spawn(async move {
        let mut rx = writer.subscribe();
        rx.wait_for(|&last| last > 50).await.unwrap();
        writer.read(50, 100, usize::MAX).unwrap()
    });
    let writer = log.clone();
    tokio::task::spawn_blocking(move || append_range(&writer, 51, 52))
        .await
        .unwrap();
    let got = poll.await.unwrap();
    assert!(!got.is_empty() && got[0].offset == 51);
}

#[test]
fn concurrent_appends_and_reads_lose_nothing() {
    const THREADS: usize = 4;
    const BATCHES: usize = 300;
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), small(16 * 1024)).unwrap();
    let done = Arc::new(AtomicBool::new(false));

    // record contents: "<thread>:<batch>:<k>" so every record says who wrote it
    let writers: Vec<_> = (0..THREADS)
        .map(|t| {
            let log = log.clone();
            thread::spawn(move || {
                let mut rng = Rng::new(t as u64 + 100);
                let mut lasts = Vec::new();
                for b in 0..BATCHES {
                    let n = 1 + rng.below(4) as usize;
                    let batch: Vec<Vec<u8>> = (0..n)
                        .map(|k| {
                            let mut v = format!("{t}:{b}:{k}:").into_bytes();
                            let len = rng.below(64) as usize;
                            v.extend(rng.bytes(len));
                            v
                        })
                        .collect();
                    let refs: Vec<&[u8]> = batch.iter().map(|v| v.as_slice()).collect();
                    lasts.push((log.append(&refs).unwrap(), n));
                }
                lasts
            })
        })
        .collect();

    // a reader in this process and one "in another process" tail the log meanwhile
    let tail = |read: Box<dyn Fn(u64) -> Vec<Record> + Send>, done: Arc<AtomicBool>| {
        thread::spawn(move || {
            let mut seen: Vec<Record> = Vec::new();
            loop {
                let finished = done.load(Ordering::SeqCst);
                let after = seen.last().map_or(0, |r| r.offset);
                let got = read(after);
                for (i, r) in got.iter().enumerate() {
                    assert_eq!(r.offset, after + 1 + i as u64, "dense and in order");
                }
                let empty = got.is_empty();
                seen.extend(got);
                if finished && empty {
                    return seen;
                }
            }
        })
    };
    let in_process = {
        let log = log.clone();
        tail(
            Box::new(move |after| log.read(after, 37, 4096).unwrap()),
            done.clone(),
        )
    };
    let other = {
        let reader = LogReader::open(dir.path()).unwrap();
        tail(
            Box::new(move |after| reader.read(after, 50, 8192).unwrap()),
            done.clone(),
        )
    };

    let mut batches: Vec<(u64, usize)> = Vec::new();
    for w in writers {
        batches.extend(w.join().unwrap());
    }
    done.store(true, Ordering::SeqCst);
    let total: usize = batches.iter().map(|b| b.1).sum();
    assert_eq!(log.last_offset(), total as u64);

    // each batch got a contiguous range; the ranges tile 1..=total exactly
    batches.sort();
    let mut next = 1;
    for (last, n) in &batches {
        assert_eq!(last + 1 - *n as u64, next);
        next = last + 1;
    }

    let all = read_all(&log);
    assert_eq!(all.len(), total);
    // every writer's records appear exactly once, in the order it wrote them
    let mut per_thread: HashMap<usize, Vec<(usize, usize)>> = HashMap::new();
    for (i, r) in all.iter().enumerate() {
        assert_eq!(r.offset, i as u64 + 1);
        let text = String::from_utf8_lossy(&r.data);
        let mut parts = text.splitn(4, ':');
        let t: usize = parts.next().unwrap().parse().unwrap();
        let b: usize = parts.next().unwrap().parse().unwrap();
        let k: usize = parts.next().unwrap().parse().unwrap();
        per_thread.entry(t).or_default().push((b, k));
    }
    for t in 0..THREADS {
        let got = &per_thread[&t];
        assert!(
            got.windows(2).all(|w| w[0] < w[1]),
            "thread {t} out of order"
        );
        assert_eq!(got.iter().filter(|(_, k)| *k == 0).count(), BATCHES);
    }
    assert_eq!(in_process.join().unwrap(), all);
    assert_eq!(other.join().unwrap(), all);
}

/// Expected result of `read(after, max_records, max_bytes)` for a log holding `model`
/// (offset i + 1 → model[i]) from `first` on.
fn expected(
    model: &[Vec<u8>],
    first: u64,
    after: u64,
    max_records: usize,
    max_bytes: usize,
) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut bytes = 0;
    let start = after.saturating_add(1).max(first);
    for offset in start..=model.len() as u64 {
        let data = &model[offset as usize - 1];
        if out.len() >= max_records || (!out.is_empty() && bytes + data.len() > max_bytes) {
            break;
        }
        bytes += data.len();
        out.push((offset, data.clone()));
    }
    out
}

fn pairs(records: Vec<Record>) -> Vec<(u64, Vec<u8>)> {
    records.into_iter().map(|r| (r.offset, r.data)).collect()
}

#[test]
fn randomized_appends_reopens_and_reads_match_a_model() {
    for seed in 1..=12u64 {
        let mut rng = Rng::new(seed);
        let dir = tempfile::tempdir().unwrap();
        let segment_bytes = 200 + rng.below(3000);
        // every third seed also has size retention, so old records go away as it runs
        let max_bytes = (seed % 3 == 0).then(|| segment_bytes * (1 + rng.below(4)));
        let options = || LogOptions {
            retention: meshql_log::Retention {
                max_bytes,
                max_age: None,
            },
            ..small(segment_bytes)
        };
        let mut first_seen = 0;
        let mut log = Some(Log::open(dir.path(), options()).unwrap());
        let reader = LogReader::open(dir.path()).unwrap();
        let mut model: Vec<Vec<u8>> = Vec::new();
        for step in 0..400 {
            let ctx = format!("seed {seed} step {step}");
            match rng.below(10) {
                0..=4 => {
                    let n = rng.below(6) as usize;
                    let batch: Vec<Vec<u8>> = (0..n)
                        .map(|_| {
                            let len = if rng.below(20) == 0 {
                                2000 + rng.below(5000)
                            } else {
                                rng.below(300)
                            };
                            rng.bytes(len as usize)
                        })
                        .collect();
                    let refs: Vec<&[u8]> = batch.iter().map(|v| v.as_slice()).collect();
                    let last = log.as_ref().unwrap().append(&refs).unwrap();
                    model.extend(batch);
                    assert_eq!(last, model.len() as u64, "{ctx}");
                }
                5 => {
                    drop(log.take()); // first: the lock must be released
                    log = Some(Log::open(dir.path(), options()).unwrap());
                    assert!(log.as_ref().unwrap().recovery().is_none(), "{ctx}");
                }
                _ => {
                    let last = model.len() as u64;
                    let after = rng.below(last + 3);
                    let max_records = rng.below(40) as usize;
                    let max_bytes_read = rng.below(4000) as usize;
                    let log = log.as_ref().unwrap();
                    let first = log.first_offset();
                    if max_bytes.is_none() {
                        assert_eq!(first, if last == 0 { 0 } else { 1 }, "{ctx}");
                    }
                    assert!(
                        first >= first_seen && first <= last + 1,
                        "{ctx}: first {first}"
                    );
                    first_seen = first;
                    let want = expected(&model, first, after, max_records, max_bytes_read);
                    assert_eq!(log.last_offset(), last, "{ctx}");
                    assert_eq!(
                        pairs(log.read(after, max_records, max_bytes_read).unwrap()),
                        want,
                        "{ctx}"
                    );
                    if rng.below(2) == 0 {
                        assert_eq!(reader.last_offset().unwrap(), last, "{ctx}");
                        assert_eq!(
                            pairs(reader.read(after, max_records, max_bytes_read).unwrap()),
                            want,
                            "{ctx}"
                        );
                    }
                }
            }
        }
        let log = log.unwrap();
        let all = pairs(read_all(&log));
        let first = log.first_offset().max(1);
        assert_eq!(
            all,
            expected(&model, first, 0, usize::MAX, usize::MAX),
            "seed {seed}"
        );
        if let Some(max) = max_bytes {
            assert!(log.first_offset() > 1, "seed {seed}: retention ran");
            log.apply_retention().unwrap();
            assert!(
                total_bytes(dir.path()) <= max || segments(dir.path()).len() == 1,
                "seed {seed}"
            );
        }
        assert_eq!(
            pairs(reader.read(0, usize::MAX, usize::MAX).unwrap()),
            all,
            "seed {seed}"
        );
    }
}
