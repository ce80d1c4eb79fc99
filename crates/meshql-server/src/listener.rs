//! The HTTP listener: a socket with a long listen backlog, the accept loop with its limit on
//! connections, each connection served by hyper's HTTP/1.1 with the timeouts of
//! [`crate::connection`], and a bounded graceful shutdown. With `[server.tls]` each
//! connection's task first runs the TLS handshake over the same timed socket (so the header
//! timeout bounds the handshake and the first request's headers together).

use crate::connection::{ConnState, Limits, Service, Watched, STATS};
use crate::direct::Direct;
use crate::tls::Tls;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use meshql_config::resolve::ServerSpec;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::io;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Binds `address` (`host:port`, the first of its addresses that binds) with SO_REUSEADDR and
/// a listen queue of `backlog` connections (the kernel may cap it, on Linux at
/// `net.core.somaxconn`).
pub async fn bind(address: &str, backlog: u32) -> io::Result<TcpListener> {
    let mut last = None;
    for addr in tokio::net::lookup_host(address).await? {
        match bind_one(addr, backlog) {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{address} resolves to no address"),
        )
    }))
}

fn bind_one(addr: SocketAddr, backlog: u32) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // as std and tokio do on Unix: a restarted server need not wait out TIME_WAIT
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

/// How long a serving thread with more connections than another waits before it accepts
/// (thread per core): long enough for an idle thread to wake and take the connection, short
/// against a connection's set-up.
const BALANCE_WAIT: Duration = Duration::from_micros(500);

/// Files the process keeps open besides its connections (storage, log segments, outgoing
/// connections), subtracted from the open-file limit for the default `max_connections`.
const RESERVED_FILES: usize = 256;

/// `server.max_connections` when the config leaves it out: 10,000, or the open-file limit
/// less [`RESERVED_FILES`] when that is lower (at least 64).
pub fn default_max_connections() -> usize {
    match open_file_limit() {
        Some(limit) => {
            ServerSpec::DEFAULT_MAX_CONNECTIONS.min(limit.saturating_sub(RESERVED_FILES).max(64))
        }
        None => ServerSpec::DEFAULT_MAX_CONNECTIONS,
    }
}

/// The soft limit on open files, when there is one.
fn open_file_limit() -> Option<usize> {
    #[cfg(unix)]
    {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit only writes the struct it is given.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0
            && limit.rlim_cur != libc::RLIM_INFINITY
        {
            return Some(usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX));
        }
        None
    }
    #[cfg(not(unix))]
    None
}

/// The largest request line and headers, and hyper's read and write buffer limit per
/// connection (its default buffer limit is about 400 KiB, with no limit of its own on headers).
const MAX_BUF_BYTES: usize = 64 * 1024;

const SERVING: u8 = 0;
/// Shutting down: no new requests; requests in progress may finish.
const DRAINING: u8 = 1;
/// The shutdown deadline passed: every connection left is closed.
const CUTTING: u8 = 2;

/// What the accept loop and every connection task share.
struct Shared {
    router: Router,
    /// REST reads by id and GraphQL POSTs answered without the router.
    direct: Option<Arc<Direct>>,
    http1: http1::Builder,
    limits: Limits,
    stage: AtomicU8,
    /// `[server.tls]`: the handshake every connection starts with.
    tls: Option<tokio_rustls::TlsAcceptor>,
    /// Open connections by id (to wake and count them at shutdown).
    conns: Mutex<HashMap<u64, Arc<ConnState>>>,
    /// The last connection id given.
    next_id: AtomicU64,
    /// Connections served at once (`server.max_connections`).
    max: usize,
    /// Requests carry their client's address (for `[server.rate_limit]`).
    tag_clients: bool,
}

impl Shared {
    /// Moves every connection to `stage`; returns how many are open and how many of them
    /// have a request in progress.
    fn enter(&self, stage: u8) -> (usize, usize) {
        self.stage.store(stage, Ordering::Release);
        let conns = self.conns.lock();
        let mut busy = 0;
        for c in conns.values() {
            if c.in_flight.load(Ordering::Relaxed) > 0 {
                busy += 1;
            }
            c.waker.wake();
        }
        (conns.len(), busy)
    }
}

