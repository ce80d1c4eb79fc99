//! The report as a terminal table (in the seeds' style) and as Markdown.

use super::{Curve, CurvePoint, Report, RunReport, ScenarioReport};
use crate::stats::KindSummary;
use std::fmt::Write;

const HEADERS: [&str; 15] = [
    "kind", "count", "req/s", "avg", "min", "med", "p90", "p95", "p99", "p99.9", "max", "http err",
    "gql err", "err %", "checks",
];

fn row(k: &KindSummary) -> [String; 15] {
    let ms = |v: f64| format!("{v:.2}");
    [
        k.kind.clone(),
        thousands(k.count),
        format!("{:.1}", k.rps),
        ms(k.avg_ms),
        ms(k.min_ms),
        ms(k.med_ms),
        ms(k.p90_ms),
        ms(k.p95_ms),
        ms(k.p99_ms),
        ms(k.p999_ms),
        ms(k.max_ms),
        k.http_errors.to_string(),
        k.graphql_errors.to_string(),
        format!("{:.2}", k.error_rate * 100.0),
        if k.checks_passed + k.checks_failed == 0 {
            "-".into()
        } else {
            format!("{}/{}", k.checks_passed, k.checks_passed + k.checks_failed)
        },
    ]
}

/// Columns of a latency-vs-load table (latencies in ms, from each request's due time).
pub(super) const CURVE_HEADERS: [&str; 12] = [
    "load",
    "offered/s",
    "achieved/s",
    "p50",
    "p90",
    "p99",
    "p99.9",
    "max",
    "errors",
    "dropped",
    "lag p99",
    "server cores",
];

pub(super) fn curve_row(p: &CurvePoint) -> [String; 12] {
    let ms = |v: f64| format!("{v:.2}");
    let k = &p.latency;
    [
        format!("{:.0}%", p.fraction * 100.0),
        thousands(p.offered_rps.round() as u64),
        thousands(k.rps.round() as u64),
        ms(k.med_ms),
        ms(k.p90_ms),
        ms(k.p99_ms),
        ms(k.p999_ms),
        ms(k.max_ms),
        thousands(k.http_errors + k.graphql_errors),
        thousands(p.dropped),
        ms(p.schedule_lag_p99_ms),
        p.server
            .as_ref()
            .map_or_else(|| "-".into(), |s| format!("{:.2}", s.cpu_cores)),
    ]
}

/// `rest_get_by_id — saturation 80,123 req/s` above a curve's table.
pub(super) fn curve_title(c: &Curve) -> String {
    format!(
        "{} — saturation {} req/s (closed loop, above)",
        c.kind,
        thousands(c.saturation_rps.round() as u64)
    )
}

/// The curves of a scenario as one compact table, a path per block of rows.
fn terminal_curves(out: &mut String, curves: &[Curve]) {
    if curves.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\n-- latency vs offered load (open model; ms from each request's due time)"
    );
    let mut headers = vec!["path".to_string()];
    headers.extend(CURVE_HEADERS.map(String::from));
    let mut rows: Vec<Vec<String>> = Vec::new();
    for c in curves {
        for (i, p) in c.points.iter().enumerate() {
            let mut r = vec![if i == 0 {
                c.kind.clone()
            } else {
                String::new()
            }];
            r.extend(curve_row(p));
            rows.push(r);
        }
    }
    let mut widths: Vec<usize> = headers.iter().map(String::len).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut l = String::from("   ");
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i == 0 {
                let _ = write!(l, "{c:<w$}");
            } else {
                let _ = write!(l, "  {c:>w$}");
            }
        }
        l
    };
    let _ = writeln!(out, "{}", line(&headers));
    for r in &rows {
        let _ = writeln!(out, "{}", line(r));
    }
    for c in curves {
        if c.points.is_empty() {
            let _ = writeln!(out, "   {}: no points (nothing measured)", c.kind);
        }
    }
}

/// 12345 → "12,345".
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let groups: Vec<&str> = digits
        .as_bytes()
        .rchunks(3)
        .rev()
        .map(|g| std::str::from_utf8(g).expect("ASCII digits"))
        .collect();
    groups.join(",")
}

fn run_line(run: &RunReport) -> String {
    let mut parts = vec![
        run.model.clone(),
        format!("{:.1}s", run.duration_s),
        format!("{} iterations", thousands(run.iterations)),
        format!("peak {} users", run.peak_vus),
    ];
    if run.offered_rps.is_some() {
        parts.push(format!("{} dropped", thousands(run.dropped)));
    }
    if let Some(s) = &run.server {
        parts.push(format!(
            "server peak RSS {:.1} MiB, {:.2} cores",
            s.peak_rss_mib, s.cpu_cores
        ));
    }
    parts.join(" · ")
}

pub(super) fn metrics_line(run: &RunReport) -> Option<String> {
    if run.metrics.is_empty() {
        return None;
    }
    Some(
        run.metrics
            .iter()
            .map(|(k, v)| format!("{k} = {}", fmt_metric(*v)))
            .collect::<Vec<_>>()
            .join(" · "),
    )
}

