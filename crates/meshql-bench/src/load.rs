//! Load models and the runners that drive virtual users through a [`Workload`].
//!
//! **Closed model** (k6 `ramping-vus`): a number of virtual users, each looping over
//! iterations back to back (plus optional think time). The number follows staged targets with
//! linear ramps between them, exactly like k6's stages: from `start_vus`, stage *i* moves
//! linearly to its target over its duration. A user above the current target finishes its
//! iteration and stops (newest first).
//!
//! **Open model** (k6 `constant-arrival-rate`): iteration *i* is due at `start + i / rate`,
//! whatever happened before. When it is due it goes to an idle worker; with none idle a new
//! worker is created up to `max_workers`; beyond that the iteration is *dropped* and counted.
//! Iterations go out on schedule however slowly the server answers, so slow answers cannot
//! thin out the load (no coordinated omission). The runner waits for due times with a
//! [`PreciseTimer`] (microseconds) rather than tokio's timer, which rounds every deadline up to
//! the next millisecond: with latency counted from the due time, that millisecond would be
//! charged to every request. It wakes at most once per [`MIN_WAKE_GAP`] (50 µs). How late
//! each iteration actually started (a late wake-up, a busy generator) is kept in a histogram
//! of its own, so the generator's own lag is visible next to the latency it is part of.

use crate::client::{Session, Target};
use crate::monitor::Live;
use crate::precise::PreciseTimer;
use crate::stats::Recorder;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One virtual user (closed model) or worker (open model).
pub struct Vu {
    pub id: usize,
    pub session: Session,
    pub rng: fastrand::Rng,
    reported: u64,
}

impl Vu {
    pub fn new(id: usize, target: Target) -> Self {
        Self {
            id,
            session: Session::new(target),
            rng: fastrand::Rng::with_seed(0x5eed ^ id as u64),
            reported: 0,
        }
    }

    fn report(&mut self, live: &Live) {
        let total = self.session.recorder.total_requests();
        live.add_requests(total - self.reported);
        self.reported = total;
    }
}

/// What one iteration of a scenario does. `due` is when the iteration was scheduled (open
/// model) or started (closed model); latency of open-model requests counts from it.
#[async_trait]
pub trait Workload: Send + Sync + 'static {
    async fn iteration(&self, vu: &mut Vu, due: Instant);
}

/// A stage of a closed-model profile: move linearly to `target` users over `duration`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Stage {
    pub duration: Duration,
    pub target: usize,
}

/// Closed model: staged virtual users with optional think time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClosedModel {
    pub name: String,
    pub start_vus: usize,
    pub stages: Vec<Stage>,
    pub think: Duration,
}

fn stage(secs: u64, target: usize) -> Stage {
    Stage {
        duration: Duration::from_secs(secs),
        target,
    }
}

impl ClosedModel {
    /// `vus` users for `duration`, no ramp.
    pub fn constant(vus: usize, duration: Duration) -> Self {
        Self {
            name: "constant".into(),
            start_vus: vus,
            stages: vec![Stage {
                duration,
                target: vus,
            }],
            think: Duration::ZERO,
        }
    }

    /// MeshQL's k6 `smoke` profile: 1 user for 10 s.
    pub fn smoke() -> Self {
        Self {
            name: "smoke".into(),
            ..Self::constant(1, Duration::from_secs(10))
        }
    }

    /// MeshQL's k6 `load` profile: ramp to 5 users, then 10, then down to 0 over 55 s.
    pub fn load() -> Self {
        Self {
            name: "load".into(),
            start_vus: 0,
            stages: vec![stage(10, 5), stage(30, 10), stage(15, 0)],
            think: Duration::ZERO,
        }
    }

    /// MeshQL's k6 `stress` profile: 10 → 30 → 50 users, then down to 0 over 90 s.
    pub fn stress() -> Self {
        Self {
            name: "stress".into(),
            start_vus: 0,
            stages: vec![stage(20, 10), stage(20, 30), stage(30, 50), stage(20, 0)],
            think: Duration::ZERO,
        }
    }

    pub fn by_name(name: &str) -> Option<Self> {
        match name {
            "smoke" => Some(Self::smoke()),
            "load" => Some(Self::load()),
            "stress" => Some(Self::stress()),
            _ => None,
        }
    }

    pub fn total(&self) -> Duration {
        self.stages.iter().map(|s| s.duration).sum()
    }

    pub fn max_vus(&self) -> usize {
        self.stages
            .iter()
            .map(|s| s.target)
            .chain([self.start_vus])
            .max()
            .unwrap_or(0)
    }

    /// How many users should be running `t` after the start (linear within a stage, rounded
    /// to the nearest user; 0 after the last stage).
    pub fn vus_at(&self, t: Duration) -> usize {
        let mut from = self.start_vus as f64;
        let mut begin = Duration::ZERO;
        for s in &self.stages {
            let end = begin + s.duration;
            if t < end {
                let frac = if s.duration.is_zero() {
                    1.0
                } else {
                    (t - begin).as_secs_f64() / s.duration.as_secs_f64()
                };
                return (from + (s.target as f64 - from) * frac).round() as usize;
            }
            from = s.target as f64;
            begin = end;
        }
        0
    }

