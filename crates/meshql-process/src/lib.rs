//! Processors: consumers of the change feed that write entities.
//!
//! A processor (`[[processor]]` in the config) reads the service's change log as a consumer
//! group of its own (`processor-<name>`, see `meshql_changes::Consumer`), turns each batch
//! of input changes into writes of its output entity, and commits those writes **with the
//! position of the last input** in one transaction of the output store
//! ([`meshql_core::output`]). After a crash it resumes after that position: every input
//! counts exactly once, whatever the log redelivers.
//!
//! ```text
//!  log ──(consumer group processor-<name>, batches)──▶ processor ──▶ EntityService::apply_output
//!                                                                      │ validation, grants
//!                                                                      ▼
//!                                       output store: versions + state + dead letters + position
//!                                                     (one transaction) ──▶ its own changes
//! ```
//!
//! Kinds: `projection` ([`projection`]): declared aggregates per key; `rust` and `script`
//! ([`transform`], [`script`]): a function per input change; `mapping` ([`mapping`]): a
//! legacy table's rows as a clean entity's documents, declared field by field (a transform
//! too). Outputs go through [`meshql_engine::EntityService`] (JSON Schema validation,
//! grants, the output's own change in the feed), never through HTTP. An input that cannot be
//! processed is a *dead letter* — kept with the reason and the input in the output store, in
//! the same transaction — and the processor goes on.
//!
//! Instead of the change log a processor may read a [`source`]: Kafka topics ([`kafka`]) or a
//! NATS JetStream stream ([`nats`]), in Debezium's or meshql's message format
//! ([`envelope`]). Exactly once holds there too: the source's own position (the stream
//! sequence to read next, each partition's next offset) is a state row of the processor,
//! committed with the batch's outputs in the same transaction and read back at start; the
//! broker's acknowledgements and group offsets play no part.

pub mod acc;
pub mod envelope;
pub mod expr;
pub mod kafka;
pub mod mapping;
pub mod nats;
pub mod pgcdc;
mod pgtls;
pub mod plan;
pub mod projection;
mod runtime;
pub mod script;
pub mod source;
pub mod time;
pub mod transform;

pub use runtime::{
    start, ProcessError, ProcessorStats, Processors, RebuildError, RebuildState, StartOptions,
};

use meshql_core::SettingError;
use serde_json::{Map, Value};

/// A field of a document: a top-level name, or a dotted path into nested objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldPath {
    pub text: String,
    parts: Vec<String>,
}

impl FieldPath {
    pub fn new(text: &str) -> Self {
        Self {
            text: text.to_owned(),
            parts: text.split('.').map(str::to_owned).collect(),
        }
    }

    /// The value at this path (`None` when a step is missing or not an object).
    pub fn get<'a>(&self, doc: &'a Map<String, Value>) -> Option<&'a Value> {
        let (first, rest) = self.parts.split_first()?;
        let mut v = doc.get(first)?;
        for p in rest {
            v = v.as_object()?.get(p)?;
        }
        Some(v)
    }
}

/// An entity as processors see it when their config is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntityInfo {
    pub name: String,
    /// The top-level properties of its JSON Schema (`None`: no schema, any field).
    pub fields: Option<Vec<String>>,
    /// Those properties' schemas (`None`: not known), for checks of the values a processor
    /// writes (a mapping's types and codes).
    pub properties: Option<Map<String, Value>>,
}

impl EntityInfo {
    /// The properties a JSON Schema declares (`None` when it declares none).
    pub fn fields_of(schema: Option<&Value>) -> Option<Vec<String>> {
        let props = schema?.get("properties")?.as_object()?;
        Some(props.keys().cloned().collect())
    }

    /// The properties' schemas of a JSON Schema (`None` when it declares none).
    pub fn properties_of(schema: Option<&Value>) -> Option<Map<String, Value>> {
        schema?.get("properties")?.as_object().cloned()
    }
}

/// A checked processor, ready to start.
#[derive(Debug, Clone)]
pub enum ProcessorPlan {
    Projection(projection::spec::ProjectionSpec),
    /// `rust`, `script` and `mapping` processors.
    Transform(transform::TransformSpec),
}

impl ProcessorPlan {
    pub fn name(&self) -> &str {
        match self {
            ProcessorPlan::Projection(p) => &p.name,
            ProcessorPlan::Transform(t) => &t.name,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            ProcessorPlan::Projection(_) => "projection",
            ProcessorPlan::Transform(t) => t.kind,
        }
    }

    /// The entity the processor writes.
    pub fn output(&self) -> &str {
        match self {
            ProcessorPlan::Projection(p) => &p.output,
            ProcessorPlan::Transform(t) => &t.output,
        }
    }

    /// The entities it reads.
    pub fn inputs(&self) -> Vec<String> {
        match self {
            ProcessorPlan::Projection(p) => p.inputs(),
            ProcessorPlan::Transform(t) => t.inputs.clone(),
        }
    }

    /// The entities whose changes it consumes from the service's log: its inputs and a
    /// projection's related documents.
    pub fn reads(&self) -> Vec<String> {
        match self {
            ProcessorPlan::Projection(p) => p.reads(),
            ProcessorPlan::Transform(t) => t.inputs.clone(),
        }
    }

    pub fn enabled(&self) -> bool {
        match self {
            ProcessorPlan::Projection(p) => p.enabled,
            ProcessorPlan::Transform(t) => t.enabled,
        }
    }

    /// Changes per output transaction at most.
    pub fn batch(&self) -> usize {
        match self {
            ProcessorPlan::Projection(p) => p.batch,
            ProcessorPlan::Transform(t) => t.batch,
        }
    }

