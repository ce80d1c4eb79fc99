//! The ids a mapping derives ([`legacy_id`] of a table and key values): its row's document id
//! from the table's key columns, and a `reference`'s foreign key from this row's columns (and
//! constants), which is the id the referred table's mapping gives its row.

use super::row::get;
use super::rules::KeyPart;
use meshql_core::legacy_id::legacy_id;
use serde_json::{Map, Value};

/// The clean id of `row` of `table` whose key columns are `key` (an error when a key column is
/// null or missing).
pub(super) fn row_id(
    table: &str,
    key: &[String],
    row: &Map<String, Value>,
) -> Result<String, String> {
    let mut values = Vec::with_capacity(key.len());
    for k in key {
        match get(row, k) {
            Some(v @ (Value::String(_) | Value::Number(_) | Value::Bool(_))) => values.push(v),
            Some(v) => {
                return Err(format!(
                    "key column `{k}` of `{}` is {v}, not a key value",
                    table
                ))
            }
            None => {
                return Err(format!(
                    "key column `{k}` of `{}` is null or missing",
                    table
                ))
            }
        }
    }
    Ok(legacy_id(table, &values).expect("key values are scalars"))
}

/// A `reference`'s value for field `name`: the id of the row of `table` whose key is `key`'s
/// values in `row`; null when a key column is null or blank.
pub(super) fn reference_id(
    table: &str,
    key: &[KeyPart],
    name: &str,
    row: &Map<String, Value>,
) -> Result<Value, String> {
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
            Some(v @ (Value::String(_) | Value::Number(_) | Value::Bool(_))) => values.push(v),
            Some(v) => {
                return Err(format!(
                    "field `{name}`: column `{c}` is {v}, not a key value"
                ))
            }
        }
    }
    Ok(Value::String(
        legacy_id(table, &values).expect("key values are scalars"),
    ))
}
