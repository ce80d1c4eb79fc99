//! `meshql bench compare A.json B.json`: the runs both reports share, side by side, with
//! B/A ratios of throughput and of median and p95 latency, then of the tail (p99, p99.9, max);
//! latency-vs-load curve points are matched by their fraction of each report's own saturation.

use super::{Report, ScenarioReport};
use crate::stats::KindSummary;
use std::fmt::Write;

fn ratio(a: f64, b: f64) -> String {
    if a == 0.0 {
        "-".into()
    } else {
        format!("{:.2}x", b / a)
    }
}

/// One line of the comparison: a kind of a run, or a point of a curve, in both reports.
struct Pair<'a> {
    name: String,
    a: &'a KindSummary,
    b: &'a KindSummary,
}

/// The points of every curve both scenarios hold, matched by fraction of saturation.
fn curve_pairs<'a>(
    sa: &'a ScenarioReport,
    sb: &'a ScenarioReport,
    missing: &mut Vec<String>,
) -> Vec<Pair<'a>> {
    let mut out = Vec::new();
    for ca in &sa.curves {
        let Some(cb) = sb.curves.iter().find(|c| c.kind == ca.kind) else {
            missing.push(format!("{} / curve {} (only in A)", sa.name, ca.kind));
            continue;
        };
        for pa in &ca.points {
            let pb = cb
                .points
                .iter()
                .find(|p| (p.fraction - pa.fraction).abs() < 1e-9);
            if let Some(pb) = pb {
                out.push(Pair {
                    name: format!(
                        "{} / curve {} / {:.0}%",
                        sa.name,
                        ca.kind,
                        pa.fraction * 100.0
                    ),
                    a: &pa.latency,
                    b: &pb.latency,
                });
            }
        }
    }
    out
}

fn main_line(out: &mut String, p: &Pair) {
    let (ka, kb) = (p.a, p.b);
    let rps = format!(
        "{:>11.1} {:>11.1} {:>7}",
        ka.rps,
        kb.rps,
        ratio(ka.rps, kb.rps)
    );
    let rest = columns(&[(ka.med_ms, kb.med_ms), (ka.p95_ms, kb.p95_ms)]);
    let _ = writeln!(out, "{:<44} {rps}  {rest}", p.name);
}

/// `A B B/A` for each pair of values, two decimals, the groups two spaces apart.
fn columns(pairs: &[(f64, f64)]) -> String {
    pairs
        .iter()
        .map(|(a, b)| format!("{a:>8.2} {b:>8.2} {:>7}", ratio(*a, *b)))
        .collect::<Vec<_>>()
        .join("  ")
}

/// A table of every (scenario, run, kind) and curve point present in both reports; lines only
/// in one report are listed after it.
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
    let mut tail = Vec::new();
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
                let p = Pair {
                    name: format!("{} / {} / {}", sa.name, ra.label, ka.kind),
                    a: ka,
                    b: kb,
                };
                main_line(&mut out, &p);
                tail.push(p);
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
        for p in curve_pairs(sa, sb, &mut missing) {
            main_line(&mut out, &p);
            tail.push(p);
        }
    }
    if !tail.is_empty() {
        let _ = writeln!(
            out,
            "\n{:<44} {:>8} {:>8} {:>7}  {:>8} {:>8} {:>7}  {:>8} {:>8} {:>7}",
            "tail latency (ms)",
            "A p99",
            "B p99",
            "B/A",
            "A p99.9",
            "B p99.9",
            "B/A",
            "A max",
            "B max",
            "B/A"
        );
        for p in &tail {
            let (ka, kb) = (p.a, p.b);
            let rest = columns(&[
                (ka.p99_ms, kb.p99_ms),
                (ka.p999_ms, kb.p999_ms),
                (ka.max_ms, kb.max_ms),
            ]);
            let _ = writeln!(out, "{:<44} {rest}", p.name);
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
