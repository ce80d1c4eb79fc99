//! The rules of a mapping — a field's transformation and options ([`Field`], [`Rule`]) — and
//! their parsing from a `[processor.mapping.fields]` entry, each error naming its setting
//! (`mapping.fields.rate_class.map`). The settings errors' helpers ([`err`], [`under`]) serve
//! the other files of the module too.

use meshql_core::legacy_id::key_text;
use meshql_core::SettingError;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// The transformations a field may name.
pub const TRANSFORMATIONS: &[&str] = &[
    "copy",
    "title",
    "lower",
    "int",
    "number",
    "cents",
    "date",
    "datetime",
    "flag",
    "code",
    "concat",
    "add",
    "subtract",
    "reference",
    "lookup",
];

/// Where `YYYY`, `MM` and `DD` sit in a date format (character positions), and its separators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct DateFormat {
    len: usize,
    year: usize,
    month: usize,
    day: usize,
    literals: Vec<(usize, char)>,
}

impl DateFormat {
    fn parse(format: &str) -> Result<Self, String> {
        let chars: Vec<char> = format.chars().collect();
        let (mut year, mut month, mut day) = (None, None, None);
        let mut literals = Vec::new();
        let mut i = 0;
        let starts = |i: usize, token: &str| {
            token
                .chars()
                .enumerate()
                .all(|(k, t)| chars.get(i + k) == Some(&t))
        };
        while i < chars.len() {
            let (slot, width) = if starts(i, "YYYY") {
                (&mut year, 4)
            } else if starts(i, "MM") {
                (&mut month, 2)
            } else if starts(i, "DD") {
                (&mut day, 2)
            } else {
                if chars[i].is_alphabetic() {
                    return Err(format!(
                        "`{format}`: only YYYY, MM and DD, between separators that are not letters"
                    ));
                }
                literals.push((i, chars[i]));
                i += 1;
                continue;
            };
            if slot.replace(i).is_some() {
                return Err(format!(
                    "`{format}` places a part twice (YYYY, MM and DD once each)"
                ));
            }
            i += width;
        }
        match (year, month, day) {
            (Some(year), Some(month), Some(day)) => Ok(Self {
                len: chars.len(),
                year,
                month,
                day,
                literals,
            }),
            _ => Err(format!("`{format}` needs YYYY, MM and DD once each")),
        }
    }

    /// `YYYY-MM-DD`, or `None` when `text` does not have the format's length and separators.
    pub(super) fn read(&self, text: &str) -> Option<String> {
        let chars: Vec<char> = text.chars().collect();
        if chars.len() != self.len || self.literals.iter().any(|(i, c)| chars[*i] != *c) {
            return None;
        }
        let part = |at: usize, n: usize| chars[at..at + n].iter().collect::<String>();
        Some(format!(
            "{}-{}-{}",
            part(self.year, 4),
            part(self.month, 2),
            part(self.day, 2)
        ))
    }
}

/// What a code not in the map does.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Unknown {
    DeadLetter,
    Default(Value),
}

/// One transformation, compiled.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Rule {
    Copy(String),
    Title(String),
    Lower(String),
    Int(String),
    Number(String),
    Cents(String),
    Date(String, DateFormat),
    DateTime(String, Option<String>, DateFormat),
    Flag(String, String),
    Code {
        column: String,
        map: BTreeMap<String, Value>,
        unknown: Unknown,
    },
    Concat(Vec<Field>, String),
    Add(Vec<String>),
    Subtract(Vec<String>),
    Reference {
        table: String,
        key: Vec<KeyPart>,
    },
    Lookup {
        entity: String,
        id: Box<Field>,
        field: String,
        wait: std::time::Duration,
    },
}

