//! Declared migrations (`[[entity.migration]]`): a change of the shape of an entity's
//! documents, written as new versions of the documents it changes, once.
//!
//! ```toml
//! [[entity.migration]]
//! name = "2026-12-split-status"         # unique per entity; recorded once it has run
//! rename = { name = "title" }            # old field = new name
//! set = { eggs = { int = "eggs" }, label = { concat = ["title", "breed"], separator = " " } }
//! drop = ["legacy_code"]
//! default = { status = "active" }        # when absent or null
//! batch = 500                            # documents per transaction (1 to 10000)
//! ```
//!
//! # What a migration does to one document
//!
//! Starting from the current version, in this order: each `rename` moves a field's value to
//! its new name (nothing when the field is absent; the old name's value wins over one already
//! under the new name); each `drop` removes a field; each `set` field gets the value of its
//! transformation — any of the mapping language's but `lookup` ([`crate::mapping`]: `copy`,
//! `int`, `number`, `lower`, `title`, `code`, `concat`, `date`, `flag`, `add`, …, with
//! `default` and `omit_empty`) — computed from the document **as it was before this
//! migration** (so `set` may read a field that `rename` or `drop` removes); each `default`
//! field is set when it is absent or null. Fields named nowhere are kept as they are. `id` is
//! never touched. A document the migrations leave equal gets no new version.
//!
//! # Checked with the config
//!
//! Each error names the migration's field (`rename.name`, `set.eggs.int`). `id` appears
//! nowhere; a field is written by one of `rename`, `set` and `default` at most, and is not
//! also dropped; a renamed field is not dropped; the names a migration writes are properties
//! of the entity's JSON Schema (when it lists them), and what it writes fits them (the type a
//! transformation makes, a code table's values and every default against `type` and `enum`);
//! a field the schema requires is not dropped; at least one change is declared.
//!
//! # Running: once, resumable, never half-visible
//!
//! Migrations run before the service serves ([`run`], called at start-up by the process that
//! writes the entity; `meshql migrate` runs them from the command line). Their record is kept
//! in the entity's own storage, as the outputs of a consumer named `migration:<entity>`
//! ([`meshql_core::OutputStore`]): each applied migration's name, when it ran, how many
//! documents it changed and its declaration. So a migration runs once per database, however
//! many processes start, and `meshql check` and the console can tell what ran.
//!
//! The pending migrations of an entity (declared, not recorded; a migration declared before
//! one that ran is refused: add new migrations after the last) run in one pass over its
//! current documents, composed in order:
//!
//! 1. The run is recorded first: the migrations' names and its start time `S`, committed
//!    before any document is written.
//! 2. The documents are read in id order, `batch` at a time ([`meshql_core::StoreReader::list_page`]).
//!    A document whose current version was written after `S` is in the new shape
//!    already (it was written by this run, or through the API under the new schema) and is
//!    left alone. Each other one is transformed and validated against the entity's JSON
//!    Schema; the changed ones are written as new versions — the history before them stays,
//!    so an `at` read before the migration answers as before — in one transaction with the
//!    run's progress (the last id read).
//! 3. The last transaction records each migration as applied and forgets the run.
//!
//! Before anything is written, every document the run will read is transformed and
//! validated (as a dry run does): when any fails — a value a transformation cannot read, a
//! result the JSON Schema refuses — the run does not start, and the error counts them and
//! names a few. So a run never stops half-way on the data.
//!
//! A crash (kill -9) between transactions leaves the versions and the progress of the last
//! committed one: the next start resumes after the recorded id, with the same declarations
//! (a run whose migrations were re-declared differently in between is refused, naming them),
//! and the start-time rule would skip a document of this run anyway (the run writes nothing
//! in `S`'s millisecond). Nothing is written twice, and nothing is half-written.
//!
//! Because the process that serves the entity's writes runs the migrations before it
//! listens, and a process that only reads it waits for the record, no read is answered with a
//! half-migrated entity. The written versions go through the change feed like any write, so
//! caches, projections and relays see the new shape.

