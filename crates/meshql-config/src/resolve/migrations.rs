//! `[[entity.migration]]`: names (unique per entity; they are recorded in the entity's
//! storage once the migration has run) checked here; the other fields are kept as written,
//! with their lines, for `meshql_process::migration`, which checks them against the
//! entity's JSON Schema at `meshql check` and at start-up.

use super::{field_line, Resolver};
use crate::error::line_of;
use crate::model::MigrationConfig;
use std::collections::{BTreeMap, HashSet};
use toml::Spanned;

/// A migration whose name passed the checks; its other fields are unchecked here.
#[derive(Debug, Clone, PartialEq)]
pub struct MigrationSpec {
    pub name: String,
    /// Every other field, as JSON.
    pub settings: serde_json::Value,
    /// How errors name the migration: `entity[0].migration[1] "rename_name"`.
    pub path: String,
    /// The entry's line in the config file.
    pub line: Option<usize>,
    /// The line of each field.
    pub field_lines: BTreeMap<String, usize>,
}

impl MigrationSpec {
    /// The line of a field (`rename`, or a path into it such as `rename.name`), else the
    /// entry's.
    pub fn line_of(&self, field: Option<&str>) -> Option<usize> {
        field_line(&self.field_lines, field).or(self.line)
    }
}

impl Resolver {
    /// Checks the names of one entity's migrations (`field`: how errors name the entity).
    pub(super) fn resolve_migrations(
        &mut self,
        blocks: &[Spanned<MigrationConfig>],
        field: &str,
    ) -> Vec<MigrationSpec> {
        let mut names = HashSet::new();
        let mut resolved = Vec::new();
        for (index, block) in blocks.iter().enumerate() {
            let m = block.get_ref();
            let name = m.name.get_ref().clone();
            let path = format!("{field}.migration[{index}] \"{name}\"");
            let valid = !name.is_empty()
                && name.len() <= 94
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
            if !valid {
                self.error(
                    Some(&m.name),
                    format!("{path}.name"),
                    "use 1 to 94 letters, digits, `.`, `_` or `-`",
                );
            } else if !names.insert(name.clone()) {
                self.error(
                    Some(&m.name),
                    format!("{path}.name"),
                    "duplicate migration name for this entity",
                );
            }
            resolved.push(MigrationSpec {
                name,
                settings: serde_json::Value::Object(m.settings.clone()),
                path,
                line: Some(line_of(&self.text, block.span().start)),
                field_lines: m
                    .offsets
                    .iter()
                    .map(|(k, offset)| (k.clone(), line_of(&self.text, *offset)))
                    .collect(),
            });
        }
        resolved
    }
}
