//! Which closed segments retention deletes.

use crate::Retention;

/// What retention needs to know about a segment.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SegmentFacts {
    pub size: u64,
    /// Newest record's timestamp (or, when unknown, the file's modification time), in ms.
    pub newest_ms: Option<i64>,
}

/// How many of the oldest segments to delete: the longest prefix of segments, never
/// including the last (active) one, such that each is deleted because the log is still over
/// `max_bytes` without it, or because its newest record is older than `max_age`.
pub(crate) fn select(segments: &[SegmentFacts], retention: &Retention, now_ms: i64) -> usize {
    if retention.max_bytes.is_none() && retention.max_age.is_none() {
        return 0;
    }
    let mut total: u64 = segments.iter().map(|s| s.size).sum();
    let cutoff = retention
        .max_age
        .map(|age| now_ms.saturating_sub(i64::try_from(age.as_millis()).unwrap_or(i64::MAX)));
    let mut count = 0;
    for s in segments.iter().take(segments.len().saturating_sub(1)) {
        let over_bytes = retention.max_bytes.is_some_and(|max| total > max);
        let expired = matches!((cutoff, s.newest_ms), (Some(c), Some(t)) if t < c);
        if !(over_bytes || expired) {
            break;
        }
        total -= s.size;
        count += 1;
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn facts(sizes: &[u64], newest: &[i64]) -> Vec<SegmentFacts> {
        sizes
            .iter()
            .zip(newest)
            .map(|(&size, &t)| SegmentFacts {
                size,
                newest_ms: Some(t),
            })
            .collect()
    }

    #[test]
    fn nothing_without_limits() {
        let s = facts(&[100, 100, 100], &[0, 0, 0]);
        assert_eq!(select(&s, &Retention::default(), 1_000_000), 0);
    }

    #[test]
    fn by_bytes_keeps_the_newest_under_the_limit_and_always_the_active() {
        let s = facts(&[100, 100, 100, 50], &[0, 0, 0, 0]);
        let r = |max| Retention {
            max_bytes: Some(max),
            max_age: None,
        };
        assert_eq!(select(&s, &r(1000), 0), 0);
        assert_eq!(select(&s, &r(350), 0), 0);
        assert_eq!(select(&s, &r(349), 0), 1);
        assert_eq!(select(&s, &r(150), 0), 2);
        assert_eq!(select(&s, &r(0), 0), 3);
        assert_eq!(select(&s[3..], &r(0), 0), 0);
        assert_eq!(select(&[], &r(0), 0), 0);
    }

    #[test]
    fn by_age_deletes_the_expired_prefix() {
        let s = facts(&[1, 1, 1, 1], &[100, 200, 280, 300]);
        let r = Retention {
            max_bytes: None,
            max_age: Some(Duration::from_millis(50)),
        };
        // cutoff 250: the first two are expired
        assert_eq!(select(&s, &r, 300), 2);
        // the third is expired but behind a kept one: segments go oldest first only
        let behind = facts(&[1, 1, 1, 1], &[100, 280, 100, 300]);
        assert_eq!(select(&behind, &r, 300), 1);
        assert_eq!(select(&s, &r, 1000), 3);
        assert_eq!(select(&s, &r, 150), 0);
        let unknown = [SegmentFacts {
            size: 1,
            newest_ms: None,
        }; 3];
        assert_eq!(select(&unknown, &r, 1000), 0);
    }
}
