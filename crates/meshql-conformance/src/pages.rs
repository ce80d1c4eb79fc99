//! Paging through the list ([`meshql_core::StoreReader::list_page`]): id order, snapshots at
//! a fixed time, and token filters.

use crate::harness::{create_at, name_of, now_ms, payload, ALL, W};
use meshql_core::{DynStore, Millis, NewDocument, RemoveOutcome, TokenFilter};
use serde_json::json;

/// Every page of [`meshql_core::StoreReader::list_page`] from the start, each after the last
/// id of the one before, until a page comes back short: the documents in page order.
async fn walk_pages(
    store: &DynStore,
    limit: usize,
    ctx: &meshql_core::ReadContext<'_>,
) -> Vec<meshql_core::Envelope> {
    let mut out: Vec<meshql_core::Envelope> = Vec::new();
    loop {
        let after = out.last().map(|e| e.id.clone());
        let page = store
            .list_page(after.as_deref(), limit, ctx)
            .await
            .expect("list_page");
        assert!(
            page.len() <= limit,
            "{} rows for a limit of {limit}",
            page.len()
        );
        let short = page.len() < limit;
        out.extend(page);
        if short {
            return out;
        }
    }
}

fn ids_in_order(envs: &[meshql_core::Envelope]) -> Vec<String> {
    let ids: Vec<String> = envs.iter().map(|e| e.id.clone()).collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "pages are in strictly increasing id order: {ids:?}"
    );
    ids
}

/// Pages cover the list exactly once, in id order (not creation order), whatever the page
/// size; `after` need not be a stored id; past the end is empty; `limit` 0 is empty.
pub async fn list_pages_cover_the_list_once_in_id_order(store: DynStore) {
    // created out of id order, one of them updated (two versions), one deleted
    let order = [7, 3, 12, 0, 9, 1, 14, 5, 11, 2, 8, 13, 4, 10, 6];
    for n in order {
        let id = format!("doc-{n:02}");
        store
            .create(
                NewDocument::with_id(&id, payload(json!({"name": format!("n{n}")}))),
                &W,
            )
            .await
            .unwrap();
    }
    store
        .update(
            "doc-05",
            NewDocument::new(payload(json!({"name": "n5b"}))),
            &W,
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store.remove("doc-09", &W).await.unwrap(),
        RemoveOutcome::Removed
    );
    let now = meshql_core::ReadContext::new(&ALL, None);
    let mut listed = store.list(&now).await.unwrap();
    listed.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(listed.len(), 14);
    for limit in [1, 4, 5, 14, 100] {
        let pages = walk_pages(&store, limit, &now).await;
        ids_in_order(&pages);
        assert_eq!(
            pages, listed,
            "pages of {limit} equal the list, in id order"
        );
    }
    let first = store.list_page(None, 3, &now).await.unwrap();
    assert_eq!(ids_in_order(&first), ["doc-00", "doc-01", "doc-02"]);
    let between = store.list_page(Some("doc-04x"), 2, &now).await.unwrap();
    assert_eq!(
        ids_in_order(&between),
        ["doc-05", "doc-06"],
        "after an id that is not stored"
    );
    assert_eq!(name_of(&between[0].payload), "n5b", "the latest version");
    let skip_deleted = store.list_page(Some("doc-08"), 1, &now).await.unwrap();
    assert_eq!(
        ids_in_order(&skip_deleted),
        ["doc-10"],
        "a tombstone is skipped"
    );
    assert!(store
        .list_page(Some("doc-14"), 10, &now)
        .await
        .unwrap()
        .is_empty());
    assert!(store
        .list_page(Some("zzz"), 10, &now)
        .await
        .unwrap()
        .is_empty());
    assert!(store.list_page(None, 0, &now).await.unwrap().is_empty());
}

