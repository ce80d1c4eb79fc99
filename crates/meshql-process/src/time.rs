//! Times in inputs: what a windowed aggregate or a `last` ordered by time reads.

use serde_json::Value;

/// Milliseconds since the epoch of a JSON time: an integer (milliseconds), or a string
/// `YYYY-MM-DD`, optionally followed by `T` (or a space) `HH:MM[:SS[.fraction]]` and `Z` or
/// an offset `±HH:MM` (none: UTC).
pub fn parse_time(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => parse_text(s.trim()),
        _ => None,
    }
}

fn digits(s: &str, from: usize, len: usize) -> Option<i64> {
    let part = s.get(from..from + len)?;
    if part.bytes().all(|b| b.is_ascii_digit()) {
        part.parse().ok()
    } else {
        None
    }
}

fn parse_text(s: &str) -> Option<i64> {
    let (y, m, d) = (digits(s, 0, 4)?, digits(s, 5, 2)?, digits(s, 8, 2)?);
    if s.as_bytes().get(4) != Some(&b'-') || s.as_bytes().get(7) != Some(&b'-') {
        return None;
    }
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    let mut ms = days_from_civil(y, m as u32, d as u32) * 86_400_000;
    let rest = &s[10..];
    if rest.is_empty() {
        return Some(ms);
    }
    if !matches!(rest.as_bytes()[0], b'T' | b't' | b' ') {
        return None;
    }
    let t = &rest[1..];
    let (h, min) = (digits(t, 0, 2)?, digits(t, 3, 2)?);
    if t.as_bytes().get(2) != Some(&b':') || h > 23 || min > 59 {
        return None;
    }
    ms += (h * 3600 + min * 60) * 1000;
    let mut i = 5;
    if t.as_bytes().get(i) == Some(&b':') {
        let sec = digits(t, 6, 2)?;
        if sec > 60 {
            return None;
        }
        ms += sec * 1000;
        i = 8;
        if matches!(t.as_bytes().get(i), Some(b'.') | Some(b',')) {
            let frac: String = t[i + 1..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            if frac.is_empty() {
                return None;
            }
            i += 1 + frac.len();
            let padded = format!("{:0<3}", &frac[..frac.len().min(3)]);
            ms += padded.parse::<i64>().ok()?;
        }
    }
    match &t[i..] {
        "" | "Z" | "z" => Some(ms),
        zone => {
            let sign = match zone.as_bytes()[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let (zh, zm) = (digits(zone, 1, 2)?, digits(zone, 4, 2)?);
            if zone.len() != 6 || zone.as_bytes()[3] != b':' {
                return None;
            }
            Some(ms - sign * (zh * 3600 + zm * 60) * 1000)
        }
    }
}

/// (year, month 1..=12, day 1..=31) of a day count since 1970-01-01 (proleptic Gregorian).
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Days since 1970-01-01 of a civil date.
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = m as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_forms_inputs_use() {
        let base = 1_709_510_400_000; // 2024-03-04T00:00:00Z
        assert_eq!(parse_time(&json!("2024-03-04")), Some(base));
        assert_eq!(
            parse_time(&json!("2024-03-04T01:02:03Z")),
            Some(base + 3_723_000)
        );
        assert_eq!(
            parse_time(&json!("2024-03-04T01:02:03.5Z")),
            Some(base + 3_723_500)
        );
        assert_eq!(
            parse_time(&json!("2024-03-04T01:02:03.123456Z")),
            Some(base + 3_723_123)
        );
        assert_eq!(
            parse_time(&json!("2024-03-04 01:02")),
            Some(base + 3_720_000)
        );
        assert_eq!(parse_time(&json!("2024-03-04T02:00:00+02:00")), Some(base));
        assert_eq!(parse_time(&json!("2024-03-03T22:00:00-02:00")), Some(base));
        assert_eq!(parse_time(&json!(base)), Some(base));
        for bad in [
            "yesterday",
            "2024-13-01",
            "2024-03-04T25:00",
            "2024-03-04X",
            "2024-03-04T01:02:03+0200",
            "",
        ] {
            assert_eq!(parse_time(&json!(bad)), None, "{bad}");
        }
        assert_eq!(parse_time(&json!(true)), None);
    }
}
