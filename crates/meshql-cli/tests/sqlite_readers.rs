//! SQLite's read resources through the binary (issue 11): a burst of whole-table GraphQL
//! reads runs at most `concurrent_scans` scans at once (so it cannot spawn a thread per
//! request), and the read connections it opened are closed after it, down to
//! `idle_read_connections`, as `/metrics` reports. A SQLite file is open to one process
//! alone unless its storage says `exclusive = false`.

mod common;

use common::{example_copy, free_port, run_meshql, Server};
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

/// The farm example with its SQLite file at `file` (an absolute path) and `extra` added to
/// the storage block.
fn farm_config(file: Option<&std::path::Path>, extra: &str) -> tempfile::TempDir {
    let file = file.map(|f| f.display().to_string());
    example_copy("farm", |toml| {
        let name = file.unwrap_or_else(|| "farm.db".to_owned());
        toml.replacen(
            "file = \"farm.db\"\n",
            &format!("file = \"{name}\"\n{extra}"),
            1,
        )
    })
}

/// meshql opens its SQLite files for itself alone: a second process serving the same file
/// stops at start-up, naming the file and the setting that shares it (also when only the
/// second says `exclusive = false`), and the first keeps serving. With `exclusive = false` in
/// both, both serve the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_is_open_to_one_process_unless_shared() {
    let share = "exclusive = false\n";
    // (the first's block, the second's): refused unless both share
    for (first_extra, extra) in [("", ""), ("", share), (share, share)] {
        let shared = !first_extra.is_empty();
        let first_dir = farm_config(None, first_extra);
        let data = tempfile::tempdir().unwrap();
        let first =
            Server::start_with_data_dir(&first_dir.path().join("meshql.toml"), data.path(), &[]);
        let created = first
            .client()
            .post_json("/farm/api", &json!({"name": "Emerdale"}))
            .await;
        created.expect_status(201);
        let id = created.json()["id"].as_str().unwrap().to_owned();

        let file = data.path().join("farm.db");
        let second_dir = farm_config(Some(&file), extra);
        let second_config = second_dir.path().join("meshql.toml");
        if shared {
            let second = Server::start(&second_config, &[]);
            let got = second.client().get(&format!("/farm/api/{id}")).await;
            got.expect_status(200);
            assert_eq!(
                got.json()["name"],
                "Emerdale",
                "the second process reads the file"
            );
        } else {
            let port = free_port().to_string();
            let second_data = tempfile::tempdir().unwrap();
            let started = std::time::Instant::now();
            let out = run_meshql(
                &[
                    "serve",
                    second_config.to_str().unwrap(),
                    "--port",
                    &port,
                    "--data-dir",
                    second_data.path().to_str().unwrap(),
                ],
                Duration::from_secs(60),
            );
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success(),
                "a second process served the file: {err}"
            );
            assert!(
                err.contains(&file.display().to_string())
                    && err.contains("another process has it open")
                    && err.contains("exclusive = false"),
                "{err}"
            );
            assert_eq!(
                err.matches("another process has it open").count(),
                1,
                "said once: {err}"
            );
            if extra.is_empty() {
                // the holder keeps its lock while it runs: nothing to wait for (SQLite's busy
                // timeout is 5 s)
                assert!(
                    started.elapsed() < Duration::from_millis(4_500),
                    "refused after {:?}: {err}",
                    started.elapsed()
                );
            }
        }
        let again = first.client().get(&format!("/farm/api/{id}")).await;
        again.expect_status(200);
        assert_eq!(again.json()["name"], "Emerdale");
    }
}
