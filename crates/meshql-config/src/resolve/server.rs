//! `[server]`: the HTTP listener's connection limits, checked, with their defaults filled in.

use super::Resolver;
use crate::model::{ServerConfig, TlsConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::PathBuf;
use std::time::Duration;
use toml::Spanned;

/// The longest timeout accepted (a day): beyond it a limit protects nothing.
const MAX_TIMEOUT_MS: u64 = 24 * 3600 * 1000;
/// The most connections accepted as `max_connections`.
pub const MAX_CONNECTIONS: usize = 1_000_000;
/// The most subscriptions accepted as `max_subscriptions`.
pub const MAX_SUBSCRIPTIONS: u64 = 1_000_000;

/// Connection limits of the HTTP listener (`[server]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSpec {
    /// From a request's first byte to the end of its headers.
    pub header_read_timeout: Duration,
    /// An idle keep-alive connection: no request in progress, no byte of the next one.
    pub keep_alive_timeout: Duration,
    /// For a request body, from when the server first waits for it.
    pub body_read_timeout: Duration,
    /// A write to the client that makes no progress (the client stopped reading).
    pub write_timeout: Duration,
    /// Connections served at once; `None`: derived from the open-file limit at start.
    pub max_connections: Option<usize>,
    /// GraphQL subscriptions open at once; one more is refused.
    pub max_subscriptions: u64,
    pub listen_backlog: u32,
    /// How long requests in progress may still run after SIGTERM/SIGINT.
    pub shutdown_timeout: Duration,
    /// How long a read carrying a consistency token waits for a replica, in milliseconds.
    pub read_your_writes_wait_ms: u64,
    /// `[server.tls]`: HTTPS with this certificate and key.
    pub tls: Option<TlsSpec>,
    /// `[server.rate_limit]`: `None` limits nothing (and costs nothing per request).
    pub rate_limit: Option<super::RateLimitSpec>,
    /// `[server.persisted_queries]` (APQ by default).
    pub persisted_queries: super::PersistedQueriesSpec,
    /// Threads that accept and serve connections, each with a single-threaded runtime of its
    /// own (a connection stays on the thread that accepted it); 0: the connections are served
    /// by the process's work-stealing runtime. Not a config setting: `meshql serve --runtime`
    /// and `--workers` decide it.
    pub serve_threads: usize,
}

/// `[server.tls]`: the certificate chain and private key files, resolved against the config
/// file's directory. Both held a PEM certificate / private key when the config was checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSpec {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The certificate chain of a PEM file: every `CERTIFICATE` section, in order (other
/// sections are skipped); an error when there is none or the PEM is malformed.
pub fn read_cert_chain(path: &std::path::Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let chain = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: invalid PEM: {e}", path.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "{}: no PEM CERTIFICATE section (expected the certificate chain)",
            path.display()
        ));
    }
    Ok(chain)
}

/// The private key of a PEM file (the first `PRIVATE KEY`, `RSA PRIVATE KEY` or `EC PRIVATE
/// KEY` section); an error when there is none or the PEM is malformed.
pub fn read_private_key(path: &std::path::Path) -> Result<PrivateKeyDer<'static>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => format!(
            "{}: no PEM PRIVATE KEY section (expected a PKCS#8, PKCS#1 or SEC1 private key)",
            path.display()
        ),
        e => format!("{}: invalid PEM: {e}", path.display()),
    })
}

impl ServerSpec {
    pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
    pub const DEFAULT_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(60);
    pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
    pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(60);
    /// The default `max_connections` when the open-file limit allows it.
    pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
    /// The default `max_subscriptions`.
    pub const DEFAULT_MAX_SUBSCRIPTIONS: u64 = 10_000;
    pub const DEFAULT_LISTEN_BACKLOG: u32 = 4096;
    pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
    pub const DEFAULT_READ_YOUR_WRITES_WAIT_MS: u64 = 200;
}

impl Default for ServerSpec {
    fn default() -> Self {
        Self {
            header_read_timeout: Self::DEFAULT_HEADER_READ_TIMEOUT,
            keep_alive_timeout: Self::DEFAULT_KEEP_ALIVE_TIMEOUT,
            body_read_timeout: Self::DEFAULT_BODY_READ_TIMEOUT,
            write_timeout: Self::DEFAULT_WRITE_TIMEOUT,
            max_connections: None,
            max_subscriptions: Self::DEFAULT_MAX_SUBSCRIPTIONS,
            listen_backlog: Self::DEFAULT_LISTEN_BACKLOG,
            shutdown_timeout: Self::DEFAULT_SHUTDOWN_TIMEOUT,
            read_your_writes_wait_ms: Self::DEFAULT_READ_YOUR_WRITES_WAIT_MS,
            tls: None,
            rate_limit: None,
            persisted_queries: super::PersistedQueriesSpec::default(),
            serve_threads: 0,
        }
    }
}

