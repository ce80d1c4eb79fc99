//! The change feed's series of `/metrics`: what the hub copied into the log, and the log's
//! ends.

use crate::Hub;
use meshql_core::metrics::Collect;
use std::fmt::Write;

impl Collect for Hub {
    fn collect(&self, out: &mut String) {
        write_feed_metrics(out, self);
    }
}

fn write_feed_metrics(out: &mut String, hub: &Hub) {
    let stats = hub.stats();
    let name = "meshql_changes_copied_total";
    let _ = writeln!(
        out,
        "# HELP {name} Changes copied from the entity's store into the change log.\n# TYPE {name} counter"
    );
    for s in &stats {
        let _ = writeln!(out, "{name}{{entity=\"{}\"}} {}", s.entity, s.copied);
    }
    let name = "meshql_changes_copy_errors_total";
    let _ = writeln!(
        out,
        "# HELP {name} Failed attempts to copy the entity's changes (retried).\n# TYPE {name} counter"
    );
    for s in &stats {
        let _ = writeln!(out, "{name}{{entity=\"{}\"}} {}", s.entity, s.errors);
    }
    let log = hub.log();
    let name = "meshql_changes_log_last_position";
    let _ = writeln!(
        out,
        "# HELP {name} Position of the newest change in the log.\n# TYPE {name} gauge\n{name} {}",
        log.last_offset()
    );
    let name = "meshql_changes_log_first_position";
    let _ = writeln!(
        out,
        "# HELP {name} Position of the oldest change the log still keeps.\n# TYPE {name} gauge\n{name} {}",
        log.first_offset()
    );
}
