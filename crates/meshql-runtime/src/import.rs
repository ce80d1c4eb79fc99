//! An import of an export's lines ([`crate::export`]'s format) into a service's stores, what
//! `meshql import` does from the files or through the running service's
//! `POST /_meshql/import`.
//!
//! Each entity's versions are written in batches through `StoreWriter::import_versions` (ids,
//! times, tombstones and tokens kept; a version stored already is skipped, so a second import
//! changes nothing). A version that is not a tombstone is validated against the target
//! entity's JSON Schema first: one that fails, names an entity the service does not declare,
//! or is not a version line, is refused and counted with its reason, and the import goes on.
//! At most [`PAGE`] versions per entity are held before they are written.

use meshql_core::{DynStore, Envelope};
use meshql_engine::PayloadValidator;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Versions written to a store per transaction.
pub const PAGE: usize = 2048;
/// Refusals kept (with their reasons) per entity.
const EXAMPLES: usize = 5;

/// What an import did with one entity's versions.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct Tally {
    pub read: u64,
    pub written: u64,
    pub refused: u64,
    /// A few refusals' reasons.
    pub examples: Vec<String>,
}

impl Tally {
    fn refuse(&mut self, why: String) {
        self.refused += 1;
        if self.examples.len() < EXAMPLES {
            self.examples.push(why);
        }
    }
}

/// What an import did: per entity (lines that could not be read under `(unreadable lines)`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct ImportReport {
    pub versions: u64,
    pub entities: BTreeMap<String, Tally>,
}

impl ImportReport {
    pub fn written(&self) -> u64 {
        self.entities.values().map(|t| t.written).sum()
    }

    pub fn refused(&self) -> u64 {
        self.entities.values().map(|t| t.refused).sum()
    }
}

#[derive(serde::Deserialize)]
struct Line {
    entity: String,
    id: String,
    created_at: i64,
    #[serde(default)]
    deleted: bool,
    #[serde(default)]
    authorized_tokens: Vec<String>,
    payload: Box<serde_json::value::RawValue>,
}

/// Checks an export's first line: its header, format 1.
pub fn check_header(first: &str) -> Result<(), String> {
    let header: serde_json::Value = serde_json::from_str(first)
        .map_err(|e| format!("line 1 is not a meshql export header: {e}"))?;
    if header["meshql_export"] != crate::export::FORMAT {
        return Err(format!(
            "not a meshql export (format {}): its first line is {}",
            crate::export::FORMAT,
            first.trim()
        ));
    }
    Ok(())
}

/// An import in progress: lines in, versions written a page at a time.
pub struct Importer {
    stores: HashMap<String, DynStore>,
    validators: Arc<HashMap<String, PayloadValidator>>,
    pending: HashMap<String, Vec<Envelope>>,
    report: ImportReport,
}

impl Importer {
    /// Into `stores`, validating against `validators` (by entity).
    pub fn new(
        stores: &[(String, DynStore)],
        validators: Arc<HashMap<String, PayloadValidator>>,
    ) -> Self {
        Self {
            stores: stores.iter().cloned().collect(),
            validators,
            pending: HashMap::new(),
            report: ImportReport::default(),
        }
    }

    /// The JSON Schema validators of a config's entities.
    pub fn validators(
        config: &meshql_config::ResolvedConfig,
    ) -> Result<HashMap<String, PayloadValidator>, String> {
        let mut validators = HashMap::new();
        for e in &config.entities {
            if let Some(schema) = e.rest.as_ref().and_then(|r| r.schema.as_ref()) {
                let v = PayloadValidator::new(schema)
                    .map_err(|err| format!("{}: {}", e.name, err.0))?;
                validators.insert(e.name.clone(), v);
            }
        }
        Ok(validators)
    }

    /// Versions read so far.
    pub fn versions(&self) -> u64 {
        self.report.versions
    }

    /// One version line (`line_no`: its line in the export, for the reasons of refusals);
    /// an error only when a store fails.
    pub async fn line(&mut self, line_no: u64, line: &str) -> Result<(), String> {
        if line.trim().is_empty() {
            return Ok(());
        }
        self.report.versions += 1;
        let parsed: Line = match serde_json::from_str(line) {
            Ok(l) => l,
            Err(e) => {
                self.report
                    .entities
                    .entry("(unreadable lines)".into())
                    .or_default()
                    .refuse(format!("line {line_no}: {e}"));
                return Ok(());
            }
        };
        let tally = self
            .report
            .entities
            .entry(parsed.entity.clone())
            .or_default();
        tally.read += 1;
        let Some(store) = self.stores.get(&parsed.entity) else {
            tally.refuse(format!(
                "line {line_no}: the config declares no entity \"{}\"",
                parsed.entity
            ));
            return Ok(());
        };
        if !parsed.deleted {
            if let Some(v) = self.validators.get(&parsed.entity) {
                let value: serde_json::Value = match serde_json::from_str(parsed.payload.get()) {
                    Ok(v) => v,
                    Err(e) => {
                        tally.refuse(format!("line {line_no}: {}: {e}", parsed.id));
                        return Ok(());
                    }
                };
                let violations = v.violations(&value);
                if !violations.is_empty() {
                    let why: Vec<String> = violations
                        .iter()
                        .take(3)
                        .map(|x| {
                            format!(
                                "{} {}",
                                x["path"].as_str().unwrap_or(""),
                                x["message"].as_str().unwrap_or("")
                            )
                        })
                        .collect();
                    tally.refuse(format!(
                        "line {line_no}: {} at {}: {}",
                        parsed.id,
                        parsed.created_at,
                        why.join("; ")
                    ));
                    return Ok(());
                }
            }
        }
        let batch = self.pending.entry(parsed.entity.clone()).or_default();
        batch.push(Envelope {
            id: parsed.id,
            payload: parsed.payload.get().to_owned(),
            created_at: parsed.created_at,
            deleted: parsed.deleted,
            authorized_tokens: parsed.authorized_tokens,
        });
        if batch.len() >= PAGE {
            flush(store, batch, tally, &parsed.entity).await?;
        }
        Ok(())
    }

    /// Writes what is still held, and says what the import did.
    pub async fn finish(mut self) -> Result<ImportReport, String> {
        for (entity, batch) in self.pending.iter_mut() {
            let tally = self.report.entities.entry(entity.clone()).or_default();
            flush(&self.stores[entity], batch, tally, entity).await?;
        }
        Ok(self.report)
    }
}

async fn flush(
    store: &DynStore,
    batch: &mut Vec<Envelope>,
    tally: &mut Tally,
    entity: &str,
) -> Result<(), String> {
    if batch.is_empty() {
        return Ok(());
    }
    let written = store
        .import_versions(batch)
        .await
        .map_err(|e| format!("{entity}: {e}"))?;
    tally.written += written;
    batch.clear();
    Ok(())
}
