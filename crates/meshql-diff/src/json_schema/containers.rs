//! Keywords on objects and arrays: `properties`, `required`, `additionalProperties`,
//! `patternProperties`, `items`, `prefixItems`, `contains`, `uniqueItems` ...

use super::{child, is_false, names, Differ, TRUE};
use crate::change::Level;
use serde_json::{Map, Value};

impl Differ<'_> {
    pub(super) fn objects(&mut self, o: &Map<String, Value>, n: &Map<String, Value>, path: &str) {
        let empty = Map::new();
        let old_props = o
            .get("properties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let new_props = n
            .get("properties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let old_required = names(o.get("required"));
        let new_required = names(n.get("required"));
        let props_path = child(path, "properties");

        for (name, old_prop) in old_props {
            let at = child(&props_path, name);
            match new_props.get(name) {
                Some(new_prop) => self.schema(old_prop, new_prop, &at),
                None => self.property_removed(name, n, &at),
            }
        }
        for name in new_props.keys() {
            if old_props.contains_key(name) || new_required.contains(&name.as_str()) {
                continue; // compared above, or reported as a new required property below
            }
            self.push(
                Level::Safe,
                &child(&props_path, name),
                format!("optional property `{name}` added"),
            );
        }
        for name in new_required.iter().filter(|r| !old_required.contains(r)) {
            let at = child(&props_path, name);
            let message = if old_props.contains_key(*name) {
                format!("property `{name}` is now required: documents without it are rejected")
            } else {
                format!("new required property `{name}`: documents without it are rejected")
            };
            self.push(Level::Breaking, &at, message);
        }
        for name in old_required.iter().filter(|r| !new_required.contains(r)) {
            if old_props.contains_key(*name) && !new_props.contains_key(*name) {
                continue; // the removal of the property says it
            }
            self.push(
                Level::Safe,
                &child(&props_path, name),
                format!("property `{name}` is no longer required"),
            );
        }

        self.closing(o, n, path, "additionalProperties");
        self.closing(o, n, path, "unevaluatedProperties");
        self.pattern_properties(o, n, path);
        self.optional_subschema(o, n, path, "propertyNames");
    }

    fn property_removed(&mut self, name: &str, n: &Map<String, Value>, at: &str) {
        let closed = (is_false(n.get("additionalProperties"))
            || is_false(n.get("unevaluatedProperties")))
            && !n.contains_key("patternProperties");
        let governed = n
            .get("additionalProperties")
            .is_some_and(|ap| !matches!(ap, Value::Bool(_)))
            || n.contains_key("patternProperties");
        if closed {
            self.push(
                Level::Breaking,
                at,
                format!(
                    "property `{name}` removed while additional properties are not allowed: \
                     documents that carry it are rejected"
                ),
            );
        } else if governed {
            self.push(
                Level::Dangerous,
                at,
                format!(
                    "property `{name}` removed: documents that carry it are now checked \
                     against additionalProperties or patternProperties (not classified)"
                ),
            );
        } else {
            self.push(
                Level::Dangerous,
                at,
                format!(
                    "property `{name}` removed: stored documents still carry it and clients \
                     may still send it, undeclared"
                ),
            );
        }
    }

    /// `additionalProperties`, `unevaluatedProperties`, `additionalItems`,
    /// `unevaluatedItems`: absent is `true`; turning `false` closes the object or array.
    fn closing(&mut self, o: &Map<String, Value>, n: &Map<String, Value>, path: &str, kw: &str) {
        let (old, new) = (o.get(kw), n.get(kw));
        let at = child(path, kw);
        let what = if kw.ends_with("Items") {
            "items beyond the listed positions"
        } else {
            "properties not declared in `properties`"
        };
        match (is_false(old), is_false(new)) {
            (true, true) => {}
            (false, true) => self.push(
                Level::Breaking,
                &at,
                format!("{kw} turned false: documents with {what} are rejected"),
            ),
            (true, false) => self.push(
                Level::Safe,
                &at,
                format!("{kw} is no longer false: {what} are accepted"),
            ),
            (false, false) => {
                if old.is_some() || new.is_some() {
                    self.schema(old.unwrap_or(&TRUE), new.unwrap_or(&TRUE), &at);
                }
            }
        }
    }

    /// A keyword whose absence means "anything" (`propertyNames`).
    fn optional_subschema(
        &mut self,
        o: &Map<String, Value>,
        n: &Map<String, Value>,
        path: &str,
        kw: &str,
    ) {
        let (old, new) = (o.get(kw), n.get(kw));
        if old.is_some() || new.is_some() {
            self.schema(old.unwrap_or(&TRUE), new.unwrap_or(&TRUE), &child(path, kw));
        }
    }

    fn pattern_properties(&mut self, o: &Map<String, Value>, n: &Map<String, Value>, path: &str) {
        let empty = Map::new();
        let old = o
            .get("patternProperties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let new = n
            .get("patternProperties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let base = child(path, "patternProperties");
        for (pattern, old_schema) in old {
            let at = child(&base, pattern);
            match new.get(pattern) {
                Some(new_schema) => self.schema(old_schema, new_schema, &at),
                None => self.push(
                    Level::Dangerous,
                    &at,
                    format!(
                        "pattern property `{pattern}` removed: matching properties now fall \
                         to additionalProperties (not classified)"
                    ),
                ),
            }
        }
        for pattern in new.keys().filter(|p| !old.contains_key(*p)) {
            self.push(
                Level::Dangerous,
                &child(&base, pattern),
                format!(
                    "pattern property `{pattern}` added: properties matching it are now checked \
                     against its schema, and documents may already carry some (not classified)"
                ),
            );
        }
    }

    pub(super) fn arrays(&mut self, o: &Map<String, Value>, n: &Map<String, Value>, path: &str) {
        let at = child(path, "items");
        match (o.get("items"), n.get("items")) {
            (None, None) => {}
            (Some(Value::Array(old)), Some(Value::Array(new))) => self.positions(old, new, &at),
            (Some(Value::Array(_)), _) | (_, Some(Value::Array(_))) => self.push(
                Level::Dangerous,
                &at,
                "`items` changed between a list of schemas (one per position) and one schema \
                 for every item; not classified",
            ),
            (old, new) => self.schema(old.unwrap_or(&TRUE), new.unwrap_or(&TRUE), &at),
        }
        let no_items = Vec::new();
        let old_prefix = o.get("prefixItems").and_then(Value::as_array);
        let new_prefix = n.get("prefixItems").and_then(Value::as_array);
        if old_prefix.is_some() || new_prefix.is_some() {
            self.positions(
                old_prefix.unwrap_or(&no_items),
                new_prefix.unwrap_or(&no_items),
                &child(path, "prefixItems"),
            );
        }
        self.closing(o, n, path, "additionalItems");
        self.closing(o, n, path, "unevaluatedItems");

        let at = child(path, "contains");
        match (o.get("contains"), n.get("contains")) {
            (None, None) => {}
            (None, Some(_)) => self.push(
                Level::Breaking,
                &at,
                "contains added: arrays without a matching item are rejected",
            ),
            (Some(_), None) => self.push(Level::Safe, &at, "contains removed"),
            (Some(old), Some(new)) => self.schema(old, new, &at),
        }

        let unique = |m: &Map<String, Value>| m.get("uniqueItems") == Some(&Value::Bool(true));
        let at = child(path, "uniqueItems");
        match (unique(o), unique(n)) {
            (false, true) => self.push(
                Level::Breaking,
                &at,
                "uniqueItems turned true: arrays with repeated items are rejected",
            ),
            (true, false) => self.push(Level::Safe, &at, "uniqueItems no longer required"),
            _ => {}
        }
    }

    /// Schemas per array position (`prefixItems`, draft-07 `items` as a list).
    fn positions(&mut self, old: &[Value], new: &[Value], path: &str) {
        for i in 0..old.len().max(new.len()) {
            let (a, b) = (old.get(i).unwrap_or(&TRUE), new.get(i).unwrap_or(&TRUE));
            self.schema(a, b, &child(path, &i.to_string()));
        }
    }
}
