//! The answers to a request over its limit, and the REST routes' gate.
//!
//! Both are 429 Too Many Requests with `Retry-After` (whole seconds, rounded up) and the
//! frontend's usual error body: REST `{"error", "code": "RATE_LIMITED", "retry_after"}`;
//! GraphQL `{"errors": [{"message", "extensions": {"code": "RATE_LIMITED", "retryAfter"}}]}`
//! (Apollo Client and urql hand a non-2xx JSON body's `errors` to the application, and
//! retry links read the status and the header).

use super::{CallerKey, Class, ClientAddr, RateLimiter, Refusal};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::Response;
use meshql_core::ErrorKind;
use std::sync::Arc;

impl Refusal {
    fn message(&self) -> String {
        format!(
            "too many requests: this caller's `{}` limit is {} per second with a burst of {}; retry in {} s",
            self.class.name(),
            trim_float(self.spec.per_second()),
            self.spec.burst,
            self.retry_after_seconds()
        )
    }
}

/// `2.5`, `100` (not `100.0`), to 3 decimals.
fn trim_float(x: f64) -> String {
    let text = format!("{x:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn too_many(refusal: &Refusal, body: String) -> Response {
    let mut r = Response::new(axum::body::Body::from(body));
    *r.status_mut() = meshql_rest::edge::status(ErrorKind::RateLimited);
    let headers = r.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(
        header::RETRY_AFTER,
        HeaderValue::from(refusal.retry_after_seconds()),
    );
    r
}

/// A REST request's 429.
pub(crate) fn rest_refusal(refusal: &Refusal) -> Response {
    let body = serde_json::json!({
        "error": refusal.message(),
        "code": ErrorKind::RateLimited.code(),
        "retry_after": refusal.retry_after_seconds(),
    });
    too_many(refusal, body.to_string())
}

/// A GraphQL request's 429.
pub(crate) fn graphql_refusal(refusal: &Refusal) -> Response {
    let body = serde_json::json!({"errors": [{
        "message": refusal.message(),
        "extensions": {
            "code": ErrorKind::RateLimited.code(),
            "retryAfter": refusal.retry_after_seconds(),
        },
    }]});
    too_many(refusal, body.to_string())
}

/// The gate in front of one restlette's routes.
#[derive(Clone)]
pub(crate) struct RestLimit {
    pub(crate) limiter: Arc<RateLimiter>,
    /// `P/health` and `P/ready`: probes are never limited.
    pub(crate) probes: [Arc<str>; 2],
}

impl RestLimit {
    pub(crate) fn new(limiter: Arc<RateLimiter>, rest_path: &str) -> RestLimit {
        RestLimit {
            limiter,
            probes: [
                Arc::from(format!("{rest_path}/health")),
                Arc::from(format!("{rest_path}/ready")),
            ],
        }
    }

    /// The class of a REST request, when it counts.
    fn class_of(&self, method: &Method, path: &str) -> Option<Class> {
        let class = match *method {
            Method::GET | Method::HEAD => Class::Reads,
            Method::POST | Method::PUT | Method::DELETE | Method::PATCH => Class::Writes,
            _ => return None,
        };
        if !self.limiter.limits(class) || self.probes.iter().any(|p| **p == *path) {
            return None;
        }
        Some(class)
    }

    /// Admits a read by id (the server's direct path; a refusal is answered with
    /// [`rest_refusal`]).
    pub(crate) async fn admit_read(&self, caller: &CallerKey) -> Result<(), Refusal> {
        self.limiter.admit(Class::Reads, caller, 1).await
    }
}

/// Middleware of a restlette's routes: one token of the request's class, or 429.
pub(crate) async fn limit_rest(
    State(gate): State<RestLimit>,
    request: Request,
    next: Next,
) -> Response {
    let Some(class) = gate.class_of(request.method(), request.uri().path()) else {
        return next.run(request).await;
    };
    let caller = caller_of(&gate.limiter, &request);
    match gate.limiter.admit(class, &caller, 1).await {
        Ok(()) => next.run(request).await,
        Err(refusal) => rest_refusal(&refusal),
    }
}

/// The caller of a request (its `Authorization`, its connection's address).
pub(crate) fn caller_of<B>(limiter: &RateLimiter, request: &axum::http::Request<B>) -> CallerKey {
    let client = request.extensions().get::<ClientAddr>().map(|c| c.0);
    caller_from(limiter, request.headers(), client)
}

/// The caller of a request's headers and its connection's address.
pub(crate) fn caller_from(
    limiter: &RateLimiter,
    headers: &axum::http::HeaderMap,
    client: Option<std::net::IpAddr>,
) -> CallerKey {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    limiter.caller(authorization, client)
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshql_config::resolve::{BucketSpec, RateLimitSpec};
    use std::time::Duration;

    #[test]
    fn rates_print_without_trailing_zeros() {
        assert_eq!(trim_float(100.0), "100");
        assert_eq!(trim_float(2.5), "2.5");
        assert_eq!(trim_float(0.001), "0.001");
    }

    #[test]
    fn probes_and_unlimited_classes_pass_through() {
        let spec = RateLimitSpec {
            reads: Some(BucketSpec {
                interval: Duration::from_secs(1),
                burst: 1,
            }),
            writes: None,
            graphql: None,
            max_callers: 10,
            shared: None,
        };
        let limiter = Arc::new(RateLimiter::new(&spec, Arc::new(meshql_core::NoAuth), None));
        let gate = RestLimit::new(limiter, "/farm/api");
        assert_eq!(
            gate.class_of(&Method::GET, "/farm/api/x"),
            Some(Class::Reads)
        );
        assert_eq!(
            gate.class_of(&Method::HEAD, "/farm/api"),
            Some(Class::Reads)
        );
        assert_eq!(gate.class_of(&Method::GET, "/farm/api/health"), None);
        assert_eq!(gate.class_of(&Method::GET, "/farm/api/ready"), None);
        // writes are not limited by this config; OPTIONS never is
        assert_eq!(gate.class_of(&Method::POST, "/farm/api"), None);
        assert_eq!(gate.class_of(&Method::OPTIONS, "/farm/api"), None);
    }
}
