//! `[storage.<name>] type = "mongo"`: the block's fields and their registration.

use crate::{MongoDatabase, MongoOptions};
use async_trait::async_trait;
use meshql_core::{
    BackendContext, Component, DynDatabase, SettingError, Storage, StorageTarget, StoreError,
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
    /// A second URI (same form and TLS options as `uri`) for the API's reads (REST GETs,
    /// GraphQL): a replica set's secondaries, say. It reads the same `db`; without a
    /// `readPreference` of its own it reads with `secondaryPreferred`. Writes, and the reads a
    /// write depends on, stay on `uri`. Absent: every read goes to `uri`.
    #[serde(default)]
    pub read_url: Option<String>,
    /// With `read_url`: reads go to `uri` while the `read_url` is further behind than this
    /// (and while it is unreachable, or its permits are all taken). MongoDB's lag is not
    /// measured (that needs `replSetGetStatus`, an admin command FerretDB lacks): only
    /// reachability and saturation move reads, so this has no effect yet; on a replica set,
    /// `maxStalenessSeconds` in the `read_url` bounds the lag of the secondaries read.
    #[serde(default = "meshql_core::replica::default_max_lag_ms")]
    pub read_max_lag_ms: u64,
    /// With `read_url`: how often the `read_url`'s reachability is measured (a ping).
    #[serde(default = "meshql_core::replica::default_probe_ms")]
    pub read_probe_ms: u64,
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

impl Component<Storage> for MongoBackend {
    const KIND: &'static str = "mongo";
    type Settings = MongoSettings;

    fn build(
        &self,
        s: MongoSettings,
        _context: &BackendContext<'_>,
    ) -> Result<Box<dyn StorageTarget>, SettingError> {
        Ok(Box::new(MongoTarget(options(s)?)))
    }
}

/// The options a block's settings give, once checked.
fn options(s: MongoSettings) -> Result<MongoOptions, SettingError> {
    if s.pool_size == Some(0) {
        return Err(SettingError::new(
            "pool_size",
            "must be at least 1 (the connections a request can wait for)",
        ));
    }
    check_uri(&s.uri).map_err(|e| SettingError::new("uri", e))?;
    if let Some(read_url) = &s.read_url {
        check_uri(read_url).map_err(|e| SettingError::new("read_url", e))?;
    }
    let mut options = MongoOptions::new(s.uri, s.db);
    options.read_url = s.read_url;
    options.replica =
        meshql_core::replica::ReplicaSettings::from_block(s.read_max_lag_ms, s.read_probe_ms)?;
    options.pool_size = s.pool_size;
    options.pool_wait = Duration::from_millis(s.pool_wait_ms);
    Ok(options)
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
        let target = format!("mongo:{} {}", self.0.uri, self.0.database);
        match &self.0.read_url {
            // blocks reading elsewhere are databases of their own
            Some(read_url) => format!("{target} read:{read_url}"),
            None => target,
        }
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
    use meshql_core::registry::Part;
    use meshql_core::{BackendContext, Storage};
    use serde_json::json;

    fn options(v: &serde_json::Value) -> Result<super::MongoOptions, meshql_core::SettingError> {
        super::options(meshql_core::parse_settings(v)?)
    }

    fn configure(settings: serde_json::Value) -> Result<String, meshql_core::SettingError> {
        let context = BackendContext {
            block: "default",
            data_dir: std::path::Path::new("/tmp"),
        };
        Part::<Storage>::configure(&super::MongoBackend, &settings, &context)
            .map(|target| target.target())
    }

    #[test]
    fn read_url_is_checked_like_uri_and_named_in_its_errors() {
        let uri = "mongodb://h:1/";
        let plain = configure(json!({"uri": uri, "db": "d"})).unwrap();
        let split = configure(json!({"uri": uri, "db": "d", "read_url": "mongodb://r:2/"}))
            .expect("a good read_url");
        assert_ne!(plain, split, "a read_url makes a storage target of its own");
        for (read_url, expected) in [
            ("http://r:2/", "scheme"),
            (
                "mongodb://r:2/?readPreference=sometimes",
                "not a valid read preference",
            ),
            (
                "mongodb://r:2/?tls=true&tlsCAFile=/nonexistent/ca.pem",
                "tlsCAFile /nonexistent/ca.pem cannot be read",
            ),
        ] {
            let e = configure(json!({"uri": uri, "db": "d", "read_url": read_url}))
                .expect_err(read_url);
            assert_eq!(e.field.as_deref(), Some("read_url"), "{read_url}: {e}");
            assert!(
                e.message.to_lowercase().contains(&expected.to_lowercase()),
                "{read_url}: {e}"
            );
        }
        let e = configure(json!({"uri": uri, "db": "d", "read_url": 7})).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("read_url"), "{e}");
    }

    #[test]
    fn the_replica_bounds_default_to_the_engine_s_and_are_read() {
        use meshql_core::replica::ReplicaSettings;
        use std::time::Duration;
        let base = json!({"uri": "mongodb://h:1/", "db": "d", "read_url": "mongodb://r:2/"});
        // the bound on a secondary's lag the docs point to instead
        super::check_uri("mongodb://r:2/?readPreference=secondaryPreferred&maxStalenessSeconds=90")
            .expect("maxStalenessSeconds");
        let o = options(&base).unwrap();
        assert_eq!(o.replica, ReplicaSettings::default());
        assert_eq!(o.replica.max_lag, Duration::from_millis(1000));
        assert_eq!(o.replica.probe_every, Duration::from_millis(250));
        let mut custom = base.clone();
        custom["read_max_lag_ms"] = json!(5000);
        custom["read_probe_ms"] = json!(10);
        assert_eq!(
            options(&custom).unwrap().replica,
            ReplicaSettings {
                max_lag: Duration::from_secs(5),
                probe_every: Duration::from_millis(10),
            }
        );
        for bad in [0, 9] {
            let mut settings = base.clone();
            settings["read_probe_ms"] = json!(bad);
            let e = options(&settings).unwrap_err();
            assert_eq!(e.field.as_deref(), Some("read_probe_ms"), "{e}");
            assert!(e.message.contains("at least 10"), "{e}");
        }
        for (field, value) in [
            ("read_probe_ms", json!(-1)),
            ("read_max_lag_ms", json!("1s")),
        ] {
            let mut settings = base.clone();
            settings[field] = value;
            let e = options(&settings).unwrap_err();
            assert_eq!(e.field.as_deref(), Some(field), "{e}");
        }
    }

    #[test]
    fn the_schema_lists_read_url() {
        let schema = Part::<Storage>::schema(&super::MongoBackend);
        let text = schema.to_string();
        assert!(text.contains("\"read_url\""), "{text}");
        assert!(text.contains("secondaryPreferred"), "{text}");
        let properties = &schema["properties"];
        for field in ["read_max_lag_ms", "read_probe_ms"] {
            let description = properties[field]["description"]
                .as_str()
                .unwrap_or_default();
            assert!(description.contains("read_url"), "{field}: {schema}");
        }
        let lag = properties["read_max_lag_ms"]["description"]
            .as_str()
            .unwrap();
        let lag = lag.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(lag.contains("lag is not measured"), "{lag}");
        assert_eq!(properties["read_max_lag_ms"]["default"], json!(1000));
        assert_eq!(properties["read_probe_ms"]["default"], json!(250));
    }

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
