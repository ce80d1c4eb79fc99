//! Request latency per route, method and status, for `/metrics` as Prometheus histograms
//! (`meshql_http_request_duration_seconds`).
//!
//! A route is the pattern it matched (`/farm/api/{id}`, never the id itself), so the series
//! stay few whatever the traffic. Each request costs one read-locked map lookup by the
//! pattern, a scan of that route's few (method, status) series and two relaxed atomic
//! additions; the time is taken from the request's arrival at the router to
//! its response head (a streamed body, such as a long REST list or an SSE stream, is not
//! included).

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::fmt::Write;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tracing::Instrument;

/// Upper bounds of the buckets, in microseconds (100 µs … 10 s), then +Inf.
const BOUNDS_MICROS: [u64; 16] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

#[derive(Default)]
struct Series {
    /// Requests per bucket (not cumulative; the last one is +Inf).
    buckets: [AtomicU64; BOUNDS_MICROS.len() + 1],
    sum_micros: AtomicU64,
}

impl Series {
    fn record(&self, micros: u64) {
        let bucket = BOUNDS_MICROS.partition_point(|&bound| bound < micros);
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }
}

/// The series of one route: one per method and status seen (a handful).
type RouteSeries = Vec<(Method, u16, Arc<Series>)>;

/// Latency histograms of every route answered so far.
#[derive(Default)]
pub struct RequestMetrics {
    routes: RwLock<HashMap<Arc<str>, RouteSeries>>,
}

impl RequestMetrics {
    pub fn record(&self, route: &str, method: &Method, status: u16, micros: u64) {
        let found = self.routes.read().get(route).and_then(|series| {
            series
                .iter()
                .find(|(m, s, _)| m == method && *s == status)
                .map(|(_, _, series)| series.clone())
        });
        let series = match found {
            Some(series) => series,
            None => {
                let mut routes = self.routes.write();
                let list = routes.entry(Arc::from(route)).or_default();
                match list.iter().find(|(m, s, _)| m == method && *s == status) {
                    Some((_, _, series)) => series.clone(),
                    None => {
                        let series = Arc::new(Series::default());
                        list.push((method.clone(), status, series.clone()));
                        series
                    }
                }
            }
        };
        series.record(micros);
    }

    /// Appends the histograms in Prometheus text format.
    pub fn write(&self, out: &mut String) {
        let name = "meshql_http_request_duration_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Time from a request's arrival to its response head, by route pattern, method and status.\n# TYPE {name} histogram"
        );
        let routes = self.routes.read();
        let mut all: Vec<(&str, &Method, u16, &Series)> = routes
            .iter()
            .flat_map(|(route, list)| {
                list.iter().map(move |(method, status, series)| {
                    (route.as_ref(), method, *status, series.as_ref())
                })
            })
            .collect();
        all.sort_by(|a, b| (a.0, a.1.as_str(), a.2).cmp(&(b.0, b.1.as_str(), b.2)));
        for (route, method, status, series) in all {
            let labels = format!(
                "route=\"{}\",method=\"{method}\",status=\"{status}\"",
                escape(route)
            );
            let mut cumulative = 0;
            for (i, bucket) in series.buckets.iter().enumerate() {
                cumulative += bucket.load(Ordering::Relaxed);
                let le = match BOUNDS_MICROS.get(i) {
                    Some(micros) => format!("{}", *micros as f64 / 1e6),
                    None => "+Inf".to_owned(),
                };
                let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
            }
            let sum = series.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
            let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
            let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
        }
    }
}

fn escape(label: &str) -> String {
    label.replace('\\', "\\\\").replace('"', "\\\"")
}

/// The middleware: times the request and records it under the route it matched.
pub async fn measure(
    State(metrics): State<Arc<RequestMetrics>>,
    request: Request,
    next: Next,
) -> Response {
    let method = request.method().clone();
    // a clone of the matched pattern is a reference count, not a copy
    let route = request.extensions().get::<MatchedPath>().cloned();
    timed(
        &metrics,
        route.as_ref().map(|r| r.as_str()),
        &method,
        next.run(request),
    )
    .await
}

/// Runs `answer` timed, in a span naming the request, and records its time under `route`
/// (unless none matched). Responses answered without the router are timed here too.
pub(crate) async fn timed(
    metrics: &RequestMetrics,
    route: Option<&str>,
    method: &Method,
    answer: impl Future<Output = Response>,
) -> Response {
    let started = Instant::now();
    // a debug-level span: with the default `info` filter its callsite is disabled once and
    // costs a check per request; at `debug` every log line of the request carries it
    let span = tracing::debug_span!("request", method = %method, route = route.unwrap_or(""));
    let response = answer.instrument(span.clone()).await;
    let micros = started.elapsed().as_micros() as u64;
    let status = response.status().as_u16();
    span.in_scope(|| tracing::debug!(status, micros, "answered"));
    if let Some(route) = route {
        metrics.record(route, method, status, micros);
    }
    response
}

impl meshql_core::metrics::Collect for RequestMetrics {
    fn collect(&self, out: &mut String) {
        self.write(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line<'a>(out: &'a str, prefix: &str) -> &'a str {
        out.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in\n{out}"))
    }

    #[test]
    fn buckets_are_cumulative_with_sum_and_count() {
        let m = RequestMetrics::default();
        for micros in [50, 100, 101, 3_000, 20_000_000] {
            m.record("/t/api/{id}", &Method::GET, 200, micros);
        }
        m.record("/t/api/{id}", &Method::GET, 404, 10);
        m.record("/t/api", &Method::POST, 201, 10);
        let mut out = String::new();
        m.write(&mut out);
        let labels = r#"route="/t/api/{id}",method="GET",status="200""#;
        let bucket = |le: &str| {
            line(
                &out,
                &format!("meshql_http_request_duration_seconds_bucket{{{labels},le=\"{le}\"}}"),
            )
            .rsplit(' ')
            .next()
            .unwrap()
            .to_owned()
        };
        // 50 and 100 µs are within the first bound (≤ 100 µs), 101 in the next
        assert_eq!(bucket("0.0001"), "2");
        assert_eq!(bucket("0.00025"), "3");
        assert_eq!(bucket("0.005"), "4");
        assert_eq!(bucket("10"), "4");
        assert_eq!(bucket("+Inf"), "5");
        assert!(line(
            &out,
            &format!("meshql_http_request_duration_seconds_count{{{labels}}}")
        )
        .ends_with(" 5"));
        assert!(line(
            &out,
            &format!("meshql_http_request_duration_seconds_sum{{{labels}}}")
        )
        .ends_with(" 20.003251"));
        assert!(out.contains(r#"status="404""#) && out.contains(r#"route="/t/api",method="POST""#));
    }

    #[test]
    fn quotes_in_a_route_are_escaped() {
        let m = RequestMetrics::default();
        m.record("/a\"b", &Method::GET, 200, 1);
        let mut out = String::new();
        m.write(&mut out);
        assert!(out.contains(r#"route="/a\"b""#), "{out}");
    }
}
