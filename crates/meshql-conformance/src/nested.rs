//! Nested searches ([`meshql_core::Store::find_nested`]) against level-by-level lookups.

use crate::harness::{all, args, by_id, by_name, by_parent, create_at, payload, ALL, W};
use meshql_core::{
    BoundArgs, DynStore, Millis, Nested, NestedRow, NewDocument, QueryTemplate, TokenFilter,
};
use serde_json::{json, Value};

/// What [`Store::find_nested`](meshql_core::Store::find_nested) must return: `find`, then
/// one `find_batch` per relationship and level.
pub(crate) async fn level_by_level(
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
