//! Rate limits shared by several processes: token buckets kept by one server (Redis, through
//! meshql-cache-redis) instead of in each process, so that a caller's limit is one limit
//! however many processes its requests are spread over.
//!
//! The server's limiter (`[server.rate_limit]`) decides each request with
//! [`SharedLimiter::take`] when the config names a store (`redis = { … }`), and with its own
//! in-process buckets when the store fails — it never waits for a store longer than the
//! store's timeout. A store knows nothing of HTTP, classes or callers: a bucket is a key, a
//! rate and a capacity.
//!
//! A store crate implements [`crate::Component`]`<`[`SharedLimits`]`>` once (its settings,
//! checks and JSON Schema) and the binary registers it with one line.

use async_trait::async_trait;
use std::sync::Arc;
use std::time::Duration;

/// One bucket's refill rate and capacity: a token comes back every `interval`; at most
/// `burst` are held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitRule {
    pub interval: Duration,
    pub burst: u32,
}

/// A shared store failed to decide (unreachable, slower than its timeout, an unexpected
/// answer): the caller decides by itself.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct SharedLimitError(pub String);

/// Token buckets kept for several processes by one server. Each call is one round trip and
/// atomic: concurrent takes from any process never hand out more than the bucket holds.
#[async_trait]
pub trait SharedLimiter: Send + Sync + 'static {
    /// For logs and metrics (`"redis"`).
    fn kind(&self) -> &'static str;

    /// Takes `cost` tokens (1 to `rule.burst`) from the bucket `key` (a bucket nobody has
    /// taken from, or that refilled, is full). `Ok(Ok(()))`: taken; `Ok(Err(wait))`: the
    /// bucket holds fewer, and `wait` is how long until it would hold them (nothing is
    /// taken); `Err`: the store could not say.
    async fn take(
        &self,
        key: &str,
        rule: LimitRule,
        cost: u32,
    ) -> Result<Result<(), Duration>, SharedLimitError>;
}

/// Kinds of shared rate-limit store, as `[server.rate_limit]` names them (`redis = { … }`:
/// the key is the kind). The config crate keeps the block's fields opaque and hands them
/// here; building the block connects nothing.
pub struct SharedLimits;

impl crate::Family for SharedLimits {
    const WHAT: &'static str = "rate limit store";
    type Context<'a> = ();
    type Built = Box<dyn SharedLimiterTarget>;
}

/// The shared rate-limit stores a binary knows, by their key in `[server.rate_limit]`.
pub type SharedLimitRegistry = crate::Registry<SharedLimits>;

/// Checked settings of a shared rate-limit store, ready to connect.
#[async_trait]
pub trait SharedLimiterTarget: std::fmt::Debug + Send + Sync {
    /// The client. A server that is down now is not an error (requests are decided in
    /// process until it answers); only settings the client library rejects are.
    async fn connect(
        &self,
    ) -> Result<Arc<dyn SharedLimiter>, Box<dyn std::error::Error + Send + Sync>>;
}
