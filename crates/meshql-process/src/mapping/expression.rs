//! One field's transformation of the mapping language on its own, reading a document's
//! fields where a mapping reads a legacy row's columns: what a declared migration's `set`
//! computes (`meshql_process::migration`).

use super::checks::fits_schema;
use super::eval::value;
use super::rules::{err, field, Field, Rule};
use meshql_core::SettingError;
use serde_json::{Map, Value};

/// A checked transformation (`{ int = "eggs" }`, `{ concat = [...] }`, …) with its `default`
/// and `omit_empty` options. Every transformation but `lookup` (which reads another entity):
/// the field names it reads are the document's fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Expression(Field);

impl Expression {
    /// Checks `decl`, whose result is written to field `name` of `entity`; `prop`: that
    /// field's JSON Schema property, when the schema declares it (the type the
    /// transformation makes, and its code values and default, are checked against it).
    /// Errors name `at`.
    pub fn parse(
        decl: &Value,
        at: &str,
        prop: Option<&Value>,
        entity: &str,
        name: &str,
    ) -> Result<Self, SettingError> {
        let f = field(decl, at, true)?;
        if let Rule::Lookup { .. } = f.rule {
            return Err(err(
                format!("{at}.lookup"),
                "a migration computes a field from the document itself: `lookup` reads \
                 another entity, so it is not allowed here",
            ));
        }
        if let Some(prop) = prop {
            fits_schema(&f, prop, at, entity, name)?;
        }
        Ok(Self(f))
    }

    /// The field's value computed from `doc` (`name` names it in errors); `None` when
    /// `omit_empty` leaves it out.
    pub fn eval(&self, name: &str, doc: &Map<String, Value>) -> Result<Option<Value>, String> {
        let v = value(&self.0, name, doc)?;
        if self.0.omit_empty && (v.is_null() || v.as_str() == Some("")) {
            return Ok(None);
        }
        Ok(Some(v))
    }
}
