//! Reading: lists, `read_many`, searches (`find`, `find_batch`), ids and values outside
//! Latin-1, and token filters.

use crate::harness::{
    all, args, by_id, by_name, by_name_and_type, by_parent, create, create_at, name_of, names,
    now_ms, payload, set, writer, ALL, W,
};
use meshql_core::{BoundArgs, DynStore, Millis, NewDocument, RemoveOutcome, TokenFilter};
use serde_json::json;
use std::collections::BTreeSet;

pub async fn list_returns_latest_only(store: DynStore) {
    let a = create(&store, json!({"name": "a1"})).await;
    let _b = create(&store, json!({"name": "b1"})).await;
    store
        .update(&a, NewDocument::new(payload(json!({"name": "a2"}))), &W)
        .await
        .unwrap();
    let list = store
        .list(&meshql_core::ReadContext::new(&ALL, None))
        .await
        .unwrap();
    assert_eq!(list.len(), 2, "one item per id");
    assert_eq!(names(list.iter().map(|e| &e.payload)), set(&["a2", "b1"]));
}

pub async fn lists_keep_creation_order(store: DynStore) {
    let a = create(&store, json!({"name": "a"})).await;
    create(&store, json!({"name": "b"})).await;
    create(&store, json!({"name": "c"})).await;
    store
        .update(&a, NewDocument::new(payload(json!({"name": "a2"}))), &W)
        .await
        .unwrap();
    let listed: Vec<String> = store
        .list(&meshql_core::ReadContext::new(&ALL, None))
        .await
        .unwrap()
        .iter()
        .map(|e| name_of(&e.payload))
        .collect();
    assert_eq!(
        listed,
        ["a2", "b", "c"],
        "an update keeps the document's place"
    );
    let found: Vec<String> = store
        .find(
            &meshql_core::Search::new(&all(), &BoundArgs::new(), None),
            &meshql_core::ReadContext::new(&ALL, None),
        )
        .await
        .unwrap()
        .iter()
        .map(|r| name_of(&r.payload))
        .collect();
    assert_eq!(found, ["a2", "b", "c"]);
}

pub async fn read_many_and_remove_many(store: DynStore) {
    let a = create(&store, json!({"name": "a"})).await;
    let b = create(&store, json!({"name": "b"})).await;
    let c = create(&store, json!({"name": "c"})).await;
    let got = store
        .read_many(
            &[a.clone(), "missing".into(), c.clone()],
            &meshql_core::ReadContext::new(&ALL, None),
        )
        .await
        .unwrap();
    assert_eq!(
        got.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
        vec![a.clone(), c.clone()]
    );
    let outcomes = store
        .remove_many(&[a.clone(), b.clone(), "missing".into()], &W)
        .await
        .unwrap();
    assert_eq!(
        outcomes,
        vec![
            (a.clone(), RemoveOutcome::Removed),
            (b.clone(), RemoveOutcome::Removed),
            ("missing".to_owned(), RemoveOutcome::NotFound)
        ]
    );
    let left = store
        .read_many(
            &[a, b, c.clone()],
            &meshql_core::ReadContext::new(&ALL, None),
        )
        .await
        .unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].id, c);
}

