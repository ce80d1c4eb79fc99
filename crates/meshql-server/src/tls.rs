//! `[server.tls]`: the rustls server config (ring provider, TLS 1.2 and 1.3, ALPN `http/1.1`)
//! and its certificate, re-read when the files change.
//!
//! The certificate is served through a resolver holding the current pair: a background task
//! looks at the modification times (and sizes) of the two files every
//! [`RELOAD_CHECK_INTERVAL`] and, when either changed, loads both again. A pair that does not
//! load (unreadable, not PEM, key not matching the certificate — as when only one of the two
//! files is replaced yet) is logged as an error and the previous pair keeps serving; the next
//! change is tried again.

use meshql_config::resolve::{read_cert_chain, read_private_key, TlsSpec};
use parking_lot::RwLock;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::path::Path;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};
use tokio_rustls::TlsAcceptor;

/// How often the certificate and key files are checked for changes.
pub const RELOAD_CHECK_INTERVAL: Duration = Duration::from_secs(2);

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Loads the certificate chain and private key and checks that they belong together.
pub fn load_pair(spec: &TlsSpec) -> Result<Arc<CertifiedKey>, String> {
    let chain = read_cert_chain(&spec.cert)?;
    let key = read_private_key(&spec.key)?;
    let key = CertifiedKey::from_der(chain, key, &provider()).map_err(|e| {
        let why = match e {
            rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
                "the private key does not belong to the certificate".to_owned()
            }
            e => e.to_string(),
        };
        format!(
            "certificate {} with key {}: {why}",
            spec.cert.display(),
            spec.key.display()
        )
    })?;
    Ok(Arc::new(key))
}

/// Serves the current certificate to every client.
#[derive(Debug)]
struct Current(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for Current {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().clone())
    }
}

/// The acceptor of a TLS listener, and the certificate it serves.
pub(crate) struct Tls {
    pub(crate) acceptor: TlsAcceptor,
    current: Arc<Current>,
    spec: TlsSpec,
}

impl Tls {
    /// Loads the pair and builds the server config; an error when the pair does not load.
    pub(crate) fn new(spec: &TlsSpec) -> Result<Self, String> {
        let current = Arc::new(Current(RwLock::new(load_pair(spec)?)));
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_cert_resolver(current.clone());
        // the server speaks HTTP/1.1 only
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            current,
            spec: spec.clone(),
        })
    }

    /// Starts the task that reloads the pair when its files change; it ends once the
    /// listener (the last holder of the resolver) is gone.
    pub(crate) fn watch(&self) {
        let current = Arc::downgrade(&self.current);
        let spec = self.spec.clone();
        tokio::spawn(reload_loop(current, spec));
    }
}

/// What identifies a version of a file: modification time and length (`None` when it cannot
/// be read).
fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

async fn reload_loop(current: Weak<Current>, spec: TlsSpec) {
    let mut seen = (stamp(&spec.cert), stamp(&spec.key));
    let mut tick = tokio::time::interval(RELOAD_CHECK_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(current) = current.upgrade() else {
            return;
        };
        let now = (stamp(&spec.cert), stamp(&spec.key));
        if now == seen {
            continue;
        }
        seen = now;
        let spec = spec.clone();
        let loaded = tokio::task::spawn_blocking(move || load_pair(&spec))
            .await
            .unwrap_or_else(|e| Err(format!("loading panicked: {e}")));
        match loaded {
            Ok(pair) => {
                *current.0.write() = pair;
                tracing::info!("[server.tls]: certificate reloaded");
            }
            Err(e) => tracing::error!(
                "[server.tls]: the changed certificate or key does not load, the previous \
                 pair is still served: {e}"
            ),
        }
    }
}