impl Rule {
    /// The columns it names, each with the setting that names it (`at` and below).
    pub(super) fn columns(&self, at: &str, out: &mut Vec<(String, String)>) {
        let mut one = |c: &String| out.push((at.to_owned(), c.clone()));
        match self {
            Rule::Copy(c)
            | Rule::Title(c)
            | Rule::Lower(c)
            | Rule::Int(c)
            | Rule::Number(c)
            | Rule::Cents(c)
            | Rule::Date(c, _)
            | Rule::Flag(c, _)
            | Rule::Code { column: c, .. } => one(c),
            Rule::DateTime(d, t, _) => {
                one(d);
                if let Some(t) = t {
                    one(t);
                }
            }
            Rule::Add(cs) | Rule::Subtract(cs) => cs.iter().for_each(one),
            Rule::Reference { key, .. } => {
                for k in key {
                    if let KeyPart::Column(c) = k {
                        one(c);
                    }
                }
            }
            Rule::Concat(parts, _) => {
                for (i, p) in parts.iter().enumerate() {
                    p.rule.columns(&format!("{at}.concat[{i}]"), out);
                }
            }
            Rule::Lookup { id, .. } => id.rule.columns(&format!("{at}.id"), out),
        }
    }
}

/// One value of a `reference`'s key.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum KeyPart {
    /// A column of this row.
    Column(String),
    /// A constant (`{ value = "1000" }`).
    Value(String),
}

/// How long a `lookup` waits for its document by default.
const LOOKUP_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
/// The longest `wait_ms` a `lookup` may declare.
const LOOKUP_WAIT_MAX_MS: u64 = 600_000;

/// A field's transformation and options.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Field {
    pub(super) rule: Rule,
    pub(super) default: Option<Value>,
    pub(super) omit_empty: bool,
}

pub(super) fn err(field: impl Into<String>, message: impl Into<String>) -> SettingError {
    SettingError::new(field, message)
}

/// A settings error of a nested block, its field under `at`.
pub(super) fn under(at: &str, e: SettingError) -> SettingError {
    SettingError {
        field: Some(match e.field {
            Some(f) => format!("{at}.{f}"),
            None => at.to_owned(),
        }),
        message: e.message,
    }
}

/// The options a transformation takes besides `default` and `omit_empty`.
fn options_of(rule: &str) -> &'static [&'static str] {
    match rule {
        "date" | "datetime" => &["format"],
        "flag" => &["true_value"],
        "code" => &["map", "unknown"],
        "concat" => &["separator"],
        "reference" => &["key"],
        "lookup" => &["id", "field", "wait_ms"],
        _ => &[],
    }
}

const COMMON: &[&str] = &["default", "omit_empty"];

/// A column name.
pub(super) fn column(v: &Value, at: &str) -> Result<String, SettingError> {
    match v {
        Value::String(s) if !s.trim().is_empty() => Ok(s.clone()),
        _ => Err(err(at, "a column name (a non-empty string)")),
    }
}

/// A list of column names, at least `least`.
fn columns(v: &Value, at: &str, least: usize, what: &str) -> Result<Vec<String>, SettingError> {
    let Value::Array(items) = v else {
        return Err(err(at, format!("a list of column names ({what})")));
    };
    if items.len() < least {
        return Err(err(at, format!("name at least {least} column(s) ({what})")));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, c)| column(c, &format!("{at}[{i}]")))
        .collect()
}

fn string_option(
    decl: &Map<String, Value>,
    name: &str,
    at: &str,
) -> Result<Option<String>, SettingError> {
    match decl.get(name) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(err(format!("{at}.{name}"), "a string")),
    }
}

