//! Query templates: how a GraphQL root query's arguments select documents.
//!
//! Two forms are accepted, both parsed once at start-up:
//!
//! * **Filter** (Mongo-style JSON, every backend): `{"id": "{{id}}"}`,
//!   `{"payload.farm_id": "{{id}}"}`, `{}` for all documents. Each key is `id` or
//!   `payload.<dotted.path>`; each value is a literal, a whole placeholder `"{{arg}}"`
//!   (bound to the argument's JSON value), or a string with placeholders inside
//!   (`"zone-{{zone}}"`, bound as the rendered string). Keys combine with AND.
//! * **Sql** (raw SQL fragments, SQL backends, for configs written for MeshQL's Java/TS
//!   servers): `id = '{{id}}'`, `json_extract(payload, '$.farm_id') = '{{id}}'`. Placeholders
//!   are never spliced into the SQL text: `'{{x}}'` becomes a bound parameter, and a string
//!   literal with a placeholder inside becomes a concatenation of literals and parameters.
//!
//! Templates are evaluated against the latest visible version of each document
//! ("latest, then filter"), see the storage contract.

use serde_json::{Map, Value};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use thiserror::Error;

/// Arguments of a query, by name (GraphQL argument values as JSON).
pub type BoundArgs = Map<String, Value>;

#[derive(Debug, Error, PartialEq)]
pub enum TemplateError {
    #[error("template is not a JSON object: {0}")]
    NotAnObject(String),
    #[error("unsupported template key `{0}`: use `id` or `payload.<field>`")]
    UnsupportedKey(String),
    #[error("unsupported template value for `{key}`: {reason}")]
    UnsupportedValue { key: String, reason: String },
    #[error("unterminated placeholder in `{0}`")]
    Unterminated(String),
    #[error("unterminated string literal in SQL fragment `{0}`")]
    UnterminatedLiteral(String),
}

/// Where a filter looks in a document.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum FieldPath {
    /// The envelope id.
    Id,
    /// A (possibly nested) payload field: `payload.a.b` is `["a", "b"]`.
    Payload(Vec<String>),
}

impl FieldPath {
    /// The SQL/JSON path of a payload field, e.g. `$.farm_id`; `None` for the envelope id.
    pub fn json_path(&self) -> Option<String> {
        match self {
            FieldPath::Id => None,
            FieldPath::Payload(segments) => {
                let mut path = String::from("$");
                for s in segments {
                    path.push('.');
                    path.push_str(s);
                }
                Some(path)
            }
        }
    }

    /// Looks the field up in a payload map.
    pub fn lookup<'a>(&self, id: &'a str, payload: &'a Map<String, Value>) -> Option<Value> {
        match self {
            FieldPath::Id => Some(Value::String(id.to_owned())),
            FieldPath::Payload(segments) => {
                let mut cur = payload.get(segments.first()?)?;
                for s in &segments[1..] {
                    cur = cur.as_object()?.get(s)?;
                }
                Some(cur.clone())
            }
        }
    }
}

/// One piece of a string with placeholders.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Text(String),
    Arg(String),
}

/// The right-hand side of a filter predicate.
#[derive(Debug, Clone, PartialEq)]
pub enum ArgValue {
    /// `"{{name}}"`: the argument's JSON value.
    Arg(String),
    /// A fixed JSON value.
    Literal(Value),
    /// A string with placeholders inside, rendered with the arguments.
    Interpolated(Vec<Piece>),
}

impl ArgValue {
    /// The value to compare against, given the query's arguments. Missing arguments are
    /// `Null`, which matches nothing.
    pub fn bind(&self, args: &BoundArgs) -> Value {
        match self {
            ArgValue::Arg(name) => args.get(name).cloned().unwrap_or(Value::Null),
            ArgValue::Literal(v) => v.clone(),
            ArgValue::Interpolated(pieces) => Value::String(render(pieces, args)),
        }
    }
}

/// Renders pieces with the arguments (strings as they are, other values as JSON).
pub fn render(pieces: &[Piece], args: &BoundArgs) -> String {
    let mut out = String::new();
    for p in pieces {
        match p {
            Piece::Text(t) => out.push_str(t),
            Piece::Arg(name) => match args.get(name) {
                Some(Value::String(s)) => out.push_str(s),
                Some(Value::Null) | None => {}
                Some(other) => out.push_str(&other.to_string()),
            },
        }
    }
    out
}

