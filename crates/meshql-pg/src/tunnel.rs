//! TLS for the `postgres_cdc` source's connections to the legacy database, with the same
//! `sslmode` / `sslrootcert` reading and rustls settings as meshql's PostgreSQL store
//! ([`crate::tls`]).
//!
//! The SQL connection (catalog, snapshot copy) is tokio-postgres with the store's connector.
//! The replication connection is pgwire-replication's, whose own TLS would bring a second
//! crypto library (aws-lc, through tokio-rustls's default features) beside the ring provider
//! the rest of meshql uses. So the source gives pgwire-replication a plain Unix socket in a
//! private directory (mode 0700: only this user can connect to it) and a [`Tunnel`] carries
//! each connection made to it to the server: `SSLRequest`, the TLS handshake with the store's
//! client settings, then the bytes both ways. With `sslmode=prefer` a server that does not
//! offer TLS (or whose handshake fails) is reached in clear, as libpq and the store do.

use crate::tls::{self as client_tls, SslMode};
use parking_lot::Mutex;
use rustls::pki_types::ServerName;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};

/// PostgreSQL's `SSLRequest`: length 8, code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// How long reaching the server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What a URL asks of TLS: `None` when it is `sslmode=disable` or names a Unix socket.
pub struct TlsTarget {
    host: String,
    port: u16,
    mode: SslMode,
    rustls: Arc<rustls::ClientConfig>,
}

impl TlsTarget {
    /// Reads `url`'s TLS settings (an error is a sentence for `meshql check`).
    pub fn of(url: &str) -> Result<Option<TlsTarget>, String> {
        let c = client_tls::read_url(url)?;
        if c.mode == SslMode::Disable {
            return Ok(None);
        }
        let host = match c.config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
            _ => return Ok(None),
        };
        Ok(Some(TlsTarget {
            host,
            port: c.config.get_ports().first().copied().unwrap_or(5432),
            mode: c.mode,
            rustls: c.rustls,
        }))
    }
}

/// A private Unix socket whose connections are carried to the server over TLS; closed (its
/// directory removed, its connections cut) when dropped.
pub struct Tunnel {
    dir: PathBuf,
    task: tokio::task::JoinHandle<()>,
    /// Why the last connection could not be carried (for the error the client then sees).
    failure: Arc<Mutex<Option<String>>>,
}

impl Tunnel {
    /// Opens the socket `<dir>/.s.PGSQL.<port>` (the name libpq and pgwire-replication give a
    /// socket directory and port) for `target`.
    pub fn open(target: TlsTarget) -> Result<Tunnel, String> {
        let dir = std::env::temp_dir().join(format!("meshql-pgtls-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let socket = dir.join(format!(".s.PGSQL.{}", target.port));
        let listener = match UnixListener::bind(&socket) {
            Ok(l) => l,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(format!("{}: {e}", socket.display()));
            }
        };
        let failure = Arc::new(Mutex::new(None));
        let target = Arc::new(target);
        let reported = failure.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (target, reported) = (target.clone(), reported.clone());
                tokio::spawn(async move {
                    if let Err(e) = carry(client, &target).await {
                        *reported.lock() = Some(e);
                    }
                });
            }
        });
        Ok(Tunnel { dir, task, failure })
    }

    /// The directory to give pgwire-replication as its host.
    pub fn socket_dir(&self) -> String {
        self.dir.to_string_lossy().into_owned()
    }

    /// Why the last connection could not be carried, if it could not.
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().take()
    }
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Reaches the server over TCP within [`CONNECT_TIMEOUT`].
async fn tcp(target: &TlsTarget) -> Result<TcpStream, String> {
    let stream = tokio::time::timeout(
        CONNECT_TIMEOUT,
        TcpStream::connect((target.host.as_str(), target.port)),
    )
    .await
    .map_err(|_| format!("connecting to {}:{} timed out", target.host, target.port))?
    .map_err(|e| format!("connecting to {}:{}: {e}", target.host, target.port))?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Carries one client connection to the server.
async fn carry(mut client: UnixStream, target: &TlsTarget) -> Result<(), String> {
    let mut server = tcp(target).await?;
    server
        .write_all(&SSL_REQUEST)
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = [0u8; 1];
    server
        .read_exact(&mut answer)
        .await
        .map_err(|e| format!("the server's answer to SSLRequest: {e}"))?;
    let clear = |reason: String| -> Result<(), String> {
        if target.mode == SslMode::Prefer {
            tracing::warn!("postgres_cdc: {reason}; sslmode=prefer: replicating without TLS");
            Ok(())
        } else {
            Err(reason)
        }
    };
    if answer[0] != b'S' {
        clear(format!(
            "{}:{} does not offer TLS",
            target.host, target.port
        ))?;
        // after `N` the same connection goes on in clear
        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
        return Ok(());
    }
    let name = ServerName::try_from(target.host.clone())
        .map_err(|_| format!("`{}` is not a host name TLS can check", target.host))?;
    let connector = tokio_rustls::TlsConnector::from(target.rustls.clone());
    match tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(name, server)).await {
        Ok(Ok(mut tls)) => {
            let _ = tokio::io::copy_bidirectional(&mut client, &mut tls).await;
            Ok(())
        }
        Ok(Err(e)) => {
            clear(format!(
                "the TLS handshake with {} failed: {e}",
                target.host
            ))?;
            let mut server = tcp(target).await?;
            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            Ok(())
        }
        Err(_) => Err(format!("the TLS handshake with {} timed out", target.host)),
    }
}