/// Serves `router` on `listener` until `shutdown` completes, then stops accepting, closes
/// idle and half-read connections at once, lets requests in progress finish for up to
/// `spec.shutdown_timeout`, and closes what is left.
pub(crate) async fn run(
    router: Router,
    direct: Option<Arc<Direct>>,
    tag_clients: bool,
    listener: TcpListener,
    spec: &ServerSpec,
    tls: Option<Tls>,
    shutdown: impl Future<Output = ()>,
) {
    if let Some(tls) = &tls {
        tls.watch();
    }
    let max = spec
        .max_connections
        .unwrap_or_else(default_max_connections)
        .clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
    if let (Some(_), Some(files)) = (spec.max_connections, open_file_limit()) {
        if max.saturating_add(RESERVED_FILES) > files {
            tracing::warn!(
                "server.max_connections = {max} but the open-file limit is {files}: accepting \
                 fails (and is retried) once about {} connections are open; raise the limit \
                 (ulimit -n, LimitNOFILE=) or lower max_connections",
                files.saturating_sub(RESERVED_FILES)
            );
        }
    }
    let mut http1 = http1::Builder::new();
    // the timeouts are the socket's (see `Watched`): hyper's own header timer would also
    // close idle keep-alive connections at the header timeout
    http1.header_read_timeout(None);
    // a request's line and headers: 431 beyond this; and a connection buffers at most this
    // much of what it reads or writes
    http1.max_header_size(MAX_BUF_BYTES);
    http1.max_buf_size(MAX_BUF_BYTES);
    let shared = Arc::new(Shared {
        router,
        direct,
        http1,
        limits: Limits {
            header: spec.header_read_timeout,
            idle: spec.keep_alive_timeout,
            body: spec.body_read_timeout,
            write: spec.write_timeout,
        },
        stage: AtomicU8::new(SERVING),
        tls: tls.map(|t| t.acceptor),
        conns: Mutex::new(HashMap::new()),
        next_id: AtomicU64::new(0),
        max,
        tag_clients,
    });
    let permits = Arc::new(Semaphore::new(max));
    STATS.max.store(max as u64, Ordering::Relaxed);
    let serving_threads = match Some(spec.serve_threads).filter(|n| *n > 0) {
        Some(n) => match PerCore::start(n, &shared, &permits, listener) {
            Ok(threads) => {
                shutdown.await;
                threads.stop_accepting().await;
                Some(threads)
            }
            Err(e) => {
                tracing::error!("cannot start the serving threads: {e}");
                return;
            }
        },
        None => {
            accept_loop(shared.clone(), permits.clone(), listener, None, shutdown).await;
            None
        }
    };
    drain(&shared, &permits, spec).await;
    if let Some(threads) = serving_threads {
        threads.finish().await;
    }
}

/// The serving threads (`ServerSpec::serve_threads`, thread per core): each has a
/// single-threaded runtime and polls the same listening socket (a clone of its descriptor
/// registered with its own runtime); a connection is served, start to end, by the thread that
/// accepted it — no connection or request is handed between threads, as nginx's workers do.
/// Background work (the change feed, relays, probes) stays on the process's runtime.
struct PerCore {
    stop: tokio::sync::watch::Sender<bool>,
    done: tokio::sync::watch::Sender<bool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl PerCore {
    fn start(
        n: usize,
        shared: &Arc<Shared>,
        permits: &Arc<Semaphore>,
        listener: TcpListener,
    ) -> io::Result<PerCore> {
        let socket = listener.into_std()?;
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let (done, done_rx) = tokio::sync::watch::channel(false);
        let mut threads = Vec::with_capacity(n);
        let balance: Arc<[AtomicU64]> = (0..n).map(|_| AtomicU64::new(0)).collect();
        for i in 0..n {
            let socket = socket.try_clone()?;
            let balance = balance.clone();
            let (shared, permits) = (shared.clone(), permits.clone());
            let (mut stop_rx, mut done_rx) = (stop_rx.clone(), done_rx.clone());
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            threads.push(
                std::thread::Builder::new()
                    .name(format!("meshql-serve-{i}"))
                    .spawn(move || {
                        meshql_core::serving::enter(i, n);
                        runtime.block_on(async move {
                            let listener = match TcpListener::from_std(socket) {
                                Ok(l) => l,
                                Err(e) => {
                                    tracing::error!("serving thread {i}: {e}");
                                    return;
                                }
                            };
                            let stopping = async move {
                                let _ = stop_rx.wait_for(|s| *s).await;
                            };
                            let share = Some((balance, i));
                            accept_loop(shared, permits, listener, share, stopping).await;
                            // its connections finish (or are cut) on this thread's runtime
                            let _ = done_rx.wait_for(|d| *d).await;
                        });
                    })?,
            );
        }
        Ok(PerCore {
            stop,
            done,
            threads,
        })
    }

    /// Every thread stops accepting (their listeners are closed once they all have).
    async fn stop_accepting(&self) {
        let _ = self.stop.send(true);
    }

    /// The drain is over: the threads end, dropping what is left on them.
    async fn finish(self) {
        let _ = self.done.send(true);
        let threads = self.threads;
        let _ = tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        })
        .await;
    }
}

