//! CORS on every response; any `OPTIONS` request is answered 200 at once (CONTRACT §2.4).

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;

#[derive(Clone)]
pub struct Cors {
    pub origin: HeaderValue,
}

const METHODS: HeaderValue = HeaderValue::from_static("GET, POST, PUT, DELETE, OPTIONS");
const HEADERS: HeaderValue = HeaderValue::from_static("Content-Type, Authorization");

pub async fn cors(State(cors): State<Cors>, request: Request, next: Next) -> Response {
    let mut response = if request.method() == Method::OPTIONS {
        let mut r = Response::new(axum::body::Body::empty());
        *r.status_mut() = StatusCode::OK;
        r
    } else {
        next.run(request).await
    };
    let h = response.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, cors.origin.clone());
    h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, METHODS);
    h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, HEADERS);
    response
}
