//! Keywords on values: `type`, `enum`, `const`, numeric and length bounds, `multipleOf`,
//! `pattern` and `format`.

use super::{child, Differ};
use crate::change::Level;
use serde_json::{Map, Value};

/// Lower bounds: a larger value accepts fewer documents.
pub(super) const LOWER_BOUNDS: [&str; 6] = [
    "minimum",
    "exclusiveMinimum",
    "minLength",
    "minItems",
    "minProperties",
    "minContains",
];

/// Upper bounds: a smaller value accepts fewer documents.
pub(super) const UPPER_BOUNDS: [&str; 6] = [
    "maximum",
    "exclusiveMaximum",
    "maxLength",
    "maxItems",
    "maxProperties",
    "maxContains",
];

/// The JSON types a schema can name (`integer` is a kind of `number`).
const ALL_TYPES: [&str; 6] = ["array", "boolean", "null", "number", "object", "string"];

/// The types a `type` keyword allows; `None` when absent (any type).
fn type_set(value: Option<&Value>) -> Option<Vec<&str>> {
    match value? {
        Value::String(one) => Some(vec![one.as_str()]),
        Value::Array(many) => Some(many.iter().filter_map(Value::as_str).collect()),
        _ => None,
    }
}

fn type_accepts(types: &Option<Vec<&str>>, kind: &str) -> bool {
    match types {
        None => true,
        Some(types) => types.contains(&kind) || (kind == "integer" && types.contains(&"number")),
    }
}

fn type_kinds<'t>(types: &Option<Vec<&'t str>>) -> Vec<&'t str> {
    types.clone().unwrap_or_else(|| ALL_TYPES.to_vec())
}

fn describe_types(types: &Option<Vec<&str>>) -> String {
    match types {
        None => "any type".to_owned(),
        Some(types) if types.is_empty() => "no type".to_owned(),
        Some(types) => types.join(" or "),
    }
}