/// `read_many` at a past time, with duplicates, tombstones and tokens: one read statement.
pub async fn read_many_at_a_time(store: DynStore) {
    let t0 = 1_700_000_000_000;
    create_at(&store, "a", json!({"name": "a1"}), t0).await;
    create_at(&store, "a", json!({"name": "a2"}), t0 + 10).await;
    create_at(&store, "b", json!({"name": "b1"}), t0 + 20).await;
    create_at(&store, "c", json!({"name": "c1"}), t0).await;
    store.remove("c", &W).await.unwrap();
    store
        .create(
            NewDocument::with_id("d", payload(json!({"name": "d1"}))).at(t0),
            &W.with_tokens(vec!["alice".to_owned()]),
        )
        .await
        .unwrap();
    let ids: Vec<String> = ["b", "a", "c", "d", "a", "missing"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let read = |at, filter: TokenFilter| {
        let (store, ids) = (store.clone(), ids.clone());
        async move {
            let before = store.stats().reads;
            let got = store
                .read_many(&ids, &meshql_core::ReadContext::new(&filter, at))
                .await
                .unwrap();
            assert_eq!(store.stats().reads - before, 1, "one read for all ids");
            got.iter().map(|e| name_of(&e.payload)).collect::<Vec<_>>()
        }
    };
    // request order, duplicates repeated, tombstones and missing ids left out
    assert_eq!(read(None, ALL).await, ["b1", "a2", "d1", "a2"]);
    assert_eq!(read(Some(t0 + 5), ALL).await, ["a1", "c1", "d1", "a1"]);
    assert_eq!(read(Some(t0 - 1), ALL).await, Vec::<String>::new());
    let bob = TokenFilter::AnyOf(vec!["bob".into()]);
    assert_eq!(read(Some(t0 + 10), bob).await, ["a2", "c1", "a2"]);
}

pub async fn find_by_id_field_and_two_fields(store: DynStore) {
    let a = create(&store, json!({"name": "chuck", "type": "hen"})).await;
    create(&store, json!({"name": "chuck", "type": "rooster"})).await;
    create(&store, json!({"name": "duck", "type": "hen"})).await;
    let by_id_rows = store
        .find(
            &meshql_core::Search::new(&by_id(), &args(json!({"id": a})), None),
            &meshql_core::ReadContext::new(&ALL, None),
        )
        .await
        .unwrap();
    assert_eq!(by_id_rows.len(), 1);
    assert_eq!(by_id_rows[0].id, a);
    let chucks = store
        .find(
            &meshql_core::Search::new(&by_name(), &args(json!({"name": "chuck"})), None),
            &meshql_core::ReadContext::new(&ALL, None),
        )
        .await
        .unwrap();
    assert_eq!(chucks.len(), 2);
    let hen_chuck = store
        .find(
            &meshql_core::Search::new(
                &by_name_and_type(),
                &args(json!({"name": "chuck", "type": "hen"})),
                None,
            ),
            &meshql_core::ReadContext::new(&ALL, None),
        )
        .await
        .unwrap();
    assert_eq!(hen_chuck.len(), 1);
    assert_eq!(hen_chuck[0].id, a);
    let everyone = store
        .find(
            &meshql_core::Search::new(&all(), &BoundArgs::new(), None),
            &meshql_core::ReadContext::new(&ALL, None),
        )
        .await
        .unwrap();
    assert_eq!(everyone.len(), 3);
}

pub async fn find_with_empty_or_missing_parameters(store: DynStore) {
    create(&store, json!({"name": "chuck"})).await;
    let none = store
        .find(
            &meshql_core::Search::new(&by_name(), &BoundArgs::new(), None),
            &meshql_core::ReadContext::new(&ALL, None),
        )
        .await
        .unwrap();
    assert!(none.is_empty(), "a missing argument matches nothing");
    let none = store
        .find(
            &meshql_core::Search::new(&by_name(), &args(json!({"name": ""})), None),
            &meshql_core::ReadContext::new(&ALL, None),
        )
        .await
        .unwrap();
    assert!(none.is_empty());
    let none = store
        .find(
            &meshql_core::Search::new(&by_id(), &args(json!({"id": "unknown"})), None),
            &meshql_core::ReadContext::new(&ALL, None),
        )
        .await
        .unwrap();
    assert!(none.is_empty());
}

pub async fn find_honours_limit(store: DynStore) {
    for i in 0..5 {
        create(&store, json!({"name": format!("n{i}")})).await;
    }
    let two = store
        .find(
            &meshql_core::Search::new(&all(), &BoundArgs::new(), Some(2)),
            &meshql_core::ReadContext::new(&ALL, None),
        )
        .await
        .unwrap();
    assert_eq!(two.len(), 2);
    let all_rows = store
        .find(
            &meshql_core::Search::new(&all(), &BoundArgs::new(), Some(100)),
            &meshql_core::ReadContext::new(&ALL, None),
        )
        .await
        .unwrap();
    assert_eq!(all_rows.len(), 5);
}

pub async fn find_at_a_time(store: DynStore) {
    let t0 = 1_700_000_000_000;
    create_at(&store, "a", json!({"name": "early"}), t0).await;
    create_at(&store, "b", json!({"name": "late"}), t0 + 10).await;
    let at_t0 = store
        .find(
            &meshql_core::Search::new(&all(), &BoundArgs::new(), None),
            &meshql_core::ReadContext::new(&ALL, Some(t0)),
        )
        .await
        .unwrap();
    assert_eq!(names(at_t0.iter().map(|r| &r.payload)), set(&["early"]));
    let listed = store
        .list(&meshql_core::ReadContext::new(&ALL, Some(t0 + 10)))
        .await
        .unwrap();
    assert_eq!(listed.len(), 2);
}

/// Searches `at` moments across a history of replaces (a document leaving one filter's
/// answer for another's) and a tombstone: each moment sees each document's version of that
/// moment, whole-table and filtered, never two versions of one document.
pub async fn find_at_moments_across_history(store: DynStore) {
    let t0 = 1_700_000_000_000;
    create_at(&store, "a", json!({"name": "x"}), t0).await;
    create_at(&store, "a", json!({"name": "y"}), t0 + 10).await;
    create_at(&store, "b", json!({"name": "y"}), t0 + 5).await;
    create_at(&store, "b", json!({"name": "x"}), t0 + 15).await;
    create_at(&store, "c", json!({"name": "x"}), t0 + 2).await;
    create_at(&store, "d", json!({"name": "x"}), t0 + 30).await;
    store.remove("c", &W).await.unwrap();
    let later = now_ms() + 60_000;
    // (at, every document, name = x, name = y)
    type Case<'a> = (Millis, &'a [&'a str], &'a [&'a str], &'a [&'a str]);
    let cases: &[Case] = &[
        (t0 - 1, &[], &[], &[]),
        (t0, &["a"], &["a"], &[]),
        (t0 + 2, &["a", "c"], &["a", "c"], &[]),
        (t0 + 5, &["a", "b", "c"], &["a", "c"], &["b"]),
        (t0 + 10, &["a", "b", "c"], &["c"], &["a", "b"]),
        (t0 + 15, &["a", "b", "c"], &["b", "c"], &["a"]),
        (t0 + 30, &["a", "b", "c", "d"], &["b", "c", "d"], &["a"]),
        (later, &["a", "b", "d"], &["b", "d"], &["a"]),
    ];
    for &(at, every, x, y) in cases {
        for (template, bound, expected) in [
            (all(), json!({}), every),
            (by_name(), json!({"name": "x"}), x),
            (by_name(), json!({"name": "y"}), y),
        ] {
            let rows = store
                .find(
                    &meshql_core::Search::new(&template, &args(bound.clone()), None),
                    &meshql_core::ReadContext::new(&ALL, Some(at)),
                )
                .await
                .unwrap();
            let mut ids: Vec<&str> = rows.iter().map(|r| r.id.as_str()).collect();
            ids.sort_unstable();
            assert_eq!(ids, expected, "at t0{:+}, {bound}", at - t0);
        }
    }
}

pub async fn find_batch_groups_rows_by_key(store: DynStore) {
    create(&store, json!({"name": "h1", "parent": "c1"})).await;
    create(&store, json!({"name": "h2", "parent": "c1"})).await;
    create(&store, json!({"name": "h3", "parent": "c2"})).await;
    let before = store.stats().reads;
    let rows = store
        .find_batch(
            &meshql_core::BatchSearch::new(
                &by_parent(),
                "id",
                &["c1".into(), "c2".into(), "c3".into()],
            ),
            &meshql_core::ReadContext::new(&ALL, None),
        )
        .await
        .unwrap();
    assert_eq!(store.stats().reads - before, 1, "one query for all keys");
    let mut grouped: std::collections::BTreeMap<String, BTreeSet<String>> = Default::default();
    for (k, r) in &rows {
        grouped
            .entry(k.clone())
            .or_default()
            .insert(name_of(&r.payload));
    }
    assert_eq!(grouped["c1"], set(&["h1", "h2"]));
    assert_eq!(grouped["c2"], set(&["h3"]));
    assert!(!grouped.contains_key("c3"));
    let ids = store
        .find_batch(
            &meshql_core::BatchSearch::new(&by_id(), "id", &[rows[0].1.id.clone()]),
            &meshql_core::ReadContext::new(&ALL, None),
        )
        .await
        .unwrap();
    assert_eq!(ids.len(), 1);
}

/// Ids, keys and values outside Latin-1 (CJK, emoji) are found by every kind of lookup: a
/// backend that passes keys through a column of another character set loses them.
pub async fn ids_and_values_outside_latin1_are_found(store: DynStore) {
    for (id, name, parent) in [
        ("漢字-1", "名前", "親😀"),
        ("e😀", "émoji😀", "親😀"),
        ("ü-3", "ü", "other"),
    ] {
        store
            .create(
                NewDocument::with_id(id, payload(json!({"name": name, "parent": parent}))),
                &W,
            )
            .await
            .expect("create");
    }
    let ids: Vec<String> = ["漢字-1", "e😀", "ü-3", "none-😀"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let found = store
        .read_many(&ids, &meshql_core::ReadContext::new(&ALL, None))
        .await
        .unwrap();
    assert_eq!(
        found.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(),
        ["漢字-1", "e😀", "ü-3"],
        "read_many"
    );
    let rows = store
        .find_batch(
            &meshql_core::BatchSearch::new(&by_parent(), "id", &["親😀".to_owned()]),
            &meshql_core::ReadContext::new(&ALL, None),
        )
        .await
        .unwrap();
    assert_eq!(
        names(rows.iter().map(|(_, r)| r.payload.as_str())),
        set(&["名前", "émoji😀"]),
        "find_batch"
    );
    assert!(
        rows.iter().all(|(k, _)| k == "親😀"),
        "keys come back as sent"
    );
    let by_name = store
        .find(
            &meshql_core::Search::new(&by_name(), &args(json!({"name": "émoji😀"})), None),
            &meshql_core::ReadContext::new(&ALL, None),
        )
        .await
        .unwrap();
    assert_eq!(by_name.len(), 1, "find by a field");
    let read = store
        .read("e😀", &meshql_core::ReadContext::new(&ALL, None))
        .await
        .unwrap()
        .expect("read");
    assert_eq!(name_of(&read.payload), "émoji😀");
}

pub async fn token_filtering(store: DynStore) {
    let secret = store
        .create(
            NewDocument::new(payload(json!({"name": "secret"}))),
            &W.with_tokens(vec!["alice".to_owned()]),
        )
        .await
        .unwrap()
        .id;
    let public = create(&store, json!({"name": "public"})).await;
    let alice = TokenFilter::AnyOf(vec!["alice".into()]);
    let bob = TokenFilter::AnyOf(vec!["bob".into()]);
    let nobody = TokenFilter::AnyOf(vec![]);
    assert!(store
        .read(&secret, &meshql_core::ReadContext::new(&alice, None))
        .await
        .unwrap()
        .is_some());
    assert!(store
        .read(&secret, &meshql_core::ReadContext::new(&bob, None))
        .await
        .unwrap()
        .is_none());
    assert!(store
        .read(&secret, &meshql_core::ReadContext::new(&ALL, None))
        .await
        .unwrap()
        .is_some());
    assert!(
        store
            .read(&public, &meshql_core::ReadContext::new(&bob, None))
            .await
            .unwrap()
            .is_some(),
        "untokened is public"
    );
    assert_eq!(
        store
            .read(&secret, &meshql_core::ReadContext::new(&alice, None))
            .await
            .unwrap()
            .unwrap()
            .authorized_tokens,
        vec!["alice".to_owned()]
    );
    assert_eq!(
        names(
            store
                .list(&meshql_core::ReadContext::new(&bob, None))
                .await
                .unwrap()
                .iter()
                .map(|e| &e.payload)
        ),
        set(&["public"])
    );
    assert_eq!(
        store
            .list(&meshql_core::ReadContext::new(&nobody, None))
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        store
            .list(&meshql_core::ReadContext::new(&alice, None))
            .await
            .unwrap()
            .len(),
        2
    );
    let found = store
        .find(
            &meshql_core::Search::new(&all(), &BoundArgs::new(), None),
            &meshql_core::ReadContext::new(&bob, None),
        )
        .await
        .unwrap();
    assert_eq!(names(found.iter().map(|r| &r.payload)), set(&["public"]));
    let batch = store
        .find_batch(
            &meshql_core::BatchSearch::new(&by_id(), "id", &[secret.clone(), public.clone()]),
            &meshql_core::ReadContext::new(&bob, None),
        )
        .await
        .unwrap();
    assert_eq!(batch.len(), 1);
    assert_eq!(
        store.remove(&secret, &writer(&["bob"])).await.unwrap(),
        RemoveOutcome::NotFound
    );
    assert!(store
        .update(
            &secret,
            NewDocument::new(payload(json!({"name": "hacked"}))),
            &writer(&["bob"])
        )
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        store.versions(&secret).await.unwrap().len(),
        1,
        "bob changed nothing"
    );
}
