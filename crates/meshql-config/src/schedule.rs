//! Backup schedules (cron expressions of five fields, or six with seconds first, in UTC) and
//! S3 URLs.

use chrono::{DateTime, Utc};
use croner::Cron;

/// A checked cron expression of five fields — minute, hour, day of month, month, day of
/// week — or six, with seconds first.
pub fn parse(text: &str) -> Result<Cron, String> {
    use croner::parser::{CronParser, Seconds};
    let fields = text.split_whitespace().count();
    if !(5..=6).contains(&fields) {
        return Err(format!(
            "`{text}` has {fields} fields; a schedule has five: minute hour day-of-month month \
             day-of-week (\"0 3 * * *\" is every day at 03:00 UTC), or six with seconds first"
        ));
    }
    CronParser::builder()
        .seconds(Seconds::Optional)
        .build()
        .parse(text)
        .map_err(|e| format!("`{text}` is not a cron expression: {e}"))
}

/// The first moment (ms since the epoch, UTC) strictly after `after_ms` that `cron` names.
pub fn next_after(cron: &Cron, after_ms: i64) -> Option<i64> {
    let after: DateTime<Utc> = DateTime::from_timestamp_millis(after_ms)?;
    cron.find_next_occurrence(&after, false)
        .ok()
        .map(|t| t.timestamp_millis())
}

/// `(bucket, prefix)` of `s3://bucket[/prefix]` (prefix without slashes at either end).
pub fn s3_bucket(url: &str) -> Option<(String, String)> {
    let rest = url.strip_prefix("s3://")?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let valid = (3..=63).contains(&bucket.len())
        && bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    valid.then(|| (bucket.to_owned(), prefix.trim_matches('/').to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules() {
        let daily = parse("0 3 * * *").unwrap();
        // 2026-12-07T10:00:00Z → the next day at 03:00
        let from = DateTime::parse_from_rfc3339("2026-12-07T10:00:00Z")
            .unwrap()
            .timestamp_millis();
        let next = next_after(&daily, from).unwrap();
        assert_eq!(
            DateTime::from_timestamp_millis(next).unwrap().to_rfc3339(),
            "2026-12-08T03:00:00+00:00"
        );
        assert!(parse("0 3 * *").unwrap_err().contains("five"));
        assert!(parse("61 3 * * *").is_err());
        assert!(parse("*/15 * * * *").is_ok());
        let every_two_seconds = parse("*/2 * * * * *").unwrap();
        assert_eq!(next_after(&every_two_seconds, 1_000), Some(2_000));
    }

    #[test]
    fn s3_urls() {
        assert_eq!(
            s3_bucket("s3://meshql-backups/prod/eggs/"),
            Some(("meshql-backups".into(), "prod/eggs".into()))
        );
        assert_eq!(s3_bucket("s3://bkt"), Some(("bkt".into(), "".into())));
        assert_eq!(s3_bucket("http://bkt"), None);
        assert_eq!(s3_bucket("s3://Bad_Bucket"), None);
    }
}
