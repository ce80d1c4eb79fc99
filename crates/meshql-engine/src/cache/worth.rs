//! Whether a shared cache is worth its round trip, per operation of an entity.
//!
//! A read through a shared cache pays one round trip to it before storage, and a hit saves
//! the storage read. When an operation's reads rarely hit — uniformly random ids over a large
//! table, as in seed 004 (100,000 products: about 0 % hits) — every read pays the round trip
//! for nothing (measured: p95 1.23–1.39× the same reads without the cache).
//!
//! **Windows of consulted reads.** Each operation counts its hits over windows of [`WINDOW`]
//! reads that consulted the cache. When a window ends below the configured minimum hit rate,
//! only one read in [`SAMPLE_EVERY`] consults the cache (looks it up and, on a miss, fills it)
//! until a window ends at or above the minimum; the others go straight to storage. The sampled
//! reads keep filling and measuring, so once a hot set forms they hit and consulting resumes
//! for every read.
//!
//! **Never stale either way.** A read that skips the cache reads storage, which is current;
//! writes advance their tags whether reads consult the cache or not, so what sampled reads
//! filled is invalidated as any other answer is.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// Consulted reads per window.
pub(crate) const WINDOW: u32 = 64;
/// While an operation's hit rate is below the minimum, one read in this many consults the
/// cache (under 5 %, so a p95 is that of storage alone).
pub(crate) const SAMPLE_EVERY: u32 = 32;

/// One operation's recent hit rate and whether its reads consult the cache.
#[derive(Default)]
pub(crate) struct Worth {
    /// The current window: consulted reads in the low 32 bits, hits in the high 32.
    window: AtomicU64,
    /// The last window ended below the minimum hit rate.
    sampling: AtomicBool,
    /// Reads while sampling (which of them consult).
    tick: AtomicU32,
}

impl Worth {
    /// Whether this read consults the cache.
    pub(crate) fn consult(&self) -> bool {
        !self.sampling.load(Ordering::Relaxed)
            || self
                .tick
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(SAMPLE_EVERY)
    }

    /// A consulted read hit or missed; a window that ends with fewer than `min_hits` hits
    /// turns sampling on, one with at least as many turns it off.
    pub(crate) fn record(&self, hit: bool, min_hits: u32) {
        let add = 1 + (u64::from(hit) << 32);
        let now = self.window.fetch_add(add, Ordering::Relaxed) + add;
        if now as u32 == WINDOW {
            // only the read that completed the window gets here: it takes the window's
            // counts away, leaving those of reads recorded since
            self.window.fetch_sub(now, Ordering::Relaxed);
            let hits = (now >> 32) as u32;
            self.sampling.store(hits < min_hits, Ordering::Relaxed);
        }
    }

    #[cfg(test)]
    fn sampling(&self) -> bool {
        self.sampling.load(Ordering::Relaxed)
    }
}

/// The hits a window needs for every read to consult the cache: `min_hit_rate` of
/// [`WINDOW`], rounded up (0: always consult).
pub(crate) fn min_hits(min_hit_rate: f64) -> u32 {
    (min_hit_rate.clamp(0.0, 1.0) * f64::from(WINDOW)).ceil() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(w: &Worth, hits: u32, min: u32) {
        for i in 0..WINDOW {
            w.record(i < hits, min);
        }
    }

    #[test]
    fn every_read_consults_until_a_window_ends_below_the_minimum() {
        let w = Worth::default();
        let min = min_hits(0.1);
        assert_eq!(min, 7);
        for _ in 0..WINDOW - 1 {
            assert!(w.consult());
            w.record(false, min);
        }
        assert!(!w.sampling(), "a window still open decides nothing");
        w.record(false, min);
        assert!(w.sampling());
        let consulted = (0..SAMPLE_EVERY * 4).filter(|_| w.consult()).count();
        assert_eq!(consulted, 4, "one read in {SAMPLE_EVERY}");
    }

    #[test]
    fn sampled_reads_that_hit_turn_consulting_back_on() {
        let w = Worth::default();
        let min = min_hits(0.1);
        window(&w, 0, min);
        assert!(w.sampling());
        window(&w, min - 1, min);
        assert!(w.sampling(), "one hit short of the minimum");
        window(&w, min, min);
        assert!(!w.sampling());
        assert!((0..SAMPLE_EVERY).all(|_| w.consult()));
    }

    #[test]
    fn a_minimum_of_zero_never_samples() {
        let w = Worth::default();
        window(&w, 0, min_hits(0.0));
        assert!(!w.sampling());
        assert_eq!(min_hits(1.0), WINDOW);
        assert_eq!(min_hits(2.0), WINDOW, "clamped");
    }

    #[test]
    fn reads_recorded_from_several_threads_count_once_each() {
        let w = std::sync::Arc::new(Worth::default());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let w = w.clone();
                // 4 × 80 reads: exactly 5 windows of 64, whatever the interleaving
                std::thread::spawn(move || {
                    for _ in 0..80 {
                        w.record(t % 2 == 0, 1);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(
            w.window.load(Ordering::Relaxed) as u32,
            0,
            "every window closed"
        );
    }
}
