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
        Ok(Self { validator })
    }

    /// Every violation as `{"path": "/field", "message": "..."}` (at most 20).
    pub fn violations(&self, instance: &Value) -> Vec<Value> {
        // the common case first: `is_valid` stops at the first failure and builds no errors
        if self.validator.is_valid(instance) {
            return Vec::new();
        }
        self.validator
            .iter_errors(instance)
            .take(20)
            .map(|e| {
                let path = e.instance_path().to_string();
                json!({
                    "path": if path.is_empty() { "/".to_owned() } else { path },
                    "message": e.to_string(),
                })
            })
            .collect()
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
        let bad_time = json!({"name": "x", "coop_id": "7f0c2c1e-2f4b-4bb8-9d77-3b0e6f7c6a11", "seen": "yesterday"});
        assert_eq!(v.violations(&bad_time).len(), 1);
    }
}
