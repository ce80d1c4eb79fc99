//! `GET P`: the current documents of an entity — all of them, streamed page by page, or one
//! page of them when the client asks with `limit` / `after`.
//!
//! What the MeshQL contract forces (CONTRACT §2.1, §2.3 item 2): a plain `GET P` answers 200 with a
//! JSON array of *every* current payload (with its `id`). MeshQL clients count it and poll it
//! until it grows, so nothing may be cut by default. What we chose:
//!
//! * **Whole list, streamed.** The list is read in keyset pages ordered by id
//!   ([`meshql_core::StoreReader::list_page`]), all read as of the time the request began (one
//!   snapshot, whatever is written while it streams), and written out as each page is read:
//!   memory per request is about two pages (the first of 1,000 documents, then about
//!   [`PAGE_BYTES`] of payload each), whatever the table holds. A list that fits in
//!   the first page ([`PAGE_ROWS`]) is answered in one piece, as before (`Content-Length`, no
//!   chunking). Once the first chunk has left, the status (200) cannot change: a storage error
//!   after that ends the body early — the client sees a truncated array, i.e. invalid JSON,
//!   never a short valid one — and is logged.
//! * **One page on request.** `?limit=N` (1..=[`MAX_LIMIT`]) and/or `?after=<id>` answer the
//!   documents whose id sorts after `after`, at most `limit` (default [`PAGE_ROWS`]), with
//!   `Link: <P?limit=N&after=<last id>>; rel="next"` (RFC 8288) when more follow. A bad value
//!   is a 400 naming the parameter, and so is any parameter the list does not take.
//! * **As of a moment.** `?at=T` (milliseconds or RFC 3339, [`crate::params`]) lists the
//!   documents as they were at `T`, whole or one page at a time (the next page's link keeps
//!   `at`, so every page is read at the same moment); without it the list is read as of the
//!   moment the request began.
//! * **Order.** Both are in id order. Server-made ids are UUIDv7, ordered by creation time, so
//!   for them this is creation order (the order before pages existed) except between
//!   documents created concurrently in the same millisecond.

use crate::error::RestError;
pub use crate::params::{MAX_AFTER, MAX_LIMIT, PAGE_ROWS};
use crate::response::{array_of, json_response};
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use futures::StreamExt;
use meshql_core::{now_millis, Envelope, Millis};
use meshql_engine::{EntityService, Session};
use std::sync::Arc;

/// Payload bytes a streamed page holds at most after the first, from the sizes seen so far:
/// pages of large documents hold fewer of them (at least [`MIN_PAGE_ROWS`]), pages of small
/// ones at most [`MAX_PAGE_ROWS`]. (Larger pages of small documents saved little on
/// MariaDB and cost more on SQLite, where a page over 1,000 rows leaves the async workers for
/// the blocking pool: 4 concurrent lists of 600,000 rows took 1.2-1.4 s with up to 3,500 rows
/// per page, 0.6-0.8 s with 1,000.)
pub const PAGE_BYTES: usize = 1 << 20;
const MIN_PAGE_ROWS: usize = 16;
const MAX_PAGE_ROWS: usize = PAGE_ROWS;

/// The list's query parameters.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ListQuery {
    pub limit: Option<usize>,
    pub after: Option<String>,
    /// The moment the list is read as of (`None`: now).
    pub at: Option<Millis>,
}

impl ListQuery {
    /// From the decoded query pairs: `limit`, `after` and `at` checked, any other name
    /// refused.
    pub fn parse(pairs: &[(String, String)]) -> Result<Self, RestError> {
        crate::params::check_names(pairs, crate::params::LIST)?;
        let limit = crate::params::single(pairs, "limit")?
            .map(|value| {
                value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| {
                        bad("limit", format!("must be an integer from 1 to {MAX_LIMIT}"))
                    })
            })
            .transpose()?;
        let after = crate::params::single(pairs, "after")?
            .map(|value| {
                if value.is_empty() || value.len() > MAX_AFTER {
                    Err(bad(
                        "after",
                        format!("must be a document id (1 to {MAX_AFTER} bytes)"),
                    ))
                } else {
                    Ok(value.to_owned())
                }
            })
            .transpose()?;
        Ok(ListQuery {
            limit,
            after,
            at: crate::params::at(pairs)?,
        })
    }

    /// Whether the client asked for one page.
    pub fn paged(&self) -> bool {
        self.limit.is_some() || self.after.is_some()
    }
}

fn bad(parameter: &'static str, message: String) -> RestError {
    RestError::BadParameter(parameter, message)
}

/// `GET P` for `session` (its read permission checked first: a 403 before anything is
/// read).
pub(crate) async fn respond(
    service: &Arc<EntityService>,
    path: &str,
    session: Session,
    query: ListQuery,
) -> Result<Response, RestError> {
    // who may read is the engine's decision, taken by the first list_page before anything
    // is answered
    if query.paged() {
        one_page(service, path, &session, query).await
    } else {
        everything(service, session, query.at).await
    }
}