/// One field's declaration (`top`: an output field, not a part of `concat`).
pub(super) fn field(decl: &Value, at: &str, top: bool) -> Result<Field, SettingError> {
    let known = TRANSFORMATIONS.join(", ");
    let decl = match decl {
        Value::String(_) => {
            return Ok(Field {
                rule: Rule::Copy(column(decl, at)?),
                default: None,
                omit_empty: false,
            })
        }
        Value::Object(m) => m,
        _ => {
            return Err(err(
                at,
                format!("a column name, or a table with one transformation ({known})"),
            ))
        }
    };
    let all_options = [
        "format",
        "true_value",
        "map",
        "unknown",
        "separator",
        "key",
        "id",
        "field",
        "wait_ms",
    ];
    if let Some(k) = decl.keys().find(|k| {
        let k = k.as_str();
        !TRANSFORMATIONS.contains(&k) && !all_options.contains(&k) && !COMMON.contains(&k)
    }) {
        return Err(err(
            format!("{at}.{k}"),
            format!("unknown transformation `{k}` (known: {known})"),
        ));
    }
    let mut rules = decl
        .keys()
        .filter(|k| TRANSFORMATIONS.contains(&k.as_str()));
    let name = match (rules.next(), rules.next()) {
        (Some(name), None) => name.as_str(),
        (Some(a), Some(b)) => {
            return Err(err(
                at,
                format!("one transformation per field: `{a}` and `{b}` are two"),
            ))
        }
        (None, _) => return Err(err(at, format!("name a transformation: one of {known}"))),
    };
    let options = options_of(name);
    for k in decl.keys() {
        if k == name || options.contains(&k.as_str()) || COMMON.contains(&k.as_str()) {
            continue;
        }
        let takes: Vec<&str> = options.iter().chain(COMMON).copied().collect();
        return Err(err(
            format!("{at}.{k}"),
            format!(
                "`{k}` is not an option of `{name}` (it takes: {})",
                takes.join(", ")
            ),
        ));
    }
    let omit_empty = match decl.get("omit_empty") {
        None => false,
        Some(Value::Bool(b)) if top => *b,
        Some(_) if !top => {
            return Err(err(
                format!("{at}.omit_empty"),
                "a part of `concat` has no `omit_empty`: null and empty parts are left out",
            ))
        }
        Some(_) => return Err(err(format!("{at}.omit_empty"), "true or false")),
    };
    let default = decl.get("default").cloned();
    let arg = &decl[name];
    let here = format!("{at}.{name}");
    let format = || -> Result<DateFormat, SettingError> {
        let text = string_option(decl, "format", at)?.unwrap_or_else(|| "YYYYMMDD".into());
        DateFormat::parse(&text).map_err(|m| err(format!("{at}.format"), m))
    };
    let rule = match name {
        "copy" => Rule::Copy(column(arg, &here)?),
        "title" => Rule::Title(column(arg, &here)?),
        "lower" => Rule::Lower(column(arg, &here)?),
        "int" => Rule::Int(column(arg, &here)?),
        "number" => Rule::Number(column(arg, &here)?),
        "cents" => Rule::Cents(column(arg, &here)?),
        "date" => Rule::Date(column(arg, &here)?, format()?),
        "datetime" => {
            let cols = match arg {
                Value::String(_) => vec![column(arg, &here)?],
                _ => columns(arg, &here, 1, "the date column, then the time column")?,
            };
            if cols.len() > 2 {
                return Err(err(here, "at most two columns: the date, then the time"));
            }
            Rule::DateTime(cols[0].clone(), cols.get(1).cloned(), format()?)
        }
        "flag" => Rule::Flag(
            column(arg, &here)?,
            string_option(decl, "true_value", at)?.unwrap_or_else(|| "Y".into()),
        ),
        "code" => {
            let map = match decl.get("map") {
                Some(Value::Object(m)) if !m.is_empty() => {
                    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
                }
                Some(_) => return Err(err(
                    format!("{at}.map"),
                    "a table of codes and their values, at least one: `map = { A = \"active\" }`",
                )),
                None => {
                    return Err(err(
                        format!("{at}.map"),
                        "a code table needs its `map`: `map = { A = \"active\" }`",
                    ))
                }
            };
            let unknown = match decl.get("unknown") {
                None => Unknown::DeadLetter,
                Some(Value::String(s)) if s == "dead_letter" => Unknown::DeadLetter,
                Some(Value::Object(m)) if m.len() == 1 && m.contains_key("default") => {
                    Unknown::Default(m["default"].clone())
                }
                Some(_) => {
                    return Err(err(
                        format!("{at}.unknown"),
                        "what an unknown code does: \"dead_letter\" or `{ default = <value> }`",
                    ))
                }
            };
            Rule::Code {
                column: column(arg, &here)?,
                map,
                unknown,
            }
        }
        "concat" => {
            let Value::Array(parts) = arg else {
                return Err(err(
                    here,
                    "a list of parts: column names or transformations",
                ));
            };
            if parts.is_empty() {
                return Err(err(here, "name at least one part"));
            }
            let parts = parts
                .iter()
                .enumerate()
                .map(|(i, p)| field(p, &format!("{here}[{i}]"), false))
                .collect::<Result<Vec<_>, _>>()?;
            Rule::Concat(
                parts,
                string_option(decl, "separator", at)?.unwrap_or_default(),
            )
        }
        "add" => Rule::Add(columns(arg, &here, 2, "the operands")?),
        "subtract" => Rule::Subtract(columns(arg, &here, 2, "the first, minus the others")?),
        "reference" => {
            let Value::String(table) = arg else {
                return Err(err(here, "the table the foreign key refers to"));
            };
            if table.trim().is_empty() {
                return Err(err(here, "the table the foreign key refers to"));
            }
            let Some(key) = decl.get("key") else {
                return Err(err(
                    format!("{at}.key"),
                    "the columns of this row that hold the referred row's key",
                ));
            };
            Rule::Reference {
                table: table.clone(),
                key: key_parts(key, &format!("{at}.key"))?,
            }
        }
        "lookup" => {
            if !top {
                return Err(err(here, "a `lookup` is a field of its own, not a part"));
            }
            let Value::String(entity) = arg else {
                return Err(err(here, "the entity whose document it reads"));
            };
            if entity.trim().is_empty() {
                return Err(err(here, "the entity whose document it reads"));
            }
            let Some(id) = decl.get("id") else {
                return Err(err(
                    format!("{at}.id"),
                    "the document's id: a column or a transformation, e.g. \
                     `{ reference = \"zequi_hen\", key = [\"equnr\"] }`",
                ));
            };
            let id = field(id, &format!("{at}.id"), false)?;
            let Some(Value::String(of)) = decl.get("field") else {
                return Err(err(
                    format!("{at}.field"),
                    "the field of that document to take (a string)",
                ));
            };
            let wait = match decl.get("wait_ms") {
                None => LOOKUP_WAIT,
                Some(v) => match v.as_u64() {
                    Some(ms) if ms <= LOOKUP_WAIT_MAX_MS => std::time::Duration::from_millis(ms),
                    _ => {
                        return Err(err(
                            format!("{at}.wait_ms"),
                            format!(
                                "milliseconds the row may wait for the document, 0 to \
                                 {LOOKUP_WAIT_MAX_MS}"
                            ),
                        ))
                    }
                },
            };
            Rule::Lookup {
                entity: entity.clone(),
                id: Box::new(id),
                field: of.clone(),
                wait,
            }
        }
        _ => unreachable!("every transformation has its arm"),
    };
    Ok(Field {
        rule,
        default,
        omit_empty,
    })
}

/// A `reference`'s key: column names, or `{ value = "…" }` constants.
fn key_parts(v: &Value, at: &str) -> Result<Vec<KeyPart>, SettingError> {
    let what = "the referred row's key: column names or `{ value = \"…\" }` constants";
    let Value::Array(items) = v else {
        return Err(err(at, format!("a list ({what})")));
    };
    if items.is_empty() {
        return Err(err(at, format!("name at least 1 column ({what})")));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let here = format!("{at}[{i}]");
            match item {
                Value::Object(m) if m.len() == 1 && m.contains_key("value") => {
                    match key_text(&m["value"]) {
                        Some(t) if !t.trim().is_empty() => Ok(KeyPart::Value(t)),
                        _ => Err(err(here, "a constant key value: text, a number or a bool")),
                    }
                }
                _ => Ok(KeyPart::Column(column(item, &here)?)),
            }
        })
        .collect()
}
