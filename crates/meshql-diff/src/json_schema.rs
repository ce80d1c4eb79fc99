//! The JSON Schema diff: what a new version of an entity's schema does to clients that write
//! documents and to the documents already stored.
//!
//! A change is **breaking** when some document that the old schema accepted is rejected by
//! the new one (the set of valid documents shrank), **safe** when every old document is
//! still valid and nothing else can be noticed, and **dangerous** when documents stay valid
//! but readers may be surprised (a new enum value, a property no longer declared, another
//! default), or when the change could not be classified with certainty.
//!
//! Local references (`#/$defs/...`, `#/definitions/...`) are followed on both sides, so a
//! definition moved into `$defs` is no change, and a change inside a definition is reported
//! at every place that uses it. Recursive definitions end where the same pair of references
//! is already being compared.

use crate::change::{Change, Level};
use serde_json::{Map, Value};
use std::borrow::Cow;

/// The schema that accepts everything (an absent subschema).
static TRUE: Value = Value::Bool(true);

/// How many references in a row are followed before giving up (`a` → `b` → `a` ...).
const MAX_REF_HOPS: usize = 32;

/// Lower bounds: a larger value accepts fewer documents.
const LOWER_BOUNDS: [&str; 6] = [
    "minimum",
    "exclusiveMinimum",
    "minLength",
    "minItems",
    "minProperties",
    "minContains",
];

/// Upper bounds: a smaller value accepts fewer documents.
const UPPER_BOUNDS: [&str; 6] = [
    "maximum",
    "exclusiveMaximum",
    "maxLength",
    "maxItems",
    "maxProperties",
    "maxContains",
];

/// Keywords that only describe (no effect on validation or on what readers see).
const ANNOTATIONS: [&str; 7] = [
    "title",
    "description",
    "$comment",
    "examples",
    "deprecated",
    "$anchor",
    "$dynamicAnchor",
];

/// Keywords with their own comparison; every other keyword is classified in `others`.
const HANDLED: &[&str] = &[
    "$ref",
    "$defs",
    "definitions",
    "type",
    "enum",
    "const",
    "properties",
    "required",
    "additionalProperties",
    "unevaluatedProperties",
    "patternProperties",
    "propertyNames",
    "items",
    "prefixItems",
    "additionalItems",
    "unevaluatedItems",
    "contains",
    "uniqueItems",
    "multipleOf",
    "pattern",
    "format",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "default",
];

/// The JSON types a schema can name (`integer` is a kind of `number`).
const ALL_TYPES: [&str; 6] = ["array", "boolean", "null", "number", "object", "string"];

/// Compares two versions of one JSON Schema. Changes come in the order of the schema's
/// keywords; paths are JSON Pointers into the schema (`/properties/address/properties/zip`,
/// `/properties/eggs/minimum`), `/` for the schema as a whole.
pub fn diff_json_schema(old: &Value, new: &Value) -> Vec<Change> {
    let mut differ = Differ {
        old_root: old,
        new_root: new,
        following: Vec::new(),
        changes: Vec::new(),
    };
    differ.schema(old, new, "");
    differ.changes
}

struct Differ<'r> {
    old_root: &'r Value,
    new_root: &'r Value,
    /// The pairs of references being compared on the way down (old, new): a pair met again
    /// is a recursive definition, already being compared higher up.
    following: Vec<(Option<String>, Option<String>)>,
    changes: Vec<Change>,
}

/// `path` + `/token`, the token escaped as JSON Pointer wants (`~` → `~0`, `/` → `~1`).
fn child(path: &str, token: &str) -> String {
    format!("{path}/{}", token.replace('~', "~0").replace('/', "~1"))
}

/// The path as shown: the root is `/`.
fn shown(path: &str) -> String {
    if path.is_empty() {
        "/".to_owned()
    } else {
        path.to_owned()
    }
}

