//! TLS to PostgreSQL: libpq's `sslmode` and `sslrootcert` connection parameters on top of
//! tokio-postgres (which knows `disable`, `prefer` and `require` only, and nothing of
//! certificates), with rustls and the ring provider.
//!
//! | `sslmode` | TLS | certificate checked |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` (default, as libpq) | when the server offers it; plain when it does not or the handshake fails | no |
//! | `require` | always | no; the chain when `sslrootcert` is given (as libpq) |
//! | `verify-ca` | always | chain up to `sslrootcert` |
//! | `verify-full` | always | chain, and the host name (or IP address) in the URL |
//!
//! `sslrootcert` is a PEM file of one or more CA certificates, or `system` for the Mozilla
//! root set compiled in (webpki-roots). Without it, `verify-ca`/`verify-full` use
//! `~/.postgresql/root.crt` as libpq does, and are a configuration error when that does not
//! exist. Both parameters are taken out of the URL before tokio-postgres reads the rest.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use tokio_postgres::config::SslMode as PgSslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

/// libpq's `sslmode` values (`allow` is not offered: tokio-postgres cannot start plain and
/// retry with TLS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<Self, String> {
        Ok(match value {
            "disable" => Self::Disable,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            "allow" => {
                return Err(
                    "sslmode=allow is not supported (the driver cannot connect plain first \
                     and retry with TLS): use prefer or disable"
                        .into(),
                )
            }
            other => {
                return Err(format!(
                "sslmode={other:?} is not one of disable, prefer, require, verify-ca, verify-full"
            ))
            }
        })
    }
}

/// Where trusted CA certificates come from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Roots {
    File(PathBuf),
    /// The Mozilla root set compiled in.
    System,
}

/// A connection URL read: tokio-postgres's configuration and what TLS it asks for.
pub struct Connection {
    pub config: tokio_postgres::Config,
    pub mode: SslMode,
    pub tls: MakeRustlsConnect,
    /// The rustls client behind `tls`, for a client that makes its own TLS sessions (the
    /// replication connection of the `postgres_cdc` source).
    pub rustls: Arc<ClientConfig>,
}

/// Reads a URL (`postgres://…?sslmode=…&sslrootcert=…`, or libpq's `key=value` form), loads
/// the CA file it names and builds the TLS client. Every error is a sentence fit for
/// `meshql check`.
pub fn read_url(url: &str) -> Result<Connection, String> {
    let (rest, params) = split_tls_params(url)?;
    let mut mode = SslMode::Prefer;
    let mut rootcert = None;
    for (key, value) in params {
        match key.as_str() {
            "sslmode" => mode = SslMode::parse(&value)?,
            "sslrootcert" => rootcert = Some(value),
            _ => {
                return Err(format!(
                    "`{key}` is not supported (client certificates and revocation lists are not \
                     offered); TLS parameters meshql reads: sslmode, sslrootcert"
                ))
            }
        }
    }
    let mut config = tokio_postgres::Config::from_str(&rest).map_err(|e| {
        match std::error::Error::source(&e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        }
    })?;
    config.ssl_mode(match mode {
        SslMode::Disable => PgSslMode::Disable,
        SslMode::Prefer => PgSslMode::Prefer,
        _ => PgSslMode::Require,
    });
    let roots = match rootcert.as_deref() {
        Some("system") => Some(Roots::System),
        Some("") => return Err("sslrootcert is empty".into()),
        Some(path) => Some(Roots::File(PathBuf::from(path))),
        None if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) => {
            let default = std::env::var_os("HOME")
                .map(|h| PathBuf::from(h).join(".postgresql/root.crt"))
                .filter(|p| p.is_file());
            match default {
                Some(p) => Some(Roots::File(p)),
                None => {
                    return Err(format!(
                        "sslmode={} needs the CA to trust: add sslrootcert=<PEM file> (or \
                         sslrootcert=system for the public roots); ~/.postgresql/root.crt, \
                         libpq's default, does not exist",
                        if mode == SslMode::VerifyCa {
                            "verify-ca"
                        } else {
                            "verify-full"
                        }
                    ))
                }
            }
        }
        None => None,
    };
    // require with a CA file checks the chain, as libpq does
    let mode_for_certs = match (mode, &roots) {
        (SslMode::Require, Some(_)) => SslMode::VerifyCa,
        (m, _) => m,
    };
    let client = client_config(mode_for_certs, roots.as_ref())?;
    Ok(Connection {
        config,
        mode,
        tls: MakeRustlsConnect::new(client.clone()),
        rustls: Arc::new(client),
    })
}

