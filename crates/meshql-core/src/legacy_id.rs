//! The clean id of a legacy table's row: what a `mapping` processor writes a row as, and what
//! anyone who knows the table and the key can compute without asking meshql (CONTRACT
//! §14.2.3). Fixed for good: changing it would change every id.

use serde_json::Value;
use uuid::Uuid;

/// The namespace of [`legacy_id`]'s UUIDv5s (fixed: changing it would change every id).
pub const LEGACY_NAMESPACE: Uuid = Uuid::from_u128(0x6fa4a995_5b3f_41d4_a4a1_13b2a525552a);

/// A key value as [`legacy_id`] reads it (`None`: null, an object or an array): a number's
/// decimal digits (a float without a fraction as an integer), a string without its trailing
/// spaces, `true` / `false`.
pub fn key_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.trim_end_matches(' ').to_owned()),
        Value::Number(n) => Some(number_text(n)),
        Value::Bool(b) => Some(b.to_string()),
        Value::Null | Value::Array(_) | Value::Object(_) => None,
    }
}

fn number_text(n: &serde_json::Number) -> String {
    if let Some(i) = n.as_i64() {
        i.to_string()
    } else if let Some(u) = n.as_u64() {
        u.to_string()
    } else {
        let f = n.as_f64().unwrap_or(f64::NAN);
        if f.fract() == 0.0 && f.abs() < 9.0e15 {
            (f as i64).to_string()
        } else {
            f.to_string()
        }
    }
}

/// The clean id of the row of `table` whose key columns hold `key_values` (in the key's
/// order): the UUIDv5 in [`LEGACY_NAMESPACE`] of the JSON text `["<table lower-cased>",
/// "<key_text of each value>", …]`. `None` when a value is null, an object or an array.
pub fn legacy_id(table: &str, key_values: &[&Value]) -> Option<String> {
    let mut name = vec![table.trim().to_ascii_lowercase()];
    for v in key_values {
        name.push(key_text(v)?);
    }
    let text = serde_json::to_string(&name).expect("strings serialise");
    Some(Uuid::new_v5(&LEGACY_NAMESPACE, text.as_bytes()).to_string())
}
