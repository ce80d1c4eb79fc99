//! A TCP proxy between meshql and a database server that a test can pause (bytes are held,
//! not lost, until it resumes) and cut (every open connection is dropped, as a network
//! failure or a server crash would). Runs on the test's tokio runtime.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::AbortHandle;

/// Bytes held towards the server since the last pause.
type Held = Arc<Mutex<Vec<u8>>>;

/// Held bytes kept for [`FaultProxy::until_request_held`] to search.
const HELD_KEPT: usize = 1 << 20;

pub struct FaultProxy {
    addr: SocketAddr,
    paused: watch::Sender<bool>,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
    accept: AbortHandle,
    /// Bytes meshql sent towards the server since the last pause (held while paused), up
    /// to [`HELD_KEPT`].
    held: Held,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (paused, _) = watch::channel(false);
        let connections: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let held = Held::default();
        let (tx, conns, sent) = (paused.clone(), connections.clone(), held.clone());
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
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
            paused,
            connections,
            accept,
            held,
        }
    }

    /// `127.0.0.1:<port>` to connect to instead of the server.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Holds every byte in either direction until [`resume`](Self::resume).
    pub fn pause(&self) {
        self.held.lock().unwrap().clear();
        self.paused.send_replace(true);
    }

    /// Waits until a request holding `needle` (a name or value it carries) is held on the
    /// wire since the pause, holding its connection: other traffic (the driver's heartbeats,
    /// the change feed's polls) does not count. Panics after `limit`.
    pub async fn until_request_held(&self, needle: &[u8], limit: Duration) {
        let deadline = Instant::now() + limit;
        while !self
            .held
            .lock()
            .unwrap()
            .windows(needle.len())
            .any(|w| w == needle)
        {
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

    /// Drops every open connection (what was held is lost), then forwards new ones again.
    pub fn cut(&self) {
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

async fn forward(client: TcpStream, server: TcpStream, paused: watch::Receiver<bool>, held: Held) {
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    // either direction ending ends the connection
    tokio::select! {
        _ = pump(cr, sw, paused.clone(), Some(held)) => {}
        _ = pump(sr, cw, paused, None) => {}
    }
}

/// Copies `from` to `to`; while paused it reads one buffer ahead (kept in `held`) and
/// holds it until the pause ends.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut paused: watch::Receiver<bool>,
    held: Option<Held>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if *paused.borrow() {
            if let Some(held) = &held {
                let mut held = held.lock().unwrap();
                let room = HELD_KEPT.saturating_sub(held.len());
                held.extend_from_slice(&buf[..n.min(room)]);
            }
        }
        if paused.wait_for(|p| !*p).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
