//! A search and the relationships below it, read in one read transaction
//! ([`meshql_core::StoreReader::find_nested`] on SQLite).
//!
//! Level by level, every relationship is one batched statement, and every statement on its
//! own is a read transaction: it takes a WAL read lock and releases it, which goes through a
//! mutex shared by every connection to the file (and an `fcntl` whenever the process's
//! first reader arrives or its last leaves). Under a depth-3 load those lock operations cost
//! more than the three lookups themselves (docs/BENCHMARKS.md). Here the same statements
//! run on one connection inside one `BEGIN … COMMIT`: one read lock and one snapshot per
//! request.
//!
//! The statements are exactly those of [`StoreReader::find`] for the search and of
//! [`StoreReader::find_batch`] for each relationship, so results, `at` reads, token filters
//! and sorts are the same as level by level. The keys of a level come from its parents'
//! payloads, parsed once for the result (the rule of [`meshql_core::nested::key_text`]);
//! rows keep their statement's order (creation order, or the template's sort), and a row
//! that several parents share is cloned for all but its last appearance. Payloads are parsed
//! into the fields the caller reads ([`Search::fields`], [`Nested::fields`]) plus the key
//! fields of the levels below ([`meshql_core::field_set`]).
//!
//! [`StoreReader::find`]: meshql_core::StoreReader::find
//! [`StoreReader::find_batch`]: meshql_core::StoreReader::find_batch

use super::{is_scan, query_error, tokens_json, SqliteStore};
use crate::dialect::DIALECT;
use crate::sql::{Compiled, Shape};
use meshql_core::nested::{join_levels, keeping_keys, key_text, Level};
use meshql_core::{
    parse_payload, BoundArgs, FieldSet, Millis, Nested, NestedRow, ReadContext, Search, StoreError,
};
use meshql_store_sql::dialect::Dialect;
use rusqlite::Connection;
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A fetched document: id and parsed payload.
type Doc = (String, Map<String, Value>);

/// What every statement of one tree binds besides its own arguments.
struct Bounds {
    at: Option<Millis>,
    tokens: Option<String>,
}

/// A relationship's batched lookup and the relationships below it, compiled (owned, so
/// that a scan can take the tree to the blocking pool).
struct LevelPlan {
    sql: Arc<(String, Compiled)>,
    key_field: String,
    vector: bool,
    /// The payload fields parsed of this level's rows (`None`: all).
    fields: Option<FieldSet>,
    children: Vec<LevelPlan>,
}

/// Ends a read transaction when dropped, whatever happened inside it.
struct ReadTransaction<'c>(&'c Connection);

impl<'c> ReadTransaction<'c> {
    fn begin(conn: &'c Connection) -> Result<Self, StoreError> {
        conn.prepare_cached("BEGIN")
            .and_then(|mut s| s.execute([]))
            .map_err(query_error)?;
        Ok(Self(conn))
    }
}

impl Drop for ReadTransaction<'_> {
    fn drop(&mut self) {
        // a read-only transaction commits without writing; should that fail, roll back (the
        // pool closes a connection left inside a transaction in any case)
        if self
            .0
            .prepare_cached("COMMIT")
            .and_then(|mut s| s.execute([]))
            .is_err()
        {
            let _ = self.0.execute_batch("ROLLBACK");
        }
    }
}

/// Column `i` as text, borrowed from the row (no copy before parsing).
fn text<'r>(row: &'r rusqlite::Row<'_>, i: usize) -> Result<&'r str, StoreError> {
    row.get_ref(i)
        .map_err(query_error)?
        .as_str()
        .map_err(|e| StoreError::Corrupt(format!("payload: {e}")))
}

fn parse(
    id: &str,
    payload: &str,
    fields: Option<&[String]>,
) -> Result<Map<String, Value>, StoreError> {
    parse_payload(payload, fields)
        .map_err(|e| StoreError::Corrupt(format!("payload of `{id}`: {e}")))
}

/// The key `(id, payload)` offers a relationship through `key_field` (`id`: the envelope id).
fn key_of<'d>(doc: &'d Doc, key_field: &str) -> Option<Cow<'d, str>> {
    if key_field == "id" {
        return Some(Cow::Borrowed(&doc.0));
    }
    doc.1.get(key_field).and_then(key_text)
}

