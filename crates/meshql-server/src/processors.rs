//! `[[processor]]`: each entry's fields checked by `meshql_process` against the service's
//! entities (errors name the file, the field's line and the field), and the processors
//! started on the hub's log, writing through the engine's entity services.

use crate::app::BuildError;
use meshql_config::{ConfigError, ResolvedConfig};
use meshql_engine::EntityService;
use meshql_process::{EntityInfo, ProcessorPlan, ProcessorStats, Processors, StartOptions};
use std::collections::HashMap;
use std::fmt::Write;
use std::sync::Arc;

/// The entities as processors see them: names and JSON Schema fields.
fn entities(config: &ResolvedConfig) -> Vec<EntityInfo> {
    config
        .entities
        .iter()
        .map(|e| EntityInfo {
            name: e.name.clone(),
            fields: EntityInfo::fields_of(e.rest.as_ref().and_then(|r| r.schema.as_ref())),
        })
        .collect()
}

/// Checks every processor; or every problem, naming the file, line and field.
pub fn configure(config: &ResolvedConfig) -> Result<Vec<ProcessorPlan>, Vec<ConfigError>> {
    let entities = entities(config);
    let mut plans = Vec::new();
    let mut problems = Vec::new();
    let error = |spec: &meshql_config::ProcessorSpec, e: meshql_core::SettingError| ConfigError {
        file: config.file.clone(),
        line: spec.line_of(e.field.as_deref()),
        field: match e.field {
            Some(field) => format!("{}.{field}", spec.path),
            None => spec.path.clone(),
        },
        message: e.message,
    };
    for spec in &config.processors {
        let base = config.file.parent().unwrap_or(std::path::Path::new("."));
        match meshql_process::configure(&spec.name, &spec.kind, &spec.settings, &entities, base) {
            Ok(plan) => plans.push(plan),
            Err(e) => problems.push(error(spec, e)),
        }
    }
    if problems.is_empty() {
        if let Err((i, e)) = meshql_process::check_plans(&plans) {
            let spec = config
                .processors
                .iter()
                .find(|s| s.name == plans[i].name())
                .expect("every plan has its entry");
            problems.push(error(spec, e));
        }
    }
    if problems.is_empty() {
        Ok(plans)
    } else {
        Err(problems)
    }
}

/// Starts every enabled processor of the config on `log`.
pub async fn start(
    config: &ResolvedConfig,
    log: meshql_log::Log,
    services: &HashMap<String, Arc<EntityService>>,
    options: StartOptions,
) -> Result<Processors, BuildError> {
    let plans = configure(config)
        .map_err(|errors| BuildError::Preflight(errors.iter().map(|e| e.to_string()).collect()))?;
    meshql_process::start(&plans, services, log, options)
        .await
        .map_err(|e| BuildError::Changes {
            dir: config.changes.dir.display().to_string(),
            message: e.to_string(),
        })
}

/// The processors' series for `/metrics`.
pub fn write_metrics(out: &mut String, stats: &[ProcessorStats]) {
    if stats.is_empty() {
        return;
    }
    type Series = (
        &'static str,
        &'static str,
        &'static str,
        fn(&ProcessorStats) -> String,
    );
    let series: [Series; 8] = [
        ("meshql_processor_inputs_total", "counter", "Input changes the processor applied.", |s| s.processed.to_string()),
        ("meshql_processor_outputs_total", "counter", "Output versions the processor wrote.", |s| s.written.to_string()),
        ("meshql_processor_batches_total", "counter", "Batches the processor committed (outputs with their input position, one transaction each).", |s| s.batches.to_string()),
        ("meshql_processor_dead_letters", "gauge", "Inputs the processor set aside as dead letters (all time).", |s| s.dead_letters.to_string()),
        ("meshql_processor_errors_total", "counter", "Failed batches (each retried with backoff).", |s| s.errors.to_string()),
        ("meshql_processor_position", "gauge", "Log position up to which the processor's effects are committed.", |s| s.position.to_string()),
        ("meshql_processor_lag", "gauge", "Changes in the log the processor has not read past yet.", |s| s.lag.to_string()),
        ("meshql_processor_lag_seconds", "gauge", "Age of the oldest change the processor has not applied (0 when caught up).", |s| format!("{:.3}", s.lag_seconds)),
    ];
    for (name, kind, help, get) in series {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for s in stats {
            let _ = writeln!(
                out,
                "{name}{{processor=\"{}\",type=\"{}\",output=\"{}\"}} {}",
                s.name,
                s.kind,
                s.output,
                get(s)
            );
        }
    }
}