impl Resolver {
    /// A setting in `low..=high`, reported at its line otherwise.
    fn server_setting(
        &mut self,
        at: &Option<Spanned<u64>>,
        key: &str,
        low: u64,
        high: u64,
        why_low: &str,
    ) -> Option<u64> {
        let at = at.as_ref()?;
        let v = *at.get_ref();
        if v < low {
            self.error(Some(at), format!("server.{key}"), why_low.to_owned());
            return None;
        }
        if v > high {
            self.error(Some(at), format!("server.{key}"), format!("at most {high}"));
            return None;
        }
        Some(v)
    }

    /// `[server]`, with defaults for what it leaves out (errors are reported and the defaults
    /// kept).
    pub(super) fn resolve_server(&mut self, s: &ServerConfig) -> ServerSpec {
        let mut spec = ServerSpec::default();
        let positive = "must be at least 1 (a timeout of 0 would close every connection)";
        for (at, key, target) in [
            (
                &s.header_read_timeout_ms,
                "header_read_timeout_ms",
                &mut spec.header_read_timeout,
            ),
            (
                &s.keep_alive_timeout_ms,
                "keep_alive_timeout_ms",
                &mut spec.keep_alive_timeout,
            ),
            (
                &s.body_read_timeout_ms,
                "body_read_timeout_ms",
                &mut spec.body_read_timeout,
            ),
            (
                &s.write_timeout_ms,
                "write_timeout_ms",
                &mut spec.write_timeout,
            ),
        ] {
            if let Some(ms) = self.server_setting(at, key, 1, MAX_TIMEOUT_MS, positive) {
                *target = Duration::from_millis(ms);
            }
        }
        if let Some(ms) = self.server_setting(
            &s.shutdown_timeout_ms,
            "shutdown_timeout_ms",
            0,
            MAX_TIMEOUT_MS,
            "",
        ) {
            spec.shutdown_timeout = Duration::from_millis(ms);
        }
        if let Some(ms) = self.server_setting(
            &s.read_your_writes_wait_ms,
            "read_your_writes_wait_ms",
            0,
            60_000,
            "",
        ) {
            spec.read_your_writes_wait_ms = ms;
        }
        if let Some(n) = self.server_setting(
            &s.max_connections,
            "max_connections",
            1,
            MAX_CONNECTIONS as u64,
            "must be at least 1",
        ) {
            spec.max_connections = Some(n as usize);
        }
        if let Some(n) = self.server_setting(
            &s.max_subscriptions,
            "max_subscriptions",
            1,
            MAX_SUBSCRIPTIONS,
            "must be at least 1 (0 would refuse every subscription)",
        ) {
            spec.max_subscriptions = n;
        }
        if let Some(n) = self.server_setting(
            &s.listen_backlog,
            "listen_backlog",
            1,
            65_535,
            "must be at least 1",
        ) {
            spec.listen_backlog = n as u32;
        }
        if let Some(tls) = &s.tls {
            spec.tls = self.resolve_tls(tls);
        }
        if let Some(limits) = &s.rate_limit {
            spec.rate_limit = self.resolve_rate_limit(limits);
        }
        if let Some(persisted) = &s.persisted_queries {
            spec.persisted_queries = self.resolve_persisted_queries(persisted);
        }
        spec
    }

