//! Reading a legacy row's columns: by name (exactly, else without regard to ASCII case), as
//! text, and as numbers (from JSON numbers and numeric text alike).

use meshql_core::legacy_id::key_text;
use serde_json::{Map, Value};

/// A column's value (`None`: null or absent): its exact name, else without regard to ASCII
/// case.
pub(super) fn get<'a>(row: &'a Map<String, Value>, column: &str) -> Option<&'a Value> {
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

pub(super) fn column_text(
    row: &Map<String, Value>,
    field: &str,
    column: &str,
) -> Result<Option<String>, String> {
    get(row, column).map(|v| text(v, field, column)).transpose()
}

/// A number read from a column.
#[derive(Debug, Clone, Copy)]
pub(super) enum Num {
    Int(i64),
    Float(f64),
}

/// A column's number (`None`: null, absent or blank text).
pub(super) fn num(
    row: &Map<String, Value>,
    field: &str,
    column: &str,
) -> Result<Option<Num>, String> {
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
pub(super) fn int(
    row: &Map<String, Value>,
    field: &str,
    column: &str,
) -> Result<Option<i64>, String> {
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
