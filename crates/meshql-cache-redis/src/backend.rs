//! The Redis shared cache's registration: its settings checked into what connects.

use crate::client::{Link, RedisCache};
use crate::settings::{redacted, RedisSettings};
use async_trait::async_trait;
use meshql_core::{Component, SettingError};
use meshql_engine::{SharedCache, SharedCacheTarget, SharedCaches};
use std::sync::Arc;

/// Registers the Redis shared cache (`[cache] redis = { … }`) with the server.
#[derive(Debug, Default, Clone, Copy)]
pub struct RedisBackend;

impl Component<SharedCaches> for RedisBackend {
    const KIND: &'static str = "redis";
    type Settings = RedisSettings;

    fn parse(&self, settings: &serde_json::Value) -> Result<RedisSettings, SettingError> {
        RedisSettings::read(settings)
    }

    fn build(
        &self,
        settings: RedisSettings,
        _: &(),
    ) -> Result<Box<dyn SharedCacheTarget>, SettingError> {
        settings.check()?;
        Ok(Box::new(RedisTarget(settings)))
    }
}

/// Checked settings, ready to connect.
struct RedisTarget(RedisSettings);

impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTarget")
            .field("url", &redacted(&self.0.url))
            .field("prefix", &self.0.prefix)
            .field("timeout_ms", &self.0.timeout_ms)
            .field("connect_timeout_ms", &self.0.connect_timeout_ms)
            .field("ca_file", &self.0.ca_file)
            .finish()
    }
}

#[async_trait]
impl SharedCacheTarget for RedisTarget {
    async fn connect(
        &self,
    ) -> Result<Arc<dyn SharedCache>, Box<dyn std::error::Error + Send + Sync>> {
        let link = Link::new(&self.0).map_err(|e| e.to_string())?;
        Ok(Arc::new(RedisCache::new(&self.0, link)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn configure(v: &serde_json::Value) -> Result<Box<dyn SharedCacheTarget>, SettingError> {
        meshql_core::registry::Part::<SharedCaches>::configure(&RedisBackend, v, &())
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redacted("redis://u:secret@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redacted("redis://:secret@h:1"), "redis://:***@h:1");
        assert_eq!(redacted("redis://h:1/0"), "redis://h:1/0");
        let target = configure(&json!({ "url": "redis://:secret@h:1" })).unwrap();
        let debug = format!("{target:?}");
        assert!(
            !debug.contains("secret") && debug.contains("***"),
            "{debug}"
        );
    }

    #[test]
    fn the_schema_describes_the_fields() {
        let s = Component::<SharedCaches>::schema(&RedisBackend);
        assert_eq!(s["required"], json!(["url"]));
        assert!(s["properties"]["timeout_ms"].is_object(), "{s}");
        assert!(s["description"].as_str().unwrap().contains("Redis"), "{s}");
        assert_eq!(<RedisBackend as Component<SharedCaches>>::KIND, "redis");
    }
}
