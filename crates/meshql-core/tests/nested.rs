//! Putting a nested statement's flat rows back into a tree, without a database.

use meshql_core::nested::{assemble, assemble_text, field_sets, relationship_parents, FlatRow};
use meshql_core::{DynStore, FieldSet, Nested, NestedRow, QueryTemplate};
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

fn fields(names: &[&str]) -> Option<FieldSet> {
    Some(names.iter().map(|n| n.to_string()).collect())
}

/// Each relationship's rows are parsed into its reader's fields, when those hold the key
/// fields of the relationships below it (else whole); the search's into the root's.
#[test]
fn text_rows_are_parsed_into_the_fields_their_reader_reads() {
    let mut tree = tree();
    tree[0].fields = fields(&["name"]); // coops: no `farm`, the key of (3) below them
    tree[0].children[0].fields = fields(&["name"]); // hens
    tree[0].children[1].fields = fields(&["name"]); // a coop's farm
    tree[1].fields = None; // tags: everything
    let root = fields(&["name", "code"]);
    let per = field_sets(root.as_ref(), &tree);
    let names = |p: &Option<FieldSet>| p.as_ref().map(|f| f.to_vec());
    assert_eq!(
        per.iter().map(names).collect::<Vec<_>>(),
        [
            Some(vec!["name".to_owned(), "code".to_owned()]),
            None,
            Some(vec!["name".to_owned()]),
            Some(vec!["name".to_owned()]),
            None,
        ]
    );
    let rows = vec![
        (
            0,
            None,
            "f1".to_owned(),
            r#"{"name":"one","code":7,"owner":"x"}"#,
            1,
        ),
        (
            1,
            Some("f1".to_owned()),
            "c1".to_owned(),
            r#"{"name":"c","farm":"f1","size":3}"#,
            2,
        ),
        (
            2,
            Some("c1".to_owned()),
            "h1".to_owned(),
            r#"{"name":"h","coop":"c1"}"#,
            3,
        ),
        (
            3,
            Some("f1".to_owned()),
            "f1".to_owned(),
            r#"{"name":"one","code":7}"#,
            1,
        ),
        (
            4,
            Some("7".to_owned()),
            "t1".to_owned(),
            r#"{"label":"t"}"#,
            4,
        ),
    ];
    let got = assemble_text(&tree, root.as_ref(), rows).unwrap();
    let f1 = &got[0];
    assert_eq!(
        Value::Object(f1.payload.clone()),
        json!({"name": "one", "code": 7})
    );
    let c1 = &f1.children[0][0];
    assert_eq!(
        c1.payload["size"], 3,
        "parsed whole: its fields leave out a key below"
    );
    assert_eq!(ids(&c1.children[1]), ["f1"]);
    assert_eq!(
        Value::Object(c1.children[0][0].payload.clone()),
        json!({"name": "h"})
    );
    assert_eq!(f1.children[1][0].payload["label"], "t");

    let bad = vec![(0, None, "f9".to_owned(), r#"{"name": tru}"#, 1)];
    let e = assemble_text(&tree, root.as_ref(), bad)
        .unwrap_err()
        .to_string();
    assert!(e.contains("f9"), "{e}");
}