mod run;

pub use run::{
    dry_run, rewind, run, status, Applied, Changed, DryRun, MigrationError, Progress, Report, State,
};

use crate::mapping::{value_fits, Expression};
use crate::EntityInfo;
use meshql_core::SettingError;
use serde_json::{Map, Value};

/// The most documents a migration writes per transaction.
pub const MAX_BATCH: usize = 10_000;
/// Documents per transaction unless `batch` says otherwise.
pub const DEFAULT_BATCH: usize = 500;

/// A checked migration of one entity.
#[derive(Debug, Clone, PartialEq)]
pub struct Migration {
    name: String,
    rename: Vec<(String, String)>,
    drop: Vec<String>,
    set: Vec<(String, Expression)>,
    default: Vec<(String, Value)>,
    batch: usize,
    /// The declaration as written (recorded with the migration once it ran).
    declaration: Value,
}

fn err(field: impl Into<String>, message: impl Into<String>) -> SettingError {
    SettingError {
        field: Some(field.into()),
        message: message.into(),
    }
}

const FIELDS: &[&str] = &["rename", "set", "drop", "default", "batch"];

impl Migration {
    /// Checks the fields of a `[[entity.migration]]` entry (all but `name`) against the
    /// entity's JSON Schema; errors name the field (`rename.name`).
    pub fn compile(
        name: &str,
        settings: &Value,
        entity: &EntityInfo,
    ) -> Result<Self, SettingError> {
        let Value::Object(s) = settings else {
            return Err(SettingError {
                field: None,
                message: "a table of `rename`, `set`, `drop` and `default`".into(),
            });
        };
        if let Some(k) = s.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(err(
                k.clone(),
                format!(
                    "unknown field (a migration has: name, {})",
                    FIELDS.join(", ")
                ),
            ));
        }
        let known = |at: &str, field: &str| -> Result<(), SettingError> {
            if field == "id" {
                return Err(err(
                    at,
                    "`id` is the document's identity: no migration changes it",
                ));
            }
            if field.is_empty() {
                return Err(err(at, "a field's name"));
            }
            Ok(())
        };
        let in_schema = |at: &str, field: &str| -> Result<(), SettingError> {
            if let Some(fields) = &entity.fields {
                if !fields.iter().any(|f| f == field) {
                    return Err(err(
                        at,
                        format!(
                            "entity `{}` has no field `{field}` (its JSON Schema has: {}): a \
                             migration writes the shape the schema declares",
                            entity.name,
                            fields.join(", ")
                        ),
                    ));
                }
            }
            Ok(())
        };
        let prop = |field: &str| entity.properties.as_ref().and_then(|p| p.get(field));
        let object = |key: &str| -> Result<Option<&Map<String, Value>>, SettingError> {
            match s.get(key) {
                None => Ok(None),
                Some(Value::Object(m)) => Ok(Some(m)),
                Some(_) => Err(err(key, "a table: field = …")),
            }
        };
        // who writes each field, to refuse two writers
        let mut written: Vec<(String, String)> = Vec::new();
        fn claim(
            written: &mut Vec<(String, String)>,
            at: String,
            field: &str,
        ) -> Result<(), SettingError> {
            if let Some((other, _)) = written.iter().find(|(_, f)| f == field) {
                return Err(err(
                    at,
                    format!("`{field}` is written by `{other}` already: one change per field"),
                ));
            }
            written.push((at, field.to_owned()));
            Ok(())
        }

