//! Latency and outcome statistics per request kind.
//!
//! Every virtual user records into its own [`Recorder`] (no locks on the request path); the
//! runner merges the recorders when a run ends. Latencies go into an HdrHistogram in
//! microseconds with three significant digits (values up to one minute), so percentiles are
//! exact to 0.1 % whatever the number of samples, and merging is a bucket-wise sum.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Largest latency the histograms track exactly; slower responses are clamped to it.
const MAX_MICROS: u64 = 60_000_000;

/// What one request ended as, beyond its latency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A 2xx/3xx answer without GraphQL `errors`.
    Ok,
    /// HTTP status ≥ 400, or no answer at all (connection refused/reset, timeout).
    HttpError,
    /// HTTP 200 whose GraphQL body carries a non-empty `errors` array.
    GraphqlError,
}

/// Counters and latency histogram of one request kind.
#[derive(Clone)]
pub struct KindStats {
    histogram: Histogram<u64>,
    pub http_errors: u64,
    pub graphql_errors: u64,
    pub checks_passed: u64,
    pub checks_failed: u64,
}

impl Default for KindStats {
    fn default() -> Self {
        Self {
            histogram: Histogram::new_with_bounds(1, MAX_MICROS, 3)
                .expect("static histogram bounds are valid"),
            http_errors: 0,
            graphql_errors: 0,
            checks_passed: 0,
            checks_failed: 0,
        }
    }
}

impl KindStats {
    pub fn record(&mut self, latency: Duration, outcome: Outcome) {
        let micros = (latency.as_micros() as u64).clamp(1, MAX_MICROS);
        self.histogram
            .record(micros)
            .expect("value clamped into the histogram's range");
        match outcome {
            Outcome::Ok => {}
            Outcome::HttpError => self.http_errors += 1,
            Outcome::GraphqlError => self.graphql_errors += 1,
        }
    }

    /// Reclassifies one request already recorded as [`Outcome::Ok`] as a GraphQL error (for
    /// callers that only look at the body after recording).
    pub fn graphql_error(&mut self) {
        self.graphql_errors += 1;
    }

    pub fn check(&mut self, passed: bool) {
        if passed {
            self.checks_passed += 1;
        } else {
            self.checks_failed += 1;
        }
    }

    pub fn count(&self) -> u64 {
        self.histogram.len()
    }

    pub fn merge(&mut self, other: &KindStats) {
        self.histogram
            .add(&other.histogram)
            .expect("histograms share bounds");
        self.http_errors += other.http_errors;
        self.graphql_errors += other.graphql_errors;
        self.checks_passed += other.checks_passed;
        self.checks_failed += other.checks_failed;
    }

    /// The summary line of this kind over a measured window of `elapsed`.
    pub fn summarise(&self, kind: &str, elapsed: Duration) -> KindSummary {
        let h = &self.histogram;
        let count = h.len();
        let ms = |micros: u64| micros as f64 / 1000.0;
        let (avg, min, med, p90, p95, p99, p999, max) = if count == 0 {
            (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        } else {
            (
                h.mean() / 1000.0,
                ms(h.min()),
                ms(h.value_at_quantile(0.50)),
                ms(h.value_at_quantile(0.90)),
                ms(h.value_at_quantile(0.95)),
                ms(h.value_at_quantile(0.99)),
                ms(h.value_at_quantile(0.999)),
                ms(h.max()),
            )
        };
        let failed = self.http_errors + self.graphql_errors;
        KindSummary {
            kind: kind.to_string(),
            count,
            rps: if elapsed.is_zero() {
                0.0
            } else {
                count as f64 / elapsed.as_secs_f64()
            },
            avg_ms: avg,
            min_ms: min,
            med_ms: med,
            p90_ms: p90,
            p95_ms: p95,
            p99_ms: p99,
            p999_ms: p999,
            max_ms: max,
            http_errors: self.http_errors,
            graphql_errors: self.graphql_errors,
            error_rate: if count == 0 {
                0.0
            } else {
                failed as f64 / count as f64
            },
            checks_passed: self.checks_passed,
            checks_failed: self.checks_failed,
        }
    }
}

/// The recorders of one virtual user: one [`KindStats`] per request kind, in first-seen order.
#[derive(Clone, Default)]
pub struct Recorder {
    kinds: Vec<(&'static str, KindStats)>,
}

impl Recorder {
    /// The statistics of `kind`, created on first use. Kinds are few (≤ a dozen), so a linear
    /// scan over pointer-equal static strings beats hashing.
    pub fn kind(&mut self, kind: &'static str) -> &mut KindStats {
        let at = match self.kinds.iter().position(|(k, _)| *k == kind) {
            Some(i) => i,
            None => {
                self.kinds.push((kind, KindStats::default()));
                self.kinds.len() - 1
            }
        };
        &mut self.kinds[at].1
    }

