//! `SqliteStore::apply_log`: versions made elsewhere (a Kafka topic the store materialises)
//! applied in the log's order, with the log's positions in the same transaction.

use meshql_core::{
    ChangeFeed, Cursor, Envelope, OutputStore, ReadContext, StateWrite, Store, StoreReader,
    TokenFilter,
};
use meshql_store_sqlite::{LogVersion, SqliteDatabase, SqliteOptions, SqliteStore};
use serde_json::{json, Value};

fn version(id: &str, at: i64, deleted: bool, payload: Value, tokens: &[&str]) -> Envelope {
    Envelope {
        id: id.into(),
        payload: payload.to_string(),
        created_at: at,
        deleted,
        authorized_tokens: tokens.iter().map(|t| (*t).to_owned()).collect(),
    }
}

fn offset(partition: u32, next: u64) -> StateWrite {
    StateWrite {
        key: format!("hens/{partition}"),
        group: None,
        value: Some(next.to_string()),
    }
}

#[tokio::test]
async fn versions_follow_the_logs_order_with_its_positions() {
    let dir = tempfile::tempdir().unwrap();
    let db = SqliteDatabase::open(&dir.path().join("m.db"), SqliteOptions::default()).unwrap();
    let store = SqliteStore::new(db, "hen");
    store.prepare(&[]).await.unwrap();

    let written = store
        .apply_log(
            "kafka:hens",
            vec![
                version("a", 1_000, false, json!({"name": "Greta"}), &["alice"]).into(),
                // a writer whose clock is behind: still the newest, 1 ms after
                version("a", 900, false, json!({"name": "Greta II"}), &["alice"]).into(),
                version("b", 1_200, false, json!({"id": "b", "name": "Berta"}), &[]).into(),
            ],
            vec![offset(0, 3)],
        )
        .await
        .unwrap();
    assert_eq!(
        written.iter().map(|e| e.created_at).collect::<Vec<_>>(),
        [1_000, 1_001, 1_200]
    );
    let a = store
        .read("a", &ReadContext::LATEST)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a.created_at, 1_001);
    assert_eq!(
        serde_json::from_str::<Value>(&a.payload).unwrap(),
        json!({"id": "a", "name": "Greta II"})
    );
    assert_eq!(a.authorized_tokens, ["alice"]);
    let then = store
        .read("a", &ReadContext::new(&TokenFilter::All, Some(1_000)))
        .await
        .unwrap()
        .unwrap();
    assert!(then.payload.contains("\"Greta\""), "{}", then.payload);

    // a tombstone from the log, and the next positions
    store
        .apply_log(
            "kafka:hens",
            vec![version("b", 1_100, true, json!({"name": "Berta"}), &[]).into()],
            vec![offset(0, 4)],
        )
        .await
        .unwrap();
    assert!(store
        .read("b", &ReadContext::LATEST)
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        store
            .versions("b")
            .await
            .unwrap()
            .iter()
            .map(|v| (v.created_at, v.deleted))
            .collect::<Vec<_>>(),
        [(1_200, false), (1_201, true)]
    );
    let state = store
        .output_state("kafka:hens", &["hens/0".to_owned()])
        .await
        .unwrap();
    assert_eq!(state["hens/0"], "4");

    // on the change feed in the log's order
    let feed = store.changes(Cursor::START, 10).await.unwrap();
    assert_eq!(
        feed.iter()
            .map(|c| (c.id.as_str(), c.created_at))
            .collect::<Vec<_>>(),
        [("a", 1_000), ("a", 1_001), ("b", 1_200), ("b", 1_201)]
    );

    // all or nothing: a payload that is not JSON leaves the versions and the position as they were
    let e = store
        .apply_log(
            "kafka:hens",
            vec![
                version("c", 2_000, false, json!({"name": "Clara"}), &[]).into(),
                Envelope {
                    payload: "not json".into(),
                    ..version("d", 2_000, false, json!({}), &[])
                }
                .into(),
            ],
            vec![offset(0, 6)],
        )
        .await;
    assert!(e.is_err());
    assert!(store
        .read("c", &ReadContext::LATEST)
        .await
        .unwrap()
        .is_none());
    let state = store
        .output_state("kafka:hens", &["hens/0".to_owned()])
        .await
        .unwrap();
    assert_eq!(state["hens/0"], "4");

    // a version whose writer asked for an older time goes into the past, as a back-dated
    // write does here; the newest stays the newest
    store
        .apply_log(
            "kafka:hens",
            vec![LogVersion {
                envelope: version("a", 500, false, json!({"name": "Greta 0"}), &["alice"]),
                requested: true,
                correlation_id: None,
            }],
            vec![offset(0, 7)],
        )
        .await
        .unwrap();
    let a = store
        .read("a", &ReadContext::LATEST)
        .await
        .unwrap()
        .unwrap();
    assert!(a.payload.contains("Greta II"), "{}", a.payload);
    let early = store
        .read("a", &ReadContext::new(&TokenFilter::All, Some(600)))
        .await
        .unwrap()
        .unwrap();
    assert!(early.payload.contains("Greta 0"), "{}", early.payload);
}
