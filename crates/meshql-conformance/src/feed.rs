//! The change feed (`meshql_core::change`): every write once, cursors to resume from, and a
//! tail under concurrent writers.

use crate::harness::{create, name_of, payload, writer, W};
use meshql_core::{
    ChangeOp, Cursor, DynStore, NewDocument, RemoveOutcome, StoreChange, WriteContext,
};
use serde_json::{json, Value};
use std::collections::BTreeSet;

/// Every change after `after`, read in pages of `page`, checking that cursors increase.
async fn drain(store: &DynStore, mut after: Cursor, page: usize) -> Vec<StoreChange> {
    let mut out: Vec<StoreChange> = Vec::new();
    loop {
        let batch = store.changes(after, page).await.expect("read the feed");
        assert!(batch.len() <= page, "a page holds at most `limit` changes");
        if batch.is_empty() {
            return out;
        }
        for c in batch {
            assert!(
                c.cursor > after,
                "cursors strictly increase: {} then {}",
                after,
                c.cursor
            );
            after = c.cursor;
            out.push(c);
        }
    }
}

/// The feed after `after` once it holds `expect` changes. A backend hands a change out only
/// once nothing can commit before it any more, so on a shared server a change may show a
/// moment after its write was acknowledged (while another session's older transaction runs).
pub(crate) async fn settled(store: &DynStore, after: Cursor, expect: usize) -> Vec<StoreChange> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let feed = drain(store, after, 1000).await;
        if feed.len() >= expect || std::time::Instant::now() > deadline {
            return feed;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

pub(crate) fn correlated(id: &str) -> WriteContext {
    W.with_correlation_id(id)
}

pub async fn feed_records_every_write_once(store: DynStore) {
    assert!(store.changes(Cursor::START, 10).await.unwrap().is_empty());
    let a = store
        .create(
            NewDocument::new(payload(json!({"name": "a1"}))),
            &correlated("c-create").with_tokens(vec!["alice".into()]),
        )
        .await
        .unwrap();
    let bulk = store
        .create_many(
            vec![
                NewDocument::new(payload(json!({"name": "b1"}))),
                NewDocument::new(payload(json!({"name": "c1"}))),
            ],
            &correlated("c-bulk"),
        )
        .await
        .unwrap();
    let a2 = store
        .update(
            &a.id,
            NewDocument::new(payload(json!({"name": "a2"}))),
            &correlated("c-update"),
        )
        .await
        .unwrap()
        .unwrap();
    let b = &bulk[0].id;
    assert_eq!(
        store.remove(b, &correlated("c-delete")).await.unwrap(),
        RemoveOutcome::Removed
    );
    // what writes nothing yields nothing
    assert_eq!(
        store.remove(b, &W).await.unwrap(),
        RemoveOutcome::AlreadyDeleted
    );
    assert_eq!(
        store.remove("ghost", &W).await.unwrap(),
        RemoveOutcome::NotFound
    );
    assert!(store
        .update(b, NewDocument::new(payload(json!({"name": "b2"}))), &W)
        .await
        .unwrap()
        .is_none());
    assert!(store
        .update(
            &a.id,
            NewDocument::new(payload(json!({"name": "hacked"}))),
            &writer(&["bob"])
        )
        .await
        .unwrap()
        .is_none());

    let feed = settled(&store, Cursor::START, 5).await;
    let summary: Vec<(String, ChangeOp, String, Option<String>)> = feed
        .iter()
        .map(|c| {
            (
                c.id.clone(),
                c.op,
                name_of(&c.payload),
                c.correlation_id.clone(),
            )
        })
        .collect();
    let some = |s: &str| Some(s.to_owned());
    assert_eq!(
        summary,
        vec![
            (
                a.id.clone(),
                ChangeOp::Create,
                "a1".into(),
                some("c-create")
            ),
            (
                bulk[0].id.clone(),
                ChangeOp::Create,
                "b1".into(),
                some("c-bulk")
            ),
            (
                bulk[1].id.clone(),
                ChangeOp::Create,
                "c1".into(),
                some("c-bulk")
            ),
            (
                a.id.clone(),
                ChangeOp::Update,
                "a2".into(),
                some("c-update")
            ),
            (b.clone(), ChangeOp::Delete, "b1".into(), some("c-delete")),
        ]
    );
    // a change is the stored version: its time and tokens are the version's
    assert_eq!(feed[0].created_at, a.created_at);
    assert_eq!(feed[3].created_at, a2.created_at);
    assert_eq!(feed[0].authorized_tokens, vec!["alice".to_owned()]);
    assert_eq!(
        feed[3].authorized_tokens,
        vec!["alice".to_owned()],
        "an update keeps the owner"
    );
    let versions = store.versions(b).await.unwrap();
    assert_eq!(feed[4].created_at, versions.last().unwrap().created_at);
    let p: Value = serde_json::from_str(&feed[0].payload).unwrap();
    assert_eq!(p["id"], a.id, "the payload carries the id, as reads do");
}

pub async fn feed_resumes_after_any_cursor(store: DynStore) {
    for i in 0..12 {
        create(&store, json!({"name": format!("n{i}")})).await;
    }
    let whole = settled(&store, Cursor::START, 12).await;
    assert_eq!(whole.len(), 12);
    // pages of any size, resumed from the last cursor seen, give the same feed
    for page in [1, 5, 12, 13] {
        assert_eq!(
            drain(&store, Cursor::START, page).await,
            whole,
            "pages of {page}"
        );
    }
    for (k, c) in whole.iter().enumerate() {
        assert_eq!(drain(&store, c.cursor, 4).await, whole[k + 1..].to_vec());
    }
    // writes after the reader's last cursor are the next changes, nothing before them again
    let last = whole.last().unwrap().cursor;
    create(&store, json!({"name": "late"})).await;
    let next = settled(&store, last, 1).await;
    assert_eq!(next.len(), 1);
    assert_eq!(name_of(&next[0].payload), "late");
}

/// 20 writers create and update documents while a reader tails the feed from its last cursor
/// (the outbox pitfall: a change whose transaction commits after a later one was read must
/// still be delivered). The reader ends with exactly the acknowledged writes, each once, in
/// order per document.
pub async fn feed_tail_under_concurrent_writers_is_exact(store: DynStore) {
    const WRITERS: usize = 20;
    const EACH: usize = 15;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let store = store.clone();
        let done = done.clone();
        tokio::spawn(async move {
            let mut after = Cursor::START;
            let mut seen: Vec<StoreChange> = Vec::new();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            loop {
                let finished =
                    done.load(std::sync::atomic::Ordering::Acquire) && seen.len() >= WRITERS * EACH;
                let batch = store.changes(after, 7).await.expect("read the feed");
                for c in &batch {
                    assert!(c.cursor > after, "cursors strictly increase");
                    after = c.cursor;
                }
                let empty = batch.is_empty();
                seen.extend(batch);
                if empty {
                    if finished || std::time::Instant::now() > deadline {
                        return seen;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                }
            }
        })
    };
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let store = store.clone();
        writers.push(tokio::spawn(async move {
            let id = store
                .create(
                    NewDocument::new(payload(json!({"name": format!("w{w}"), "n": 0}))),
                    &correlated(&format!("w{w}-0")),
                )
                .await
                .expect("create")
                .id;
            for i in 1..EACH {
                store
                    .update(
                        &id,
                        NewDocument::new(payload(json!({"name": format!("w{w}"), "n": i}))),
                        &correlated(&format!("w{w}-{i}")),
                    )
                    .await
                    .expect("update")
                    .expect("found");
            }
            id
        }));
    }
    let mut ids = Vec::new();
    for t in writers {
        ids.push(t.await.unwrap());
    }
    done.store(true, std::sync::atomic::Ordering::Release);
    let seen = reader.await.unwrap();
    assert_eq!(seen.len(), WRITERS * EACH, "every acknowledged write, once");
    let tags: BTreeSet<String> = seen
        .iter()
        .filter_map(|c| c.correlation_id.clone())
        .collect();
    assert_eq!(tags.len(), WRITERS * EACH, "no change twice");
    assert_eq!(
        seen,
        drain(&store, Cursor::START, 1000).await,
        "the tail equals the feed"
    );
    for id in ids {
        let of_id: Vec<&StoreChange> = seen.iter().filter(|c| c.id == id).collect();
        let ns: Vec<i64> = of_id
            .iter()
            .map(|c| {
                serde_json::from_str::<Value>(&c.payload).unwrap()["n"]
                    .as_i64()
                    .unwrap()
            })
            .collect();
        assert_eq!(
            ns,
            (0..EACH as i64).collect::<Vec<_>>(),
            "in order per document"
        );
        assert!(of_id.windows(2).all(|p| p[0].created_at < p[1].created_at));
        assert_eq!(of_id[0].op, ChangeOp::Create);
    }
}
