//! The fields checked against the output entity's JSON Schema.

use super::*;
use serde_json::json;

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
        required: EntityInfo::required_of(Some(&schema)),
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
