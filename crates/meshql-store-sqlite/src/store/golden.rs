//! Golden texts: every statement this crate compiles, and what it binds, written out and
//! compared with `tests/golden/sqlite.sql.txt` (no database needed), so that a change of a
//! statement's text or of a bound parameter shows as a diff. `MESHQL_BLESS=1` rewrites the file.

use super::*;

fn shapes() -> Vec<Shape> {
    let mut out = Vec::new();
    for i in 0..8 {
        out.push(Shape {
            at: i & 4 != 0,
            tokens: i & 2 != 0,
            batch: i & 1 != 0,
        });
    }
    out
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
            let c = sql::search("hen", &template, shape);
            out.push_str(&format!("== search {label} {shape:?}\n{}\n", c.sql));
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
            ("list_latest", &s.list_latest),
            ("list_at", &s.list_at),
            ("list_latest_tokens", &s.list_latest_tokens),
            ("list_at_tokens", &s.list_at_tokens),
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
        for (i, text) in s.page.iter().enumerate() {
            out.push_str(&format!("== table {table} page {i}\n{text}\n"));
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

/// What the three stores' golden tests share (kept in step with the copies in the PostgreSQL
/// and MySQL crates until the SQL core crate holds it).
#[allow(dead_code)]
mod meshql_store_golden {
    use meshql_core::{BoundArgs, QueryTemplate};
    use serde_json::{json, Value};

    pub const TABLES: [&str; 4] = [
        "hen",
        "he\"n`x",
        "a_rather_long_entity_table_name_that_goes_on_and_on_past_sixty_four_chars",
        "ünïcödé_table_name_with_many_multibyte_characters_ääääääääääääää",
    ];

    /// Every template of the conformance suite, and some that reach the corners of the
    /// compilers (interpolations, the batch key in every operator, SQL fragments, odd paths).
    pub fn templates() -> Vec<(String, QueryTemplate)> {
        let mut all = meshql_conformance::templates();
        all.extend(meshql_conformance::operator_templates());
        let q = |s: &str| QueryTemplate::filter(s).unwrap();
        all.extend([
            QueryTemplate::sql("json_extract(payload, '$.name') = '{{name}}' AND id = {{id}}")
                .unwrap(),
            QueryTemplate::sql("payload->>'name' = {{name}} AND x = '{{x}}'").unwrap(),
            QueryTemplate::sql("1 = 1").unwrap(),
            q(r#"{"payload.code": "a-{{x}}", "payload.flag": true, "payload.n": 5}"#),
            q(r#"{"payload.code": {"$gte": "a-{{x}}"}, "payload.tag": {"$in": ["veg", "t-{{t}}", "{{t}}", 3]}}"#),
            q(r#"{"payload.name": {"$eq": "{{id}}"}, "payload.n": {"$lt": "{{id}}"}, "payload.tag": {"$regex": "{{id}}"}}"#),
            q(r#"{"payload.tag": {"$in": "{{id}}"}, "payload.other": {"$nin": "{{x}}"}, "id": {"$ne": "{{id}}"}}"#),
            q(r#"{"id": {"$gte": "{{x}}", "$lt": "{{id}}"}, "payload.x": {"$exists": false}}"#),
            q(r#"{"id": {"$exists": true}, "payload.a.b": {"$regex": "^q", "$options": "i"}}"#),
            q(r#"{"payload.a-b.0": "{{x}}", "payload.n": {"$gt": 1.5}}"#),
            q(r#"{"payload.a": {"$ne": "{{x}}"}, "$or": [{"id": {"$lt": "{{x}}"}, "payload.b": {"$exists": false}}, {"payload.c": {"$in": "{{cs}}"}}]}"#)
                .with_sort(r#"{"id": -1, "payload.a": 1}"#)
                .unwrap(),
            q(r#"{"payload.parent": "{{id}}", "payload.code": {"$regex": "a-{{x}}"}}"#),
        ]);
        all.into_iter()
            .enumerate()
            .map(|(i, t)| {
                let sort: Vec<String> = t
                    .sort()
                    .iter()
                    .map(|k| format!("{:?}{}", k.path, if k.descending { " desc" } else { "" }))
                    .collect();
                (format!("#{i} {} sort={sort:?}", t.source), t)
            })
            .collect()
    }

    /// A relationship of a nested read, owning what a [`meshql_core::nested::Level`] borrows.
    pub struct LevelSpec {
        pub table: &'static str,
        pub key_field: &'static str,
        pub template: QueryTemplate,
        pub vector: bool,
        pub children: Vec<LevelSpec>,
    }

    pub fn level(s: &LevelSpec) -> meshql_core::nested::Level<'_> {
        meshql_core::nested::Level {
            table: s.table.to_owned(),
            key_field: s.key_field,
            template: &s.template,
            vector: s.vector,
            children: s.children.iter().map(level).collect(),
        }
    }

    /// Searches with relationships below them: by id and by payload keys, two levels deep,
    /// siblings, and relationship templates with operators, interpolations and SQL.
    pub fn trees() -> Vec<(QueryTemplate, Vec<LevelSpec>)> {
        let q = |s: &str| QueryTemplate::filter(s).unwrap();
        let leaf = |table, key_field, template, vector| LevelSpec {
            table,
            key_field,
            template,
            vector,
            children: Vec::new(),
        };
        vec![
            (
                q(r#"{"payload.name": "{{name}}"}"#),
                vec![leaf(
                    "egg",
                    "id",
                    q(r#"{"payload.parent": "{{id}}"}"#),
                    true,
                )],
            ),
            (
                q(r#"{"payload.price": {"$gte": "{{min}}", "$lt": "{{max}}"}}"#),
                vec![LevelSpec {
                    table: "coop",
                    key_field: "farm",
                    template: q(
                        r#"{"payload.parent": "{{id}}", "payload.price": {"$gt": 2}, "payload.code": {"$regex": "a-{{x}}"}, "payload.name": {"$nin": ["{{other}}", "zzz"]}, "payload.n": {"$lt": "{{id}}"}}"#,
                    ),
                    vector: false,
                    children: vec![
                        leaf(
                            "he\"n`x",
                            "id",
                            q(r#"{"id": {"$in": "{{id}}"}, "payload.tag": {"$in": "{{tags}}"}}"#),
                            true,
                        ),
                        leaf(
                            "chick",
                            "mother",
                            QueryTemplate::sql("payload->>'m' = {{id}} AND x = '{{x}}'").unwrap(),
                            true,
                        ),
                    ],
                }],
            ),
            (
                q("{}"),
                vec![
                    leaf(
                        "egg",
                        "id",
                        q(r#"{"payload.hen": "{{id}}", "payload.code": "a-{{x}}"}"#),
                        true,
                    ),
                    leaf("farm", "farm_id", q(r#"{"id": "{{id}}"}"#), false),
                ],
            ),
            (
                q(r#"{"id": "{{id}}"}"#),
                vec![leaf(
                    "egg",
                    "id",
                    q(r#"{"payload.hen": {"$eq": "{{id}}"}, "payload.w": {"$gte": "{{id}}"}}"#),
                    true,
                )],
            ),
        ]
    }

    /// Two argument sets for a template: every argument a string, then a mix of types.
    pub fn arg_sets(template: &QueryTemplate) -> Vec<(&'static str, BoundArgs)> {
        let pool = [
            json!(7),
            json!(2.5),
            json!(true),
            Value::Null,
            json!(["a", 3, null]),
            json!("x"),
            json!(-12345678901i64),
        ];
        let (mut strings, mut mixed) = (BoundArgs::new(), BoundArgs::new());
        for (i, name) in template.placeholders().into_iter().enumerate() {
            strings.insert(name.clone(), json!(format!("s-{name}")));
            mixed.insert(name, pool[i % pool.len()].clone());
        }
        vec![("strings", strings), ("mixed", mixed)]
    }

    /// Compares `text` with the golden file at `path` (or writes it, with `MESHQL_BLESS=1`).
    pub fn check(text: &str, path: &std::path::Path) {
        if std::env::var_os("MESHQL_BLESS").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
            return;
        }
        let golden = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("{}: {e} (MESHQL_BLESS=1 writes it)", path.display()));
        if golden != text {
            let (g, t): (Vec<&str>, Vec<&str>) = (golden.lines().collect(), text.lines().collect());
            let at = (0..g.len().max(t.len()))
                .find(|&i| g.get(i) != t.get(i))
                .unwrap_or(0);
            let from = at.saturating_sub(3);
            panic!(
                "statements differ from {} at line {}:\n--- golden\n{}\n--- now\n{}",
                path.display(),
                at + 1,
                g[from.min(g.len())..(at + 3).min(g.len())].join("\n"),
                t[from.min(t.len())..(at + 3).min(t.len())].join("\n"),
            );
        }
    }
}