/// One piece of a raw SQL fragment.
#[derive(Debug, Clone, PartialEq)]
pub enum SqlPiece {
    /// SQL text, copied as it is.
    Text(String),
    /// A bound parameter holding the argument's value (as text when it stands in quotes).
    Param { arg: String, as_text: bool },
}

static NEXT_TEMPLATE_ID: AtomicU64 = AtomicU64::new(1);

/// A parsed query template.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryTemplate {
    /// Unique per parsed template: backends key compiled statements by it.
    pub id: u64,
    /// The text as written in the config.
    pub source: String,
    pub kind: TemplateKind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum TemplateKind {
    /// Conjunction of equality predicates (empty = all documents).
    Filter(Vec<(FieldPath, ArgValue)>),
    /// A raw SQL boolean expression over the columns `id` and `payload`.
    Sql(Vec<SqlPiece>),
}

impl QueryTemplate {
    /// Parses a Mongo-style JSON filter template.
    pub fn filter(source: &str) -> Result<Self, TemplateError> {
        let value: Value =
            serde_json::from_str(source).map_err(|e| TemplateError::NotAnObject(e.to_string()))?;
        let Value::Object(map) = value else {
            return Err(TemplateError::NotAnObject(source.to_owned()));
        };
        let mut predicates = Vec::with_capacity(map.len());
        for (key, value) in map {
            let path = if key == "id" {
                FieldPath::Id
            } else if let Some(rest) = key.strip_prefix("payload.") {
                if rest.is_empty() || rest.split('.').any(|s| s.is_empty() || !is_ident(s)) {
                    return Err(TemplateError::UnsupportedKey(key));
                }
                FieldPath::Payload(rest.split('.').map(str::to_owned).collect())
            } else {
                return Err(TemplateError::UnsupportedKey(key));
            };
            let arg = match value {
                Value::String(s) => {
                    let pieces = parse_pieces(&s)?;
                    match pieces.as_slice() {
                        [Piece::Arg(name)] => ArgValue::Arg(name.clone()),
                        [] => ArgValue::Literal(Value::String(String::new())),
                        [Piece::Text(t)] => ArgValue::Literal(Value::String(t.clone())),
                        _ => ArgValue::Interpolated(pieces),
                    }
                }
                Value::Object(_) | Value::Array(_) => {
                    return Err(TemplateError::UnsupportedValue {
                        key,
                        reason: "operators and arrays are not supported; use equality".into(),
                    })
                }
                other => ArgValue::Literal(other),
            };
            predicates.push((path, arg));
        }
        Ok(Self::new(source, TemplateKind::Filter(predicates)))
    }

    /// Parses a raw SQL fragment template.
    pub fn sql(source: &str) -> Result<Self, TemplateError> {
        Ok(Self::new(source, TemplateKind::Sql(parse_sql(source)?)))
    }

    fn new(source: &str, kind: TemplateKind) -> Self {
        Self {
            id: NEXT_TEMPLATE_ID.fetch_add(1, Ordering::Relaxed),
            source: source.to_owned(),
            kind,
        }
    }

    /// Every argument name the template refers to.
    pub fn placeholders(&self) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        match &self.kind {
            TemplateKind::Filter(preds) => {
                for (_, v) in preds {
                    match v {
                        ArgValue::Arg(n) => {
                            names.insert(n.clone());
                        }
                        ArgValue::Interpolated(pieces) => {
                            for p in pieces {
                                if let Piece::Arg(n) = p {
                                    names.insert(n.clone());
                                }
                            }
                        }
                        ArgValue::Literal(_) => {}
                    }
                }
            }
            TemplateKind::Sql(pieces) => {
                for p in pieces {
                    if let SqlPiece::Param { arg, .. } = p {
                        names.insert(arg.clone());
                    }
                }
            }
        }
        names
    }

    /// The payload fields this template filters on (backends index them).
    pub fn filtered_paths(&self) -> Vec<FieldPath> {
        match &self.kind {
            TemplateKind::Filter(preds) => preds
                .iter()
                .filter(|(p, _)| *p != FieldPath::Id)
                .map(|(p, _)| p.clone())
                .collect(),
            TemplateKind::Sql(pieces) => sql_json_paths(pieces),
        }
    }

    /// Evaluates a filter template against one document (used by in-memory evaluation and
    /// by backends without a query language). SQL templates cannot be evaluated here.
    pub fn matches(&self, args: &BoundArgs, id: &str, payload: &Map<String, Value>) -> bool {
        match &self.kind {
            TemplateKind::Filter(preds) => preds.iter().all(|(path, arg)| {
                let expected = arg.bind(args);
                !expected.is_null() && path.lookup(id, payload).as_ref() == Some(&expected)
            }),
            TemplateKind::Sql(_) => false,
        }
    }
}

