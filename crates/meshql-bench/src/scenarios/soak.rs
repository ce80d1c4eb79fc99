//! `soak`: a long run of the egg-economy mix at a steady, moderate rate, to see whether the
//! server's memory keeps growing. Not part of `all` (30 minutes by default); run it by name,
//! `meshql bench soak`, or shorter with `--duration SECS`.
//!
//! One iteration is one of the egg-economy suite's iterations, picked at random with equal
//! weights: `rest-crud` (REST create, read, replace, delete a farm), `graphql-queries`
//! (getById, getAll, getByZone), `federation-depth` (relationships two and three levels
//! deep, across farm, coop, hen and farm_output) and `mixed-workload` (a lay_report write and
//! reads of the farm_output and hen_productivity projections) — 3.75 requests per iteration
//! on average, against the same seeded farmyard and behind the same gates.
//!
//! **Load model: open, a fixed arrival rate** (`--soak-rate`, default 1,000 iterations/s,
//! ~3,750 requests/s; the release build on the 2-core machine serves this mix at ~4,400
//! iterations/s with 10 users, so the default is about a quarter of saturation). Memory
//! growth is only comparable between two moments of a run, or between two runs, if the
//! server did the same work in each: under a fixed arrival rate every hour of the run offers
//! the same number of requests of each kind whatever the server does. Closed users would
//! offer less as the server slows down (a leak that makes the server slower would also lower
//! the load that feeds it, and hide itself), and more after a restart or a faster change,
//! so the work per hour would move with the very thing being measured. If the server falls
//! behind the rate, the open model shows it as latency counted from each iteration's due
//! time and as dropped iterations, both in the report.
//!
//! **Memory**: the run's monitor reads the server's resident set from `/proc` once a
//! second (the per-second timeline of the report). The first 10 % of the run, at most 60 s,
//! is warm-up (allocator arenas, connection buffers, SQLite page caches and the query plan
//! cache fill then) and is left out; over the samples after it the scenario reports the
//! resident set at the start and at the end, the peak of the whole run, and the slope of a
//! least-squares line through the samples in MiB per hour, with its standard error and the
//! number of samples. They are metrics of the run (`rss_*` in report.json, printed with the
//! run in every rendering) and a note. Against `--url` nothing is sampled and only the
//! latency table is reported.

use super::egg_economy::{
    gate_depth, gate_farmyard, gate_mixed, gate_queries, gate_rest_crud, seed_farmyard,
    seed_projections, DepthLoad, MixedLoad, QueriesLoad, RestCrudLoad,
};
use super::{Ctx, Example, Scenario};
use crate::gate::GateResult;
use crate::load::{OpenModel, Vu, Workload};
use crate::monitor::Sample;
use async_trait::async_trait;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct Soak;

/// Length of a soak without `--duration`.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(30 * 60);
/// Share of the run left out of the memory figures as warm-up…
const WARMUP_FRACTION: f64 = 0.10;
/// …but never more than this.
const WARMUP_MAX: Duration = Duration::from_secs(60);

/// Warm-up of a run of `duration`: 10 % of it, at most 60 s.
pub fn warmup(duration: Duration) -> Duration {
    duration.mul_f64(WARMUP_FRACTION).min(WARMUP_MAX)
}

/// A straight line fitted by least squares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinearFit {
    /// Change of y per unit of x.
    pub slope: f64,
    pub intercept: f64,
    /// Standard error of the slope (needs three points or more).
    pub slope_stderr: Option<f64>,
}

/// Fits `y = slope · x + intercept` through `points` by ordinary least squares; `None` for
/// fewer than two points or when every x is the same.
pub fn least_squares(points: &[(f64, f64)]) -> Option<LinearFit> {
    let n = points.len();
    if n < 2 {
        return None;
    }
    let nf = n as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / nf;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / nf;
    let (mut sxx, mut sxy) = (0.0, 0.0);
    for (x, y) in points {
        sxx += (x - mean_x) * (x - mean_x);
        sxy += (x - mean_x) * (y - mean_y);
    }
    if sxx <= 0.0 || !sxx.is_finite() {
        return None;
    }
    let slope = sxy / sxx;
    let intercept = mean_y - slope * mean_x;
    let slope_stderr = (n > 2).then(|| {
        let sse: f64 = points
            .iter()
            .map(|(x, y)| {
                let r = y - (slope * x + intercept);
                r * r
            })
            .sum();
        (sse / (nf - 2.0) / sxx).sqrt()
    });
    Some(LinearFit {
        slope,
        intercept,
        slope_stderr,
    })
}

