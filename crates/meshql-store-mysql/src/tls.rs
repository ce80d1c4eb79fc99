//! TLS to MySQL / MariaDB: the `ssl-mode` and `ssl-ca` URL parameters (named after the
//! `mysql` client's options), mapped onto mysql_async's rustls support (ring provider).
//!
//! | `ssl-mode` | TLS | certificate checked |
//! |---|---|---|
//! | `DISABLED` (default: as today, and as mysql_async and MariaDB's client) | never | — |
//! | `PREFERRED` | when the server offers it | no |
//! | `REQUIRED` | always | no; the chain when `ssl-ca` is given |
//! | `VERIFY_CA` | always | chain up to `ssl-ca` (or the Mozilla roots without it); the name too, see below |
//! | `VERIFY_IDENTITY` | always | chain, and the host name (or IP address) in the URL |
//!
//! Values are case-insensitive. `ssl-ca` alone means `VERIFY_CA`. mysql_async's own
//! parameters (`require_ssl`, `verify_ca`, `verify_identity`, `built_in_roots`) still work,
//! but not together with `ssl-mode`. With TLS asked for, connections stay on TCP (mysql_async
//! otherwise moves a connection to 127.0.0.1 onto the server's Unix socket, where there is no
//! TLS).
//!
//! `VERIFY_CA` should leave the name unchecked, but mysql_async 0.37.1 recognises a name
//! mismatch by the text `NotValidForName` in rustls's error, which rustls 0.23.x (its
//! `NotValidForNameContext`) no longer prints: the name is checked as with `VERIFY_IDENTITY`
//! (tests/tls.rs notices when that changes).

use mysql_async::{Opts, OptsBuilder, SslOpts};
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disabled,
    Preferred,
    Required,
    VerifyCa,
    VerifyIdentity,
}

impl SslMode {
    fn parse(value: &str) -> Result<Self, String> {
        Ok(
            match value.to_ascii_uppercase().replace('-', "_").as_str() {
                "DISABLED" => Self::Disabled,
                "PREFERRED" => Self::Preferred,
                "REQUIRED" => Self::Required,
                "VERIFY_CA" => Self::VerifyCa,
                "VERIFY_IDENTITY" => Self::VerifyIdentity,
                _ => {
                    return Err(format!(
                    "ssl-mode={value:?} is not one of DISABLED, PREFERRED, REQUIRED, VERIFY_CA, \
                     VERIFY_IDENTITY"
                ))
                }
            },
        )
    }
}

/// A URL read: mysql_async's options (TLS set as asked) and the mode, for `PREFERRED`'s
/// fallback.
pub(crate) struct Connection {
    pub opts: Opts,
    pub mode: SslMode,
}

const DRIVER_TLS_PARAMS: [&str; 4] = [
    "require_ssl",
    "verify_ca",
    "verify_identity",
    "built_in_roots",
];

/// Reads `mysql://…?ssl-mode=…&ssl-ca=…`; every error is a sentence for `meshql check`.
pub(crate) fn read_url(url: &str) -> Result<Connection, String> {
    let (rest, params) = split_tls_params(url)?;
    let mut mode = None;
    let mut ca = None;
    for (key, value) in params {
        match key.as_str() {
            "ssl-mode" | "ssl_mode" | "sslmode" => mode = Some(SslMode::parse(&value)?),
            "ssl-ca" | "ssl_ca" => {
                if value.is_empty() {
                    return Err("ssl-ca is empty".into());
                }
                ca = Some(PathBuf::from(value));
            }
            other => {
                return Err(format!(
                    "`{other}` is not supported (client certificates are not offered); TLS \
                     parameters meshql reads: ssl-mode, ssl-ca"
                ))
            }
        }
    }
    let opts = Opts::from_url(&rest).map_err(|e| e.to_string())?;
    let driver_params = rest
        .split_once('?')
        .map(|(_, q)| {
            q.split('&')
                .any(|p| DRIVER_TLS_PARAMS.contains(&p.split('=').next().unwrap_or("")))
        })
        .unwrap_or(false);
    if driver_params && (mode.is_some() || ca.is_some()) {
        return Err(format!(
            "ssl-mode/ssl-ca and mysql_async's own {} cannot be mixed: use one or the other",
            DRIVER_TLS_PARAMS.join("/")
        ));
    }
    if driver_params {
        // the driver's own parameters, as it reads them
        let tls = opts.ssl_opts().is_some();
        let opts = OptsBuilder::from_opts(opts).prefer_socket(!tls);
        let mode = if tls {
            SslMode::Required
        } else {
            SslMode::Disabled
        };
        return Ok(Connection {
            opts: opts.into(),
            mode,
        });
    }
    let mode = match (mode, &ca) {
        (None, Some(_)) | (Some(SslMode::Required), Some(_)) => SslMode::VerifyCa,
        (None, None) => SslMode::Disabled,
        (Some(m), _) => m,
    };
    if let Some(ca) = &ca {
        check_ca(ca)?;
    }
    let ssl = match mode {
        SslMode::Disabled => None,
        SslMode::Preferred | SslMode::Required => {
            Some(SslOpts::default().with_danger_accept_invalid_certs(true))
        }
        SslMode::VerifyCa | SslMode::VerifyIdentity => {
            let mut ssl =
                SslOpts::default().with_danger_skip_domain_validation(mode == SslMode::VerifyCa);
            if let Some(ca) = &ca {
                ssl = ssl
                    .with_root_certs(vec![ca.clone().into()])
                    .with_disable_built_in_roots(true);
            }
            Some(ssl)
        }
    };
    let prefer_socket = ssl.is_none() && opts.prefer_socket();
    let opts = OptsBuilder::from_opts(opts)
        .ssl_opts(ssl)
        .prefer_socket(prefer_socket);
    Ok(Connection {
        opts: opts.into(),
        mode,
    })
}

