//! One HTTP/1.1 connection: the socket wrapper that enforces the header-read and idle
//! keep-alive timeouts, the service that counts requests in progress, and the request body
//! that enforces the body-read timeout.
//!
//! The three share a [`ConnState`]. hyper runs the service future and polls the socket from
//! the connection's one task, so its counters are only ever touched from one thread at a
//! time; they are atomics because the task moves between worker threads.

use crate::direct::{Direct, DirectFuture};
use crate::rate_limit::ClientAddr;
use axum::body::Body;
use axum::http::{header, HeaderValue, Method, Request, Response, StatusCode, Uri};
use axum::Router;
use bytes::Bytes;
use futures::task::AtomicWaker;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use pin_project_lite::pin_project;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The timeouts of a connection (`[server]`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) header: Duration,
    pub(crate) idle: Duration,
    pub(crate) body: Duration,
    pub(crate) write: Duration,
}

/// Connection counters of this process, for `/metrics`.
#[derive(Default)]
pub(crate) struct Stats {
    pub(crate) open: AtomicU64,
    pub(crate) accepted: AtomicU64,
    pub(crate) max: AtomicU64,
    /// Times the accept loop waited because `max_connections` were open.
    pub(crate) accept_waits: AtomicU64,
    pub(crate) header_timeouts: AtomicU64,
    pub(crate) idle_timeouts: AtomicU64,
    pub(crate) body_timeouts: AtomicU64,
    pub(crate) write_timeouts: AtomicU64,
    /// TLS handshakes that failed (not counting those cut by the header timeout).
    pub(crate) tls_handshake_failures: AtomicU64,
}

pub(crate) static STATS: Stats = Stats {
    open: AtomicU64::new(0),
    accepted: AtomicU64::new(0),
    max: AtomicU64::new(0),
    accept_waits: AtomicU64::new(0),
    header_timeouts: AtomicU64::new(0),
    idle_timeouts: AtomicU64::new(0),
    body_timeouts: AtomicU64::new(0),
    write_timeouts: AtomicU64::new(0),
    tls_handshake_failures: AtomicU64::new(0),
};

/// Appends the connection counters to a Prometheus text exposition.
/// The connection series of `/metrics` (process-wide counters).
pub(crate) struct ConnectionMetrics;

impl meshql_core::metrics::Collect for ConnectionMetrics {
    fn collect(&self, out: &mut String) {
        write_metrics(out);
    }
}

fn write_metrics(out: &mut String) {
    use std::fmt::Write;
    let get = |c: &AtomicU64| c.load(Relaxed);
    let s = &STATS;
    for (name, kind, help, value) in [
        ("meshql_http_connections_open", "gauge", "HTTP connections open now.", get(&s.open)),
        ("meshql_http_connections_max", "gauge", "server.max_connections: connections served at once.", get(&s.max)),
        ("meshql_http_connections_accepted_total", "counter", "HTTP connections accepted.", get(&s.accepted)),
        ("meshql_http_accept_waits_total", "counter", "Times a new connection had to wait in the listen backlog because max_connections were open.", get(&s.accept_waits)),
        ("meshql_http_tls_handshake_failures_total", "counter", "TLS handshakes that failed ([server.tls]; those cut by the header timeout count as timeouts).", get(&s.tls_handshake_failures)),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
    }
    let name = "meshql_http_connections_timed_out_total";
    let _ = writeln!(
        out,
        "# HELP {name} HTTP connections closed (or requests answered 408) by a [server] timeout.\n# TYPE {name} counter"
    );
    for (reason, value) in [
        ("header", get(&s.header_timeouts)),
        ("idle", get(&s.idle_timeouts)),
        ("body", get(&s.body_timeouts)),
        ("write", get(&s.write_timeouts)),
    ] {
        let _ = writeln!(out, "{name}{{reason=\"{reason}\"}} {value}");
    }
}

