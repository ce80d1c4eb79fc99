//! A statement's parameters: where each comes from (compiled once per statement), and the
//! values one execution binds (resolved per request, converted by each store to its
//! driver's values).

use meshql_core::template::{render, ListValue, Piece};
use meshql_core::{ArgValue, BoundArgs, Millis};
use serde_json::Value;

/// Where a statement's parameter comes from, in order of appearance (its placeholder's
/// number, where the dialect numbers them).
#[derive(Debug, Clone)]
pub enum Param {
    /// A query argument (`as_text`: it stood in quotes in a SQL fragment).
    Arg { name: String, as_text: bool },
    /// A literal from a template.
    Literal(Value),
    /// A string with placeholders, rendered with the arguments.
    Render(Vec<Piece>),
    /// The time bound of an `at` read.
    At,
    /// The caller's tokens.
    Tokens,
    /// A batch's keys.
    Keys,
    /// How many rows at most.
    Limit,
    /// An operator's operand, a template value bound with the arguments, as `kind`.
    Operand(OperandKind, ArgValue),
    /// A list operand (`$in`, `$nin`).
    List(ListValue),
}

/// Where a dialect's conditions take their operands from (the statement being compiled):
/// an operand of `kind` for the value `v` — a parameter, a relationship's key, or the
/// dialect's form of an unbound argument.
pub trait Operand {
    fn operand(&mut self, v: &meshql_core::ArgValue, kind: OperandKind) -> String;
}

/// How an operand is bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OperandKind {
    /// The value as the dialect's scalars are bound ([`Scalars`]).
    Value,
    /// Its comparable type class: `'n'` (number), `'s'` (string), else NULL.
    Class,
    /// Its text when it is a number, else NULL.
    Num,
    /// The string, else NULL.
    Str,
    /// The text a JSON scalar reads as (`->>`, `JSON_UNQUOTE`), NULL for null.
    Text,
    /// The string, else the text of any other value (NULL for null).
    Pattern,
}

/// Which optional clauses a search statement has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Shape {
    /// Read as of a moment.
    pub at: bool,
    /// Filtered by the caller's tokens.
    pub tokens: bool,
    /// With a bound LIMIT (only where the dialect limits in SQL).
    pub limit: bool,
    /// A batched lookup: rows for several keys of a relationship.
    pub batch: bool,
}

/// A statement text and its parameter sources.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub sql: String,
    pub params: Vec<Param>,
}

/// How a dialect binds scalar arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scalars {
    /// As SQLite's `json_extract` returns a JSON value: integers, reals, text (booleans as
    /// 0/1), or text when it stood in quotes in a SQL fragment.
    Typed,
    /// As the text of the JSON value (`->>`, `JSON_UNQUOTE`), NULL for null.
    Text,
}

/// How a dialect binds lists (tokens, keys, `$in` operands).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lists {
    /// One JSON array text.
    JsonText,
    /// A text array.
    TextArray,
}

/// How a dialect binds its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindStyle {
    pub scalars: Scalars,
    pub lists: Lists,
}

/// A list one execution binds besides its arguments, as the caller holds it.
#[derive(Debug, Clone, Copy)]
pub enum ListArg<'a> {
    /// A JSON array text.
    Json(&'a str),
    /// The items.
    Items(&'a [String]),
}

/// What one execution binds besides its template's own literals.
#[derive(Debug, Clone, Copy)]
pub struct Binding<'a> {
    pub args: &'a BoundArgs,
    pub at: Option<Millis>,
    pub tokens: Option<ListArg<'a>>,
    pub keys: Option<ListArg<'a>>,
    pub limit: Option<usize>,
}

/// A value to bind, whatever the driver; each store converts it to its driver's.
#[derive(Debug, Clone, PartialEq)]
pub enum Bound {
    Null,
    Int(i64),
    UInt(u64),
    Real(f64),
    Text(String),
    TextList(Vec<String>),
}

impl From<Option<String>> for Bound {
    fn from(v: Option<String>) -> Self {
        v.map_or(Bound::Null, Bound::Text)
    }
}

