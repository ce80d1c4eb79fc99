//! A projection rebuild's swap on a real PostgreSQL leaves the entity's table as `prepare`
//! makes it: its indexes, constraints and `_id` sequence under the live table's names
//! (which `prepare` at the next start looks for), nothing named after the rebuild table,
//! and the rebuild table's name free for the next rebuild.

use meshql_core::{DynStore, OutputBatch, OutputWrite, WriteContext};
use meshql_store_postgres::{PostgresDatabase, PostgresOptions, PostgresStore};
use std::sync::Arc;

fn postgres_url() -> String {
    meshql_conformance::test_server_url("postgres", "MESHQL_TEST_POSTGRES_URL")
}

/// Every relation whose name starts with `prefix`: indexes, sequences, tables.
async fn relations(client: &tokio_postgres::Client, prefix: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = client
        .query(
            "SELECT relname::text, relkind::text FROM pg_class \
             WHERE starts_with(relname::text, $1)",
            &[&prefix],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn a_swapped_in_table_has_the_live_tables_names() {
    let url = postgres_url();
    let db = PostgresDatabase::connect(&PostgresOptions::new(url.clone())).expect("pool");
    let table = format!("rebuild_{}", uuid::Uuid::new_v4().simple());
    let store: DynStore = Arc::new(PostgresStore::new(db, &table));
    let templates = meshql_conformance::templates();
    store.prepare(&templates).await.unwrap();
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let fresh = relations(&client, &table).await;
    assert!(fresh.len() > 5, "{fresh:?}");

    for round in 0..2u64 {
        let shadow = store.rebuild_store().await.unwrap();
        let batch = OutputBatch {
            writes: vec![OutputWrite::Put {
                id: "a".into(),
                payload: format!(r#"{{"name": "round-{round}"}}"#),
            }],
            ..OutputBatch::new("c#rebuild", round + 1)
        };
        shadow
            .apply_output(batch, &WriteContext::SYSTEM)
            .await
            .unwrap();
        store.swap_rebuilt("c#rebuild", "c").await.unwrap();
        assert_eq!(
            relations(&client, &table).await,
            fresh,
            "round {round}: the same relations under the same names"
        );
        store.prepare(&templates).await.unwrap();
        assert_eq!(
            relations(&client, &table).await,
            fresh,
            "round {round}: prepare finds every index (it creates none again)"
        );
    }
    let default: String = client
        .query_one(
            "SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d \
             JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum \
             WHERE d.adrelid = $1::text::regclass AND a.attname = 'tx'",
            &[&table],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        default, "pg_current_xact_id()",
        "new versions get their transaction's id again"
    );
}
