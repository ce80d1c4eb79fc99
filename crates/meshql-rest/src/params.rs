//! Query parameters of the REST routes: each route names the ones it takes, and any other
//! is a 400 naming them (a misspelt `?lmit=1` must not silently return the whole list).
//!
//! | route | parameters |
//! |---|---|
//! | `GET P` | `limit`, `after`, `at` |
//! | `GET P/{id}` | `at` |
//! | `GET P/bulk` | `ids`, `at` |
//! | every other route | none |
//!
//! `at` reads as of a moment, as GraphQL's `at` does: milliseconds since the Unix epoch or
//! an RFC 3339 date-time ([`meshql_core::time::parse_moment`]).

use crate::error::RestError;
use meshql_core::Millis;

/// Documents in the first page of a list (a list shorter than this is one response body),
/// and in a requested page without `limit`.
pub const PAGE_ROWS: usize = 1_000;
/// The largest `limit` a client may ask for.
pub const MAX_LIMIT: usize = 10_000;
/// The longest `after` accepted (longer than any stored id).
pub const MAX_AFTER: usize = 1_024;

/// `GET P`.
pub const LIST: &[&str] = &["limit", "after", "at"];
/// `GET P/{id}`.
pub const ONE: &[&str] = &["at"];
/// `GET P/bulk`.
pub const BULK_READ: &[&str] = &["ids", "at"];
/// Writes, the OpenAPI document, Swagger UI, health and readiness.
pub const NONE: &[&str] = &[];

/// The decoded pairs of a query string (`None` or empty: no pairs).
pub fn pairs(raw: Option<&str>) -> Vec<(String, String)> {
    match raw {
        Some(q) if !q.is_empty() => form_urlencoded::parse(q.as_bytes())
            .into_owned()
            // `?` alone, or `a=1&&b=2`: empty names are not parameters
            .filter(|(name, _)| !name.is_empty())
            .collect(),
        _ => Vec::new(),
    }
}

/// Fails on the first name in `pairs` that is not one of `known`.
pub fn check_names(
    pairs: &[(String, String)],
    known: &'static [&'static str],
) -> Result<(), RestError> {
    match pairs
        .iter()
        .find(|(name, _)| !known.contains(&name.as_str()))
    {
        Some((name, _)) => Err(RestError::UnknownParameter {
            name: name.clone(),
            known,
        }),
        None => Ok(()),
    }
}

/// `pairs`, after checking that every name is one of `known`.
pub fn checked(
    raw: Option<&str>,
    known: &'static [&'static str],
) -> Result<Vec<(String, String)>, RestError> {
    let pairs = pairs(raw);
    check_names(&pairs, known)?;
    Ok(pairs)
}

/// The one value of `name` in `pairs`, if given (twice is an error).
pub fn single<'p>(
    pairs: &'p [(String, String)],
    name: &'static str,
) -> Result<Option<&'p str>, RestError> {
    let mut values = pairs
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, v)| v.as_str());
    let first = values.next();
    if values.next().is_some() {
        return Err(RestError::BadParameter(name, "given more than once".into()));
    }
    Ok(first)
}

/// `at`, if given: the moment a read is made as of.
pub fn at(pairs: &[(String, String)]) -> Result<Option<Millis>, RestError> {
    single(pairs, "at")?
        .map(|v| {
            meshql_core::time::parse_moment(&offset_plus(v))
                .map_err(|e| RestError::BadParameter("at", e.to_string()))
        })
        .transpose()
}

/// A `+` in a query string decodes to a space, so `at=…T15:20:00+01:00` typed unencoded
/// arrives as `…T15:20:00 01:00`: the space before a trailing `hh:mm` is the offset's sign.
fn offset_plus(value: &str) -> std::borrow::Cow<'_, str> {
    let b = value.as_bytes();
    let n = b.len();
    let offset = n >= 7
        && b[n - 6] == b' '
        && b[n - 3] == b':'
        && [1, 2, 4, 5].iter().all(|&i| b[n - 6 + i].is_ascii_digit());
    if offset {
        std::borrow::Cow::Owned(format!("{}+{}", &value[..n - 6], &value[n - 5..]))
    } else {
        std::borrow::Cow::Borrowed(value)
    }
}

/// The `at` of a read by id (`GET P/{id}`), checking the query string's names.
pub fn read_one(raw: Option<&str>) -> Result<Option<Millis>, RestError> {
    match raw {
        None | Some("") => Ok(None),
        raw => at(&checked(raw, ONE)?),
    }
}

/// Fails unless the query string is empty (routes that take no parameters).
pub fn none(raw: Option<&str>) -> Result<(), RestError> {
    checked(raw, NONE).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_are_refused_with_the_known_ones() {
        let e = checked(Some("lmit=1"), LIST).unwrap_err();
        assert_eq!(e.status(), http::StatusCode::BAD_REQUEST);
        assert_eq!(
            e.to_string(),
            "unknown query parameter `lmit`: did you mean `limit`? (this route takes: limit, after, at)"
        );
        let e = none(Some("x=1")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown query parameter `x` (this route takes no query parameters)"
        );
        assert!(none(None).is_ok() && none(Some("")).is_ok() && none(Some("&")).is_ok());
    }

    #[test]
    fn at_is_milliseconds_or_rfc3339_once() {
        assert_eq!(read_one(None).unwrap(), None);
        assert_eq!(
            read_one(Some("at=1765117200000")).unwrap(),
            Some(1_765_117_200_000)
        );
        assert_eq!(
            read_one(Some("at=2025-12-07T15%3A20%3A00%2B01%3A00")).unwrap(),
            Some(1_765_117_200_000)
        );
        assert_eq!(
            read_one(Some("at=2025-12-07T15:20:00+01:00")).unwrap(),
            Some(1_765_117_200_000),
            "an unencoded `+` is the offset's"
        );
        let e = read_one(Some("at=yesterday")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("invalid `at` parameter: `yesterday` is neither"),
            "{e}"
        );
        let e = read_one(Some("at=1&at=2")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid `at` parameter: given more than once"
        );
        assert!(read_one(Some("limit=1")).is_err());
    }
}
