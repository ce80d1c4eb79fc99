//! Live counters shared by the virtual users, a progress line on the terminal, a per-second
//! timeline, and the server's resource use when it is a local process.

use serde::{Deserialize, Serialize};
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Counters the runners bump as iterations complete.
#[derive(Default)]
pub struct Live {
    pub requests: AtomicU64,
    pub iterations: AtomicU64,
    pub dropped: AtomicU64,
    pub vus: AtomicUsize,
}

impl Live {
    pub fn add_requests(&self, n: u64) {
        self.requests.fetch_add(n, Ordering::Relaxed);
    }
}

/// One second of a run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Sample {
    /// Seconds since the run started (end of the interval).
    pub t: f64,
    /// Requests completed in the interval, per second.
    pub rps: f64,
    /// Users (closed model) or busy workers (open model) at the sample.
    pub vus: usize,
    /// Server resident memory at the sample, MiB (local server only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_mib: Option<f64>,
}

/// CPU and memory of the server process over a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ServerUsage {
    /// Highest resident set size sampled during the run.
    pub peak_rss_mib: f64,
    /// Average CPU use over the run, in cores (1.0 = one core busy).
    pub cpu_cores: f64,
}

/// Reads `/proc/<pid>` of a local server.
#[derive(Clone, Copy)]
pub struct ProcProbe {
    pid: u32,
}

impl ProcProbe {
    pub fn new(pid: u32) -> Self {
        Self { pid }
    }

    /// Resident set size in MiB.
    pub fn rss_mib(&self) -> Option<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib / 1024.0)
    }

    /// User + system CPU time consumed so far.
    pub fn cpu_time(&self) -> Option<Duration> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).ok()?;
        // fields after the parenthesised command name; utime and stime are fields 14 and 15
        let rest = &stat[stat.rfind(')')? + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let utime: u64 = fields.get(11)?.parse().ok()?;
        let stime: u64 = fields.get(12)?.parse().ok()?;
        Some(Duration::from_secs_f64(
            (utime + stime) as f64 / clock_ticks(),
        ))
    }
}

fn clock_ticks() -> f64 {
    // USER_HZ is 100 on every Linux architecture this runs on; /proc reports in it.
    100.0
}

/// Samples progress and resources once per tick until stopped.
pub struct Monitor {
    stop: Option<oneshot::Sender<()>>,
    handle: tokio::task::JoinHandle<(Vec<Sample>, Option<ServerUsage>)>,
}

impl Monitor {
    /// Starts sampling `live` (and the server process, if any); prints a progress line on
    /// stderr when it is a terminal.
    pub fn start(
        label: String,
        planned: Duration,
        live: Arc<Live>,
        probe: Option<ProcProbe>,
    ) -> Self {
        let (stop, mut stopped) = oneshot::channel();
        let handle = tokio::spawn(async move {
            let tty = std::io::stderr().is_terminal();
            let start = Instant::now();
            let cpu0 = probe.and_then(|p| p.cpu_time());
            let mut samples = Vec::new();
            let mut peak_rss: f64 = probe.and_then(|p| p.rss_mib()).unwrap_or(0.0);
            let mut last_requests = live.requests.load(Ordering::Relaxed);
            let mut last_t = start;
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            let mut ticks = 0u64;
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = &mut stopped => break,
                }
                ticks += 1;
                if tty {
                    progress_line(&label, start.elapsed(), planned, &live);
                }
                if ticks & 3 == 0 {
                    let now = Instant::now();
                    let requests = live.requests.load(Ordering::Relaxed);
                    let rss = probe.and_then(|p| p.rss_mib());
                    if let Some(r) = rss {
                        peak_rss = peak_rss.max(r);
                    }
                    samples.push(Sample {
                        t: (now - start).as_secs_f64(),
                        rps: (requests - last_requests) as f64 / (now - last_t).as_secs_f64(),
                        vus: live.vus.load(Ordering::Relaxed),
                        rss_mib: rss,
                    });
                    last_requests = requests;
                    last_t = now;
                }
            }
            if tty {
                eprint!("\r\x1b[2K");
                let _ = std::io::stderr().flush();
            }
            let usage = probe.map(|p| {
                if let Some(r) = p.rss_mib() {
                    peak_rss = peak_rss.max(r);
                }
                let cpu = match (cpu0, p.cpu_time()) {
                    (Some(a), Some(b)) => (b - a).as_secs_f64() / start.elapsed().as_secs_f64(),
                    _ => 0.0,
                };
                ServerUsage {
                    peak_rss_mib: peak_rss,
                    cpu_cores: cpu,
                }
            });
            (samples, usage)
        });
        Self {
            stop: Some(stop),
            handle,
        }
    }

    pub async fn finish(mut self) -> (Vec<Sample>, Option<ServerUsage>) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.handle.await.unwrap_or_default()
    }
}

fn progress_line(label: &str, elapsed: Duration, planned: Duration, live: &Live) {
    const WIDTH: usize = 24;
    let frac = if planned.is_zero() {
        1.0
    } else {
        (elapsed.as_secs_f64() / planned.as_secs_f64()).min(1.0)
    };
    let filled = (frac * WIDTH as f64) as usize;
    let bar: String = "=".repeat(filled) + &" ".repeat(WIDTH - filled);
    let requests = live.requests.load(Ordering::Relaxed);
    let dropped = live.dropped.load(Ordering::Relaxed);
    let mut line = format!(
        "\r\x1b[2K{label} [{bar}] {:>3.0}s/{}s  users {:>3}  {requests} requests  {:.0} req/s",
        elapsed.as_secs_f64(),
        planned.as_secs(),
        live.vus.load(Ordering::Relaxed),
        requests as f64 / elapsed.as_secs_f64().max(1e-3),
    );
    if dropped > 0 {
        line.push_str(&format!("  dropped {dropped}"));
    }
    eprint!("{line}");
    let _ = std::io::stderr().flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_its_own_process() {
        let probe = ProcProbe::new(std::process::id());
        let rss = probe.rss_mib().expect("VmRSS readable");
        assert!(rss > 0.5 && rss < 10_000.0, "{rss}");
        let before = probe.cpu_time().expect("stat readable");
        let spin = Instant::now();
        let mut x = 0u64;
        while spin.elapsed() < Duration::from_millis(100) {
            x = x.wrapping_mul(31).wrapping_add(1);
        }
        std::hint::black_box(x);
        assert!(probe.cpu_time().unwrap() >= before);
        assert!(ProcProbe::new(u32::MAX).rss_mib().is_none());
    }
}