    pub fn merge(&mut self, other: &Recorder) {
        for (kind, stats) in &other.kinds {
            self.kind(kind).merge(stats);
        }
    }

    pub fn total_requests(&self) -> u64 {
        self.kinds.iter().map(|(_, s)| s.count()).sum()
    }

    /// One summary per kind (in first-seen order) and one over every request.
    pub fn summarise(&self, elapsed: Duration) -> (Vec<KindSummary>, KindSummary) {
        let mut all = KindStats::default();
        let kinds = self
            .kinds
            .iter()
            .map(|(k, s)| {
                all.merge(s);
                s.summarise(k, elapsed)
            })
            .collect();
        (kinds, all.summarise("overall", elapsed))
    }
}

/// What a report prints for one request kind.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct KindSummary {
    pub kind: String,
    pub count: u64,
    pub rps: f64,
    pub avg_ms: f64,
    pub min_ms: f64,
    pub med_ms: f64,
    pub p90_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    /// p99.9; absent from reports written before it existed (read back as 0).
    #[serde(default)]
    pub p999_ms: f64,
    pub max_ms: f64,
    /// Responses with HTTP status ≥ 400 and requests that got no response.
    pub http_errors: u64,
    /// HTTP 200 responses carrying GraphQL `errors`.
    pub graphql_errors: u64,
    /// (http_errors + graphql_errors) / count.
    pub error_rate: f64,
    pub checks_passed: u64,
    pub checks_failed: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn close(a: f64, b: f64) -> bool {
        // three significant digits: 0.1 % relative error at most
        (a - b).abs() <= b.abs() * 0.001 + 1e-9
    }

    #[test]
    fn percentiles_of_one_to_a_hundred_milliseconds() {
        let mut s = KindStats::default();
        for v in 1..=100 {
            s.record(ms(v), Outcome::Ok);
        }
        let sum = s.summarise("k", Duration::from_secs(10));
        assert_eq!(sum.count, 100);
        assert!(close(sum.rps, 10.0));
        assert!(close(sum.min_ms, 1.0), "{}", sum.min_ms);
        assert!(close(sum.max_ms, 100.0), "{}", sum.max_ms);
        assert!(close(sum.med_ms, 50.0), "{}", sum.med_ms);
        assert!(close(sum.p90_ms, 90.0), "{}", sum.p90_ms);
        assert!(close(sum.p95_ms, 95.0), "{}", sum.p95_ms);
        assert!(close(sum.p99_ms, 99.0), "{}", sum.p99_ms);
        assert!(close(sum.avg_ms, 50.5), "{}", sum.avg_ms);
        assert_eq!(sum.error_rate, 0.0);
    }

    #[test]
    fn a_skewed_distribution_keeps_its_tail() {
        // 990 fast requests at 200 µs and 10 slow ones at 40 ms: p99 must land on the slow
        // side's boundary, the median on the fast value, the mean in between.
        let mut s = KindStats::default();
        for _ in 0..990 {
            s.record(Duration::from_micros(200), Outcome::Ok);
        }
        for _ in 0..10 {
            s.record(ms(40), Outcome::Ok);
        }
        let sum = s.summarise("k", Duration::from_secs(1));
        assert!(close(sum.med_ms, 0.2), "{}", sum.med_ms);
        assert!(close(sum.p95_ms, 0.2), "{}", sum.p95_ms);
        assert!(close(sum.p99_ms, 0.2), "{}", sum.p99_ms);
        assert!(close(sum.max_ms, 40.0), "{}", sum.max_ms);
        assert!(close(sum.avg_ms, (990.0 * 0.2 + 10.0 * 40.0) / 1000.0));
        s.record(ms(40), Outcome::Ok);
        let sum = s.summarise("k", Duration::from_secs(1));
        assert!(sum.p99_ms > 39.0, "p99 moves to the tail: {}", sum.p99_ms);
    }

