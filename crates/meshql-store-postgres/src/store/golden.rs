//! Golden texts: every statement this crate compiles, and what it binds, written out and
//! compared with `tests/golden/postgres.sql.txt` (no database needed), so that a change of a
//! statement's text or of a bound parameter shows as a diff. `MESHQL_BLESS=1` rewrites the file.

use super::*;
use meshql_core::nested::Level;
use meshql_store_sql::golden as meshql_store_golden;
use tokio_postgres::types::{FromSql, IsNull, Type};

fn shapes() -> Vec<Shape> {
    (0..16)
        .map(|i| Shape {
            at: i & 8 != 0,
            tokens: i & 4 != 0,
            limit: i & 2 != 0,
            batch: i & 1 != 0,
        })
        .collect()
}

/// A bound parameter as the server receives it: its type and value.
fn value(p: &SqlParam) -> String {
    for ty in [Type::TEXT, Type::INT8, Type::TEXT_ARRAY] {
        let mut buf = bytes::BytesMut::new();
        match p.to_sql_checked(&ty, &mut buf) {
            Ok(IsNull::Yes) => return format!("{ty}:NULL"),
            Ok(IsNull::No) => {
                return match ty {
                    Type::TEXT => format!("{ty}:{:?}", String::from_utf8_lossy(&buf)),
                    Type::INT8 => format!("{ty}:{}", i64::from_sql(&ty, &buf).unwrap()),
                    _ => format!("{ty}:{:?}", Vec::<String>::from_sql(&ty, &buf).unwrap()),
                }
            }
            Err(_) => continue,
        }
    }
    format!("?{p:?}")
}

fn values(v: &[SqlParam]) -> String {
    let parts: Vec<String> = v.iter().map(value).collect();
    format!("[{}]", parts.join(", "))
}

fn bind_all(out: &mut String, c: &Compiled, template: &QueryTemplate, shape: Shape) {
    let tokens = Some(vec!["alice".to_owned(), "bob".to_owned()]);
    let keys = ["k1".to_owned(), "k2".to_owned()];
    let at = shape.at.then_some(1_000);
    let tokens = if shape.tokens { tokens } else { None };
    let limit = shape.limit.then_some(10);
    if shape.batch {
        let v = PostgresStore::bind(c, &BoundArgs::new(), at, &tokens, limit, Some(&keys));
        out.push_str(&format!("-- keys {}\n", values(&v)));
    } else {
        for (name, args) in meshql_store_golden::arg_sets(template) {
            let v = PostgresStore::bind(c, &args, at, &tokens, limit, None);
            out.push_str(&format!("-- {name} {}\n", values(&v)));
        }
    }
}

fn search_section(out: &mut String) {
    for (label, template) in meshql_store_golden::templates() {
        for shape in shapes() {
            let c = meshql_store_sql::search::search(&DIALECT, "hen", &template, shape);
            out.push_str(&format!("== search {label} {shape:?}\n{}\n", c.sql));
            bind_all(out, &c, &template, shape);
        }
    }
}

fn nested_section(out: &mut String) {
    let trees = meshql_store_golden::trees();
    for (i, (root, levels)) in trees.iter().enumerate() {
        let levels: Vec<Level<'_>> = levels.iter().map(meshql_store_golden::level).collect();
        for shape in shapes().into_iter().filter(|s| !s.batch) {
            let c = meshql_store_sql::nested::nested_search(&DIALECT, "hen", root, shape, &levels);
            out.push_str(&format!("== nested tree {i} {shape:?}\n{}\n", c.sql));
            bind_all(out, &c, root, shape);
        }
    }
}

fn table_section(out: &mut String) {
    for table in meshql_store_golden::TABLES {
        let s = TableSql::new(table);
        let mut fields: Vec<(String, &str)> = vec![
            ("read_latest".into(), &s.read_latest),
            ("read_at".into(), &s.read_at),
            ("read_many_latest".into(), &s.read_many_latest),
            ("read_many_at".into(), &s.read_many_at),
            ("current".into(), &s.current),
            ("current_many".into(), &s.current_many),
            ("clear_latest".into(), &s.clear_latest),
            ("insert".into(), &s.insert),
            ("version_exists".into(), &s.version_exists),
            ("versions".into(), &s.versions),
            ("lock".into(), &s.lock),
            ("changes".into(), &s.changes),
        ];
        for (i, text) in s.list.iter().enumerate() {
            fields.push((format!("list {i}"), text));
        }
        for (i, page) in s.page.iter().enumerate() {
            fields.push((format!("page {i}"), &page.sql));
        }
        for (name, text) in fields {
            out.push_str(&format!("== table {table} {name}\n{text}\n"));
        }
        out.push_str(&format!(
            "== ddl {table} create_table\n{}\n",
            sql::create_table(table)
        ));
        out.push_str(&format!(
            "== ddl {table} rebuild_table\n{}\n",
            sql::rebuild_table(table)
        ));
        let templates: Vec<QueryTemplate> = meshql_store_golden::templates()
            .into_iter()
            .map(|(_, t)| t)
            .collect();
        out.push_str(&format!(
            "== ddl {table} index_suffixes\n{:?}\n",
            sql::index_suffixes(&templates)
        ));
        for suffix in sql::index_suffixes(&templates) {
            out.push_str(&format!(
                "== ddl {table} index_name {suffix}\n{}\n",
                sql::index_name(table, &suffix)
            ));
        }
        for (label, template) in meshql_store_golden::templates() {
            for path in template.filtered_paths() {
                out.push_str(&format!(
                    "== ddl {table} field {label} {path:?}\n{:?}\n",
                    sql::create_field_index(table, &path)
                ));
            }
            for path in template.range_paths() {
                out.push_str(&format!(
                    "== ddl {table} range {label} {path:?}\n{:?}\n",
                    sql::create_range_indexes(table, &path)
                ));
            }
        }
    }
}

fn outputs_section(out: &mut String) {
    out.push_str(&format!("== outputs ddl\n{}\n", outputs::DDL));
    for (name, text) in outputs::golden_statements() {
        out.push_str(&format!("== outputs {name}\n{text}\n"));
    }
}

#[test]
fn statements_and_parameters_are_unchanged() {
    let mut out = String::new();
    search_section(&mut out);
    nested_section(&mut out);
    table_section(&mut out);
    outputs_section(&mut out);
    meshql_store_golden::check(
        &out,
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/postgres.sql.txt"),
    );
}