async fn one_page(
    service: &EntityService,
    path: &str,
    session: &Session,
    query: ListQuery,
) -> Result<Response, RestError> {
    let limit = query.limit.unwrap_or(PAGE_ROWS);
    // one row more than asked says whether another page follows; one statement, so the page
    // is read as it is now
    let mut rows = service
        .list_page(session, query.after.as_deref(), limit + 1, query.at)
        .await?;
    let more = rows.len() > limit;
    rows.truncate(limit);
    let mut response = json_response(StatusCode::OK, array_of(&rows));
    if let (true, Some(last)) = (more, rows.last()) {
        match HeaderValue::from_str(&next_link(path, &last.id, limit, query.at)) {
            Ok(link) => {
                let h = response.headers_mut();
                h.insert(header::LINK, link);
                // a browser script may read it across origins
                h.insert(
                    header::ACCESS_CONTROL_EXPOSE_HEADERS,
                    HeaderValue::from_static("Link"),
                );
            }
            Err(_) => tracing::warn!(path, "no Link header: the path is not header text"),
        }
    }
    Ok(response)
}

/// `<path?limit=N&after=ID>; rel="next"` (and `&at=T` for a list read as of `T`), the id
/// percent-encoded.
pub fn next_link(path: &str, after: &str, limit: usize, at: Option<Millis>) -> String {
    let at = at.map_or(String::new(), |t| format!("&at={t}"));
    format!(
        "<{path}?limit={limit}&after={}{at}>; rel=\"next\"",
        percent_encode(after)
    )
}

