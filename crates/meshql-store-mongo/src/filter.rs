//! Filters: meshql's query templates (`meshql_core::template`, with their arguments bound)
//! and token filters compiled to MongoDB filter documents, and the in-process re-check of a
//! version against one ([`Matcher`]).

use crate::document::{json_to_bson, payload_text};
use meshql_core::template::{CmpOp, Cond, TemplateKind};
use meshql_core::{BoundArgs, FieldPath, QueryTemplate, StoreError, TokenFilter};
use mongodb::bson::{doc, Bson, Document};

pub(crate) fn path_key(path: &FieldPath) -> String {
    match path {
        FieldPath::Id => "id".into(),
        FieldPath::Payload(s) => format!("payload.{}", s.join(".")),
    }
}

pub(crate) fn token_filter(filter: &TokenFilter) -> Option<Document> {
    match filter {
        TokenFilter::All => None,
        TokenFilter::AnyOf(t) => Some(doc! {"$or": [
            {"authorized_tokens": {"$size": 0}},
            {"authorized_tokens": {"$in": t.clone()}},
        ]}),
    }
}

/// The filter of a template with its arguments bound (`prefix` addresses the fields,
/// e.g. `doc.` after a `$group`).
pub(crate) fn template_filter(
    template: &QueryTemplate,
    args: &BoundArgs,
    prefix: &str,
) -> Result<Document, StoreError> {
    let preds = match &template.kind {
        TemplateKind::Filter(preds) => preds,
        TemplateKind::Query(spec) => {
            // every condition in one `$and`: two operators on one field stay two conditions
            let conds: Vec<Bson> = spec
                .conds
                .iter()
                .map(|c| Bson::Document(cond_filter(c, args, prefix)))
                .collect();
            return Ok(if conds.is_empty() {
                Document::new()
            } else {
                doc! {"$and": conds}
            });
        }
        TemplateKind::Sql(_) => {
            return Err(StoreError::Invalid(format!(
                "SQL fragment `{}` needs a SQL backend; MongoDB takes JSON templates",
                template.source
            )))
        }
    };
    let mut d = Document::new();
    for (path, value) in preds {
        let v = value.bind(args);
        // a missing argument matches nothing
        let v = if v.is_null() {
            Bson::Document(doc! {"$in": []})
        } else {
            json_to_bson(&v)
        };
        d.insert(format!("{prefix}{}", path_key(path)), v);
    }
    Ok(d)
}

/// A filter that matches nothing.
fn nothing() -> Bson {
    Bson::Document(doc! {"$in": []})
}

/// One condition of an operator template as a MongoDB filter (semantics:
/// `meshql_core::template::Cond`; where Mongo's own differ — `$ne` of null, comparisons
/// with a value that is not a number or a string — the filter says what meshql means).
fn cond_filter(cond: &Cond, args: &BoundArgs, prefix: &str) -> Document {
    use serde_json::Value;
    let key = |path: &FieldPath| format!("{prefix}{}", path_key(path));
    match cond {
        Cond::Cmp { path, op, value } => {
            let v = value.bind(args);
            let test = match (op, &v) {
                (CmpOp::Eq, Value::Null) => nothing(),
                (CmpOp::Eq, v) => json_to_bson(v),
                (CmpOp::Ne, Value::Null) => return Document::new(),
                (CmpOp::Ne, v) => Bson::Document(doc! {"$ne": json_to_bson(v)}),
                (op, v @ (Value::Number(_) | Value::String(_))) => {
                    Bson::Document(doc! {op.mongo(): json_to_bson(v)})
                }
                _ => nothing(),
            };
            doc! {key(path): test}
        }
        Cond::In { path, list, negate } => {
            let items: Vec<Bson> = list.bind(args).iter().map(json_to_bson).collect();
            doc! {key(path): {if *negate { "$nin" } else { "$in" }: items}}
        }
        Cond::Regex {
            path,
            pattern,
            ignore_case,
        } => match pattern.bind(args) {
            Value::String(p) => doc! {key(path): {
                "$regex": p,
                "$options": if *ignore_case { "i" } else { "" },
            }},
            _ => doc! {key(path): nothing()},
        },
        Cond::Exists { path, exists } => match path {
            FieldPath::Id if *exists => Document::new(),
            _ => doc! {key(path): {"$exists": *exists}},
        },
        Cond::And(cs) | Cond::Or(cs) => {
            let parts: Vec<Bson> = cs
                .iter()
                .map(|c| Bson::Document(cond_filter(c, args, prefix)))
                .collect();
            doc! {if matches!(cond, Cond::And(_)) { "$and" } else { "$or" }: parts}
        }
    }
}

/// Evaluates a filter built by [`template_filter`] (equalities and `$in`) on a version.
fn matches_doc(version: &Document, filter: &Document) -> bool {
    filter.iter().all(|(key, expected)| {
        let mut cur: Option<&Bson> = None;
        for (i, seg) in key.split('.').enumerate() {
            cur = if i == 0 {
                version.get(seg)
            } else {
                cur.and_then(Bson::as_document).and_then(|d| d.get(seg))
            };
        }
        match (expected, cur) {
            (Bson::Document(op), Some(actual)) if op.contains_key("$in") => op
                .get_array("$in")
                .map(|vals| vals.iter().any(|v| v == actual))
                .unwrap_or(false),
            (Bson::Document(op), None) if op.contains_key("$in") => false,
            (e, Some(actual)) => e == actual,
            (_, None) => false,
        }
    })
}

/// How the `at` path re-checks a version's newest state in process: the equality filter
/// document itself, or an operator template evaluated on the payload.
pub(crate) enum Matcher<'a> {
    Filter,
    Template(&'a QueryTemplate, &'a BoundArgs),
}

impl<'a> Matcher<'a> {
    pub(crate) fn of(template: &'a QueryTemplate, args: &'a BoundArgs) -> Self {
        match template.kind {
            TemplateKind::Query(_) => Matcher::Template(template, args),
            _ => Matcher::Filter,
        }
    }

    pub(crate) fn matches(&self, version: &Document, filter: &Document) -> bool {
        match self {
            Matcher::Filter => matches_doc(version, filter),
            Matcher::Template(t, args) => {
                let id = version.get_str("id").unwrap_or_default();
                let payload: serde_json::Map<String, serde_json::Value> = payload_text(version)
                    .ok()
                    .and_then(|p| serde_json::from_str(&p).ok())
                    .unwrap_or_default();
                t.matches(args, id, &payload)
            }
        }
    }
}
