//! `--acl`: what a mapping makes of each column — the guessed transformations, their review
//! comments and the clean field's JSON Schema and SDL type.

use super::fields::{enum_values, link_names, Field, Link};
use super::introspect::{Column, Kind, Table, SAMPLE_LIMIT};
use super::names::{self, clean, expand, toml_key, toml_str, unique, words};
use serde_json::{json, Value};

/// The last word of a column's name (lower case, unexpanded).
fn last_word(c: &Column) -> String {
    words(&c.name).pop().unwrap_or_default()
}

const CODE_WORDS: &[&str] = &["cd", "code", "type", "typ", "stat", "sts", "status"];
const FLAG_WORDS: &[&str] = &["flg", "flag", "ind"];
const DATE_WORDS: &[&str] = &["dt", "date"];
const AMOUNT_WORDS: &[&str] = &["amt", "amount"];

/// A column of the primary key or of a one-column unique constraint: its values are
/// identities, never codes to translate.
fn is_key(t: &Table, c: &Column) -> bool {
    t.primary_key.contains(&c.name) || t.uniques.iter().any(|u| *u == [c.name.clone()])
}

/// `--acl`: whether the generator reads the column's distinct values (a text column named
/// like a code or a one-character flag, without a CHECK constraint listing its values, and
/// not a key).
pub fn wants_sample(t: &Table, c: &Column) -> bool {
    if c.kind != Kind::Text || c.array || c.allowed.is_some() || c.generated || is_key(t, c) {
        return false;
    }
    let last = last_word(c);
    CODE_WORDS.contains(&last.as_str())
        || (c.max_length == Some(1) && FLAG_WORDS.contains(&last.as_str()))
}

/// One field of a mapping: its words, declaration, JSON Schema, SDL type and what was
/// guessed.
struct Guess {
    words: Vec<String>,
    rule: String,
    schema: Value,
    gql: String,
    review: Option<String>,
    /// The value is the column's text as it is.
    as_is: bool,
    /// The transformation never gives null (`flag`).
    never_null: bool,
}

/// Words without a trailing one of `drop` (when others remain).
fn without_last(mut w: Vec<String>, drop: &[&str]) -> Vec<String> {
    if w.len() > 1 && w.last().is_some_and(|l| drop.contains(&l.as_str())) {
        w.pop();
    }
    w
}

/// A code map declaration from codes (lower-cased as placeholder values).
fn code_map(col: &str, codes: &[String]) -> (String, Vec<String>) {
    let mut values: Vec<String> = Vec::new();
    let entries: Vec<String> = codes
        .iter()
        .map(|code| {
            let v = code.to_lowercase();
            if !values.contains(&v) {
                values.push(v.clone());
            }
            format!("{} = {}", toml_key(code), toml_str(&v))
        })
        .collect();
    (
        format!(
            "{{ code = {}, map = {{ {} }} }}",
            toml_str(col),
            entries.join(", ")
        ),
        values,
    )
}

