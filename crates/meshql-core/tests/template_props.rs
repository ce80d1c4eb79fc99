//! Property tests for query templates (issue 11, item 10): parsing arbitrary text as a filter
//! or a SQL fragment answers `Ok` or a `TemplateError`, never a panic; binding arbitrary
//! argument values never changes a template's structure, and a bound value is compared as
//! data (checked through the memory store: a search finds exactly the documents whose field
//! equals the value, whatever quotes, braces, SQL comments or placeholders it holds).

use meshql_core::template::{render, Piece, SqlPiece, TemplateKind};
use meshql_core::{
    ArgValue, BoundArgs, NewDocument, QueryTemplate, ReadContext, Search, Store, StoreReader,
    StoreWriter, TemplateError, TokenFilter, WriteContext,
};
use meshql_store_memory::MemoryStore;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

/// Strings made to look like template syntax, SQL and JSON.
fn nasty_string() -> impl Strategy<Value = String> {
    let atoms = prop_oneof![
        Just("{{".to_owned()),
        Just("}}".to_owned()),
        Just("{{{".to_owned()),
        Just("}}}".to_owned()),
        Just("{{x}}".to_owned()),
        Just("{{id}}".to_owned()),
        Just("{{name}}".to_owned()),
        Just("\"}".to_owned()),
        Just("'".to_owned()),
        Just("''".to_owned()),
        Just("--".to_owned()),
        Just("/*".to_owned()),
        Just(";".to_owned()),
        Just(" OR 1=1".to_owned()),
        Just("\\".to_owned()),
        Just("\"".to_owned()),
        Just("$.".to_owned()),
        Just("payload.".to_owned()),
        Just("\u{0}".to_owned()),
        Just("é𝄞".to_owned()),
        "[a-z ]{0,4}",
        "\\PC{0,3}",
    ];
    prop::collection::vec(atoms, 0..8).prop_map(|v| v.concat())
}

/// Arbitrary JSON values, shallow (arguments are GraphQL values).
fn arg_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        nasty_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            prop::collection::btree_map(nasty_string(), inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn args_strategy() -> impl Strategy<Value = BoundArgs> {
    prop::collection::btree_map(
        prop_oneof![
            Just("id".to_owned()),
            Just("name".to_owned()),
            Just("x".to_owned()),
            nasty_string()
        ],
        arg_value(),
        0..4,
    )
    .prop_map(|m| m.into_iter().collect::<Map<_, _>>())
}

/// Filter-template text: JSON objects with keys and values that look like templates.
fn filter_text() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        Just("id".to_owned()),
        "payload\\.[a-z_.-]{0,8}",
        nasty_string()
    ];
    let value = prop_oneof![nasty_string().prop_map(Value::String), arg_value(),];
    prop_oneof![
        prop::collection::vec((key, value), 0..4)
            .prop_map(|kv| { Value::Object(kv.into_iter().collect::<Map<_, _>>()).to_string() }),
        nasty_string(),
        "\\PC{0,60}",
    ]
}

fn sql_text() -> impl Strategy<Value = String> {
    let atoms = prop_oneof![
        Just("json_extract(payload, '$.name') = ".to_owned()),
        Just("id = ".to_owned()),
        Just("'{{id}}'".to_owned()),
        Just("'a-{{x}}-b'".to_owned()),
        Just("{{{x}}}".to_owned()),
        Just(" AND ".to_owned()),
        nasty_string(),
    ];
    prop::collection::vec(atoms, 0..6).prop_map(|v| v.concat())
}

