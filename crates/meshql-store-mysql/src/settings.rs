//! `[storage.<name>] type = "mysql"`: the block's fields and their registration.

use crate::{MysqlDatabase, MysqlOptions};
use async_trait::async_trait;
use meshql_core::{
    parse_settings, BackendContext, DynDatabase, SettingError, StorageBackend, StorageTarget,
    StoreError,
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

impl StorageBackend for MysqlBackend {
    fn kind(&self) -> &'static str {
        "mysql"
    }

    fn schema(&self) -> serde_json::Value {
        serde_json::to_value(schemars::schema_for!(MysqlSettings)).expect("schemas serialise")
    }

    fn configure(
        &self,
        settings: &serde_json::Value,
        _context: &BackendContext<'_>,
    ) -> Result<Box<dyn StorageTarget>, SettingError> {
        let s: MysqlSettings = parse_settings(settings)?;
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
        options.pool_size = s.pool_size;
        options.pool_wait = Duration::from_millis(s.pool_wait_ms);
        options.nested_sql = s.nested_sql;
        Ok(Box::new(MysqlTarget(options)))
    }
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
