//! Local references: `#`, `#/$defs/...`, `#/definitions/...` within the same document.

use super::MAX_REF_HOPS;
use serde_json::{Map, Value};
use std::borrow::Cow;

pub(super) fn reference(schema: &Value) -> Option<String> {
    schema
        .get("$ref")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// Whether a `$ref` appears anywhere in the value (equal text can then mean different
/// schemas, since the targets may differ).
pub(super) fn has_ref(value: &Value) -> bool {
    match value {
        Value::Object(map) => map.contains_key("$ref") || map.values().any(has_ref),
        Value::Array(items) => items.iter().any(has_ref),
        _ => false,
    }
}

/// The target of a reference within the same document (`#`, `#/$defs/x`), if it has one.
pub(super) fn resolve<'v>(root: &'v Value, reference: &str) -> Option<&'v Value> {
    let fragment = reference.strip_prefix('#')?;
    if fragment.is_empty() {
        return Some(root);
    }
    if !fragment.starts_with('/') {
        return None; // an `$anchor`: not followed
    }
    root.pointer(&fragment.replace("%25", "%"))
}

/// The schema a node stands for: a local `$ref` replaced by its target, the node's other
/// keywords laid over it. `Err` carries a reference that cannot be followed.
pub(super) fn expand<'v>(node: &'v Value, root: &'v Value) -> Result<Cow<'v, Value>, String> {
    let mut current = Cow::Borrowed(node);
    for _ in 0..MAX_REF_HOPS {
        let Some(target_ref) = reference(&current) else {
            return Ok(current);
        };
        let target = resolve(root, &target_ref).ok_or_else(|| target_ref.clone())?;
        let mut merged = match target {
            Value::Object(map) => map.clone(),
            Value::Bool(true) => Map::new(),
            Value::Bool(false) => return Ok(Cow::Owned(Value::Bool(false))),
            _ => return Err(target_ref),
        };
        if let Value::Object(siblings) = current.as_ref() {
            for (keyword, value) in siblings {
                if keyword != "$ref" {
                    merged.insert(keyword.clone(), value.clone());
                }
            }
        }
        current = Cow::Owned(Value::Object(merged));
    }
    Err(reference(&current).unwrap_or_default())
}

/// The node without its `$ref` (for two equal references that cannot be followed).
pub(super) fn without_ref(node: &Value) -> Cow<'_, Value> {
    match node {
        Value::Object(map) if map.contains_key("$ref") => {
            let mut rest = map.clone();
            rest.remove("$ref");
            Cow::Owned(Value::Object(rest))
        }
        _ => Cow::Borrowed(node),
    }
}
