//! SQLite's read resources through the binary (issue 11): a burst of whole-table GraphQL
//! reads runs at most `concurrent_scans` scans at once (so it cannot spawn a thread per
//! request), and the read connections it opened are closed after it, down to
//! `idle_read_connections`, as `/metrics` reports.

mod common;

use common::{example_copy, Server};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn threads(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

fn read_connections(metrics: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("meshql_storage_read_connections{storage=\"farm\"} "))
        .unwrap_or_else(|| panic!("no read-connection gauge in:\n{metrics}"))
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_scans_is_bounded_and_leaves_no_connections_behind() {
    let dir = example_copy("farm", |toml| {
        toml.replacen(
            "file = \"farm.db\"\n",
            "file = \"farm.db\"\nconcurrent_scans = 2\nidle_read_connections = 2\n",
            1,
        )
    });
    let server = Server::start(&dir.path().join("meshql.toml"), &["--workers", "2"]);
    let c = server.client();
    for part in 0..3 {
        let farms: Vec<Value> = (0..1_000)
            .map(|i| json!({"name": format!("farm {part}-{i}")}))
            .collect();
        c.post_json("/farm/api/bulk", &Value::Array(farms))
            .await
            .expect_status(201);
    }

    let pid = server.pid();
    let before = threads(pid);
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(before));
    let sampler = {
        let (stop, peak) = (stop.clone(), peak.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(threads(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let burst: Vec<_> = (0..64)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(async move {
                let r = c
                    .post_json("/farm/graph", &json!({"query": "{ getAll { name } }"}))
                    .await;
                r.expect_status(200);
                r.json()["data"]["getAll"].as_array().unwrap().len()
            })
        })
        .collect();
    for b in burst {
        assert_eq!(b.await.unwrap(), 3_000);
    }
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let grew = peak.load(Ordering::Relaxed) - before;
    // two scan threads at most (a thread per request would be 64)
    assert!(
        grew <= 4,
        "threads grew by {grew} during 64 concurrent scans"
    );

    // every connection the burst opened beyond the two kept idle is closed (polled: a
    // scan's connection returns to the pool just after its answer is sent)
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let open = read_connections(&c.get("/metrics").await.text);
        if open <= 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{open} read connections still open"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