    /// The entities it reads documents of besides its inputs (lookups).
    pub fn lookups(&self) -> Vec<String> {
        match self {
            ProcessorPlan::Projection(p) => p.lookups.iter().map(|l| l.entity.clone()).collect(),
            ProcessorPlan::Transform(t) => t.transform.read_entities(),
        }
    }

    /// Where it reads (`None`: the service's change log).
    pub fn source(&self) -> Option<&source::Source> {
        match self {
            ProcessorPlan::Projection(p) => p.source.as_ref(),
            ProcessorPlan::Transform(t) => t.source.as_ref(),
        }
    }

    /// The batch logic.
    pub fn planner(&self) -> std::sync::Arc<dyn plan::Planner> {
        match self {
            ProcessorPlan::Projection(p) => {
                std::sync::Arc::new(projection::Projection::new(p.clone()))
            }
            ProcessorPlan::Transform(t) => {
                std::sync::Arc::new(transform::TransformPlanner {
                    spec: t.clone(),
                    // a postgres_cdc source delivers a snapshot's rows again when the copy
                    // is taken again: the same rows must change nothing
                    skip_unchanged: matches!(t.source, Some(source::Source::PostgresCdc(_))),
                })
            }
        }
    }
}

/// The kinds of processor this build knows.
pub const KINDS: &[&str] = &["projection", "rust", "script", "mapping"];

/// Checks one `[[processor]]` entry: its `type` and its fields against the entities; `base`
/// is the config file's directory (script files are relative to it).
pub fn configure(
    name: &str,
    kind: &str,
    settings: &Value,
    entities: &[EntityInfo],
    base: &std::path::Path,
) -> Result<ProcessorPlan, SettingError> {
    // `source` is every kind's: checked here, the rest by the kind
    let mut settings = settings.clone();
    let source = match settings.as_object_mut().and_then(|m| m.remove("source")) {
        Some(s) => Some(source::compile(&s)?),
        None => None,
    };
    let settings = &settings;
    // a legacy database's tables are a processor's inputs, not entities of this config
    let tables: Vec<String> = match &source {
        Some(source::Source::PostgresCdc(s)) => s.tables.iter().map(|t| s.entity_of(t)).collect(),
        _ => Vec::new(),
    };
    let with_tables: Vec<EntityInfo>;
    let readable = if tables.is_empty() {
        entities
    } else {
        with_tables = entities
            .iter()
            .cloned()
            .chain(tables.iter().map(|t| EntityInfo {
                name: t.clone(),
                fields: None,
                properties: None,
            }))
            .collect();
        &with_tables
    };
    let mut plan = match kind {
        "projection" => {
            projection::spec::compile(name, settings, entities).map(ProcessorPlan::Projection)
        }
        "rust" => {
            transform::compile(name, "rust", settings, readable, base).map(ProcessorPlan::Transform)
        }
        "script" => transform::compile(name, "script", settings, readable, base)
            .map(ProcessorPlan::Transform),
        "mapping" => mapping::compile(name, settings, entities, source.is_some())
            .map(ProcessorPlan::Transform),
        other => Err(SettingError::new(
            "type",
            format!(
                "unknown processor type `{other}` (this build has: {})",
                KINDS.join(", ")
            ),
        )),
    }?;
    if !tables.is_empty() {
        if !entities.iter().any(|e| e.name == plan.output()) {
            return Err(SettingError::new(
                "output",
                format!(
                    "`{}` is a table of the source, not an entity of this config",
                    plan.output()
                ),
            ));
        }
        if let Some((i, input)) = plan
            .inputs()
            .iter()
            .enumerate()
            .find(|(_, i)| !tables.contains(i))
        {
            return Err(SettingError::new(
                format!("inputs[{i}]"),
                format!(
                    "`{input}` is not one of the source's tables ({})",
                    tables.join(", ")
                ),
            ));
        }
    }
    match &mut plan {
        ProcessorPlan::Projection(p) => p.source = source,
        ProcessorPlan::Transform(t) => t.source = source,
    }
    Ok(plan)
}

/// Checks that no two processors write one entity (their documents would collide): the
/// index of the second and the error.
pub fn check_plans(plans: &[ProcessorPlan]) -> Result<(), (usize, SettingError)> {
    let projections: Vec<&projection::spec::ProjectionSpec> = plans
        .iter()
        .filter_map(|p| match p {
            ProcessorPlan::Projection(s) => Some(s),
            ProcessorPlan::Transform(_) => None,
        })
        .collect();
    projection::spec::check_outputs(&projections)?;
    check_references(plans)
}

/// A mapping's `reference` to a table another mapping of the config reads must name as many
/// key values as that mapping's `key` has: the ids are computed from them, and a different
/// count would never match a parent's id.
fn check_references(plans: &[ProcessorPlan]) -> Result<(), (usize, SettingError)> {
    let mappings: Vec<(usize, &mapping::Mapping)> = plans
        .iter()
        .enumerate()
        .filter_map(|(i, p)| match p {
            ProcessorPlan::Transform(t) => t.transform.mapping().map(|m| (i, m)),
            ProcessorPlan::Projection(_) => None,
        })
        .collect();
    for (i, m) in &mappings {
        for (field, table, n) in m.references() {
            let Some((_, parent)) = mappings
                .iter()
                .find(|(_, p)| p.table().eq_ignore_ascii_case(&table))
            else {
                continue;
            };
            if parent.key().len() != n {
                return Err((
                    *i,
                    SettingError::new(
                        format!("{field}.key"),
                        format!(
                            "{n} key value(s), but the mapping of `{table}` derives its ids from \
                             {} ({}): the ids would never match",
                            parent.key().len(),
                            parent.key().join(", ")
                        ),
                    ),
                ));
            }
        }
    }
    Ok(())
}