/// Read with one fixed `at`, pages are one snapshot: updates, deletes and creates made
/// between pages change nothing; versions, tombstones and creations after `at` are not seen,
/// those before it are.
pub async fn list_pages_at_a_fixed_time_are_one_snapshot(store: DynStore) {
    let t0: Millis = 1_700_000_000_000;
    for n in 0..20 {
        create_at(
            &store,
            &format!("p-{n:02}"),
            json!({"name": format!("v{n}")}),
            t0 + n,
        )
        .await;
    }
    // before the snapshot: p-03 gets a second version; after it: p-20 is created
    store
        .update(
            "p-03",
            NewDocument::new(payload(json!({"name": "v3b"}))).at(t0 + 50),
            &W,
        )
        .await
        .unwrap()
        .unwrap();
    create_at(&store, "p-20", json!({"name": "v20"}), t0 + 200).await;
    let at = meshql_core::ReadContext::new(&ALL, Some(t0 + 100));
    let snapshot = store.list(&at).await.unwrap();
    assert_eq!(snapshot.len(), 20);

    let first = store.list_page(None, 6, &at).await.unwrap();
    assert_eq!(first.len(), 6);
    // written between pages (now, long after the snapshot)
    store
        .update(
            "p-10",
            NewDocument::new(payload(json!({"name": "v10b"}))),
            &W,
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store.remove("p-12", &W).await.unwrap(),
        RemoveOutcome::Removed
    );
    assert_eq!(
        store.remove("p-01", &W).await.unwrap(),
        RemoveOutcome::Removed
    );
    create_at(&store, "p-07x", json!({"name": "new"}), now_ms()).await;
    let mut pages = first;
    loop {
        let page = store
            .list_page(Some(&pages.last().unwrap().id.clone()), 6, &at)
            .await
            .unwrap();
        let short = page.len() < 6;
        pages.extend(page);
        if short {
            break;
        }
    }
    let expected: Vec<String> = (0..20).map(|n| format!("p-{n:02}")).collect();
    assert_eq!(
        ids_in_order(&pages),
        expected,
        "each document of the snapshot once"
    );
    let names: Vec<String> = pages.iter().map(|e| name_of(&e.payload)).collect();
    assert_eq!(names[3], "v3b", "the version before the snapshot");
    assert_eq!(names[10], "v10", "not the version written between pages");
    assert_eq!(
        names[12], "v12",
        "deleted between pages: still in the snapshot"
    );
    let mut by_id = snapshot;
    by_id.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(pages, by_id, "the pages equal the list at that time");

    // now (no time, and a time after the writes): the writes between pages are seen
    let later = now_ms() + 60_000;
    for ctx in [
        meshql_core::ReadContext::new(&ALL, None),
        meshql_core::ReadContext::new(&ALL, Some(later)),
    ] {
        let now = walk_pages(&store, 4, &ctx).await;
        let ids = ids_in_order(&now);
        assert_eq!(ids.len(), 20, "{ids:?}");
        assert!(!ids.contains(&"p-12".to_owned()) && !ids.contains(&"p-01".to_owned()));
        assert!(ids.contains(&"p-07x".to_owned()) && ids.contains(&"p-20".to_owned()));
        let p10 = now.iter().find(|e| e.id == "p-10").unwrap();
        assert_eq!(name_of(&p10.payload), "v10b");
    }
}

/// Pages show what the reader's tokens allow, judged on the version visible at the time
/// read; hidden documents never shorten a page that has more to give.
pub async fn list_pages_honour_the_token_filter(store: DynStore) {
    let t0: Millis = 1_700_000_000_000;
    let alice = TokenFilter::AnyOf(vec!["alice".into()]);
    let bob = TokenFilter::AnyOf(vec!["bob".into()]);
    for n in 0..12 {
        let owner = match n % 3 {
            0 => vec!["alice".to_owned()],
            1 => vec!["bob".to_owned()],
            _ => vec![],
        };
        store
            .create(
                NewDocument::with_id(
                    format!("t-{n:02}"),
                    payload(json!({"name": format!("t{n}")})),
                )
                .at(t0 + n),
                &W.with_tokens(owner),
            )
            .await
            .unwrap();
    }
    // bob's t-04 is handed to the public at t0 + 50
    store
        .update(
            "t-04",
            NewDocument::new(payload(json!({"name": "t4b"}))).at(t0 + 50),
            &W.with_tokens(vec![]),
        )
        .await
        .unwrap()
        .unwrap();
    let ids = |envs: &[meshql_core::Envelope]| ids_in_order(envs);
    let as_alice = walk_pages(&store, 2, &meshql_core::ReadContext::new(&alice, None)).await;
    assert_eq!(
        ids(&as_alice),
        ["t-00", "t-02", "t-03", "t-04", "t-05", "t-06", "t-08", "t-09", "t-11"]
    );
    let alice_before = walk_pages(
        &store,
        2,
        &meshql_core::ReadContext::new(&alice, Some(t0 + 20)),
    )
    .await;
    assert_eq!(
        ids(&alice_before),
        ["t-00", "t-02", "t-03", "t-05", "t-06", "t-08", "t-09", "t-11"],
        "t-04 was still bob's then"
    );
    let as_bob = store
        .list_page(Some("t-01"), 3, &meshql_core::ReadContext::new(&bob, None))
        .await
        .unwrap();
    assert_eq!(ids(&as_bob), ["t-02", "t-04", "t-05"]);
    let everyone = walk_pages(&store, 5, &meshql_core::ReadContext::new(&ALL, None)).await;
    assert_eq!(everyone.len(), 12);
    assert!(store
        .list_page(
            Some("t-11"),
            5,
            &meshql_core::ReadContext::new(&alice, None)
        )
        .await
        .unwrap()
        .is_empty());
}