    /// `[server.tls]`: both files present and holding a PEM certificate chain / private key.
    fn resolve_tls(&mut self, tls: &Spanned<TlsConfig>) -> Option<TlsSpec> {
        let t = tls.get_ref();
        let mut file = |at: &Option<Spanned<String>>, key: &str, what: &str| {
            let Some(at) = at else {
                self.error(
                    Some(tls),
                    format!("server.tls.{key}"),
                    format!("required in [server.tls]: the PEM file with the {what}"),
                );
                return None;
            };
            Some((at.clone(), self.path_of(at.get_ref())))
        };
        let cert = file(&t.cert, "cert", "certificate chain");
        let key = file(&t.key, "key", "private key");
        let mut ok = cert.is_some() && key.is_some();
        if let Some((at, path)) = &cert {
            if let Err(e) = read_cert_chain(path) {
                self.error(Some(at), "server.tls.cert", e);
                ok = false;
            }
        }
        if let Some((at, path)) = &key {
            if let Err(e) = read_private_key(path) {
                self.error(Some(at), "server.tls.key", e);
                ok = false;
            }
        }
        match (cert, key) {
            (Some((_, cert)), Some((_, key))) if ok => Some(TlsSpec { cert, key }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resolve::load_with_env;
    use crate::{ConfigErrors, ResolvedConfig};

    const ENTITY: &str = "[[entity]]\nname = \"thing\"\n[entity.rest]\n";

    fn load(server: &str) -> Result<ResolvedConfig, ConfigErrors> {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("meshql.toml");
        std::fs::write(&f, format!("port = 1\n{server}\n{ENTITY}")).unwrap();
        load_with_env(&f, |_| None)
    }

    #[test]
    fn defaults_without_a_server_section() {
        let c = load("").expect("valid");
        assert_eq!(c.server, ServerSpec::default());
        assert_eq!(c.server.header_read_timeout, Duration::from_secs(10));
        assert_eq!(c.server.keep_alive_timeout, Duration::from_secs(60));
        assert_eq!(c.server.body_read_timeout, Duration::from_secs(30));
        assert_eq!(c.server.write_timeout, Duration::from_secs(60));
        assert_eq!(c.server.max_connections, None);
        assert_eq!(c.server.max_subscriptions, 10_000);
        assert_eq!(c.server.listen_backlog, 4096);
        assert_eq!(c.server.shutdown_timeout, Duration::from_secs(10));
    }

    #[test]
    fn every_setting_is_read() {
        let c = load(
            "[server]\nheader_read_timeout_ms = 1000\nkeep_alive_timeout_ms = 2000\n\
             body_read_timeout_ms = 3000\nwrite_timeout_ms = 4000\nmax_connections = 20\nlisten_backlog = 64\n\
             shutdown_timeout_ms = 0\nmax_subscriptions = 3\n",
        )
        .expect("valid");
        assert_eq!(
            c.server,
            ServerSpec {
                header_read_timeout: Duration::from_secs(1),
                keep_alive_timeout: Duration::from_secs(2),
                body_read_timeout: Duration::from_secs(3),
                write_timeout: Duration::from_secs(4),
                max_connections: Some(20),
                max_subscriptions: 3,
                listen_backlog: 64,
                shutdown_timeout: Duration::ZERO,
                read_your_writes_wait_ms: 200,
                tls: None,
                rate_limit: None,
                persisted_queries: Default::default(),
                serve_threads: 0,
            }
        );
    }

    #[test]
    fn out_of_range_settings_name_the_line_and_field() {
        for (setting, field, message) in [
            (
                "header_read_timeout_ms = 0",
                "server.header_read_timeout_ms",
                "at least 1",
            ),
            (
                "keep_alive_timeout_ms = 0",
                "server.keep_alive_timeout_ms",
                "at least 1",
            ),
            (
                "body_read_timeout_ms = 0",
                "server.body_read_timeout_ms",
                "at least 1",
            ),
            (
                "write_timeout_ms = 0",
                "server.write_timeout_ms",
                "at least 1",
            ),
            (
                "read_your_writes_wait_ms = 60001",
                "server.read_your_writes_wait_ms",
                "at most 60000",
            ),
            (
                "shutdown_timeout_ms = 86400001",
                "server.shutdown_timeout_ms",
                "at most 86400000",
            ),
            (
                "max_connections = 0",
                "server.max_connections",
                "at least 1",
            ),
            (
                "max_connections = 1000001",
                "server.max_connections",
                "at most 1000000",
            ),
            (
                "max_subscriptions = 0",
                "server.max_subscriptions",
                "at least 1",
            ),
            (
                "max_subscriptions = 1000001",
                "server.max_subscriptions",
                "at most 1000000",
            ),
            (
                "listen_backlog = 70000",
                "server.listen_backlog",
                "at most 65535",
            ),
        ] {
            let errors = load(&format!("[server]\n{setting}\n"))
                .expect_err(setting)
                .0;
            assert_eq!(errors.len(), 1, "{setting}: {errors:?}");
            let e = &errors[0];
            assert_eq!(e.field, field, "{setting}");
            assert_eq!(e.line, Some(3), "{setting}");
            assert!(e.message.contains(message), "{setting}: {}", e.message);
            assert!(e.file.ends_with("meshql.toml"));
        }
        let e = load("[server]\nheader_timeout = 5\n")
            .expect_err("unknown key")
            .0;
        assert_eq!(e[0].line, Some(3), "{e:?}");
        assert!(e[0].message.contains("unknown field"), "{e:?}");
        let e = load("[server]\nmax_connections = -1\n")
            .expect_err("negative")
            .0;
        assert_eq!(e[0].line, Some(3), "{e:?}");
        assert_eq!(e[0].field, "server.max_connections", "{e:?}");
        let e = load("[server]\nmax_subscriptions = -1\n")
            .expect_err("negative")
            .0;
        assert_eq!(e[0].line, Some(3), "{e:?}");
        assert_eq!(e[0].field, "server.max_subscriptions", "{e:?}");
        // the largest accepted
        let c = load("[server]\nmax_subscriptions = 1000000\n").expect("valid");
        assert_eq!(c.server.max_subscriptions, 1_000_000);
    }

    /// A config with `[server.tls]` (`tls` is the table's body) next to the given files.
    fn load_tls(tls: &str, files: &[(&str, &str)]) -> Result<ResolvedConfig, ConfigErrors> {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        let f = dir.path().join("meshql.toml");
        std::fs::write(&f, format!("port = 1\n[server.tls]\n{tls}\n{ENTITY}")).unwrap();
        load_with_env(&f, |_| None)
    }

    const CERT: &str = "-----BEGIN CERTIFICATE-----\nAAECAw==\n-----END CERTIFICATE-----\n";
    const KEY: &str = "-----BEGIN PRIVATE KEY-----\nAAECAw==\n-----END PRIVATE KEY-----\n";

    #[test]
    fn tls_files_resolve_against_the_config_directory() {
        let c = load_tls(
            "cert = \"cert.pem\"\nkey = \"key.pem\"",
            &[("cert.pem", CERT), ("key.pem", KEY)],
        )
        .expect("valid");
        let tls = c.server.tls.expect("tls");
        assert!(tls.cert.ends_with("cert.pem"));
        assert!(tls.key.ends_with("key.pem"));
        assert_eq!(c.server.header_read_timeout, Duration::from_secs(10));
    }

    #[test]
    fn tls_errors_name_the_line_and_field() {
        // key missing: reported at the table
        let e = load_tls("cert = \"cert.pem\"", &[("cert.pem", CERT)])
            .expect_err("no key")
            .0;
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!(e[0].field, "server.tls.key");
        assert!(e[0].message.contains("required"), "{e:?}");
        assert!(e[0].line.is_some(), "{e:?}");
        // a file that is not there
        let e = load_tls(
            "cert = \"cert.pem\"\nkey = \"nope.pem\"",
            &[("cert.pem", CERT)],
        )
        .expect_err("missing file")
        .0;
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!(
            (e[0].field.as_str(), e[0].line),
            ("server.tls.key", Some(4))
        );
        assert!(e[0].message.contains("cannot read"), "{e:?}");
        // garbage: no PEM section at all, a malformed one, a key where the cert should be
        for (cert, key, field, message) in [
            ("hello", KEY, "server.tls.cert", "no PEM CERTIFICATE"),
            (CERT, "garbage\n", "server.tls.key", "no PEM PRIVATE KEY"),
            (
                CERT,
                "-----BEGIN PRIVATE KEY-----\n!!!\n-----END PRIVATE KEY-----\n",
                "server.tls.key",
                "invalid PEM",
            ),
            (KEY, KEY, "server.tls.cert", "no PEM CERTIFICATE"),
            (CERT, CERT, "server.tls.key", "no PEM PRIVATE KEY"),
        ] {
            let e = load_tls(
                "cert = \"cert.pem\"\nkey = \"key.pem\"",
                &[("cert.pem", cert), ("key.pem", key)],
            )
            .expect_err(message)
            .0;
            assert_eq!(e.len(), 1, "{e:?}");
            assert_eq!(e[0].field, field, "{e:?}");
            let line = if field.ends_with("cert") { 3 } else { 4 };
            assert_eq!(e[0].line, Some(line), "{e:?}");
            assert!(e[0].message.contains(message), "{message}: {e:?}");
        }
        let e = load_tls("cert = \"c\"\nkey = \"k\"\nca = \"x\"", &[])
            .expect_err("unknown field")
            .0;
        assert!(e[0].message.contains("unknown field"), "{e:?}");
    }
}
