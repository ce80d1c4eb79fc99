//! A TCP proxy between meshql and a database server that a test can pause (bytes are held,
//! not lost, until it resumes) and cut (every open connection is dropped, as a network
//! failure or a server crash would). Runs on the test's tokio runtime.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::AbortHandle;

pub struct FaultProxy {
    addr: SocketAddr,
    paused: watch::Sender<bool>,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
    accept: AbortHandle,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (paused, _) = watch::channel(false);
        let connections: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let (tx, conns) = (paused.clone(), connections.clone());
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue; // the client sees its connection closed
                };
                let task = tokio::spawn(forward(client, server, tx.subscribe()));
                conns.lock().unwrap().push(task.abort_handle());
            }
        })
        .abort_handle();
        FaultProxy {
            addr,
            paused,
            connections,
            accept,
        }
    }

    /// `127.0.0.1:<port>` to connect to instead of the server.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Holds every byte in either direction until [`resume`](Self::resume).
    pub fn pause(&self) {
        self.paused.send_replace(true);
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

async fn forward(client: TcpStream, server: TcpStream, paused: watch::Receiver<bool>) {
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    // either direction ending ends the connection
    tokio::select! {
        _ = pump(cr, sw, paused.clone()) => {}
        _ = pump(sr, cw, paused) => {}
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut paused: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if paused.wait_for(|p| !*p).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if paused.wait_for(|p| !*p).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
