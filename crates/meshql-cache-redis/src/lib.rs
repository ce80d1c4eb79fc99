//! The shared read cache on Redis: one Redis keeps the answers and the tag generations of
//! several meshql processes, so a write made through any of them invalidates the answers all
//! of them cached (see `meshql_engine::cache` for how answers are validated by tags).
//!
//! **What is stored where.** Every key starts with the configured `prefix` (default
//! `meshql`), so several services can share one Redis:
//!
//! | key                  | holds                                                          |
//! |----------------------|----------------------------------------------------------------|
//! | `<prefix>:g:<tag>`   | the tag's generation (an integer, advanced by one per write)   |
//! | `<prefix>:c:<tag>`   | the stamp (Unix milliseconds) of the newest write to the tag   |
//! | `<prefix>:a:<tag>`   | when the tag was last advanced (Unix ms, after its writes committed) |
//! | `<prefix>:v:<key>`   | a cached answer (the engine's bytes), expiring after the `ttl` |
//! | `<prefix>:rl:<class>:<caller>` | a rate limit's bucket (`[server.rate_limit] redis`), expiring when full again |
//!
//! A missing generation, stamp or moment reads as 0 (a tag advanced only by a process older
//! than the `a:` keys then counts as advanced at its stamp). Tags have no expiry (there are few: one per
//! entity plus a bounded number of document stripes and the epoch); answers do. Redis must
//! therefore never evict a key without an expiry (`maxmemory-policy` `noeviction` or a
//! `volatile-*` policy): a generation evicted back to 0 could make an old answer look current
//! again. For the same reason Redis should keep nothing on disk (`save ""`, `appendonly no`):
//! restored from a snapshot, it would bring back generations older than the writes made since,
//! next to answers read before those writes. Keys and tags are UTF-8 text of any kind (including the unit separator); Redis keys
//! are binary-safe. Cluster mode is not supported (a read touches several keys in one call).
//! TLS is: `rediss://` (rustls; the server's certificate and name verified against the
//! system's roots, or the authorities of `ca_file`).
//!
//! **One round trip per call.** [`get`](meshql_engine::SharedCache::get) is one `MGET` of the
//! tags' generations, stamps and moments and the answer; [`put`](meshql_engine::SharedCache::put) one
//! `SET … PX <ttl>`; [`advance`](meshql_engine::SharedCache::advance) one Lua script
//! (`EVALSHA`, loaded again when Redis answers that it does not know it) that, for every tag,
//! increments the generation and raises the stamp to the write's and the moment of the last
//! advance to the caller's clock if they are newer, never lowering them, atomically for the
//! call.
//!
//! **Failures.** Every call is bounded by `timeout_ms` (default 100): a slower Redis counts as
//! a failure, which the engine answers by reading around the cache. Connecting is never an
//! error: [`SharedCacheTarget::connect`](meshql_engine::SharedCacheTarget::connect) starts the
//! first attempt in the background (bounded by `connect_timeout_ms`) and returns at once; only
//! a URL the client library rejects fails. Once connected, the connection reconnects by
//! itself. While Redis is unreachable (refused, dropped, cannot connect) calls fail at once,
//! without a round trip, and at most one call a second is let through to try it again, so an
//! outage does not cost a connection attempt per read; the first call it answers opens the way
//! for all. A command sent on a connection found dropped (Redis restarted while the process
//! was idle) is sent once more on the new connection within the same bound.
//!
//! **Rate limits.** The same Redis (or another) can keep `[server.rate_limit]`'s token buckets
//! for several processes: one Lua script per request (see `limiter`), its key expiring when
//! the bucket is full again. A failure there is decided by the server's own buckets; unlike
//! the cache's calls, one that times out stops calls for a second as an unreachable Redis
//! does (a stalled Redis must not hold every request for the timeout).
//!
//! [`RedisBackend`] registers the cache as `[cache] redis = { … }` and the rate limits' store
//! as `[server.rate_limit] redis = { … }`: it owns the blocks' fields ([`RedisSettings`]:
//! defaults, checks, JSON Schema).

mod backend;
mod client;
mod limiter;
mod settings;

pub use backend::RedisBackend;
pub use settings::RedisSettings;
