//! The report as one self-contained HTML page: the tables plus inline SVG charts (latency
//! percentiles per request kind, throughput and users over time, throughput and p95 against
//! offered load, fraction of the ceiling, write → change-feed latency, each path's latency
//! against offered load) and each run's metrics. No scripts, no external assets.

use super::text::{curve_row, curve_title, metrics_line, thousands, CURVE_HEADERS};
use super::{Curve, Report, RunReport, ScenarioReport};
use std::fmt::Write;

const COLORS: [&str; 6] = [
    "#2f6db5", "#e07b28", "#3a9a4a", "#b83b5e", "#7a5cb8", "#8a8a8a",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A round upper bound for an axis (1, 1.2, 1.6, 2, 2.4, 3, 4, 5, 6, 8 × 10ⁿ: each divides
/// into four readable ticks).
fn nice_max(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let exp = 10f64.powf(v.log10().floor());
    for m in [1.0, 1.2, 1.6, 2.0, 2.4, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0] {
        if v <= m * exp {
            return m * exp;
        }
    }
    10.0 * exp
}

fn fmt_tick(v: f64) -> String {
    if v >= 1000.0 {
        thousands(v.round() as u64)
    } else if v >= 10.0 || v == 0.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

const W: f64 = 720.0;
const PAD_L: f64 = 70.0;
const PAD_R: f64 = 150.0;
const PAD_T: f64 = 30.0;
const PAD_B: f64 = 40.0;

/// The opening `<svg>` element of a chart `h` pixels high, with its title.
fn svg_open(title: &str, h: f64) -> String {
    format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" font-family="sans-serif" font-size="11"><text x="4" y="16" font-size="13" font-weight="bold">{}</text>"#,
        esc(title)
    )
}

/// Grouped horizontal bars: one group per category, one bar per series.
pub fn bar_chart(
    title: &str,
    unit: &str,
    categories: &[String],
    series: &[(&str, Vec<f64>)],
) -> String {
    let bar_h = 12.0;
    let group_h = bar_h * series.len() as f64 + 10.0;
    let h = PAD_T + PAD_B + group_h * categories.len() as f64;
    let label_w = 150.0;
    let plot_w = W - label_w - PAD_R;
    let max = nice_max(
        series
            .iter()
            .flat_map(|(_, v)| v.iter().copied())
            .fold(0.0, f64::max),
    );
    let mut svg = svg_open(title, h);
    for i in 0..=4 {
        let v = max * i as f64 / 4.0;
        let x = label_w + plot_w * i as f64 / 4.0;
        let _ = write!(
            svg,
            r##"<line x1="{x}" y1="{PAD_T}" x2="{x}" y2="{y2}" stroke="#ddd"/><text x="{x}" y="{ty}" text-anchor="middle">{}</text>"##,
            fmt_tick(v),
            y2 = h - PAD_B,
            ty = h - PAD_B + 14.0
        );
    }
    let _ = write!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        label_w + plot_w / 2.0,
        h - 8.0,
        esc(unit)
    );
    for (c, cat) in categories.iter().enumerate() {
        let y0 = PAD_T + group_h * c as f64 + 5.0;
        let _ = write!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            label_w - 6.0,
            y0 + group_h / 2.0,
            esc(cat)
        );
        for (s, (_, values)) in series.iter().enumerate() {
            let v = values.get(c).copied().unwrap_or(0.0);
            let wpx = (v / max * plot_w).max(0.5);
            let y = y0 + bar_h * s as f64;
            let _ = write!(
                svg,
                r#"<rect x="{label_w}" y="{y}" width="{wpx:.1}" height="{}" fill="{}"><title>{}: {v:.3}</title></rect>"#,
                bar_h - 2.0,
                COLORS[s % COLORS.len()],
                esc(series[s].0)
            );
        }
    }
    legend(&mut svg, series.iter().map(|(n, _)| *n));
    svg.push_str("</svg>");
    svg
}