    #[test]
    fn p999_lands_on_the_thousandth_slowest() {
        // 1..=10,000 µs: p99.9 is 9,990 µs, p99 9,900 µs, max 10,000 µs
        let mut s = KindStats::default();
        for v in 1..=10_000 {
            s.record(Duration::from_micros(v), Outcome::Ok);
        }
        let sum = s.summarise("k", Duration::from_secs(1));
        assert!(close(sum.p99_ms, 9.9), "{}", sum.p99_ms);
        assert!(close(sum.p999_ms, 9.99), "{}", sum.p999_ms);
        assert!(close(sum.max_ms, 10.0), "{}", sum.max_ms);
        // 999 fast and 1 slow per thousand: p99 stays fast, p99.9 sits on the fast side's
        // boundary, one more slow one moves it to the tail
        let mut s = KindStats::default();
        for _ in 0..9_990 {
            s.record(Duration::from_micros(200), Outcome::Ok);
        }
        for _ in 0..10 {
            s.record(ms(40), Outcome::Ok);
        }
        let sum = s.summarise("k", Duration::from_secs(1));
        assert!(close(sum.p99_ms, 0.2), "{}", sum.p99_ms);
        assert!(close(sum.p999_ms, 0.2), "{}", sum.p999_ms);
        s.record(ms(40), Outcome::Ok);
        let sum = s.summarise("k", Duration::from_secs(1));
        assert!(close(sum.p99_ms, 0.2), "{}", sum.p99_ms);
        assert!(
            sum.p999_ms > 39.0,
            "p99.9 moves to the tail: {}",
            sum.p999_ms
        );
    }

    #[test]
    fn summaries_without_p999_still_load() {
        let mut v =
            serde_json::to_value(KindStats::default().summarise("k", Duration::ZERO)).unwrap();
        v.as_object_mut().unwrap().remove("p999_ms");
        let back: KindSummary = serde_json::from_value(v).unwrap();
        assert_eq!(back.p999_ms, 0.0);
    }

    #[test]
    fn errors_are_counted_by_class_and_rate() {
        let mut s = KindStats::default();
        s.record(ms(1), Outcome::Ok);
        s.record(ms(1), Outcome::HttpError);
        s.record(ms(1), Outcome::GraphqlError);
        s.record(ms(1), Outcome::GraphqlError);
        s.check(true);
        s.check(false);
        let sum = s.summarise("k", Duration::from_secs(1));
        assert_eq!((sum.http_errors, sum.graphql_errors), (1, 2));
        assert!(close(sum.error_rate, 0.75));
        assert_eq!((sum.checks_passed, sum.checks_failed), (1, 1));
    }

    #[test]
    fn merging_recorders_equals_recording_everything_once() {
        let mut a = Recorder::default();
        let mut b = Recorder::default();
        let mut whole = Recorder::default();
        for v in 1..=50 {
            a.kind("get").record(ms(v), Outcome::Ok);
            whole.kind("get").record(ms(v), Outcome::Ok);
        }
        for v in 51..=100 {
            b.kind("get").record(ms(v), Outcome::Ok);
            whole.kind("get").record(ms(v), Outcome::Ok);
        }
        b.kind("post").record(ms(3), Outcome::HttpError);
        whole.kind("post").record(ms(3), Outcome::HttpError);
        a.merge(&b);
        let (kinds, overall) = a.summarise(Duration::from_secs(2));
        let (wkinds, woverall) = whole.summarise(Duration::from_secs(2));
        assert_eq!(kinds, wkinds);
        assert_eq!(overall, woverall);
        assert_eq!(overall.count, 101);
        assert_eq!(a.total_requests(), 101);
        assert_eq!(kinds.len(), 2);
    }

    #[test]
    fn an_empty_kind_summarises_to_zeros() {
        let sum = KindStats::default().summarise("k", Duration::ZERO);
        assert_eq!(sum.count, 0);
        assert_eq!(sum.rps, 0.0);
        assert_eq!(sum.p95_ms, 0.0);
    }

    #[test]
    fn latencies_beyond_a_minute_are_clamped_not_lost() {
        let mut s = KindStats::default();
        s.record(Duration::from_secs(120), Outcome::HttpError);
        s.record(Duration::ZERO, Outcome::Ok);
        assert_eq!(s.count(), 2);
    }
}
