//! The registrations of Redis — as the shared cache and as the rate limits' shared store —
//! their settings checked into what connects.

use crate::client::{Link, RedisCache};
use crate::limiter::RedisLimiter;
use crate::settings::{redacted, RedisSettings};
use async_trait::async_trait;
use meshql_core::{Component, SettingError, SharedLimiter, SharedLimiterTarget, SharedLimits};
use meshql_engine::{SharedCache, SharedCacheTarget, SharedCaches};
use std::sync::Arc;

/// Registers Redis with the server: as the shared cache (`[cache] redis = { … }`, in a
/// `SharedCacheRegistry`) and as the rate limits' shared store (`[server.rate_limit] redis =
/// { … }`, in a `SharedLimitRegistry`). Both blocks have the same fields.
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

impl Component<SharedLimits> for RedisBackend {
    const KIND: &'static str = "redis";
    type Settings = RedisSettings;

    fn parse(&self, settings: &serde_json::Value) -> Result<RedisSettings, SettingError> {
        RedisSettings::read(settings)
    }

    fn build(
        &self,
        settings: RedisSettings,
        _: &(),
    ) -> Result<Box<dyn SharedLimiterTarget>, SettingError> {
        settings.check()?;
        Ok(Box::new(RedisTarget(settings)))
    }
}

/// Checked settings, ready to connect (as a cache or as a rate-limit store).
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
        let link = Link::new(&self.0, "cache").map_err(|e| e.to_string())?;
        Ok(Arc::new(RedisCache::new(&self.0, link)))
    }
}

#[async_trait]
impl SharedLimiterTarget for RedisTarget {
    async fn connect(
        &self,
    ) -> Result<Arc<dyn SharedLimiter>, Box<dyn std::error::Error + Send + Sync>> {
        let link = Link::new(&self.0, "rate limits").map_err(|e| e.to_string())?;
        Ok(Arc::new(RedisLimiter::new(&self.0, link)))
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
    fn the_rate_limit_store_checks_the_same_fields() {
        let configure = |v: &serde_json::Value| {
            meshql_core::registry::Part::<SharedLimits>::configure(&RedisBackend, v, &())
        };
        assert!(configure(&json!({ "url": "redis://127.0.0.1:6379" })).is_ok());
        let e = configure(&json!({ "url": "http://h" })).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("url"));
        let e = configure(&json!({ "url": "redis://h", "timeout_ms": 0 })).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("timeout_ms"));
        let e = configure(&json!({ "prefix": "x" })).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("url"));
        assert_eq!(<RedisBackend as Component<SharedLimits>>::KIND, "redis");
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
