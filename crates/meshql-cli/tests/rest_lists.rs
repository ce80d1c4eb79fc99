//! REST lists through the binary (issue 11 item 1, REST half): a plain `GET P` of tens of
//! thousands of documents is complete and correct, streamed as one snapshot of the moment it
//! began, while the server's memory stays far below the size of the bodies it is sending;
//! `limit`/`after` pages walk every document once by their `Link` headers; bad values are 400
//! JSON naming the parameter.

mod common;

use common::{Client, Server};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn config(dir: &Path) -> PathBuf {
    let file = dir.join("meshql.toml");
    std::fs::write(
        &file,
        "port = 1\n\n[[entity]]\nname = \"note\"\n\n[entity.rest]\npath = \"/note/api\"\n",
    )
    .expect("write the config");
    file
}

/// `n` notes of about `size` bytes each, created through `POST /note/api/bulk`; their ids.
async fn seed(c: &Client, n: usize, size: usize) -> Vec<String> {
    let text = "x".repeat(size);
    let mut ids = Vec::with_capacity(n);
    let batch = (512 * 1024 / size.max(1)).clamp(1, 2_000);
    while ids.len() < n {
        let items: Vec<Value> = (ids.len()..(ids.len() + batch).min(n))
            .map(|i| json!({"n": i, "text": text}))
            .collect();
        let r = c.post_json("/note/api/bulk", &Value::Array(items)).await;
        r.expect_status(201);
        let made = r.json();
        ids.extend(
            made.as_array()
                .unwrap()
                .iter()
                .map(|v| v["id"].as_str().unwrap().to_owned()),
        );
    }
    ids
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// The server's peak RSS while `work` runs, sampled every 5 ms on a thread.
async fn peak_rss_during<T>(pid: u32, work: impl std::future::Future<Output = T>) -> (u64, T) {
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(rss_kib(pid)));
    let sampler = {
        let (stop, peak) = (stop.clone(), peak.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(rss_kib(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let out = work.await;
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    (peak.load(Ordering::Relaxed), out)
}

fn ids_of(items: &[Value]) -> Vec<String> {
    items
        .iter()
        .map(|v| v["id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_large_list_is_complete_while_memory_stays_far_below_its_size() {
    const N: usize = 30_000;
    const SIZE: usize = 2_000;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&config(dir.path()), &[]);
    let c = server.client();
    let mut ids = seed(&c, N, SIZE).await;
    ids.sort();

    // one list first: the server's caches and connections are warm when measuring
    let first = c.get("/note/api").await;
    first.expect_status(200);
    assert!(
        first.header("content-length").is_none(),
        "a list of many pages is streamed (chunked)"
    );
    let body_bytes = first.text.len();
    assert!(body_bytes > N * SIZE, "{body_bytes} bytes");
    let items: Vec<Value> = serde_json::from_str(&first.text).unwrap();
    assert_eq!(ids_of(&items), ids, "every document once, in id order");
    assert!(items
        .iter()
        .all(|v| v["text"].as_str().unwrap().len() == SIZE));
    drop((first, items));

    // four lists at once
    const LISTS: usize = 4;
    let pid = server.pid();
    let before = rss_kib(pid);
    let (peak, bodies) = peak_rss_during(pid, async {
        let tasks: Vec<_> = (0..LISTS)
            .map(|_| {
                let c = c.clone();
                tokio::spawn(async move {
                    let r = c.get("/note/api").await;
                    r.expect_status(200);
                    r.text
                })
            })
            .collect();
        let mut bodies = Vec::new();
        for t in tasks {
            bodies.push(t.await.unwrap());
        }
        bodies
    })
    .await;
    for body in &bodies {
        let items: Vec<Value> = serde_json::from_str(body).unwrap();
        assert_eq!(ids_of(&items), ids);
    }
    let grown_mib = peak.saturating_sub(before) / 1024;
    let sent_mib = (bodies.iter().map(String::len).sum::<usize>() / (1024 * 1024)) as u64;
    eprintln!(
        "{LISTS} concurrent lists of {N} documents, {sent_mib} MiB sent: server RSS {} → peak {} MiB (+{grown_mib} MiB)",
        before / 1024,
        peak / 1024
    );
    // before pages, each list held its rows and its body at once: about 2.5 × the body
    // (+150 MiB per list of this size)
    assert!(
        grown_mib < 40,
        "RSS grew {grown_mib} MiB while sending {sent_mib} MiB"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_list_is_the_snapshot_of_its_start() {
    const N: usize = 6_000;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&config(dir.path()), &[]);
    let c = server.client();
    let made = seed(&c, N, 1_000).await;
    let mut ids = made.clone();
    ids.sort();
    let changed = ids[N - 5].clone();
    let n_of_changed = made.iter().position(|id| *id == changed).unwrap();

    let http = reqwest::Client::new();
    let mut resp = http.get(c.url("/note/api")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.chunk().await.unwrap().expect("a first chunk").to_vec();
    // written while the list streams: in pages still to come (the highest ids), and new
    let last = ids[N - 1].clone();
    let late = ids[N - 10].clone();
    for id in [&last, &late] {
        c.delete(&format!("/note/api/{id}"))
            .await
            .expect_status(200);
    }
    c.put_json(&format!("/note/api/{changed}"), &json!({"n": -1}))
        .await
        .expect_status(200);
    c.post_json("/note/api", &json!({"n": "new"}))
        .await
        .expect_status(201);
    while let Some(chunk) = resp.chunk().await.unwrap() {
        body.extend_from_slice(&chunk);
    }
    let items: Vec<Value> = serde_json::from_slice(&body).unwrap();
    assert_eq!(ids_of(&items), ids, "the documents of the moment it began");
    assert_eq!(
        items[N - 5]["n"],
        json!(n_of_changed),
        "not the version written since"
    );

    // a list begun now sees those writes
    let now = c.list("/note/api").await;
    assert_eq!(now.len(), N - 1);
    let now_ids: BTreeSet<String> = ids_of(&now).into_iter().collect();
    assert!(!now_ids.contains(&last) && !now_ids.contains(&late));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_and_after_walk_every_document_once() {
    const N: usize = 2_500;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&config(dir.path()), &[]);
    let c = server.client();
    let mut ids = seed(&c, N, 100).await;
    ids.sort();
    let whole = c.list("/note/api").await;

    let mut uri = "/note/api?limit=777".to_owned();
    let mut seen: Vec<Value> = Vec::new();
    let mut pages = 0;
    loop {
        let r = c.get(&uri).await;
        r.expect_status(200);
        assert_eq!(r.content_type(), "application/json");
        let Value::Array(items) = r.json() else {
            panic!("{uri}: not an array")
        };
        assert!(items.len() <= 777);
        pages += 1;
        seen.extend(items);
        let Some(link) = r.header("link") else { break };
        let next = link
            .strip_prefix('<')
            .and_then(|l| l.strip_suffix(">; rel=\"next\""))
            .unwrap_or_else(|| panic!("Link: {link}"));
        assert_eq!(
            next,
            format!(
                "/note/api?limit=777&after={}",
                seen.last().unwrap()["id"].as_str().unwrap()
            )
        );
        uri = next.to_owned();
    }
    assert_eq!(pages, 4, "777 + 777 + 777 + 169");
    assert_eq!(ids_of(&seen), ids, "every document once, in id order");
    assert_eq!(seen, whole, "the pages are the list");

    // after an id (or between ids), alone: up to 1,000 from there
    let r = c.get(&format!("/note/api?after={}", ids[9])).await;
    r.expect_status(200);
    let Value::Array(items) = r.json() else {
        panic!()
    };
    assert_eq!(items.len(), 1_000);
    assert_eq!(items[0]["id"], ids[10]);
    let r = c
        .get(&format!("/note/api?after={}&limit=5", ids[N - 1]))
        .await;
    assert_eq!(r.json(), json!([]));
    assert!(r.header("link").is_none());
    let r = c.get("/note/api?after=~&limit=5").await;
    assert_eq!(r.json(), json!([]), "`~` sorts after every UUID");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_list_parameters_are_400_json_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&config(dir.path()), &[]);
    let c = server.client();
    seed(&c, 3, 10).await;
    for (query, name) in [
        ("limit=0", "limit"),
        ("limit=10001", "limit"),
        ("limit=many", "limit"),
        ("limit=2&limit=3", "limit"),
        ("after=", "after"),
        ("limit=5&after=", "after"),
    ] {
        let r = c.get(&format!("/note/api?{query}")).await;
        r.expect_status(400);
        assert_eq!(r.content_type(), "application/json", "{query}");
        let body = r.json();
        assert_eq!(body["parameter"], name, "{query}: {body}");
        assert!(body["error"].as_str().unwrap().contains(name), "{body}");
    }
    // an unknown parameter is refused, naming the ones the list takes
    let r = c.get("/note/api?page=2").await;
    r.expect_status(400);
    assert_eq!(r.json()["parameter"], "page");
    // the OpenAPI document names them
    let doc = c.get("/note/api/api-docs/swagger.json").await.json();
    let params: Vec<&str> = doc["paths"]["/note/api"]["get"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(params, ["limit", "after", "at"]);
}
