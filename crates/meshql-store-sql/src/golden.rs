//! Test support: the templates, nested trees, arguments and tables every SQL store's golden
//! test renders its statements for, and the comparison with the golden file. A store's
//! golden test writes out every statement it compiles and what each binds, without a
//! database, so that a change of a statement's text or of a bound parameter shows as a diff
//! (`MESHQL_BLESS=1` rewrites the file).

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

/// The statements of [`crate::outputs::OutputSql`], by name, then a store's own (`own`),
/// as the golden files list them.
pub fn output_statements(
    o: &crate::outputs::OutputSql,
    own: &[(&str, &str)],
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = [
        ("position", &o.position),
        ("group", &o.group),
        ("upsert_state", &o.upsert_state),
        ("delete_state", &o.delete_state),
        ("insert_letter", &o.insert_letter),
        ("upsert_position", &o.upsert_position),
        ("letters_of", &o.letters_of),
        ("letters", &o.letters),
        ("count_letters", &o.count_letters),
    ]
    .into_iter()
    .map(|(n, s)| (n.to_owned(), s.clone()))
    .collect();
    for (i, t) in crate::outputs::CONSUMER_TABLES.iter().enumerate() {
        out.push((format!("delete_consumer {t}"), o.delete_consumer[i].clone()));
        out.push((format!("move_consumer {t}"), o.move_consumer[i].clone()));
    }
    out.extend(own.iter().map(|(n, s)| (format!("own {n}"), s.to_string())));
    out
}
