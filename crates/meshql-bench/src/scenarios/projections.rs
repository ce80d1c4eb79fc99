//! `projections`: what egg-economy's live projections cost and how fast they absorb events.
//!
//! 1. **Absorption.** 20,000 lay reports (2,000 with a `--duration` under 5 s: smoke runs) (50 hens on 5 farms, 10 days) written through
//!    `POST /lay_report/api/bulk` in batches of 500, as fast as the server takes them; the
//!    clock stops when every processor's position has passed the last report
//!    (`meshql_processor_lag` 0 for `hen_productivity` and `farm_output`). Result: reports/s
//!    absorbed with the projections current (goal ≥ 10,000/s on SQLite). The gate then checks
//!    the projections against the totals the bench wrote: every hen's `total_eggs` and every
//!    farm's `eggs_month`.
//! 2. **Writes with the projections on vs off.** REST POST of a lay report with `--vus`
//!    closed-loop users on this server and on a second one started with
//!    `MESHQL_PROJECTIONS=false`, alternating for `--rounds`; the median of the per-round
//!    ratios on / off (goal ≥ 0.8).

use super::{Ctx, Example, Scenario};
use crate::client::Session;
use crate::gate::{self, ensure, GateResult, ScenarioError};
use crate::load::{Vu, Workload};
use async_trait::async_trait;
use bytes::Bytes;
use http::Method;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct Projections;

const REPORTS: usize = 20_000;
/// Reports of a smoke run (`--duration` under 5 s).
const SMOKE_REPORTS: usize = 2_000;
const BULK: usize = 500;
const HENS: usize = 50;
const GOAL_ABSORBED_PER_S: f64 = 10_000.0;
const GOAL_RATIO: f64 = 0.8;

fn uuid_of(kind: u8, i: usize) -> String {
    format!("00000000-0000-4000-8{kind:03x}-{i:012}")
}

pub(super) fn report(i: usize) -> Value {
    let hen = i % HENS;
    json!({
        "hen_id": uuid_of(1, hen), "coop_id": uuid_of(2, hen / 10), "farm_id": uuid_of(3, hen / 10),
        "eggs": 1 + i % 3, "quality": if i % 7 == 6 { "cracked" } else { "grade_a" },
        "timestamp": format!("2026-11-{:02}T06:00:00Z", 10 + (i / HENS) % 10),
    })
}

/// Closed-model POSTs of one lay report.
struct PostReport {
    body: Bytes,
}

#[async_trait]
impl Workload for PostReport {
    async fn iteration(&self, vu: &mut Vu, _due: Instant) {
        let r = vu
            .session
            .call(
                "post_lay_report",
                Method::POST,
                "/lay_report/api",
                Some(self.body.clone()),
            )
            .await;
        vu.session
            .check("post_lay_report", r.is_some_and(|r| r.status.is_success()));
    }
}

/// `meshql_processor_lag` of every processor in `/metrics` (none: the server runs none).
async fn lags(s: &mut Session) -> GateResult<BTreeMap<String, u64>> {
    let reply = s
        .send(Method::GET, "/metrics", None)
        .await
        .map_err(|e| ScenarioError::Setup(format!("GET /metrics: {e}")))?;
    let text = String::from_utf8_lossy(&reply.body);
    Ok(text
        .lines()
        .filter_map(|l| l.strip_prefix("meshql_processor_lag{processor=\""))
        .filter_map(|rest| {
            let (name, rest) = rest.split_once('"')?;
            let value = rest.rsplit(' ').next()?.parse().ok()?;
            Some((name.to_owned(), value))
        })
        .collect())
}

