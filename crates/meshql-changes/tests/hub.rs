//! The hub copies store feeds into the log exactly once, across restarts and crashes.

use meshql_changes::feed::read_page;
use meshql_changes::{FeedFilter, Hub, HubOptions};
use meshql_core::{Cursor, DynStore, NewDocument, Store, TokenFilter, WriteContext};
use meshql_log::{Log, LogOptions};
use meshql_store_sqlite::{SqliteDatabase, SqliteOptions, SqliteStore};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

async fn sqlite_store(dir: &Path, table: &str) -> DynStore {
    let db = SqliteDatabase::open(&dir.join("data.db"), SqliteOptions::default()).unwrap();
    let store = SqliteStore::new(db, table);
    store.prepare(&[]).await.unwrap();
    Arc::new(store)
}

async fn write(store: &DynStore, name: &str, tokens: &[&str]) -> String {
    let payload = json!({"name": name}).as_object().unwrap().clone();
    let ctx = WriteContext::SYSTEM
        .with_tokens(tokens.iter().map(|t| t.to_string()).collect())
        .with_correlation_id(format!("c-{name}"));
    store
        .create(NewDocument::new(payload), &ctx)
        .await
        .unwrap()
        .id
}

fn options() -> HubOptions {
    HubOptions {
        poll: Duration::from_millis(20),
        checkpoint_every: Duration::from_millis(50),
        ..HubOptions::default()
    }
}

/// Every record of the log, as JSON values.
fn all(log: &Log) -> Vec<Value> {
    read_page(log, 0, usize::MAX, &FeedFilter::default())
        .unwrap()
        .changes
        .into_iter()
        .map(|(_, c)| serde_json::from_slice(&c).unwrap())
        .collect()
}

