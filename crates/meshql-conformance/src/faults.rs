//! Fault injection (`meshql_core::fault`): writes that fail part-way leave no trace.

use crate::feed::{correlated, settled};
use crate::harness::{create, name_of, names, payload, set, ALL};
use meshql_core::{Cursor, DynStore, NewDocument};
use serde_json::json;

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
