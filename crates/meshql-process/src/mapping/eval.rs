//! Evaluating a mapping's rules on a row: each transformation (`title`, `lower`, `int`,
//! `cents`, `date`, `flag`, `code`, `concat`, `add`, …) makes a field's value from the row's
//! columns, then the field's `default` applies. A `lookup` is read by the mapping itself
//! (`Mapping::document_with`), not here.

use super::ids::reference_id;
use super::row::{column_text, get, int, num, Num};
use super::rules::{Field, Rule, Unknown};
use meshql_core::legacy_id::key_text;
use serde_json::{Map, Value};

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
pub(super) fn value(f: &Field, name: &str, row: &Map<String, Value>) -> Result<Value, String> {
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
        Rule::Reference { table, key } => reference_id(table, key, name, row)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