fn legend<'a>(svg: &mut String, names: impl Iterator<Item = &'a str>) {
    for (i, name) in names.enumerate() {
        let y = PAD_T + 16.0 * i as f64;
        let _ = write!(
            svg,
            r#"<rect x="{}" y="{}" width="10" height="10" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            W - PAD_R + 12.0,
            y,
            COLORS[i % COLORS.len()],
            W - PAD_R + 26.0,
            y + 9.0,
            esc(name)
        );
    }
}

/// Lines over a shared x axis; each series is scaled to its own axis when `own_scale`.
pub fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(&str, Vec<(f64, f64)>)],
) -> String {
    let h = 260.0;
    let plot_w = W - PAD_L - PAD_R;
    let plot_h = h - PAD_T - PAD_B;
    let points = series.iter().flat_map(|(_, p)| p.iter());
    let (xmax, ymax) = points.fold((0.0f64, 0.0f64), |(x, y), p| (x.max(p.0), y.max(p.1)));
    let (xmax, ymax) = (nice_max(xmax), nice_max(ymax));
    let mut svg = svg_open(title, h);
    for i in 0..=4 {
        let y = PAD_T + plot_h * (1.0 - i as f64 / 4.0);
        let x = PAD_L + plot_w * i as f64 / 4.0;
        let _ = write!(
            svg,
            r##"<line x1="{PAD_L}" y1="{y}" x2="{x2}" y2="{y}" stroke="#ddd"/><text x="{tx}" y="{ty}" text-anchor="end">{}</text>"##,
            fmt_tick(ymax * i as f64 / 4.0),
            x2 = PAD_L + plot_w,
            tx = PAD_L - 4.0,
            ty = y + 4.0
        );
        let _ = write!(
            svg,
            r#"<text x="{x}" y="{}" text-anchor="middle">{}</text>"#,
            h - PAD_B + 14.0,
            fmt_tick(xmax * i as f64 / 4.0)
        );
    }
    let _ = write!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text><text x="12" y="{}" transform="rotate(-90 12 {})" text-anchor="middle">{}</text>"#,
        PAD_L + plot_w / 2.0,
        h - 6.0,
        esc(x_label),
        PAD_T + plot_h / 2.0,
        PAD_T + plot_h / 2.0,
        esc(y_label)
    );
    for (i, (name, pts)) in series.iter().enumerate() {
        let path: Vec<String> = pts
            .iter()
            .map(|(x, y)| {
                format!(
                    "{:.1},{:.1}",
                    PAD_L + x / xmax * plot_w,
                    PAD_T + plot_h * (1.0 - y / ymax)
                )
            })
            .collect();
        let _ = write!(
            svg,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"><title>{}</title></polyline>"#,
            COLORS[i % COLORS.len()],
            path.join(" "),
            esc(name)
        );
        if pts.len() <= 20 {
            for (x, y) in pts {
                let _ = write!(
                    svg,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{}"><title>{name}: {x:.0} → {y:.2}</title></circle>"#,
                    PAD_L + x / xmax * plot_w,
                    PAD_T + plot_h * (1.0 - y / ymax),
                    COLORS[i % COLORS.len()],
                );
            }
        }
    }
    legend(&mut svg, series.iter().map(|(n, _)| *n));
    svg.push_str("</svg>");
    svg
}