/// `--acl`: how one column becomes a clean field (`key`: a column whose values are
/// identities, copied as they are).
fn guess(c: &Column, key: bool) -> Guess {
    let raw = words(&c.name);
    let w = expand(&raw);
    let last = last_word(c);
    let col = toml_str(&c.name);
    let what = format!("{} ({})", c.name, c.sql_type);
    let plain = |rule: &str, schema: Value, gql: &str| Guess {
        words: w.clone(),
        rule: format!("{{ {rule} = {col} }}"),
        schema,
        gql: gql.to_owned(),
        review: None,
        as_is: rule == "copy",
        never_null: false,
    };
    if c.array {
        // the snapshot (`to_jsonb`) sends an array, later changes PostgreSQL's text of it
        let mut g = plain(
            "copy",
            json!({"type": ["array", "string"], "$comment": c.sql_type.clone()}),
            "JSON",
        );
        g.review = Some(format!(
            "{what} arrives as a JSON array from the snapshot but as PostgreSQL's array text \
             (`{{a,b}}`) from later changes: copied as it comes"
        ));
        g.as_is = false;
        return g;
    }
    match &c.kind {
        Kind::Text => {
            if let Some(allowed) = c.allowed.as_ref().filter(|a| !a.numeric) {
                if key || allowed.values.iter().all(|v| *v == v.to_lowercase()) {
                    return plain(
                        "copy",
                        json!({"type": "string", "enum": allowed.values}),
                        "String",
                    );
                }
                let (rule, values) = code_map(&c.name, &allowed.values);
                return Guess {
                    words: without_last(w, &["code"]),
                    rule,
                    schema: json!({"type": "string", "enum": values}),
                    gql: "String".into(),
                    review: Some(format!(
                        "codes of {what} from CHECK constraint {}; each maps to itself in lower \
                         case: replace those placeholders with words",
                        allowed.constraint
                    )),
                    as_is: false,
                    never_null: false,
                };
            }
            if c.max_length == Some(8) && DATE_WORDS.contains(&last.as_str()) {
                let mut g = plain("date", json!({"type": "string"}), "String");
                g.review = Some(format!(
                    "a YYYYMMDD date guessed from {what}, a name ending in {}: it becomes \
                     YYYY-MM-DD (give `format` if the text is laid out otherwise)",
                    last.to_uppercase()
                ));
                return g;
            }
            if c.max_length == Some(1) && FLAG_WORDS.contains(&last.as_str()) {
                let sampled = match &c.sample {
                    Some(Ok(values)) => values.clone(),
                    _ => Vec::new(),
                };
                let has = |v: &str| sampled.iter().any(|s| s == v);
                let true_value = if has("Y") || sampled.is_empty() {
                    "Y"
                } else if has("T") {
                    "T"
                } else if has("1") {
                    "1"
                } else {
                    "Y"
                };
                let rule = if true_value == "Y" {
                    format!("{{ flag = {col} }}")
                } else {
                    format!("{{ flag = {col}, true_value = {} }}", toml_str(true_value))
                };
                let seen = if sampled.is_empty() {
                    String::new()
                } else {
                    format!(" (values in the table now: {})", sampled.join(", "))
                };
                return Guess {
                    words: without_last(w, &["flag", "indicator"]),
                    rule,
                    schema: json!({"type": "boolean"}),
                    gql: "Boolean".into(),
                    review: Some(format!(
                        "a flag guessed from {what}, a name ending in {}: `{true_value}` is true, \
                         anything else (null too) false{seen}",
                        last.to_uppercase()
                    )),
                    as_is: false,
                    never_null: true,
                };
            }
            if key {
                return copy_text(c, w);
            }
            if CODE_WORDS.contains(&last.as_str()) {
                let why = match &c.sample {
                    Some(Ok(values)) if !values.is_empty() && values.len() <= SAMPLE_LIMIT => {
                        let (rule, mapped) = code_map(&c.name, values);
                        return Guess {
                            words: without_last(w, &["code"]),
                            rule,
                            schema: json!({"type": "string", "enum": mapped}),
                            gql: "String".into(),
                            review: Some(format!(
                                "codes of {what} from the {} distinct value(s) in the table now \
                                 (SELECT DISTINCT); each maps to itself in lower case: replace \
                                 those placeholders with words; a code not listed makes its row \
                                 a dead letter",
                                values.len()
                            )),
                            as_is: false,
                            never_null: false,
                        };
                    }
                    Some(Ok(values)) if values.is_empty() => "no rows to read codes from",
                    Some(Ok(_)) => "more than 20 distinct values, not a code table",
                    Some(Err(_)) | None => "its values could not be read",
                };
                let mut g = copy_text(c, w);
                g.review = Some(format!(
                    "{what} is named like a code ({}) but {why}: copied",
                    last.to_uppercase()
                ));
                if let Some(Err(e)) = &c.sample {
                    g.review = g.review.map(|r| format!("{r} ({e})"));
                }
                return g;
            }
            if w.iter().any(|x| x == "name") {
                let mut g = plain("title", json!({"type": "string"}), "String");
                g.review = Some(format!(
                    "title case guessed for {what}, a name: `O'NEIL-SMITH` becomes \
                     `O'Neil-Smith`, `MCDONALD` `Mcdonald`"
                ));
                return g;
            }
            if w.iter().any(|x| x == "email") {
                let mut g = plain("lower", json!({"type": "string"}), "String");
                g.review = Some(format!("lower case guessed for {what}, an e-mail address"));
                return g;
            }
            copy_text(c, w)
        }
        Kind::Int(_) => {
            if let Some(allowed) = c.allowed.as_ref().filter(|a| a.numeric) {
                return plain(
                    "int",
                    json!({"type": "integer", "enum": enum_values(allowed, c)}),
                    "Int",
                );
            }
            if AMOUNT_WORDS.contains(&last.as_str()) {
                let mut g = plain("cents", json!({"type": "number"}), "Float");
                g.review = Some(format!(
                    "an amount in whole cents guessed from {what}, an integer named ending in \
                     {}: 9840 becomes 98.4 (use `int` if it is not cents)",
                    last.to_uppercase()
                ));
                return g;
            }
            plain("int", json!({"type": "integer"}), "Int")
        }
        Kind::Numeric | Kind::Float => plain("number", json!({"type": "number"}), "Float"),
        Kind::Bool => plain("copy", json!({"type": "boolean"}), "Boolean"),
        Kind::Date => plain(
            "copy",
            json!({"type": "string", "format": "date"}),
            "String",
        ),
        Kind::Time => plain("copy", json!({"type": "string"}), "String"),
        Kind::Timestamp { .. } => {
            let mut g = plain(
                "copy",
                json!({"type": "string", "$comment": c.sql_type.clone()}),
                "String",
            );
            g.review = Some(format!(
                "{what} arrives as text: `2025-06-01T12:00:00+00:00` from the snapshot, \
                 PostgreSQL's `2025-06-01 12:00:00+00` from later changes: copied as it comes"
            ));
            g
        }
        Kind::Uuid => plain("copy", json!({"type": "string", "format": "uuid"}), "ID"),
        Kind::Json => plain("copy", json!({"$comment": c.sql_type.clone()}), "JSON"),
        Kind::Enum(labels) => plain("copy", json!({"type": "string", "enum": labels}), "String"),
        Kind::Other(t) => {
            let mut g = plain(
                "copy",
                json!({"type": "string", "$comment": format!("PostgreSQL {t}, as text")}),
                "String",
            );
            g.review = Some(format!("{what}: copied as PostgreSQL's text"));
            g
        }
    }
}

