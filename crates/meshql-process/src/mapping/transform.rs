//! [`Mapping`]: a checked `[processor.mapping]` block — the legacy table, its key columns and
//! the output fields' rules — and its [`Transform`]: a row's change becomes its document's
//! version (with the documents its `lookup`s read) or its tombstone.

use super::checks::fits_schema;
use super::eval::value;
use super::ids::row_id;
use super::rules::{column, err, field, under, Field, Rule};
use crate::plan::Input;
use crate::transform::{DerivedIds, Emit, Found, Read, Transform};
use crate::EntityInfo;
use meshql_core::legacy_id::key_text;
use meshql_core::{parse_settings, ChangeOp, SettingError};
use serde::Deserialize;
use serde_json::{Map, Value};

/// A checked mapping: the [`Transform`] of a `type = "mapping"` processor.
#[derive(Debug, Clone, PartialEq)]
pub struct Mapping {
    table: String,
    key: Vec<String>,
    fields: Vec<(String, Field)>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MappingSettings {
    table: String,
    key: Vec<String>,
    fields: Map<String, Value>,
}

impl Mapping {
    /// Checks a `[processor.mapping]` block (`table`, `key`, `fields`) against the output
    /// entity and, for `lookup`s, the service's `entities`; errors name their field under
    /// `mapping.`.
    pub fn new(
        block: &Value,
        output: &EntityInfo,
        entities: &[EntityInfo],
    ) -> Result<Self, SettingError> {
        let s: MappingSettings = parse_settings(block).map_err(|e| under("mapping", e))?;
        if s.table.trim().is_empty() {
            return Err(err("mapping.table", "name the legacy table"));
        }
        if s.key.is_empty() {
            return Err(err(
                "mapping.key",
                "name the table's primary key column(s): the document's id is derived from them",
            ));
        }
        let mut key = Vec::new();
        for (i, k) in s.key.iter().enumerate() {
            let k = column(&Value::String(k.clone()), &format!("mapping.key[{i}]"))?;
            if key.contains(&k) {
                return Err(err(format!("mapping.key[{i}]"), format!("`{k}` twice")));
            }
            key.push(k);
        }
        if s.fields.is_empty() {
            return Err(err("mapping.fields", "map at least one field"));
        }
        let mut fields = Vec::new();
        for (name, decl) in &s.fields {
            let at = format!("mapping.fields.{name}");
            if name == "id" {
                return Err(err(
                    at,
                    "the id is derived from the table and `key`, not mapped",
                ));
            }
            if let Some(known) = &output.fields {
                if !known.iter().any(|f| f == name) {
                    return Err(err(
                        at,
                        format!(
                            "entity `{}` has no field `{name}` (its JSON Schema has: {})",
                            output.name,
                            known.join(", ")
                        ),
                    ));
                }
            }
            let f = field(decl, &at, true)?;
            if let Rule::Lookup {
                entity, field: of, ..
            } = &f.rule
            {
                let Some(target) = entities.iter().find(|e| e.name == *entity) else {
                    let names: Vec<&str> = entities.iter().map(|e| e.name.as_str()).collect();
                    return Err(err(
                        format!("{at}.lookup"),
                        format!(
                            "unknown entity `{entity}` (this config has: {})",
                            names.join(", ")
                        ),
                    ));
                };
                if let Some(known) = &target.fields {
                    if of != "id" && !known.iter().any(|k| k == of) {
                        return Err(err(
                            format!("{at}.field"),
                            format!(
                                "entity `{entity}` has no field `{of}` (its JSON Schema has: {})",
                                known.join(", ")
                            ),
                        ));
                    }
                }
            }
            if let Some(prop) = output.properties.as_ref().and_then(|p| p.get(name)) {
                fits_schema(&f, prop, &at, &output.name, name)?;
            }
            fields.push((name.clone(), f));
        }
        Ok(Self {
            table: s.table,
            key,
            fields,
        })
    }

    /// Each `reference` it makes: the setting that declares it (`mapping.fields.farm_id`),
    /// the table it refers to and how many key values it gives.
    pub fn references(&self) -> Vec<(String, String, usize)> {
        fn walk(rule: &Rule, at: String, out: &mut Vec<(String, String, usize)>) {
            match rule {
                Rule::Reference { table, key } => out.push((at, table.clone(), key.len())),
                Rule::Concat(parts, _) => {
                    for (i, p) in parts.iter().enumerate() {
                        walk(&p.rule, format!("{at}.concat[{i}]"), out);
                    }
                }
                Rule::Lookup { id, .. } => walk(&id.rule, format!("{at}.id"), out),
                _ => {}
            }
        }
        let mut out = Vec::new();
        for (name, f) in &self.fields {
            walk(&f.rule, format!("mapping.fields.{name}"), &mut out);
        }
        out
    }