/// What the socket, the service and the request bodies of one connection share.
pub(crate) struct ConnState {
    pub(crate) peer: SocketAddr,
    /// Requests whose response has not been sent to the end yet.
    pub(crate) in_flight: AtomicUsize,
    /// Requests whose response was sent (or abandoned).
    completed: AtomicU64,
    /// When the last one was, in nanoseconds of [`clock`].
    idle_since: AtomicU64,
    /// The body of the current request timed out (its answer becomes 408).
    body_timed_out: AtomicBool,
    /// The connection is being cut at the shutdown deadline: requests still in progress say
    /// so in the log.
    pub(crate) cut: AtomicBool,
    /// The server is shutting down: a read with no request in progress sees end-of-stream.
    pub(crate) closing: AtomicBool,
    /// The connection switched protocols (a WebSocket): it is no longer HTTP, so neither the
    /// header nor the idle timeout applies (the write timeout still does).
    upgraded: AtomicBool,
    /// The connection's task, woken when the server starts shutting down.
    pub(crate) waker: AtomicWaker,
}

impl ConnState {
    pub(crate) fn new(peer: SocketAddr) -> Self {
        Self {
            peer,
            in_flight: AtomicUsize::new(0),
            completed: AtomicU64::new(0),
            idle_since: AtomicU64::new(0),
            body_timed_out: AtomicBool::new(false),
            cut: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            upgraded: AtomicBool::new(false),
            waker: AtomicWaker::new(),
        }
    }
}

/// A fixed instant that [`ConnState::idle_since`] counts from.
fn base() -> Instant {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

/// Where a connection is between requests, as its socket sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// No request in progress and no byte of the next one: the keep-alive timeout runs.
    Idle,
    /// Reading a request's line and headers (or waiting for a new connection's first
    /// request): the header-read timeout runs.
    Head,
    /// A request is in progress: the handler and the body timeout are in charge.
    Busy,
}

/// The accepted socket, closing it when the client is too slow to send headers or stays idle
/// too long.
///
/// Cheap on the hot path: the clock is read only when a read has to wait, and the one timer
/// is re-armed only when a deadline comes earlier than the one armed (a later one is found
/// when the armed one fires). While a request is in progress the timer stays armed no later
/// than one keep-alive timeout ahead: hyper does not read again when the response is sent
/// (its earlier read is still registered), so the timer is what brings the idle connection
/// back here to be timed.
pub(crate) struct Watched {
    tcp: TcpStream,
    state: Arc<ConnState>,
    header_timeout: Duration,
    idle_timeout: Duration,
    write_timeout: Duration,
    phase: Phase,
    /// `state.completed` when the phase was last worked out.
    seen_completed: u64,
    /// When the current phase's wait began (for `Head`, the first read that had to wait).
    since: Option<Instant>,
    sleep: Option<Pin<Box<Sleep>>>,
    /// When the write that is waiting for the client began to wait.
    write_since: Option<Instant>,
    /// The write timer, made the first time a write has to wait.
    write_sleep: Option<Pin<Box<Sleep>>>,
}

impl Watched {
    pub(crate) fn new(tcp: TcpStream, state: Arc<ConnState>, limits: &Limits) -> Self {
        Self {
            tcp,
            state,
            header_timeout: limits.header,
            idle_timeout: limits.idle,
            write_timeout: limits.write,
            // a new connection must send its first request within the header timeout
            phase: Phase::Head,
            seen_completed: 0,
            since: None,
            sleep: None,
            write_since: None,
            write_sleep: None,
        }
    }

