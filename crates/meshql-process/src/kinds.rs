//! The processor types this build knows (`projection`, `rust`, `script`, `mapping`) and the
//! checks of a `[[processor]]` entry: its `type` picks the checker, its `source` (every
//! type's) is checked by the source's own component, and the plans of a config are checked
//! against each other.

use crate::transform::{self, Transform, TransformSpec, MAX_PARALLEL};
use crate::{mapping, projection, script, source, EntityInfo, ProcessorPlan};
use meshql_core::{parse_settings, Component, Family, Registry, SettingError};
use serde::Deserialize;
use serde_json::Value;
use std::sync::{Arc, OnceLock};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    #[serde(default)]
    function: Option<String>,
    #[serde(default)]
    script: Option<String>,
    #[serde(default)]
    timeout_ms: Option<u64>,
    #[serde(default)]
    memory_bytes: Option<usize>,
    inputs: Vec<String>,
    output: String,
    #[serde(default)]
    batch: Option<usize>,
    #[serde(default)]
    parallel: Option<usize>,
    #[serde(default)]
    key: Option<String>,
    #[serde(default = "yes")]
    enabled: bool,
}

fn yes() -> bool {
    true
}

/// Checks a `rust` or `script` processor; `base` is the directory script paths are relative
/// to (the config file's).
pub fn compile_transform(
    name: &str,
    kind: &'static str,
    settings: &Value,
    entities: &[EntityInfo],
    base: &std::path::Path,
) -> Result<TransformSpec, SettingError> {
    let s: Settings = parse_settings(settings)?;
    let known = |e: &str, field: &str| -> Result<(), SettingError> {
        if entities.iter().any(|x| x.name == e) {
            Ok(())
        } else {
            let names: Vec<&str> = entities.iter().map(|x| x.name.as_str()).collect();
            Err(SettingError::new(
                field,
                format!(
                    "unknown entity `{e}` (this config has: {})",
                    names.join(", ")
                ),
            ))
        }
    };
    known(&s.output, "output")?;
    if s.inputs.is_empty() {
        return Err(SettingError::new(
            "inputs",
            "name at least one entity to read",
        ));
    }
    for (i, e) in s.inputs.iter().enumerate() {
        known(e, &format!("inputs[{i}]"))?;
    }
    if let Some(b) = s.batch {
        if !(1..=10_000).contains(&b) {
            return Err(SettingError::new("batch", "must be between 1 and 10000"));
        }
    }
    let parallel = s.parallel.unwrap_or(1);
    if !(1..=MAX_PARALLEL).contains(&parallel) {
        return Err(SettingError::new(
            "parallel",
            format!("must be between 1 and {MAX_PARALLEL}"),
        ));
    }
    if let Some(k) = &s.key {
        if k.trim().is_empty() {
            return Err(SettingError::new(
                "key",
                "name the payload field whose value orders the inputs",
            ));
        }
    }
    let transform: Arc<dyn Transform> = match kind {
        "rust" => {
            if s.script.is_some() || s.timeout_ms.is_some() || s.memory_bytes.is_some() {
                return Err(SettingError::new(
                    "script",
                    "`script`, `timeout_ms` and `memory_bytes` are for `type = \"script\"`",
                ));
            }
            let Some(function) = s.function else {
                return Err(SettingError::new(
                    "function",
                    "name the registered function to run",
                ));
            };
            transform::lookup(&function).ok_or_else(|| {
                SettingError::new(
                    "function",
                    format!(
                        "no function `{function}` is registered in this build (it has: {})",
                        transform::transform_names().join(", ")
                    ),
                )
            })?
        }
        _ => {
            if s.function.is_some() {
                return Err(SettingError::new(
                    "function",
                    "`function` is for `type = \"rust\"`; a script processor takes `script`",
                ));
            }
            let Some(script) = s.script else {
                return Err(SettingError::new(
                    "script",
                    "the script's file, relative to the config file",
                ));
            };
            let path = base.join(&script);
            let source = std::fs::read_to_string(&path).map_err(|e| {
                SettingError::new("script", format!("cannot read {}: {e}", path.display()))
            })?;
            let limits = script::Limits {
                timeout: std::time::Duration::from_millis(s.timeout_ms.unwrap_or(100).max(1)),
                memory_bytes: s.memory_bytes.unwrap_or(16 << 20).max(1 << 20),
            };
            Arc::new(
                script::Script::new(&path.display().to_string(), &source, limits, parallel)
                    .map_err(|e| SettingError::new("script", e))?,
            )
        }
    };
    Ok(TransformSpec {
        name: name.to_owned(),
        kind,
        inputs: s.inputs,
        output: s.output,
        batch: s.batch.unwrap_or(100),
        parallel,
        key: s.key,
        enabled: s.enabled,
        transform,
        source: None,
    })
}

/// Processor types, as a `[[processor]]` entry's `type` names them: each is a
/// [`Component`] registered with one line in [`registry`]. A type's settings are the entry's
/// fields other than `name`, `type` and `source` (every type's: checked by the source's own
/// component), kept as JSON and checked by the type against the service's entities.
pub struct ProcessorTypes;