fn is_ident(s: &str) -> bool {
    s.chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Splits `a{{x}}b` into pieces. `{{{x}}}` (Handlebars' unescaped form) is accepted too.
fn parse_pieces(s: &str) -> Result<Vec<Piece>, TemplateError> {
    let mut pieces = Vec::new();
    let mut rest = s;
    while let Some(start) = rest.find("{{") {
        if start > 0 {
            pieces.push(Piece::Text(rest[..start].to_owned()));
        }
        let after = &rest[start + 2..];
        let (triple, after) = match after.strip_prefix('{') {
            Some(a) => (true, a),
            None => (false, after),
        };
        let close = if triple { "}}}" } else { "}}" };
        let end = after
            .find(close)
            .ok_or_else(|| TemplateError::Unterminated(s.to_owned()))?;
        let name = after[..end].trim();
        if name.is_empty() || !is_ident(name) {
            return Err(TemplateError::Unterminated(s.to_owned()));
        }
        pieces.push(Piece::Arg(name.to_owned()));
        rest = &after[end + close.len()..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest.to_owned()));
    }
    Ok(pieces)
}

/// Parses a SQL fragment: placeholders inside string literals become parameters joined to
/// the literal's other text with `||`; bare placeholders become parameters.
fn parse_sql(source: &str) -> Result<Vec<SqlPiece>, TemplateError> {
    let mut out: Vec<SqlPiece> = Vec::new();
    let push_text = |out: &mut Vec<SqlPiece>, t: &str| {
        if t.is_empty() {
            return;
        }
        if let Some(SqlPiece::Text(prev)) = out.last_mut() {
            prev.push_str(t);
        } else {
            out.push(SqlPiece::Text(t.to_owned()));
        }
    };
    let bytes = source.as_bytes();
    let mut i = 0;
    let mut text_start = 0;
    while i < bytes.len() {
        if bytes[i] == b'\'' {
            // find the end of the literal ('' is an escaped quote)
            let lit_start = i;
            let mut j = i + 1;
            loop {
                if j >= bytes.len() {
                    return Err(TemplateError::UnterminatedLiteral(source.to_owned()));
                }
                if bytes[j] == b'\'' {
                    if j + 1 < bytes.len() && bytes[j + 1] == b'\'' {
                        j += 2;
                        continue;
                    }
                    break;
                }
                j += 1;
            }
            let inner = &source[lit_start + 1..j];
            if inner.contains("{{") {
                push_text(&mut out, &source[text_start..lit_start]);
                let pieces = parse_pieces(inner)?;
                let parts: Vec<SqlPiece> = pieces
                    .into_iter()
                    .map(|p| match p {
                        Piece::Text(t) => SqlPiece::Text(format!("'{t}'")),
                        Piece::Arg(arg) => SqlPiece::Param { arg, as_text: true },
                    })
                    .collect();
                let multi = parts.len() > 1;
                if multi {
                    push_text(&mut out, "(");
                }
                for (k, part) in parts.into_iter().enumerate() {
                    if k > 0 {
                        push_text(&mut out, " || ");
                    }
                    match part {
                        SqlPiece::Text(t) => push_text(&mut out, &t),
                        p => out.push(p),
                    }
                }
                if multi {
                    push_text(&mut out, ")");
                }
                text_start = j + 1;
            }
            i = j + 1;
        } else if bytes[i..].starts_with(b"{{") {
            push_text(&mut out, &source[text_start..i]);
            let rest = &source[i..];
            let pieces = parse_pieces(rest)?;
            let Some(Piece::Arg(arg)) = pieces.first() else {
                return Err(TemplateError::Unterminated(source.to_owned()));
            };
            let triple = rest.starts_with("{{{");
            let end = rest
                .find(if triple { "}}}" } else { "}}" })
                .ok_or_else(|| TemplateError::Unterminated(source.to_owned()))?;
            out.push(SqlPiece::Param {
                arg: arg.clone(),
                as_text: false,
            });
            i += end + if triple { 3 } else { 2 };
            text_start = i;
        } else {
            i += 1;
        }
    }
    push_text(&mut out, &source[text_start..]);
    Ok(out)
}

/// JSON paths that a SQL fragment extracts (`json_extract(payload, '$.x')`, `payload->>'x'`),
/// so that backends can index them.
fn sql_json_paths(pieces: &[SqlPiece]) -> Vec<FieldPath> {
    let mut paths = Vec::new();
    for p in pieces {
        let SqlPiece::Text(t) = p else { continue };
        let mut rest = t.as_str();
        while let Some(pos) = rest.find("'$.") {
            let after = &rest[pos + 3..];
            if let Some(end) = after.find('\'') {
                let path = &after[..end];
                if !path.is_empty() && path.split('.').all(|s| !s.is_empty() && is_ident(s)) {
                    let fp = FieldPath::Payload(path.split('.').map(str::to_owned).collect());
                    if !paths.contains(&fp) {
                        paths.push(fp);
                    }
                }
                rest = &after[end..];
            } else {
                break;
            }
        }
    }
    paths
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn args(v: Value) -> BoundArgs {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn filter_templates_parse() {
        let t = QueryTemplate::filter(r#"{"payload.farm_id": "{{id}}"}"#).unwrap();
        assert_eq!(
            t.kind,
            TemplateKind::Filter(vec![(
                FieldPath::Payload(vec!["farm_id".into()]),
                ArgValue::Arg("id".into())
            )])
        );
        assert_eq!(t.placeholders().into_iter().collect::<Vec<_>>(), ["id"]);
        assert_eq!(
            t.filtered_paths()[0].json_path().as_deref(),
            Some("$.farm_id")
        );
        let all = QueryTemplate::filter("{}").unwrap();
        assert_eq!(all.kind, TemplateKind::Filter(vec![]));
        let id = QueryTemplate::filter(r#"{"id":"{{id}}"}"#).unwrap();
        assert!(id.filtered_paths().is_empty());
    }

    #[test]
    fn filter_templates_reject_what_they_cannot_do() {
        assert!(matches!(
            QueryTemplate::filter(r#"{"name": "x"}"#),
            Err(TemplateError::UnsupportedKey(_))
        ));
        assert!(matches!(
            QueryTemplate::filter(r#"{"payload.a": {"$gt": 1}}"#),
            Err(TemplateError::UnsupportedValue { .. })
        ));
        assert!(matches!(
            QueryTemplate::filter(r#"["x"]"#),
            Err(TemplateError::NotAnObject(_))
        ));
        assert!(matches!(
            QueryTemplate::filter(r#"{"id": "{{id"}"#),
            Err(TemplateError::Unterminated(_))
        ));
    }

    #[test]
    fn filter_templates_match_documents() {
        let t = QueryTemplate::filter(r#"{"payload.zone": "{{zone}}", "payload.kind": "z-{{k}}"}"#)
            .unwrap();
        let doc = args(json!({"zone": "north", "kind": "z-1"}));
        assert!(t.matches(&args(json!({"zone": "north", "k": 1})), "x", &doc));
        assert!(!t.matches(&args(json!({"zone": "south", "k": 1})), "x", &doc));
        assert!(!t.matches(&args(json!({})), "x", &doc));
    }

    #[test]
    fn sql_fragments_become_parameters() {
        let t = QueryTemplate::sql("json_extract(payload, '$.farm_id') = '{{id}}'").unwrap();
        assert_eq!(
            t.kind,
            TemplateKind::Sql(vec![
                SqlPiece::Text("json_extract(payload, '$.farm_id') = ".into()),
                SqlPiece::Param {
                    arg: "id".into(),
                    as_text: true
                },
            ])
        );
        assert_eq!(
            t.filtered_paths(),
            vec![FieldPath::Payload(vec!["farm_id".into()])]
        );
        let t = QueryTemplate::sql("name LIKE '%{{n}}%' AND x = {{y}} AND q = 'it''s'").unwrap();
        assert_eq!(
            t.kind,
            TemplateKind::Sql(vec![
                SqlPiece::Text("name LIKE ('%' || ".into()),
                SqlPiece::Param {
                    arg: "n".into(),
                    as_text: true
                },
                SqlPiece::Text(" || '%') AND x = ".into()),
                SqlPiece::Param {
                    arg: "y".into(),
                    as_text: false
                },
                SqlPiece::Text(" AND q = 'it''s'".into()),
            ])
        );
        assert!(QueryTemplate::sql("a = 'open").is_err());
        // multi-byte characters around placeholders
        let t = QueryTemplate::sql("\"größe\" = {{x}} AND name = 'é{{y}}ü'").unwrap();
        assert_eq!(t.placeholders().len(), 2);
    }
}
