//! Putting a nested statement's flat rows back into a tree, without a database.

use meshql_core::nested::{assemble, relationship_parents, FlatRow};
use meshql_core::{DynStore, Nested, NestedRow, QueryTemplate};
use meshql_store_memory::MemoryStore;
use serde_json::{json, Value};
use std::sync::Arc;

fn level(key_field: &str, vector: bool, children: Vec<Nested>) -> Nested {
    let store: DynStore = Arc::new(MemoryStore::new());
    Nested {
        key_field: key_field.to_owned(),
        vector,
        store,
        template: QueryTemplate::filter(r#"{"payload.parent": "{{id}}"}"#).unwrap(),
        fields: None,
        children,
    }
}

fn row(relationship: usize, key: Option<&str>, id: &str, payload: Value, order: i64) -> FlatRow {
    FlatRow {
        relationship,
        key: key.map(str::to_owned),
        id: id.to_owned(),
        payload: payload.as_object().cloned().unwrap_or_default(),
        order,
    }
}

fn ids(rows: &[NestedRow]) -> Vec<&str> {
    rows.iter().map(|r| r.id.as_str()).collect()
}

/// farms → (1) coops by farm id → (2) hens by coop id, (3) the coop's farm by its `farm`
/// field (a singleton, shared by every coop of a farm); farms → (4) tags by a number.
fn tree() -> Vec<Nested> {
    vec![
        level(
            "id",
            true,
            vec![level("id", true, vec![]), level("farm", false, vec![])],
        ),
        level("code", true, vec![]),
    ]
}

#[test]
fn relationships_are_numbered_depth_first() {
    assert_eq!(relationship_parents(&tree()), [0, 1, 1, 0]);
}

#[test]
fn rows_find_their_parents_by_key_in_creation_order() {
    let rows = vec![
        // deliberately out of order: the statement need not sort
        row(1, Some("f1"), "c2", json!({"farm": "f1"}), 20),
        row(0, None, "f2", json!({"name": "two"}), 2),
        row(2, Some("c1"), "h1", json!({}), 30),
        row(1, Some("f1"), "c1", json!({"farm": "f1"}), 10),
        row(3, Some("f1"), "f1", json!({"name": "one", "code": 7}), 1),
        row(4, Some("7"), "t1", json!({}), 40),
        row(0, None, "f1", json!({"name": "one", "code": 7}), 1),
        row(3, Some("f1"), "f1-later", json!({}), 5),
    ];
    let got = assemble(&tree(), rows).unwrap();
    assert_eq!(ids(&got), ["f1", "f2"]);
    let f1 = &got[0];
    assert_eq!(f1.payload["name"], "one");
    assert_eq!(ids(&f1.children[0]), ["c1", "c2"]);
    let (c1, c2) = (&f1.children[0][0], &f1.children[0][1]);
    assert_eq!(ids(&c1.children[0]), ["h1"]);
    assert!(c2.children[0].is_empty(), "no hens: an empty vector");
    // a singleton takes the first in creation order, and a row shared by several parents
    // appears under each with its whole payload
    assert_eq!(ids(&c1.children[1]), ["f1"]);
    assert_eq!(c1.children[1], c2.children[1]);
    assert_eq!(c2.children[1][0].payload["code"], 7);
    // a number key matches its text
    assert_eq!(ids(&f1.children[1]), ["t1"]);
    assert_eq!(got[1].children, vec![Vec::<NestedRow>::new(); 2]);
}

#[test]
fn keys_that_are_not_scalars_and_rows_out_of_step() {
    // a parent whose key field holds an object offers no key
    let rows = vec![
        row(0, None, "f1", json!({"code": {"nested": 1}}), 1),
        row(4, Some("{\"nested\":1}"), "t1", json!({}), 2),
    ];
    let got = assemble(&tree(), rows).unwrap();
    assert!(got[0].children[1].is_empty());
    let e = assemble(&tree(), vec![row(5, None, "x", json!({}), 1)]).unwrap_err();
    assert!(e.contains("relationship 5"), "{e}");
    assert_eq!(assemble(&tree(), Vec::new()).unwrap(), Vec::new());
}