fn fmt_metric(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        // counts
        format!("{}", v as i64)
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn thresholds_line(run: &RunReport) -> String {
    run.thresholds
        .iter()
        .map(|t| {
            format!(
                "{} {} {} {} {}",
                t.name,
                fmt_metric(t.value),
                t.comparison.symbol(),
                fmt_metric(t.limit),
                if t.passed { "ok" } else { "FAILED" }
            )
        })
        .collect::<Vec<_>>()
        .join(" · ")
}

/// The report's first line: tool, time, machine, and how its cores were split between the
/// load generator and the server (`server workers N` when the bench started the servers).
pub(super) fn machine_line(report: &Report) -> String {
    let m = &report.machine;
    let workers = m
        .server_workers
        .map_or_else(String::new, |w| format!(" · server workers {w}"));
    format!(
        "{} · {} · {} cores ({}) · Linux {} · load generator on {} thread(s){workers}",
        report.tool, report.started, m.cores, m.cpu, m.kernel, m.client_threads
    )
}

/// The whole report for a terminal.
pub fn terminal(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", machine_line(report));
    for s in &report.scenarios {
        terminal_scenario(&mut out, s);
    }
    out
}

fn terminal_scenario(out: &mut String, s: &ScenarioReport) {
    let _ = writeln!(out, "\n== {} — {}", s.name, s.description);
    let _ = writeln!(out, "   target {} · {}", s.url, s.status.label());
    for run in &s.runs {
        let _ = writeln!(out, "\n-- {}: {}", run.label, run_line(run));
        let mut rows: Vec<[String; 15]> = run.kinds.iter().map(row).collect();
        if run.kinds.len() > 1 {
            rows.push(row(&run.overall));
        }
        let mut widths = HEADERS.map(str::len);
        for r in &rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.len());
            }
        }
        let line = |cells: &[String]| {
            let mut l = String::new();
            for (i, (c, w)) in cells.iter().zip(widths).enumerate() {
                if i == 0 {
                    let _ = write!(l, "{c:<w$}");
                } else {
                    let _ = write!(l, "  {c:>w$}");
                }
            }
            l
        };
        let _ = writeln!(out, "{}", line(&HEADERS.map(String::from)));
        for r in &rows {
            let _ = writeln!(out, "{}", line(r));
        }
        if let Some(ml) = metrics_line(run) {
            let _ = writeln!(out, "   {ml}");
        }
        let _ = writeln!(out, "   thresholds: {}", thresholds_line(run));
    }
    terminal_curves(out, &s.curves);
    for n in &s.notes {
        let _ = writeln!(out, "   note: {n}");
    }
}

/// The whole report as Markdown (latencies in ms).
pub fn markdown(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# meshql bench report\n");
    let _ = writeln!(out, "{}\n", machine_line(report));
    let _ = writeln!(out, "| scenario | status | runs |\n|---|---|---|");
    for s in &report.scenarios {
        let _ = writeln!(
            out,
            "| {} | {} | {} |",
            s.name,
            s.status.label().replace('|', "\\|"),
            s.runs.len()
        );
    }
    for s in &report.scenarios {
        let _ = writeln!(out, "\n## {}\n\n{}\n", s.name, s.description);
        let _ = writeln!(out, "Target `{}` — **{}**\n", s.url, s.status.label());
        for run in &s.runs {
            let _ = writeln!(out, "### {}\n\n{}\n", run.label, run_line(run));
            let _ = writeln!(out, "| {} |", HEADERS.join(" | "));
            let _ = writeln!(out, "|---{}|", "|---:".repeat(HEADERS.len() - 1));
            for k in run
                .kinds
                .iter()
                .chain((run.kinds.len() > 1).then_some(&run.overall))
            {
                let _ = writeln!(out, "| {} |", row(k).join(" | "));
            }
            if let Some(ml) = metrics_line(run) {
                let _ = writeln!(out, "\n{ml}");
            }
            let _ = writeln!(out, "\nThresholds: {}\n", thresholds_line(run));
        }
        for c in &s.curves {
            let _ = writeln!(
                out,
                "### Latency vs offered load: {}\n\nOpen model, constant arrival rates at fractions of the saturation; latencies in ms from each request's due time.\n",
                curve_title(c)
            );
            let _ = writeln!(out, "| {} |", CURVE_HEADERS.join(" | "));
            let _ = writeln!(out, "|---{}|", "|---:".repeat(CURVE_HEADERS.len() - 1));
            for p in &c.points {
                let _ = writeln!(out, "| {} |", curve_row(p).join(" | "));
            }
            let _ = writeln!(out);
        }
        for n in &s.notes {
            let _ = writeln!(out, "- {n}");
        }
        let charts: Vec<_> = super::charts(report)
            .into_iter()
            .filter(|c| c.scenario == s.name)
            .collect();
        if !charts.is_empty() {
            let _ = writeln!(out);
            for c in charts {
                let _ = writeln!(
                    out,
                    "![{}](charts/{})",
                    c.file.trim_end_matches(".svg"),
                    c.file
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
    }

    #[test]
    fn metrics_are_formatted_by_size() {
        assert_eq!(fmt_metric(0.0), "0");
        assert_eq!(fmt_metric(10000.0), "10000");
        assert_eq!(fmt_metric(3.0), "3");
        assert_eq!(fmt_metric(0.2164), "0.216");
        assert_eq!(fmt_metric(4.567), "4.57");
        assert_eq!(fmt_metric(1234.4), "1234");
    }
}