fn copy_text(c: &Column, words: Vec<String>) -> Guess {
    let mut schema = json!({"type": "string"});
    if let Some(n) = c.max_length {
        schema["maxLength"] = json!(n);
    }
    Guess {
        words,
        rule: format!("{{ copy = {} }}", toml_str(&c.name)),
        schema,
        gql: "String".into(),
        review: None,
        as_is: true,
        never_null: false,
    }
}

/// With `, omit_empty = true` before the closing brace.
fn omitting_empty(rule: &str) -> String {
    match rule.strip_suffix(" }") {
        Some(head) => format!("{head}, omit_empty = true }}"),
        None => rule.to_owned(),
    }
}

/// The fields of an `--acl` entity: what its mapping makes of each column.
pub(super) fn acl_fields(
    t: &Table,
    own: &[usize],
    links: &mut [Link],
    entity_names: &[String],
    tables: &[Table],
) -> Vec<Field> {
    let mut fields: Vec<Field> = Vec::new();
    let taken = |fields: &[Field], n: &str| n == "id" || fields.iter().any(|f| f.name == n);
    let single_int_key = match t.primary_key.as_slice() {
        [k] => t
            .column(k)
            .filter(|c| matches!(c.kind, Kind::Int(_)) && !c.array)
            .map(|c| c.name.clone()),
        _ => None,
    };
    for c in &t.columns {
        if c.generated {
            continue;
        }
        if single_int_key.as_deref() == Some(c.name.as_str()) {
            let base = format!("legacy_{}", clean(&c.name));
            let name = unique(&base, "_", |n| taken(&fields, n));
            fields.push(Field {
                name,
                schema: json!({"type": "integer"}),
                gql: "Int".into(),
                required: true,
                column: None,
                mapping: Some(format!("{{ int = {} }}", toml_str(&c.name))),
                review: None,
            });
        }
        for &l in own {
            let fk = &t.foreign_keys[links[l].fk];
            if fk.columns.first() != Some(&c.name) {
                continue;
            }
            let parent = &tables[links[l].parent];
            let (base, role) = link_names(t, &links[l], &entity_names[links[l].parent], true);
            let name = unique(&base, "_", |n| taken(&fields, n));
            let keys: Vec<String> = links[l].key.iter().map(|k| toml_str(k)).collect();
            fields.push(Field {
                name: name.clone(),
                schema: json!({"type": "string"}),
                gql: "ID".into(),
                required: fk
                    .columns
                    .iter()
                    .all(|col| t.column(col).is_some_and(|c| c.not_null)),
                column: None,
                mapping: Some(format!(
                    "{{ reference = {}, key = [{}], omit_empty = true }}",
                    toml_str(&parent.label()),
                    keys.join(", ")
                )),
                review: None,
            });
            links[l].field = name;
            links[l].role = role;
        }
        if single_int_key.as_deref() == Some(c.name.as_str()) {
            continue;
        }
        let linked = own.iter().any(|&l| {
            let fk = &t.foreign_keys[links[l].fk];
            fk.columns.contains(&c.name) && !t.primary_key.contains(&c.name)
        }) || own.iter().any(|&l| {
            let fk = &t.foreign_keys[links[l].fk];
            fk.columns == [c.name.clone()]
        });
        if linked {
            continue;
        }
        let mut g = guess(c, is_key(t, c));
        // a foreign key this init cannot follow (its table is not generated, or it refers
        // to a unique key rather than the primary key)
        if let Some(fk) = t.foreign_keys.iter().find(|fk| {
            fk.columns.contains(&c.name)
                && !own.iter().any(|&l| t.foreign_keys[links[l].fk] == **fk)
        }) {
            let note = format!(
                "{} is part of foreign key {} to {}, which is not generated or not by its \
                 primary key: copied, no resolver",
                c.name, fk.name, fk.ref_table
            );
            g.review = Some(match g.review {
                Some(r) => format!("{r}; {note}"),
                None => note,
            });
        }
        let base = match names::snake(&g.words) {
            n if n == "id" => "legacy_id".to_owned(),
            n => n,
        };
        let name = unique(&base, "_", |n| taken(&fields, n));
        let nullable = !c.not_null && !g.never_null;
        fields.push(Field {
            name,
            schema: g.schema,
            gql: g.gql,
            required: c.not_null,
            column: g.as_is.then(|| c.name.clone()),
            mapping: Some(if nullable {
                omitting_empty(&g.rule)
            } else {
                g.rule
            }),
            review: g.review,
        });
    }
    fields
}
