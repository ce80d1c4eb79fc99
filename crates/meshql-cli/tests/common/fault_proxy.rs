//! A TCP proxy between meshql and a database server that a test can pause (bytes are held,
//! not lost, until it resumes), make hold one request (the first carrying a given name, while
//! all other traffic flows), make deliver one request and hold the server's reply to it (the
//! server does the work, the client never hears of it), and cut (every open connection is
//! dropped, as a network failure or a server crash would). Runs on the test's tokio runtime.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::AbortHandle;

/// What the connections towards the server share with the test.
#[derive(Default)]
struct Towards {
    /// Bytes held since the last pause or hold.
    held: Mutex<Vec<u8>>,
    /// Set by [`FaultProxy::hold_request_with`]: a read carrying it stops its connection.
    hold_on: Mutex<Option<Vec<u8>>>,
    /// Set by [`FaultProxy::hold_reply_to_request_with`]: the first read carrying it is
    /// forwarded, and the server's replies on its connection are held from then on.
    hold_reply_on: Mutex<Option<Vec<u8>>>,
    /// Reply bytes held since the last [`FaultProxy::hold_reply_to_request_with`] (up to
    /// [`HELD_KEPT`]).
    replies_held: Mutex<Vec<u8>>,
}

/// Held bytes kept for [`FaultProxy::until_request_held`] to search.
const HELD_KEPT: usize = 1 << 20;

