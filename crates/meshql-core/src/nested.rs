//! Putting the flat rows of a nested statement back into a tree.
//!
//! A SQL backend answers [`crate::Store::find_nested`] with one statement whose rows are
//! `(relationship, key, id, payload, order)`: relationship 0 is the search itself, the
//! others are the [`Nested`] relationships numbered depth first from 1 (see
//! [`relationship_parents`]); `key` is the parent key a relationship row was found for.
//! [`assemble`] sorts each relationship's rows into creation order, indexes them by key and
//! walks the tree from the search's rows, giving every row, per relationship below it, the
//! rows whose key is its key field: all of them for a vector, the first for a singleton.
//! A row reachable from several parents appears under each; its payload is moved into its
//! last appearance and cloned into the others.

use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use serde_json::{Map, Value};

use crate::{FieldSet, Nested, NestedRow, QueryTemplate};

/// A relationship of a nested statement: the rows of `table` matching `template` with its
/// `id` argument bound to the parent's `key_field`.
pub struct Level<'a> {
    pub table: String,
    pub key_field: &'a str,
    pub template: &'a QueryTemplate,
    pub vector: bool,
    pub children: Vec<Level<'a>>,
}

/// `nested` as levels of one statement, if every relationship's store is a table of the
/// database `database` of `backend` ([`crate::Relation`]); `None` when one is not.
pub fn join_levels<'a>(
    nested: &'a [Nested],
    backend: &str,
    database: usize,
) -> Option<Vec<Level<'a>>> {
    nested
        .iter()
        .map(|n| {
            let r = n.store.relation()?;
            if r.backend != backend || r.database != database {
                return None;
            }
            Some(Level {
                table: r.table,
                key_field: &n.key_field,
                template: &n.template,
                vector: n.vector,
                children: join_levels(&n.children, backend, database)?,
            })
        })
        .collect()
}

/// Identifies a nested statement, for caching its text: `root` (the search's template id
/// and whatever else shapes the statement) and every level's table, key, template and
/// cardinality.
pub fn signature(root: impl Hash, levels: &[Level<'_>]) -> u64 {
    fn walk(levels: &[Level<'_>], h: &mut std::collections::hash_map::DefaultHasher) {
        levels.len().hash(h);
        for l in levels {
            (&l.table, l.key_field, l.template.id, l.vector).hash(h);
            walk(&l.children, h);
        }
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    root.hash(&mut h);
    walk(levels, &mut h);
    h.finish()
}

/// A row of a nested statement.
#[derive(Debug, Clone)]
pub struct FlatRow {
    /// 0: the search; from 1: the relationships, depth first.
    pub relationship: usize,
    /// The parent key the row was found for (`None` for the search's rows).
    pub key: Option<String>,
    pub id: String,
    pub payload: Map<String, Value>,
    /// Creation order within the relationship (a row's first version's number).
    pub order: i64,
}

/// For every relationship below a search (numbered depth first from 1), the number of its
/// parent (0: the search itself).
pub fn relationship_parents(nested: &[Nested]) -> Vec<usize> {
    fn walk(levels: &[Nested], parent: usize, out: &mut Vec<usize>) {
        for level in levels {
            out.push(parent);
            let me = out.len();
            walk(&level.children, me, out);
        }
    }
    let mut out = Vec::new();
    walk(nested, 0, &mut out);
    out
}

/// The key a field's value offers a relationship: strings as they are, numbers and
/// booleans as text, anything else none. Level-by-level resolution and nested statements
/// (in Rust here, in SQL by the backends) follow this one rule.
pub fn key_text(value: &Value) -> Option<Cow<'_, str>> {
    match value {
        Value::String(s) => Some(Cow::Borrowed(s)),
        Value::Number(n) => Some(Cow::Owned(n.to_string())),
        Value::Bool(b) => Some(Cow::Owned(b.to_string())),
        _ => None,
    }
}

/// The key row `(id, payload)` offers through `key_field` (`id`: the envelope id).
fn row_key<'r>(
    id: &'r str,
    payload: &'r Map<String, Value>,
    key_field: &str,
) -> Option<Cow<'r, str>> {
    if key_field == "id" {
        return Some(Cow::Borrowed(id));
    }
    payload.get(key_field).and_then(key_text)
}

/// The payload fields to parse of rows that have the relationships `below`: `fields` (the
/// reader's, [`crate::Search::fields`] or [`Nested::fields`]) when they hold the key field of
/// every one of them, without which the rows below could not be found; else `None` (every
/// field).
pub fn keeping_keys(fields: Option<&FieldSet>, below: &[Nested]) -> Option<FieldSet> {
    fields
        .filter(|f| {
            below
                .iter()
                .all(|n| n.key_field == "id" || f.contains(&n.key_field))
        })
        .cloned()
}

/// The payload fields to parse per relationship of a nested statement (0: the search, whose
/// reader reads `root`; then `nested` depth first), by [`keeping_keys`].
pub fn field_sets(root: Option<&FieldSet>, nested: &[Nested]) -> Vec<Option<FieldSet>> {
    fn walk(levels: &[Nested], out: &mut Vec<Option<FieldSet>>) {
        for level in levels {
            out.push(keeping_keys(level.fields.as_ref(), &level.children));
            walk(&level.children, out);
        }
    }
    let mut out = vec![keeping_keys(root, nested)];
    walk(nested, &mut out);
    out
}