impl SqliteStore {
    /// [`meshql_core::StoreReader::find_nested`]: `None` when a relationship is in another
    /// file or backend. A search of the whole table runs, with its relationships, on the
    /// blocking pool as a scan.
    pub(super) async fn find_nested_in_one_transaction(
        &self,
        search: &Search<'_>,
        nested: &[Nested],
        ctx: &ReadContext<'_>,
    ) -> Result<Option<Vec<NestedRow>>, StoreError> {
        let Search {
            template,
            args,
            limit,
            fields,
        } = *search;
        if !self.db.nested_reads() || nested.is_empty() {
            return Ok(None);
        }
        let Some(levels) = join_levels(nested, DIALECT.backend(), self.database_id()) else {
            return Ok(None);
        };
        template
            .check_args(args)
            .map_err(|e| StoreError::Invalid(e.to_string()))?;
        let bounds = Bounds {
            at: ctx.at,
            tokens: tokens_json(ctx.filter),
        };
        let shape = Shape {
            at: bounds.at.is_some(),
            tokens: bounds.tokens.is_some(),
            limit: false,
            batch: false,
        };
        let root = self.core.compiled(template, shape);
        let params = Self::bind(&root, args, bounds.at, &bounds.tokens, None);
        let plans = self.plans(
            &levels,
            nested,
            Shape {
                batch: true,
                ..shape
            },
        );
        let root_fields = keeping_keys(fields, nested);
        let reads = self.core.reads.clone();
        let run = move |conn: &Connection| {
            let root = Root {
                compiled: &root,
                params: &params,
                limit,
                fields: root_fields.as_deref(),
            };
            read_tree(conn, root, &plans, &bounds, &reads)
        };
        if is_scan(template, limit) {
            // counted per statement by `read_tree`, not as one scan
            self.db.scan(run).await.map(Some)
        } else {
            self.db.read(run).map(Some)
        }
    }

    /// The compiled lookups of `levels` (the relationships `nested`, joined), depth first.
    fn plans(&self, levels: &[Level<'_>], nested: &[Nested], shape: Shape) -> Vec<LevelPlan> {
        levels
            .iter()
            .zip(nested)
            .map(|(level, n)| LevelPlan {
                sql: self.level_sql(level, shape),
                key_field: level.key_field.to_owned(),
                vector: level.vector,
                fields: keeping_keys(n.fields.as_ref(), &n.children),
                children: self.plans(&level.children, &n.children, shape),
            })
            .collect()
    }

    /// The statement of a relationship's batched lookup (as its own store compiles it).
    fn level_sql(&self, level: &Level<'_>, shape: Shape) -> Arc<(String, Compiled)> {
        let make = || {
            (
                level.table.clone(),
                crate::dialect::search(&level.table, level.template, shape),
            )
        };
        let found = self
            .level_compiled
            .get_or_insert_with((level.template.id, shape), make);
        if found.0 == level.table {
            found
        } else {
            // one template serving two tables: never cached under the same key
            Arc::new(make())
        }
    }
}

/// The search of a tree: its statement, bound, how many rows at most, and the payload fields
/// parsed (`None`: all).
struct Root<'r> {
    compiled: &'r Compiled,
    params: &'r [rusqlite::types::Value],
    limit: Option<usize>,
    fields: Option<&'r [String]>,
}

/// The search's rows (at most `limit`) and, below them, the rows of `levels`, in one read
/// transaction.
fn read_tree(
    conn: &Connection,
    root: Root<'_>,
    levels: &[LevelPlan],
    bounds: &Bounds,
    reads: &AtomicU64,
) -> Result<Vec<NestedRow>, StoreError> {
    let _tx = ReadTransaction::begin(conn)?;
    reads.fetch_add(1, Ordering::Relaxed);
    let mut docs = Vec::new();
    {
        let mut stmt = conn
            .prepare_cached(&root.compiled.sql)
            .map_err(query_error)?;
        let mut rows = stmt
            .query(rusqlite::params_from_iter(root.params.iter()))
            .map_err(query_error)?;
        while docs.len() < root.limit.unwrap_or(usize::MAX) {
            let Some(row) = rows.next().map_err(query_error)? else {
                break;
            };
            let id: String = row.get(0).map_err(query_error)?;
            let payload = parse(&id, text(row, 1)?, root.fields)?;
            docs.push((id, payload));
        }
    }
    let below = below(conn, levels, &docs, bounds, reads)?;
    Ok(docs
        .into_iter()
        .zip(below)
        .map(|((id, payload), children)| NestedRow {
            id,
            payload,
            children,
        })
        .collect())
}