/// Every parameter of `c` for one execution, converted by `to` (one allocation: the
/// result).
pub fn bind<V>(
    style: BindStyle,
    c: &Compiled,
    b: &Binding<'_>,
    mut to: impl FnMut(Bound) -> V,
) -> Vec<V> {
    let list = |l: Option<ListArg<'_>>| match (l, style.lists) {
        (Some(ListArg::Json(s)), _) => Bound::Text(s.to_owned()),
        (Some(ListArg::Items(items)), _) => Bound::TextList(items.to_vec()),
        (None, Lists::JsonText) => Bound::Text("[]".to_owned()),
        (None, Lists::TextArray) => Bound::TextList(Vec::new()),
    };
    let scalar = |v: &Value, as_text: bool| match style.scalars {
        Scalars::Typed => typed(v, as_text),
        Scalars::Text => as_text_of(v).into(),
    };
    c.params
        .iter()
        .map(|p| {
            to(match p {
                Param::Arg { name, as_text } => {
                    scalar(b.args.get(name).unwrap_or(&Value::Null), *as_text)
                }
                Param::Literal(v) => scalar(v, false),
                Param::Render(pieces) => Bound::Text(render(pieces, b.args)),
                Param::At => Bound::Int(b.at.unwrap_or(Millis::MAX)),
                Param::Tokens => list(b.tokens),
                Param::Keys => list(b.keys),
                Param::Limit => Bound::UInt(b.limit.unwrap_or(usize::MAX) as u64),
                Param::Operand(kind, v) => operand(style, *kind, v.bind(b.args)),
                Param::List(l) => {
                    let items = l.bind(b.args);
                    match (style.lists, style.scalars) {
                        (Lists::JsonText, Scalars::Typed) => {
                            Bound::Text(Value::Array(items).to_string())
                        }
                        (Lists::JsonText, Scalars::Text) => Bound::Text(
                            Value::Array(
                                items
                                    .into_iter()
                                    .filter_map(text_of)
                                    .map(Value::String)
                                    .collect(),
                            )
                            .to_string(),
                        ),
                        (Lists::TextArray, _) => {
                            Bound::TextList(items.into_iter().filter_map(text_of).collect())
                        }
                    }
                }
            })
        })
        .collect()
}

/// An operand bound with the arguments, as `kind`.
fn operand(style: BindStyle, kind: OperandKind, v: Value) -> Bound {
    match (kind, v) {
        (OperandKind::Value, v) => match style.scalars {
            Scalars::Typed => typed_owned(v),
            Scalars::Text => text_of(v).into(),
        },
        (OperandKind::Class, Value::Number(_)) => Bound::Text("n".into()),
        (OperandKind::Class, Value::String(_)) => Bound::Text("s".into()),
        (OperandKind::Num, Value::Number(n)) => Bound::Text(n.to_string()),
        (OperandKind::Str | OperandKind::Pattern, Value::String(s)) => Bound::Text(s),
        (OperandKind::Text | OperandKind::Pattern, v) => text_of(v).into(),
        (OperandKind::Class | OperandKind::Num | OperandKind::Str, _) => Bound::Null,
    }
}

/// A JSON scalar as the text `->>` / `JSON_UNQUOTE` yields for it (`None` for null:
/// matches nothing).
pub fn as_text_of(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// [`as_text_of`], taking the value.
fn text_of(v: Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s),
        other => as_text_of(&other),
    }
}

/// A JSON value as SQLite's `json_extract` returns it, for comparisons (`as_text`: as text,
/// where it stood in quotes in a SQL fragment).
pub fn typed(value: &Value, as_text: bool) -> Bound {
    match value {
        Value::Null => Bound::Null,
        Value::Bool(b) if as_text => Bound::Text(b.to_string()),
        Value::Bool(b) => Bound::Int(*b as i64),
        Value::Number(n) if as_text => Bound::Text(n.to_string()),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Bound::Int(i),
            None => Bound::Real(n.as_f64().unwrap_or(0.0)),
        },
        Value::String(s) => Bound::Text(s.clone()),
        other => Bound::Text(other.to_string()),
    }
}

/// [`typed`], taking the value (not as text).
fn typed_owned(value: Value) -> Bound {
    match value {
        Value::String(s) => Bound::Text(s),
        other => typed(&other, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SQLITE: BindStyle = BindStyle {
        scalars: Scalars::Typed,
        lists: Lists::JsonText,
    };
    const POSTGRES: BindStyle = BindStyle {
        scalars: Scalars::Text,
        lists: Lists::TextArray,
    };

    #[test]
    fn operands_bind_by_kind() {
        let v = |v: Value| ArgValue::Literal(v);
        let params = vec![
            Param::Operand(OperandKind::Value, v(json!(true))),
            Param::Operand(OperandKind::Class, v(json!(2.5))),
            Param::Operand(OperandKind::Num, v(json!("5"))),
            Param::Operand(OperandKind::Str, v(json!("5"))),
            Param::Operand(OperandKind::Pattern, v(json!(5))),
            Param::Operand(OperandKind::Text, v(Value::Null)),
            Param::List(ListValue::Items(vec![
                v(json!(1)),
                v(json!("a")),
                v(Value::Null),
            ])),
            Param::Limit,
        ];
        let c = Compiled {
            sql: String::new(),
            params,
        };
        let args = BoundArgs::new();
        let b = Binding {
            args: &args,
            at: None,
            tokens: None,
            keys: None,
            limit: None,
        };
        assert_eq!(
            bind(SQLITE, &c, &b, |v| v),
            vec![
                Bound::Int(1),
                Bound::Text("n".into()),
                Bound::Null,
                Bound::Text("5".into()),
                Bound::Text("5".into()),
                Bound::Null,
                Bound::Text(r#"[1,"a"]"#.into()),
                Bound::UInt(u64::MAX),
            ]
        );
        assert_eq!(bind(POSTGRES, &c, &b, |v| v)[0], Bound::Text("true".into()));
        assert_eq!(
            bind(POSTGRES, &c, &b, |v| v)[6],
            Bound::TextList(vec!["1".into(), "a".into()])
        );
    }
}
