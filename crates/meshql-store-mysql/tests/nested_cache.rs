//! The nested statements a store caches are bounded: more distinct selection shapes than
//! [`MysqlStore::NESTED_STATEMENTS`] keep the cache within it, and the statements open on
//! the connection within mysql_async's statement cache, and a shape evicted and asked again
//! still answers correctly. Against a real MariaDB, like `conformance.rs`.

use meshql_core::{
    BoundArgs, DynStore, Nested, NestedRow, NewDocument, QueryTemplate, ReadContext, Search, Store,
    TokenFilter, WriteContext,
};
use meshql_store_mysql::{MysqlDatabase, MysqlOptions, MysqlStore};
use serde_json::{json, Map, Value};
use std::sync::Arc;

fn mysql_url() -> String {
    meshql_conformance::test_server_url("mariadb", "MESHQL_TEST_MYSQL_URL")
}

fn payload(v: Value) -> Map<String, Value> {
    v.as_object().expect("object").clone()
}

/// Shape `i`: every document and, for each, the document its payload field `k{i}` names.
fn shape(store: &DynStore, by_id: &QueryTemplate, i: usize) -> Vec<Nested> {
    vec![Nested {
        key_field: format!("k{i}"),
        vector: false,
        store: store.clone(),
        template: by_id.clone(),
        fields: None,
        children: Vec::new(),
    }]
}

/// What shape `i` must answer: `f1` names `c1` in `k0` and `c2` in `k1`.
fn expected(i: usize) -> Vec<(String, Vec<String>)> {
    let child: &[&str] = match i {
        0 => &["c1"],
        1 => &["c2"],
        _ => &[],
    };
    vec![
        ("f1".into(), child.iter().map(|c| c.to_string()).collect()),
        ("c1".into(), Vec::new()),
        ("c2".into(), Vec::new()),
    ]
}

fn summary(rows: &[NestedRow]) -> Vec<(String, Vec<String>)> {
    rows.iter()
        .map(|r| {
            assert_eq!(r.children.len(), 1, "one relationship");
            (
                r.id.clone(),
                r.children[0].iter().map(|c| c.id.clone()).collect(),
            )
        })
        .collect()
}

/// Asks shape `i` and checks the answer.
async fn ask(store: &DynStore, all: &QueryTemplate, by_id: &QueryTemplate, i: usize) {
    let rows = store
        .find_nested(
            &Search::new(all, &BoundArgs::new(), None),
            &shape(store, by_id, i),
            &ReadContext::new(&TokenFilter::All, None),
        )
        .await
        .unwrap()
        .expect("MariaDB joins its own tables");
    assert_eq!(summary(&rows), expected(i), "shape {i}");
}

#[tokio::test]
async fn nested_statements_stay_bounded_and_evicted_shapes_answer_again() {
    // one connection, so that its session is the one the test reads; nested statements on
    let mut options = MysqlOptions::new(mysql_url());
    options.pool_size = 1;
    options.nested_sql = true;
    let db = MysqlDatabase::connect(&options).expect("pool");
    let table = format!("nested_cache_{}", uuid::Uuid::new_v4().simple());
    let concrete = Arc::new(MysqlStore::new(db, &table));
    let all = QueryTemplate::filter("{}").unwrap();
    let by_id = QueryTemplate::filter(r#"{"id": "{{id}}"}"#).unwrap();
    concrete
        .prepare(&[all.clone(), by_id.clone()])
        .await
        .expect("prepare a fresh table");
    let store: DynStore = concrete.clone();
    let w = WriteContext::SYSTEM;
    for (id, p) in [
        ("f1", json!({"name": "f1", "k0": "c1", "k1": "c2"})),
        ("c1", json!({"name": "c1"})),
        ("c2", json!({"name": "c2"})),
    ] {
        store
            .create(NewDocument::with_id(id, payload(p)), &w)
            .await
            .unwrap();
    }
    let ask = |i: usize| ask(&store, &all, &by_id, i);

    let capacity = MysqlStore::NESTED_STATEMENTS;
    ask(0).await;
    assert_eq!(concrete.nested_statements_cached(), 1);
    let shapes = capacity + 40;
    for i in 1..shapes {
        ask(i).await;
        assert!(concrete.nested_statements_cached() <= capacity, "shape {i}");
    }
    assert_eq!(concrete.nested_statements_cached(), capacity);
    // the connection prepared every shape, and closed the least recently used beyond its
    // statement cache, which they filled
    let open = concrete.statements_open_on_a_connection().await.unwrap();
    assert_eq!(open, MysqlStore::STATEMENTS_PER_CONNECTION as u64);

    // shapes 0 and 1 were the oldest: evicted, built again, and correct
    ask(0).await;
    ask(1).await;
    assert_eq!(concrete.nested_statements_cached(), capacity);
    // and again, from the cache
    ask(0).await;
    ask(1).await;
    ask(shapes - 1).await;
    assert_eq!(concrete.nested_statements_cached(), capacity);
}