    /// The legacy table it reads.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The table's key columns.
    pub fn key(&self) -> &[String] {
        &self.key
    }

    /// The clean id of `row` (an error when a key column is null or missing).
    pub fn id_of(&self, row: &Map<String, Value>) -> Result<String, String> {
        row_id(&self.table, &self.key, row)
    }
    /// The clean document of `row` (a `lookup` finds nothing: see [`Mapping::document_with`]).
    pub fn document(&self, row: &Map<String, Value>) -> Result<Map<String, Value>, String> {
        self.document_with(row, None)
    }

    /// The clean document of `row` (`found`: the documents its `lookup`s read, see
    /// [`Transform::reads`]).
    pub fn document_with(
        &self,
        row: &Map<String, Value>,
        found: Option<&Found>,
    ) -> Result<Map<String, Value>, String> {
        let mut doc = Map::new();
        for (name, f) in &self.fields {
            let v = match &f.rule {
                Rule::Lookup {
                    entity,
                    id,
                    field,
                    wait,
                } => {
                    let v = match value(id, name, row)? {
                        Value::Null => Value::Null,
                        id => {
                            let id = key_text(&id).ok_or_else(|| {
                                format!("field `{name}`: the lookup's id is {id}, not text")
                            })?;
                            match found.and_then(|f| f.get(entity, &id)) {
                                Some(_) if field == "id" => Value::String(id),
                                Some(doc) => doc.get(field).cloned().unwrap_or(Value::Null),
                                None => {
                                    return Err(format!(
                                        "field `{name}`: `{entity}` {id} does not exist \
                                         (waited {} ms for it)",
                                        wait.as_millis()
                                    ))
                                }
                            }
                        }
                    };
                    match (&v, &f.default) {
                        (Value::Null, Some(d)) => d.clone(),
                        _ => v,
                    }
                }
                _ => value(f, name, row)?,
            };
            if f.omit_empty && (v.is_null() || v.as_str() == Some("")) {
                continue;
            }
            doc.insert(name.clone(), v);
        }
        Ok(doc)
    }
}

impl Transform for Mapping {
    fn transform(&self, input: &Input) -> Result<Vec<Emit>, String> {
        self.transform_with(input, &Found::default())
    }

    fn legacy_columns(&self) -> Option<(String, Vec<(String, String)>)> {
        let mut named = Vec::new();
        for (i, k) in self.key.iter().enumerate() {
            named.push((format!("mapping.key[{i}]"), k.clone()));
        }
        for (name, f) in &self.fields {
            f.rule
                .columns(&format!("mapping.fields.{name}"), &mut named);
        }
        Some((self.table.clone(), named))
    }

    fn derived_ids(&self) -> Option<DerivedIds> {
        Some(DerivedIds {
            table: self.table.clone(),
            key: self.key.clone(),
            references: self.references(),
        })
    }

    fn read_entities(&self) -> Vec<String> {
        let mut entities: Vec<String> = Vec::new();
        for (_, f) in &self.fields {
            if let Rule::Lookup { entity, .. } = &f.rule {
                if !entities.contains(entity) {
                    entities.push(entity.clone());
                }
            }
        }
        entities
    }

    fn reads(&self, input: &Input) -> Vec<Read> {
        if input.op == ChangeOp::Delete || !input.entity.eq_ignore_ascii_case(&self.table) {
            return Vec::new();
        }
        let mut reads = Vec::new();
        for (name, f) in &self.fields {
            if let Rule::Lookup {
                entity, id, wait, ..
            } = &f.rule
            {
                // an id that cannot be computed fails in `transform_with`, with its reason
                if let Some(id) = value(id, name, &input.payload)
                    .ok()
                    .as_ref()
                    .and_then(key_text)
                {
                    reads.push(Read {
                        entity: entity.clone(),
                        id,
                        wait: *wait,
                    });
                }
            }
        }
        reads
    }

    fn transform_with(&self, input: &Input, found: &Found) -> Result<Vec<Emit>, String> {
        if !input.entity.eq_ignore_ascii_case(&self.table) {
            return Ok(Vec::new());
        }
        let id = Some(self.id_of(&input.payload)?);
        let payload = match input.op {
            ChangeOp::Delete => None,
            ChangeOp::Create | ChangeOp::Update => {
                Some(self.document_with(&input.payload, Some(found))?)
            }
        };
        Ok(vec![Emit { id, payload }])
    }
}
