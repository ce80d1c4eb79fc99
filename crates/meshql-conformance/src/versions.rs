//! Creating, updating and removing documents: ids, versions, tombstones and reads `at` a
//! time.

use crate::harness::{
    all, args, by_id, by_name, by_parent, create, create_at, name_of, names, payload, set, ALL, W,
};
use meshql_core::{BoundArgs, DynStore, NewDocument, RemoveOutcome};
use serde_json::{json, Value};

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

/// An import writes versions as they were — ids, times, tombstones, tokens — in any order,
/// each placed by its time: `at` reads answer as on the store they came from. Importing
/// them again writes nothing, and the store's feed holds each imported version once.
pub async fn import_keeps_versions_and_is_idempotent(store: DynStore) {
    use meshql_core::{Envelope, ReadContext, TokenFilter};
    let v = |id: &str, at: i64, deleted: bool, name: &str, tokens: &[&str]| Envelope {
        id: id.to_owned(),
        payload: json!({"name": name}).to_string(),
        created_at: at,
        deleted,
        authorized_tokens: tokens.iter().map(|t| t.to_string()).collect(),
    };
    // out of order on purpose: a later version first, then the ones before it
    let versions = vec![
        v("imp-a", 3_000, false, "a3", &[]),
        v("imp-a", 1_000, false, "a1", &[]),
        v("imp-b", 1_500, false, "b1", &["owner"]),
        v("imp-a", 2_000, false, "a2", &[]),
        v("imp-b", 2_500, true, "b1", &["owner"]),
    ];
    assert_eq!(store.import_versions(&versions).await.unwrap(), 5);
    assert_eq!(
        store.import_versions(&versions).await.unwrap(),
        0,
        "a second import writes nothing"
    );
    let history = store.versions("imp-a").await.unwrap();
    let times: Vec<i64> = history.iter().map(|e| e.created_at).collect();
    assert_eq!(times, [1_000, 2_000, 3_000]);
    let all = TokenFilter::All;
    let name_at = |env: Option<Envelope>| env.map(|e| name_of(&e.payload));
    assert_eq!(
        name_at(
            store
                .read("imp-a", &ReadContext::new(&all, None))
                .await
                .unwrap()
        ),
        Some("a3".to_owned())
    );
    assert_eq!(
        name_at(
            store
                .read("imp-a", &ReadContext::new(&all, Some(2_100)))
                .await
                .unwrap()
        ),
        Some("a2".to_owned())
    );
    // the tombstone is kept: b reads at 2,000 and not after 2,500
    assert!(store
        .read("imp-b", &ReadContext::new(&all, Some(2_000)))
        .await
        .unwrap()
        .is_some());
    assert!(store
        .read("imp-b", &ReadContext::new(&all, None))
        .await
        .unwrap()
        .is_none());
    let b = store.versions("imp-b").await.unwrap();
    assert_eq!(b.len(), 2);
    assert!(b[1].deleted);
    assert_eq!(b[0].authorized_tokens, ["owner"]);
    // one more version among those stored: only it is written
    let mut more = versions.clone();
    more.push(v("imp-a", 2_500, false, "a2b", &[]));
    assert_eq!(store.import_versions(&more).await.unwrap(), 1);
    // the feed: each of the six versions once, whatever was imported twice (read once it
    // holds six: on a shared server a change shows once no older transaction can commit)
    let mut feed: Vec<(String, i64)> = crate::feed::settled(&store, meshql_core::Cursor::seq(0), 6)
        .await
        .iter()
        .map(|c| (c.id.clone(), c.created_at))
        .collect();
    feed.sort();
    assert_eq!(
        feed,
        [
            ("imp-a".to_owned(), 1_000),
            ("imp-a".to_owned(), 2_000),
            ("imp-a".to_owned(), 2_500),
            ("imp-a".to_owned(), 3_000),
            ("imp-b".to_owned(), 1_500),
            ("imp-b".to_owned(), 2_500),
        ],
        "each imported version is on the feed once"
    );
    assert_eq!(
        name_at(
            store
                .read("imp-a", &ReadContext::new(&all, Some(2_600)))
                .await
                .unwrap()
        ),
        Some("a2b".to_owned())
    );
    assert_eq!(
        name_at(
            store
                .read("imp-a", &ReadContext::new(&all, None))
                .await
                .unwrap()
        ),
        Some("a3".to_owned()),
        "an older version imported later does not become the latest"
    );
}