    /// `5→10→0 over 55s` style description.
    pub fn describe(&self) -> String {
        let mut points = vec![];
        if self.start_vus != self.stages.first().map_or(0, |s| s.target) && self.start_vus != 0 {
            points.push(self.start_vus.to_string());
        }
        for s in &self.stages {
            if points.last() != Some(&s.target.to_string()) {
                points.push(s.target.to_string());
            }
        }
        let think = if self.think.is_zero() {
            String::new()
        } else {
            format!(", think {} ms", self.think.as_millis())
        };
        format!(
            "{}: {} users over {}s{think}",
            self.name,
            points.join("→"),
            self.total().as_secs()
        )
    }
}

/// Open model: a constant arrival rate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpenModel {
    /// Iterations per second.
    pub rate: f64,
    pub duration: Duration,
    /// Workers created (and connected) before the first iteration.
    pub pre_allocated: usize,
    /// Most workers ever in flight; an iteration due when all are busy is dropped.
    pub max_workers: usize,
}

impl OpenModel {
    /// Number of iterations the run schedules: one at t = 0 and then every 1/rate while
    /// t < duration.
    pub fn iterations(&self) -> u64 {
        (self.rate * self.duration.as_secs_f64()).ceil() as u64
    }

    /// When iteration `i` is due, relative to the start.
    pub fn due(&self, i: u64) -> Duration {
        Duration::from_secs_f64(i as f64 / self.rate)
    }

    pub fn describe(&self) -> String {
        format!(
            "{} iterations/s for {}s (workers {}..{})",
            self.rate,
            self.duration.as_secs_f64(),
            self.pre_allocated,
            self.max_workers
        )
    }
}

/// The result of one run of a load model.
pub struct RunOutcome {
    pub recorder: Recorder,
    /// Open model: how late iterations started after they were due, in microseconds.
    pub schedule_lag: hdrhistogram::Histogram<u64>,
    pub elapsed: Duration,
    pub iterations: u64,
    pub dropped: u64,
    pub peak_vus: usize,
}

const LAG_MAX_MICROS: u64 = 60_000_000;

fn lag_histogram() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(1, LAG_MAX_MICROS, 3).expect("static bounds")
}

/// Runs `workload` under a closed model.
pub async fn run_closed(
    target: &Target,
    workload: Arc<dyn Workload>,
    model: &ClosedModel,
    live: Arc<Live>,
) -> RunOutcome {
    let start = Instant::now();
    let end = start + model.total();
    let mut handles = Vec::new();
    // stop flags of the running users, oldest first
    let mut running: Vec<Arc<AtomicBool>> = Vec::new();
    let mut peak = 0;
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        let want = model.vus_at(now - start);
        while running.len() < want {
            let stop = Arc::new(AtomicBool::new(false));
            let mut vu = Vu::new(handles.len(), target.clone());
            let (workload, live, flag, think) =
                (workload.clone(), live.clone(), stop.clone(), model.think);
            live.vus.fetch_add(1, Ordering::Relaxed);
            handles.push(tokio::spawn(async move {
                let mut iterations = 0u64;
                while !flag.load(Ordering::Relaxed) && Instant::now() < end {
                    workload.iteration(&mut vu, Instant::now()).await;
                    iterations += 1;
                    vu.report(&live);
                    live.iterations.fetch_add(1, Ordering::Relaxed);
                    if !think.is_zero() {
                        tokio::time::sleep(think).await;
                    }
                }
                live.vus.fetch_sub(1, Ordering::Relaxed);
                (vu.session.recorder, iterations)
            }));
            running.push(stop);
        }
        while running.len() > want {
            if let Some(stop) = running.pop() {
                stop.store(true, Ordering::Relaxed);
            }
        }
        peak = peak.max(running.len());
        tokio::time::sleep((end - now).min(Duration::from_millis(20))).await;
    }
    for stop in &running {
        stop.store(true, Ordering::Relaxed);
    }
    let mut recorder = Recorder::default();
    let mut iterations = 0;
    for h in handles {
        if let Ok((r, n)) = h.await {
            recorder.merge(&r);
            iterations += n;
        }
    }
    RunOutcome {
        recorder,
        schedule_lag: lag_histogram(),
        elapsed: start.elapsed(),
        iterations,
        dropped: 0,
        peak_vus: peak,
    }
}

/// The open model's generator wakes at most once per this for the iterations falling due: at
/// rates above 20,000/s iterations are sent up to this late, in small groups, and the lag
/// shows it (`schedule_lag`).
pub const MIN_WAKE_GAP: Duration = Duration::from_micros(50);

