//! Declarative anti-corruption mappings (`type = "mapping"`): one legacy table's rows become
//! one clean entity's documents, declared field by field rather than coded.
//!
//! A mapping is a [`Transform`], so it runs in the
//! [`TransformPlanner`](crate::transform::TransformPlanner) like `rust` and `script`
//! processors: lanes by key, dead letters, and the output committed with the input's position
//! (exactly once). The rows come from a `source` (`postgres_cdc`, Debezium's envelope on
//! Kafka, …) as [`Input`]s whose `entity` is the table's name and whose `payload` is the row:
//! column name → JSON value. A number may arrive as JSON (`9840`: Debezium, `postgres_cdc`'s
//! integer columns) or as text (`"9840"`: a `VARCHAR` column, `numeric` in some feeds, a
//! text-only feed); every transformation below accepts both. What a declaration cannot express
//! belongs in a `rust` or `script` processor ([`crate::transform`]).
//!
//! # The legacy `customer` (CONTRACT §14.2.3)
//!
//! ```toml
//! [[processor]]
//! name = "customers"
//! type = "mapping"
//! inputs = ["cust_acct"]           # the tables whose rows it reads
//! output = "customer"              # the clean entity it writes
//! source = { type = "postgres_cdc", url = "${LEGACY_URL}", publication = "meshql_legacy", tables = ["cust_acct"] }
//! # or Debezium's envelope from Kafka:
//! # source = { type = "kafka", brokers = "localhost:9092", topics = ["legacy.public.cust_acct"] }
//! # optional, as for `rust` and `script` processors: batch, parallel, key, enabled
//!
//! [processor.mapping]
//! table = "cust_acct"              # one of `inputs` (may be left out when there is one input)
//! key = ["acct_id"]                # the table's primary key columns
//!
//! [processor.mapping.fields]
//! legacy_acct_id = { int = "acct_id" }
//! account_number = "acct_num"
//! first_name = { title = "cust_nm_first" }
//! last_name = { title = "cust_nm_last" }
//! address = { concat = [{ title = "addr_ln1" }, { title = "addr_ln2" }], separator = ", ", omit_empty = true }
//! city = { title = "addr_city", omit_empty = true }
//! state = { copy = "addr_st", omit_empty = true }
//! zip = { copy = "addr_zip", omit_empty = true }
//! phone = { copy = "phone_num", omit_empty = true }
//! email = { lower = "email_addr", omit_empty = true }
//! rate_class = { code = "rt_cd", map = { RES = "residential", COM = "commercial", IND = "industrial" } }
//! service_type = { code = "svc_type", map = { E = "electric", G = "gas", B = "both" } }
//! status = { code = "stat_cd", map = { A = "active", S = "suspended", C = "closed" } }
//! connected_date = { date = "conn_dt", omit_empty = true }
//! disconnected_date = { date = "disc_dt", omit_empty = true }
//! budget_billing = { flag = "budget_flg" }
//! paperless = { flag = "paperless_flg" }
//! ```
//!
//! A child's foreign key is computed from its own columns, so it equals the parent's id
//! whichever row arrives first: `customer_id = { reference = "cust_acct", key = ["acct_id"],
//! omit_empty = true }` in the `mtr_rdng`, `bill_hdr` and `pymt_hist` mappings.
//!
//! # Documents and ids
//!
//! - The document's id is [`legacy_id`]`(table, key values)`: a UUIDv5 in the namespace
//!   [`LEGACY_NAMESPACE`] of the JSON text `["<table>","<key 1>",…]` (the table in lower case,
//!   each key value as [`key_text`] writes it, no spaces: `["cust_acct","1"]`). An insert and
//!   every later update of a row write versions of one document, and a replay rewrites the same
//!   ones.
//! - **Key values are compared as text**: a JSON number is its decimal digits (`1`, and `1.0`
//!   too, give `"1"`), a string its text without trailing spaces (`CHAR(n)` pads with them), a
//!   boolean `true` / `false`. So `pgoutput`'s `"1"` and Debezium's `1` give one id, and so do a
//!   `CHAR(10)` key and the `VARCHAR` column that refers to it. Text is never read as a number:
//!   `"007"` and `"7"` stay two keys (a `VARCHAR` key may hold both). A null, missing, object or
//!   array key value is an error (a dead letter).
//! - Create and update → the document (`Emit { id: Some(id), payload: Some(doc) }`); delete →
//!   its tombstone (`payload: None`), the id computed from the key columns of the deleted row
//!   (only those are read). A row whose key changes arrives as a delete of the old key and a
//!   create of the new one (Debezium does so; a source must do the same).
//! - Changes of an input other than `table` (compared without regard to ASCII case) lead to
//!   nothing.
//! - Unless the processor sets `key` (the payload field its lanes follow, see
//!   [`crate::transform`]), it is the first key column, so one row's changes keep their order
//!   under `parallel > 1`.
//!
//! # Fields
//!
//! Each entry of `[processor.mapping.fields]` is an output field: a column name (a copy under a
//! new name), or an inline table with exactly one transformation and its options.
//!
//! | Transformation | Result |
//! |---|---|
//! | `"col"`, `{ copy = "col" }` | the value as it is (text without its trailing spaces) |
//! | `{ title = "col" }` | §14.2.3's `title`: lower-cased, then the first character and each one after a space, `-` or `'` upper-cased: `O'NEIL-SMITH` → `O'Neil-Smith`, `1ST` → `1st`, `MCDONALD` → `Mcdonald` |
//! | `{ lower = "col" }` | lower-cased text |
//! | `{ int = "col" }` | a JSON integer, from a number or numeric text (`"9840"`, `"12.0"`); a fraction or non-numeric text is an error |
//! | `{ number = "col" }` | a JSON number from a number or numeric text (`"12.5"` → `12.5`, `"7"` → `7`) |
//! | `{ cents = "col" }` | a whole number of cents as a decimal amount: `9840` → `98.4`, `42000` → `420.0` (a JSON float) |
//! | `{ date = "col", format = "YYYYMMDD" }` | `YYYY-MM-DD`. `format` (default `YYYYMMDD`) places `YYYY`, `MM` and `DD` once each among separators that are not letters (`DD.MM.YYYY`, `MM/DD/YYYY`); text of another length, or whose separators differ, is null. As §14.2.3's `date`, the digits are taken by position and not checked |
//! | `{ datetime = ["date_col", "time_col"], format = "YYYYMMDD" }` | §14.3's `ts`: `YYYY-MM-DDTHH:MM:SSZ` from a date as `date` reads it and an `HHMMSS` time; a time that is not 6 characters (null included), or no time column, is `00:00:00`; a null date is null |
//! | `{ flag = "col", true_value = "Y" }` | `true` when the text is `true_value` (default `"Y"`), else `false` — null too |
//! | `{ code = "col", map = { A = "active", … }, unknown = … }` | the map's value for the code (the text of the column: an integer column's `1` is the code `"1"`). A code not in the map: `unknown = "dead_letter"` (the default) makes the row a dead letter naming the field, column and code; `unknown = { default = X }` gives X |
//! | `{ concat = [part, …], separator = ", " }` | the parts' texts joined with `separator` (default `""`), the null and empty ones left out (so `title(LN1) + ", " + title(LN2)` only when LN2 is set); null when every part is. A part is a column name or a transformation (`{ title = "addr_ln1" }`) |
//! | `{ add = ["a", "b", …] }`, `{ subtract = ["a", "b", …] }` | the sum; the first minus the others. Integers when every operand is one, else a float; null when any operand is null |
//! | `{ reference = "table", key = ["col", …] }` | a computed foreign key: the id [`legacy_id`] gives the row of `table` whose key is these columns' values in this row; null when any of them is null or empty. A key item may be a constant instead of a column: `key = ["mandt", { value = "1000" }]` |
//! | `{ lookup = "entity", id = <column or transformation>, field = "f", wait_ms = 30000 }` | the field `f` of the current document `id` of the clean `entity` (written by another processor, or through the API): what the row does not hold but its parent's clean document does — §14.3's lay report takes its hen's `coop_id` with `id = { reference = "zequi_hen", key = ["mandt", "equnr"] }`. A document that does not exist yet is waited for, up to `wait_ms` (default 30,000, at most 600,000; the batch waits with it, so the rows keep their order), then the row is a dead letter naming it; a null id gives null. The value is read when the row is processed: a later change of the parent does not change documents already written. A field of its own (not a part of `concat`, nor a lookup's `id`) |
//!
//! Options every field takes:
//! - `default = X`: the field's value when the transformation's result is null.
//! - `omit_empty = true`: leave the field out when its value (after `default`) is null or `""`.
//!
//! **Nulls.** A column that is null or absent from the row makes the transformation's result
//! null (`flag` excepted: `false`), so the field is written as `null`, unless `default` or
//! `omit_empty` says otherwise. Blank text (only spaces) counts as null for the numeric
//! transformations (`int`, `number`, `cents`, `add`, `subtract`) and for `reference`. Column
//! names match exactly, else without regard to ASCII case (`ACCT_ID` finds `acct_id`). A
//! misspelt column therefore reads as null, not as an error (the legacy schema is not known
//! when the config is checked). An update that leaves a column out reads it as null too:
//! PostgreSQL logs an unchanged large (TOASTed) value only under `REPLICA IDENTITY FULL`, so
//! give tables with such columns that identity.
//!
//! **Text.** Every text value is read without its trailing spaces (`CHAR(n)` columns pad with
//! them); leading spaces are kept. A number read as text is its digits as in key values.
//!
//! **Errors** (the row becomes a dead letter with the message, and the processor goes on): a key
//! column that is null or missing; a value that is not numeric where a number is needed, or not
//! whole where an integer is (`int`, `cents`); an unknown code under `unknown = "dead_letter"`;
//! an object or array where text is needed. Each names the field, the column and the value.
//!
//! **Checked with the config** (each error names its field, e.g.
//! `mapping.fields.rate_class.map`): the output entity exists and has each field (when its JSON
//! Schema lists properties); `id` is not a field; `table` is one of `inputs`; without a `source`,
//! the inputs are entities of the service; `key` and every `reference`'s `key` name at least one
//! column; every transformation is known (the message lists them) and takes the options given;
//! `code` has a non-empty `map`; a date `format` has `YYYY`, `MM` and `DD` once each; a
//! `lookup`'s entity exists and has its `field`. Against the output's JSON Schema, where its
//! property declares them: the JSON type a transformation makes (`flag` a boolean, `int` an
//! integer, `cents` and `number` a number, the text ones a string), and each value of a code
//! table, its `unknown` default and a field's `default` against the property's `type` and
//! `enum` (`copy`, `lookup`, `add` and `subtract` make what the data holds, so they are not
//! checked). Across the config's mappings: a `reference` to a table another mapping reads gives
//! as many key values as that mapping's `key` has (else its ids could never match). `meshql
//! check` also asks the legacy database, when it can reach it, whether every column a mapping
//! names exists.

use crate::plan::Input;
use crate::transform::{DerivedIds, Emit, Found, Read, Transform, TransformSpec, MAX_PARALLEL};
use crate::EntityInfo;
pub use meshql_core::legacy_id::{key_text, legacy_id, LEGACY_NAMESPACE};
use meshql_core::{parse_settings, ChangeOp, SettingError};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

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

/// CONTRACT §14.2.3's `title`: lower-case `s`, then upper-case its first character and each
/// character after a space, `-` or `'` (a digit stays as it is: `1ST` → `1st`). A character
/// whose capital is more than one character (`ß`) is kept.
pub fn title(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut upper = true;
    for c in s.to_lowercase().chars() {
        if upper {
            let mut caps = c.to_uppercase();
            match (caps.next(), caps.next()) {
                (Some(u), None) => out.push(u),
                _ => out.push(c),
            }
        } else {
            out.push(c);
        }
        upper = matches!(c, ' ' | '-' | '\'');
    }
    out
}

