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

mod combinators;
mod containers;
mod refs;
mod values;

use crate::change::{Change, Level};
use refs::{expand, has_ref, reference, without_ref};
use serde_json::{Map, Value};
use std::borrow::Cow;
use values::{LOWER_BOUNDS, UPPER_BOUNDS};

/// The schema that accepts everything (an absent subschema).
static TRUE: Value = Value::Bool(true);

/// How many references in a row are followed before giving up (`a` → `b` → `a` ...).
const MAX_REF_HOPS: usize = 32;

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
