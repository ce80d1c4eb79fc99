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

/// Below this, an `at` is more likely seconds than milliseconds: 10^11 ms is 1973-03-03,
/// while 10^11 s is the year 5138. Reads still take such a value as milliseconds (it is a
/// valid moment); their answers carry a hint (REST's 404 body, GraphQL's `extensions`).
pub const SECONDS_LIKE_BELOW: Millis = 100_000_000_000;

/// Whether `at` (milliseconds) looks like a time in seconds since the epoch.
pub fn looks_like_seconds(at: Millis) -> bool {
    at > 0 && at < SECONDS_LIKE_BELOW
}

/// The hint a read `at` a seconds-like moment carries.
pub fn seconds_hint(at: Millis) -> String {
    format!(
        "`at` is in milliseconds since the Unix epoch: {at} is {}; if you meant seconds, use {}",
        describe_millis(at),
        at.saturating_mul(1000)
    )
}

/// `ms` as an RFC 3339 date-time in UTC (millisecond precision), or the number when it is
/// out of range.
pub fn describe_millis(ms: Millis) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_else(|| format!("{ms} ms"))
}

/// A moment that is neither milliseconds since the epoch nor an RFC 3339 date-time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is neither milliseconds since the Unix epoch (e.g. 1765117200000) nor an RFC 3339 date-time (e.g. 2025-12-07T14:20:00Z)")]
pub struct BadMoment(pub String);

/// A moment written as text: milliseconds since the Unix epoch (digits, optionally with a
/// fraction, which is dropped as GraphQL's `at` drops it) or an RFC 3339 date-time with its
/// offset (`2025-12-07T14:20:00Z`, `2025-12-07T15:20:00.250+01:00`).
pub fn parse_moment(text: &str) -> Result<Millis, BadMoment> {
    let bad = || BadMoment(text.to_owned());
    let t = text.trim();
    let (whole, fraction) = t.split_once('.').unwrap_or((t, ""));
    if !whole.is_empty()
        && whole.bytes().all(|b| b.is_ascii_digit())
        && fraction.bytes().all(|b| b.is_ascii_digit())
        && !(t.ends_with('.'))
    {
        return whole.parse::<Millis>().map_err(|_| bad());
    }
    chrono::DateTime::parse_from_rfc3339(t)
        .map(|d| d.timestamp_millis())
        .map_err(|_| bad())
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
    fn moments_are_milliseconds_or_rfc3339() {
        assert_eq!(parse_moment("1765117200000"), Ok(1_765_117_200_000));
        assert_eq!(parse_moment(" 1765117200000.9 "), Ok(1_765_117_200_000));
        assert_eq!(parse_moment("0"), Ok(0));
        assert_eq!(parse_moment("2025-12-07T14:20:00Z"), Ok(1_765_117_200_000));
        assert_eq!(
            parse_moment("2025-12-07T15:20:00.250+01:00"),
            Ok(1_765_117_200_250)
        );
        for bad in [
            "",
            "-5",
            "12abc",
            "1.",
            ".5",
            "yesterday",
            "2025-12-07",
            "1e12",
            "99999999999999999999",
        ] {
            assert_eq!(parse_moment(bad), Err(BadMoment(bad.to_owned())), "{bad}");
        }
    }

    #[test]
    fn seconds_are_told_apart_from_milliseconds() {
        assert!(looks_like_seconds(1_765_117_200));
        assert!(!looks_like_seconds(1_765_117_200_000));
        assert!(
            !looks_like_seconds(0),
            "the epoch itself is a moment, not a mistake"
        );
        let hint = seconds_hint(1_765_117_200);
        assert!(hint.contains("1970-01-21T10:18:37.200Z"), "{hint}");
        assert!(hint.contains("1765117200000"), "{hint}");
    }

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