/// Charts of one run, each named by a short slug.
fn run_charts(run: &RunReport) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let kinds: Vec<String> = run.kinds.iter().map(|k| k.kind.clone()).collect();
    out.push((
        "latency",
        bar_chart(
            &format!("{} — latency per request kind", run.label),
            "milliseconds",
            &kinds,
            &[
                ("median", run.kinds.iter().map(|k| k.med_ms).collect()),
                ("p95", run.kinds.iter().map(|k| k.p95_ms).collect()),
                ("p99", run.kinds.iter().map(|k| k.p99_ms).collect()),
            ],
        ),
    ));
    if run.timeline.len() >= 2 {
        out.push((
            "timeline",
            line_chart(
                &format!("{} — throughput over time", run.label),
                "seconds",
                "requests/s",
                &[("req/s", run.timeline.iter().map(|s| (s.t, s.rps)).collect())],
            ),
        ));
        let users: Vec<(f64, f64)> = run.timeline.iter().map(|s| (s.t, s.vus as f64)).collect();
        let rss: Vec<(f64, f64)> = run
            .timeline
            .iter()
            .filter_map(|s| s.rss_mib.map(|r| (s.t, r)))
            .collect();
        let mut series = vec![("users / busy workers", users)];
        if !rss.is_empty() {
            series.push(("server RSS (MiB)", rss));
        }
        out.push((
            "users-memory",
            line_chart(
                &format!("{} — users and server memory", run.label),
                "seconds",
                "users · MiB",
                &series,
            ),
        ));
    }
    out
}

/// Charts across the runs of one scenario, each named by a short slug.
fn scenario_charts(s: &ScenarioReport) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let swept: Vec<&RunReport> = s.runs.iter().filter(|r| r.offered_rps.is_some()).collect();
    if swept.len() >= 2 {
        let offered = |r: &RunReport| r.offered_rps.unwrap_or(0.0);
        out.push((
            "throughput-vs-offered",
            line_chart(
                "throughput against offered load",
                "offered requests/s",
                "requests/s",
                &[
                    (
                        "achieved",
                        swept.iter().map(|r| (offered(r), r.overall.rps)).collect(),
                    ),
                    (
                        "offered",
                        swept.iter().map(|r| (offered(r), offered(r))).collect(),
                    ),
                ],
            ),
        ));
        out.push((
            "latency-vs-offered",
            line_chart(
                "latency against offered load",
                "offered requests/s",
                "milliseconds",
                &[
                    (
                        "p95",
                        swept
                            .iter()
                            .map(|r| (offered(r), r.overall.p95_ms))
                            .collect(),
                    ),
                    (
                        "p99",
                        swept
                            .iter()
                            .map(|r| (offered(r), r.overall.p99_ms))
                            .collect(),
                    ),
                    (
                        "median",
                        swept
                            .iter()
                            .map(|r| (offered(r), r.overall.med_ms))
                            .collect(),
                    ),
                ],
            ),
        ));
    }
    let feed: Vec<&RunReport> = s
        .runs
        .iter()
        .filter(|r| r.metrics.contains_key("feed_latency_p50_ms"))
        .collect();
    if !feed.is_empty() {
        let series = |key: &str| -> Vec<f64> {
            feed.iter()
                .map(|r| r.metrics.get(key).copied().unwrap_or(0.0))
                .collect()
        };
        out.push((
            "feed-latency",
            bar_chart(
                "write → change on the feed (from send)",
                "milliseconds",
                &feed.iter().map(|r| r.label.clone()).collect::<Vec<_>>(),
                &[
                    ("p50", series("feed_latency_p50_ms")),
                    ("p90", series("feed_latency_p90_ms")),
                    ("p99", series("feed_latency_p99_ms")),
                ],
            ),
        ));
    }
    let a_to_b: Vec<&RunReport> = s
        .runs
        .iter()
        .filter(|r| r.metrics.contains_key("a_to_b_latency_p50_ms"))
        .collect();
    if !a_to_b.is_empty() {
        let series = |key: &str| -> Vec<f64> {
            a_to_b
                .iter()
                .map(|r| r.metrics.get(key).copied().unwrap_or(0.0))
                .collect()
        };
        out.push((
            "a-to-b-latency",
            bar_chart(
                "POST on one process → change on another's feed (from send)",
                "milliseconds",
                &a_to_b.iter().map(|r| r.label.clone()).collect::<Vec<_>>(),
                &[
                    ("p50", series("a_to_b_latency_p50_ms")),
                    ("p95", series("a_to_b_latency_p95_ms")),
                    ("p99", series("a_to_b_latency_p99_ms")),
                ],
            ),
        ));
    }
    let ratios: Vec<(String, f64)> = s
        .runs
        .iter()
        .filter_map(|r| r.metrics.get("of_ceiling").map(|v| (r.label.clone(), *v)))
        .collect();
    if !ratios.is_empty() {
        out.push((
            "of-ceiling",
            bar_chart(
                "throughput as a fraction of the ceiling (same tool, same run)",
                "fraction of ceiling",
                &ratios.iter().map(|(l, _)| l.clone()).collect::<Vec<_>>(),
                &[("of ceiling", ratios.iter().map(|(_, v)| *v).collect())],
            ),
        ));
    }
    out
}