        let mut rename = Vec::new();
        for (from, to) in object("rename")?.into_iter().flatten() {
            let at = format!("rename.{from}");
            known(&at, from)?;
            let Value::String(to) = to else {
                return Err(err(at, "the field's new name (a string)"));
            };
            known(&at, to)?;
            if from == to {
                return Err(err(at, "renamed to itself"));
            }
            in_schema(&at, to)?;
            claim(&mut written, at, to)?;
            rename.push((from.clone(), to.clone()));
        }
        let mut drop = Vec::new();
        match s.get("drop") {
            None => {}
            Some(Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    let at = format!("drop[{i}]");
                    let Value::String(f) = item else {
                        return Err(err(at, "a field's name (a string)"));
                    };
                    known(&at, f)?;
                    if drop.contains(f) {
                        return Err(err(at, format!("`{f}` twice")));
                    }
                    if rename.iter().any(|(from, _)| from == f) {
                        return Err(err(
                            at,
                            format!("`{f}` is renamed: a rename removes the old name already"),
                        ));
                    }
                    if let Some((other, _)) = written.iter().find(|(_, w)| w == f) {
                        return Err(err(at, format!("`{f}` is written by `{other}`")));
                    }
                    if entity.required.iter().any(|r| r == f) {
                        return Err(err(
                            at,
                            format!(
                                "entity `{}`'s JSON Schema requires `{f}`: dropping it would \
                                 make every document invalid",
                                entity.name
                            ),
                        ));
                    }
                    drop.push(f.clone());
                }
            }
            Some(_) => return Err(err("drop", "a list of field names")),
        }
        let mut set = Vec::new();
        for (field, decl) in object("set")?.into_iter().flatten() {
            let at = format!("set.{field}");
            known(&at, field)?;
            if drop.contains(field) {
                return Err(err(at, format!("`{field}` is dropped")));
            }
            in_schema(&at, field)?;
            let e = Expression::parse(decl, &at, prop(field), &entity.name, field)?;
            claim(&mut written, at, field)?;
            set.push((field.clone(), e));
        }
        let mut default = Vec::new();
        for (field, v) in object("default")?.into_iter().flatten() {
            let at = format!("default.{field}");
            known(&at, field)?;
            if drop.contains(field) {
                return Err(err(at, format!("`{field}` is dropped")));
            }
            if v.is_null() {
                return Err(err(at, "a value other than null"));
            }
            in_schema(&at, field)?;
            if let Some(p) = prop(field) {
                value_fits(v, p, at.clone(), "the default", &entity.name, field)?;
            }
            claim(&mut written, at, field)?;
            default.push((field.clone(), v.clone()));
        }
        let batch = match s.get("batch") {
            None => DEFAULT_BATCH,
            Some(v) => match v.as_u64() {
                Some(b) if (1..=MAX_BATCH as u64).contains(&b) => b as usize,
                _ => return Err(err("batch", format!("between 1 and {MAX_BATCH}"))),
            },
        };
        if rename.is_empty() && drop.is_empty() && set.is_empty() && default.is_empty() {
            return Err(SettingError {
                field: None,
                message: "declares no change: give it `rename`, `set`, `drop` or `default`".into(),
            });
        }
        Ok(Self {
            name: name.to_owned(),
            rename,
            drop,
            set,
            default,
            batch,
            declaration: settings.clone(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Documents written per transaction.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// The declaration as written.
    pub fn declaration(&self) -> &Value {
        &self.declaration
    }

    /// The document `doc` becomes (see the module docs for the order); an error names the
    /// field whose transformation failed and why.
    pub fn apply(&self, doc: &Map<String, Value>) -> Result<Map<String, Value>, String> {
        let mut out = doc.clone();
        for (from, to) in &self.rename {
            if let Some(v) = out.remove(from) {
                out.insert(to.clone(), v);
            }
        }
        for f in &self.drop {
            out.remove(f);
        }
        for (field, e) in &self.set {
            match e.eval(field, doc)? {
                Some(v) => out.insert(field.clone(), v),
                None => out.remove(field),
            };
        }
        for (field, v) in &self.default {
            if out.get(field).is_none_or(Value::is_null) {
                out.insert(field.clone(), v.clone());
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
