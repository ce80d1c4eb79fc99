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
/// (`replicaSet`, `readPreference`, `maxPoolSize`, ...) are honoured.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MongoSettings {
    /// `mongodb://host:port/?replicaSet=rs0`
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
        let mut options = MongoOptions::new(s.uri, s.db);
        options.pool_size = s.pool_size;
        options.pool_wait = Duration::from_millis(s.pool_wait_ms);
        Ok(Box::new(MongoTarget(options)))
    }
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
