//! `[[processor]]`: names (unique; they are consumer groups in the log) and the change feed
//! they read, checked before a server starts. The fields of a processor's `type` are kept as
//! written, with their lines, for the processor crate (`meshql_process`), which checks them
//! against the entities at `meshql check` and at start-up.

use super::{field_line, Resolver};
use crate::error::line_of;
use crate::model::ProcessorConfig;
use std::collections::{BTreeMap, HashSet};
use toml::Spanned;

/// A processor whose name passed the checks; the fields of its type are unchecked here.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessorSpec {
    pub name: String,
    /// The `type`.
    pub kind: String,
    /// Every other field, as JSON.
    pub settings: serde_json::Value,
    /// How errors name the processor: `processor[0] "hen_productivity"`.
    pub path: String,
    /// The entry's line in the config file.
    pub line: Option<usize>,
    /// The line of each field.
    pub field_lines: BTreeMap<String, usize>,
}

impl ProcessorSpec {
    /// The line of a field (`fields`, or a path into it such as `fields.total_eggs`), else
    /// the entry's.
    pub fn line_of(&self, field: Option<&str>) -> Option<usize> {
        field_line(&self.field_lines, field).or(self.line)
    }
}

impl Resolver {
    /// Checks every processor's name.
    pub(super) fn resolve_processors(
        &mut self,
        blocks: &[Spanned<ProcessorConfig>],
        changes_enabled: bool,
    ) -> Vec<ProcessorSpec> {
        let mut names = HashSet::new();
        let mut resolved = Vec::new();
        for (index, block) in blocks.iter().enumerate() {
            let p = block.get_ref();
            let name = p.name.get_ref().clone();
            let path = format!("processor[{index}] \"{name}\"");
            let valid = !name.is_empty()
                && name.len() <= 94
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
            if !valid {
                self.error(
                    Some(&p.name),
                    format!("{path}.name"),
                    "use 1 to 94 letters, digits, `.`, `_` or `-`",
                );
            } else if !names.insert(name.clone()) {
                self.error(
                    Some(&p.name),
                    format!("{path}.name"),
                    "duplicate processor name",
                );
            }
            if !changes_enabled {
                // serving goes on without it (a run with the feed off, `meshql bench changes`)
                self.warn(
                    block,
                    path.clone(),
                    "does not run: a processor reads the change feed, which `[changes] enabled = false` turns off",
                );
            }
            resolved.push(ProcessorSpec {
                name,
                kind: p.kind.get_ref().clone(),
                settings: serde_json::Value::Object(p.settings.clone()),
                path,
                line: Some(line_of(&self.text, block.span().start)),
                field_lines: p
                    .offsets
                    .iter()
                    .map(|(k, offset)| (k.clone(), line_of(&self.text, *offset)))
                    .collect(),
            });
        }
        resolved
    }
}