/// Every argument a template refers to, and its structure, are fixed at parse time.
fn structure(t: &QueryTemplate) -> (TemplateKind, std::collections::BTreeSet<String>) {
    (t.kind.clone(), t.placeholders())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    /// Any text as a filter template: a template or an error, and binding and matching
    /// with any arguments against any payload never panics nor changes the template.
    #[test]
    fn filter_parse_and_bind_never_panic(
        text in filter_text(),
        args in args_strategy(),
        payload in prop::collection::btree_map("[a-z]{1,3}", arg_value(), 0..4),
    ) {
        let payload: Map<String, Value> = payload.into_iter().collect();
        match QueryTemplate::filter(&text) {
            Ok(t) => {
                let before = structure(&t);
                let _ = t.matches(&args, "some-id", &payload);
                let _ = t.filtered_paths();
                if let TemplateKind::Filter(preds) = &t.kind {
                    for (path, arg) in preds {
                        let _ = path.lookup("some-id", &payload);
                        let _ = path.json_path();
                        let _ = arg.bind(&args);
                    }
                }
                prop_assert_eq!(structure(&t), before);
            }
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }

    /// Any text as a SQL fragment: a template or an error, never a panic; bare or quoted
    /// placeholders are parameters, never SQL text.
    #[test]
    fn sql_parse_never_panics(text in sql_text()) {
        match QueryTemplate::sql(&text) {
            Ok(t) => {
                let _ = t.filtered_paths();
                let TemplateKind::Sql(pieces) = &t.kind else {
                    return Err(TestCaseError::fail("sql() made a filter"));
                };
                for p in pieces {
                    if let SqlPiece::Text(s) = p {
                        // a well-formed placeholder never survives as SQL text
                        for name in t.placeholders() {
                            let placeholder = format!("{{{{{name}}}}}");
                            prop_assert!(!s.contains(&placeholder), "{placeholder} left in {s:?}");
                        }
                    }
                }
            }
            Err(TemplateError::Unterminated(_) | TemplateError::UnterminatedLiteral(_)) => {}
            Err(e) => return Err(TestCaseError::fail(format!("unexpected SQL error kind: {e:?}"))),
        }
    }

    /// A whole placeholder binds to the argument's value as it is; a placeholder inside a
    /// string renders the value into that string between the fixed text, and nothing else.
    #[test]
    fn bound_values_are_data(value in nasty_string(), other in arg_value()) {
        let whole = QueryTemplate::filter(r#"{"payload.name": "{{name}}"}"#).unwrap();
        let inside = QueryTemplate::filter(r#"{"payload.name": "a'-{{name}}-\"}"}"#).unwrap();
        let sql = QueryTemplate::sql("json_extract(payload, '$.name') = 'a-{{name}}' AND id = {{id}}").unwrap();
        let (w0, i0, s0) = (structure(&whole), structure(&inside), structure(&sql));

        let mut args = BoundArgs::new();
        args.insert("name".into(), Value::String(value.clone()));
        args.insert("id".into(), other);
        let TemplateKind::Filter(preds) = &whole.kind else { unreachable!() };
        prop_assert_eq!(preds[0].1.bind(&args), Value::String(value.clone()));
        let TemplateKind::Filter(preds) = &inside.kind else { unreachable!() };
        prop_assert!(matches!(preds[0].1, ArgValue::Interpolated(_)));
        prop_assert_eq!(preds[0].1.bind(&args), Value::String(format!("a'-{value}-\"}}")));
        let pieces = vec![Piece::Text("<".into()), Piece::Arg("name".into()), Piece::Text(">".into())];
        prop_assert_eq!(render(&pieces, &args), format!("<{value}>"));

        // binding happened; nothing about any template changed
        prop_assert_eq!(structure(&whole), w0);
        prop_assert_eq!(structure(&inside), i0);
        prop_assert_eq!(structure(&sql), s0);
        let names: Vec<String> = sql.placeholders().into_iter().collect();
        prop_assert_eq!(names, vec!["id".to_owned(), "name".to_owned()]);
    }

    /// Through a store: searching by a nasty value finds exactly the documents whose name
    /// is that value (the decoys hold the value's pieces, the placeholder itself, and a
    /// document whose name is the template text).
    #[test]
    fn search_with_a_nasty_value_finds_exactly_its_matches(
        value in nasty_string(),
        decoys in prop::collection::vec(nasty_string(), 0..5),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let store = MemoryStore::new();
            let by_name = QueryTemplate::filter(r#"{"payload.name": "{{name}}"}"#).unwrap();
            let by_prefixed = QueryTemplate::filter(r#"{"payload.name": "p-{{name}}"}"#).unwrap();
            store.prepare(&[by_name.clone(), by_prefixed.clone()]).await.unwrap();
            let mut names = vec![
                value.clone(),
                format!("p-{value}"),
                "{{name}}".to_owned(),
                "p-{{name}}".to_owned(),
                format!("{value}'"),
                format!("\"{value}"),
            ];
            names.extend(decoys);
            for (i, n) in names.iter().enumerate() {
                let payload = json!({"name": n}).as_object().unwrap().clone();
                store
                    .create(NewDocument::with_id(format!("d{i}"), payload), &WriteContext::SYSTEM)
                    .await
                    .unwrap();
            }
            let mut args = BoundArgs::new();
            args.insert("name".into(), Value::String(value.clone()));
            let all = TokenFilter::All;
            for (template, expected) in [(&by_name, value.clone()), (&by_prefixed, format!("p-{value}"))] {
                let rows = store
                    .find(&Search::new(template, &args, None), &ReadContext::new(&all, None))
                    .await
                    .unwrap();
                let mut found: Vec<String> = rows.into_iter().map(|r| r.id).collect();
                found.sort();
                let mut want: Vec<String> = names
                    .iter()
                    .enumerate()
                    .filter(|(_, n)| **n == expected)
                    .map(|(i, _)| format!("d{i}"))
                    .collect();
                want.sort();
                prop_assert_eq!(found, want, "template {} with {:?}", template.source, value);
            }
            Ok(())
        })?;
    }
}