/// The server's resident set over a run, from its per-second timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct RssTrend {
    /// Seconds at the start of the run left out.
    pub warmup_s: f64,
    /// First sample after the warm-up, MiB.
    pub start_mib: f64,
    /// Last sample, MiB.
    pub end_mib: f64,
    /// Highest sample of the whole run (warm-up included), MiB.
    pub peak_mib: f64,
    /// Least-squares slope over the samples after the warm-up, MiB per hour (`None` with
    /// fewer than two such samples).
    pub slope_mib_per_hour: Option<f64>,
    pub slope_stderr_mib_per_hour: Option<f64>,
    /// Samples after the warm-up.
    pub samples: usize,
}

impl RssTrend {
    /// `None` when the timeline has no resident-set sample after the warm-up (a remote
    /// server, or a run shorter than its warm-up).
    pub fn from_timeline(timeline: &[Sample], warmup_s: f64) -> Option<Self> {
        let all: Vec<(f64, f64)> = timeline
            .iter()
            .filter_map(|s| s.rss_mib.map(|r| (s.t, r)))
            .collect();
        let measured: Vec<(f64, f64)> = all
            .iter()
            .copied()
            .filter(|(t, _)| *t >= warmup_s)
            .collect();
        let (first, last) = (measured.first()?, measured.last()?);
        let fit = least_squares(&measured);
        const HOUR: f64 = 3600.0;
        Some(Self {
            warmup_s,
            start_mib: first.1,
            end_mib: last.1,
            peak_mib: all.iter().map(|p| p.1).fold(f64::MIN, f64::max),
            slope_mib_per_hour: fit.map(|f| f.slope * HOUR),
            slope_stderr_mib_per_hour: fit.and_then(|f| f.slope_stderr).map(|e| e * HOUR),
            samples: measured.len(),
        })
    }

    /// The figures as `rss_*` metrics of a run.
    pub fn metrics(&self) -> Vec<(&'static str, f64)> {
        let mut m = vec![
            ("rss_warmup_s", self.warmup_s),
            ("rss_start_mib", self.start_mib),
            ("rss_end_mib", self.end_mib),
            ("rss_peak_mib", self.peak_mib),
            ("rss_samples", self.samples as f64),
        ];
        if let Some(s) = self.slope_mib_per_hour {
            m.push(("rss_slope_mib_per_hour", s));
        }
        if let Some(e) = self.slope_stderr_mib_per_hour {
            m.push(("rss_slope_stderr_mib_per_hour", e));
        }
        m
    }

    /// One line for the scenario's notes.
    pub fn describe(&self) -> String {
        let slope = match (self.slope_mib_per_hour, self.slope_stderr_mib_per_hour) {
            (Some(s), Some(e)) => format!("slope {s:+.2} MiB/h (± {e:.2} standard error)"),
            (Some(s), None) => format!("slope {s:+.2} MiB/h"),
            _ => "no slope (fewer than two samples)".into(),
        };
        format!(
            "server RSS after {} s of warm-up: {:.1} MiB at the start, {:.1} MiB at the end, \
             peak {:.1} MiB; {slope}, least squares over {} samples",
            self.warmup_s, self.start_mib, self.end_mib, self.peak_mib, self.samples
        )
    }
}

/// One of the egg-economy suite's iterations at random.
struct SoakLoad {
    parts: Vec<Arc<dyn Workload>>,
}

#[async_trait]
impl Workload for SoakLoad {
    async fn iteration(&self, vu: &mut Vu, due: Instant) {
        let part = &self.parts[vu.rng.usize(..self.parts.len())];
        part.iteration(vu, due).await;
    }
}

fn model(rate: f64, duration: Duration) -> OpenModel {
    let pre = ((rate / 10.0) as usize).clamp(10, 100);
    OpenModel {
        rate,
        duration,
        pre_allocated: pre,
        max_workers: pre * 4,
    }
}