/// Accepts connections on `listener` and serves each on a task of the current runtime until
/// `shutdown` completes; then closes the listener.
///
/// With `balance` (thread per core: every thread's open connections, and this thread's
/// index), a thread serving more connections than the least busy one waits a little before
/// it accepts, so that the other takes the next connection: every thread polls the same
/// socket, and the first awake would otherwise take connections whatever its load.
async fn accept_loop(
    shared: Arc<Shared>,
    permits: Arc<Semaphore>,
    listener: TcpListener,
    balance: Option<(Arc<[AtomicU64]>, usize)>,
    shutdown: impl Future<Output = ()>,
) {
    let max = shared.max;
    let mut shutdown = pin!(shutdown);
    let mut full_warned: Option<Instant> = None;
    let mut accept_error_logged: Option<Instant> = None;
    loop {
        let permit = match permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                STATS.accept_waits.fetch_add(1, Ordering::Relaxed);
                if full_warned.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                    tracing::warn!(
                        "{max} connections open (server.max_connections): new connections wait \
                         in the listen backlog until one closes"
                    );
                    full_warned = Some(Instant::now());
                }
                tokio::select! {
                    p = permits.clone().acquire_owned() => p.expect("the semaphore is never closed"),
                    _ = &mut shutdown => break,
                }
            }
        };
        if let Some((open, me)) = &balance {
            let mine = open[*me].load(Ordering::Relaxed);
            let least = open
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .min()
                .unwrap_or(0);
            if mine > least {
                tokio::select! {
                    _ = tokio::time::sleep(BALANCE_WAIT) => {}
                    _ = &mut shutdown => break,
                }
            }
        }
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(accepted) => accepted,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    // out of file descriptors, most likely: wait for some to close
                    if accept_error_logged.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                        tracing::error!("cannot accept connections: {e}");
                        accept_error_logged = Some(Instant::now());
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(100)) => continue,
                        _ = &mut shutdown => break,
                    }
                }
            },
            _ = &mut shutdown => break,
        };
        // a change stream writes small events one after the other; with Nagle's algorithm
        // each waited for the client's delayed ACK (up to 40 ms) before the next left
        let _ = tcp.set_nodelay(true);
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        STATS.accepted.fetch_add(1, Ordering::Relaxed);
        match &balance {
            None => {
                tokio::spawn(connection(shared.clone(), tcp, peer, id, permit));
            }
            Some((open, me)) => {
                let (open, me) = (open.clone(), *me);
                open[me].fetch_add(1, Ordering::Relaxed);
                let serve = connection(shared.clone(), tcp, peer, id, permit);
                tokio::spawn(async move {
                    serve.await;
                    open[me].fetch_sub(1, Ordering::Relaxed);
                });
            }
        }
    }
    // new connections are refused from here on (once every clone of the socket is closed)
    drop(listener);
}

/// After the accepting stopped: closes idle connections, lets requests in progress finish for
/// up to `spec.shutdown_timeout`, then closes what is left.
async fn drain(shared: &Arc<Shared>, permits: &Arc<Semaphore>, spec: &ServerSpec) {
    let max = shared.max;
    let started = Instant::now();
    let (open, busy) = shared.enter(DRAINING);
    if open > 0 {
        tracing::info!(
            "stopped accepting; {open} connections open: {} idle or not done sending a \
             request closed now, {busy} with a request in progress get up to {} ms to finish",
            open - busy,
            spec.shutdown_timeout.as_millis()
        );
    }
    let everyone = max as u32;
    if tokio::time::timeout(spec.shutdown_timeout, permits.acquire_many(everyone))
        .await
        .is_ok()
    {
        if open > 0 {
            tracing::info!(
                "all connections closed after {} ms",
                started.elapsed().as_millis()
            );
        }
        return;
    }
    let (open, busy) = shared.enter(CUTTING);
    tracing::warn!(
        "shutdown deadline of {} ms passed: closing the {open} connections left ({busy} with \
         a request still in progress)",
        spec.shutdown_timeout.as_millis()
    );
    // every connection task ends at its next poll; a request handler blocked in a thread
    // is not waited for
    let _ = tokio::time::timeout(Duration::from_secs(2), permits.acquire_many(everyone)).await;
}

