//! The processors' series of `/metrics`: per processor, what it read, wrote and set aside,
//! and how far behind it is (none without processors).

use crate::{ProcessorStats, Processors};
use meshql_core::metrics::Collect;
use std::fmt::Write;

impl Collect for Processors {
    fn collect(&self, out: &mut String) {
        write_metrics(out, &self.stats());
    }
}

/// The processors' series for `/metrics`.
fn write_metrics(out: &mut String, stats: &[ProcessorStats]) {
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