fn reference(schema: &Value) -> Option<String> {
    schema
        .get("$ref")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// Whether a `$ref` appears anywhere in the value (equal text can then mean different
/// schemas, since the targets may differ).
fn has_ref(value: &Value) -> bool {
    match value {
        Value::Object(map) => map.contains_key("$ref") || map.values().any(has_ref),
        Value::Array(items) => items.iter().any(has_ref),
        _ => false,
    }
}

/// The target of a reference within the same document (`#`, `#/$defs/x`), if it has one.
fn resolve<'v>(root: &'v Value, reference: &str) -> Option<&'v Value> {
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
fn expand<'v>(node: &'v Value, root: &'v Value) -> Result<Cow<'v, Value>, String> {
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
fn without_ref(node: &Value) -> Cow<'_, Value> {
    match node {
        Value::Object(map) if map.contains_key("$ref") => {
            let mut rest = map.clone();
            rest.remove("$ref");
            Cow::Owned(Value::Object(rest))
        }
        _ => Cow::Borrowed(node),
    }
}

/// A schema's keywords: `true` has none, `false` and non-schemas are `None`.
fn keywords(schema: &Value) -> Option<Cow<'_, Map<String, Value>>> {
    match schema {
        Value::Object(map) => Some(Cow::Borrowed(map)),
        Value::Bool(true) => Some(Cow::Owned(Map::new())),
        _ => None,
    }
}

