//! The read cache of a server (`[cache]`): a shared cache's key (`redis = { … }`) checked by
//! the crate registered for it (in [`crate::Registries`]); builds the [`Cache`] every entity's service reads through, keeps it told of the change
//! feed (writes by other processes), and, for a shared cache that missed an update, retries
//! until it can be trusted again.
//!
//! A shared cache that is down never fails a request or makes the service unready: reads go
//! to storage (`meshql_cache_bypassed_total` in `/metrics`, one warning in the log) until it
//! answers again.

use crate::error::BuildError;
use meshql_changes::{CopyListener, Listeners};
use meshql_config::{ConfigError, ResolvedConfig};
use meshql_core::StoreChange;
use meshql_engine::{Cache, CacheSettings, SharedCacheRegistry, SharedCacheTarget};
use std::sync::Arc;
use std::time::Duration;

/// Checks the shared cache's settings with its crate; `Ok(None)` without one.
pub fn configure(
    config: &ResolvedConfig,
    registry: &SharedCacheRegistry,
) -> Result<Option<Box<dyn SharedCacheTarget>>, Vec<ConfigError>> {
    let Some(shared) = config.cache.as_ref().and_then(|c| c.shared.as_ref()) else {
        return Ok(None);
    };
    let problem = |field: String, message: String| ConfigError {
        file: config.file.clone(),
        line: shared.line,
        field,
        message,
    };
    let Some(backend) = registry.get(shared.kind) else {
        return Err(vec![problem(
            format!("cache.{}", shared.kind),
            "this binary has no such shared cache".into(),
        )]);
    };
    backend
        .configure(&shared.settings, &())
        .map(Some)
        .map_err(|e| {
            vec![problem(
                match e.field {
                    Some(f) => format!("cache.{}.{f}", shared.kind),
                    None => format!("cache.{}", shared.kind),
                },
                e.message,
            )]
        })
}

/// The cache of `config`'s entities, or `None` without `[cache]`.
pub async fn build(
    config: &ResolvedConfig,
    registry: &SharedCacheRegistry,
) -> Result<Option<Arc<Cache>>, BuildError> {
    let Some(spec) = &config.cache else {
        return Ok(None);
    };
    let settings = CacheSettings {
        max_bytes: spec.max_bytes,
        ttl: spec.ttl,
        settle: spec.settle,
        min_hit_rate: spec.min_hit_rate,
    };
    let entities = config.entities.iter().map(|e| e.name.clone());
    let target = configure(config, registry)
        .map_err(|errors| BuildError::Preflight(errors.iter().map(|e| e.to_string()).collect()))?;
    let cache = match target {
        None => Cache::local(settings, entities),
        Some(target) => {
            let shared = target.connect().await.map_err(|e| {
                BuildError::Preflight(vec![format!("{}: cache: {e}", config.file.display())])
            })?;
            let cache = Cache::shared(settings, entities, shared);
            tokio::spawn(recover(Arc::downgrade(&cache)));
            cache
        }
    };
    if !config.changes.config.enabled {
        tracing::warn!(
            "[cache] with the change feed off: writes by other processes to these databases \
             are not seen by this process's cache until its answers expire (cache.ttl_ms)"
        );
    }
    tracing::info!(
        cache = cache.kind(),
        max_bytes = spec.max_bytes,
        ttl_ms = spec.ttl.as_millis() as u64,
        "read cache on"
    );
    Ok(Some(cache))
}

/// Tells `cache` of every change the hub copies (writes of other processes sharing a
/// database included).
pub fn listeners(cache: Option<&Arc<Cache>>) -> Listeners {
    struct Invalidate(Arc<Cache>);
    impl CopyListener for Invalidate {
        fn copied(&self, entity: &str, changes: &[StoreChange]) {
            for c in changes {
                self.0.invalidated(entity, &c.id, c.created_at);
            }
        }
    }
    Listeners(
        cache
            .map(|c| Arc::new(Invalidate(c.clone())) as Arc<dyn CopyListener>)
            .into_iter()
            .collect(),
    )
}

/// Once a second, lets a shared cache that missed an update be trusted again when it answers
/// (see `meshql_engine::cache`). Ends with the cache.
async fn recover(cache: std::sync::Weak<Cache>) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Some(cache) = cache.upgrade() else {
            return;
        };
        cache.recover().await;
    }
}
