//! `throughput`: the hot paths as a fraction of the load tool's ceiling, measured side by side
//! in one run with the same tool — a server that does nothing (one thread answering a fixed
//! ~170-byte JSON body, like nginx with one worker), then REST GET by id, GraphQL getById,
//! GraphQL depth 3 (1 farm → 3 coops → 15 hens) and REST POST, each with `--vus` closed-loop
//! users and no think time. These are issue 3's speed targets.
//!
//! Then, unless `--curve-secs 0`, a latency-vs-load curve per hot path (issue 14): the open
//! model at 10, 25, 50, 75 and 90 % of the throughput the same run just measured for that path
//! (the median over `--rounds`), each rate for `--curve-secs` seconds, latency counted from each
//! request's due time. Saturation numbers alone judge the tail where the server is flat out;
//! the curve shows it at equal load.
//!
//! Responses are checked by status and by a byte search for GraphQL `errors` only: parsing
//! every body would spend the cores the server is being measured on.

use super::egg_economy::seed_farmyard;
use super::writes::BackgroundWrites;
use super::{Ctx, Example, Scenario};
use crate::client::{graphql_body, Target};
use crate::gate::{self, ensure, len_at, GateResult, ScenarioError};
use crate::load::{OpenModel, Vu, Workload};
use crate::report::{Curve, CurvePoint, RunReport};
use async_trait::async_trait;
use bytes::Bytes;
use http::Method;
use serde_json::json;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

pub struct Throughput;

/// One request, repeated: `(kind, method, path, body)`.
struct Repeat {
    kind: &'static str,
    method: Method,
    path: String,
    body: Option<Bytes>,
    graphql: bool,
}

