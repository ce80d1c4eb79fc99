//! The `x-meshql-log-behind-ms` response header of a service with stores materialised from a
//! log (the Kafka backend): how old its answers may be, the largest of its stores' (see
//! `meshql_core::LogLag::behind_ms`). 0 while every log is reachable and applied up to the end
//! it last reported; with a broker down, reads go on from the local state and this says for
//! how long it has not been able to tell. Installed only when such a store is served; the
//! value is taken from the stores at most every [`REFRESH_MS`] and shared by the responses
//! in between.

use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use meshql_core::DynStore;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// The header's name.
pub const HEADER: &str = "x-meshql-log-behind-ms";

/// How long a value is used before it is taken again from the stores.
pub const REFRESH_MS: u64 = 10;

/// The stores, and the value last taken from them.
pub struct LogBehind {
    stores: Vec<DynStore>,
    started: Instant,
    /// `(ms since started when taken, + 1) << 32 | value (ms, saturated)`; 0: never taken.
    last: AtomicU64,
}

impl LogBehind {
    pub fn new(stores: Vec<DynStore>) -> Arc<LogBehind> {
        Arc::new(LogBehind {
            stores,
            started: Instant::now(),
            last: AtomicU64::new(0),
        })
    }

    fn value(&self) -> u64 {
        let now = self.started.elapsed().as_millis() as u64 + 1;
        let last = self.last.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last >> 32) < REFRESH_MS {
            return last & u64::from(u32::MAX);
        }
        let behind = self
            .stores
            .iter()
            .filter_map(|s| s.stats().log.map(|l| l.behind_ms))
            .max()
            .unwrap_or(0)
            .min(u64::from(u32::MAX));
        self.last.store((now << 32) | behind, Ordering::Relaxed);
        behind
    }
}

pub async fn header(State(log): State<Arc<LogBehind>>, request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    response
        .headers_mut()
        .insert(HEADER, HeaderValue::from(log.value()));
    response
}
