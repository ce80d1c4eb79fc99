//! Golden texts: every statement this crate compiles, and what it binds, written out and
//! compared with `tests/golden/sqlite.sql.txt` (no database needed), so that a change of a
//! statement's text or of a bound parameter shows as a diff. `MESHQL_BLESS=1` rewrites the file.

use super::*;
use meshql_store_sql::golden as meshql_store_golden;

fn shapes() -> Vec<Shape> {
    let mut out = Vec::new();
    for i in 0..8 {
        out.push(Shape {
            at: i & 4 != 0,
            tokens: i & 2 != 0,
            limit: false,
            batch: i & 1 != 0,
        });
    }
    out
}

/// The label of a shape (as its `Debug` was before `Shape` had `limit`).
fn label(s: Shape) -> String {
    format!(
        "Shape {{ at: {}, tokens: {}, batch: {} }}",
        s.at, s.tokens, s.batch
    )
}

fn values(v: &[SqlValue]) -> String {
    let parts: Vec<String> = v.iter().map(|v| format!("{v:?}")).collect();
    format!("[{}]", parts.join(", "))
}

fn search_section(out: &mut String) {
    let tokens = Some(r#"["alice","bob"]"#.to_owned());
    let keys = r#"["k1","k2"]"#;
    for (label, template) in meshql_store_golden::templates() {
        for shape in shapes() {
            let c = crate::dialect::search("hen", &template, shape);
            out.push_str(&format!(
                "== search {label} {}\n{}\n",
                self::label(shape),
                c.sql
            ));
            let at = shape.at.then_some(1_000);
            let tokens = if shape.tokens { tokens.clone() } else { None };
            if shape.batch {
                let v = SqliteStore::bind(&c, &BoundArgs::new(), at, &tokens, Some(keys));
                out.push_str(&format!("-- keys {}\n", values(&v)));
            } else {
                for (name, args) in meshql_store_golden::arg_sets(&template) {
                    let v = SqliteStore::bind(&c, &args, at, &tokens, None);
                    out.push_str(&format!("-- {name} {}\n", values(&v)));
                }
            }
        }
    }
}

fn table_section(out: &mut String) {
    for table in meshql_store_golden::TABLES {
        let s = TableSql::new(table);
        let fields: [(&str, &str); 14] = [
            ("read_latest", &s.read_latest),
            ("read_at", &s.read_at),
            ("read_many_latest", &s.read_many_latest),
            ("read_many_at", &s.read_many_at),
            ("list_latest", &s.list[0]),
            ("list_at", &s.list[1]),
            ("list_latest_tokens", &s.list[2]),
            ("list_at_tokens", &s.list[3]),
            ("current", &s.current),
            ("clear_latest", &s.clear_latest),
            ("insert", &s.insert),
            ("version_exists", &s.version_exists),
            ("versions", &s.versions),
            ("changes", &s.changes),
        ];
        for (name, text) in fields {
            out.push_str(&format!("== table {table} {name}\n{text}\n"));
        }
        for (i, page) in s.page.iter().enumerate() {
            out.push_str(&format!("== table {table} page {i}\n{}\n", page.sql));
        }
        out.push_str(&format!(
            "== ddl {table} create_table\n{}\n",
            sql::create_table(table)
        ));
        out.push_str(&format!(
            "== ddl {table} rebuild_table\n{}\n",
            outputs::rebuild_table(table)
        ));
        for (label, template) in meshql_store_golden::templates() {
            for path in template.filtered_paths() {
                out.push_str(&format!(
                    "== ddl {table} field {label} {path:?}\n{:?}\n",
                    sql::create_field_index(table, &path)
                ));
            }
        }
    }
    out.push_str(&format!("== ddl added_columns\n{:?}\n", sql::ADDED_COLUMNS));
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
    table_section(&mut out);
    outputs_section(&mut out);
    meshql_store_golden::check(
        &out,
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/sqlite.sql.txt"),
    );
}