/// The URL without `sslmode`/`sslrootcert` (and other `ssl*` keys, returned so that they can be
/// refused by name), and those parameters, decoded.
fn split_tls_params(url: &str) -> Result<(String, Vec<(String, String)>), String> {
    let ours = |k: &str| k.starts_with("ssl") && k != "sslnegotiation";
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let Some((base, query)) = url.split_once('?') else {
            return Ok((url.to_owned(), Vec::new()));
        };
        let mut kept = Vec::new();
        let mut taken = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let key = meshql_core::backend::percent_decode(k)?;
            if ours(&key) {
                taken.push((key, meshql_core::backend::percent_decode(v)?));
            } else {
                kept.push(pair);
            }
        }
        let rest = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        Ok((rest, taken))
    } else {
        // key=value pairs separated by blanks; values may be single-quoted with \ escapes
        let mut kept = String::new();
        let mut taken = Vec::new();
        let mut chars = url.char_indices().peekable();
        loop {
            while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
            let Some(&(start, _)) = chars.peek() else {
                break;
            };
            let mut key = String::new();
            while let Some((_, c)) = chars.next_if(|(_, c)| *c != '=' && !c.is_whitespace()) {
                key.push(c);
            }
            while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
            if chars.next_if(|(_, c)| *c == '=').is_none() {
                return Err(format!("`{key}` has no value (expected key=value)"));
            }
            while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
            let mut value = String::new();
            if chars.next_if(|(_, c)| *c == '\'').is_some() {
                loop {
                    match chars.next() {
                        Some((_, '\'')) => break,
                        Some((_, '\\')) => match chars.next() {
                            Some((_, c)) => value.push(c),
                            None => return Err("unterminated quoted value".into()),
                        },
                        Some((_, c)) => value.push(c),
                        None => return Err("unterminated quoted value".into()),
                    }
                }
            } else {
                while let Some((_, c)) = chars.next_if(|(_, c)| !c.is_whitespace()) {
                    if c == '\\' {
                        if let Some((_, c)) = chars.next() {
                            value.push(c);
                        }
                    } else {
                        value.push(c);
                    }
                }
            }
            let end = chars.peek().map(|(i, _)| *i).unwrap_or(url.len());
            if ours(&key) {
                taken.push((key, value));
            } else {
                kept.push_str(&url[start..end]);
                kept.push(' ');
            }
        }
        Ok((kept.trim_end().to_owned(), taken))
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn load_roots(roots: &Roots) -> Result<RootCertStore, String> {
    let mut store = RootCertStore::empty();
    match roots {
        Roots::System => store.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        Roots::File(path) => {
            let shown = path.display();
            let pem = std::fs::read(path)
                .map_err(|e| format!("sslrootcert {shown} cannot be read: {e}"))?;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert =
                    cert.map_err(|e| format!("sslrootcert {shown} is not valid PEM: {e}"))?;
                store
                    .add(cert)
                    .map_err(|e| format!("sslrootcert {shown}: a certificate is unusable: {e}"))?;
            }
            if store.is_empty() {
                return Err(format!("sslrootcert {shown} holds no CERTIFICATE"));
            }
        }
    }
    Ok(store)
}

fn client_config(mode: SslMode, roots: Option<&Roots>) -> Result<ClientConfig, String> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let config = match (mode, roots) {
        (SslMode::VerifyFull, Some(roots)) => builder
            .with_root_certificates(load_roots(roots)?)
            .with_no_client_auth(),
        (SslMode::VerifyCa, Some(roots)) => {
            let inner =
                WebPkiServerVerifier::builder_with_provider(Arc::new(load_roots(roots)?), provider)
                    .build()
                    .map_err(|e| e.to_string())?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(ChainOnly(inner)))
                .with_no_client_auth()
        }
        // disable (never used), prefer and require: encrypted, the certificate unchecked
        _ => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unchecked(provider)))
            .with_no_client_auth(),
    };
    Ok(config)
}

/// `prefer` / `require`: any certificate, but the handshake's signatures are still checked
/// (the session is encrypted to whoever holds the certificate's key).
#[derive(Debug)]
struct Unchecked(Arc<CryptoProvider>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a trusted CA; the name is not compared (webpki checks
/// the chain first, so a name mismatch is only reported for a chain that verified).
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// Whether a connection error came from the TLS layer (a handshake failure, a certificate
/// refused) rather than from the network or the server.
pub fn tls_failure(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    meshql_core::error::cause_of::<rustls::Error>(e).map(ToString::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_parameters_are_taken_out_of_urls() {
        let (rest, taken) = split_tls_params(
            "postgres://u:p@h:5/db?application_name=x&sslmode=verify-full&sslrootcert=%2Ftmp%2Fca.pem",
        )
        .unwrap();
        assert_eq!(rest, "postgres://u:p@h:5/db?application_name=x");
        assert_eq!(
            taken,
            vec![
                ("sslmode".to_owned(), "verify-full".to_owned()),
                ("sslrootcert".to_owned(), "/tmp/ca.pem".to_owned())
            ]
        );
        let (rest, taken) =
            split_tls_params("host=h port=5 sslmode=require sslrootcert='/a b/ca.pem' user=u")
                .unwrap();
        assert_eq!(rest, "host=h port=5 user=u");
        assert_eq!(taken[1].1, "/a b/ca.pem");
        let (rest, taken) = split_tls_params("postgres://h/db").unwrap();
        assert_eq!(rest, "postgres://h/db");
        assert!(taken.is_empty());
    }

    #[test]
    fn modes_and_their_errors() {
        let c = read_url("postgres://h/db").unwrap();
        assert_eq!(c.mode, SslMode::Prefer);
        assert_eq!(c.config.get_ssl_mode(), PgSslMode::Prefer);
        let c = read_url("postgres://h/db?sslmode=disable").unwrap();
        assert_eq!(c.config.get_ssl_mode(), PgSslMode::Disable);
        let c = read_url("postgres://h/db?sslmode=verify-full&sslrootcert=system").unwrap();
        assert_eq!(c.config.get_ssl_mode(), PgSslMode::Require);
        for (url, expected) in [
            ("postgres://h/db?sslmode=bogus", "is not one of"),
            ("postgres://h/db?sslmode=allow", "allow is not supported"),
            ("postgres://h/db?sslcert=/x", "`sslcert` is not supported"),
            (
                "postgres://h/db?sslmode=require&sslrootcert=/nonexistent/ca.pem",
                "cannot be read",
            ),
            ("postgres://h/db?bogus=1", "unknown option"),
        ] {
            let e = read_url(url)
                .err()
                .unwrap_or_else(|| panic!("{url} accepted"));
            assert!(e.contains(expected), "{url}: {e}");
        }
    }
}