/// The latency-vs-load chart of one path: p50, p99 and p99.9 against the offered rate.
fn curve_chart(c: &Curve) -> String {
    let series = |f: fn(&super::CurvePoint) -> f64| -> Vec<(f64, f64)> {
        c.points.iter().map(|p| (p.offered_rps, f(p))).collect()
    };
    line_chart(
        &format!(
            "{} — latency against offered load (open model, from due time)",
            c.kind
        ),
        "offered requests/s",
        "milliseconds",
        &[
            ("p50", series(|p| p.latency.med_ms)),
            ("p99", series(|p| p.latency.p99_ms)),
            ("p99.9", series(|p| p.latency.p999_ms)),
        ],
    )
}

/// Charts of a scenario's curves, each named `curve-<kind>`.
fn curve_charts(s: &ScenarioReport) -> Vec<(String, String)> {
    s.curves
        .iter()
        .filter(|c| !c.points.is_empty())
        .map(|c| (format!("curve-{}", slug(&c.kind)), curve_chart(c)))
        .collect()
}

/// Turns a label into a file-name-safe slug.
fn slug(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_matches('-').to_string()
}

/// One chart of a report, as a standalone SVG file.
pub struct Chart {
    /// Scenario the chart belongs to.
    pub scenario: String,
    /// File name (`<scenario>-<run>-<chart>.svg`).
    pub file: String,
    pub svg: String,
}

/// Every chart of the report, in the order the HTML page shows them.
pub fn charts(report: &Report) -> Vec<Chart> {
    let mut out = Vec::new();
    for s in &report.scenarios {
        for (name, svg) in scenario_charts(s) {
            out.push(Chart {
                scenario: s.name.clone(),
                file: format!("{}-{name}.svg", slug(&s.name)),
                svg,
            });
        }
        for run in &s.runs {
            for (name, svg) in run_charts(run) {
                out.push(Chart {
                    scenario: s.name.clone(),
                    file: format!("{}-{}-{name}.svg", slug(&s.name), slug(&run.label)),
                    svg,
                });
            }
        }
        for (name, svg) in curve_charts(s) {
            out.push(Chart {
                scenario: s.name.clone(),
                file: format!("{}-{name}.svg", slug(&s.name)),
                svg,
            });
        }
    }
    out
}

