//! `pgoutput` tuples and snapshot rows as JSON documents: column types to JSON values, keys
//! to ids, commit times to Unix milliseconds.

use super::settings::Table;
use crate::plan::{Input, Item};
use pg_walstream::{ColumnData, TupleData};
use serde_json::{Map, Value};

/// A table's columns as the stream describes them.
pub(super) struct Relation {
    pub(super) table: Table,
    pub(super) entity: String,
    /// Name and type of each column, in the tuple's order.
    pub(super) columns: Vec<(String, u32)>,
    /// The primary key's columns (indexes into `columns`).
    pub(super) key: Vec<usize>,
}

/// A row change as the runtime carries it: no text of its own (a dead letter keeps the row).
pub(super) fn item(input: Input) -> Item<'static> {
    Item {
        input,
        raw: std::borrow::Cow::Borrowed(""),
    }
}

/// PostgreSQL's microseconds since 2000-01-01 as Unix milliseconds.
pub(super) fn pg_micros_to_unix_ms(micros: i64) -> i64 {
    const PG_EPOCH_MS: i64 = 946_684_800_000;
    micros.div_euclid(1000) + PG_EPOCH_MS
}

/// A key column's value as text (the input's id).
pub(super) fn text_of(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

/// The primary key's values of a snapshot row.
pub(super) fn key_of(row: &Map<String, Value>, key: &[String]) -> String {
    key.iter()
        .map(|k| text_of(row.get(k)))
        .collect::<Vec<_>>()
        .join(",")
}

/// A tuple as column → JSON value; an unchanged large value comes from the old tuple when
/// the stream sent one, else it is left out.
pub(super) fn row_of(
    relation: &Relation,
    tuple: &TupleData,
    old: Option<&TupleData>,
) -> Map<String, Value> {
    let mut row = Map::with_capacity(relation.columns.len());
    for (i, (name, type_id)) in relation.columns.iter().enumerate() {
        let Some(column) = tuple.columns.get(i) else {
            break;
        };
        let column = if column.is_unchanged() {
            match old.and_then(|o| o.columns.get(i)) {
                Some(c) if !c.is_unchanged() => c,
                _ => continue,
            }
        } else {
            column
        };
        row.insert(name.clone(), value_of(column, *type_id));
    }
    row
}

/// Built-in type ids of the columns given a JSON type other than text.
pub(super) mod oid {
    pub const BOOL: u32 = 16;
    pub const INT8: u32 = 20;
    pub const INT2: u32 = 21;
    pub const INT4: u32 = 23;
    pub const OID: u32 = 26;
    pub const JSON: u32 = 114;
    pub const FLOAT4: u32 = 700;
    pub const FLOAT8: u32 = 701;
    pub const NUMERIC: u32 = 1700;
    pub const JSONB: u32 = 3802;
    /// The types `value_of` reads as JSON (the snapshot copies them so, and every other type
    /// as its text, as the stream sends it).
    pub const AS_JSON: &[u32] = &[
        BOOL, INT8, INT2, INT4, OID, JSON, FLOAT4, FLOAT8, NUMERIC, JSONB,
    ];
}

/// One column's text as the JSON value its type suggests.
pub(super) fn value_of(column: &ColumnData, type_id: u32) -> Value {
    if column.is_null() {
        return Value::Null;
    }
    let Some(text) = column.as_str() else {
        return Value::Null;
    };
    let text = text.as_ref();
    match type_id {
        oid::BOOL => Value::Bool(text == "t"),
        oid::INT2 | oid::INT4 | oid::INT8 | oid::OID => text
            .parse::<i64>()
            .map(Value::from)
            .unwrap_or_else(|_| Value::String(text.to_owned())),
        oid::FLOAT4 | oid::FLOAT8 | oid::NUMERIC => {
            if let Ok(i) = text.parse::<i64>() {
                Value::from(i)
            } else {
                text.parse::<f64>()
                    .ok()
                    .and_then(serde_json::Number::from_f64)
                    .map(Value::Number)
                    // NaN and infinities stay text
                    .unwrap_or_else(|| Value::String(text.to_owned()))
            }
        }
        oid::JSON | oid::JSONB => {
            serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
        }
        _ => Value::String(text.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    #[test]
    pub(super) fn column_text_becomes_typed_json() {
        let t = |s: &str| ColumnData::text(s.as_bytes().to_vec());
        assert_eq!(value_of(&t("9840"), oid::INT4), json!(9840));
        assert_eq!(value_of(&t("98.40"), oid::NUMERIC), json!(98.4));
        assert_eq!(value_of(&t("12"), oid::NUMERIC), json!(12));
        assert_eq!(value_of(&t("NaN"), oid::NUMERIC), json!("NaN"));
        assert_eq!(value_of(&t("t"), oid::BOOL), json!(true));
        assert_eq!(value_of(&t("{\"a\":1}"), oid::JSONB), json!({"a": 1}));
        assert_eq!(value_of(&t("19980315"), 1043), json!("19980315"));
        assert_eq!(value_of(&ColumnData::null(), oid::INT4), Value::Null);
        assert_eq!(pg_micros_to_unix_ms(0), 946_684_800_000);
    }
}
