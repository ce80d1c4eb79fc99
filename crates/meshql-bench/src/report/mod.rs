//! What a bench run produces: one [`Report`] (serialised as JSON), rendered as a terminal
//! table, Markdown, and a self-contained HTML page with SVG charts.

mod compare;
mod html;
mod text;

pub use compare::compare;
pub use html::{charts, html, Chart};
pub use text::{markdown, terminal};

use crate::monitor::{Sample, ServerUsage};
use crate::stats::KindSummary;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// `meshql bench <version>`.
    pub tool: String,
    /// When the bench started (RFC 3339, UTC).
    pub started: String,
    pub machine: Machine,
    pub target: TargetInfo,
    pub scenarios: Vec<ScenarioReport>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    pub cores: usize,
    pub cpu: String,
    pub kernel: String,
    /// Threads the load generator ran on.
    pub client_threads: usize,
    /// Worker threads of the servers the bench started (`None`: a server it did not start).
    #[serde(default)]
    pub server_workers: Option<usize>,
}

impl Machine {
    pub fn probe(client_threads: usize, server_workers: Option<usize>) -> Self {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| std::env::consts::OS.to_string());
        Self {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu,
            kernel,
            client_threads,
            server_workers,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TargetInfo {
    /// Base URL requests went to (the last one, when scenarios started their own servers).
    pub url: String,
    /// Whether the bench started the server itself (then RSS/CPU are reported).
    pub local: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScenarioReport {
    pub name: String,
    pub description: String,
    pub status: Status,
    /// The server the scenario measured.
    pub url: String,
    pub runs: Vec<RunReport>,
    /// Observations the scenario adds (what the gate proved, derived ratios, …).
    #[serde(default)]
    pub notes: Vec<String>,
    /// Latency against offered load, one curve per measured path (`throughput`); absent
    /// from reports written before curves existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub curves: Vec<Curve>,
}

/// Latency of one path against offered load: open-model runs at fixed fractions of the
/// closed-loop throughput the same run measured for that path.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Curve {
    /// The request kind (hot path) the curve belongs to.
    pub kind: String,
    /// The closed-loop throughput (req/s) the offered rates are fractions of.
    pub saturation_rps: f64,
    pub points: Vec<CurvePoint>,
}

/// One constant arrival rate of a [`Curve`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CurvePoint {
    /// Offered rate as a fraction of the curve's `saturation_rps`.
    pub fraction: f64,
    /// Requests due per second.
    pub offered_rps: f64,
    pub duration_s: f64,
    /// Requests sent (due ones minus dropped ones).
    pub iterations: u64,
    /// Requests due while every worker was busy, never sent.
    pub dropped: u64,
    /// How late the generator started requests after they were due: p99 and max (ms).
    pub schedule_lag_p99_ms: f64,
    pub schedule_lag_max_ms: f64,
    /// Latency from each request's due time; `rps` is the achieved rate.
    pub latency: KindSummary,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerUsage>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Status {
    Passed,
    /// Every run measured, but a threshold was crossed.
    ThresholdsFailed,
    /// The validation gate rejected the target: nothing was measured.
    GateFailed {
        reason: String,
    },
    /// Setup failed before the gate (server would not start, seeding failed, …).
    Failed {
        reason: String,
    },
    /// Not applicable to this target (e.g. needs a local server).
    Skipped {
        reason: String,
    },
}

impl Status {
    pub fn label(&self) -> String {
        match self {
            Status::Passed => "passed".into(),
            Status::ThresholdsFailed => "thresholds failed".into(),
            Status::GateFailed { reason } => format!("GATE FAILED: {reason}"),
            Status::Failed { reason } => format!("FAILED: {reason}"),
            Status::Skipped { reason } => format!("skipped: {reason}"),
        }
    }

    pub fn is_failure(&self) -> bool {
        !matches!(self, Status::Passed | Status::Skipped { .. })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunReport {
    /// What this run measured within its scenario (`load`, `300/s`, `ceiling`, …).
    pub label: String,
    /// The load model in words.
    pub model: String,
    /// Offered iteration rate (open model only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offered_rps: Option<f64>,
    pub duration_s: f64,
    pub iterations: u64,
    pub dropped: u64,
    pub peak_vus: usize,
    pub kinds: Vec<KindSummary>,
    pub overall: KindSummary,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerUsage>,
    pub thresholds: Vec<Threshold>,
    /// Extra numbers (`of_ceiling`, `storage_reads_per_request`, …).
    #[serde(default)]
    pub metrics: BTreeMap<String, f64>,
    #[serde(default)]
    pub timeline: Vec<Sample>,
}

/// A pass/fail bound on a run (k6 thresholds).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Threshold {
    pub name: String,
    pub limit: f64,
    pub value: f64,
    pub passed: bool,
    /// How `value` must compare with `limit`: below it unless said otherwise (absent from
    /// reports written before goals of other kinds existed).
    #[serde(default, skip_serializing_if = "Comparison::is_below")]
    pub comparison: Comparison,
}

/// The side of its limit a [`Threshold`]'s value must be on.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Comparison {
    /// `value < limit` (latencies, error rates).
    #[default]
    Below,
    /// `value ≤ limit` (counts that must stay at 0: lost, duplicated).
    AtMost,
    /// `value ≥ limit` (rates with a goal).
    AtLeast,
}

impl Comparison {
    fn is_below(&self) -> bool {
        *self == Comparison::Below
    }

    /// The operator as it is printed.
    pub fn symbol(self) -> &'static str {
        match self {
            Comparison::Below => "<",
            Comparison::AtMost => "≤",
            Comparison::AtLeast => "≥",
        }
    }
}

impl Threshold {
    /// `value` must be at least `limit`.
    pub fn at_least(name: impl Into<String>, limit: f64, value: f64) -> Self {
        Self {
            name: name.into(),
            limit,
            value,
            passed: value >= limit,
            comparison: Comparison::AtLeast,
        }
    }