    /// A write has to wait for the client to read: has it waited too long?
    fn poll_write_deadline<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let deadline = *self.write_since.get_or_insert_with(Instant::now) + self.write_timeout;
        let sleep = match &mut self.write_sleep {
            Some(s) => {
                if s.deadline() != deadline {
                    s.as_mut().reset(deadline);
                }
                s
            }
            None => self
                .write_sleep
                .insert(Box::pin(tokio::time::sleep_until(deadline))),
        };
        ready!(sleep.as_mut().poll(cx));
        STATS.write_timeouts.fetch_add(1, Relaxed);
        tracing::debug!(peer = %self.state.peer, "the client read nothing of a response for {} ms: connection closed", self.write_timeout.as_millis());
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the client stopped reading",
        )))
    }

    fn sync_phase(&mut self) {
        if self.state.in_flight.load(Relaxed) > 0 || self.state.upgraded.load(Relaxed) {
            self.phase = Phase::Busy;
            return;
        }
        let completed = self.state.completed.load(Relaxed);
        if self.phase == Phase::Busy || completed != self.seen_completed {
            self.seen_completed = completed;
            self.phase = Phase::Idle;
            self.since = Some(base() + Duration::from_nanos(self.state.idle_since.load(Relaxed)));
        }
    }

    /// A read has to wait: is it past the phase's deadline?
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let deadline = match self.phase {
            Phase::Busy => {
                // a timer armed and not fired is soon enough (and holds this task's waker)
                if self.sleep.as_ref().is_some_and(|s| !s.is_elapsed()) {
                    return Poll::Pending;
                }
                // the soonest this connection can have been idle for a whole timeout
                Instant::now() + self.idle_timeout
            }
            Phase::Idle => *self.since.get_or_insert_with(Instant::now) + self.idle_timeout,
            Phase::Head => *self.since.get_or_insert_with(Instant::now) + self.header_timeout,
        };
        let sleep = match &mut self.sleep {
            Some(s) => {
                if s.deadline() > deadline {
                    s.as_mut().reset(deadline);
                }
                s
            }
            None => self
                .sleep
                .insert(Box::pin(tokio::time::sleep_until(deadline))),
        };
        loop {
            ready!(sleep.as_mut().poll(cx));
            if sleep.deadline() >= deadline && self.phase != Phase::Busy {
                break;
            }
            // an earlier deadline fired: wait for this one
            sleep.as_mut().reset(deadline);
        }
        match self.phase {
            Phase::Idle => {
                STATS.idle_timeouts.fetch_add(1, Relaxed);
                tracing::debug!(peer = %self.state.peer, "idle keep-alive connection closed after {} ms", self.idle_timeout.as_millis());
                // end of stream: hyper closes an idle connection without complaint
                Poll::Ready(Ok(()))
            }
            _ => {
                STATS.header_timeouts.fetch_add(1, Relaxed);
                tracing::debug!(peer = %self.state.peer, "no complete request headers within {} ms: connection closed", self.header_timeout.as_millis());
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "request headers not received in time",
                )))
            }
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.sync_phase();
        if this.phase != Phase::Busy && this.state.closing.load(Relaxed) {
            // shutting down: no new request (a half-sent one is dropped)
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.tcp).poll_read(cx, buf) {
            Poll::Pending => this.poll_deadline(cx),
            Poll::Ready(Ok(())) => {
                if this.phase == Phase::Idle && buf.filled().len() > before {
                    // the first bytes of the next request
                    this.phase = Phase::Head;
                    this.since = None;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
        }
    }
}

impl AsyncWrite for Watched {
    #[inline]
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.tcp).poll_write(cx, buf) {
            Poll::Pending => this.poll_write_deadline(cx),
            done => {
                this.write_since = None;
                done
            }
        }
    }

    #[inline]
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.tcp).poll_write_vectored(cx, bufs) {
            Poll::Pending => this.poll_write_deadline(cx),
            done => {
                this.write_since = None;
                done
            }
        }
    }

    #[inline]
    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    #[inline]
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    #[inline]
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

/// The router as hyper's service for one connection (REST reads by id and GraphQL POSTs
/// answered directly).
pub(crate) struct Service {
    pub(crate) router: Router,
    pub(crate) direct: Option<Arc<Direct>>,
    pub(crate) state: Arc<ConnState>,
    pub(crate) body_timeout: Duration,
    /// Each request carries its connection's address ([`ClientAddr`]) for the rate limiter
    /// (only when the server limits rates).
    pub(crate) tag_clients: bool,
}

impl hyper::service::Service<Request<Incoming>> for Service {
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn call(&self, req: Request<Incoming>) -> ResponseFuture {
        self.state.in_flight.fetch_add(1, Relaxed);
        self.state.body_timed_out.store(false, Relaxed);
        let guard = InFlight {
            state: self.state.clone(),
            method: req.method().clone(),
            uri: req.uri().clone(),
        };
        let state = self.state.clone();
        let timeout = self.body_timeout;
        let req = req.map(|inner| RequestBody {
            inner,
            state,
            timeout,
            sleep: None,
            timed_out: false,
        });
        let client = self.tag_clients.then(|| self.state.peer.ip());
        let mut req = match &self.direct {
            Some(direct) => match direct.answer(req, client) {
                Ok(future) => {
                    return ResponseFuture {
                        inner: Answer::Direct { future },
                        guard: Some(guard),
                        body_timeout: timeout,
                    }
                }
                Err(req) => req,
            },
            None => req,
        };
        // routed requests find the address as an extension (only when rates are limited)
        if let Some(ip) = client {
            req.extensions_mut().insert(ClientAddr(ip));
        }
        let mut router = self.router.clone();
        ResponseFuture {
            inner: Answer::Routed {
                future: tower_service::Service::call(&mut router, req),
            },
            guard: Some(guard),
            body_timeout: timeout,
        }
    }
}

