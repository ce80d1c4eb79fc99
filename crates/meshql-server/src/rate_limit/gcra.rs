//! One token bucket in one atomic word: the generic cell rate algorithm (GCRA).
//!
//! A bucket of `burst` tokens refilled at one token per `interval` is kept as a single
//! instant, the *theoretical arrival time* (TAT): when the bucket would be full again. A
//! request of cost `n` at time `now` moves the TAT to `max(TAT, now) + n × interval`; it is
//! admitted if the new TAT is at most `now + burst × interval` (the bucket then held at least
//! `n` tokens), and refused otherwise, with the wait until it would fit as its retry-after.
//! That is exactly a token bucket, without a refill timer or a token count to keep in step:
//! one load and one compare-and-swap per request, no lock.
//!
//! A bucket whose TAT is in the past is full, so a bucket left alone for `burst × interval`
//! is the same as a new one: the limiter may forget it then (see [`Rule::idle`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A class's refill rate and capacity.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rule {
    /// Nanoseconds per token.
    interval: u64,
    /// `burst × interval`: how far ahead of now the TAT may be.
    tolerance: u64,
    burst: u32,
}

impl Rule {
    pub(crate) fn new(interval: Duration, burst: u32) -> Rule {
        let interval = u64::try_from(interval.as_nanos())
            .unwrap_or(u64::MAX)
            .max(1);
        let burst = burst.max(1);
        Rule {
            interval,
            tolerance: interval.saturating_mul(u64::from(burst)),
            burst,
        }
    }

    /// How long an untouched bucket takes to be full again: after that it may be dropped.
    #[cfg(test)]
    pub(crate) fn idle(&self) -> Duration {
        Duration::from_nanos(self.tolerance)
    }

    /// Takes `cost` tokens (at least 1, at most the burst) from `bucket` at `now`
    /// (nanoseconds of the limiter's clock); `Err` with the wait until they would be there.
    pub(crate) fn take(&self, bucket: &Bucket, cost: u32, now: u64) -> Result<(), Duration> {
        let increment = self
            .interval
            .saturating_mul(u64::from(cost.clamp(1, self.burst)));
        let limit = now.saturating_add(self.tolerance);
        let mut tat = bucket.tat.load(Ordering::Relaxed);
        loop {
            let next = tat.max(now).saturating_add(increment);
            if next > limit {
                return Err(Duration::from_nanos(next - limit));
            }
            match bucket
                .tat
                .compare_exchange_weak(tat, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Ok(()),
                Err(seen) => tat = seen,
            }
        }
    }
}

/// A caller's bucket in one class.
#[derive(Debug, Default)]
pub(crate) struct Bucket {
    /// When the bucket is full again, in nanoseconds of the limiter's clock (0: full).
    tat: AtomicU64,
}

impl Bucket {
    /// Whether the bucket is full again at `now` (it owes nothing: forgetting it loses
    /// nothing).
    pub(crate) fn is_full_at(&self, now: u64) -> bool {
        self.tat.load(Ordering::Relaxed) <= now
    }

    /// How far ahead of `now` its theoretical arrival time is: what it owes.
    pub(crate) fn owed_at(&self, now: u64) -> u64 {
        self.tat.load(Ordering::Relaxed).saturating_sub(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_full_bucket_admits_its_burst_then_one_per_interval() {
        // 10 per second, burst 3
        let rule = Rule::new(Duration::from_millis(100), 3);
        let bucket = Bucket::default();
        let now = 1_000 * MS;
        for _ in 0..3 {
            assert_eq!(rule.take(&bucket, 1, now), Ok(()));
        }
        assert_eq!(rule.take(&bucket, 1, now), Err(Duration::from_millis(100)));
        // 40 ms later: 60 ms to go
        assert_eq!(
            rule.take(&bucket, 1, now + 40 * MS),
            Err(Duration::from_millis(60))
        );
        assert_eq!(rule.take(&bucket, 1, now + 100 * MS), Ok(()));
        assert!(rule.take(&bucket, 1, now + 100 * MS).is_err());
        // idle for the whole refill: full again
        let later = now + 100 * MS + rule.idle().as_nanos() as u64;
        for _ in 0..3 {
            assert_eq!(rule.take(&bucket, 1, later), Ok(()));
        }
        assert!(rule.take(&bucket, 1, later).is_err());
    }

    #[test]
    fn a_cost_takes_that_many_tokens_and_at_most_the_burst() {
        let rule = Rule::new(Duration::from_millis(10), 5);
        let bucket = Bucket::default();
        let now = 50 * MS;
        assert_eq!(rule.take(&bucket, 4, now), Ok(()));
        // one token left: a cost of 2 waits for one more
        assert_eq!(rule.take(&bucket, 2, now), Err(Duration::from_millis(10)));
        assert_eq!(rule.take(&bucket, 1, now), Ok(()));
        // a cost above the burst is charged the burst: it fits a full bucket
        let fresh = Bucket::default();
        assert_eq!(rule.take(&fresh, 1_000, now), Ok(()));
        assert_eq!(rule.take(&fresh, 1, now), Err(Duration::from_millis(10)));
        // cost 0 is charged 1
        let other = Bucket::default();
        for _ in 0..5 {
            assert_eq!(rule.take(&other, 0, now), Ok(()));
        }
        assert!(rule.take(&other, 0, now).is_err());
    }

    #[test]
    fn a_refusal_takes_nothing() {
        let rule = Rule::new(Duration::from_secs(1), 2);
        let bucket = Bucket::default();
        assert!(rule.take(&bucket, 2, 0).is_ok());
        for _ in 0..100 {
            assert!(rule.take(&bucket, 1, 0).is_err());
        }
        // refused requests did not push the refill back
        assert_eq!(rule.take(&bucket, 1, 1_000 * MS), Ok(()));
    }

    #[test]
    fn concurrent_takers_share_exactly_the_burst() {
        let rule = Rule::new(Duration::from_secs(3600), 1000);
        let bucket = std::sync::Arc::new(Bucket::default());
        let admitted = std::sync::Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (bucket, admitted) = (bucket.clone(), admitted.clone());
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        if rule.take(&bucket, 1, 7).is_ok() {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(admitted.load(Ordering::Relaxed), 1000);
    }

    #[test]
    fn the_slowest_and_fastest_rules_the_config_allows() {
        // 0.001 per second with a burst of 1000000: no overflow, one token per 1000 s
        let slow = Rule::new(Duration::from_secs(1000), 1_000_000);
        let bucket = Bucket::default();
        let now = u64::MAX / 2;
        assert!(slow.take(&bucket, 1_000_000, now).is_ok());
        assert_eq!(slow.take(&bucket, 1, now), Err(Duration::from_secs(1000)));
        // 1000000 per second, burst 1
        let fast = Rule::new(Duration::from_micros(1), 1);
        let bucket = Bucket::default();
        assert!(fast.take(&bucket, 1, 0).is_ok());
        assert_eq!(fast.take(&bucket, 1, 0), Err(Duration::from_micros(1)));
        assert!(fast.take(&bucket, 1, 1_000).is_ok());
    }
}