pub struct FaultProxy {
    addr: SocketAddr,
    /// Set by [`FaultProxy::refuse`]: new connections are closed at once.
    refusing: Arc<AtomicBool>,
    paused: watch::Sender<bool>,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
    accept: AbortHandle,
    /// Bytes meshql sent towards the server since the last pause or hold (those held), up
    /// to [`HELD_KEPT`], and the hold's needle.
    towards: Arc<Towards>,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (paused, _) = watch::channel(false);
        let connections: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let towards = Arc::<Towards>::default();
        let refusing = Arc::new(AtomicBool::new(false));
        let (tx, conns, sent) = (paused.clone(), connections.clone(), towards.clone());
        let refuse = refusing.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if refuse.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue; // the client sees its connection closed
                };
                let task = tokio::spawn(forward(client, server, tx.subscribe(), sent.clone()));
                conns.lock().unwrap().push(task.abort_handle());
            }
        })
        .abort_handle();
        FaultProxy {
            addr,
            refusing,
            paused,
            connections,
            accept,
            towards,
        }
    }

    /// `127.0.0.1:<port>` to connect to instead of the server.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Holds every byte in either direction until [`resume`](Self::resume).
    pub fn pause(&self) {
        self.towards.held.lock().unwrap().clear();
        self.paused.send_replace(true);
    }

    /// From now on, the first request towards the server that carries `needle` (a name or
    /// value in it) is held, and its connection with it, until [`cut`](Self::cut); every
    /// other connection flows (the driver's handshakes and heartbeats, the feed's polls).
    pub fn hold_request_with(&self, needle: &[u8]) {
        self.towards.held.lock().unwrap().clear();
        *self.towards.hold_on.lock().unwrap() = Some(needle.to_vec());
    }

    /// From now on, the first request towards the server that carries `needle` is
    /// forwarded, and from then on the server's replies on that connection are held (never
    /// delivered) until [`cut`](Self::cut): the server does what the request asks, and the
    /// client never hears the answer (a lost acknowledgement). Every other connection
    /// flows. [`until_request_held`](Self::until_request_held) then finds the request (it
    /// was sent), [`until_reply_held`](Self::until_reply_held) the server's answer.
    pub fn hold_reply_to_request_with(&self, needle: &[u8]) {
        self.towards.held.lock().unwrap().clear();
        self.towards.replies_held.lock().unwrap().clear();
        *self.towards.hold_reply_on.lock().unwrap() = Some(needle.to_vec());
    }

    /// Waits until the server answered the request that
    /// [`hold_reply_to_request_with`](Self::hold_reply_to_request_with) let through, its
    /// answer held by the proxy. Panics after `limit`.
    pub async fn until_reply_held(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.towards.replies_held.lock().unwrap().is_empty() {
            assert!(
                Instant::now() < deadline,
                "the server did not answer the request let through within {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The reply bytes held so far (see
    /// [`hold_reply_to_request_with`](Self::hold_reply_to_request_with)).
    pub fn held_reply(&self) -> Vec<u8> {
        self.towards.replies_held.lock().unwrap().clone()
    }

    /// Waits until a request holding `needle` (a name or value it carries) is held on the
    /// wire since the pause or hold, holding its connection (or, after
    /// [`hold_reply_to_request_with`](Self::hold_reply_to_request_with), was forwarded with
    /// its reply held): other traffic (the driver's heartbeats, the change feed's polls)
    /// does not count. Panics after `limit`.
    pub async fn until_request_held(&self, needle: &[u8], limit: Duration) {
        let deadline = Instant::now() + limit;
        while !contains(&self.towards.held.lock().unwrap(), needle) {
            assert!(
                Instant::now() < deadline,
                "no request with {:?} reached the paused proxy within {limit:?}",
                String::from_utf8_lossy(needle)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn resume(&self) {
        self.paused.send_replace(false);
    }

    /// The server is gone: every open connection is dropped and new ones are closed at once,
    /// until [`accept_again`](Self::accept_again).
    pub fn refuse(&self) {
        self.refusing.store(true, Ordering::SeqCst);
        self.cut();
    }

    pub fn accept_again(&self) {
        self.refusing.store(false, Ordering::SeqCst);
    }

    /// Drops every open connection (what was held is lost), then forwards new ones again.
    pub fn cut(&self) {
        *self.towards.hold_on.lock().unwrap() = None;
        *self.towards.hold_reply_on.lock().unwrap() = None;
        for c in self.connections.lock().unwrap().drain(..) {
            c.abort();
        }
        self.resume();
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

async fn forward(
    client: TcpStream,
    server: TcpStream,
    paused: watch::Receiver<bool>,
    towards: Arc<Towards>,
) {
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    // set once this connection forwarded the request whose replies are to be held
    let hold_replies = Arc::new(AtomicBool::new(false));
    // either direction ending ends the connection
    tokio::select! {
        _ = pump(cr, sw, paused.clone(), Some(towards.clone()), hold_replies.clone()) => {}
        _ = replies(sr, cw, paused, towards, hold_replies) => {}
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Copies `from` to `to`; while paused it reads one buffer ahead (kept in `towards`) and
/// holds it until the pause ends. Towards the server (`towards` given), a read carrying the
/// hold's needle is kept and never sent: the connection stalls until it is cut; a read
/// carrying the reply hold's needle is sent, and sets `hold_replies` first.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut paused: watch::Receiver<bool>,
    towards: Option<Arc<Towards>>,
    hold_replies: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let hold = towards.as_ref().is_some_and(|h| {
            h.hold_on
                .lock()
                .unwrap()
                .as_deref()
                .is_some_and(|needle| contains(&buf[..n], needle))
        });
        // the first request carrying the reply hold's needle (the hold is taken, once)
        let hold_reply = towards.as_ref().is_some_and(|h| {
            let mut on = h.hold_reply_on.lock().unwrap();
            let found = on
                .as_deref()
                .is_some_and(|needle| contains(&buf[..n], needle));
            if found {
                *on = None;
            }
            found
        });
        if hold_reply {
            hold_replies.store(true, Ordering::SeqCst);
        }
        if *paused.borrow() || hold {
            if let Some(towards) = &towards {
                let mut held = towards.held.lock().unwrap();
                let room = HELD_KEPT.saturating_sub(held.len());
                held.extend_from_slice(&buf[..n.min(room)]);
            }
        }
        if hold {
            return std::future::pending().await;
        }
        if paused.wait_for(|p| !*p).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        if hold_reply {
            // sent: now it counts as held (its reply will be)
            if let Some(towards) = &towards {
                let mut held = towards.held.lock().unwrap();
                let room = HELD_KEPT.saturating_sub(held.len());
                held.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
}

/// Copies the server's replies to the client as [`pump`] does, except once `hold_replies`
/// is set: from then on what the server sends is kept in `towards` and never delivered.
async fn replies(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut paused: watch::Receiver<bool>,
    towards: Arc<Towards>,
    hold_replies: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if hold_replies.load(Ordering::SeqCst) {
            let mut held = towards.replies_held.lock().unwrap();
            let room = HELD_KEPT.saturating_sub(held.len());
            held.extend_from_slice(&buf[..n.min(room)]);
            continue;
        }
        if paused.wait_for(|p| !*p).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
