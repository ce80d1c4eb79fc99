//! Writing: bulk creates, owners kept by updates, concurrent writers and same-millisecond
//! updates.

use crate::harness::{create, name_of, payload, writer, ALL, W};
use meshql_core::{DynStore, NewDocument, TokenFilter};
use serde_json::json;
use std::collections::BTreeSet;

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
