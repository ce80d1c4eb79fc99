//! What a table's columns and foreign keys become, shared by the plain model and `--acl`'s
//! guesses: an entity's fields, the links between generated tables, and their names.

use super::introspect::{Allowed, Column, Kind, Table};
use super::names::{self, expand, ident, words};
use serde_json::{json, Value};

/// One field of an entity.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    pub name: String,
    /// The property's JSON Schema.
    pub schema: Value,
    /// Its SDL type, without `!`.
    pub gql: String,
    pub required: bool,
    /// The column it comes from, when it is one column's value as it is (for `getBy…`).
    pub column: Option<String>,
    /// `--acl`: the mapping's declaration of the field (a TOML value).
    pub mapping: Option<String>,
    /// `--acl`: what was guessed, for a `# review:` comment.
    pub review: Option<String>,
}

/// A foreign key between two generated tables.
#[derive(Debug, Clone)]
pub(super) struct Link {
    pub child: usize,
    pub fk: usize,
    pub parent: usize,
    /// The child's columns in the order of the parent's primary key (`--acl`), else as the
    /// constraint lists them.
    pub key: Vec<String>,
    /// Several foreign keys of the child refer to this parent, or the child is the parent.
    pub ambiguous: bool,
    /// Set while the child's fields are made.
    pub field: String,
    pub role: String,
}

/// The link's field name (before de-duplication) and role (what the parent is to the
/// child: `customer_account`, `manager`).
pub(super) fn link_names(
    t: &Table,
    link: &Link,
    parent_entity: &str,
    acl: bool,
) -> (String, String) {
    let fk = &t.foreign_keys[link.fk];
    if !link.ambiguous {
        let field = if !acl && fk.columns.len() == 1 {
            ident(&fk.columns[0])
        } else {
            format!("{parent_entity}_id")
        };
        return (field, parent_entity.to_owned());
    }
    let base = if acl {
        names::snake(&expand(
            &fk.columns.iter().flat_map(|c| words(c)).collect::<Vec<_>>(),
        ))
    } else {
        ident(&fk.columns.join("_"))
    };
    let role = base
        .strip_suffix("_id")
        .filter(|r| !r.is_empty())
        .unwrap_or(&base)
        .to_owned();
    let field = if !acl && fk.columns.len() == 1 {
        base
    } else {
        format!("{role}_id")
    };
    (field, role)
}

/// The values a CHECK constraint allows, as JSON.
pub(super) fn enum_values(allowed: &Allowed, c: &Column) -> Value {
    Value::Array(
        allowed
            .values
            .iter()
            .map(|v| match (&c.kind, allowed.numeric) {
                (Kind::Int(_), true) => v.parse::<i64>().map_or(json!(v), |n| json!(n)),
                (Kind::Numeric | Kind::Float, true) => {
                    v.parse::<f64>().map_or(json!(v), |n| json!(n))
                }
                _ => json!(v),
            })
            .collect(),
    )
}