/// [`assemble`] for rows whose payloads are JSON text, as SQL drivers return them:
/// `(relationship, key, id, payload, order)`; each payload is parsed into the fields its
/// relationship's reader reads (`root`: the search's, [`field_sets`]).
pub fn assemble_text<P: AsRef<str>>(
    nested: &[Nested],
    root: Option<&FieldSet>,
    rows: impl IntoIterator<Item = (usize, Option<String>, String, P, i64)>,
) -> Result<Vec<NestedRow>, crate::StoreError> {
    let corrupt = crate::StoreError::Corrupt;
    let fields = field_sets(root, nested);
    let flat = rows
        .into_iter()
        .map(|(relationship, key, id, payload, order)| {
            let only = fields.get(relationship).and_then(|f| f.as_deref());
            Ok(FlatRow {
                relationship,
                key,
                payload: crate::parse_payload(payload.as_ref(), only)
                    .map_err(|e| corrupt(format!("payload of `{id}`: {e}")))?,
                id,
                order,
            })
        })
        .collect::<Result<Vec<_>, crate::StoreError>>()?;
    assemble(nested, flat).map_err(corrupt)
}

/// The tree of `rows`, the rows of a nested statement for the relationships `nested`.
/// Fails on a row numbered past the relationships (a statement out of step with them).
pub fn assemble(nested: &[Nested], mut rows: Vec<FlatRow>) -> Result<Vec<NestedRow>, String> {
    let parents = relationship_parents(nested);
    let count = parents.len() + 1;
    if let Some(bad) = rows.iter().find(|r| r.relationship >= count) {
        return Err(format!(
            "nested statement: relationship {} of {}",
            bad.relationship,
            count - 1
        ));
    }
    // stable, and cheap when the statement already ordered them
    rows.sort_by_key(|r| (r.relationship, r.order));
    let mut tree = Tree {
        rows: (0..count).map(|_| Vec::new()).collect(),
        by_key: (0..count).map(|_| HashMap::new()).collect(),
        below: vec![Vec::new(); count],
        levels: Vec::with_capacity(count - 1),
    };
    for (i, &p) in parents.iter().enumerate() {
        tree.below[p].push(i + 1);
    }
    fn flatten<'a>(levels: &'a [Nested], out: &mut Vec<(&'a str, bool)>) {
        for l in levels {
            out.push((l.key_field.as_str(), l.vector));
            flatten(&l.children, out);
        }
    }
    flatten(nested, &mut tree.levels);
    for row in rows {
        let r = row.relationship;
        let list = &mut tree.rows[r];
        if let Some(k) = row.key {
            tree.by_key[r].entry(k).or_default().push(list.len());
        }
        list.push((row.id, row.payload));
    }
    Ok(tree.into_rows())
}

/// `rows[r]`: relationship `r`'s rows (0: the search) in creation order.
struct Tree<'a> {
    rows: Vec<Vec<(String, Map<String, Value>)>>,
    /// Per relationship: its rows by key, in order.
    by_key: Vec<HashMap<String, Vec<usize>>>,
    /// Per relationship (0: the search): the relationships below it.
    below: Vec<Vec<usize>>,
    /// Per relationship (from 1): key field and cardinality.
    levels: Vec<(&'a str, bool)>,
}

impl Tree<'_> {
    /// The rows below row `i` of relationship `r`: per relationship below, its row numbers.
    fn below_row(&self, r: usize, i: usize) -> Vec<(usize, Vec<usize>)> {
        let (id, payload) = &self.rows[r][i];
        self.below[r]
            .iter()
            .map(|&c| {
                let (key_field, vector) = self.levels[c - 1];
                let found =
                    row_key(id, payload, key_field).and_then(|k| self.by_key[c].get(k.as_ref()));
                let rows = match found {
                    Some(rows) if vector => rows.clone(),
                    Some(rows) => rows.iter().take(1).copied().collect(),
                    None => Vec::new(),
                };
                (c, rows)
            })
            .collect()
    }

    /// Counts how often each row appears in the tree under row `i` of relationship `r`.
    fn count(&self, r: usize, i: usize, uses: &mut [Vec<u32>]) {
        uses[r][i] += 1;
        for (c, rows) in self.below_row(r, i) {
            for j in rows {
                self.count(c, j, uses);
            }
        }
    }

    fn into_rows(mut self) -> Vec<NestedRow> {
        let mut uses: Vec<Vec<u32>> = self.rows.iter().map(|r| vec![0; r.len()]).collect();
        for i in 0..self.rows[0].len() {
            self.count(0, i, &mut uses);
        }
        (0..self.rows[0].len())
            .map(|i| self.node(0, i, &mut uses))
            .collect()
    }

    fn node(&mut self, r: usize, i: usize, uses: &mut [Vec<u32>]) -> NestedRow {
        let children = self
            .below_row(r, i)
            .into_iter()
            .map(|(c, rows)| rows.into_iter().map(|j| self.node(c, j, uses)).collect())
            .collect();
        uses[r][i] -= 1;
        let row = &mut self.rows[r][i];
        let (id, payload) = if uses[r][i] == 0 {
            (std::mem::take(&mut row.0), std::mem::take(&mut row.1))
        } else {
            row.clone()
        };
        NestedRow {
            id,
            payload,
            children,
        }
    }
}

/// Whether a search or any relationship below it sorts (a `sort` on its template): one
/// nested statement returns rows in creation order, so such a tree is read level by level.
pub fn sorted(template: &QueryTemplate, nested: &[crate::Nested]) -> bool {
    fn any(ns: &[crate::Nested]) -> bool {
        ns.iter()
            .any(|n| !n.template.sort().is_empty() || any(&n.children))
    }
    !template.sort().is_empty() || any(nested)
}