async fn until_log_holds(log: &Log, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = all(log);
        if got.len() >= n || Instant::now() > deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn names(records: &[Value]) -> Vec<String> {
    records
        .iter()
        .map(|r| r["payload"]["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_reach_the_log_once_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let hens = sqlite_store(dir.path(), "hen").await;
    let coops = sqlite_store(dir.path(), "coop").await;
    let stores = vec![
        ("hen".to_owned(), hens.clone()),
        ("coop".to_owned(), coops.clone()),
    ];
    let log_dir = dir.path().join("changes");

    let log = Log::open(&log_dir, LogOptions::default()).unwrap();
    let hub = Hub::start(log.clone(), stores.clone(), options()).unwrap();
    write(&hens, "h1", &[]).await;
    write(&coops, "c1", &[]).await;
    write(&hens, "h2", &["alice"]).await;
    let got = until_log_holds(&log, 3).await;
    assert_eq!(got.len(), 3);
    // the log orders changes of one entity as their store committed them; two entities'
    // tailers copy independently, so h1 and c1 may land in either order
    let positions: Vec<_> = got
        .iter()
        .map(|r| r["position"].as_u64().unwrap())
        .collect();
    assert_eq!(positions, vec![1, 2, 3]);
    let h1 = got.iter().find(|r| r["payload"]["name"] == "h1").unwrap();
    assert_eq!(h1["op"], "create");
    assert_eq!(h1["correlation_id"], "c-h1");
    let per_entity = |e: &str| {
        got.iter()
            .filter(|r| r["entity"] == e)
            .map(|r| r["payload"]["name"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(per_entity("hen"), vec!["h1", "h2"]);
    assert_eq!(per_entity("coop"), vec!["c1"]);
    hub.stop().await;
    drop(hub);
    drop(log);

    // written while no hub runs: copied at the next start, and nothing copied twice
    write(&hens, "h3", &[]).await;
    let log = Log::open(&log_dir, LogOptions::default()).unwrap();
    let hub = Hub::start(log.clone(), stores.clone(), options()).unwrap();
    write(&coops, "c2", &[]).await;
    let got = until_log_holds(&log, 5).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let got_later = all(&log);
    assert_eq!(got, got_later, "nothing more arrives");
    let mut sorted = names(&got);
    sorted.sort();
    assert_eq!(sorted, vec!["c1", "c2", "h1", "h2", "h3"]);
    assert_eq!(hub.stats().iter().map(|s| s.copied).sum::<u64>(), 2);

    // filters: by entity, by tokens; `last` moves past what is filtered out
    let only_coops = FeedFilter::everything().only(&["coop".into()]);
    let page = read_page(&log, 0, 10, &only_coops).unwrap();
    assert_eq!(page.changes.len(), 2);
    assert_eq!(page.last, 5);
    let bob = FeedFilter::decide(
        TokenFilter::AnyOf(vec!["bob".into()]),
        &meshql_core::Grants::unrestricted(),
        &[],
        None,
    )
    .unwrap();
    let page = read_page(&log, 0, 10, &bob).unwrap();
    assert_eq!(page.changes.len(), 4, "alice's hen is hidden from bob");
    let page = read_page(&log, 0, 2, &FeedFilter::default()).unwrap();
    assert_eq!((page.changes.len(), page.last), (2, 2));
    hub.stop().await;
    hens.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_without_checkpoint_copies_nothing_twice() {
    let dir = tempfile::tempdir().unwrap();
    let hens = sqlite_store(dir.path(), "hen").await;
    let stores = vec![("hen".to_owned(), hens.clone())];
    let log_dir = dir.path().join("changes");
    {
        let log = Log::open(&log_dir, LogOptions::default()).unwrap();
        let hub = Hub::start(log.clone(), stores.clone(), options()).unwrap();
        for i in 0..50 {
            write(&hens, &format!("h{i}"), &[]).await;
        }
        until_log_holds(&log, 50).await;
        // a crash: no stop, and the checkpoint is older than the log (or gone)
        drop(hub);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _ = std::fs::remove_file(log_dir.join("hub.json"));
    for i in 50..60 {
        write(&hens, &format!("h{i}"), &[]).await;
    }
    let log = Log::open(&log_dir, LogOptions::default()).unwrap();
    let hub = Hub::start(log.clone(), stores, options()).unwrap();
    let got = until_log_holds(&log, 60).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        all(&log).len(),
        60,
        "exactly the stored versions, once each"
    );
    let feed = hens.changes(Cursor::START, 1000).await.unwrap();
    let stored: Vec<String> = feed.iter().map(|c| c.id.clone()).collect();
    let logged: Vec<String> = got
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(logged, stored, "the log holds the store's feed, in order");
    hub.stop().await;
    hens.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_entities_keep_each_stores_order_not_a_global_one() {
    // What the log promises is each entity's commit order (its store's feed order, which
    // orders every two writes of one document and every two where one began after the other
    // was acknowledged); the tailers copy entities independently, so how two entities
    // written at once interleave is not promised and not asserted.
    let dir = tempfile::tempdir().unwrap();
    let hens = sqlite_store(dir.path(), "hen").await;
    let coops = sqlite_store(dir.path(), "coop").await;
    let stores = vec![
        ("hen".to_owned(), hens.clone()),
        ("coop".to_owned(), coops.clone()),
    ];
    let log = Log::open(&dir.path().join("changes"), LogOptions::default()).unwrap();
    let hub = Hub::start(log.clone(), stores, options()).unwrap();
    let mut tasks = Vec::new();
    for (entity, store) in [("hen", hens.clone()), ("coop", coops.clone())] {
        for w in 0..4 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                // sequential writes of one document: create, then updates
                let id = write(&store, &format!("{entity}{w}-0"), &[]).await;
                for i in 1..5 {
                    let payload = json!({"name": format!("{entity}{w}-{i}")})
                        .as_object()
                        .unwrap()
                        .clone();
                    store
                        .update(&id, NewDocument::new(payload), &WriteContext::SYSTEM)
                        .await
                        .unwrap()
                        .expect("found");
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let got = until_log_holds(&log, 40).await;
    assert_eq!(got.len(), 40, "every write once");
    let positions: Vec<u64> = got
        .iter()
        .map(|r| r["position"].as_u64().unwrap())
        .collect();
    assert_eq!(positions, (1..=40).collect::<Vec<_>>());
    for (entity, store) in [("hen", &hens), ("coop", &coops)] {
        // per entity: exactly its store's feed, in that order
        let feed = store.changes(Cursor::START, 1000).await.unwrap();
        let stored: Vec<(String, String)> = feed
            .iter()
            .map(|c| (c.id.clone(), c.created_at.to_string()))
            .collect();
        let logged: Vec<(String, String)> = got
            .iter()
            .filter(|r| r["entity"] == entity)
            .map(|r| {
                (
                    r["id"].as_str().unwrap().to_owned(),
                    r["created_at"].to_string(),
                )
            })
            .collect();
        assert_eq!(logged, stored, "{entity}: the store's feed order");
        // per document: its writes in the order they were made
        for w in 0..4 {
            let prefix = format!("{entity}{w}-");
            let versions: Vec<String> = names(&got)
                .into_iter()
                .filter(|n| n.starts_with(&prefix))
                .collect();
            let expected: Vec<String> = (0..5).map(|i| format!("{prefix}{i}")).collect();
            assert_eq!(versions, expected);
        }
    }
    hub.stop().await;
    hens.shutdown().await;
}