    /// `value` must be at most `limit`.
    pub fn at_most(name: impl Into<String>, limit: f64, value: f64) -> Self {
        Self {
            name: name.into(),
            limit,
            value,
            passed: value <= limit,
            comparison: Comparison::AtMost,
        }
    }
}

/// Bounds every run is held to.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Every kind's p95 must stay below this (ms).
    pub p95_ms: f64,
    /// (HTTP + GraphQL errors) / requests must stay below this.
    pub error_rate: f64,
}

impl Default for Bounds {
    /// MeshQL's published k6 thresholds: p95 < 500 ms, error rate < 1 %.
    fn default() -> Self {
        Self {
            p95_ms: 500.0,
            error_rate: 0.01,
        }
    }
}

impl Bounds {
    pub fn evaluate(&self, kinds: &[KindSummary], overall: &KindSummary) -> Vec<Threshold> {
        let worst_p95 = kinds.iter().map(|k| k.p95_ms).fold(0.0, f64::max);
        vec![
            Threshold {
                name: "p95 of every kind (ms)".into(),
                limit: self.p95_ms,
                value: worst_p95,
                passed: worst_p95 < self.p95_ms,
                comparison: Comparison::Below,
            },
            Threshold {
                name: "error rate".into(),
                limit: self.error_rate,
                value: overall.error_rate,
                passed: overall.error_rate < self.error_rate
                    || (self.error_rate == 0.0 && overall.error_rate == 0.0),
                comparison: Comparison::Below,
            },
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{KindStats, Outcome};
    use std::time::Duration;

    /// A summary of `n` requests at 1..=n × `step_us` µs over one second.
    fn summary(kind: &str, n: u64, step_us: u64) -> KindSummary {
        let mut s = KindStats::default();
        for i in 1..=n {
            s.record(Duration::from_micros(i * step_us), Outcome::Ok);
        }
        s.summarise(kind, Duration::from_secs(1))
    }

    fn point(fraction: f64, offered: f64) -> CurvePoint {
        CurvePoint {
            fraction,
            offered_rps: offered,
            duration_s: 2.0,
            iterations: 2 * offered as u64,
            dropped: 3,
            schedule_lag_p99_ms: 0.05,
            schedule_lag_max_ms: 0.4,
            latency: summary("rest_get_by_id", 2000, 1),
            server: Some(ServerUsage {
                peak_rss_mib: 30.0,
                cpu_cores: 0.25,
            }),
        }
    }

    fn report() -> Report {
        let kind = summary("rest_get_by_id", 1000, 2);
        Report {
            tool: "meshql bench test".into(),
            started: "2026-11-25T00:00:00Z".into(),
            machine: Machine {
                cores: 2,
                cpu: "cpu".into(),
                kernel: "6".into(),
                client_threads: 1,
                server_workers: Some(1),
            },
            target: TargetInfo {
                url: "http://127.0.0.1:1".into(),
                local: true,
            },
            scenarios: vec![ScenarioReport {
                name: "throughput".into(),
                description: "hot paths".into(),
                status: Status::Passed,
                url: "http://127.0.0.1:1".into(),
                runs: vec![RunReport {
                    label: "rest_get_by_id".into(),
                    model: "constant".into(),
                    offered_rps: None,
                    duration_s: 1.0,
                    iterations: 1000,
                    dropped: 0,
                    peak_vus: 10,
                    kinds: vec![kind.clone()],
                    overall: kind,
                    server: None,
                    thresholds: vec![],
                    metrics: BTreeMap::new(),
                    timeline: vec![],
                }],
                notes: vec![],
                curves: vec![Curve {
                    kind: "rest_get_by_id".into(),
                    saturation_rps: 80_123.0,
                    points: vec![point(0.1, 8_012.0), point(0.9, 72_111.0)],
                }],
            }],
        }
    }

    #[test]
    fn every_rendering_shows_p999_and_the_curve() {
        let r = report();
        let term = text::terminal(&r);
        assert!(term.contains("p99.9"), "{term}");
        assert!(term.contains("latency vs offered load"), "{term}");
        // one row per point, the path named on its first row only
        let rows: Vec<&str> = term
            .lines()
            .filter(|l| l.contains("8,012") || l.contains("72,111"))
            .collect();
        assert_eq!(rows.len(), 2, "{term}");
        assert!(rows[0].trim_start().starts_with("rest_get_by_id"), "{term}");
        assert!(rows[1].trim_start().starts_with("90%"), "{term}");

        let md = text::markdown(&r);
        assert!(md.contains("| p99 | p99.9 | max |"), "{md}");
        assert!(
            md.contains("### Latency vs offered load: rest_get_by_id — saturation 80,123 req/s"),
            "{md}"
        );
        assert!(md.contains("| 10% | 8,012 | 2,000 | 1.00 |"), "{md}");
        assert!(md.contains("| 90% | 72,111 |"), "{md}");
        assert!(
            md.contains(
                "![throughput-curve-rest-get-by-id](charts/throughput-curve-rest-get-by-id.svg)"
            ),
            "{md}"
        );

        let page = html::html(&r);
        assert!(page.contains("<th>p99.9</th>"));
        assert!(page.contains("rest_get_by_id — latency against offered load"));
        let chart = html::charts(&r)
            .into_iter()
            .find(|c| c.file == "throughput-curve-rest-get-by-id.svg")
            .expect("a chart per curve");
        // p50, p99 and p99.9 lines, a marker per point on each
        assert_eq!(chart.svg.matches("<polyline").count(), 3);
        assert_eq!(chart.svg.matches("<circle").count(), 6);
        assert!(chart.svg.contains(">p99.9</text>"));
    }

    #[test]
    fn compare_matches_curve_points_and_shows_the_tail() {
        let a = report();
        let mut b = report();
        b.scenarios[0].curves[0].points.pop();
        let table = compare(&a, &b, "a", "b");
        assert!(
            table.contains("throughput / curve rest_get_by_id / 10%"),
            "{table}"
        );
        assert!(!table.contains("curve rest_get_by_id / 90%"), "{table}");
        assert!(
            table.contains("A p99.9") && table.contains("B max"),
            "{table}"
        );
        assert!(
            table.contains("1.00x") && !table.contains("not compared"),
            "{table}"
        );
    }

    #[test]
    fn reports_round_trip_and_older_ones_still_load() {
        let r = report();
        let json = serde_json::to_value(&r).unwrap();
        let back: Report = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(back.scenarios[0].curves, r.scenarios[0].curves);
        // a report written before curves and p99.9 existed
        let mut old = json;
        let s = &mut old["scenarios"][0];
        s.as_object_mut().unwrap().remove("curves");
        for run in s["runs"].as_array_mut().unwrap() {
            run["overall"].as_object_mut().unwrap().remove("p999_ms");
            for k in run["kinds"].as_array_mut().unwrap() {
                k.as_object_mut().unwrap().remove("p999_ms");
            }
        }
        let back: Report = serde_json::from_value(old).unwrap();
        assert!(back.scenarios[0].curves.is_empty());
        assert_eq!(back.scenarios[0].runs[0].overall.p999_ms, 0.0);
        assert!(text::markdown(&back).contains("## throughput"));
    }
}