#[async_trait]
impl Workload for Repeat {
    async fn iteration(&self, vu: &mut Vu, _due: Instant) {
        let reply = vu
            .session
            .call(
                self.kind,
                self.method.clone(),
                &self.path,
                self.body.clone(),
            )
            .await;
        if self.graphql {
            if let Some(r) = reply {
                if contains(&r.body, b"\"errors\"") {
                    vu.session.recorder.kind(self.kind).graphql_error();
                }
            }
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// (kind, issue 3's target as a fraction of the ceiling)
const TARGETS: [(&str, f64); 4] = [
    ("rest_get_by_id", 0.30),
    ("graphql_get_by_id", 0.18),
    ("graphql_depth3", 0.036),
    ("rest_post", 0.19),
];

fn ceiling_url(ctx: &Ctx) -> Result<String, ScenarioError> {
    static BUILTIN: OnceLock<Result<String, String>> = OnceLock::new();
    if let Some(u) = &ctx.opts.ceiling {
        return Ok(u.clone());
    }
    BUILTIN
        .get_or_init(|| crate::server::start_ceiling().map_err(|e| e.to_string()))
        .clone()
        .map_err(|e| ScenarioError::Setup(format!("cannot start the ceiling server: {e}")))
}

/// Fractions of a path's saturation throughput its latency-vs-load curve offers.
const CURVE_FRACTIONS: [f64; 5] = [0.10, 0.25, 0.50, 0.75, 0.90];

/// `(fraction, offered rate)` of every point of a curve below a saturation of `saturation`
/// req/s: rates rounded to whole requests per second, at least 1/s; no points when the path
/// was not measured (nothing answered).
fn curve_rates(saturation: f64) -> Vec<(f64, f64)> {
    if !saturation.is_finite() || saturation < 1.0 {
        return Vec::new();
    }
    CURVE_FRACTIONS
        .iter()
        .map(|f| (*f, (saturation * f).round().max(1.0)))
        .collect()
}

/// One point of a curve: `rate` requests/s for `secs` seconds, `vus` connections opened
/// beforehand (as many as the saturation runs use), more opened when those are all busy —
/// up to ten milliseconds' worth of arrivals, at least 4 × `vus` — before requests are
/// dropped.
fn curve_model(rate: f64, secs: f64, vus: usize) -> OpenModel {
    let pre = vus.max(1);
    OpenModel {
        rate,
        duration: Duration::from_secs_f64(secs),
        pre_allocated: pre,
        max_workers: ((rate * 0.010) as usize).clamp(pre * 4, 1000.max(pre * 4)),
    }
}

/// A curve point from the open-model run that measured it.
fn curve_point(kind: &str, fraction: f64, run: &RunReport) -> CurvePoint {
    let latency = run
        .kinds
        .iter()
        .find(|k| k.kind == kind)
        .unwrap_or(&run.overall)
        .clone();
    let metric = |key: &str| run.metrics.get(key).copied().unwrap_or(0.0);
    CurvePoint {
        fraction,
        offered_rps: run.offered_rps.unwrap_or(0.0),
        duration_s: run.duration_s,
        iterations: run.iterations,
        dropped: run.dropped,
        schedule_lag_p99_ms: metric("schedule_lag_p99_ms"),
        schedule_lag_max_ms: metric("schedule_lag_max_ms"),
        latency,
        server: run.server.clone(),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[async_trait]
impl Scenario for Throughput {
    fn name(&self) -> &'static str {
        "throughput"
    }
    fn description(&self) -> &'static str {
        "hot paths against a do-nothing server in the same run: REST GET, GraphQL getById, depth 3, REST POST (issue 3 targets)"
    }
    fn example(&self) -> Example {
        Example::EggEconomy
    }
    async fn run(&self, ctx: &mut Ctx) -> GateResult<()> {
        let mut s = ctx.session();
        let yard = seed_farmyard(&mut s, 1, 3, 5).await?;
        let farm = &yard.farms[0];
        let get_path = format!("/farm/api/{}", farm.id);
        let doc = gate::get_json(&mut s, &get_path).await?;
        gate::expect_eq(&doc, "name", &json!(farm.name), "REST GET by id")?;
        let by_id = format!(
            "{{ getById(id: \"{}\") {{ id name farm_type zone }} }}",
            farm.id
        );
        let d = gate::query(&mut s, "/farm/graph", &by_id).await?;
        gate::expect_eq(&d, "getById.name", &json!(farm.name), "GraphQL getById")?;
        let depth3 = format!(
            "{{ getById(id: \"{}\") {{ name coops {{ name hens {{ name breed }} }} }} }}",
            farm.id
        );
        let d = gate::query(&mut s, "/farm/graph", &depth3).await?;
        let hens: usize = (0..3)
            .map(|i| len_at(&d, &format!("getById.coops.{i}.hens")))
            .sum();
        ensure(len_at(&d, "getById.coops") == 3 && hens == 15, || {
            format!("depth 3 should hold 3 coops and 15 hens, got {d}")
        })?;
        let post_doc = json!({"name": "farm-x", "farm_type": "homestead", "zone": "north"});
        let other_farm = gate::create(&mut s, "/farm/api", &post_doc).await?;
        // writes flowing (--writes-per-sec): new hens in a coop no measured read reads
        let writes_rate = ctx.opts.writes_per_sec;
        let writes_coop = if writes_rate > 0.0 {
            let coop = json!({"name": "coop-w", "farm_id": other_farm, "capacity": 10, "coop_type": "barn"});
            Some(gate::create(&mut s, "/coop/api", &coop).await?)
        } else {
            None
        };
        let mut written = Vec::new();

        let ceiling =
            Target::parse(&ceiling_url(ctx)?).map_err(|e| ScenarioError::Setup(e.to_string()))?;
        let paths: Vec<Arc<dyn Workload>> = vec![
            Arc::new(Repeat {
                kind: "rest_get_by_id",
                method: Method::GET,
                path: get_path,
                body: None,
                graphql: false,
            }),
            Arc::new(Repeat {
                kind: "graphql_get_by_id",
                method: Method::POST,
                path: "/farm/graph".into(),
                body: Some(graphql_body(&by_id)),
                graphql: true,
            }),
            Arc::new(Repeat {
                kind: "graphql_depth3",
                method: Method::POST,
                path: "/farm/graph".into(),
                body: Some(graphql_body(&depth3)),
                graphql: true,
            }),
            Arc::new(Repeat {
                kind: "rest_post",
                method: Method::POST,
                path: "/farm/api".into(),
                body: Some(Bytes::from(post_doc.to_string())),
                graphql: false,
            }),
        ];
        let model = ctx.constant(8);
        let rounds = ctx.opts.rounds.max(1);
        let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); TARGETS.len()];
        let mut saturations: Vec<Vec<f64>> = vec![Vec::new(); TARGETS.len()];
        let mut ceilings = Vec::new();
        for round in 1..=rounds {
            let suffix = if rounds > 1 {
                format!(" #{round}")
            } else {
                String::new()
            };
            let c = ctx
                .closed_at(
                    ceiling.clone(),
                    &format!("ceiling{suffix}"),
                    Arc::new(Repeat {
                        kind: "ceiling",
                        method: Method::GET,
                        path: "/".into(),
                        body: None,
                        graphql: false,
                    }),
                    &model,
                )
                .await;
            let ceiling_rps = c.overall.rps;
            ceilings.push(ceiling_rps);
            for (i, w) in paths.iter().enumerate() {
                let label = format!("{}{suffix}", TARGETS[i].0);
                let writes = match (&writes_coop, TARGETS[i].0) {
                    (Some(coop), kind) if kind != "rest_post" => {
                        let coop = coop.clone();
                        Some(BackgroundWrites::start(
                            ctx.target.clone(),
                            writes_rate,
                            "/hen/api",
                            move |n| json!({"name": format!("w{n}"), "coop_id": coop, "breed": "leghorn"}),
                        ))
                    }
                    _ => None,
                };
                let run = ctx.closed(&label, w.clone(), &model).await;
                if let Some(writes) = writes {
                    let (sent, failed, secs) = writes.stop().await;
                    written.push((label.clone(), sent, failed, secs));
                }
                let ratio = if ceiling_rps > 0.0 {
                    run.overall.rps / ceiling_rps
                } else {
                    0.0
                };
                ratios[i].push(ratio);
                saturations[i].push(run.overall.rps);
                if let Some(last) = ctx.runs.last_mut() {
                    last.metrics.insert("of_ceiling".into(), ratio);
                }
            }
        }
        ctx.note(format!(
            "ceiling: {:.0} req/s (median of {rounds} round(s)); same tool, same users, same run",
            median(ceilings)
        ));
        for (label, sent, failed, secs) in &written {
            ctx.note(format!(
                "{label}: {sent} hens written meanwhile ({:.0}/s asked, {:.0}/s sent), {failed} failed",
                writes_rate,
                *sent as f64 / secs.max(1e-9)
            ));
            ensure(*failed == 0, || {
                format!("{failed} background writes failed during {label}")
            })?;
        }
        for (i, (kind, target)) in TARGETS.iter().enumerate() {
            let r = median(ratios[i].clone());
            ctx.note(format!(
                "{kind}: {r:.3} of ceiling (target ≥ {target}) {}",
                if r >= *target { "met" } else { "NOT met" }
            ));
        }
        let secs = ctx.opts.curve_secs;
        if secs.is_finite() && secs > 0.0 {
            for (i, w) in paths.iter().enumerate() {
                let kind = TARGETS[i].0;
                let saturation = median(saturations[i].clone());
                let mut points = Vec::new();
                for (fraction, rate) in curve_rates(saturation) {
                    let label = format!("{kind} at {:.0}%", fraction * 100.0);
                    let model = curve_model(rate, secs, ctx.opts.vus);
                    let run = ctx.open_unlisted(&label, w.clone(), &model).await;
                    points.push(curve_point(kind, fraction, &run));
                }
                ctx.add_curve(Curve {
                    kind: kind.to_string(),
                    saturation_rps: saturation,
                    points,
                });
            }
            ctx.note(format!(
                "latency vs load: open model at {} % of each path's saturation above, {secs} s per rate, latency from each request's due time",
                CURVE_FRACTIONS.map(|f| format!("{:.0}", f * 100.0)).join(", ")
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_byte_search() {
        assert_eq!(median(vec![]), 0.0);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(contains(br#"{"errors":[]}"#, b"\"errors\""));
        assert!(!contains(br#"{"data":{}}"#, b"\"errors\""));
    }

    #[test]
    fn curve_rates_are_fractions_of_the_measured_saturation() {
        let rates = curve_rates(80_123.0);
        let offered: Vec<f64> = rates.iter().map(|r| r.1).collect();
        assert_eq!(offered, [8_012.0, 20_031.0, 40_062.0, 60_092.0, 72_111.0]);
        let fractions: Vec<f64> = rates.iter().map(|r| r.0).collect();
        assert_eq!(fractions, CURVE_FRACTIONS);
        // a slow path still gets a point per fraction, never a rate of zero
        let slow: Vec<f64> = curve_rates(3.0).iter().map(|r| r.1).collect();
        assert_eq!(slow, [1.0, 1.0, 2.0, 2.0, 3.0]);
        // nothing measured, nothing offered
        assert!(curve_rates(0.0).is_empty());
        assert!(curve_rates(f64::NAN).is_empty());
    }

    #[test]
    fn curve_points_keep_the_saturation_runs_connections() {
        let m = curve_model(72_000.0, 2.0, 10);
        assert_eq!((m.pre_allocated, m.max_workers), (10, 720));
        assert_eq!(m.iterations(), 144_000);
        let m = curve_model(800.0, 0.5, 10);
        assert_eq!((m.pre_allocated, m.max_workers), (10, 40));
        assert_eq!(m.iterations(), 400);
        let m = curve_model(1e9, 1.0, 10);
        assert_eq!(m.max_workers, 1000);
    }
}