/// A request in progress, until its response is sent to the end or abandoned.
struct InFlight {
    state: Arc<ConnState>,
    method: Method,
    uri: Uri,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.state.cut.load(Relaxed) {
            tracing::warn!(
                peer = %self.state.peer,
                "shutdown deadline: {} {} cut off before its response was complete",
                self.method,
                self.uri
            );
        }
        let now = Instant::now().saturating_duration_since(base());
        self.state
            .idle_since
            .store(u64::try_from(now.as_nanos()).unwrap_or(u64::MAX), Relaxed);
        self.state.completed.fetch_add(1, Relaxed);
        self.state.in_flight.fetch_sub(1, Relaxed);
    }
}

pin_project! {
    /// The answer to a request: the router's, or a direct one.
    #[project = AnswerProj]
    enum Answer {
        Routed { #[pin] future: axum::routing::future::RouteFuture<Infallible> },
        Direct { future: DirectFuture },
    }
}

pin_project! {
    /// The answer, turned into 408 when the request body timed out.
    pub(crate) struct ResponseFuture {
        #[pin]
        inner: Answer,
        guard: Option<InFlight>,
        body_timeout: Duration,
    }
}

impl Future for ResponseFuture {
    type Output = Result<Response<ResponseBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = match this.inner.project() {
            AnswerProj::Routed { future } => match ready!(future.poll(cx)) {
                Ok(response) => response,
            },
            AnswerProj::Direct { future } => ready!(future.as_mut().poll(cx)),
        };
        let guard = this.guard.take().expect("polled after completion");
        if response.status() == StatusCode::SWITCHING_PROTOCOLS {
            guard.state.upgraded.store(true, Relaxed);
        }
        let response = if guard.state.body_timed_out.load(Relaxed) {
            body_timeout_response(response, *this.body_timeout)
        } else {
            response
        };
        Poll::Ready(Ok(response.map(|inner| ResponseBody {
            inner,
            _guard: guard,
        })))
    }
}

/// 408 in JSON, closing the connection (the rest of the body is never read); the CORS
/// header of the handler's answer is kept.
fn body_timeout_response(original: Response<Body>, timeout: Duration) -> Response<Body> {
    let body = serde_json::json!({
        "error": format!(
            "the request body was not received within {} ms",
            timeout.as_millis()
        ),
        "code": "REQUEST_TIMEOUT",
    });
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = StatusCode::REQUEST_TIMEOUT;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    if let Some(origin) = original.headers().get(header::ACCESS_CONTROL_ALLOW_ORIGIN) {
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
    }
    response
}

/// A response body that keeps its request counted as in progress until it is sent.
pub(crate) struct ResponseBody {
    inner: Body,
    _guard: InFlight,
}

impl http_body::Body for ResponseBody {
    type Data = Bytes;
    type Error = axum::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The request body did not arrive in time.
#[derive(Debug)]
struct BodyTimeout(Duration);

impl std::fmt::Display for BodyTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the request body was not received within {} ms",
            self.0.as_millis()
        )
    }
}

impl std::error::Error for BodyTimeout {}

/// A request body that fails once it has not arrived within the timeout of the first time
/// it had to be waited for (a body that is already there costs no timer).
pub(crate) struct RequestBody {
    inner: Incoming,
    state: Arc<ConnState>,
    timeout: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    timed_out: bool,
}

impl http_body::Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.timed_out {
            return Poll::Ready(Some(Err(BodyTimeout(this.timeout).into())));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(frame.map(|f| f.map_err(Into::into))),
            Poll::Pending => {
                let timeout = this.timeout;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                ready!(sleep.as_mut().poll(cx));
                this.timed_out = true;
                this.state.body_timed_out.store(true, Relaxed);
                STATS.body_timeouts.fetch_add(1, Relaxed);
                tracing::debug!(peer = %this.state.peer, "request body not received within {} ms", timeout.as_millis());
                Poll::Ready(Some(Err(BodyTimeout(timeout).into())))
            }
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