/// The whole report as a standalone HTML page.
pub fn html(report: &Report) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<!doctype html><html><head><meta charset="utf-8"><title>meshql bench — {started}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}}table{{border-collapse:collapse;font-size:12px;margin:.5em 0}}td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}}td:first-child,th:first-child{{text-align:left}}svg{{display:block;margin:.8em 0}}.fail{{color:#b00;font-weight:bold}}</style></head><body>
<h1>meshql bench</h1><p>{machine}</p>"#,
        started = esc(&report.started),
        machine = esc(&super::text::machine_line(report)),
    );
    for s in &report.scenarios {
        let class = if s.status.is_failure() {
            " class=\"fail\""
        } else {
            ""
        };
        let _ = write!(
            out,
            "<h2>{}</h2><p>{}</p><p>target <code>{}</code> — <span{class}>{}</span></p>",
            esc(&s.name),
            esc(&s.description),
            esc(&s.url),
            esc(&s.status.label())
        );
        for (_, svg) in scenario_charts(s) {
            out.push_str(&svg);
        }
        for run in &s.runs {
            let _ = write!(
                out,
                "<h3>{}</h3><p>{}</p>",
                esc(&run.label),
                esc(&run.model)
            );
            out.push_str("<table><tr><th>kind</th><th>count</th><th>req/s</th><th>avg</th><th>min</th><th>med</th><th>p90</th><th>p95</th><th>p99</th><th>p99.9</th><th>max</th><th>http err</th><th>gql err</th><th>checks</th></tr>");
            for k in run
                .kinds
                .iter()
                .chain((run.kinds.len() > 1).then_some(&run.overall))
            {
                let _ = write!(
                    out,
                    "<tr><td>{}</td><td>{}</td><td>{:.1}</td><td>{:.2}</td><td>{:.2}</td><td>{:.2}</td><td>{:.2}</td><td>{:.2}</td><td>{:.2}</td><td>{:.2}</td><td>{:.2}</td><td>{}</td><td>{}</td><td>{}/{}</td></tr>",
                    esc(&k.kind), thousands(k.count), k.rps, k.avg_ms, k.min_ms, k.med_ms, k.p90_ms,
                    k.p95_ms, k.p99_ms, k.p999_ms, k.max_ms, k.http_errors, k.graphql_errors, k.checks_passed,
                    k.checks_passed + k.checks_failed
                );
            }
            out.push_str("</table>");
            if let Some(u) = &run.server {
                let _ = write!(
                    out,
                    "<p>server peak RSS {:.1} MiB · {:.2} cores</p>",
                    u.peak_rss_mib, u.cpu_cores
                );
            }
            if let Some(ml) = metrics_line(run) {
                let _ = write!(out, "<p>{}</p>", esc(&ml));
            }
            for (_, svg) in run_charts(run) {
                out.push_str(&svg);
            }
        }
        for c in &s.curves {
            let _ = write!(
                out,
                "<h3>Latency vs offered load: {}</h3><p>open model, constant arrival rates at fractions of the saturation; latencies in ms from each request's due time</p><table><tr>",
                esc(&curve_title(c))
            );
            for h in CURVE_HEADERS {
                let _ = write!(out, "<th>{}</th>", esc(h));
            }
            out.push_str("</tr>");
            for p in &c.points {
                out.push_str("<tr>");
                for cell in curve_row(p) {
                    let _ = write!(out, "<td>{}</td>", esc(&cell));
                }
                out.push_str("</tr>");
            }
            out.push_str("</table>");
            if !c.points.is_empty() {
                out.push_str(&curve_chart(c));
            }
        }
        for n in &s.notes {
            let _ = write!(out, "<p>note: {}</p>", esc(n));
        }
    }
    out.push_str("</body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_bounds_are_round() {
        let cases = [
            (0.0, 1.0),
            (0.7, 0.8),
            (1.3, 1.6),
            (4.2, 5.0),
            (55.0, 60.0),
            (730.0, 800.0),
            (5000.0, 5000.0),
        ];
        for (v, want) in cases {
            let got = nice_max(v);
            assert!(
                (got - want).abs() < 1e-9 * want,
                "nice_max({v}) = {got}, want {want}"
            );
        }
    }

    #[test]
    fn charts_are_well_formed_svg() {
        let svg = bar_chart(
            "t <x>",
            "ms",
            &["a".into(), "b".into()],
            &[("p95", vec![1.0, 2.0]), ("p99", vec![3.0, 4.0])],
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert_eq!(svg.matches("<rect").count(), 4 + 2); // bars + legend swatches
        assert!(svg.contains("t &lt;x&gt;"));
        let svg = line_chart("l", "x", "y", &[("s", vec![(0.0, 1.0), (1.0, 2.0)])]);
        assert!(svg.contains("<polyline") && svg.ends_with("</svg>"));
    }
}