/// What a processor type checks an entry against.
pub struct ProcessorContext<'a> {
    /// The processor's name.
    pub name: &'a str,
    /// The service's entities.
    pub entities: &'a [EntityInfo],
    /// What its inputs may name: the entities, and a capture source's tables.
    pub readable: &'a [EntityInfo],
    /// The config file's directory (script files are relative to it).
    pub base: &'a std::path::Path,
    /// Whether the entry reads a `source` instead of the change log.
    pub has_source: bool,
}

impl Family for ProcessorTypes {
    const WHAT: &'static str = "processor";
    type Context<'a> = ProcessorContext<'a>;
    type Built = ProcessorPlan;
}

/// `type = "projection"`: declared aggregates per key ([`crate::projection`]).
pub struct ProjectionType;
/// `type = "rust"`: a [`Transform`] compiled into the binary, by name.
pub struct RustType;
/// `type = "script"`: a JavaScript transform ([`crate::script`]).
pub struct ScriptType;
/// `type = "mapping"`: a legacy table's rows as a clean entity's documents ([`crate::mapping`]).
pub struct MappingType;

impl Component<ProcessorTypes> for ProjectionType {
    const KIND: &'static str = "projection";
    type Settings = Value;
    fn build(&self, s: Value, c: &ProcessorContext<'_>) -> Result<ProcessorPlan, SettingError> {
        projection::spec::compile(c.name, &s, c.entities).map(ProcessorPlan::Projection)
    }
}

impl Component<ProcessorTypes> for RustType {
    const KIND: &'static str = "rust";
    type Settings = Value;
    fn build(&self, s: Value, c: &ProcessorContext<'_>) -> Result<ProcessorPlan, SettingError> {
        compile_transform(c.name, "rust", &s, c.readable, c.base).map(ProcessorPlan::Transform)
    }
}

impl Component<ProcessorTypes> for ScriptType {
    const KIND: &'static str = "script";
    type Settings = Value;
    fn build(&self, s: Value, c: &ProcessorContext<'_>) -> Result<ProcessorPlan, SettingError> {
        compile_transform(c.name, "script", &s, c.readable, c.base).map(ProcessorPlan::Transform)
    }
}

impl Component<ProcessorTypes> for MappingType {
    const KIND: &'static str = "mapping";
    type Settings = Value;
    fn build(&self, s: Value, c: &ProcessorContext<'_>) -> Result<ProcessorPlan, SettingError> {
        mapping::compile(c.name, &s, c.entities, c.has_source).map(ProcessorPlan::Transform)
    }
}

/// Every processor type this build knows, by `type`.
pub fn registry() -> &'static Registry<ProcessorTypes> {
    static REGISTRY: OnceLock<Registry<ProcessorTypes>> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        Registry::new()
            .register(ProjectionType)
            .register(RustType)
            .register(ScriptType)
            .register(MappingType)
    })
}

/// The processor types this build knows.
pub fn kinds() -> Vec<&'static str> {
    registry().kinds()
}

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
    let tables: Vec<String> = source.as_ref().map(|s| s.tables()).unwrap_or_default();
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
                required: Vec::new(),
            }))
            .collect();
        &with_tables
    };
    let context = ProcessorContext {
        name,
        entities,
        readable,
        base,
        has_source: source.is_some(),
    };
    let mut plan = registry().configure(kind, settings, &context)?;
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
    let mappings: Vec<(usize, transform::DerivedIds)> = plans
        .iter()
        .enumerate()
        .filter_map(|(i, p)| match p {
            ProcessorPlan::Transform(t) => t.transform.derived_ids().map(|m| (i, m)),
            ProcessorPlan::Projection(_) => None,
        })
        .collect();
    for (i, m) in &mappings {
        for (field, table, n) in m.references.iter().cloned() {
            let Some((_, parent)) = mappings
                .iter()
                .find(|(_, p)| p.table.eq_ignore_ascii_case(&table))
            else {
                continue;
            };
            if parent.key.len() != n {
                return Err((
                    *i,
                    SettingError::new(
                        format!("{field}.key"),
                        format!(
                            "{n} key value(s), but the mapping of `{table}` derives its ids from \
                             {} ({}): the ids would never match",
                            parent.key.len(),
                            parent.key.join(", ")
                        ),
                    ),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parallel_and_key_are_checked() {
        let entities: Vec<EntityInfo> = ["event", "processedevent"]
            .into_iter()
            .map(|name| EntityInfo {
                name: name.into(),
                fields: None,
                properties: None,
                required: Vec::new(),
            })
            .collect();
        let base = std::path::Path::new(".");
        let ok = json!({"function": "events.enrich", "inputs": ["event"], "output": "processedevent", "parallel": 8, "key": "name"});
        let spec = compile_transform("p", "rust", &ok, &entities, base).unwrap();
        assert_eq!((spec.parallel, spec.key.as_deref()), (8, Some("name")));
        for (bad, field) in [
            (json!({"parallel": 0}), "parallel"),
            (json!({"parallel": 65}), "parallel"),
            (json!({"key": " "}), "key"),
        ] {
            let mut s = ok.clone();
            s.as_object_mut().unwrap().remove("parallel");
            s.as_object_mut().unwrap().remove("key");
            for (k, v) in bad.as_object().unwrap() {
                s[k] = v.clone();
            }
            let e = compile_transform("p", "rust", &s, &entities, base).unwrap_err();
            assert_eq!(e.field.as_deref(), Some(field), "{e:?}");
        }
    }
}
