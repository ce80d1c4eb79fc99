//! `[storage.<name>] type = "mysql"`: the block's fields and their registration.

use crate::{MysqlDatabase, MysqlOptions};
use async_trait::async_trait;
use meshql_core::{
    BackendContext, Component, DynDatabase, SettingError, Storage, StorageTarget, StoreError,
};
use schemars::JsonSchema;
use serde::Deserialize;
use std::time::Duration;

/// MySQL or MariaDB: one table per entity, JSON payloads.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MysqlSettings {
    /// `mysql://user:password@host:port/database`. TLS: `?ssl-mode=DISABLED|PREFERRED|
    /// REQUIRED|VERIFY_CA|VERIFY_IDENTITY` (default `DISABLED`) and `ssl-ca=<PEM file>` for
    /// the CA to trust.
    pub url: String,
    /// A read replica (same URL form): the API's reads (REST GETs, GraphQL) go there, while
    /// writes and what a write depends on go to `url`. Absent: everything goes to `url`.
    #[serde(default)]
    pub read_url: Option<String>,
    /// With `read_url`: reads go to the primary while the replica is further behind than this
    /// (and while it is unreachable, or its connections are all busy). The server reports its
    /// lag in whole seconds (`Seconds_Behind_Master`, `Seconds_Behind_Source`): below 1000,
    /// any lag at all counts. A replica whose replication is stopped counts as far behind.
    #[serde(default = "meshql_core::replica::default_max_lag_ms")]
    pub read_max_lag_ms: u64,
    /// With `read_url`: how often the replica's lag and reachability are measured.
    #[serde(default = "meshql_core::replica::default_probe_ms")]
    pub read_probe_ms: u64,
    /// Connections in the pool (and in the replica's pool).
    #[serde(default = "default_pool_size")]
    pub pool_size: usize,
    /// How long a request waits for a free connection before answering 503.
    #[serde(default = "default_pool_wait_ms")]
    pub pool_wait_ms: u64,
    /// Answer a GraphQL query and its relationships into entities of this database with one
    /// SQL statement instead of one per level. Off by default: on MariaDB over loopback it
    /// measured slower than a batched lookup per level.
    #[serde(default)]
    pub nested_sql: bool,
}

fn default_pool_size() -> usize {
    16
}
fn default_pool_wait_ms() -> u64 {
    5_000
}

/// Registers MySQL/MariaDB with a backend registry.
#[derive(Debug, Default, Clone, Copy)]
pub struct MysqlBackend;

impl Component<Storage> for MysqlBackend {
    const KIND: &'static str = "mysql";
    type Settings = MysqlSettings;

    fn build(
        &self,
        s: MysqlSettings,
        _context: &BackendContext<'_>,
    ) -> Result<Box<dyn StorageTarget>, SettingError> {
        Ok(Box::new(MysqlTarget(options(s)?)))
    }
}

/// The options a block's settings give, once checked.
fn options(s: MysqlSettings) -> Result<MysqlOptions, SettingError> {
    if s.pool_size == 0 {
        return Err(SettingError::new(
            "pool_size",
            "must be at least 1 (the connections a request can wait for)",
        ));
    }
    // the URL, its TLS parameters and CA file are checked now, not at the first query
    crate::tls::read_url(&s.url).map_err(|e| SettingError::new("url", e))?;
    if let Some(read_url) = &s.read_url {
        crate::tls::read_url(read_url).map_err(|e| SettingError::new("read_url", e))?;
    }
    let mut options = MysqlOptions::new(s.url);
    options.read_url = s.read_url;
    options.replica =
        meshql_core::replica::ReplicaSettings::from_block(s.read_max_lag_ms, s.read_probe_ms)?;
    options.pool_size = s.pool_size;
    options.pool_wait = Duration::from_millis(s.pool_wait_ms);
    options.nested_sql = s.nested_sql;
    Ok(options)
}

#[derive(Debug)]
struct MysqlTarget(MysqlOptions);

#[async_trait]
impl StorageTarget for MysqlTarget {
    fn target(&self) -> String {
        format!("mysql:{}", self.0.url)
    }

    async fn open(&self) -> Result<DynDatabase, StoreError> {
        Ok(MysqlDatabase::connect(&self.0)?)
    }
}

#[cfg(test)]
mod tests {
    use meshql_core::registry::Part;
    use meshql_core::replica::ReplicaSettings;
    use meshql_core::Storage;
    use serde_json::json;

    fn options(v: &serde_json::Value) -> Result<super::MysqlOptions, meshql_core::SettingError> {
        super::options(meshql_core::parse_settings(v)?)
    }
    use std::time::Duration;

    const URL: &str = "mysql://u:p@h:1/d";

    #[test]
    fn the_replica_bounds_default_to_the_engine_s_and_are_read() {
        let o = options(&json!({"url": URL, "read_url": URL})).unwrap();
        assert_eq!(o.replica, ReplicaSettings::default());
        assert_eq!(o.replica.max_lag, Duration::from_millis(1000));
        assert_eq!(o.replica.probe_every, Duration::from_millis(250));
        let o = options(&json!({
            "url": URL, "read_url": URL, "read_max_lag_ms": 5000, "read_probe_ms": 10
        }))
        .unwrap();
        assert_eq!(
            o.replica,
            ReplicaSettings {
                max_lag: Duration::from_secs(5),
                probe_every: Duration::from_millis(10),
            }
        );
    }

    #[test]
    fn a_probe_period_under_10_ms_is_refused() {
        for bad in [json!(0), json!(9)] {
            let e = options(&json!({"url": URL, "read_probe_ms": bad})).unwrap_err();
            assert_eq!(e.field.as_deref(), Some("read_probe_ms"), "{e}");
            assert!(e.message.contains("at least 10"), "{e}");
        }
        for (field, value) in [
            ("read_probe_ms", json!(-1)),
            ("read_max_lag_ms", json!("1s")),
        ] {
            let e = options(&json!({"url": URL, field: value})).unwrap_err();
            assert_eq!(e.field.as_deref(), Some(field), "{e}");
        }
    }

    #[test]
    fn the_schema_documents_the_replica_bounds() {
        let schema = Part::<Storage>::schema(&super::MysqlBackend);
        let properties = &schema["properties"];
        for field in ["read_max_lag_ms", "read_probe_ms"] {
            let description = properties[field]["description"]
                .as_str()
                .unwrap_or_default();
            assert!(description.contains("read_url"), "{field}: {schema}");
        }
        assert_eq!(properties["read_max_lag_ms"]["default"], json!(1000));
        assert_eq!(properties["read_probe_ms"]["default"], json!(250));
    }
}
