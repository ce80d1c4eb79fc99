//! `meshql bench compare A.json B.json`: the runs both reports share, side by side, with
//! B/A ratios of throughput and of median and p95 latency.

use super::Report;
use std::fmt::Write;

fn ratio(a: f64, b: f64) -> String {
    if a == 0.0 {
        "-".into()
    } else {
        format!("{:.2}x", b / a)
    }
}

/// A table of every (scenario, run, kind) present in both reports; lines only in one report
/// are listed after it.
pub fn compare(a: &Report, b: &Report, a_name: &str, b_name: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "A = {a_name} ({})\nB = {b_name} ({})\n",
        a.started, b.started
    );
    let header = format!(
        "{:<44} {:>11} {:>11} {:>7}  {:>8} {:>8} {:>7}  {:>8} {:>8} {:>7}",
        "scenario / run / kind",
        "A req/s",
        "B req/s",
        "B/A",
        "A med",
        "B med",
        "B/A",
        "A p95",
        "B p95",
        "B/A"
    );
    let _ = writeln!(out, "{header}");
    let mut missing = Vec::new();
    for sa in &a.scenarios {
        let Some(sb) = b.scenarios.iter().find(|s| s.name == sa.name) else {
            missing.push(format!("{} (only in A)", sa.name));
            continue;
        };
        for ra in &sa.runs {
            let Some(rb) = sb.runs.iter().find(|r| r.label == ra.label) else {
                missing.push(format!("{} / {} (only in A)", sa.name, ra.label));
                continue;
            };
            for ka in ra.kinds.iter().chain([&ra.overall]) {
                let kb = if ka.kind == "overall" {
                    Some(&rb.overall)
                } else {
                    rb.kinds.iter().find(|k| k.kind == ka.kind)
                };
                let Some(kb) = kb else { continue };
                let name = format!("{} / {} / {}", sa.name, ra.label, ka.kind);
                let _ = writeln!(
                    out,
                    "{:<44} {:>11.1} {:>11.1} {:>7}  {:>8.2} {:>8.2} {:>7}  {:>8.2} {:>8.2} {:>7}",
                    name,
                    ka.rps,
                    kb.rps,
                    ratio(ka.rps, kb.rps),
                    ka.med_ms,
                    kb.med_ms,
                    ratio(ka.med_ms, kb.med_ms),
                    ka.p95_ms,
                    kb.p95_ms,
                    ratio(ka.p95_ms, kb.p95_ms)
                );
            }
            for (key, va) in &ra.metrics {
                if let Some(vb) = rb.metrics.get(key) {
                    let _ = writeln!(
                        out,
                        "{:<44} {:>11.3} {:>11.3} {:>7}",
                        format!("{} / {} / {key}", sa.name, ra.label),
                        va,
                        vb,
                        ratio(*va, *vb)
                    );
                }
            }
        }
    }
    for sb in &b.scenarios {
        if !a.scenarios.iter().any(|s| s.name == sb.name) {
            missing.push(format!("{} (only in B)", sb.name));
        }
    }
    if !missing.is_empty() {
        let _ = writeln!(out, "\nnot compared: {}", missing.join(", "));
    }
    out
}