#[async_trait]
impl Scenario for Soak {
    fn name(&self) -> &'static str {
        "soak"
    }
    fn description(&self) -> &'static str {
        "egg-economy mix (REST CRUD, GraphQL queries and relationships, event writes) at a fixed rate for 30 min; server RSS slope (not in `all`)"
    }
    fn example(&self) -> Example {
        Example::EggEconomy
    }
    fn in_all(&self) -> bool {
        false
    }
    async fn run(&self, ctx: &mut Ctx) -> GateResult<()> {
        let mut s = ctx.session();
        gate_rest_crud(&mut s).await?;
        let yard = seed_farmyard(&mut s, 3, 3, 5).await?;
        let projections = seed_projections(&mut s, &yard).await?;
        gate_farmyard(&mut s, &yard).await?;
        gate_queries(&mut s, &yard).await?;
        gate_depth(&mut s, &yard).await?;
        gate_mixed(&mut s, &yard, projections).await?;
        let parts: Vec<Arc<dyn Workload>> = vec![
            Arc::new(RestCrudLoad),
            Arc::new(QueriesLoad { yard: yard.clone() }),
            Arc::new(DepthLoad { yard: yard.clone() }),
            Arc::new(MixedLoad::new(&yard)),
        ];
        let duration = ctx.opts.duration.unwrap_or(DEFAULT_DURATION);
        let rate = ctx.opts.soak_rate;
        let label = format!("{rate:.0}/s for {} s", duration.as_secs());
        let warmup_s = warmup(duration).as_secs_f64();
        ctx.open(&label, Arc::new(SoakLoad { parts }), &model(rate, duration))
            .await;
        let run = ctx.runs.last_mut().expect("the run just measured");
        let trend = RssTrend::from_timeline(&run.timeline, warmup_s);
        let note = match &trend {
            Some(t) => {
                for (k, v) in t.metrics() {
                    run.metrics.insert(k.into(), v);
                }
                t.describe()
            }
            None if ctx.server.is_none() => {
                "server RSS not sampled: the bench did not start the server (--url)".into()
            }
            None => format!(
                "server RSS: no sample after the {warmup_s} s warm-up; run longer (--duration)"
            ),
        };
        ctx.note(note);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    fn timeline(points: impl IntoIterator<Item = (f64, Option<f64>)>) -> Vec<Sample> {
        points
            .into_iter()
            .map(|(t, rss)| Sample {
                t,
                rps: 100.0,
                vus: 1,
                rss_mib: rss,
            })
            .collect()
    }

    #[test]
    fn a_flat_series_has_no_slope() {
        let points: Vec<(f64, f64)> = (0..100).map(|i| (i as f64, 42.0)).collect();
        let fit = least_squares(&points).unwrap();
        assert!(close(fit.slope, 0.0, 1e-12), "{fit:?}");
        assert!(close(fit.intercept, 42.0, 1e-9), "{fit:?}");
        assert!(close(fit.slope_stderr.unwrap(), 0.0, 1e-12), "{fit:?}");
    }

    #[test]
    fn a_straight_line_gives_back_its_slope_and_intercept() {
        let points: Vec<(f64, f64)> = (0..50)
            .map(|i| {
                let x = 10.0 + i as f64 * 2.5;
                (x, 0.75 * x - 3.0)
            })
            .collect();
        let fit = least_squares(&points).unwrap();
        assert!(close(fit.slope, 0.75, 1e-12), "{fit:?}");
        assert!(close(fit.intercept, -3.0, 1e-9), "{fit:?}");
        // falling lines too
        let down: Vec<(f64, f64)> = points.iter().map(|&(x, y)| (x, -y)).collect();
        assert!(close(least_squares(&down).unwrap().slope, -0.75, 1e-12));
    }

    #[test]
    fn noise_around_a_line_averages_out_and_shows_in_the_standard_error() {
        // deterministic noise: uniform in ±2 around y = 0.01 x + 30
        let mut rng = fastrand::Rng::with_seed(11);
        let points: Vec<(f64, f64)> = (0..2000)
            .map(|i| {
                let x = i as f64;
                (x, 0.01 * x + 30.0 + (rng.f64() - 0.5) * 4.0)
            })
            .collect();
        let fit = least_squares(&points).unwrap();
        let se = fit.slope_stderr.unwrap();
        assert!(se > 0.0, "{fit:?}");
        // uniform(±2) has σ ≈ 1.15; over x = 0..2000 the slope's standard error is ~4e-5
        assert!(se < 1e-4, "{fit:?}");
        assert!(close(fit.slope, 0.01, 5.0 * se), "{fit:?}");
        // pure noise: slope within a few standard errors of zero
        let flat: Vec<(f64, f64)> = (0..2000)
            .map(|i| (i as f64, 30.0 + (rng.f64() - 0.5) * 4.0))
            .collect();
        let fit = least_squares(&flat).unwrap();
        assert!(
            fit.slope.abs() <= 5.0 * fit.slope_stderr.unwrap(),
            "{fit:?}"
        );
    }

    #[test]
    fn too_few_or_degenerate_points_give_no_fit() {
        assert!(least_squares(&[]).is_none());
        assert!(least_squares(&[(1.0, 2.0)]).is_none());
        assert!(least_squares(&[(1.0, 2.0), (1.0, 3.0)]).is_none());
        let two = least_squares(&[(0.0, 1.0), (2.0, 5.0)]).unwrap();
        assert_eq!(two.slope, 2.0);
        assert!(two.slope_stderr.is_none());
    }

    #[test]
    fn the_trend_leaves_out_the_warm_up_and_reports_mib_per_hour() {
        // warm-up: 10 s climbing from 20 to 40 MiB; then +1 MiB per minute from 40 MiB
        let tl = timeline((1..=70).map(|i| {
            let t = i as f64;
            let rss = if t < 10.0 {
                20.0 + 2.0 * t
            } else {
                40.0 + (t - 10.0) / 60.0
            };
            (t, Some(rss))
        }));
        let trend = RssTrend::from_timeline(&tl, 10.0).unwrap();
        assert_eq!(trend.samples, 61);
        assert!(close(trend.start_mib, 40.0, 1e-9), "{trend:?}");
        assert!(close(trend.end_mib, 41.0, 1e-9), "{trend:?}");
        assert!(close(trend.peak_mib, 41.0, 1e-9), "{trend:?}");
        assert!(
            close(trend.slope_mib_per_hour.unwrap(), 60.0, 1e-6),
            "{trend:?}"
        );
        let metrics: Vec<&str> = trend.metrics().iter().map(|m| m.0).collect();
        for key in [
            "rss_start_mib",
            "rss_end_mib",
            "rss_peak_mib",
            "rss_slope_mib_per_hour",
            "rss_slope_stderr_mib_per_hour",
            "rss_samples",
            "rss_warmup_s",
        ] {
            assert!(metrics.contains(&key), "{key}: {metrics:?}");
        }
        assert!(
            trend.describe().contains("+60.00 MiB/h"),
            "{}",
            trend.describe()
        );
    }

    #[test]
    fn the_peak_includes_the_warm_up_and_missing_samples_are_skipped() {
        let tl = timeline([
            (1.0, Some(90.0)),
            (2.0, Some(30.0)),
            (3.0, None),
            (4.0, Some(31.0)),
            (5.0, Some(30.0)),
        ]);
        let trend = RssTrend::from_timeline(&tl, 2.0).unwrap();
        assert_eq!(trend.samples, 3);
        assert_eq!(trend.peak_mib, 90.0);
        assert_eq!(trend.start_mib, 30.0);
        assert_eq!(trend.end_mib, 30.0);
    }

    #[test]
    fn no_memory_samples_no_trend() {
        let remote = timeline((1..=10).map(|i| (i as f64, None)));
        assert!(RssTrend::from_timeline(&remote, 1.0).is_none());
        let short = timeline([(1.0, Some(30.0))]);
        assert!(RssTrend::from_timeline(&short, 60.0).is_none());
        let one = RssTrend::from_timeline(&short, 0.5).unwrap();
        assert!(one.slope_mib_per_hour.is_none());
        assert!(one.describe().contains("no slope"));
    }

    #[test]
    fn warm_up_is_a_tenth_of_the_run_up_to_a_minute() {
        assert_eq!(warmup(Duration::from_secs(5)), Duration::from_millis(500));
        assert_eq!(warmup(Duration::from_secs(120)), Duration::from_secs(12));
        assert_eq!(warmup(DEFAULT_DURATION), Duration::from_secs(60));
    }
}
