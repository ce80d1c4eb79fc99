//! Time as MeshQL sees it: milliseconds since the Unix epoch.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (UTC).
pub type Millis = i64;

/// The current wall-clock time in milliseconds.
pub fn now_millis() -> Millis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as Millis)
        .unwrap_or(0)
}

/// The highest version time a service has acknowledged a write with: what a read "as of now"
/// must look at least as far ahead as. A backend may stamp a version a few milliseconds ahead
/// of the clock (versions of one document are at least 1 ms apart), so a read snapshot taken
/// from the clock alone could miss a write already answered. One is shared by the services of
/// one process (the engine records every write it acknowledges) and handed to whatever takes
/// read snapshots: it is passed explicitly, never a global, so two services in one process
/// (tests, `meshql process` beside a server) do not couple.
#[derive(Debug, Default)]
pub struct Acknowledged(std::sync::atomic::AtomicI64);

impl Acknowledged {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that a write stamped `stamp` was acknowledged.
    pub fn record(&self, stamp: Millis) {
        self.0.fetch_max(stamp, std::sync::atomic::Ordering::AcqRel);
    }

    /// The moment a read without an explicit `at` reads as of, so that all its levels see
    /// one snapshot: now, or the stamp of the latest acknowledged write if that is ahead of
    /// the clock (a client reading right after its write sees it).
    pub fn read_snapshot(&self) -> Millis {
        now_millis().max(self.0.load(std::sync::atomic::Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_read_snapshot_covers_writes_stamped_ahead_of_the_clock() {
        let clock = Acknowledged::new();
        let before = clock.read_snapshot();
        assert!(before >= now_millis() - 1000);
        let ahead = now_millis() + 60_000;
        clock.record(ahead);
        clock.record(ahead - 5);
        assert_eq!(clock.read_snapshot(), ahead);
        assert!(
            Acknowledged::new().read_snapshot() < ahead,
            "clocks are not shared"
        );
    }
}