/// Where `YYYY`, `MM` and `DD` sit in a date format (character positions), and its separators.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DateFormat {
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
    fn read(&self, text: &str) -> Option<String> {
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
enum Unknown {
    DeadLetter,
    Default(Value),
}

/// One transformation, compiled.
#[derive(Debug, Clone, PartialEq)]
enum Rule {
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
    fn columns(&self, at: &str, out: &mut Vec<(String, String)>) {
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
enum KeyPart {
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
struct Field {
    rule: Rule,
    default: Option<Value>,
    omit_empty: bool,
}

/// A checked mapping: the [`Transform`] of a `type = "mapping"` processor.
#[derive(Debug, Clone, PartialEq)]
pub struct Mapping {
    table: String,
    key: Vec<String>,
    fields: Vec<(String, Field)>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    inputs: Vec<String>,
    output: String,
    #[serde(default)]
    batch: Option<usize>,
    #[serde(default)]
    parallel: Option<usize>,
    #[serde(default)]
    key: Option<String>,
    #[serde(default = "yes")]
    enabled: bool,
    mapping: Map<String, Value>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MappingSettings {
    table: String,
    key: Vec<String>,
    fields: Map<String, Value>,
}

fn err(field: impl Into<String>, message: impl Into<String>) -> SettingError {
    SettingError::new(field, message)
}

/// A settings error of a nested block, its field under `at`.
fn under(at: &str, e: SettingError) -> SettingError {
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
fn column(v: &Value, at: &str) -> Result<String, SettingError> {
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
fn field(decl: &Value, at: &str, top: bool) -> Result<Field, SettingError> {
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

/// The JSON type a transformation makes (`None`: whatever the column holds).
fn made_type(rule: &Rule) -> Option<&'static str> {
    match rule {
        Rule::Title(_)
        | Rule::Lower(_)
        | Rule::Date(..)
        | Rule::DateTime(..)
        | Rule::Concat(..)
        | Rule::Reference { .. } => Some("string"),
        Rule::Int(_) => Some("integer"),
        Rule::Number(_) | Rule::Cents(_) => Some("number"),
        Rule::Flag(..) => Some("boolean"),
        // `add` and `subtract` make an integer of integers, a number otherwise
        Rule::Copy(_)
        | Rule::Code { .. }
        | Rule::Lookup { .. }
        | Rule::Add(_)
        | Rule::Subtract(_) => None,
    }
}

/// `word` with its indefinite article.
fn a(word: &str) -> String {
    if word.starts_with(['a', 'e', 'i', 'o', 'u']) {
        format!("an {word}")
    } else {
        format!("a {word}")
    }
}

/// The JSON type of a value, as JSON Schema names it.
fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Whether a value of JSON type `t` fits a property's `type` (absent: anything).
fn type_fits(t: &str, prop: &Value) -> Result<(), String> {
    let allowed: Vec<&str> = match prop.get("type") {
        Some(Value::String(s)) => vec![s.as_str()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => return Ok(()),
    };
    if allowed.contains(&t) || (t == "integer" && allowed.contains(&"number")) {
        Ok(())
    } else {
        Err(allowed.join(" or "))
    }
}

/// Checks what field `f` writes against the output's JSON Schema property `prop`: the type
/// its transformation makes, and a code table's values (and a `default`) against the type and
/// any `enum`.
fn fits_schema(
    f: &Field,
    prop: &Value,
    at: &str,
    entity: &str,
    name: &str,
) -> Result<(), SettingError> {
    let schema_says =
        |what: String| format!("entity `{entity}`'s JSON Schema makes `{name}` {what}");
    if let Some(t) = made_type(&f.rule) {
        if let Err(allowed) = type_fits(t, prop) {
            return Err(err(
                at,
                schema_says(format!(
                    "{}, but this transformation makes {}",
                    a(&allowed),
                    a(t)
                )),
            ));
        }
    }
    let value_fits = |v: &Value, here: String, what: &str| -> Result<(), SettingError> {
        if let Err(allowed) = type_fits(type_of(v), prop) {
            return Err(err(
                here,
                schema_says(format!(
                    "{}, but {what} {v} is {}",
                    a(&allowed),
                    a(type_of(v))
                )),
            ));
        }
        if let Some(Value::Array(choices)) = prop.get("enum") {
            if !choices.contains(v) {
                let listed: Vec<String> = choices.iter().map(Value::to_string).collect();
                return Err(err(
                    here,
                    schema_says(format!(
                        "one of {}, but {what} {v} is not",
                        listed.join(", ")
                    )),
                ));
            }
        }
        Ok(())
    };
    if let Rule::Code { map, unknown, .. } = &f.rule {
        for (code, v) in map {
            value_fits(v, format!("{at}.map"), &format!("code {code}'s value"))?;
        }
        if let Unknown::Default(v) = unknown {
            value_fits(v, format!("{at}.unknown"), "the default")?;
        }
    }
    if let Some(d) = &f.default {
        value_fits(d, format!("{at}.default"), "the default")?;
    }
    Ok(())
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

impl Mapping {
    /// Checks a `[processor.mapping]` block (`table`, `key`, `fields`) against the output
    /// entity and, for `lookup`s, the service's `entities`; errors name their field under
    /// `mapping.`.
    pub fn new(
        block: &Value,
        output: &EntityInfo,
        entities: &[EntityInfo],
    ) -> Result<Self, SettingError> {
        let s: MappingSettings = parse_settings(block).map_err(|e| under("mapping", e))?;
        if s.table.trim().is_empty() {
            return Err(err("mapping.table", "name the legacy table"));
        }
        if s.key.is_empty() {
            return Err(err(
                "mapping.key",
                "name the table's primary key column(s): the document's id is derived from them",
            ));
        }
        let mut key = Vec::new();
        for (i, k) in s.key.iter().enumerate() {
            let k = column(&Value::String(k.clone()), &format!("mapping.key[{i}]"))?;
            if key.contains(&k) {
                return Err(err(format!("mapping.key[{i}]"), format!("`{k}` twice")));
            }
            key.push(k);
        }
        if s.fields.is_empty() {
            return Err(err("mapping.fields", "map at least one field"));
        }
        let mut fields = Vec::new();
        for (name, decl) in &s.fields {
            let at = format!("mapping.fields.{name}");
            if name == "id" {
                return Err(err(
                    at,
                    "the id is derived from the table and `key`, not mapped",
                ));
            }
            if let Some(known) = &output.fields {
                if !known.iter().any(|f| f == name) {
                    return Err(err(
                        at,
                        format!(
                            "entity `{}` has no field `{name}` (its JSON Schema has: {})",
                            output.name,
                            known.join(", ")
                        ),
                    ));
                }
            }
            let f = field(decl, &at, true)?;
            if let Rule::Lookup {
                entity, field: of, ..
            } = &f.rule
            {
                let Some(target) = entities.iter().find(|e| e.name == *entity) else {
                    let names: Vec<&str> = entities.iter().map(|e| e.name.as_str()).collect();
                    return Err(err(
                        format!("{at}.lookup"),
                        format!(
                            "unknown entity `{entity}` (this config has: {})",
                            names.join(", ")
                        ),
                    ));
                };
                if let Some(known) = &target.fields {
                    if of != "id" && !known.iter().any(|k| k == of) {
                        return Err(err(
                            format!("{at}.field"),
                            format!(
                                "entity `{entity}` has no field `{of}` (its JSON Schema has: {})",
                                known.join(", ")
                            ),
                        ));
                    }
                }
            }
            if let Some(prop) = output.properties.as_ref().and_then(|p| p.get(name)) {
                fits_schema(&f, prop, &at, &output.name, name)?;
            }
            fields.push((name.clone(), f));
        }
        Ok(Self {
            table: s.table,
            key,
            fields,
        })
    }

    /// Each `reference` it makes: the setting that declares it (`mapping.fields.farm_id`),
    /// the table it refers to and how many key values it gives.
    pub fn references(&self) -> Vec<(String, String, usize)> {
        fn walk(rule: &Rule, at: String, out: &mut Vec<(String, String, usize)>) {
            match rule {
                Rule::Reference { table, key } => out.push((at, table.clone(), key.len())),
                Rule::Concat(parts, _) => {
                    for (i, p) in parts.iter().enumerate() {
                        walk(&p.rule, format!("{at}.concat[{i}]"), out);
                    }
                }
                Rule::Lookup { id, .. } => walk(&id.rule, format!("{at}.id"), out),
                _ => {}
            }
        }
        let mut out = Vec::new();
        for (name, f) in &self.fields {
            walk(&f.rule, format!("mapping.fields.{name}"), &mut out);
        }
        out
    }

    /// The legacy table it reads.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The table's key columns.
    pub fn key(&self) -> &[String] {
        &self.key
    }

    /// The clean id of `row` (an error when a key column is null or missing).
    pub fn id_of(&self, row: &Map<String, Value>) -> Result<String, String> {
        let mut values = Vec::with_capacity(self.key.len());
        for k in &self.key {
            match get(row, k) {
                Some(v @ (Value::String(_) | Value::Number(_) | Value::Bool(_))) => values.push(v),
                Some(v) => {
                    return Err(format!(
                        "key column `{k}` of `{}` is {v}, not a key value",
                        self.table
                    ))
                }
                None => {
                    return Err(format!(
                        "key column `{k}` of `{}` is null or missing",
                        self.table
                    ))
                }
            }
        }
        Ok(legacy_id(&self.table, &values).expect("key values are scalars"))
    }

    /// The clean document of `row` (a `lookup` finds nothing: see [`Mapping::document_with`]).
    pub fn document(&self, row: &Map<String, Value>) -> Result<Map<String, Value>, String> {
        self.document_with(row, None)
    }

    /// The clean document of `row` (`found`: the documents its `lookup`s read, see
    /// [`Transform::reads`]).
    pub fn document_with(
        &self,
        row: &Map<String, Value>,
        found: Option<&Found>,
    ) -> Result<Map<String, Value>, String> {
        let mut doc = Map::new();
        for (name, f) in &self.fields {
            let v = match &f.rule {
                Rule::Lookup {
                    entity,
                    id,
                    field,
                    wait,
                } => {
                    let v = match value(id, name, row)? {
                        Value::Null => Value::Null,
                        id => {
                            let id = key_text(&id).ok_or_else(|| {
                                format!("field `{name}`: the lookup's id is {id}, not text")
                            })?;
                            match found.and_then(|f| f.get(entity, &id)) {
                                Some(_) if field == "id" => Value::String(id),
                                Some(doc) => doc.get(field).cloned().unwrap_or(Value::Null),
                                None => {
                                    return Err(format!(
                                        "field `{name}`: `{entity}` {id} does not exist \
                                         (waited {} ms for it)",
                                        wait.as_millis()
                                    ))
                                }
                            }
                        }
                    };
                    match (&v, &f.default) {
                        (Value::Null, Some(d)) => d.clone(),
                        _ => v,
                    }
                }
                _ => value(f, name, row)?,
            };
            if f.omit_empty && (v.is_null() || v.as_str() == Some("")) {
                continue;
            }
            doc.insert(name.clone(), v);
        }
        Ok(doc)
    }
}

impl Transform for Mapping {
    fn transform(&self, input: &Input) -> Result<Vec<Emit>, String> {
        self.transform_with(input, &Found::default())
    }

    fn legacy_columns(&self) -> Option<(String, Vec<(String, String)>)> {
        let mut named = Vec::new();
        for (i, k) in self.key.iter().enumerate() {
            named.push((format!("mapping.key[{i}]"), k.clone()));
        }
        for (name, f) in &self.fields {
            f.rule
                .columns(&format!("mapping.fields.{name}"), &mut named);
        }
        Some((self.table.clone(), named))
    }

    fn derived_ids(&self) -> Option<DerivedIds> {
        Some(DerivedIds {
            table: self.table.clone(),
            key: self.key.clone(),
            references: self.references(),
        })
    }

    fn read_entities(&self) -> Vec<String> {
        let mut entities: Vec<String> = Vec::new();
        for (_, f) in &self.fields {
            if let Rule::Lookup { entity, .. } = &f.rule {
                if !entities.contains(entity) {
                    entities.push(entity.clone());
                }
            }
        }
        entities
    }

    fn reads(&self, input: &Input) -> Vec<Read> {
        if input.op == ChangeOp::Delete || !input.entity.eq_ignore_ascii_case(&self.table) {
            return Vec::new();
        }
        let mut reads = Vec::new();
        for (name, f) in &self.fields {
            if let Rule::Lookup {
                entity, id, wait, ..
            } = &f.rule
            {
                // an id that cannot be computed fails in `transform_with`, with its reason
                if let Some(id) = value(id, name, &input.payload)
                    .ok()
                    .as_ref()
                    .and_then(key_text)
                {
                    reads.push(Read {
                        entity: entity.clone(),
                        id,
                        wait: *wait,
                    });
                }
            }
        }
        reads
    }

    fn transform_with(&self, input: &Input, found: &Found) -> Result<Vec<Emit>, String> {
        if !input.entity.eq_ignore_ascii_case(&self.table) {
            return Ok(Vec::new());
        }
        let id = Some(self.id_of(&input.payload)?);
        let payload = match input.op {
            ChangeOp::Delete => None,
            ChangeOp::Create | ChangeOp::Update => {
                Some(self.document_with(&input.payload, Some(found))?)
            }
        };
        Ok(vec![Emit { id, payload }])
    }
}

/// A column's value (`None`: null or absent): its exact name, else without regard to ASCII
/// case.
fn get<'a>(row: &'a Map<String, Value>, column: &str) -> Option<&'a Value> {
    row.get(column)
        .or_else(|| {
            row.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(column))
                .map(|(_, v)| v)
        })
        .filter(|v| !v.is_null())
}

/// A value as text (`None`: null).
fn text(v: &Value, field: &str, column: &str) -> Result<String, String> {
    key_text(v).ok_or_else(|| format!("field `{field}`: column `{column}` is {v}, not text"))
}

fn column_text(
    row: &Map<String, Value>,
    field: &str,
    column: &str,
) -> Result<Option<String>, String> {
    get(row, column).map(|v| text(v, field, column)).transpose()
}

/// A number read from a column.
#[derive(Debug, Clone, Copy)]
enum Num {
    Int(i64),
    Float(f64),
}

/// A column's number (`None`: null, absent or blank text).
fn num(row: &Map<String, Value>, field: &str, column: &str) -> Result<Option<Num>, String> {
    let bad = |v: &Value| format!("field `{field}`: column `{column}` is {v}, not a number");
    let Some(v) = get(row, column) else {
        return Ok(None);
    };
    match v {
        Value::Number(n) => Ok(Some(match n.as_i64() {
            Some(i) => Num::Int(i),
            None => Num::Float(n.as_f64().ok_or_else(|| bad(v))?),
        })),
        Value::String(s) => {
            let t = s.trim();
            if t.is_empty() {
                return Ok(None);
            }
            if let Ok(i) = t.parse::<i64>() {
                return Ok(Some(Num::Int(i)));
            }
            match t.parse::<f64>() {
                Ok(f) if f.is_finite() => Ok(Some(Num::Float(f))),
                _ => Err(bad(v)),
            }
        }
        _ => Err(bad(v)),
    }
}

/// A column's integer (`None`: null, absent or blank).
fn int(row: &Map<String, Value>, field: &str, column: &str) -> Result<Option<i64>, String> {
    match num(row, field, column)? {
        None => Ok(None),
        Some(Num::Int(i)) => Ok(Some(i)),
        Some(Num::Float(f)) if f.fract() == 0.0 && f.abs() < 9.0e15 => Ok(Some(f as i64)),
        Some(Num::Float(_)) => Err(format!(
            "field `{field}`: column `{column}` is {}, not a whole number",
            get(row, column).expect("a value was read")
        )),
    }
}

fn float(f: f64) -> Value {
    serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)
}

/// `add` and `subtract`.
fn arithmetic(
    row: &Map<String, Value>,
    field: &str,
    columns: &[String],
    negate_rest: bool,
) -> Result<Value, String> {
    let mut nums = Vec::with_capacity(columns.len());
    for c in columns {
        match num(row, field, c)? {
            Some(n) => nums.push(n),
            None => return Ok(Value::Null),
        }
    }
    let sign = |i: usize| if negate_rest && i > 0 { -1 } else { 1 };
    let ints: Option<Vec<i64>> = nums
        .iter()
        .map(|n| match n {
            Num::Int(i) => Some(*i),
            Num::Float(_) => None,
        })
        .collect();
    if let Some(ints) = ints {
        let mut total: i64 = 0;
        for (i, n) in ints.iter().enumerate() {
            total = n
                .checked_mul(sign(i))
                .and_then(|n| total.checked_add(n))
                .ok_or_else(|| format!("field `{field}`: the result overflows a 64-bit integer"))?;
        }
        return Ok(Value::from(total));
    }
    let total: f64 = nums
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let f = match n {
                Num::Int(i) => *i as f64,
                Num::Float(f) => *f,
            };
            f * sign(i) as f64
        })
        .sum();
    Ok(float(total))
}

/// A field's value after `default` (null when there is none and the result is null).
fn value(f: &Field, name: &str, row: &Map<String, Value>) -> Result<Value, String> {
    let v = rule_value(&f.rule, name, row)?;
    Ok(match (&v, &f.default) {
        (Value::Null, Some(d)) => d.clone(),
        _ => v,
    })
}

fn rule_value(rule: &Rule, name: &str, row: &Map<String, Value>) -> Result<Value, String> {
    let as_string = |t: Option<String>| t.map_or(Value::Null, Value::String);
    Ok(match rule {
        Rule::Copy(c) => match get(row, c) {
            Some(Value::String(s)) => Value::String(s.trim_end_matches(' ').to_owned()),
            Some(v) => v.clone(),
            None => Value::Null,
        },
        Rule::Title(c) => as_string(column_text(row, name, c)?.map(|t| title(&t))),
        Rule::Lower(c) => as_string(column_text(row, name, c)?.map(|t| t.to_lowercase())),
        Rule::Int(c) => int(row, name, c)?.map_or(Value::Null, Value::from),
        Rule::Number(c) => match num(row, name, c)? {
            None => Value::Null,
            Some(Num::Int(i)) => Value::from(i),
            Some(Num::Float(f)) => float(f),
        },
        Rule::Cents(c) => {
            int(row, name, c)?.map_or(Value::Null, |cents| float(cents as f64 / 100.0))
        }
        Rule::Date(c, format) => {
            as_string(column_text(row, name, c)?.and_then(|t| format.read(&t)))
        }
        Rule::DateTime(d, t, format) => {
            let date = column_text(row, name, d)?.and_then(|t| format.read(&t));
            let time = match t {
                Some(t) => column_text(row, name, t)?,
                None => None,
            };
            as_string(date.map(|date| {
                let time: Vec<char> = time.unwrap_or_default().chars().collect();
                if time.len() == 6 {
                    let part = |i: usize| time[i..i + 2].iter().collect::<String>();
                    format!("{date}T{}:{}:{}Z", part(0), part(2), part(4))
                } else {
                    format!("{date}T00:00:00Z")
                }
            }))
        }
        Rule::Flag(c, yes) => {
            Value::Bool(column_text(row, name, c)?.as_deref() == Some(yes.as_str()))
        }
        Rule::Code {
            column,
            map,
            unknown,
        } => match column_text(row, name, column)? {
            None => Value::Null,
            Some(code) => match (map.get(&code), unknown) {
                (Some(v), _) => v.clone(),
                (None, Unknown::Default(v)) => v.clone(),
                (None, Unknown::DeadLetter) => {
                    let known: Vec<&str> = map.keys().map(String::as_str).collect();
                    return Err(format!(
                        "field `{name}`: unknown code {} in column `{column}` (the map has: {})",
                        Value::String(code),
                        known.join(", ")
                    ));
                }
            },
        },
        Rule::Concat(parts, separator) => {
            let mut texts = Vec::with_capacity(parts.len());
            for part in parts {
                let v = value(part, name, row)?;
                if v.is_null() {
                    continue;
                }
                let t = key_text(&v).ok_or_else(|| {
                    format!("field `{name}`: a part of `concat` is {v}, not text")
                })?;
                if !t.is_empty() {
                    texts.push(t);
                }
            }
            if texts.is_empty() {
                Value::Null
            } else {
                Value::String(texts.join(separator))
            }
        }
        Rule::Add(columns) => arithmetic(row, name, columns, false)?,
        Rule::Subtract(columns) => arithmetic(row, name, columns, true)?,
        Rule::Lookup { .. } => unreachable!("a lookup is a top-level field, read in `document`"),
        Rule::Reference { table, key } => {
            let mut values = Vec::with_capacity(key.len());
            let constants: Vec<Value> = key
                .iter()
                .map(|k| match k {
                    KeyPart::Value(v) => Value::String(v.clone()),
                    KeyPart::Column(_) => Value::Null,
                })
                .collect();
            for (k, constant) in key.iter().zip(&constants) {
                let c = match k {
                    KeyPart::Value(_) => {
                        values.push(constant);
                        continue;
                    }
                    KeyPart::Column(c) => c,
                };
                match get(row, c) {
                    None => return Ok(Value::Null),
                    Some(Value::String(s)) if s.trim().is_empty() => return Ok(Value::Null),
                    Some(v @ (Value::String(_) | Value::Number(_) | Value::Bool(_))) => {
                        values.push(v)
                    }
                    Some(v) => {
                        return Err(format!(
                            "field `{name}`: column `{c}` is {v}, not a key value"
                        ))
                    }
                }
            }
            Value::String(legacy_id(table, &values).expect("key values are scalars"))
        }
    })
}

/// Checks a `type = "mapping"` processor; `has_source`: it reads a `source` (its inputs are
/// legacy tables), else the service's change log (its inputs must be entities).
pub fn compile(
    name: &str,
    settings: &Value,
    entities: &[EntityInfo],
    has_source: bool,
) -> Result<TransformSpec, SettingError> {
    let s: Settings = parse_settings(settings)?;
    let names = || {
        entities
            .iter()
            .map(|x| x.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let output = entities
        .iter()
        .find(|e| e.name == s.output)
        .ok_or_else(|| {
            err(
                "output",
                format!(
                    "unknown entity `{}` (this config has: {})",
                    s.output,
                    names()
                ),
            )
        })?;
    if s.inputs.is_empty() {
        return Err(err("inputs", "name the table(s) whose rows it reads"));
    }
    for (i, input) in s.inputs.iter().enumerate() {
        if input.trim().is_empty() {
            return Err(err(format!("inputs[{i}]"), "a table's name"));
        }
        if !has_source && !entities.iter().any(|e| e.name == *input) {
            return Err(err(
                format!("inputs[{i}]"),
                format!(
                    "unknown entity `{input}` (this config has: {}); a mapping of legacy tables \
                     reads them from a `source`",
                    names()
                ),
            ));
        }
    }
    if let Some(b) = s.batch {
        if !(1..=10_000).contains(&b) {
            return Err(err("batch", "must be between 1 and 10000"));
        }
    }
    let parallel = s.parallel.unwrap_or(1);
    if !(1..=MAX_PARALLEL).contains(&parallel) {
        return Err(err(
            "parallel",
            format!("must be between 1 and {MAX_PARALLEL}"),
        ));
    }
    if let Some(k) = &s.key {
        if k.trim().is_empty() {
            return Err(err(
                "key",
                "name the payload field whose value orders the inputs",
            ));
        }
    }
    let mut block = s.mapping;
    match block.get("table") {
        None if s.inputs.len() == 1 => {
            block.insert("table".into(), Value::String(s.inputs[0].clone()));
        }
        None => {
            return Err(err(
                "mapping.table",
                format!(
                    "name the table it maps: one of the inputs ({})",
                    s.inputs.join(", ")
                ),
            ))
        }
        Some(Value::String(t)) if !s.inputs.contains(t) => {
            return Err(err(
                "mapping.table",
                format!(
                    "`{t}` is not one of the inputs ({}): the mapping would never see a row",
                    s.inputs.join(", ")
                ),
            ))
        }
        Some(_) => {}
    }
    let mapping = Mapping::new(&Value::Object(block), output, entities)?;
    Ok(TransformSpec {
        name: name.to_owned(),
        kind: "mapping",
        inputs: s.inputs,
        output: s.output,
        batch: s.batch.unwrap_or(100),
        parallel,
        key: s.key.or_else(|| mapping.key.first().cloned()),
        enabled: s.enabled,
        transform: Arc::new(mapping),
        source: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{PlanIo, Planner};
    use crate::transform::TransformPlanner;
    use meshql_core::{OutputWrite, StoreError};
    use serde_json::json;
    use std::collections::HashMap;

    /// The four §14.2.3 mappings as in the report's TOML, converted to JSON by a TOML parser
    /// (Python's `tomllib`), `source` included.
    const LEGACY: &str = r#"
[
{
  "name": "customers",
  "type": "mapping",
  "inputs": ["cust_acct"],
  "output": "customer",
  "source": {"type": "kafka", "brokers": "localhost:9092", "topics": ["legacy.public.cust_acct"]},
  "mapping": {
    "table": "cust_acct",
    "key": ["acct_id"],
    "fields": {
      "legacy_acct_id": {"int": "acct_id"},
      "account_number": "acct_num",
      "first_name": {"title": "cust_nm_first"},
      "last_name": {"title": "cust_nm_last"},
      "address": {"concat": [{"title": "addr_ln1"}, {"title": "addr_ln2"}], "separator": ", ", "omit_empty": true},
      "city": {"title": "addr_city", "omit_empty": true},
      "state": {"copy": "addr_st", "omit_empty": true},
      "zip": {"copy": "addr_zip", "omit_empty": true},
      "phone": {"copy": "phone_num", "omit_empty": true},
      "email": {"lower": "email_addr", "omit_empty": true},
      "rate_class": {"code": "rt_cd", "map": {"RES": "residential", "COM": "commercial", "IND": "industrial"}},
      "service_type": {"code": "svc_type", "map": {"E": "electric", "G": "gas", "B": "both"}},
      "status": {"code": "stat_cd", "map": {"A": "active", "S": "suspended", "C": "closed"}},
      "connected_date": {"date": "conn_dt", "omit_empty": true},
      "disconnected_date": {"date": "disc_dt", "omit_empty": true},
      "budget_billing": {"flag": "budget_flg"},
      "paperless": {"flag": "paperless_flg"}
    }
  }
},
{
  "name": "meter_readings",
  "type": "mapping",
  "inputs": ["mtr_rdng"],
  "output": "meter_reading",
  "source": {"type": "kafka", "brokers": "localhost:9092", "topics": ["legacy.public.mtr_rdng"]},
  "mapping": {
    "table": "mtr_rdng",
    "key": ["rdng_id"],
    "fields": {
      "customer_id": {"reference": "cust_acct", "key": ["acct_id"], "omit_empty": true},
      "meter_number": "mtr_num",
      "reading_date": {"date": "rdng_dt"},
      "reading_value": {"int": "rdng_val", "default": 0},
      "previous_value": {"int": "prev_rdng_val", "omit_empty": true},
      "kwh_used": {"subtract": ["rdng_val", "prev_rdng_val"], "omit_empty": true},
      "reading_type": {"code": "rdng_type", "map": {"A": "actual", "E": "estimated", "C": "customer"}},
      "estimated": {"flag": "est_flg"},
      "billed": {"flag": "billed_flg"}
    }
  }
},
{
  "name": "bills",
  "type": "mapping",
  "inputs": ["bill_hdr"],
  "output": "bill",
  "source": {"type": "kafka", "brokers": "localhost:9092", "topics": ["legacy.public.bill_hdr"]},
  "mapping": {
    "table": "bill_hdr",
    "key": ["bill_id"],
    "fields": {
      "customer_id": {"reference": "cust_acct", "key": ["acct_id"], "omit_empty": true},
      "legacy_bill_id": {"int": "bill_id"},
      "bill_date": {"date": "bill_dt"},
      "due_date": {"date": "due_dt"},
      "period_from": {"date": "bill_prd_from"},
      "period_to": {"date": "bill_prd_to"},
      "total_amount": {"cents": "tot_amt"},
      "kwh_used": {"int": "kwh_used"},
      "status": {"code": "stat_cd", "map": {"O": "open", "P": "paid", "D": "delinquent", "X": "cancelled"}},
      "late": {"flag": "late_flg"}
    }
  }
},
{
  "name": "payments",
  "type": "mapping",
  "inputs": ["pymt_hist"],
  "output": "payment",
  "source": {"type": "kafka", "brokers": "localhost:9092", "topics": ["legacy.public.pymt_hist"]},
  "mapping": {
    "table": "pymt_hist",
    "key": ["pymt_id"],
    "fields": {
      "customer_id": {"reference": "cust_acct", "key": ["acct_id"], "omit_empty": true},
      "legacy_bill_id": {"int": "bill_id", "omit_empty": true},
      "bill_id": {"reference": "bill_hdr", "key": ["bill_id"], "omit_empty": true},
      "payment_date": {"date": "pymt_dt"},
      "amount": {"cents": "pymt_amt"},
      "method": {"code": "pymt_mthd", "map": {"W": "web", "E": "electronic", "K": "check", "C": "cash", "P": "phone"}},
      "confirmation_number": {"copy": "conf_num", "omit_empty": true},
      "status": {"code": "stat_cd", "map": {"S": "success", "F": "failed", "R": "refunded"}, "default": "success"}
    }
  }
}
]
"#;

    /// The clean entities' JSON Schema properties (CONTRACT §14.2.4).
    fn entities() -> Vec<EntityInfo> {
        let with = |name: &str, fields: &[&str]| EntityInfo {
            name: name.into(),
            fields: Some(fields.iter().map(|f| (*f).to_owned()).collect()),
            properties: None,
        };
        vec![
            with(
                "customer",
                &[
                    "account_number",
                    "first_name",
                    "last_name",
                    "rate_class",
                    "service_type",
                    "status",
                    "address",
                    "city",
                    "state",
                    "zip",
                    "phone",
                    "email",
                    "connected_date",
                    "disconnected_date",
                    "budget_billing",
                    "paperless",
                    "legacy_acct_id",
                ],
            ),
            with(
                "meter_reading",
                &[
                    "meter_number",
                    "reading_date",
                    "reading_value",
                    "reading_type",
                    "customer_id",
                    "previous_value",
                    "kwh_used",
                    "estimated",
                    "billed",
                ],
            ),
            with(
                "bill",
                &[
                    "bill_date",
                    "due_date",
                    "total_amount",
                    "kwh_used",
                    "status",
                    "customer_id",
                    "legacy_bill_id",
                    "period_from",
                    "period_to",
                    "late",
                ],
            ),
            with(
                "payment",
                &[
                    "payment_date",
                    "amount",
                    "method",
                    "status",
                    "customer_id",
                    "bill_id",
                    "legacy_bill_id",
                    "confirmation_number",
                ],
            ),
        ]
    }

    /// A processor of [`LEGACY`] as `configure` sees it: its name, type and other settings.
    fn entry(name: &str) -> (String, Value) {
        let all: Vec<Value> = serde_json::from_str(LEGACY).unwrap();
        let mut p = all
            .into_iter()
            .find(|p| p["name"] == name)
            .unwrap()
            .as_object()
            .unwrap()
            .clone();
        p.remove("name");
        let kind = p.remove("type").unwrap().as_str().unwrap().to_owned();
        (kind, Value::Object(p))
    }

    fn plan(name: &str) -> crate::ProcessorPlan {
        let (kind, settings) = entry(name);
        crate::configure(
            name,
            &kind,
            &settings,
            &entities(),
            std::path::Path::new("."),
        )
        .unwrap()
    }

    fn spec(name: &str) -> TransformSpec {
        match plan(name) {
            crate::ProcessorPlan::Transform(t) => t,
            other => panic!("not a transform: {other:?}"),
        }
    }

    fn input(entity: &str, op: ChangeOp, row: Value) -> Input {
        Input {
            position: 1,
            change_id: format!("{entity}:x:1"),
            entity: entity.into(),
            id: "x".into(),
            op,
            created_at: 1,
            correlation_id: None,
            payload: row.as_object().unwrap().clone(),
            order: (0, 1),
            fresh: false,
        }
    }

    /// What processor `name` makes of a created `row` of `table`: (id, document).
    fn clean(name: &str, table: &str, row: Value) -> Result<(String, Value), String> {
        let out = spec(name)
            .transform
            .transform(&input(table, ChangeOp::Create, row))?;
        assert_eq!(out.len(), 1);
        let Emit { id, payload } = out.into_iter().next().unwrap();
        Ok((id.unwrap(), Value::Object(payload.unwrap())))
    }

    // ids computed with Python's uuid.uuid5(UUID("6fa4a995-5b3f-41d4-a4a1-13b2a525552a"), text)
    const CUST_1: &str = "583b05e8-a3fb-508e-99c0-260b1a0fc29a"; // ["cust_acct","1"]
    const CUST_2: &str = "9974b243-b8b0-5d2b-9762-dfe1ac6fe94b"; // ["cust_acct","2"]
    const BILL_1: &str = "854f3f43-f101-5648-a16e-24de00102512"; // ["bill_hdr","1"]
    const BILL_10: &str = "550f9033-72ab-5171-a02a-15c45d13ea89"; // ["bill_hdr","10"]
    const RDNG_2: &str = "1a6be9b8-3fd3-5013-9f7d-3fa9c9b918d2"; // ["mtr_rdng","2"]
    const PYMT_1: &str = "1a6cc105-8216-5100-9e19-f043e33e50fd"; // ["pymt_hist","1"]
    const PYMT_5: &str = "efbb3b98-6017-5a0a-9c06-b429dd47cae5"; // ["pymt_hist","5"]

    #[test]
    fn title_is_14_2_3s() {
        for (legacy, clean) in [
            ("MARGARET", "Margaret"),
            ("742 EVERGREEN TERRACE", "742 Evergreen Terrace"),
            ("O'NEIL-SMITH", "O'Neil-Smith"),
            ("1ST", "1st"),
            ("12 1ST ST", "12 1st St"),
            ("MCDONALD", "Mcdonald"),
            ("mary-jane o'hara", "Mary-Jane O'Hara"),
            ("SUITE  300", "Suite  300"),
            ("ÉLODIE", "Élodie"),
            ("", ""),
        ] {
            assert_eq!(title(legacy), clean, "{legacy}");
        }
    }

    #[test]
    fn seed_customers_are_cleaned() {
        // Debezium-style: integers as JSON numbers
        let (id, doc) = clean(
            "customers",
            "cust_acct",
            json!({"acct_id": 1, "acct_num": "100100-00001", "cust_nm_first": "MARGARET",
                   "cust_nm_last": "HENDERSON", "addr_ln1": "742 EVERGREEN TERRACE", "addr_ln2": null,
                   "addr_city": "SPRINGFIELD", "addr_st": "IL", "addr_zip": "62704",
                   "phone_num": "217-555-0101", "email_addr": "MHenderson@Email.com", "rt_cd": "RES",
                   "svc_type": "E", "stat_cd": "A", "conn_dt": "19980315", "disc_dt": null,
                   "budget_flg": "Y", "paperless_flg": "N"}),
        )
        .unwrap();
        assert_eq!(id, CUST_1);
        assert_eq!(
            doc,
            json!({"legacy_acct_id": 1, "account_number": "100100-00001", "first_name": "Margaret",
                   "last_name": "Henderson", "address": "742 Evergreen Terrace", "city": "Springfield",
                   "state": "IL", "zip": "62704", "phone": "217-555-0101",
                   "email": "mhenderson@email.com", "rate_class": "residential",
                   "service_type": "electric", "status": "active", "connected_date": "1998-03-15",
                   "budget_billing": true, "paperless": false})
        );
        // every value as text (a VARCHAR-typed feed), CHAR padding, empty strings, no phone
        let (id, doc) = clean(
            "customers",
            "cust_acct",
            json!({"acct_id": "2", "acct_num": "200200-00002", "cust_nm_first": "KENJI   ",
                   "cust_nm_last": "NAKAMURA", "addr_ln1": "1200 INDUSTRIAL PKWY", "addr_ln2": "SUITE 300",
                   "addr_city": "SPRINGFIELD", "addr_st": "IL", "addr_zip": "62707",
                   "phone_num": null, "email_addr": "", "rt_cd": "COM", "svc_type": "B",
                   "stat_cd": "A", "conn_dt": "20050601", "disc_dt": "", "budget_flg": "N",
                   "paperless_flg": "Y"}),
        )
        .unwrap();
        assert_eq!(id, CUST_2);
        assert_eq!(
            doc,
            json!({"legacy_acct_id": 2, "account_number": "200200-00002", "first_name": "Kenji",
                   "last_name": "Nakamura", "address": "1200 Industrial Pkwy, Suite 300",
                   "city": "Springfield", "state": "IL", "zip": "62707", "rate_class": "commercial",
                   "service_type": "both", "status": "active", "connected_date": "2005-06-01",
                   "budget_billing": false, "paperless": true})
        );
        // no email, an empty LN2, flags absent from the row
        let (_, doc) = clean(
            "customers",
            "cust_acct",
            json!({"acct_id": 3, "acct_num": "100100-00003", "cust_nm_first": "SIOBHAN",
                   "cust_nm_last": "OCONNELL", "addr_ln1": "88 OAK STREET", "addr_ln2": "",
                   "addr_city": "SPRINGFIELD", "addr_st": "IL", "addr_zip": "62702",
                   "rt_cd": "RES", "svc_type": "E", "stat_cd": "S", "conn_dt": "20120910"}),
        )
        .unwrap();
        assert_eq!(
            doc,
            json!({"legacy_acct_id": 3, "account_number": "100100-00003", "first_name": "Siobhan",
                   "last_name": "Oconnell", "address": "88 Oak Street", "city": "Springfield",
                   "state": "IL", "zip": "62702", "rate_class": "residential",
                   "service_type": "electric", "status": "suspended", "connected_date": "2012-09-10",
                   "budget_billing": false, "paperless": false})
        );
        // a closed account with a disconnection date; LN1 null with LN2 set is LN2 alone
        // (not §14.2.3's "null, …" quirk); a name with an apostrophe and a hyphen
        let (_, doc) = clean(
            "customers",
            "cust_acct",
            json!({"acct_id": 4, "acct_num": "300300-00004", "cust_nm_first": "JAMES",
                   "cust_nm_last": "O'NEIL-SMITH", "addr_ln1": null, "addr_ln2": "5000 RIVER ROAD",
                   "addr_city": null, "addr_st": "IL", "addr_zip": "62711", "rt_cd": "IND",
                   "svc_type": "G", "stat_cd": "C", "conn_dt": "20010220", "disc_dt": "20240131",
                   "budget_flg": "N", "paperless_flg": "Y"}),
        )
        .unwrap();
        assert_eq!(
            doc,
            json!({"legacy_acct_id": 4, "account_number": "300300-00004", "first_name": "James",
                   "last_name": "O'Neil-Smith", "address": "5000 River Road", "state": "IL",
                   "zip": "62711", "rate_class": "industrial", "service_type": "gas",
                   "status": "closed", "connected_date": "2001-02-20",
                   "disconnected_date": "2024-01-31", "budget_billing": false, "paperless": true})
        );
    }

    #[test]
    fn meter_readings_subtract_and_refer_to_their_customer() {
        let typed = json!({"rdng_id": 2, "acct_id": 1, "mtr_num": "M-10042", "rdng_dt": "20250801",
                           "rdng_val": 13580, "prev_rdng_val": 12450, "rdng_type": "A",
                           "est_flg": "N", "billed_flg": "Y"});
        let text = json!({"rdng_id": "2", "acct_id": "1", "mtr_num": "M-10042", "rdng_dt": "20250801",
                          "rdng_val": "13580", "prev_rdng_val": "12450", "rdng_type": "A",
                          "est_flg": "N", "billed_flg": "Y"});
        let expected = json!({"customer_id": CUST_1, "meter_number": "M-10042",
                              "reading_date": "2025-08-01", "reading_value": 13580,
                              "previous_value": 12450, "kwh_used": 1130, "reading_type": "actual",
                              "estimated": false, "billed": true});
        for row in [typed, text] {
            let (id, doc) = clean("meter_readings", "mtr_rdng", row).unwrap();
            assert_eq!(id, RDNG_2);
            assert_eq!(doc, expected);
        }
        // an estimate; no previous reading: neither previous_value nor kwh_used
        let (_, doc) = clean(
            "meter_readings",
            "mtr_rdng",
            json!({"rdng_id": 9, "acct_id": 3, "mtr_num": "M-10098", "rdng_dt": "20250901",
                   "rdng_val": 5400, "prev_rdng_val": null, "rdng_type": "E", "est_flg": "Y",
                   "billed_flg": "N"}),
        )
        .unwrap();
        assert_eq!(doc["reading_type"], "estimated");
        assert_eq!(doc["estimated"], true);
        assert_eq!(doc["reading_value"], 5400);
        assert!(doc.get("previous_value").is_none() && doc.get("kwh_used").is_none());
        // RDNG_VAL missing: 0 (§14.2.3), and kwh_used left out
        let (_, doc) = clean(
            "meter_readings",
            "mtr_rdng",
            json!({"rdng_id": 10, "acct_id": 3, "mtr_num": "M-10098", "rdng_dt": "20250901",
                   "prev_rdng_val": 100, "rdng_type": "C"}),
        )
        .unwrap();
        assert_eq!(doc["reading_value"], 0);
        assert_eq!(doc["previous_value"], 100);
        assert_eq!(doc["reading_type"], "customer");
        assert!(doc.get("kwh_used").is_none());
        // a non-numeric reading is a dead letter naming the field, column and value
        let e = clean(
            "meter_readings",
            "mtr_rdng",
            json!({"rdng_id": 11, "acct_id": 3, "mtr_num": "M-1", "rdng_dt": "20250901",
                   "rdng_val": "12x", "prev_rdng_val": 1, "rdng_type": "A"}),
        )
        .unwrap_err();
        assert!(
            e.contains("`reading_value`") && e.contains("`rdng_val`") && e.contains("\"12x\""),
            "{e}"
        );
    }

    #[test]
    fn bills_are_in_dollars() {
        let (id, doc) = clean(
            "bills",
            "bill_hdr",
            json!({"bill_id": 1, "acct_id": 1, "bill_dt": "20250615", "due_dt": "20250715",
                   "bill_prd_from": "20250601", "bill_prd_to": "20250630", "tot_amt": 9840,
                   "kwh_used": 950, "stat_cd": "P", "late_flg": "N"}),
        )
        .unwrap();
        assert_eq!(id, BILL_1);
        assert_eq!(
            doc,
            json!({"customer_id": CUST_1, "legacy_bill_id": 1, "bill_date": "2025-06-15",
                   "due_date": "2025-07-15", "period_from": "2025-06-01", "period_to": "2025-06-30",
                   "total_amount": 98.4, "kwh_used": 950, "status": "paid", "late": false})
        );
        assert_eq!(serde_json::to_string(&doc["total_amount"]).unwrap(), "98.4");
        // text-typed numbers; 420.00 is a JSON float
        let (_, doc) = clean(
            "bills",
            "bill_hdr",
            json!({"bill_id": "4", "acct_id": "2", "bill_dt": "20250615", "due_dt": "20250715",
                   "bill_prd_from": "20250601", "bill_prd_to": "20250630", "tot_amt": "42000",
                   "kwh_used": "4200", "stat_cd": "P", "late_flg": "N"}),
        )
        .unwrap();
        assert_eq!(doc["customer_id"], CUST_2);
        assert_eq!(doc["legacy_bill_id"], 4);
        assert_eq!(doc["kwh_used"], 4200);
        assert_eq!(
            serde_json::to_string(&doc["total_amount"]).unwrap(),
            "420.0"
        );
        for (cents, dollars, code, status, late, flag) in [
            ("8300", "83.0", "D", "delinquent", true, "Y"),
            ("7250", "72.5", "D", "delinquent", true, "Y"),
            ("106200", "1062.0", "O", "open", false, "N"),
            ("20220", "202.2", "X", "cancelled", false, "N"),
        ] {
            let (_, doc) = clean(
                "bills",
                "bill_hdr",
                json!({"bill_id": 7, "acct_id": 3, "bill_dt": "20250615", "due_dt": "20250715",
                       "bill_prd_from": "20250601", "bill_prd_to": "20250630", "tot_amt": cents,
                       "kwh_used": 800, "stat_cd": code, "late_flg": flag}),
            )
            .unwrap();
            assert_eq!(
                serde_json::to_string(&doc["total_amount"]).unwrap(),
                dollars
            );
            assert_eq!(doc["status"], status);
            assert_eq!(doc["late"], late);
        }
        // cents that are not a number, or not whole
        for (bad, says) in [("98,40", "not a number"), ("98.5", "not a whole number")] {
            let e = clean(
                "bills",
                "bill_hdr",
                json!({"bill_id": 1, "acct_id": 1, "tot_amt": bad, "kwh_used": 1, "stat_cd": "P"}),
            )
            .unwrap_err();
            assert!(
                e.contains("`total_amount`")
                    && e.contains("`tot_amt`")
                    && e.contains(bad)
                    && e.contains(says),
                "{e}"
            );
        }
    }

    #[test]
    fn payments_refer_to_their_bill_when_they_have_one() {
        let (id, doc) = clean(
            "payments",
            "pymt_hist",
            json!({"pymt_id": 1, "acct_id": 1, "bill_id": 1, "pymt_dt": "20250702",
                   "pymt_amt": 9840, "pymt_mthd": "W", "conf_num": "WEB-20250702-001",
                   "stat_cd": "S"}),
        )
        .unwrap();
        assert_eq!(id, PYMT_1);
        assert_eq!(
            doc,
            json!({"customer_id": CUST_1, "legacy_bill_id": 1, "bill_id": BILL_1,
                   "payment_date": "2025-07-02", "amount": 98.4, "method": "web",
                   "confirmation_number": "WEB-20250702-001", "status": "success"})
        );
        // the seed's payment 5: bill 10, 980.00 by check
        let (id, doc) = clean(
            "payments",
            "pymt_hist",
            json!({"pymt_id": "5", "acct_id": "4", "bill_id": "10", "pymt_dt": "20250630",
                   "pymt_amt": "98000", "pymt_mthd": "K", "conf_num": "CHK-004872",
                   "stat_cd": "S"}),
        )
        .unwrap();
        assert_eq!(id, PYMT_5);
        assert_eq!(doc["bill_id"], BILL_10);
        assert_eq!(doc["legacy_bill_id"], 10);
        assert_eq!(serde_json::to_string(&doc["amount"]).unwrap(), "980.0");
        assert_eq!(doc["method"], "check");
        // no bill, no confirmation, a null status (the column's default 'S' stands in)
        let (_, doc) = clean(
            "payments",
            "pymt_hist",
            json!({"pymt_id": 6, "acct_id": 2, "bill_id": null, "pymt_dt": "20250725",
                   "pymt_amt": 47000, "pymt_mthd": "E", "conf_num": null, "stat_cd": null}),
        )
        .unwrap();
        assert_eq!(
            doc,
            json!({"customer_id": CUST_2, "payment_date": "2025-07-25", "amount": 470.0,
                   "method": "electronic", "status": "success"})
        );
        for (code, method) in [("C", "cash"), ("P", "phone")] {
            let (_, doc) = clean(
                "payments",
                "pymt_hist",
                json!({"pymt_id": 7, "acct_id": 2, "pymt_dt": "20250725", "pymt_amt": 1,
                       "pymt_mthd": code, "stat_cd": "R"}),
            )
            .unwrap();
            assert_eq!(
                (doc["method"].as_str(), doc["status"].as_str()),
                (Some(method), Some("refunded"))
            );
            assert_eq!(serde_json::to_string(&doc["amount"]).unwrap(), "0.01");
        }
    }

    #[test]
    fn ids_are_stable_and_a_reference_is_its_parents_id() {
        let one = json!(1);
        assert_eq!(legacy_id("cust_acct", &[&one]).unwrap(), CUST_1);
        // int, text, a float without a fraction, CHAR padding, the table's case: one id
        for v in [json!("1"), json!(1.0), json!("1   "), json!(1u64)] {
            assert_eq!(legacy_id("cust_acct", &[&v]).unwrap(), CUST_1, "{v}");
        }
        assert_eq!(legacy_id("CUST_ACCT", &[&one]).unwrap(), CUST_1);
        // text is not read as a number; tables and keys make different ids
        assert_ne!(
            legacy_id("cust_acct", &[&json!("007")]),
            legacy_id("cust_acct", &[&json!("7")])
        );
        assert_ne!(legacy_id("bill_hdr", &[&one]).unwrap(), CUST_1);
        assert_eq!(
            legacy_id("cust_acct", &[&json!("ABC")]).unwrap(),
            "968bcfc4-543a-5576-abfc-d57c20f5e157"
        );
        // a composite key (SAP: MANDT, MBLNR, MJAHR)
        assert_eq!(
            legacy_id(
                "zmseg_101",
                &[&json!("100"), &json!("4900000001"), &json!(2026)]
            )
            .unwrap(),
            "03d2ccaa-eced-5752-8031-7f441116748f"
        );
        assert_eq!(legacy_id("cust_acct", &[&Value::Null]), None);
        assert_eq!(legacy_id("cust_acct", &[&json!({"a": 1})]), None);
        assert_eq!(key_text(&json!(2.5)).as_deref(), Some("2.5"));
        assert_eq!(key_text(&json!(true)).as_deref(), Some("true"));
        // the child's FK is the parent's id whichever way each delivers the key
        let (parent, _) = clean(
            "customers",
            "cust_acct",
            json!({"acct_id": "1", "acct_num": "n", "rt_cd": "RES", "svc_type": "E", "stat_cd": "A"}),
        )
        .unwrap();
        for acct in [json!(1), json!("1")] {
            let (_, child) = clean(
                "bills",
                "bill_hdr",
                json!({"bill_id": 1, "acct_id": acct, "tot_amt": 1, "kwh_used": 1, "stat_cd": "P"}),
            )
            .unwrap();
            assert_eq!(child["customer_id"], parent.as_str());
        }
        // and the same row twice makes the same id and document
        let row = json!({"bill_id": 1, "acct_id": 1, "tot_amt": 1, "kwh_used": 1, "stat_cd": "P"});
        assert_eq!(
            clean("bills", "bill_hdr", row.clone()),
            clean("bills", "bill_hdr", row)
        );
    }

    #[test]
    fn a_delete_tombstones_the_rows_document() {
        let t = spec("customers").transform;
        // a delete carries the key columns (replica identity DEFAULT) or the whole row
        for row in [
            json!({"acct_id": 2}),
            json!({"acct_id": "2", "acct_num": "200200-00002", "rt_cd": "???"}),
        ] {
            let out = t
                .transform(&input("cust_acct", ChangeOp::Delete, row))
                .unwrap();
            assert_eq!(
                out,
                vec![Emit {
                    id: Some(CUST_2.into()),
                    payload: None
                }]
            );
        }
        let e = t
            .transform(&input(
                "cust_acct",
                ChangeOp::Delete,
                json!({"acct_num": "x"}),
            ))
            .unwrap_err();
        assert!(e.contains("`acct_id`") && e.contains("cust_acct"), "{e}");
        // a create without its key is a dead letter too
        let e = t
            .transform(&input(
                "cust_acct",
                ChangeOp::Create,
                json!({"acct_id": null}),
            ))
            .unwrap_err();
        assert!(e.contains("`acct_id`"), "{e}");
        // another table's rows lead to nothing; the table's case does not matter
        assert!(t
            .transform(&input("bill_hdr", ChangeOp::Create, json!({"acct_id": 1})))
            .unwrap()
            .is_empty());
        let out = t
            .transform(&input(
                "CUST_ACCT",
                ChangeOp::Update,
                json!({"ACCT_ID": 2, "RT_CD": "COM", "SVC_TYPE": "E", "STAT_CD": "A"}),
            ))
            .unwrap();
        assert_eq!(out[0].id.as_deref(), Some(CUST_2));
        assert_eq!(out[0].payload.as_ref().unwrap()["rate_class"], "commercial");
    }

    /// `customers`' settings as the kind sees them: `source` taken out (by `configure`).
    fn customers() -> Value {
        let (_, mut settings) = entry("customers");
        settings.as_object_mut().unwrap().remove("source");
        settings
    }

    fn customers_with(field: &str, decl: Value) -> Result<TransformSpec, SettingError> {
        let mut settings = customers();
        settings["mapping"]["fields"][field] = decl;
        compile("customers", &settings, &entities(), true)
    }

    #[test]
    fn an_unknown_code_is_a_dead_letter_or_the_default() {
        let row =
            json!({"acct_id": 1, "acct_num": "n", "rt_cd": "XYZ", "svc_type": "E", "stat_cd": "A"});
        let e = clean("customers", "cust_acct", row.clone()).unwrap_err();
        assert!(
            e.contains("`rate_class`")
                && e.contains("`rt_cd`")
                && e.contains("\"XYZ\"")
                && e.contains("COM, IND, RES"),
            "{e}"
        );
        for unknown in [json!("dead_letter"), json!({"default": "residential"})] {
            let t = customers_with(
                "rate_class",
                json!({"code": "rt_cd", "map": {"RES": "residential", "COM": "commercial"}, "unknown": unknown.clone()}),
            )
            .unwrap()
            .transform;
            let out = t.transform(&input("cust_acct", ChangeOp::Create, row.clone()));
            match unknown {
                Value::String(_) => assert!(out.unwrap_err().contains("\"XYZ\"")),
                _ => assert_eq!(
                    out.unwrap()[0].payload.as_ref().unwrap()["rate_class"],
                    "residential"
                ),
            }
        }
        // a null code is null, not unknown
        let (_, doc) = clean(
            "customers",
            "cust_acct",
            json!({"acct_id": 1, "acct_num": "n", "rt_cd": null, "svc_type": "E", "stat_cd": "A"}),
        )
        .unwrap();
        assert_eq!(doc["rate_class"], Value::Null);
        // an integer column's codes are its digits
        let t = customers_with(
            "status",
            json!({"code": "stat_cd", "map": {"1": "active", "2": "closed"}}),
        )
        .unwrap()
        .transform;
        let out = t
            .transform(&input(
                "cust_acct",
                ChangeOp::Create,
                json!({"acct_id": 1, "rt_cd": "RES", "stat_cd": 2}),
            ))
            .unwrap();
        assert_eq!(out[0].payload.as_ref().unwrap()["status"], "closed");
    }

    /// A mapping without a schema to check against, from a `[processor.mapping]` block.
    fn free(block: Value) -> Mapping {
        Mapping::new(
            &block,
            &EntityInfo {
                name: "out".into(),
                fields: None,
                properties: None,
            },
            &[],
        )
        .unwrap()
    }

    #[test]
    fn sap_rows_timestamps_defaults_and_composite_references() {
        let farm = free(
            json!({"table": "zfarm_mstr", "key": ["mandt", "werks"], "fields": {
                "legacy_werks": "werks",
                "name": "farm_nm",
                "farm_type": {"code": "farm_typ_cd", "map": {"M": "megafarm", "L": "local_farm", "H": "homestead"},
                              "unknown": {"default": "local_farm"}},
                "owner": {"copy": "eigr", "omit_empty": true}
            }}),
        );
        let row = json!({"mandt": "100", "werks": "1000", "bukrs": "1000", "farm_nm": "Sonnenhof Megafarm",
                         "farm_typ_cd": "M", "zone_cd": "north", "eigr": "Heinrich Mueller"});
        let out = farm
            .transform(&input("zfarm_mstr", ChangeOp::Create, row))
            .unwrap();
        assert_eq!(
            out[0].id.as_deref(),
            Some("551c08e4-b9d1-5e8e-ae6a-6c2ce4b35566")
        );
        assert_eq!(
            Value::Object(out[0].payload.clone().unwrap()),
            json!({"legacy_werks": "1000", "name": "Sonnenhof Megafarm", "farm_type": "megafarm",
                   "owner": "Heinrich Mueller"})
        );
        let doc = farm
            .document(json!({"mandt": "100", "werks": "2000", "farm_nm": "Gruener Hof", "farm_typ_cd": "Q", "eigr": null})
                .as_object()
                .unwrap())
            .unwrap();
        assert_eq!(
            Value::Object(doc),
            json!({"legacy_werks": "2000", "name": "Gruener Hof", "farm_type": "local_farm"})
        );
        let lay = free(
            json!({"table": "zafru_lege", "key": ["mandt", "aufnr"], "fields": {
                "farm_id": {"reference": "zfarm_mstr", "key": ["mandt", "werks"]},
                "eggs": {"int": "ei_menge"},
                "timestamp": {"datetime": ["erfas_dt", "erfas_zt"]}
            }}),
        );
        for (dt, zt, ts) in [
            (
                json!("20260201"),
                json!("063015"),
                json!("2026-02-01T06:30:15Z"),
            ),
            (
                json!("20260201"),
                Value::Null,
                json!("2026-02-01T00:00:00Z"),
            ),
            (
                json!("20260201"),
                json!("0630"),
                json!("2026-02-01T00:00:00Z"),
            ),
            (json!("2026021"), json!("063015"), Value::Null),
            (Value::Null, json!("063015"), Value::Null),
        ] {
            let doc = lay
                .document(
                    json!({"mandt": "100", "aufnr": "1", "werks": "1000", "ei_menge": 12,
                                 "erfas_dt": dt, "erfas_zt": zt})
                    .as_object()
                    .unwrap(),
                )
                .unwrap();
            assert_eq!(doc["timestamp"], ts);
            assert_eq!(doc["farm_id"], "551c08e4-b9d1-5e8e-ae6a-6c2ce4b35566");
            assert_eq!(doc["eggs"], 12);
        }
        // a reference with a null or blank key column is null
        for werks in [Value::Null, json!("   ")] {
            let doc = lay
                .document(
                    json!({"mandt": "100", "aufnr": "1", "werks": werks})
                        .as_object()
                        .unwrap(),
                )
                .unwrap();
            assert_eq!(doc["farm_id"], Value::Null);
        }
    }

    #[test]
    fn numbers_dates_concat_and_defaults() {
        let m = free(json!({"table": "t", "key": ["k"], "fields": {
            "n": {"number": "n"},
            "i": {"int": "i"},
            "sum": {"add": ["a", "b"]},
            "diff": {"subtract": ["a", "b", "c"]},
            "d": {"date": "d", "format": "DD.MM.YYYY"},
            "us": {"date": "us", "format": "MM/DD/YYYY"},
            "label": {"concat": ["x", {"lower": "y"}, {"int": "i"}], "separator": " / "},
            "none": {"concat": ["missing", "blank"], "omit_empty": false},
            "fallback": {"copy": "missing", "default": "n/a"},
            "yes": {"flag": "f", "true_value": "X"},
            "raw": "raw"
        }}));
        let doc = |row: Value| Value::Object(m.document(row.as_object().unwrap()).unwrap());
        assert_eq!(
            doc(
                json!({"k": 1, "n": "12.5", "i": "7", "a": "1.5", "b": 2, "c": 1, "d": "15.03.1998",
                       "us": "03/15/1998", "x": "A  ", "y": "B", "blank": "  ", "f": "X",
                       "raw": {"nested": [1]}})
            ),
            json!({"n": 12.5, "i": 7, "sum": 3.5, "diff": -1.5, "d": "1998-03-15", "us": "1998-03-15",
                   "label": "A / b / 7", "none": null, "fallback": "n/a", "yes": true,
                   "raw": {"nested": [1]}})
        );
        // integers stay integers; a wrong separator or length is null; blank numbers are null
        assert_eq!(
            doc(
                json!({"k": 1, "n": 7, "i": 12.0, "a": 10, "b": "3", "c": "2", "d": "15/03/1998",
                       "us": "3/15/1998", "y": "B", "f": "Y"})
            ),
            json!({"n": 7, "i": 12, "sum": 13, "diff": 5, "d": null, "us": null, "label": "b / 12",
                   "none": null, "fallback": "n/a", "yes": false, "raw": null})
        );
        let blank = doc(json!({"k": 1, "n": " ", "i": "", "a": "", "b": 1}));
        assert_eq!(
            (&blank["n"], &blank["i"], &blank["sum"]),
            (&Value::Null, &Value::Null, &Value::Null)
        );
        // the default format and §14.2.3's missing digit check
        let m = free(json!({"table": "t", "key": ["k"], "fields": {"d": {"date": "d"}}}));
        for (legacy, clean) in [
            (json!("19980315"), json!("1998-03-15")),
            (json!(19980315), json!("1998-03-15")),
            (json!("1998031"), Value::Null),
            (json!("ABCDEFGH"), json!("ABCD-EF-GH")),
        ] {
            let doc = m
                .document(json!({"d": legacy}).as_object().unwrap())
                .unwrap();
            assert_eq!(doc["d"], clean);
        }
        // overflow and objects are dead letters
        let m = free(json!({"table": "t", "key": ["k"], "fields": {
            "s": {"subtract": ["a", "b"]}, "t": {"title": "o"}
        }}));
        let e = m
            .document(json!({"a": i64::MIN, "b": 1}).as_object().unwrap())
            .unwrap_err();
        assert!(e.contains("`s`") && e.contains("overflows"), "{e}");
        let e = m
            .document(json!({"o": {"x": 1}}).as_object().unwrap())
            .unwrap_err();
        assert!(
            e.contains("`t`") && e.contains("`o`") && e.contains("not text"),
            "{e}"
        );
    }

    #[test]
    fn the_documented_config_compiles() {
        for (name, table, key) in [
            ("customers", "cust_acct", "acct_id"),
            ("meter_readings", "mtr_rdng", "rdng_id"),
            ("bills", "bill_hdr", "bill_id"),
            ("payments", "pymt_hist", "pymt_id"),
        ] {
            let s = spec(name);
            assert_eq!(s.kind, "mapping");
            assert_eq!(s.inputs, vec![table.to_owned()]);
            // the lanes follow the legacy key
            assert_eq!(s.key.as_deref(), Some(key));
            assert_eq!(s.source.as_ref().map(|s| s.kind()), Some("kafka"));
            assert_eq!(plan(name).kind(), "mapping");
        }
        assert!(crate::KINDS.contains(&"mapping"));
    }

    fn error_of(r: Result<TransformSpec, SettingError>) -> SettingError {
        match r {
            Ok(s) => panic!("accepted: {s:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn config_errors_name_their_field() {
        let known = TRANSFORMATIONS.join(", ");
        for (field, decl, at, says) in [
            (
                "rate_class",
                json!({"decode": "rt_cd"}),
                "mapping.fields.rate_class.decode",
                "unknown transformation `decode`",
            ),
            (
                "rate_class",
                json!({"code": "rt_cd"}),
                "mapping.fields.rate_class.map",
                "needs its `map`",
            ),
            (
                "rate_class",
                json!({"code": "rt_cd", "map": {}}),
                "mapping.fields.rate_class.map",
                "at least one",
            ),
            (
                "rate_class",
                json!({"code": "rt_cd", "map": {"A": "a"}, "unknown": "skip"}),
                "mapping.fields.rate_class.unknown",
                "dead_letter",
            ),
            (
                "first_name",
                json!({"title": "a", "separator": ", "}),
                "mapping.fields.first_name.separator",
                "not an option of `title`",
            ),
            (
                "first_name",
                json!({"title": "a", "lower": "b"}),
                "mapping.fields.first_name",
                "one transformation",
            ),
            (
                "first_name",
                json!({"omit_empty": true}),
                "mapping.fields.first_name",
                "name a transformation",
            ),
            (
                "first_name",
                json!(3),
                "mapping.fields.first_name",
                "a column name",
            ),
            (
                "account_number",
                json!(" "),
                "mapping.fields.account_number",
                "a column name",
            ),
            (
                "connected_date",
                json!({"date": "conn_dt", "format": "YYYYMM"}),
                "mapping.fields.connected_date.format",
                "YYYY, MM and DD",
            ),
            (
                "connected_date",
                json!({"date": "conn_dt", "format": "YYYYMMDDHH"}),
                "mapping.fields.connected_date.format",
                "separators",
            ),
            (
                "connected_date",
                json!({"date": "conn_dt", "format": "YYYYMMDDDD"}),
                "mapping.fields.connected_date.format",
                "twice",
            ),
            (
                "address",
                json!({"concat": [{"title": "a", "omit_empty": true}]}),
                "mapping.fields.address.concat[0].omit_empty",
                "null and empty parts",
            ),
            (
                "address",
                json!({"concat": [{"titel": "a"}]}),
                "mapping.fields.address.concat[0].titel",
                "unknown transformation",
            ),
            (
                "address",
                json!({"concat": []}),
                "mapping.fields.address.concat",
                "at least one",
            ),
            (
                "legacy_acct_id",
                json!({"subtract": ["a"]}),
                "mapping.fields.legacy_acct_id.subtract",
                "at least 2",
            ),
            (
                "legacy_acct_id",
                json!({"reference": "cust_acct", "key": []}),
                "mapping.fields.legacy_acct_id.key",
                "at least 1",
            ),
            (
                "legacy_acct_id",
                json!({"reference": "cust_acct"}),
                "mapping.fields.legacy_acct_id.key",
                "the columns",
            ),
            (
                "legacy_acct_id",
                json!({"reference": ""}),
                "mapping.fields.legacy_acct_id.reference",
                "the table",
            ),
            (
                "budget_billing",
                json!({"flag": "b", "omit_empty": "yes"}),
                "mapping.fields.budget_billing.omit_empty",
                "true or false",
            ),
            (
                "nickname",
                json!("cust_nm_first"),
                "mapping.fields.nickname",
                "has no field `nickname`",
            ),
            ("id", json!("acct_id"), "mapping.fields.id", "derived"),
        ] {
            let e = error_of(customers_with(field, decl.clone()));
            assert_eq!(e.field.as_deref(), Some(at), "{decl}: {e:?}");
            assert!(e.message.contains(says), "{decl}: {e:?}");
        }
        let e = error_of(customers_with("rate_class", json!({"decode": "rt_cd"})));
        assert!(e.message.contains(&known), "{e:?}");

        let ok = customers();
        let with = |path: &[&str], v: Value| {
            let mut s = ok.clone();
            let mut at = &mut s;
            for p in &path[..path.len() - 1] {
                at = &mut at[*p];
            }
            at[path[path.len() - 1]] = v;
            compile("customers", &s, &entities(), true)
        };
        for (path, v, at, says) in [
            (
                &["mapping", "table"][..],
                json!("bill_hdr"),
                "mapping.table",
                "not one of the inputs",
            ),
            (
                &["mapping", "key"][..],
                json!([]),
                "mapping.key",
                "primary key",
            ),
            (
                &["mapping", "key"][..],
                json!(["acct_id", "acct_id"]),
                "mapping.key[1]",
                "twice",
            ),
            (
                &["mapping", "fields"][..],
                json!({}),
                "mapping.fields",
                "at least one",
            ),
            (
                &["output"][..],
                json!("client"),
                "output",
                "unknown entity `client`",
            ),
            (&["inputs"][..], json!([]), "inputs", "table"),
            (&["parallel"][..], json!(0), "parallel", "between"),
            (&["batch"][..], json!(0), "batch", "between"),
            (&["key"][..], json!(" "), "key", "orders"),
        ] {
            let e = error_of(with(path, v.clone()));
            assert_eq!(e.field.as_deref(), Some(at), "{path:?} = {v}: {e:?}");
            assert!(e.message.contains(says), "{path:?} = {v}: {e:?}");
        }
        // `table` may be left out with one input, not with two
        let mut s = ok.clone();
        s["mapping"].as_object_mut().unwrap().remove("table");
        assert!(compile("customers", &s, &entities(), true).is_ok());
        s["inputs"] = json!(["cust_acct", "bill_hdr"]);
        let e = error_of(compile("customers", &s, &entities(), true));
        assert_eq!(e.field.as_deref(), Some("mapping.table"));
        // an unknown setting of the block, and no block
        let e = error_of(with(&["mapping", "tables"], json!("x")));
        assert!(
            e.field.as_deref().unwrap_or("").starts_with("mapping"),
            "{e:?}"
        );
        let mut s = ok.clone();
        s.as_object_mut().unwrap().remove("mapping");
        assert!(error_of(compile("customers", &s, &entities(), true))
            .message
            .contains("mapping"));
        // without a source the inputs are the service's entities
        let e = crate::configure(
            "customers",
            "mapping",
            &ok,
            &entities(),
            std::path::Path::new("."),
        )
        .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("inputs[0]"));
        assert!(e.message.contains("`source`"), "{e:?}");
    }

    struct NoIo;

    #[async_trait::async_trait]
    impl PlanIo for NoIo {
        async fn state(&self, _: &[String]) -> Result<HashMap<String, String>, StoreError> {
            Ok(HashMap::new())
        }
        async fn group(&self, _: &str) -> Result<Vec<(String, String)>, StoreError> {
            Ok(Vec::new())
        }
        async fn lookup(&self, _: &str, _: &str) -> Result<Option<Map<String, Value>>, StoreError> {
            Ok(None)
        }
    }

    #[tokio::test]
    async fn the_planner_writes_puts_tombstones_and_dead_letters() {
        let planner = plan("customers").planner();
        let row = |id: i64, rt: &str| {
            json!({"acct_id": id, "acct_num": "n", "cust_nm_first": "ANN", "rt_cd": rt,
                   "svc_type": "E", "stat_cd": "A"})
        };
        let inputs = vec![
            input("cust_acct", ChangeOp::Create, row(1, "RES")),
            input("cust_acct", ChangeOp::Update, row(1, "BAD")),
            input("cust_acct", ChangeOp::Delete, json!({"acct_id": "2"})),
        ];
        let outcome = planner.plan(&NoIo, &inputs).await.unwrap();
        assert_eq!(outcome.dead.len(), 1);
        assert_eq!(outcome.dead[0].0, 1);
        assert!(outcome.dead[0].1.contains("\"BAD\""), "{:?}", outcome.dead);
        assert_eq!(outcome.writes.len(), 2);
        match &outcome.writes[0] {
            (OutputWrite::Put { id, payload }, from) => {
                assert_eq!((id.as_str(), from.as_slice()), (CUST_1, &[0][..]));
                let doc: Value = serde_json::from_str(payload).unwrap();
                assert_eq!(doc["first_name"], "Ann");
            }
            other => panic!("{other:?}"),
        }
        match &outcome.writes[1] {
            (OutputWrite::Delete { id }, from) => {
                assert_eq!((id.as_str(), from.as_slice()), (CUST_2, &[2][..]))
            }
            other => panic!("{other:?}"),
        }
    }

    /// A hen's document appears after its first lookup (another processor writes it).
    struct LateHen {
        asked: std::sync::atomic::AtomicUsize,
        appears_after: usize,
    }

    #[async_trait::async_trait]
    impl PlanIo for LateHen {
        async fn state(&self, _: &[String]) -> Result<HashMap<String, String>, StoreError> {
            Ok(HashMap::new())
        }
        async fn group(&self, _: &str) -> Result<Vec<(String, String)>, StoreError> {
            Ok(Vec::new())
        }
        async fn lookup(
            &self,
            entity: &str,
            id: &str,
        ) -> Result<Option<Map<String, Value>>, StoreError> {
            let n = self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let hen = legacy_id("zequi_hen", &[&json!("100"), &json!("H1")]).unwrap();
            Ok(
                (entity == "hen" && id == hen && n >= self.appears_after).then(|| {
                    json!({"coop_id": "coop-of-h1"})
                        .as_object()
                        .unwrap()
                        .clone()
                }),
            )
        }
    }

    fn lay_reports(wait_ms: u64) -> TransformPlanner {
        let hen = EntityInfo {
            name: "hen".into(),
            fields: Some(vec!["coop_id".into(), "name".into()]),
            properties: None,
        };
        let lay = EntityInfo {
            name: "lay_report".into(),
            fields: None,
            properties: None,
        };
        let spec = compile(
            "lay_reports",
            &json!({"inputs": ["zafru_lege"], "output": "lay_report", "mapping": {
                "key": ["mandt", "aufnr"],
                "fields": {
                    "hen_id": {"reference": "zequi_hen", "key": ["mandt", "equnr"]},
                    "coop_id": {"lookup": "hen", "id": {"reference": "zequi_hen", "key": ["mandt", "equnr"]},
                                "field": "coop_id", "wait_ms": wait_ms},
                    "source_id": {"reference": "zfarm_mstr", "key": ["mandt", {"value": "1000"}]}
                }}}),
            &[hen, lay],
            true,
        )
        .unwrap();
        TransformPlanner {
            spec,
            skip_unchanged: false,
        }
    }

    #[tokio::test]
    async fn a_lookup_waits_for_its_document_then_dead_letters_the_row() {
        let row = |equnr: &str| {
            input(
                "zafru_lege",
                ChangeOp::Create,
                json!({"mandt": "100", "aufnr": "A1", "equnr": equnr}),
            )
        };
        // the hen appears on the third look: the row waits for it
        let io = LateHen {
            asked: Default::default(),
            appears_after: 2,
        };
        let outcome = lay_reports(5_000).plan(&io, &[row("H1")]).await.unwrap();
        assert!(outcome.dead.is_empty(), "{:?}", outcome.dead);
        let (OutputWrite::Put { payload, .. }, _) = &outcome.writes[0] else {
            panic!("{:?}", outcome.writes)
        };
        let doc: Value = serde_json::from_str(payload).unwrap();
        assert_eq!(doc["coop_id"], "coop-of-h1");
        assert_eq!(
            doc["hen_id"],
            legacy_id("zequi_hen", &[&json!("100"), &json!("H1")]).unwrap()
        );
        // a constant in a reference's key
        assert_eq!(
            doc["source_id"],
            legacy_id("zfarm_mstr", &[&json!("100"), &json!("1000")]).unwrap()
        );
        assert_eq!(io.asked.load(std::sync::atomic::Ordering::SeqCst), 3);
        // a hen that never appears: the row waits `wait_ms`, then is a dead letter naming it
        let started = std::time::Instant::now();
        let outcome = lay_reports(100)
            .plan(&NoIo, &[row("H1"), row("H2")])
            .await
            .unwrap();
        assert!(started.elapsed() >= std::time::Duration::from_millis(100));
        assert_eq!(outcome.dead.len(), 2);
        assert!(
            outcome.dead[0].1.contains("`hen`") && outcome.dead[0].1.contains("does not exist"),
            "{:?}",
            outcome.dead
        );
        // a delete reads nothing
        let outcome = lay_reports(60_000)
            .plan(
                &NoIo,
                &[input(
                    "zafru_lege",
                    ChangeOp::Delete,
                    json!({"mandt": "100", "aufnr": "A1"}),
                )],
            )
            .await
            .unwrap();
        assert!(matches!(outcome.writes[0].0, OutputWrite::Delete { .. }));
    }

    #[test]
    fn lookups_are_checked_with_the_config() {
        let hen = EntityInfo {
            name: "hen".into(),
            fields: Some(vec!["coop_id".into()]),
            properties: None,
        };
        let out = EntityInfo {
            name: "lay_report".into(),
            fields: None,
            properties: None,
        };
        let with = |decl: Value| {
            compile(
                "l",
                &json!({"inputs": ["t"], "output": "lay_report",
                        "mapping": {"key": ["k"], "fields": {"coop_id": decl}}}),
                &[hen.clone(), out.clone()],
                true,
            )
        };
        for (decl, at, says) in [
            (
                json!({"lookup": "hens", "id": "h", "field": "coop_id"}),
                "mapping.fields.coop_id.lookup",
                "unknown entity `hens`",
            ),
            (
                json!({"lookup": "hen", "id": "h", "field": "coops"}),
                "mapping.fields.coop_id.field",
                "no field `coops`",
            ),
            (
                json!({"lookup": "hen", "field": "coop_id"}),
                "mapping.fields.coop_id.id",
                "the document's id",
            ),
            (
                json!({"lookup": "hen", "id": "h"}),
                "mapping.fields.coop_id.field",
                "the field",
            ),
            (
                json!({"lookup": "hen", "id": "h", "field": "coop_id", "wait_ms": -1}),
                "mapping.fields.coop_id.wait_ms",
                "milliseconds",
            ),
            (
                json!({"concat": [{"lookup": "hen", "id": "h", "field": "coop_id"}]}),
                "mapping.fields.coop_id.concat[0].lookup",
                "a field of its own",
            ),
            (
                json!({"reference": "t", "key": [{"value": ""}]}),
                "mapping.fields.coop_id.key[0]",
                "constant",
            ),
            (
                json!({"reference": "t", "key": [{"values": "x"}]}),
                "mapping.fields.coop_id.key[0]",
                "column name",
            ),
        ] {
            let e = error_of(with(decl.clone()));
            assert_eq!(e.field.as_deref(), Some(at), "{decl}: {e:?}");
            assert!(e.message.contains(says), "{decl}: {e:?}");
        }
        assert!(with(json!({"lookup": "hen", "id": "h", "field": "id", "wait_ms": 0})).is_ok());
    }

    #[test]
    fn fields_are_checked_against_the_outputs_json_schema() {
        let schema = json!({"properties": {
            "paperless": {"type": "string"},
            "status": {"type": "string", "enum": ["active", "closed"]},
            "amount": {"type": "integer"},
            "total": {"type": ["number", "null"]},
            "count": {"type": "number"},
            "anything": {}
        }});
        let out = EntityInfo {
            name: "customer".into(),
            fields: EntityInfo::fields_of(Some(&schema)),
            properties: EntityInfo::properties_of(Some(&schema)),
        };
        let with = |field: &str, decl: Value| {
            compile(
                "c",
                &json!({"inputs": ["t"], "output": "customer",
                        "mapping": {"key": ["k"], "fields": {field: decl}}}),
                std::slice::from_ref(&out),
                true,
            )
        };
        for (field, decl, at, says) in [
            (
                "paperless",
                json!({"flag": "f"}),
                "mapping.fields.paperless",
                "makes `paperless` a string, but this transformation makes a boolean",
            ),
            (
                "amount",
                json!({"cents": "c"}),
                "mapping.fields.amount",
                "an integer, but this transformation makes a number",
            ),
            (
                "status",
                json!({"code": "s", "map": {"A": "active", "X": "gone"}}),
                "mapping.fields.status.map",
                "one of \"active\", \"closed\", but code X's value \"gone\" is not",
            ),
            (
                "status",
                json!({"code": "s", "map": {"A": "active"}, "unknown": {"default": "other"}}),
                "mapping.fields.status.unknown",
                "the default \"other\" is not",
            ),
            (
                "status",
                json!({"code": "s", "map": {"A": 1}}),
                "mapping.fields.status.map",
                "a string, but code A's value 1 is an integer",
            ),
            (
                "amount",
                json!({"int": "a", "default": "none"}),
                "mapping.fields.amount.default",
                "an integer, but the default \"none\" is a string",
            ),
        ] {
            let e = error_of(with(field, decl.clone()));
            assert_eq!(e.field.as_deref(), Some(at), "{decl}: {e:?}");
            assert!(e.message.contains(says), "{decl}: {e:?}");
        }
        for (field, decl) in [
            (
                "status",
                json!({"code": "s", "map": {"A": "active", "C": "closed"}, "unknown": {"default": "active"}}),
            ),
            ("total", json!({"cents": "c"})),
            ("count", json!({"int": "c"})),
            ("amount", json!({"subtract": ["a", "b"]})),
            ("paperless", json!("p")),
            ("anything", json!({"flag": "f"})),
        ] {
            assert!(with(field, decl.clone()).is_ok(), "{decl}");
        }
    }
}
