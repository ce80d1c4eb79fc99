//! `[storage.<name>] type = "mongo"`: the block's fields and their registration.

use crate::{MongoDatabase, MongoOptions};
use async_trait::async_trait;
use meshql_core::{
    parse_settings, BackendContext, DynDatabase, SettingError, StorageBackend, StorageTarget,
    StoreError,
};
use schemars::JsonSchema;
use serde::Deserialize;
use std::time::Duration;

/// MongoDB (or FerretDB): one collection per entity, one document per version. URI options
/// (`replicaSet`, `readPreference`, `maxPoolSize`, `tls`, `tlsCAFile`, ...) are honoured.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MongoSettings {
    /// `mongodb://host:port/?replicaSet=rs0`. TLS: `tls=true`, `tlsCAFile=<PEM file>`,
    /// `tlsCertificateKeyFile`, `tlsAllowInvalidCertificates`, `tlsInsecure` (the driver's, with
    /// rustls); `mongodb+srv://` turns TLS on by default.
    pub uri: String,
    /// Database name.
    pub db: String,
    /// Operations in flight at once (and the driver's `maxPoolSize`); the URI's
    /// `maxPoolSize` when absent, else 16.
    #[serde(default)]
    pub pool_size: Option<usize>,
    /// How long a request waits for a free connection before answering 503.
    #[serde(default = "default_pool_wait_ms")]
    pub pool_wait_ms: u64,
}

fn default_pool_wait_ms() -> u64 {
    5_000
}

/// Registers MongoDB with a backend registry.
#[derive(Debug, Default, Clone, Copy)]
pub struct MongoBackend;

impl StorageBackend for MongoBackend {
    fn kind(&self) -> &'static str {
        "mongo"
    }

    fn schema(&self) -> serde_json::Value {
        serde_json::to_value(schemars::schema_for!(MongoSettings)).expect("schemas serialise")
    }

    fn configure(
        &self,
        settings: &serde_json::Value,
        _context: &BackendContext<'_>,
    ) -> Result<Box<dyn StorageTarget>, SettingError> {
        let s: MongoSettings = parse_settings(settings)?;
        if s.pool_size == Some(0) {
            return Err(SettingError::new(
                "pool_size",
                "must be at least 1 (the connections a request can wait for)",
            ));
        }
        check_uri(&s.uri).map_err(|e| SettingError::new("uri", e))?;
        let mut options = MongoOptions::new(s.uri, s.db);
        options.pool_size = s.pool_size;
        options.pool_wait = Duration::from_millis(s.pool_wait_ms);
        Ok(Box::new(MongoTarget(options)))
    }
}

/// The URI as the driver reads it (unknown options, bad values, TLS options that contradict
/// each other), and the TLS files it names: readable PEM, which the driver would only find out
/// at the first connection.
fn check_uri(uri: &str) -> Result<(), String> {
    use mongodb::options::{ConnectionString, Tls};
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;
    let parsed = ConnectionString::parse(uri).map_err(|e| match *e.kind {
        mongodb::error::ErrorKind::InvalidArgument { message, .. } => message,
        _ => e.to_string(),
    })?;
    if let Some(Tls::Enabled(tls)) = &parsed.tls {
        for (option, path) in [
            ("tlsCAFile", &tls.ca_file_path),
            ("tlsCertificateKeyFile", &tls.cert_key_file_path),
        ] {
            let Some(path) = path else { continue };
            let shown = path.display();
            let pem =
                std::fs::read(path).map_err(|e| format!("{option} {shown} cannot be read: {e}"))?;
            let mut certs = 0;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                cert.map_err(|e| format!("{option} {shown} is not valid PEM: {e}"))?;
                certs += 1;
            }
            if certs == 0 {
                return Err(format!("{option} {shown} holds no CERTIFICATE"));
            }
        }
    }
    Ok(())
}

#[derive(Debug)]
struct MongoTarget(MongoOptions);

#[async_trait]
impl StorageTarget for MongoTarget {
    fn target(&self) -> String {
        format!("mongo:{} {}", self.0.uri, self.0.database)
    }

    fn sql_templates(&self) -> bool {
        false
    }

    async fn open(&self) -> Result<DynDatabase, StoreError> {
        Ok(MongoDatabase::connect(&self.0).await?)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn uris_are_checked_with_their_tls_files() {
        assert!(super::check_uri("mongodb://h:1/").is_ok());
        assert!(
            super::check_uri("mongodb://h:1/?tls=true&tlsAllowInvalidCertificates=true").is_ok()
        );
        for (uri, expected) in [
            ("mongodb://h:1/?tls=maybe", "tls"),
            ("mongodb://h:1/?tlz=true", "tlz is an invalid option"),
            (
                "mongodb://h:1/?tls=true&tlsAllowInvalidHostnames=true",
                "tlsallowinvalidhostnames is an invalid option",
            ),
            (
                "mongodb://h:1/?tls=true&tlsCAFile=/nonexistent/ca.pem",
                "tlsCAFile /nonexistent/ca.pem cannot be read",
            ),
            ("mongodb://h:1/?tls=false&tlsCAFile=/x.pem", "tls=false"),
            ("http://h:1/", "scheme"),
        ] {
            let e = super::check_uri(uri)
                .err()
                .unwrap_or_else(|| panic!("{uri} accepted"));
            assert!(e.contains(expected), "{uri}: {e}");
        }
    }
}