/// Runs `workload` under an open model.
pub async fn run_open(
    target: &Target,
    workload: Arc<dyn Workload>,
    model: &OpenModel,
    live: Arc<Live>,
) -> RunOutcome {
    let idle: Arc<Mutex<Vec<Vu>>> = Arc::new(Mutex::new(Vec::new()));
    let lag = Arc::new(Mutex::new(lag_histogram()));
    let max = model.max_workers.max(1);
    let mut created = 0;
    for _ in 0..model.pre_allocated.min(max) {
        let mut vu = Vu::new(created, target.clone());
        vu.session.warm().await;
        idle.lock().expect("idle lock").push(vu);
        created += 1;
    }
    let mut tasks = tokio::task::JoinSet::new();
    let mut dropped = 0;
    let mut peak = 0;
    let n = model.iterations();
    let start = Instant::now();
    let timer = PreciseTimer::new();
    let mut woke = start;
    for i in 0..n {
        let due = start + model.due(i);
        if due > Instant::now() {
            // iterations due less than MIN_WAKE_GAP after the last wake-up wait for the next
            // one, so at high rates a wake-up sends a few together instead of waking the
            // generator (and a core) once per request
            timer.sleep_until(due.max(woke + MIN_WAKE_GAP)).await;
            woke = Instant::now();
        }
        let vu = idle.lock().expect("idle lock").pop();
        let mut vu = match vu {
            Some(vu) => vu,
            None if created < max => {
                created += 1;
                Vu::new(created - 1, target.clone())
            }
            None => {
                dropped += 1;
                live.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        let busy = created - idle.lock().expect("idle lock").len();
        peak = peak.max(busy);
        live.vus.store(busy, Ordering::Relaxed);
        let (workload, idle, live, lag) =
            (workload.clone(), idle.clone(), live.clone(), lag.clone());
        tasks.spawn(async move {
            let late = due.elapsed().as_micros() as u64;
            let _ = lag
                .lock()
                .expect("lag lock")
                .record(late.min(LAG_MAX_MICROS));
            vu.session.due_at(due);
            workload.iteration(&mut vu, due).await;
            vu.report(&live);
            live.iterations.fetch_add(1, Ordering::Relaxed);
            idle.lock().expect("idle lock").push(vu);
        });
        // reap finished tasks so the set does not grow with the run
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    let elapsed = start.elapsed();
    let mut recorder = Recorder::default();
    let workers = std::mem::take(&mut *idle.lock().expect("idle lock"));
    for vu in &workers {
        recorder.merge(&vu.session.recorder);
    }
    let schedule_lag = std::mem::replace(&mut *lag.lock().expect("lag lock"), lag_histogram());
    RunOutcome {
        recorder,
        schedule_lag,
        elapsed,
        iterations: n - dropped,
        dropped,
        peak_vus: peak,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: f64) -> Duration {
        Duration::from_secs_f64(secs)
    }

    #[test]
    fn load_profile_ramps_like_k6_stages() {
        let m = ClosedModel::load();
        assert_eq!(m.total(), s(55.0));
        assert_eq!(m.max_vus(), 10);
        assert_eq!(m.vus_at(s(0.0)), 0);
        assert_eq!(m.vus_at(s(5.0)), 3); // 2.5 rounds up
        assert_eq!(m.vus_at(s(9.99)), 5);
        assert_eq!(m.vus_at(s(10.0)), 5);
        assert_eq!(m.vus_at(s(25.0)), 8); // 5 + 5 × 15/30 = 7.5
        assert_eq!(m.vus_at(s(40.0)), 10);
        assert_eq!(m.vus_at(s(47.5)), 5);
        assert_eq!(m.vus_at(s(55.0)), 0);
        assert_eq!(m.describe(), "load: 5→10→0 users over 55s");
    }

    #[test]
    fn stress_and_smoke_profiles() {
        let m = ClosedModel::stress();
        assert_eq!(m.total(), s(90.0));
        assert_eq!(m.max_vus(), 50);
        assert_eq!(m.vus_at(s(20.0)), 10);
        assert_eq!(m.vus_at(s(40.0)), 30);
        assert_eq!(m.vus_at(s(55.0)), 40);
        assert_eq!(m.vus_at(s(70.0)), 50);
        assert_eq!(m.describe(), "stress: 10→30→50→0 users over 90s");
        let m = ClosedModel::smoke();
        assert_eq!(
            (m.vus_at(s(0.0)), m.vus_at(s(9.9)), m.vus_at(s(10.0))),
            (1, 1, 0)
        );
        assert_eq!(m.describe(), "smoke: 1 users over 10s");
        assert!(ClosedModel::by_name("soak").is_none());
    }

    #[test]
    fn arrival_schedule_is_evenly_spaced() {
        let m = OpenModel {
            rate: 300.0,
            duration: s(30.0),
            pre_allocated: 30,
            max_workers: 120,
        };
        assert_eq!(m.iterations(), 9000);
        assert_eq!(m.due(0), Duration::ZERO);
        assert_eq!(m.due(300), s(1.0));
        let gap = m.due(151) - m.due(150);
        assert!((gap.as_secs_f64() - 1.0 / 300.0).abs() < 1e-9);
        assert!(m.due(m.iterations() - 1) < m.duration);
        let odd = OpenModel {
            rate: 2.5,
            duration: s(1.0),
            ..m
        };
        assert_eq!(odd.iterations(), 3); // due at 0, 0.4, 0.8
    }
}
