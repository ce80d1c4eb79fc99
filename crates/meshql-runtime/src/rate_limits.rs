//! `[server.rate_limit]`'s shared store (`redis = { … }`): its settings checked by the crate
//! registered for it (in [`crate::Registries`]) and its client made. The limiter itself is
//! the server's (it knows requests and callers); the runtime hands it the store.
//!
//! A store that is down never fails the build or a request: the server decides requests
//! with its own buckets until the store answers (`meshql_rate_limit_shared_fallbacks_total`).

use crate::error::BuildError;
use meshql_config::{ConfigError, ResolvedConfig};
use meshql_core::{SharedLimitRegistry, SharedLimiter, SharedLimiterTarget};
use std::sync::Arc;

/// Checks the shared store's settings with its crate; `Ok(None)` without one.
pub fn configure(
    config: &ResolvedConfig,
    registry: &SharedLimitRegistry,
) -> Result<Option<Box<dyn SharedLimiterTarget>>, Vec<ConfigError>> {
    let Some(shared) = config
        .server
        .rate_limit
        .as_ref()
        .and_then(|r| r.shared.as_ref())
    else {
        return Ok(None);
    };
    let problem = |field: String, message: String| ConfigError {
        file: config.file.clone(),
        line: shared.line,
        field,
        message,
    };
    let block = format!("server.rate_limit.{}", shared.kind);
    let Some(store) = registry.get(shared.kind) else {
        return Err(vec![problem(
            block,
            "this binary has no such rate limit store".into(),
        )]);
    };
    store
        .configure(&shared.settings, &())
        .map(Some)
        .map_err(|e| {
            vec![problem(
                match e.field {
                    Some(f) => format!("{block}.{f}"),
                    None => block.clone(),
                },
                e.message,
            )]
        })
}

/// The client of `config`'s shared rate-limit store, or `None` without one (connecting in
/// the background: a store that is down is not an error).
pub async fn connect(
    config: &ResolvedConfig,
    registry: &SharedLimitRegistry,
) -> Result<Option<Arc<dyn SharedLimiter>>, BuildError> {
    let target = configure(config, registry)
        .map_err(|errors| BuildError::Preflight(errors.iter().map(|e| e.to_string()).collect()))?;
    let Some(target) = target else {
        return Ok(None);
    };
    let store = target.connect().await.map_err(|e| {
        BuildError::Preflight(vec![format!(
            "{}: server.rate_limit: {e}",
            config.file.display()
        )])
    })?;
    tracing::info!(store = store.kind(), "rate limits shared");
    Ok(Some(store))
}
