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
}

impl Machine {
    pub fn probe(client_threads: usize) -> Self {
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
            },
            Threshold {
                name: "error rate".into(),
                limit: self.error_rate,
                value: overall.error_rate,
                passed: overall.error_rate < self.error_rate
                    || (self.error_rate == 0.0 && overall.error_rate == 0.0),
            },
        ]
    }
}