impl Differ<'_> {
    pub(super) fn types(&mut self, o: &Map<String, Value>, n: &Map<String, Value>, path: &str) {
        let (old, new) = (type_set(o.get("type")), type_set(n.get("type")));
        let lost: Vec<&str> = type_kinds(&old)
            .into_iter()
            .filter(|kind| !type_accepts(&new, kind))
            .map(|kind| match kind {
                "number" if type_accepts(&new, "integer") => "numbers with a fraction",
                other => other,
            })
            .collect();
        let gained = type_kinds(&new)
            .into_iter()
            .any(|kind| !type_accepts(&old, kind));
        let (from, to) = (describe_types(&old), describe_types(&new));
        let at = child(path, "type");
        match (lost.is_empty(), gained) {
            (true, false) => {}
            (true, true) => self.push(
                Level::Safe,
                &at,
                format!("type widened from {from} to {to}"),
            ),
            (false, false) => self.push(
                Level::Breaking,
                &at,
                format!(
                    "type narrowed from {from} to {to}: {} no longer accepted",
                    lost.join(", ")
                ),
            ),
            (false, true) => self.push(
                Level::Breaking,
                &at,
                format!(
                    "type changed from {from} to {to}: {} no longer accepted",
                    lost.join(", ")
                ),
            ),
        }
    }

    pub(super) fn enumeration(
        &mut self,
        o: &Map<String, Value>,
        n: &Map<String, Value>,
        path: &str,
    ) {
        let at = child(path, "enum");
        match (
            o.get("enum").and_then(Value::as_array),
            n.get("enum").and_then(Value::as_array),
        ) {
            (None, None) => {}
            (None, Some(values)) => self.push(
                Level::Breaking,
                &at,
                format!(
                    "enum added: only {} accepted",
                    values
                        .iter()
                        .map(Value::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
            (Some(_), None) => self.push(
                Level::Dangerous,
                &at,
                "enum removed: any value is accepted, and readers that switch over the \
                 listed values may meet others",
            ),
            (Some(old), Some(new)) => {
                for value in old.iter().filter(|v| !new.contains(v)) {
                    self.push(
                        Level::Breaking,
                        &at,
                        format!("enum value {value} removed: documents holding it are rejected"),
                    );
                }
                for value in new.iter().filter(|v| !old.contains(v)) {
                    self.push(
                        Level::Dangerous,
                        &at,
                        format!(
                            "enum value {value} added: readers that switch over the values \
                             may not know it"
                        ),
                    );
                }
            }
        }
    }

    pub(super) fn constant(&mut self, o: &Map<String, Value>, n: &Map<String, Value>, path: &str) {
        let at = child(path, "const");
        match (o.get("const"), n.get("const")) {
            (None, None) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, Some(value)) => self.push(
                Level::Breaking,
                &at,
                format!("const {value} added: no other value is accepted"),
            ),
            (Some(value), None) => self.push(
                Level::Dangerous,
                &at,
                format!("const {value} removed: any value is accepted, readers may meet others"),
            ),
            (Some(a), Some(b)) => self.push(
                Level::Breaking,
                &at,
                format!("const changed from {a} to {b}: documents holding {a} are rejected"),
            ),
        }
    }

    pub(super) fn bound(
        &mut self,
        o: &Map<String, Value>,
        n: &Map<String, Value>,
        path: &str,
        kw: &str,
        lower: bool,
    ) {
        let (old, new) = (o.get(kw), n.get(kw));
        if old == new {
            return;
        }
        let at = child(path, kw);
        let number = |v: Option<&Value>| v.and_then(|v| v.as_f64().map(|n| (n, v.to_string())));
        match (number(old), number(new)) {
            (None, Some((_, b))) if old.is_none() => {
                self.push(Level::Breaking, &at, format!("{kw} {b} added (tightened)"))
            }
            (Some((_, a)), None) if new.is_none() => {
                self.push(Level::Safe, &at, format!("{kw} {a} removed (loosened)"))
            }
            (Some((a, a_text)), Some((b, b_text))) => {
                let verb = if b > a { "raised" } else { "lowered" };
                let tightened = if lower { b > a } else { b < a };
                if tightened {
                    self.push(
                        Level::Breaking,
                        &at,
                        format!("{kw} {verb} from {a_text} to {b_text} (tightened)"),
                    );
                } else if a != b {
                    self.push(
                        Level::Safe,
                        &at,
                        format!("{kw} {verb} from {a_text} to {b_text} (loosened)"),
                    );
                }
            }
            _ => self.push(
                Level::Dangerous,
                &at,
                format!(
                    "{kw} changed from {} to {}; not a number on one side, not classified",
                    old.map_or("nothing".to_owned(), Value::to_string),
                    new.map_or("nothing".to_owned(), Value::to_string),
                ),
            ),
        }
    }

    pub(super) fn multiple_of(
        &mut self,
        o: &Map<String, Value>,
        n: &Map<String, Value>,
        path: &str,
    ) {
        let (old, new) = (o.get("multipleOf"), n.get("multipleOf"));
        if old == new {
            return;
        }
        let at = child(path, "multipleOf");
        match (old.and_then(Value::as_f64), new.and_then(Value::as_f64)) {
            (None, Some(b)) => self.push(
                Level::Breaking,
                &at,
                format!("multipleOf {b} added (tightened)"),
            ),
            (Some(a), None) => self.push(
                Level::Safe,
                &at,
                format!("multipleOf {a} removed (loosened)"),
            ),
            (Some(a), Some(b)) => {
                // every multiple of `a` is a multiple of `b` when a / b is a whole number
                let ratio = a / b;
                if b != 0.0 && (ratio - ratio.round()).abs() < 1e-9 {
                    self.push(
                        Level::Safe,
                        &at,
                        format!("multipleOf changed from {a} to {b} (loosened)"),
                    );
                } else {
                    self.push(
                        Level::Breaking,
                        &at,
                        format!("multipleOf changed from {a} to {b}: multiples of {a} that are not of {b} are rejected"),
                    );
                }
            }
            (None, None) => self.push(
                Level::Dangerous,
                &at,
                "multipleOf changed, not a number; not classified",
            ),
        }
    }

    pub(super) fn strings(&mut self, o: &Map<String, Value>, n: &Map<String, Value>, path: &str) {
        for kw in ["pattern", "format"] {
            let (old, new) = (o.get(kw), n.get(kw));
            if old == new {
                continue;
            }
            let at = child(path, kw);
            let text = |v: &Value| v.as_str().map_or_else(|| v.to_string(), str::to_owned);
            match (old, new) {
                (None, Some(b)) => self.push(
                    Level::Breaking,
                    &at,
                    format!(
                        "{kw} `{}` added: strings that do not match it are rejected",
                        text(b)
                    ),
                ),
                (Some(a), None) => self.push(
                    Level::Safe,
                    &at,
                    format!("{kw} `{}` removed (loosened)", text(a)),
                ),
                (Some(a), Some(b)) => self.push(
                    Level::Breaking,
                    &at,
                    format!(
                        "{kw} changed from `{}` to `{}`: strings that matched the old one may \
                         be rejected (a {kw} is not proven wider)",
                        text(a),
                        text(b)
                    ),
                ),
                (None, None) => {}
            }
        }
    }
}