/// Errors of one incoming connection (not of the listener).
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Removes a connection from [`Shared::conns`] when its task ends.
struct Registered {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.shared.conns.lock().remove(&self.id);
        STATS.open.fetch_sub(1, Ordering::Relaxed);
    }
}

enum Event {
    Done(Result<(), hyper::Error>),
    Stage(u8),
}

async fn connection(
    shared: Arc<Shared>,
    tcp: TcpStream,
    peer: SocketAddr,
    id: u64,
    _permit: OwnedSemaphorePermit,
) {
    let state = Arc::new(ConnState::new(peer));
    shared.conns.lock().insert(id, state.clone());
    STATS.open.fetch_add(1, Ordering::Relaxed);
    let _registered = Registered {
        shared: shared.clone(),
        id,
    };
    let watched = Watched::new(tcp, state.clone(), &shared.limits);
    let Some(acceptor) = &shared.tls else {
        return serve(&shared, &state, peer, watched).await;
    };
    let mut handshake = pin!(acceptor.accept(watched));
    // the handshake is bounded by the header timeout (`Watched`); a shutdown ends it at once
    let tls = poll_fn(|cx| {
        if let Poll::Ready(r) = handshake.as_mut().poll(cx) {
            return Poll::Ready(Some(r));
        }
        if shared.stage.load(Ordering::Acquire) != SERVING {
            return Poll::Ready(None);
        }
        state.waker.register(cx.waker());
        if shared.stage.load(Ordering::Acquire) != SERVING {
            return Poll::Ready(None);
        }
        Poll::Pending
    })
    .await;
    match tls {
        Some(Ok(stream)) => serve(&shared, &state, peer, stream).await,
        // a header timeout is counted (and logged) as such by `Watched`
        Some(Err(e)) if e.kind() != io::ErrorKind::TimedOut => {
            STATS.tls_handshake_failures.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%peer, "TLS handshake failed: {e}");
        }
        // timed out, or shutting down before the handshake was done
        Some(Err(_)) | None => {}
    }
}

/// Serves HTTP/1.1 on a connection's (plain or TLS) stream until it closes or the shutdown
/// closes it.
async fn serve<I>(shared: &Arc<Shared>, state: &Arc<ConnState>, peer: SocketAddr, io: I)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(io);
    let service = Service {
        router: shared.router.clone(),
        direct: shared.direct.clone(),
        state: state.clone(),
        body_timeout: shared.limits.body,
        tag_clients: shared.tag_clients,
    };
    let mut conn = pin!(shared.http1.serve_connection(io, service).with_upgrades());
    let mut seen = SERVING;
    loop {
        let event = poll_fn(|cx| {
            if let Poll::Ready(r) = conn.as_mut().poll(cx) {
                return Poll::Ready(Event::Done(r));
            }
            let stage = shared.stage.load(Ordering::Acquire);
            if stage != seen {
                return Poll::Ready(Event::Stage(stage));
            }
            state.waker.register(cx.waker());
            // a stage set between the load and the registration
            let stage = shared.stage.load(Ordering::Acquire);
            if stage != seen {
                return Poll::Ready(Event::Stage(stage));
            }
            Poll::Pending
        })
        .await;
        match event {
            Event::Done(Ok(())) => break,
            Event::Done(Err(e)) => {
                tracing::debug!(%peer, "connection closed: {e}");
                break;
            }
            Event::Stage(stage) => {
                seen = stage;
                if stage == CUTTING {
                    state.cut.store(true, Ordering::Relaxed);
                    break;
                }
                // DRAINING: no further request on this connection. hyper closes it at once
                // when idle, or once the response in progress is sent; a connection in the
                // middle of a request's headers reads end-of-stream (see `Watched`)
                state.closing.store(true, Ordering::Relaxed);
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}
