//! The storage conformance suite (CONTRACT §4), written once and run unchanged against every
//! backend. A backend's test file calls [`conformance_tests!`] with an async expression that
//! yields a fresh, prepared, empty [`DynStore`]:
//!
//! ```text
//! meshql_conformance::conformance_tests!(async { my_backend::fresh_store().await });
//! ```
//!
//! Each case is a plain async function taking the store, so a failure names its case.
//! [`operator_tests!`] and [`output_tests!`] (processor outputs, `meshql_core::output`) are
//! run the same way.

pub mod operators;
pub mod outputs;
pub use operators::*;
pub use outputs::*;

use meshql_core::{
    BoundArgs, ChangeOp, Cursor, DynStore, Millis, Nested, NestedRow, NewDocument, QueryTemplate,
    RemoveOutcome, StoreChange, TokenFilter, WriteContext,
};
use serde_json::{json, Map, Value};
use std::collections::BTreeSet;

/// Templates every case may use; stores are prepared with them.
pub fn templates() -> Vec<QueryTemplate> {
    vec![by_id(), by_name(), by_name_and_type(), by_parent(), all()]
}

fn by_id() -> QueryTemplate {
    QueryTemplate::filter(r#"{"id": "{{id}}"}"#).unwrap()
}
fn by_name() -> QueryTemplate {
    QueryTemplate::filter(r#"{"payload.name": "{{name}}"}"#).unwrap()
}
fn by_name_and_type() -> QueryTemplate {
    QueryTemplate::filter(r#"{"payload.name": "{{name}}", "payload.type": "{{type}}"}"#).unwrap()
}
fn by_parent() -> QueryTemplate {
    QueryTemplate::filter(r#"{"payload.parent": "{{id}}"}"#).unwrap()
}
fn all() -> QueryTemplate {
    QueryTemplate::filter("{}").unwrap()
}

fn payload(v: Value) -> Map<String, Value> {
    v.as_object().expect("object").clone()
}

fn args(v: Value) -> BoundArgs {
    payload(v)
}

fn name_of(payload_text: &str) -> String {
    let v: Value = serde_json::from_str(payload_text).expect("payload is JSON");
    v["name"].as_str().unwrap_or_default().to_owned()
}

fn names<T: AsRef<str>>(payloads: impl IntoIterator<Item = T>) -> BTreeSet<String> {
    payloads.into_iter().map(|p| name_of(p.as_ref())).collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

const ALL: TokenFilter = TokenFilter::All;
/// A writer that sees everything and stamps no tokens.
const W: WriteContext = WriteContext::SYSTEM;

/// A writer holding `tokens` (they filter what it may change).
fn writer(tokens: &[&str]) -> WriteContext {
    WriteContext::SYSTEM.with_filter(TokenFilter::AnyOf(
        tokens.iter().map(|t| t.to_string()).collect(),
    ))
}

async fn create(store: &DynStore, v: Value) -> String {
    store
        .create(NewDocument::new(payload(v)), &W)
        .await
        .expect("create")
        .id
}

async fn create_at(store: &DynStore, id: &str, v: Value, at: Millis) {
    store
        .create(NewDocument::with_id(id, payload(v)).at(at), &W)
        .await
        .expect("create at");
}

pub async fn create_assigns_uuid_and_embeds_id(store: DynStore) {
    let env = store
        .create(NewDocument::new(payload(json!({"name": "chuck"}))), &W)
        .await
        .unwrap();
    assert_eq!(env.id.len(), 36, "ids are UUID strings: {}", env.id);
    assert!(!env.deleted);
    let p: Value = serde_json::from_str(&env.payload).unwrap();
    assert_eq!(p["name"], "chuck");
    assert_eq!(p["id"], env.id, "the payload carries the envelope id");
    let read = store
        .read(&env.id, &meshql_core::ReadContext::new(&ALL, None))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read.payload, env.payload);
    assert_eq!(read.created_at, env.created_at);
}

pub async fn create_honours_given_id_and_created_at(store: DynStore) {
    let at = 1_600_000_000_000;
    let env = store
        .create(
            NewDocument::with_id("fixed-id", payload(json!({"name": "old", "id": "spoof"}))).at(at),
            &W,
        )
        .await
        .unwrap();
    assert_eq!(env.id, "fixed-id");
    assert_eq!(env.created_at, at);
    let p: Value = serde_json::from_str(&env.payload).unwrap();
    assert_eq!(
        p["id"], "fixed-id",
        "the envelope id wins over a payload id"
    );
}

pub async fn read_missing_is_none(store: DynStore) {
    assert!(store
        .read("nope", &meshql_core::ReadContext::new(&ALL, None))
        .await
        .unwrap()
        .is_none());
    assert!(store.versions("nope").await.unwrap().is_empty());
}

pub async fn update_appends_a_version(store: DynStore) {
    let id = create(&store, json!({"name": "v1"})).await;
    let v2 = store
        .update(&id, NewDocument::new(payload(json!({"name": "v2"}))), &W)
        .await
        .unwrap()
        .expect("update of an existing id");
    assert_eq!(v2.id, id);
    let now = store
        .read(&id, &meshql_core::ReadContext::new(&ALL, None))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(name_of(&now.payload), "v2");
    let versions = store.versions(&id).await.unwrap();
    assert_eq!(versions.len(), 2);
    assert!(versions[0].created_at < versions[1].created_at);
    assert_eq!(
        names(
            store
                .list(&meshql_core::ReadContext::new(&ALL, None))
                .await
                .unwrap()
                .iter()
                .map(|e| &e.payload)
        ),
        set(&["v2"])
    );
}

pub async fn update_of_missing_or_deleted_writes_nothing(store: DynStore) {
    let none = store
        .update("ghost", NewDocument::new(payload(json!({"name": "x"}))), &W)
        .await
        .unwrap();
    assert!(none.is_none());
    assert!(store.versions("ghost").await.unwrap().is_empty());
    let id = create(&store, json!({"name": "a"})).await;
    store.remove(&id, &W).await.unwrap();
    let none = store
        .update(&id, NewDocument::new(payload(json!({"name": "b"}))), &W)
        .await
        .unwrap();
    assert!(none.is_none());
    assert_eq!(store.versions(&id).await.unwrap().len(), 2);
}

pub async fn versions_over_time(store: DynStore) {
    let t0 = 1_700_000_000_000;
    create_at(&store, "coop", json!({"name": "red"}), t0).await;
    create_at(&store, "coop", json!({"name": "purple"}), t0 + 1000).await;
    let read = |at| {
        let store = store.clone();
        async move {
            store
                .read("coop", &meshql_core::ReadContext::new(&ALL, at))
                .await
                .unwrap()
                .map(|e| name_of(&e.payload))
        }
    };
    assert_eq!(read(Some(t0 - 1)).await, None, "before creation");
    assert_eq!(
        read(Some(t0)).await.as_deref(),
        Some("red"),
        "at is inclusive"
    );
    assert_eq!(read(Some(t0 + 999)).await.as_deref(), Some("red"));
    assert_eq!(read(Some(t0 + 1000)).await.as_deref(), Some("purple"));
    assert_eq!(read(None).await.as_deref(), Some("purple"));
    let found = store
        .find(
            &meshql_core::Search::new(&by_id(), &args(json!({"id": "coop"})), None),
            &meshql_core::ReadContext::new(&ALL, Some(t0 + 500)),
        )
        .await
        .unwrap();
    assert_eq!(names(found.iter().map(|r| &r.payload)), set(&["red"]));
}

pub async fn back_dated_collisions_keep_latest_exact(store: DynStore) {
    create_at(&store, "d", json!({"name": "v100"}), 100).await;
    create_at(&store, "d", json!({"name": "v101"}), 101).await;
    // stamped 100 again: collisions push it to 102, which makes it the newest version
    create_at(&store, "d", json!({"name": "late"}), 100).await;
    let versions = store.versions("d").await.unwrap();
    let stamps: Vec<_> = versions.iter().map(|v| v.created_at).collect();
    assert_eq!(stamps, [100, 101, 102]);
    let now = store
        .read("d", &meshql_core::ReadContext::new(&ALL, None))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(name_of(&now.payload), "late");
    assert_eq!(
        names(
            store
                .list(&meshql_core::ReadContext::new(&ALL, None))
                .await
                .unwrap()
                .iter()
                .map(|e| &e.payload)
        ),
        set(&["late"])
    );
    // a back-dated version between existing ones stays history
    create_at(&store, "e", json!({"name": "e100"}), 100).await;
    create_at(&store, "e", json!({"name": "e200"}), 200).await;
    create_at(&store, "e", json!({"name": "e150"}), 150).await;
    let now = store
        .read("e", &meshql_core::ReadContext::new(&ALL, None))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(name_of(&now.payload), "e200");
    let then = store
        .read("e", &meshql_core::ReadContext::new(&ALL, Some(160)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(name_of(&then.payload), "e150");
}

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

fn now_ms() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as Millis
}

pub async fn remove_is_a_tombstone(store: DynStore) {
    let t0 = 1_700_000_000_000;
    create_at(&store, "hen", json!({"name": "chuck"}), t0).await;
    assert_eq!(
        store.remove("hen", &W).await.unwrap(),
        RemoveOutcome::Removed
    );
    assert!(
        store
            .read("hen", &meshql_core::ReadContext::new(&ALL, None))
            .await
            .unwrap()
            .is_none(),
        "gone now"
    );
    assert!(store
        .list(&meshql_core::ReadContext::new(&ALL, None))
        .await
        .unwrap()
        .is_empty());
    assert!(store
        .find(
            &meshql_core::Search::new(&all(), &BoundArgs::new(), None),
            &meshql_core::ReadContext::new(&ALL, None)
        )
        .await
        .unwrap()
        .is_empty());
    let then = store
        .read("hen", &meshql_core::ReadContext::new(&ALL, Some(t0)))
        .await
        .unwrap();
    assert_eq!(
        then.map(|e| name_of(&e.payload)).as_deref(),
        Some("chuck"),
        "history kept"
    );
    let versions = store.versions("hen").await.unwrap();
    assert_eq!(versions.len(), 2);
    assert!(versions[1].deleted);
    assert_eq!(
        store.remove("hen", &W).await.unwrap(),
        RemoveOutcome::AlreadyDeleted,
        "remove is idempotent"
    );
    assert_eq!(
        store.remove("never", &W).await.unwrap(),
        RemoveOutcome::NotFound
    );
}

pub async fn tombstone_is_applied_before_filtering(store: DynStore) {
    let id = create(&store, json!({"name": "ghost"})).await;
    store.remove(&id, &W).await.unwrap();
    let found = store
        .find(
            &meshql_core::Search::new(&by_name(), &args(json!({"name": "ghost"})), None),
            &meshql_core::ReadContext::new(&ALL, None),
        )
        .await
        .unwrap();
    assert!(
        found.is_empty(),
        "an older matching version must not resurrect"
    );
}

pub async fn latest_then_filter(store: DynStore) {
    let id = create(&store, json!({"name": "hen", "parent": "coop-a"})).await;
    store
        .update(
            &id,
            NewDocument::new(payload(json!({"name": "hen", "parent": "coop-b"}))),
            &W,
        )
        .await
        .unwrap();
    let in_a = store
        .find(
            &meshql_core::Search::new(&by_parent(), &args(json!({"id": "coop-a"})), None),
            &meshql_core::ReadContext::new(&ALL, None),
        )
        .await
        .unwrap();
    assert!(in_a.is_empty(), "moved documents leave their old group");
    let in_b = store
        .find(
            &meshql_core::Search::new(&by_parent(), &args(json!({"id": "coop-b"})), None),
            &meshql_core::ReadContext::new(&ALL, None),
        )
        .await
        .unwrap();
    assert_eq!(in_b.len(), 1);
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

/// What [`Store::find_nested`](meshql_core::Store::find_nested) must return: `find`, then
/// one `find_batch` per relationship and level.
async fn level_by_level(
    store: &DynStore,
    template: &QueryTemplate,
    args: &BoundArgs,
    nested: &[Nested],
    filter: &TokenFilter,
    at: Option<Millis>,
    limit: Option<usize>,
) -> Vec<NestedRow> {
    let rows = store
        .find(
            &meshql_core::Search::new(template, args, limit),
            &meshql_core::ReadContext::new(filter, at),
        )
        .await
        .unwrap();
    let mut out: Vec<NestedRow> = rows
        .into_iter()
        .map(|r| NestedRow {
            id: r.id,
            payload: serde_json::from_str(&r.payload).unwrap(),
            children: Vec::new(),
        })
        .collect();
    attach(&mut out, nested, filter, at).await;
    out
}

fn attach<'a>(
    parents: &'a mut [NestedRow],
    nested: &'a [Nested],
    filter: &'a TokenFilter,
    at: Option<Millis>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>> {
    Box::pin(async move {
        for n in nested {
            let key_of = |p: &NestedRow| -> Option<String> {
                if n.key_field == "id" {
                    return Some(p.id.clone());
                }
                match p.payload.get(&n.key_field)? {
                    Value::String(s) => Some(s.clone()),
                    Value::Number(x) => Some(x.to_string()),
                    Value::Bool(b) => Some(b.to_string()),
                    _ => None,
                }
            };
            let mut keys: Vec<String> = parents.iter().filter_map(key_of).collect();
            keys.sort();
            keys.dedup();
            let rows = if keys.is_empty() {
                Vec::new()
            } else {
                n.store
                    .find_batch(
                        &meshql_core::BatchSearch::new(&n.template, "id", &keys),
                        &meshql_core::ReadContext::new(filter, at),
                    )
                    .await
                    .unwrap()
            };
            let mut per_key: std::collections::HashMap<String, Vec<NestedRow>> = Default::default();
            for (key, row) in rows {
                let rows = per_key.entry(key).or_default();
                if n.vector || rows.is_empty() {
                    rows.push(NestedRow {
                        id: row.id,
                        payload: serde_json::from_str(&row.payload).unwrap(),
                        children: Vec::new(),
                    });
                }
            }
            for rows in per_key.values_mut() {
                attach(rows, &n.children, filter, at).await;
            }
            for p in parents.iter_mut() {
                let children = key_of(p)
                    .and_then(|k| per_key.get(&k).cloned())
                    .unwrap_or_default();
                p.children.push(children);
            }
        }
    })
}

/// A search and its relationships in one statement (where a backend can) gives exactly
/// what level-by-level lookups give: vectors and singletons, keys from the id, from a
/// payload field and from a number, tombstones, moved documents, `at`, tokens and `limit`.
pub async fn nested_search_matches_level_by_level(store: DynStore) {
    let t0 = 1_700_000_000_000;
    create_at(&store, "f1", json!({"name": "farm", "type": "farm"}), t0).await;
    create_at(
        &store,
        "f2",
        json!({"name": "farm", "type": "farm"}),
        t0 + 1,
    )
    .await;
    create_at(&store, "c1", json!({"name": "c1", "parent": "f1"}), t0 + 2).await;
    create_at(&store, "c2", json!({"name": "c2", "parent": "f1"}), t0 + 3).await;
    create_at(&store, "c3", json!({"name": "c3", "parent": "f2"}), t0 + 4).await;
    create_at(&store, "h1", json!({"name": "h1", "parent": "c1"}), t0 + 5).await;
    create_at(&store, "h2", json!({"name": "h2", "parent": "c1"}), t0 + 6).await;
    store
        .create(
            NewDocument::with_id("c4", payload(json!({"name": "c4", "parent": "f1"}))).at(t0 + 7),
            &W.with_tokens(vec!["alice".to_owned()]),
        )
        .await
        .unwrap();
    create_at(&store, "c2", json!({"name": "c2", "parent": "f2"}), t0 + 10).await;
    store.remove("h2", &W).await.unwrap();
    create_at(&store, "n1", json!({"name": "num", "code": 7}), t0 + 11).await;
    create_at(&store, "n2", json!({"name": "n2", "parent": "7"}), t0 + 12).await;

    let leaf = |key_field: &str, vector: bool, template: QueryTemplate| Nested {
        key_field: key_field.to_owned(),
        vector,
        store: store.clone(),
        template,
        fields: None,
        children: Vec::new(),
    };
    let mut children = leaf("id", true, by_parent());
    children.children = vec![
        leaf("id", true, by_parent()),
        leaf("parent", false, by_id()),
    ];
    let tree = vec![
        children,
        leaf("code", true, by_parent()),
        leaf("parent", false, by_id()),
    ];

    let alice = TokenFilter::AnyOf(vec!["alice".into()]);
    let bob = TokenFilter::AnyOf(vec!["bob".into()]);
    /// root template, its arguments, reader, `at`, `limit`
    type Case = (
        QueryTemplate,
        BoundArgs,
        TokenFilter,
        Option<Millis>,
        Option<usize>,
    );
    let cases: Vec<Case> = vec![
        (all(), BoundArgs::new(), ALL, None, None),
        (all(), BoundArgs::new(), ALL, Some(t0 + 8), None),
        (all(), BoundArgs::new(), alice, None, None),
        (all(), BoundArgs::new(), bob, Some(t0 + 20), None),
        (by_name(), args(json!({"name": "farm"})), ALL, None, Some(1)),
        (by_name(), args(json!({"name": "nobody"})), ALL, None, None),
    ];
    let mut checked = 0;
    for (i, (template, args, filter, at, limit)) in cases.into_iter().enumerate() {
        let expected = level_by_level(&store, &template, &args, &tree, &filter, at, limit).await;
        if i == 0 {
            // f1 → c1 (→ h1, ↑ f1) and c4; c2 moved to f2; h2 deleted; n1 → n2 by number
            let f1 = expected.iter().find(|r| r.id == "f1").unwrap();
            let kids: Vec<&str> = f1.children[0].iter().map(|r| r.id.as_str()).collect();
            assert_eq!(kids, ["c1", "c4"]);
            let c1 = &f1.children[0][0];
            assert_eq!(
                c1.children[0].iter().map(|r| &r.id).collect::<Vec<_>>(),
                ["h1"]
            );
            assert_eq!(c1.children[1][0].id, "f1");
            let n1 = expected.iter().find(|r| r.id == "n1").unwrap();
            assert_eq!(n1.children[1][0].id, "n2");
        }
        let Some(got) = store
            .find_nested(
                &meshql_core::Search::new(&template, &args, limit),
                &tree,
                &meshql_core::ReadContext::new(&filter, at),
            )
            .await
            .unwrap()
        else {
            // this backend goes level by level; one that can join its own tables must not
            assert!(
                store.relation().is_none(),
                "a joinable store answered level by level"
            );
            return;
        };
        assert_eq!(
            got, expected,
            "{} {args:?} {filter:?} at {at:?} limit {limit:?}",
            template.source
        );
        // the same tree read for a caller that names the fields it reads: the same rows,
        // and those fields as they are (a store may return more of them)
        let root_fields = projection(&["name", "code", "parent"]);
        let projected = store
            .find_nested(
                &meshql_core::Search::new(&template, &args, limit).reading(Some(&root_fields)),
                &with_fields(&tree),
                &meshql_core::ReadContext::new(&filter, at),
            )
            .await
            .unwrap()
            .expect("a store that joins its tables joins them for a projection too");
        assert_projected(&projected, &expected, &root_fields, &with_fields(&tree));
        checked += 1;
    }
    assert_eq!(checked, 6);
}

fn projection(fields: &[&str]) -> meshql_core::FieldSet {
    fields.iter().map(|f| f.to_string()).collect()
}

/// `tree` with every level reading `name` and the key fields of the levels below it.
fn with_fields(tree: &[Nested]) -> Vec<Nested> {
    tree.iter()
        .map(|n| {
            let mut fields = vec!["name"];
            fields.extend(n.children.iter().map(|c| c.key_field.as_str()));
            Nested {
                fields: Some(projection(&fields)),
                children: with_fields(&n.children),
                ..n.clone()
            }
        })
        .collect()
}

/// `got` holds the rows of `expected`, in order, each with the fields of `fields` (and of
/// `tree` below) exactly as `expected` has them.
fn assert_projected(
    got: &[meshql_core::NestedRow],
    expected: &[meshql_core::NestedRow],
    fields: &[String],
    tree: &[Nested],
) {
    let ids =
        |rows: &[meshql_core::NestedRow]| rows.iter().map(|r| r.id.clone()).collect::<Vec<_>>();
    assert_eq!(ids(got), ids(expected));
    for (g, e) in got.iter().zip(expected) {
        for f in fields {
            assert_eq!(g.payload.get(f), e.payload.get(f), "{} field {f}", e.id);
        }
        assert_eq!(g.children.len(), tree.len());
        for ((gc, ec), level) in g.children.iter().zip(&e.children).zip(tree) {
            let level_fields = level.fields.as_deref().unwrap_or_default();
            assert_projected(gc, ec, level_fields, &level.children);
        }
    }
}

pub async fn create_many_is_one_write(store: DynStore) {
    let docs = (0..5)
        .map(|i| NewDocument::new(payload(json!({"name": format!("n{i}")}))))
        .collect();
    let envs = store.create_many(docs, &W).await.unwrap();
    assert_eq!(envs.len(), 5);
    let ids: BTreeSet<_> = envs.iter().map(|e| e.id.clone()).collect();
    assert_eq!(ids.len(), 5, "distinct ids");
    assert_eq!(
        store
            .list(&meshql_core::ReadContext::new(&ALL, None))
            .await
            .unwrap()
            .len(),
        5
    );
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

pub async fn update_keeps_the_owner_unless_told_otherwise(store: DynStore) {
    let alice = TokenFilter::AnyOf(vec!["alice".into()]);
    let id = store
        .create(
            NewDocument::new(payload(json!({"name": "v1"}))),
            &W.with_tokens(vec!["alice".to_owned()]),
        )
        .await
        .unwrap()
        .id;
    store
        .update(
            &id,
            NewDocument::new(payload(json!({"name": "v2"}))),
            &writer(&["alice"]),
        )
        .await
        .unwrap()
        .unwrap();
    let now = store
        .read(&id, &meshql_core::ReadContext::new(&alice, None))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(now.authorized_tokens, vec!["alice".to_owned()]);
    let team = ["team".to_owned()];
    store
        .update(
            &id,
            NewDocument::new(payload(json!({"name": "v3"}))),
            &writer(&["alice"]).with_tokens(team.to_vec()),
        )
        .await
        .unwrap()
        .unwrap();
    let now = store
        .read(&id, &meshql_core::ReadContext::new(&ALL, None))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(now.authorized_tokens, team.to_vec());
}

pub async fn concurrent_writes_all_land(store: DynStore) {
    let mut tasks = Vec::new();
    for w in 0..20 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..10 {
                store
                    .create(
                        NewDocument::new(payload(json!({"name": format!("w{w}-{i}")}))),
                        &W,
                    )
                    .await
                    .expect("no write may fail under concurrency");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        store
            .list(&meshql_core::ReadContext::new(&ALL, None))
            .await
            .unwrap()
            .len(),
        200
    );
}

/// Writers updating and removing one id at once: every write lands as its own version, and
/// exactly one version is the latest (the newest), whatever order the writes took.
pub async fn concurrent_writes_of_one_id_keep_one_latest(store: DynStore) {
    let id = create(&store, json!({"name": "v0"})).await;
    let mut tasks = Vec::new();
    for w in 0..8 {
        let (store, id) = (store.clone(), id.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..5 {
                store
                    .update(
                        &id,
                        NewDocument::new(payload(json!({"name": format!("w{w}-{i}")}))),
                        &W,
                    )
                    .await
                    .expect("no update may fail under concurrency");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let ctx = meshql_core::ReadContext::new(&ALL, None);
    let versions = store.versions(&id).await.unwrap();
    assert_eq!(versions.len(), 41, "every update is a version");
    let newest = versions.iter().max_by_key(|v| v.created_at).unwrap();
    let listed: Vec<_> = store
        .list(&ctx)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.id == id)
        .collect();
    assert_eq!(listed.len(), 1, "one version of the id is the latest");
    assert_eq!(
        listed[0].payload, newest.payload,
        "the latest is the newest"
    );
    let read = store.read(&id, &ctx).await.unwrap().unwrap();
    assert_eq!(read.payload, newest.payload);

    // a remove racing updates: the id ends removed or updated after it, never both listed
    let mut tasks = Vec::new();
    for w in 0..4 {
        let (store, id) = (store.clone(), id.clone());
        tasks.push(tokio::spawn(async move {
            match w {
                0 => {
                    store.remove(&id, &W).await.unwrap();
                }
                _ => {
                    store
                        .update(&id, NewDocument::new(payload(json!({"name": "late"}))), &W)
                        .await
                        .unwrap();
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let versions = store.versions(&id).await.unwrap();
    let newest = versions.iter().max_by_key(|v| v.created_at).unwrap();
    let listed = store
        .list(&ctx)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.id == id)
        .count();
    let read = store.read(&id, &ctx).await.unwrap();
    match newest.deleted {
        true => assert!(listed == 0 && read.is_none(), "removed last: gone"),
        false => assert!(listed == 1 && read.is_some(), "updated last: one latest"),
    }
}

pub async fn same_millisecond_updates_keep_every_version(store: DynStore) {
    let id = create(&store, json!({"name": "v0"})).await;
    for i in 1..=5 {
        store
            .update(
                &id,
                NewDocument::new(payload(json!({"name": format!("v{i}")}))),
                &W,
            )
            .await
            .unwrap()
            .unwrap();
    }
    let versions = store.versions(&id).await.unwrap();
    assert_eq!(versions.len(), 6);
    let stamps: BTreeSet<_> = versions.iter().map(|v| v.created_at).collect();
    assert_eq!(stamps.len(), 6, "versions get distinct timestamps");
    let now = store
        .read(&id, &meshql_core::ReadContext::new(&ALL, None))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(name_of(&now.payload), "v5");
}

// ---------------------------------------------------------------------------------------
// The change feed (meshql_core::change)
// ---------------------------------------------------------------------------------------

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
async fn settled(store: &DynStore, after: Cursor, expect: usize) -> Vec<StoreChange> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let feed = drain(store, after, 1000).await;
        if feed.len() >= expect || std::time::Instant::now() > deadline {
            return feed;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

fn correlated(id: &str) -> WriteContext {
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

/// A batch that fails part-way through storage (its third document cannot be stored) leaves
/// nothing: no document, no version, no change. So does a single write that fails.
pub async fn failed_writes_leave_no_trace(store: DynStore) {
    let before = create(&store, json!({"name": "kept"})).await;
    let poison = || {
        NewDocument::new(payload(
            json!({"name": "poison", "note": meshql_core::fault::POISON}),
        ))
    };
    let batch = vec![
        NewDocument::new(payload(json!({"name": "first"}))),
        NewDocument::with_id(before.clone(), payload(json!({"name": "kept-v2"}))),
        poison(),
        NewDocument::new(payload(json!({"name": "last"}))),
    ];
    assert!(
        store
            .create_many(batch, &correlated("doomed"))
            .await
            .is_err(),
        "a batch with a document that cannot be stored fails"
    );
    assert!(store.create(poison(), &correlated("doomed")).await.is_err());
    assert!(store
        .update(&before, poison(), &correlated("doomed"))
        .await
        .is_err());
    assert_eq!(
        names(
            store
                .list(&meshql_core::ReadContext::new(&ALL, None))
                .await
                .unwrap()
                .iter()
                .map(|e| &e.payload)
        ),
        set(&["kept"]),
        "nothing of the failed writes is stored"
    );
    assert_eq!(store.versions(&before).await.unwrap().len(), 1);
    // the store goes on: the next write and its change land, and nothing of the failed writes
    // stands before it
    create(&store, json!({"name": "after"})).await;
    let feed = settled(&store, Cursor::START, 2).await;
    assert_eq!(
        feed.iter().map(|c| name_of(&c.payload)).collect::<Vec<_>>(),
        vec!["kept", "after"]
    );
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

/// Generates one `#[tokio::test]` per conformance case. `$make` is an async expression
/// evaluating to a fresh, prepared (with [`templates`]), empty `DynStore`.
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@cases $make;
            create_assigns_uuid_and_embeds_id,
            create_honours_given_id_and_created_at,
            read_missing_is_none,
            update_appends_a_version,
            update_of_missing_or_deleted_writes_nothing,
            versions_over_time,
            list_returns_latest_only,
            lists_keep_creation_order,
            list_pages_cover_the_list_once_in_id_order,
            list_pages_at_a_fixed_time_are_one_snapshot,
            list_pages_honour_the_token_filter,
            back_dated_collisions_keep_latest_exact,
            remove_is_a_tombstone,
            tombstone_is_applied_before_filtering,
            latest_then_filter,
            read_many_and_remove_many,
            read_many_at_a_time,
            nested_search_matches_level_by_level,
            create_many_is_one_write,
            find_by_id_field_and_two_fields,
            find_with_empty_or_missing_parameters,
            find_honours_limit,
            find_at_a_time,
            find_at_moments_across_history,
            find_batch_groups_rows_by_key,
            ids_and_values_outside_latin1_are_found,
            token_filtering,
            update_keeps_the_owner_unless_told_otherwise,
            concurrent_writes_all_land,
            concurrent_writes_of_one_id_keep_one_latest,
            same_millisecond_updates_keep_every_version,
            feed_records_every_write_once,
            feed_resumes_after_any_cursor,
            failed_writes_leave_no_trace,
            feed_tail_under_concurrent_writers_is_exact
        );
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let store: ::meshql_core::DynStore = $make.await;
                $crate::$case(store.clone()).await;
                store.shutdown().await;
            }
        )*
    };
}

/// The URL of a real server for tests: the environment variable `env_var` when set (CI sets
/// it once for the whole run), or else the URL printed by `scripts/services/<service>.sh
/// start`, which installs and starts the server when needed. Panics — so the test fails
/// loudly — when no server can be had. Cached per process.
pub fn test_server_url(service: &str, env_var: &str) -> String {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static URLS: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();
    let mut urls = URLS.get_or_init(Default::default).lock().unwrap();
    if let Some(url) = urls.get(service) {
        return url.clone();
    }
    let url = match std::env::var(env_var) {
        Ok(url) => url,
        Err(_) => {
            let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../scripts/services")
                .join(format!("{service}.sh"));
            let out = std::process::Command::new("bash")
                .arg(&script)
                .arg("start")
                .stdin(std::process::Stdio::null())
                .output()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
            assert!(
                out.status.success(),
                "{service} could not be started for the tests:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).unwrap().trim().to_owned()
        }
    };
    urls.insert(service.to_owned(), url.clone());
    url
}
