//! JSON Schema (draft-07) validation of request bodies, with the formats MeshQL's schemas
//! use (`uuid`, `date`, `date-time`, ...) enforced.

use serde_json::{json, Value};
use thiserror::Error;

#[derive(Debug, Error)]
#[error("invalid JSON Schema: {0}")]
pub struct ValidatorError(pub String);

/// A compiled schema.
pub struct PayloadValidator {
    validator: jsonschema::Validator,
    /// The schema, for the integer range check (JSON Schema's `integer` is any number
    /// without a fraction, 1e300 included).
    schema: Value,
}

impl std::fmt::Debug for PayloadValidator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PayloadValidator")
    }
}

fn is_uuid(s: &str) -> bool {
    uuid::Uuid::try_parse(s).is_ok() && s.len() == 36
}

impl PayloadValidator {
    pub fn new(schema: &Value) -> Result<Self, ValidatorError> {
        // `$schema` selects the draft when present; draft-07 otherwise.
        let mut options = jsonschema::options();
        if schema.get("$schema").is_none() {
            options = options.with_draft(jsonschema::Draft::Draft7);
        }
        let validator = options
            .should_validate_formats(true)
            .with_format("uuid", is_uuid)
            .build(schema)
            .map_err(|e| ValidatorError(e.to_string()))?;
        Ok(Self {
            validator,
            schema: schema.clone(),
        })
    }

    /// Every violation as `{"path": "/field", "message": "..."}` (at most 20).
    pub fn violations(&self, instance: &Value) -> Vec<Value> {
        let mut found = Vec::new();
        integers_in_range(&self.schema, instance, &mut String::new(), &mut found);
        // the common case first: `is_valid` stops at the first failure and builds no errors
        if found.is_empty() && self.validator.is_valid(instance) {
            return Vec::new();
        }
        let schema_errors = self.validator.iter_errors(instance).map(|e| {
            let path = e.instance_path().to_string();
            json!({
                "path": if path.is_empty() { "/".to_owned() } else { path },
                "message": e.to_string(),
            })
        });
        found.extend(schema_errors);
        found.truncate(20);
        found
    }
}

/// Whether `schema` declares `type: integer` (alone or among others).
fn declares_integer(schema: &Value) -> bool {
    match schema.get("type") {
        Some(Value::String(t)) => t == "integer",
        Some(Value::Array(types)) => types.iter().any(|t| t == "integer"),
        _ => false,
    }
}

/// Violations for numbers where the schema (through `properties` and `items`) declares an
/// integer but the value does not fit in 64 bits: JSON Schema accepts any number without a
/// fraction as an integer, so `18446744073709551616` (parsed as a float) would be stored as
/// 1.8446744073709552e19 and then break every typed read of the document.
fn integers_in_range(schema: &Value, value: &Value, path: &mut String, out: &mut Vec<Value>) {
    match value {
        Value::Number(n)
            if declares_integer(schema)
                && !(n.is_i64() || n.is_u64())
                && n.as_f64().is_some_and(|f| f.fract() == 0.0) =>
        {
            out.push(json!({
                "path": if path.is_empty() { "/".to_owned() } else { path.clone() },
                "message": format!(
                    "{n} is out of range for an integer (from {} to {})",
                    i64::MIN,
                    u64::MAX
                ),
            }));
        }
        Value::Object(map) => {
            let Some(Value::Object(properties)) = schema.get("properties") else {
                return;
            };
            for (key, sub) in properties {
                if let Some(v) = map.get(key) {
                    let len = path.len();
                    path.push('/');
                    path.push_str(&key.replace('~', "~0").replace('/', "~1"));
                    integers_in_range(sub, v, path, out);
                    path.truncate(len);
                }
            }
        }
        Value::Array(items) => {
            let Some(sub) = schema.get("items").filter(|s| s.is_object()) else {
                return;
            };
            for (i, v) in items.iter().enumerate() {
                let len = path.len();
                path.push('/');
                path.push_str(&i.to_string());
                integers_in_range(sub, v, path, out);
                path.truncate(len);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hen() -> PayloadValidator {
        PayloadValidator::new(&json!({
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "additionalProperties": false,
            "required": ["name", "coop_id"],
            "properties": {
                "name": {"type": "string"},
                "coop_id": {"type": "string", "format": "uuid"},
                "dob": {"type": "string", "format": "date"},
                "seen": {"type": "string", "format": "date-time"},
                "eggs": {"type": "integer", "minimum": 0, "maximum": 10}
            }
        }))
        .unwrap()
    }

    #[test]
    fn accepts_valid_payloads() {
        let v = hen();
        let ok = json!({"name": "chuck", "coop_id": "7f0c2c1e-2f4b-4bb8-9d77-3b0e6f7c6a11",
                        "dob": "2024-02-29", "seen": "2024-01-01T10:00:00Z", "eggs": 3});
        assert!(v.violations(&ok).is_empty(), "{:?}", v.violations(&ok));
    }

    #[test]
    fn names_each_violation() {
        let v = hen();
        let bad =
            json!({"coop_id": "not-a-uuid", "dob": "2024-13-01", "eggs": 11, "colour": "red"});
        let errs = v.violations(&bad);
        let paths: Vec<&str> = errs.iter().map(|e| e["path"].as_str().unwrap()).collect();
        for expected in ["/coop_id", "/dob", "/eggs"] {
            assert!(paths.contains(&expected), "{expected} in {errs:?}");
        }
        let text = serde_json::to_string(&errs).unwrap();
        assert!(
            text.contains("name"),
            "missing required field named: {text}"
        );
        assert!(text.contains("colour"), "unexpected field named: {text}");
        let huge: Value = serde_json::from_str(
            r#"{"name": "x", "coop_id": "7f0c2c1e-2f4b-4bb8-9d77-3b0e6f7c6a11", "eggs": 18446744073709551616}"#,
        )
        .unwrap();
        let errs = v.violations(&huge);
        assert_eq!(errs[0]["path"], "/eggs", "{errs:?}");
        assert!(
            errs[0]["message"]
                .as_str()
                .unwrap()
                .contains("out of range for an integer"),
            "{errs:?}"
        );
        let bad_time = json!({"name": "x", "coop_id": "7f0c2c1e-2f4b-4bb8-9d77-3b0e6f7c6a11", "seen": "yesterday"});
        assert_eq!(v.violations(&bad_time).len(), 1);
    }
}

#[cfg(test)]
mod integer_range_tests {
    use super::*;

    #[test]
    fn integers_beyond_64_bits_are_refused_at_any_depth() {
        let v = PayloadValidator::new(&json!({
            "type": "object",
            "properties": {
                "counts": {"type": "array", "items": {"type": ["integer", "null"]}},
                "inner": {"type": "object", "properties": {"n": {"type": "integer"}}},
                "ratio": {"type": "number"}
            }
        }))
        .unwrap();
        let parse = |s: &str| serde_json::from_str::<Value>(s).unwrap();
        let ok = parse(
            r#"{"counts": [1, -9223372036854775808, 18446744073709551615, null], "inner": {"n": 3}, "ratio": 1e300}"#,
        );
        assert!(v.violations(&ok).is_empty(), "{:?}", v.violations(&ok));
        let bad = parse(r#"{"counts": [1, 18446744073709551616], "inner": {"n": -1e19}}"#);
        let paths: Vec<String> = v
            .violations(&bad)
            .iter()
            .map(|e| e["path"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(paths, vec!["/counts/1", "/inner/n"]);
    }
}
