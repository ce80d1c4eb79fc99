//! Response bodies the routes share: a JSON response, and a JSON array of stored payloads
//! written without parsing them again.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use meshql_core::Envelope;

pub(crate) fn json_response(status: StatusCode, body: impl Into<axum::body::Body>) -> Response {
    let mut r = Response::new(body.into());
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// `[p1,p2,...]` from stored payload texts, without re-serialising them.
pub(crate) fn array_of(envelopes: &[Envelope]) -> Vec<u8> {
    let len = envelopes.iter().map(|e| e.payload.len() + 1).sum::<usize>() + 2;
    let mut out = Vec::with_capacity(len);
    out.push(b'[');
    for (i, e) in envelopes.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(e.payload.as_bytes());
    }
    out.push(b']');
    out
}
