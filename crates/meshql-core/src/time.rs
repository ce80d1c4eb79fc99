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

/// The highest version time this process has acknowledged a write with (see
/// [`acknowledge`]).
static ACKNOWLEDGED: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

/// Records that a write stamped `stamp` was acknowledged. A backend may stamp a version a
/// few milliseconds ahead of the clock (versions of one document are at least 1 ms apart), so
/// a read "as of now" must look at least this far ahead to see everything this process has
/// answered for: see [`read_snapshot`].
pub fn acknowledge(stamp: Millis) {
    ACKNOWLEDGED.fetch_max(stamp, std::sync::atomic::Ordering::AcqRel);
}

/// The moment a request without an explicit `at` reads as of, so that all its levels see one
/// snapshot: now, or the stamp of the latest write this process acknowledged if that is
/// ahead of the clock (a client reading right after its write sees it).
pub fn read_snapshot() -> Millis {
    now_millis().max(ACKNOWLEDGED.load(std::sync::atomic::Ordering::Acquire))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_read_snapshot_covers_writes_stamped_ahead_of_the_clock() {
        let ahead = now_millis() + 60_000;
        acknowledge(ahead);
        acknowledge(ahead - 5);
        assert_eq!(read_snapshot(), ahead);
    }
}
