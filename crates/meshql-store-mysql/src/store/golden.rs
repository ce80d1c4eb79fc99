//! Golden texts: every statement this crate compiles, and what it binds, written out and
//! compared with `tests/golden/mysql.sql.txt` (no database needed), so that a change of a
//! statement's text or of a bound parameter shows as a diff. `MESHQL_BLESS=1` rewrites the file.

use super::*;
use meshql_core::nested::Level;
use meshql_store_sql::golden as meshql_store_golden;

fn shapes() -> Vec<Shape> {
    (0..8)
        .map(|i| Shape {
            at: i & 4 != 0,
            tokens: i & 2 != 0,
            limit: false,
            batch: i & 1 != 0,
        })
        .collect()
}

/// A bound parameter as the server receives it: its type and value.
fn value(v: &Value) -> String {
    match v {
        Value::NULL => "NULL".to_owned(),
        Value::Bytes(b) => format!("bytes:{:?}", String::from_utf8_lossy(b)),
        Value::Int(i) => format!("int:{i}"),
        Value::UInt(u) => format!("uint:{u}"),
        other => format!("{other:?}"),
    }
}

/// The label of a shape (as its `Debug` was before `Shape` had `limit`).
fn label(s: Shape) -> String {
    format!(
        "Shape {{ at: {}, tokens: {}, batch: {} }}",
        s.at, s.tokens, s.batch
    )
}

fn values(p: &Params) -> String {
    let parts: Vec<String> = match p {
        Params::Positional(v) => v.iter().map(value).collect(),
        other => vec![format!("{other:?}")],
    };
    format!("[{}]", parts.join(", "))
}

fn bind_all(out: &mut String, c: &Compiled, template: &QueryTemplate, shape: Shape, limit: bool) {
    let tokens = Some(r#"["alice","bob"]"#.to_owned());
    let keys = r#"["k1","k2"]"#;
    let at = shape.at.then_some(1_000);
    let tokens = if shape.tokens { tokens } else { None };
    let limit = limit.then_some(10);
    if shape.batch {
        let v = MysqlStore::bind(c, &BoundArgs::new(), at, &tokens, Some(keys), limit);
        out.push_str(&format!("-- keys {}\n", values(&v)));
    } else {
        for (name, args) in meshql_store_golden::arg_sets(template) {
            let v = MysqlStore::bind(c, &args, at, &tokens, None, limit);
            out.push_str(&format!("-- {name} {}\n", values(&v)));
        }
    }
}

fn search_section(out: &mut String) {
    for (label, template) in meshql_store_golden::templates() {
        for shape in shapes() {
            let c = meshql_store_sql::search::search(&DIALECT, "hen", &template, shape);
            out.push_str(&format!(
                "== search {label} {}\n{}\n",
                self::label(shape),
                c.sql
            ));
            bind_all(out, &c, &template, shape, false);
        }
    }
}

fn nested_section(out: &mut String) {
    let trees = meshql_store_golden::trees();
    for (i, (root, levels)) in trees.iter().enumerate() {
        let levels: Vec<Level<'_>> = levels.iter().map(meshql_store_golden::level).collect();
        for shape in shapes().into_iter().filter(|s| !s.batch) {
            for limit in [false, true] {
                let shape = Shape { limit, ..shape };
                let c =
                    meshql_store_sql::nested::nested_search(&DIALECT, "hen", root, shape, &levels);
                out.push_str(&format!(
                    "== nested tree {i} {} limit {limit}\n{}\n",
                    label(shape),
                    c.sql
                ));
                bind_all(out, &c, root, shape, limit);
            }
        }
    }
}

fn table_section(out: &mut String) {
    for table in meshql_store_golden::TABLES {
        let s = TableSql::new(table);
        let mut fields: Vec<(String, String)> = vec![
            ("read_latest".into(), s.read_latest.clone()),
            ("read_at".into(), s.read_at.clone()),
            ("read_many_latest".into(), s.read_many_latest.clone()),
            ("read_many_at".into(), s.read_many_at.clone()),
            ("current".into(), s.current.clone()),
            ("current_many".into(), s.current_many.clone()),
            ("clear_latest".into(), s.clear_latest.clone()),
            ("insert".into(), s.insert.clone()),
            ("version_exists".into(), s.version_exists.clone()),
            ("versions".into(), s.versions.clone()),
            ("tick".into(), s.tick.clone()),
            ("stamp_one".into(), s.stamp_one.clone()),
            (
                "stamp_one_and_commit".into(),
                format!("{:?}", s.stamp_one_and_commit),
            ),
            ("stamp_many".into(), s.stamp_many.clone()),
            ("changes".into(), s.changes.clone()),
        ];
        for (i, text) in s.list.iter().enumerate() {
            fields.push((format!("list {i}"), text.clone()));
        }
        for (i, page) in s.page.iter().enumerate() {
            fields.push((format!("page {i}"), page.sql.clone()));
        }
        for (name, text) in fields {
            out.push_str(&format!("== table {table} {name}\n{text}\n"));
        }
        out.push_str(&format!(
            "== ddl {table} create_table\n{}\n",
            sql::create_table(table)
        ));
        out.push_str(&format!(
            "== ddl {table} upgrade_for_feed\n{}\n",
            sql::upgrade_for_feed(table).join("\n")
        ));
        out.push_str(&format!(
            "== ddl {table} rebuild_table\n{}\n",
            sql::rebuild_table(table)
        ));
        out.push_str(&format!(
            "== ddl {table} swapped_out_table\n{}\n",
            sql::swapped_out_table(table)
        ));
        for (label, template) in meshql_store_golden::templates() {
            for path in template.filtered_paths() {
                out.push_str(&format!(
                    "== ddl {table} field {label} {path:?}\n{}\n",
                    sql::field_column_ddl(table, &path).join("\n")
                ));
            }
            for path in template.range_paths() {
                out.push_str(&format!(
                    "== ddl {table} range {label} {path:?}\n{}\n",
                    sql::range_column_ddl(table, &path).join("\n")
                ));
            }
        }
    }
    out.push_str(&format!("== ddl clock\n{}\n", sql::CREATE_CLOCK));
}

fn outputs_section(out: &mut String) {
    out.push_str(&format!("== outputs ddl\n{}\n", outputs::DDL.join("\n")));
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
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/mysql.sql.txt"),
    );
}