/// The rows of `levels` below `parents`: for every parent, per level in order, its related
/// rows (all of them for a vector, the first for a singleton) with theirs.
fn below(
    conn: &Connection,
    levels: &[LevelPlan],
    parents: &[Doc],
    bounds: &Bounds,
    reads: &AtomicU64,
) -> Result<Vec<Vec<Vec<NestedRow>>>, StoreError> {
    let mut out: Vec<Vec<Vec<NestedRow>>> = parents
        .iter()
        .map(|_| Vec::with_capacity(levels.len()))
        .collect();
    for level in levels {
        let keys: Vec<Option<Cow<'_, str>>> = parents
            .iter()
            .map(|p| key_of(p, &level.key_field))
            .collect();
        let mut distinct: Vec<&str> = Vec::new();
        let mut seen = HashSet::new();
        for k in keys.iter().flatten() {
            if seen.insert(k.as_ref()) {
                distinct.push(k.as_ref());
            }
        }
        if distinct.is_empty() {
            out.iter_mut().for_each(|o| o.push(Vec::new()));
            continue;
        }
        let compiled = &level.sql.1;
        let keys_json = serde_json::to_string(&distinct).expect("strings serialise");
        let params = SqliteStore::bind(
            compiled,
            &BoundArgs::new(),
            bounds.at,
            &bounds.tokens,
            Some(&keys_json),
        );
        reads.fetch_add(1, Ordering::Relaxed);
        let mut found_keys: Vec<String> = Vec::new();
        let mut docs: Vec<Doc> = Vec::new();
        {
            let mut stmt = conn.prepare_cached(&compiled.sql).map_err(query_error)?;
            let mut rows = stmt
                .query(rusqlite::params_from_iter(params.iter()))
                .map_err(query_error)?;
            while let Some(row) = rows.next().map_err(query_error)? {
                found_keys.push(row.get(0).map_err(query_error)?);
                let id: String = row.get(1).map_err(query_error)?;
                let payload = parse(&id, text(row, 2)?, level.fields.as_deref())?;
                docs.push((id, payload));
            }
        }
        let mut grand = if level.children.is_empty() {
            docs.iter().map(|_| Vec::new()).collect()
        } else {
            below(conn, &level.children, &docs, bounds, reads)?
        };
        let mut by_key: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, k) in found_keys.iter().enumerate() {
            by_key.entry(k.as_str()).or_default().push(i);
        }
        let picks: Vec<&[usize]> = keys
            .iter()
            .map(|k| {
                let rows = k
                    .as_deref()
                    .and_then(|k| by_key.get(k))
                    .map_or(&[][..], Vec::as_slice);
                if level.vector {
                    rows
                } else {
                    &rows[..rows.len().min(1)]
                }
            })
            .collect();
        let mut uses = vec![0u32; docs.len()];
        for &i in picks.iter().flat_map(|p| p.iter()) {
            uses[i] += 1;
        }
        let mut nodes: Vec<Option<NestedRow>> = docs
            .into_iter()
            .zip(grand.iter_mut())
            .map(|((id, payload), children)| {
                Some(NestedRow {
                    id,
                    payload,
                    children: std::mem::take(children),
                })
            })
            .collect();
        for (parent, pick) in out.iter_mut().zip(picks) {
            let rows = pick
                .iter()
                .map(|&i| {
                    uses[i] -= 1;
                    let node = if uses[i] == 0 {
                        nodes[i].take()
                    } else {
                        nodes[i].clone()
                    };
                    node.expect("a row is moved out only at its last use")
                })
                .collect();
            parent.push(rows);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SqliteDatabase, SqliteOptions};
    use meshql_core::{
        DynReader, NewDocument, QueryTemplate, Store, StoreReader, StoreWriter, TokenFilter,
        WriteContext,
    };

    fn doc(fields: serde_json::Value) -> NewDocument {
        NewDocument::new(fields.as_object().unwrap().clone())
    }

    /// Coop and hen stores of `db`, with the templates of a coop by id and of hens by coop,
    /// prepared.
    async fn coops_and_hens(
        db: &Arc<SqliteDatabase>,
    ) -> (
        Arc<SqliteStore>,
        Arc<SqliteStore>,
        QueryTemplate,
        QueryTemplate,
    ) {
        let coops = Arc::new(SqliteStore::new(db.clone(), "coop"));
        let hens = Arc::new(SqliteStore::new(db.clone(), "hen"));
        let by_id = QueryTemplate::filter(r#"{"id": "{{id}}"}"#).unwrap();
        let by_coop = QueryTemplate::filter(r#"{"payload.coop_id": "{{id}}"}"#).unwrap();
        coops.prepare(std::slice::from_ref(&by_id)).await.unwrap();
        hens.prepare(std::slice::from_ref(&by_coop)).await.unwrap();
        (coops, hens, by_id, by_coop)
    }

    /// A relationship whose rows cannot be read fails the tree with the row named, and the
    /// read transaction ends with it: the connection goes back to the pool outside any
    /// transaction, so the next reads see later writes.
    #[tokio::test]
    async fn a_failed_tree_read_leaves_no_transaction_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let options = SqliteOptions {
            idle_readers: 1,
            ..SqliteOptions::default()
        };
        let db = SqliteDatabase::open(&path, options).unwrap();
        let (coops, hens, by_id, by_coop) = coops_and_hens(&db).await;
        let w = WriteContext::SYSTEM;
        let coop = coops
            .create(doc(serde_json::json!({"name": "c"})), &w)
            .await
            .unwrap()
            .id;
        let hen = hens
            .create(doc(serde_json::json!({"name": "h1", "coop_id": coop})), &w)
            .await
            .unwrap()
            .id;
        let nested = vec![Nested {
            key_field: "id".into(),
            vector: true,
            store: hens.clone() as DynReader,
            template: by_coop,
            fields: None,
            children: Vec::new(),
        }];
        let mut args = BoundArgs::new();
        args.insert("id".into(), coop.as_str().into());
        let ctx = ReadContext::new(&TokenFilter::All, None);
        let tree = || async {
            coops
                .find_nested(&Search::new(&by_id, &args, None), &nested, &ctx)
                .await
        };
        let ok = tree().await.unwrap().expect("one file: read as one tree");
        assert_eq!(ok[0].children[0][0].id, hen);

        // the hen's payload is damaged behind the store's back
        let raw = Connection::open(&path).unwrap();
        // valid JSON to SQLite (its index still finds the row), not to the reader: a
        // number out of range
        raw.execute(
            "UPDATE hen SET payload = '{\"coop_id\": \"' || ?1 || '\", \"n\": 1e400}' WHERE id = ?2",
            [&coop, &hen],
        )
        .unwrap();
        let Err(StoreError::Corrupt(e)) = tree().await else {
            panic!("a damaged payload was read");
        };
        assert!(e.contains(&hen), "{e}");
        raw.execute(
            "UPDATE hen SET payload = json_object('name', 'h1', 'coop_id', ?1, 'id', ?2) WHERE id = ?2",
            [&coop, &hen],
        )
        .unwrap();
        hens.create(doc(serde_json::json!({"name": "h2", "coop_id": coop})), &w)
            .await
            .unwrap();
        let again = tree().await.unwrap().unwrap();
        let names: Vec<&str> = again[0].children[0]
            .iter()
            .map(|h| h.payload["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["h1", "h2"], "the read after the failure is current");
        assert_eq!(db.open_readers(), 1);
    }

    /// Payloads hold the fields the caller reads; a level whose fields leave out a key field
    /// of the level below is parsed whole, so the rows below are still found.
    #[tokio::test]
    async fn payloads_hold_the_fields_read() {
        let dir = tempfile::tempdir().unwrap();
        let db = SqliteDatabase::open(&dir.path().join("t.db"), SqliteOptions::default()).unwrap();
        let (coops, hens, by_id, by_coop) = coops_and_hens(&db).await;
        let w = WriteContext::SYSTEM;
        let coop = coops
            .create(doc(serde_json::json!({"name": "c", "capacity": 50})), &w)
            .await
            .unwrap()
            .id;
        for name in ["h1", "h2"] {
            let hen = serde_json::json!({"name": name, "coop_id": coop, "breed": "leghorn"});
            hens.create(doc(hen), &w).await.unwrap();
        }
        let fields = |names: &[&str]| -> Option<FieldSet> {
            Some(names.iter().map(|n| n.to_string()).collect())
        };
        let level = |store: &Arc<SqliteStore>, key: &str, template: &QueryTemplate| Nested {
            key_field: key.into(),
            vector: true,
            store: store.clone() as DynReader,
            template: template.clone(),
            fields: fields(&["name"]),
            children: Vec::new(),
        };
        let mut args = BoundArgs::new();
        args.insert("id".into(), coop.as_str().into());
        let ctx = ReadContext::new(&TokenFilter::All, None);
        let root_fields = fields(&["name"]).unwrap();
        let search = Search::new(&by_id, &args, None).reading(Some(&root_fields));
        let keys = |p: &Map<String, Value>| p.keys().cloned().collect::<Vec<_>>();

        let tree = vec![level(&hens, "id", &by_coop)];
        let got = coops
            .find_nested(&search, &tree, &ctx)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(keys(&got[0].payload), ["name"]);
        let hens_read: Vec<Vec<String>> = got[0].children[0]
            .iter()
            .map(|h| keys(&h.payload))
            .collect();
        assert_eq!(hens_read, [["name"], ["name"]]);

        // hen → its coop through `coop_id`, which the hens' fields leave out
        let mut hen_level = level(&hens, "id", &by_coop);
        hen_level.children = vec![level(&coops, "coop_id", &by_id)];
        let got = coops
            .find_nested(&search, &[hen_level], &ctx)
            .await
            .unwrap()
            .unwrap();
        let first = &got[0].children[0][0];
        assert_eq!(first.payload["breed"], "leghorn", "parsed whole");
        assert_eq!(first.children[0][0].id, coop, "and the coop below found");
        assert_eq!(keys(&first.children[0][0].payload), ["name"]);
    }

    /// One template (one compiled-statement key) used by relationships to two tables of the
    /// file: each level reads its own table.
    #[tokio::test]
    async fn one_template_over_two_tables_reads_each_table() {
        let dir = tempfile::tempdir().unwrap();
        let db = SqliteDatabase::open(&dir.path().join("t.db"), SqliteOptions::default()).unwrap();
        let coops = Arc::new(SqliteStore::new(db.clone(), "coop"));
        let hens = Arc::new(SqliteStore::new(db.clone(), "hen"));
        let ducks = Arc::new(SqliteStore::new(db.clone(), "duck"));
        let by_id = QueryTemplate::filter(r#"{"id": "{{id}}"}"#).unwrap();
        let by_coop = QueryTemplate::filter(r#"{"payload.coop_id": "{{id}}"}"#).unwrap();
        for store in [&coops, &hens, &ducks] {
            store
                .prepare(&[by_id.clone(), by_coop.clone()])
                .await
                .unwrap();
        }
        let w = WriteContext::SYSTEM;
        let coop = coops
            .create(doc(serde_json::json!({"name": "c"})), &w)
            .await
            .unwrap()
            .id;
        for (store, name) in [(&hens, "hen"), (&ducks, "duck")] {
            store
                .create(doc(serde_json::json!({"name": name, "coop_id": coop})), &w)
                .await
                .unwrap();
        }
        let level = |store: &Arc<SqliteStore>| Nested {
            key_field: "id".into(),
            vector: true,
            store: store.clone() as DynReader,
            template: by_coop.clone(),
            fields: None,
            children: Vec::new(),
        };
        let nested = vec![level(&hens), level(&ducks)];
        let mut args = BoundArgs::new();
        args.insert("id".into(), coop.as_str().into());
        let ctx = ReadContext::new(&TokenFilter::All, None);
        for _ in 0..2 {
            let tree = coops
                .find_nested(&Search::new(&by_id, &args, None), &nested, &ctx)
                .await
                .unwrap()
                .unwrap();
            let names: Vec<&str> = tree[0]
                .children
                .iter()
                .map(|rows| rows[0].payload["name"].as_str().unwrap())
                .collect();
            assert_eq!(names, ["hen", "duck"]);
        }
    }

    /// A relationship to a table of another file is not joined: the caller goes level by
    /// level.
    #[tokio::test]
    async fn a_relationship_to_another_file_is_read_level_by_level() {
        let dir = tempfile::tempdir().unwrap();
        let a = SqliteDatabase::open(&dir.path().join("a.db"), SqliteOptions::default()).unwrap();
        let b = SqliteDatabase::open(&dir.path().join("b.db"), SqliteOptions::default()).unwrap();
        let coops = SqliteStore::new(a, "coop");
        let hens = Arc::new(SqliteStore::new(b, "hen"));
        let all = QueryTemplate::filter("{}").unwrap();
        let by_coop = QueryTemplate::filter(r#"{"payload.coop_id": "{{id}}"}"#).unwrap();
        coops.prepare(std::slice::from_ref(&all)).await.unwrap();
        hens.prepare(std::slice::from_ref(&by_coop)).await.unwrap();
        let nested = vec![Nested {
            key_field: "id".into(),
            vector: true,
            store: hens as DynReader,
            template: by_coop,
            fields: None,
            children: Vec::new(),
        }];
        let args = BoundArgs::new();
        let found = coops
            .find_nested(
                &Search::new(&all, &args, None),
                &nested,
                &ReadContext::new(&TokenFilter::All, None),
            )
            .await
            .unwrap();
        assert!(found.is_none());
    }
}
