//! The checks of a mapping's fields against the output entity's JSON Schema, made with the
//! config: the JSON type a transformation makes, and a code table's values, its `unknown`
//! default and a field's `default` against the property's `type` and `enum`.

use super::rules::{err, Field, Rule, Unknown};
use meshql_core::SettingError;
use serde_json::Value;

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
pub(super) fn fits_schema(
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
    let value_fits =
        |v: &Value, here: String, what: &str| value_fits(v, prop, here, what, entity, name);
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

/// Checks a constant written to field `name` (a code's value, a default) against the output's
/// JSON Schema property `prop`: its type and any `enum`. `what` names it in the message.
pub fn value_fits(
    v: &Value,
    prop: &Value,
    here: String,
    what: &str,
    entity: &str,
    name: &str,
) -> Result<(), SettingError> {
    let schema_says =
        |what: String| format!("entity `{entity}`'s JSON Schema makes `{name}` {what}");
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
}