/// The names listed by `required` (or any array of strings).
fn names(value: Option<&Value>) -> Vec<&str> {
    value
        .and_then(Value::as_array)
        .map(|items| items.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn is_false(value: Option<&Value>) -> bool {
    matches!(value, Some(Value::Bool(false)))
}

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

fn list(items: &[&str]) -> String {
    items
        .iter()
        .map(|item| format!("`{item}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Differ<'_> {
    fn push(&mut self, level: Level, path: &str, message: impl Into<String>) {
        self.changes.push(Change::new(level, shown(path), message));
    }

    /// Runs `compare` with an empty change list and returns what it found.
    fn capture(&mut self, compare: impl FnOnce(&mut Self)) -> Vec<Change> {
        let outer = std::mem::take(&mut self.changes);
        compare(self);
        std::mem::replace(&mut self.changes, outer)
    }

    /// Compares two subschemas found at `path`.
    fn schema(&mut self, old: &Value, new: &Value, path: &str) {
        if old == new && !has_ref(old) {
            return;
        }
        let pair = (reference(old), reference(new));
        let followed = pair.0.is_some() || pair.1.is_some();
        if followed {
            if self.following.contains(&pair) {
                return;
            }
            self.following.push(pair.clone());
        }
        match (expand(old, self.old_root), expand(new, self.new_root)) {
            (Ok(old), Ok(new)) => self.expanded(&old, &new, path),
            (Err(a), Err(b)) if a == b => self.expanded(&without_ref(old), &without_ref(new), path),
            (old_ref, new_ref) => {
                let side = |r: Result<_, String>, s: &Option<String>| match (r, s) {
                    (Err(r), _) => format!("`{r}` (not followed)"),
                    (Ok(_), Some(r)) => format!("`{r}`"),
                    (Ok(_), None) => "an inline schema".to_owned(),
                };
                let message = format!(
                    "reference changed from {} to {}; only references within the schema \
                     are followed, so the change is not classified",
                    side(old_ref, &pair.0),
                    side(new_ref, &pair.1),
                );
                self.push(Level::Dangerous, &child(path, "$ref"), message);
            }
        }
        if followed {
            self.following.pop();
        }
    }

    /// Compares two subschemas whose references were followed.
    fn expanded(&mut self, old: &Value, new: &Value, path: &str) {
        match (old, new) {
            (Value::Bool(false), Value::Bool(false)) => {}
            (_, Value::Bool(false)) => self.push(
                Level::Breaking,
                path,
                "the schema is now `false`: no value is accepted here",
            ),
            (Value::Bool(false), _) => self.push(
                Level::Safe,
                path,
                "the schema was `false`: values are now accepted here",
            ),
            _ => match (keywords(old), keywords(new)) {
                (Some(o), Some(n)) => self.keywords(&o, &n, path),
                _ => self.push(
                    Level::Dangerous,
                    path,
                    "one side is not a schema (neither an object nor a boolean); not classified",
                ),
            },
        }
    }

    fn keywords(&mut self, o: &Map<String, Value>, n: &Map<String, Value>, path: &str) {
        self.types(o, n, path);
        self.enumeration(o, n, path);
        self.constant(o, n, path);
        self.objects(o, n, path);
        self.arrays(o, n, path);
        for keyword in LOWER_BOUNDS {
            self.bound(o, n, path, keyword, true);
        }
        for keyword in UPPER_BOUNDS {
            self.bound(o, n, path, keyword, false);
        }
        self.multiple_of(o, n, path);
        self.strings(o, n, path);
        self.all_of(o, n, path);
        self.alternatives(o, n, path, "anyOf");
        self.alternatives(o, n, path, "oneOf");
        self.conditions(o, n, path);
        self.dependencies(o, n, path);
        self.others(o, n, path);
    }

    fn types(&mut self, o: &Map<String, Value>, n: &Map<String, Value>, path: &str) {
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

    fn enumeration(&mut self, o: &Map<String, Value>, n: &Map<String, Value>, path: &str) {
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

    fn constant(&mut self, o: &Map<String, Value>, n: &Map<String, Value>, path: &str) {
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

    fn objects(&mut self, o: &Map<String, Value>, n: &Map<String, Value>, path: &str) {
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

    fn arrays(&mut self, o: &Map<String, Value>, n: &Map<String, Value>, path: &str) {
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

    fn bound(
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
        match (old.map(Value::as_f64), new.map(Value::as_f64)) {
            (None, Some(Some(_))) => self.push(
                Level::Breaking,
                &at,
                format!("{kw} {} added (tightened)", new.unwrap_or(&TRUE)),
            ),
            (Some(Some(_)), None) => self.push(
                Level::Safe,
                &at,
                format!("{kw} {} removed (loosened)", old.unwrap_or(&TRUE)),
            ),
            (Some(Some(a)), Some(Some(b))) => {
                let (a_text, b_text) = (old.unwrap_or(&TRUE), new.unwrap_or(&TRUE));
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

    fn multiple_of(&mut self, o: &Map<String, Value>, n: &Map<String, Value>, path: &str) {
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

    fn strings(&mut self, o: &Map<String, Value>, n: &Map<String, Value>, path: &str) {
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

    fn all_of(&mut self, o: &Map<String, Value>, n: &Map<String, Value>, path: &str) {
        let no_members = Vec::new();
        let old = o
            .get("allOf")
            .and_then(Value::as_array)
            .unwrap_or(&no_members);
        let new = n
            .get("allOf")
            .and_then(Value::as_array)
            .unwrap_or(&no_members);
        if old == new && !old.iter().any(has_ref) {
            return;
        }
        let base = child(path, "allOf");
        // members found unchanged on both sides are set aside; the others pair up in order
        let mut old_left: Vec<&Value> = old.iter().collect();
        let mut new_left: Vec<(usize, &Value)> = Vec::new();
        for (j, member) in new.iter().enumerate() {
            match old_left.iter().position(|m| *m == member && !has_ref(m)) {
                Some(i) => {
                    old_left.remove(i);
                }
                None => new_left.push((j, member)),
            }
        }
        let pairs = old_left.len().min(new_left.len());
        for (old_member, (j, new_member)) in old_left.iter().zip(&new_left) {
            self.schema(old_member, new_member, &child(&base, &j.to_string()));
        }
        for (j, _) in &new_left[pairs..] {
            self.push(
                Level::Breaking,
                &child(&base, &j.to_string()),
                "allOf member added: documents must satisfy it too",
            );
        }
        for _ in &old_left[pairs..] {
            self.push(Level::Safe, &base, "allOf member removed (loosened)");
        }
    }

    /// `anyOf` and `oneOf`: only the clear cases are decided; the rest is dangerous.
    fn alternatives(
        &mut self,
        o: &Map<String, Value>,
        n: &Map<String, Value>,
        path: &str,
        kw: &str,
    ) {
        let at = child(path, kw);
        let (old, new) = match (
            o.get(kw).and_then(Value::as_array),
            n.get(kw).and_then(Value::as_array),
        ) {
            (None, None) => return,
            (None, Some(_)) => {
                self.push(
                    Level::Breaking,
                    &at,
                    format!("{kw} added: documents must now match its alternatives"),
                );
                return;
            }
            (Some(_), None) => {
                self.push(Level::Safe, &at, format!("{kw} removed (loosened)"));
                return;
            }
            (Some(old), Some(new)) => (old, new),
        };
        if old == new && !old.iter().any(has_ref) {
            return;
        }
        let kept = |member: &Value, among: &[Value]| !has_ref(member) && among.contains(member);
        let added: Vec<usize> = (0..new.len()).filter(|&j| !kept(&new[j], old)).collect();
        let removed = old.iter().filter(|m| !kept(m, new)).count();
        if removed == 0 {
            for j in added {
                let at = child(&at, &j.to_string());
                if kw == "anyOf" {
                    self.push(Level::Safe, &at, "anyOf alternative added (loosened)");
                } else {
                    self.push(
                        Level::Dangerous,
                        &at,
                        "oneOf alternative added: a document that matched exactly one \
                         alternative may now match two and be rejected",
                    );
                }
            }
            return;
        }
        if old.len() != new.len() {
            self.push(
                Level::Dangerous,
                &at,
                format!(
                    "{kw} alternatives changed ({} before, {} now, {removed} no longer \
                     present); cannot decide whether every document still matches, review it",
                    old.len(),
                    new.len()
                ),
            );
            return;
        }
        // same number of alternatives: compare them position by position
        let inner = self.capture(|d| {
            for (i, (a, b)) in old.iter().zip(new).enumerate() {
                d.schema(a, b, &child(&at, &i.to_string()));
            }
        });
        for mut change in inner {
            if change.level == Level::Breaking {
                change.level = Level::Dangerous;
                change.message.push_str(&format!(
                    " (within {kw}: another alternative may still accept the document; \
                     cannot decide)"
                ));
            }
            self.changes.push(change);
        }
    }

    /// `not` and `if`/`then`/`else`: added constrains, removed loosens, changed is undecided.
    fn conditions(&mut self, o: &Map<String, Value>, n: &Map<String, Value>, path: &str) {
        let at = child(path, "not");
        match (o.get("not"), n.get("not")) {
            (None, None) => {}
            (None, Some(_)) => self.push(
                Level::Breaking,
                &at,
                "not added: documents matching it are rejected",
            ),
            (Some(_), None) => self.push(Level::Safe, &at, "not removed (loosened)"),
            (Some(a), Some(b)) => {
                if a != b || has_ref(a) || has_ref(b) {
                    let inner = self.capture(|d| d.schema(a, b, &at));
                    if !inner.is_empty() {
                        self.push(
                            Level::Dangerous,
                            &at,
                            "the schema under `not` changed; cannot decide (a wider `not` \
                             rejects more), review it",
                        );
                    }
                }
            }
        }
        fn conditional(m: &Map<String, Value>) -> [Option<&Value>; 3] {
            [m.get("if"), m.get("then"), m.get("else")]
        }
        let (old, new) = (conditional(o), conditional(n));
        let at = child(path, "if");
        match (old[0].is_some(), new[0].is_some()) {
            (false, false) => {}
            (false, true) => self.push(
                Level::Breaking,
                &at,
                "conditional (if/then/else) added: documents must satisfy it",
            ),
            (true, false) => self.push(Level::Safe, &at, "conditional (if/then/else) removed"),
            (true, true) => {
                if old != new || old.iter().flatten().any(|v| has_ref(v)) {
                    let inner = self.capture(|d| {
                        for (kw, (a, b)) in ["if", "then", "else"].iter().zip(old.iter().zip(&new))
                        {
                            d.schema(a.unwrap_or(&TRUE), b.unwrap_or(&TRUE), &child(path, kw));
                        }
                    });
                    if !inner.is_empty() {
                        self.push(
                            Level::Dangerous,
                            &at,
                            "conditional (if/then/else) changed; cannot decide, review it",
                        );
                    }
                }
            }
        }
    }

    /// `dependentRequired`, `dependentSchemas`, draft-07 `dependencies`, per property.
    fn dependencies(&mut self, o: &Map<String, Value>, n: &Map<String, Value>, path: &str) {
        let empty = Map::new();
        for kw in ["dependentRequired", "dependentSchemas", "dependencies"] {
            let old = o.get(kw).and_then(Value::as_object).unwrap_or(&empty);
            let new = n.get(kw).and_then(Value::as_object).unwrap_or(&empty);
            let base = child(path, kw);
            for (name, before) in old {
                let at = child(&base, name);
                match new.get(name) {
                    None => self.push(
                        Level::Safe,
                        &at,
                        format!("{kw} of `{name}` removed (loosened)"),
                    ),
                    Some(after) if after == before && !has_ref(after) => {}
                    Some(after) => match (before, after) {
                        (Value::Array(_), Value::Array(_)) => {
                            let (b, a) = (names(Some(before)), names(Some(after)));
                            let more: Vec<&str> =
                                a.iter().filter(|x| !b.contains(x)).copied().collect();
                            if !more.is_empty() {
                                self.push(
                                    Level::Breaking,
                                    &at,
                                    format!(
                                        "with `{name}` present, {} now required too",
                                        list(&more)
                                    ),
                                );
                            } else {
                                self.push(Level::Safe, &at, format!("{kw} of `{name}` loosened"));
                            }
                        }
                        (before, after) => self.schema(before, after, &at),
                    },
                }
            }
            for name in new.keys().filter(|k| !old.contains_key(*k)) {
                self.push(
                    Level::Breaking,
                    &child(&base, name),
                    format!("{kw} of `{name}` added: documents with `{name}` must satisfy it"),
                );
            }
        }
    }

    /// Annotations, `default`, and keywords this module does not know.
    fn others(&mut self, o: &Map<String, Value>, n: &Map<String, Value>, path: &str) {
        if o.get("default") != n.get("default") {
            let text = |v: Option<&Value>| v.map_or("none".to_owned(), Value::to_string);
            self.push(
                Level::Dangerous,
                &child(path, "default"),
                format!(
                    "default changed from {} to {}: clients relying on it see another value",
                    text(o.get("default")),
                    text(n.get("default"))
                ),
            );
        }
        let keys = o
            .keys()
            .chain(n.keys().filter(|k| !o.contains_key(*k)))
            .filter(|k| {
                let k = k.as_str();
                !HANDLED.contains(&k) && !LOWER_BOUNDS.contains(&k) && !UPPER_BOUNDS.contains(&k)
            });
        let mut found = Vec::new();
        for kw in keys {
            let (old, new) = (o.get(kw), n.get(kw));
            if old == new {
                continue;
            }
            let how = match (old, new) {
                (None, _) => "added",
                (_, None) => "removed",
                _ => "changed",
            };
            let at = child(path, kw);
            let change = if ANNOTATIONS.contains(&kw.as_str()) || kw.starts_with("x-") {
                Change::safe(shown(&at), format!("{kw} {how}"))
            } else {
                let why = match kw.as_str() {
                    "$schema" => "the dialect decides what the other keywords mean",
                    "$id" => "references by identifier resolve elsewhere",
                    "readOnly" | "writeOnly" => "clients may act on it",
                    _ => "meshql-diff does not classify this keyword",
                };
                Change::dangerous(shown(&at), format!("{kw} {how}; {why}"))
            };
            found.push(change);
        }
        self.changes.extend(found);
    }
}
