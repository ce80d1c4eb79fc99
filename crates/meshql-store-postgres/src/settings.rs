//! `[storage.<name>] type = "postgres"`: the block's fields and their registration.

use crate::{PostgresDatabase, PostgresOptions};
use async_trait::async_trait;
use meshql_core::{
    BackendContext, Component, DynDatabase, SettingError, Storage, StorageTarget, StoreError,
};
use schemars::JsonSchema;
use serde::Deserialize;
use std::time::Duration;

/// PostgreSQL: one table per entity, JSONB payloads.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PostgresSettings {
    /// `postgres://user:password@host:port/database`. TLS as libpq: `?sslmode=disable|prefer|
    /// require|verify-ca|verify-full` (default `prefer`: TLS when the server offers it) and
    /// `sslrootcert=<PEM file>` (or `system`) for the CA to trust.
    pub url: String,
    /// A read replica for reads (GraphQL, REST GETs); the primary when absent. Same TLS
    /// parameters as `url`.
    #[serde(default)]
    pub read_url: Option<String>,
    /// With `read_url`: reads go to the primary while the replica is further behind than this
    /// (and while it is unreachable, or its connections are all busy).
    #[serde(default = "meshql_core::replica::default_max_lag_ms")]
    pub read_max_lag_ms: u64,
    /// With `read_url`: how often the replica's lag and reachability are measured.
    #[serde(default = "meshql_core::replica::default_probe_ms")]
    pub read_probe_ms: u64,
    /// Connections per pool.
    #[serde(default = "default_pool_size")]
    pub pool_size: usize,
    /// How long a request waits for a free connection before answering 503.
    #[serde(default = "default_pool_wait_ms")]
    pub pool_wait_ms: u64,
    /// Server-side statement timeout.
    #[serde(default = "default_statement_timeout_ms")]
    pub statement_timeout_ms: u64,
    /// Answer a GraphQL query and its relationships into entities of this database with one
    /// SQL statement instead of one per level.
    #[serde(default = "default_true")]
    pub nested_sql: bool,
}

fn default_pool_size() -> usize {
    16
}
fn default_pool_wait_ms() -> u64 {
    5_000
}
fn default_statement_timeout_ms() -> u64 {
    30_000
}
fn default_true() -> bool {
    true
}

/// Registers PostgreSQL with a backend registry.
#[derive(Debug, Default, Clone, Copy)]
pub struct PostgresBackend;

impl Component<Storage> for PostgresBackend {
    const KIND: &'static str = "postgres";
    type Settings = PostgresSettings;

    fn build(
        &self,
        s: PostgresSettings,
        _context: &BackendContext<'_>,
    ) -> Result<Box<dyn StorageTarget>, SettingError> {
        if s.pool_size == 0 {
            return Err(SettingError::new(
                "pool_size",
                "must be at least 1 (the connections a request can wait for)",
            ));
        }
        // the URL, its TLS parameters and CA file are checked now, not at the first query
        meshql_pg::read_url(&s.url).map_err(|e| SettingError::new("url", e))?;
        if let Some(read_url) = &s.read_url {
            meshql_pg::read_url(read_url).map_err(|e| SettingError::new("read_url", e))?;
        }
        let mut options = PostgresOptions::new(s.url);
        options.read_url = s.read_url;
        options.replica =
            meshql_core::replica::ReplicaSettings::from_block(s.read_max_lag_ms, s.read_probe_ms)?;
        options.pool_size = s.pool_size;
        options.pool_wait = Duration::from_millis(s.pool_wait_ms);
        options.statement_timeout = Duration::from_millis(s.statement_timeout_ms);
        options.nested_sql = s.nested_sql;
        Ok(Box::new(PostgresTarget(options)))
    }
}

#[derive(Debug)]
struct PostgresTarget(PostgresOptions);

#[async_trait]
impl StorageTarget for PostgresTarget {
    fn target(&self) -> String {
        format!(
            "postgres:{} {}",
            self.0.url,
            self.0.read_url.as_deref().unwrap_or("")
        )
    }

    async fn open(&self) -> Result<DynDatabase, StoreError> {
        Ok(PostgresDatabase::connect(&self.0)?)
    }
}
