//! The edge every request and response passes: CORS on every response and any `OPTIONS`
//! request answered 200 at once (CONTRACT §2.4); request bodies must be JSON (415 otherwise,
//! unless `require_json_content_type = false`), so a cross-site "simple" request (a form, or
//! `text/plain`, sent without a CORS preflight) cannot write; and every error response has a
//! JSON body, whichever layer produced it (axum's own rejections, 405s, the fallback).
//!
//! One middleware does all three, so the hot path pays for one layer.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;

#[derive(Clone)]
pub struct Cors {
    pub origin: HeaderValue,
    /// Requests with a body must declare a JSON media type.
    pub require_json: bool,
}

const METHODS: HeaderValue = HeaderValue::from_static("GET, POST, PUT, DELETE, OPTIONS");
const HEADERS: HeaderValue = HeaderValue::from_static("Content-Type, Authorization");
/// For a preflight that asks to send the consistency token (read-your-writes from a page of
/// another origin); every other response keeps the contract's list.
const HEADERS_WITH_TOKEN: HeaderValue =
    HeaderValue::from_static("Content-Type, Authorization, X-Meshql-Consistency");

/// Error bodies longer than this are not read back into the JSON error (the reason phrase is
/// used instead).
const MAX_ERROR_TEXT: usize = 4096;

pub async fn cors(State(cors): State<Cors>, request: Request, next: Next) -> Response {
    let asks_for_token = request.method() == Method::OPTIONS
        && request
            .headers()
            .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|h| h.to_ascii_lowercase().contains("x-meshql-consistency"));
    let response = if request.method() == Method::OPTIONS {
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::OK;
        r
    } else if let Some(refused) = cors.refusal(request.headers()) {
        refused
    } else {
        next.run(request).await
    };
    finish(&cors, response, asks_for_token).await
}

/// What every response gets on its way out: a JSON body if it is an error without one, and
/// the CORS headers (the list of allowed headers names the consistency token when a
/// preflight asked for it). Responses answered without the router get it too.
pub(crate) async fn finish(cors: &Cors, mut response: Response, asks_for_token: bool) -> Response {
    if response.status().as_u16() >= 400 && !is_json(response.headers()) {
        response = json_error(response).await;
    }
    let h = response.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, cors.origin.clone());
    h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, METHODS);
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        if asks_for_token {
            HEADERS_WITH_TOKEN
        } else {
            HEADERS
        },
    );
    response
}

/// `application/json`, any `application/<x>+json`, or `application/x-ndjson` (JSON lines:
/// what `POST /_meshql/import` takes), with or without parameters. None of them is a type a
/// cross-site form may send without a preflight.
fn is_json_media_type(value: &str) -> bool {
    let essence = value.split(';').next().unwrap_or("").trim();
    let Some((kind, subtype)) = essence.split_once('/') else {
        return false;
    };
    kind.eq_ignore_ascii_case("application")
        && (subtype.eq_ignore_ascii_case("json")
            || subtype.eq_ignore_ascii_case("x-ndjson")
            || subtype.len() > 5 && subtype[subtype.len() - 5..].eq_ignore_ascii_case("+json"))
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(is_json_media_type)
}

/// Whether the request carries a body (a length above zero, or chunks).
fn has_body(headers: &HeaderMap) -> bool {
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() != "0")
}

impl Cors {
    /// Whether a request with these headers is refused: it has a body not declared JSON,
    /// and JSON is required.
    pub(crate) fn refuses(&self, headers: &HeaderMap) -> bool {
        self.require_json && has_body(headers) && !is_json(headers)
    }

    /// The 415 refusing a request with a body not declared JSON, when JSON is required.
    fn refusal(&self, headers: &HeaderMap) -> Option<Response> {
        self.refuses(headers)
            .then(|| unsupported_media_type(headers))
    }
}

/// 415 for a request whose body is not declared JSON.
fn unsupported_media_type(headers: &HeaderMap) -> Response {
    let given = headers
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let message = match given {
        Some(t) => format!("request bodies must be JSON (Content-Type: application/json), not {t}"),
        None => "request bodies must be JSON: send Content-Type: application/json".to_owned(),
    };
    let mut r = json_response(StatusCode::UNSUPPORTED_MEDIA_TYPE, &message);
    r.headers_mut()
        .insert(header::ACCEPT, HeaderValue::from_static("application/json"));
    r
}

fn json_response(status: StatusCode, message: &str) -> Response {
    let body = serde_json::json!({ "error": message }).to_string();
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// The same error with a JSON body: `{"error": <the text it had, or the reason phrase>}`;
/// other headers (`Allow` of a 405, CORS) are kept.
async fn json_error(response: Response) -> Response {
    let (mut parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, MAX_ERROR_TEXT)
        .await
        .ok()
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .filter(|t| !t.is_empty());
    let message = text.unwrap_or_else(|| {
        parts
            .status
            .canonical_reason()
            .unwrap_or("error")
            .to_owned()
    });
    let fresh = json_response(parts.status, &message);
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, fresh.into_body())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_media_types() {
        for ok in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON",
            "application/merge-patch+json",
            "application/vnd.api+json;charset=UTF-8",
        ] {
            assert!(is_json_media_type(ok), "{ok}");
        }
        for bad in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/jsonp",
            "application/+json",
            "json",
            "",
        ] {
            assert!(!is_json_media_type(bad), "{bad}");
        }
    }
}
