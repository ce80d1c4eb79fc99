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
//! Kinds: `projection` ([`projection`]): declared aggregates per key. Outputs go through
//! [`meshql_engine::EntityService`] (JSON Schema validation, grants, the output's own
//! change in the feed), never through HTTP. An input that cannot be processed is a *dead
//! letter* — kept with the reason and the input in the output store, in the same
//! transaction — and the processor goes on.

pub mod acc;
pub mod expr;
pub mod projection;
mod runtime;
pub mod time;

pub use runtime::{start, ProcessError, ProcessorStats, Processors, StartOptions};

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
}

impl EntityInfo {
    /// The properties a JSON Schema declares (`None` when it declares none).
    pub fn fields_of(schema: Option<&Value>) -> Option<Vec<String>> {
        let props = schema?.get("properties")?.as_object()?;
        Some(props.keys().cloned().collect())
    }
}

/// A checked processor, ready to start.
#[derive(Debug, Clone)]
pub enum ProcessorPlan {
    Projection(projection::spec::ProjectionSpec),
}

impl ProcessorPlan {
    pub fn name(&self) -> &str {
        match self {
            ProcessorPlan::Projection(p) => &p.name,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            ProcessorPlan::Projection(_) => "projection",
        }
    }

    /// The entity the processor writes.
    pub fn output(&self) -> &str {
        match self {
            ProcessorPlan::Projection(p) => &p.output,
        }
    }

    /// The entities it reads.
    pub fn inputs(&self) -> Vec<String> {
        match self {
            ProcessorPlan::Projection(p) => p.inputs(),
        }
    }

    pub fn enabled(&self) -> bool {
        match self {
            ProcessorPlan::Projection(p) => p.enabled,
        }
    }
}

/// The kinds of processor this build knows.
pub const KINDS: &[&str] = &["projection"];

/// Checks one `[[processor]]` entry: its `type` and its fields against the entities.
pub fn configure(
    name: &str,
    kind: &str,
    settings: &Value,
    entities: &[EntityInfo],
) -> Result<ProcessorPlan, SettingError> {
    match kind {
        "projection" => {
            projection::spec::compile(name, settings, entities).map(ProcessorPlan::Projection)
        }
        other => Err(SettingError::new(
            "type",
            format!(
                "unknown processor type `{other}` (this build has: {})",
                KINDS.join(", ")
            ),
        )),
    }
}

/// Checks that no two processors write one entity (their documents would collide): the
/// index of the second and the error.
pub fn check_plans(plans: &[ProcessorPlan]) -> Result<(), (usize, SettingError)> {
    let projections: Vec<&projection::spec::ProjectionSpec> = plans
        .iter()
        .map(|p| match p {
            ProcessorPlan::Projection(s) => s,
        })
        .collect();
    projection::spec::check_outputs(&projections)
}
