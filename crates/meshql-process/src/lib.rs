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
pub mod expr;
pub mod kinds;
pub mod mapping;
mod metrics;
pub mod migration;
pub mod pgcdc;
pub mod plan;
pub mod projection;
mod runtime;
pub mod script;
pub mod source;
pub mod time;
pub mod transform;

pub use kinds::{check_plans, configure, kinds, ProcessorTypes};
pub use runtime::{
    start, ProcessError, ProcessorStats, Processors, RebuildError, RebuildState, StartOptions,
};

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
    /// The properties its JSON Schema requires.
    pub required: Vec<String>,
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

    /// The properties a JSON Schema requires.
    pub fn required_of(schema: Option<&Value>) -> Vec<String> {
        schema
            .and_then(|s| s.get("required"))
            .and_then(Value::as_array)
            .map(|r| {
                r.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
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
    pub fn source(&self) -> Option<&std::sync::Arc<dyn source::Source>> {
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
                    skip_unchanged: t.source.as_ref().is_some_and(|s| s.redelivers()),
                })
            }
        }
    }
}