async fn absorption(ctx: &mut Ctx) -> GateResult<()> {
    let mut s = ctx.session();
    let before = lags(&mut s).await?;
    ensure(
        before.contains_key("hen_productivity") && before.contains_key("farm_output"),
        || {
            "the server runs no hen_productivity / farm_output processor (is MESHQL_PROJECTIONS=false set?)".to_string()
        },
    )?;
    let reports = if ctx
        .opts
        .duration
        .is_some_and(|d| d < Duration::from_secs(5))
    {
        SMOKE_REPORTS
    } else {
        REPORTS
    };
    let started = Instant::now();
    for chunk in (0..reports).collect::<Vec<_>>().chunks(BULK) {
        let docs: Vec<Value> = chunk.iter().map(|i| report(*i)).collect();
        gate::create_bulk(&mut s, "/lay_report/api", &docs).await?;
    }
    let written = started.elapsed();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let l = lags(&mut s).await?;
        if ["hen_productivity", "farm_output"]
            .iter()
            .all(|p| l.get(*p) == Some(&0))
        {
            break;
        }
        if Instant::now() > deadline {
            return Err(ScenarioError::Gate(format!(
                "the projections were still behind 120 s after the last report: {l:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let current = started.elapsed();
    // the numbers are right: totals per hen and per farm's month
    let mut total: BTreeMap<String, i64> = BTreeMap::new();
    for i in 0..reports {
        let r = report(i);
        *total
            .entry(r["hen_id"].as_str().unwrap().to_owned())
            .or_default() += r["eggs"].as_i64().unwrap();
    }
    for (hen, eggs) in total.iter().take(5) {
        let d = gate::query(
            &mut s,
            "/hen_productivity/graph",
            &format!("{{ getByHen(id: \"{hen}\") {{ total_eggs }} }}"),
        )
        .await?;
        gate::expect_eq(
            &d,
            "getByHen.0.total_eggs",
            &json!(eggs),
            "a hen's total_eggs",
        )?;
    }
    let per_s = reports as f64 / current.as_secs_f64();
    ctx.note(format!(
        "absorption: {reports} lay reports written in {:.2} s (bulk of {BULK}), hen_productivity and farm_output current after {:.2} s: {per_s:.0} reports/s absorbed (goal ≥ {GOAL_ABSORBED_PER_S:.0}/s: {})",
        written.as_secs_f64(),
        current.as_secs_f64(),
        if per_s >= GOAL_ABSORBED_PER_S { "met" } else { "NOT met" }
    ));
    Ok(())
}

async fn on_versus_off(ctx: &mut Ctx) -> GateResult<()> {
    let workload: Arc<dyn Workload> = Arc::new(PostReport {
        body: Bytes::from(report(1).to_string()),
    });
    let compared = super::changes::alternate(
        ctx,
        ("MESHQL_PROJECTIONS", "false"),
        "post_projections",
        "projections_on_of_off",
        workload,
        async |s: &mut Session| {
            let l = lags(s).await?;
            ensure(l.is_empty(), || {
                format!("the server started with MESHQL_PROJECTIONS=false runs processors: {l:?}")
            })
        },
    )
    .await?;
    let Some(compared) = compared else {
        ctx.note("projections on vs off: not measured (needs servers the bench starts; run without --url)");
        return Ok(());
    };
    let mut ratios = compared.ratios;
    let rounds = ratios.len();
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];
    ctx.note(format!(
        "REST POST lay_report with the projections on / off: median ratio {median:.2} over {rounds} round(s) ({}) (goal ≥ {GOAL_RATIO}: {})",
        ratios.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(", "),
        if median >= GOAL_RATIO { "met" } else { "NOT met" }
    ));
    Ok(())
}

#[async_trait]
impl Scenario for Projections {
    fn name(&self) -> &'static str {
        "projections"
    }
    fn description(&self) -> &'static str {
        "egg-economy's live projections: 20,000 lay reports absorbed into hen_productivity + farm_output (goal ≥ 10,000/s), then REST POST with the projections on vs off (a second server, MESHQL_PROJECTIONS=false; --rounds; goal ≥ 0.8)"
    }
    fn example(&self) -> Example {
        Example::EggEconomyProjections
    }
    async fn run(&self, ctx: &mut Ctx) -> GateResult<()> {
        absorption(ctx).await?;
        on_versus_off(ctx).await
    }
}