/// The CA file must be readable PEM with at least one certificate (the driver would only find
/// out at the first connection).
fn check_ca(path: &std::path::Path) -> Result<(), String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;
    let shown = path.display();
    let pem = std::fs::read(path).map_err(|e| format!("ssl-ca {shown} cannot be read: {e}"))?;
    let mut n = 0;
    for cert in CertificateDer::pem_slice_iter(&pem) {
        cert.map_err(|e| format!("ssl-ca {shown} is not valid PEM: {e}"))?;
        n += 1;
    }
    if n == 0 {
        return Err(format!("ssl-ca {shown} holds no CERTIFICATE"));
    }
    Ok(())
}

/// The URL without the `ssl-*`/`ssl_*` parameters, and those, percent-decoded.
fn split_tls_params(url: &str) -> Result<(String, Vec<(String, String)>), String> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), Vec::new()));
    };
    let mut kept = Vec::new();
    let mut taken = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let key = meshql_core::backend::percent_decode(k)?;
        if key.starts_with("ssl") {
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
}

/// Whether a connection error means the server has no TLS (what `PREFERRED` falls back on).
pub(crate) fn server_lacks_tls(e: &mysql_async::Error) -> bool {
    matches!(
        e,
        mysql_async::Error::Driver(mysql_async::DriverError::NoClientSslFlagFromServer)
    )
}

/// Whether a connection error came from TLS (a handshake failure, a refused certificate):
/// its reason when so.
pub(crate) fn tls_failure(e: &mysql_async::Error) -> Option<String> {
    meshql_core::error::cause_of::<rustls::Error>(e).map(ToString::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_and_their_errors() {
        let c = read_url("mysql://u:p@h:1/db").unwrap();
        assert_eq!(c.mode, SslMode::Disabled);
        assert!(c.opts.ssl_opts().is_none());
        let c = read_url("mysql://u:p@h:1/db?ssl-mode=required").unwrap();
        assert_eq!(c.mode, SslMode::Required);
        assert!(c.opts.ssl_opts().unwrap().accept_invalid_certs());
        assert!(!c.opts.prefer_socket());
        let c = read_url("mysql://u:p@h:1/db?ssl-mode=VERIFY_IDENTITY").unwrap();
        let ssl = c.opts.ssl_opts().unwrap();
        assert!(!ssl.accept_invalid_certs() && !ssl.skip_domain_validation());
        let c = read_url("mysql://u:p@h:1/db?require_ssl=true&verify_ca=false").unwrap();
        assert_eq!(c.mode, SslMode::Required);
        for (url, expected) in [
            ("mysql://h/db?ssl-mode=SOMETIMES", "is not one of"),
            ("mysql://h/db?ssl-cert=/x", "`ssl-cert` is not supported"),
            ("mysql://h/db?ssl-ca=/nonexistent/ca.pem", "cannot be read"),
            (
                "mysql://h/db?ssl-mode=REQUIRED&require_ssl=true",
                "cannot be mixed",
            ),
            ("mysql://h/db?bogus=1", "bogus"),
        ] {
            let e = read_url(url)
                .err()
                .unwrap_or_else(|| panic!("{url} accepted"));
            assert!(e.contains(expected), "{url}: {e}");
        }
    }
}