/// Everything but RFC 3986's unreserved characters, percent-encoded.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The whole list, as of `at` (default now): one body when it fits in the first page, else
/// streamed.
async fn everything(
    service: &Arc<EntityService>,
    session: Session,
    at: Option<Millis>,
) -> Result<Response, RestError> {
    let at = at.unwrap_or_else(now_millis);
    // an error here is still an ordinary error response
    let first = service
        .list_page(&session, None, PAGE_ROWS, Some(at))
        .await?;
    if first.len() < PAGE_ROWS {
        return Ok(json_response(StatusCode::OK, array_of(&first)));
    }
    let walk = Walk {
        service: service.clone(),
        session,
        at,
        after: first.last().map(|e| e.id.clone()),
        limit: next_limit(&first),
        sent: first.len(),
    };
    let head = futures::stream::once(std::future::ready(Ok::<_, std::io::Error>(chunk(
        b'[', &first, false,
    ))));
    drop(first);
    let rest = futures::stream::unfold(Some(walk), |walk| async move {
        let mut walk = walk?;
        match walk
            .service
            .list_page(
                &walk.session,
                walk.after.as_deref(),
                walk.limit,
                Some(walk.at),
            )
            .await
        {
            Ok(rows) => {
                let last = rows.len() < walk.limit;
                let bytes = chunk(b',', &rows, last);
                if last {
                    return Some((Ok(bytes), None));
                }
                walk.sent += rows.len();
                walk.after = rows.last().map(|e| e.id.clone());
                walk.limit = next_limit(&rows);
                Some((Ok(bytes), Some(walk)))
            }
            Err(e) => {
                tracing::error!(
                    entity = walk.service.name(),
                    documents_sent = walk.sent,
                    error = %e,
                    "REST list failed while streaming: its body is cut short"
                );
                Some((Err(std::io::Error::other(e.to_string())), None))
            }
        }
    });
    let mut response = Response::new(Body::from_stream(head.chain(rest)));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

/// Where a streamed list has got to.
struct Walk {
    service: Arc<EntityService>,
    session: Session,
    /// The snapshot every page is read at.
    at: Millis,
    /// The last id sent.
    after: Option<String>,
    /// Rows to ask for next.
    limit: usize,
    /// Documents sent so far (for the log).
    sent: usize,
}

/// The payloads of `rows`, each preceded by a comma except a first one after `[`, and `]`
/// when `last`.
fn chunk(open: u8, rows: &[Envelope], last: bool) -> Bytes {
    let len = rows.iter().map(|e| e.payload.len() + 1).sum::<usize>() + 2;
    let mut out = Vec::with_capacity(len);
    for (i, e) in rows.iter().enumerate() {
        out.push(if i == 0 { open } else { b',' });
        out.extend_from_slice(e.payload.as_bytes());
    }
    if rows.is_empty() && open == b'[' {
        out.push(b'[');
    }
    if last {
        out.push(b']');
    }
    Bytes::from(out)
}

/// Rows for the next page: about [`PAGE_BYTES`] of payloads like those of `rows`.
fn next_limit(rows: &[Envelope]) -> usize {
    let bytes: usize = rows.iter().map(|e| e.payload.len()).sum();
    let average = (bytes / rows.len().max(1)).max(1);
    (PAGE_BYTES / average).clamp(MIN_PAGE_ROWS, MAX_PAGE_ROWS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(q: &[(&str, &str)]) -> Vec<(String, String)> {
        q.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn refused(q: &[(&str, &str)]) -> String {
        match ListQuery::parse(&pairs(q)) {
            Err(RestError::BadParameter(name, _)) => name.to_owned(),
            Err(RestError::UnknownParameter { name, known }) => {
                assert_eq!(known, crate::params::LIST);
                name
            }
            other => panic!("{q:?}: {other:?}"),
        }
    }

    #[test]
    fn parameters_are_checked_and_named() {
        assert_eq!(ListQuery::parse(&[]).unwrap(), ListQuery::default());
        assert_eq!(refused(&[("x", "1")]), "x", "unknown names are refused");
        assert_eq!(refused(&[("lmit", "1")]), "lmit");
        let q = ListQuery::parse(&pairs(&[("at", "2025-12-07T14:20:00Z")])).unwrap();
        assert_eq!(q.at, Some(1_765_117_200_000));
        assert!(!q.paged(), "a list as of a moment is still the whole list");
        assert_eq!(refused(&[("at", "now")]), "at");
        let q = ListQuery::parse(&pairs(&[("limit", "10000"), ("after", "a b")])).unwrap();
        assert_eq!((q.limit, q.after.as_deref()), (Some(10_000), Some("a b")));
        assert!(ListQuery::parse(&pairs(&[("after", "x")])).unwrap().paged());
        for limit in [
            "0",
            "-1",
            "10001",
            "1.5",
            "",
            "ten",
            "99999999999999999999999",
        ] {
            assert_eq!(refused(&[("limit", limit)]), "limit", "{limit:?}");
        }
        assert_eq!(refused(&[("limit", "1"), ("limit", "2")]), "limit");
        assert_eq!(refused(&[("at", "1"), ("at", "2")]), "at");
        assert_eq!(refused(&[("after", "")]), "after");
        assert_eq!(refused(&[("after", &"x".repeat(MAX_AFTER + 1))]), "after");
        assert_eq!(refused(&[("after", "a"), ("after", "b")]), "after");
    }

    #[test]
    fn the_next_link_encodes_the_id() {
        assert_eq!(
            next_link("/farm/api", "01-ab_c.d~", 5, None),
            "</farm/api?limit=5&after=01-ab_c.d~>; rel=\"next\""
        );
        assert_eq!(
            next_link("/farm/api", "a b&c=d/é", 1, None),
            "</farm/api?limit=1&after=a%20b%26c%3Dd%2F%C3%A9>; rel=\"next\""
        );
        assert_eq!(
            next_link("/farm/api", "x", 2, Some(1_765_117_200_000)),
            "</farm/api?limit=2&after=x&at=1765117200000>; rel=\"next\"",
            "every page of a list as of a moment is read at that moment"
        );
    }

    fn env(id: &str, payload: &str) -> Envelope {
        Envelope {
            id: id.into(),
            payload: payload.into(),
            created_at: 0,
            deleted: false,
            authorized_tokens: vec![],
        }
    }

    #[test]
    fn chunks_join_into_the_array() {
        let a = [env("a", r#"{"id":"a"}"#), env("b", r#"{"id":"b"}"#)];
        let c = [env("c", r#"{"id":"c"}"#)];
        let mut body = chunk(b'[', &a, false).to_vec();
        body.extend_from_slice(&chunk(b',', &c, false));
        body.extend_from_slice(&chunk(b',', &[], true));
        assert_eq!(body, br#"[{"id":"a"},{"id":"b"},{"id":"c"}]"#);
        assert_eq!(body, array_of(&[a[0].clone(), a[1].clone(), c[0].clone()]));
        assert_eq!(&chunk(b'[', &[], true)[..], b"[]");
    }

    #[test]
    fn pages_of_large_documents_hold_fewer() {
        let small = vec![env("a", &"x".repeat(300)); 10];
        assert_eq!(next_limit(&small), PAGE_ROWS);
        let tiny = vec![env("a", "{}"); 10];
        assert_eq!(next_limit(&tiny), MAX_PAGE_ROWS);
        let large = vec![env("a", &"x".repeat(64 * 1024)); 10];
        assert_eq!(next_limit(&large), MIN_PAGE_ROWS);
        let mid = vec![env("a", &"x".repeat(10 * 1024)); 10];
        assert_eq!(next_limit(&mid), 102);
        assert_eq!(next_limit(&[]), MAX_PAGE_ROWS);
    }
}
