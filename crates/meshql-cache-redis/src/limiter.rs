//! `[server.rate_limit] redis = { … }`: token buckets kept in Redis for every process that
//! names it, so that a caller's limit is one limit across them.
//!
//! **The bucket.** The same generic cell rate algorithm as the in-process limiter (see
//! `meshql-server`'s `rate_limit::gcra`): a bucket is one number, its *theoretical arrival
//! time* (TAT), when it would be full again. A take of `cost` tokens moves it to
//! `max(TAT, now) + cost × interval` and is admitted if that is at most `now + burst ×
//! interval`; otherwise nothing changes and the excess is the wait. In Redis the number is
//! kept in microseconds of Redis's own clock (`TIME`), so the processes' clocks never
//! matter, and the whole take is one Lua script ([`TAKE`], `EVALSHA`, loaded again when
//! Redis answers that it does not know it): one round trip per request, atomic against every
//! other process.
//!
//! **Memory.** A bucket's key is `<prefix>:rl:<class>:<caller>` and expires when the bucket
//! is full again (the TTL is the TAT): forgetting a full bucket changes nothing, so Redis
//! holds only the callers that owe tokens now, and any eviction policy is safe (an evicted
//! bucket starts full again).
//!
//! **Failures** are the link's (see [`crate::client::Link`]): every call is bounded by
//! `timeout_ms`, and while Redis is unreachable calls fail at once with at most one a second
//! let through. Unlike the cache, a call that times out closes the way too: a Redis that
//! accepts commands but stalls would otherwise hold every request for the timeout. The
//! server then decides the request with its own buckets.

use crate::client::{Failure, Link};
use crate::settings::RedisSettings;
use async_trait::async_trait;
use meshql_core::{LimitRule, SharedLimitError, SharedLimiter};
use std::time::Duration;

/// Takes `ARGV[3]` tokens from the bucket `KEYS[1]`: `ARGV[1]` is the interval of one token
/// and `ARGV[2]` the tolerance (burst × interval), both in microseconds. Answers 0 when
/// taken, else the microseconds until the tokens would be there (nothing taken). Numbers
/// stay below 2^53 (Lua's doubles are exact): the clock is about 1.8e15 µs and the config
/// bounds the tolerance by 1000 s × 1000000 = 1e15 µs.
const TAKE: &str = r"
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then
  tat = now
end
local new_tat = tat + tonumber(ARGV[3]) * interval
local wait = new_tat - now - tolerance
if wait > 0 then
  return wait
end
redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', math.ceil((new_tat - now) / 1000))
return 0
";

impl From<Failure> for SharedLimitError {
    fn from(f: Failure) -> Self {
        SharedLimitError(f.to_string())
    }
}

/// Rate limits' buckets on one Redis.
pub(crate) struct RedisLimiter {
    link: Link,
    prefix: String,
    timeout: Duration,
    take: redis::Script,
}

impl RedisLimiter {
    pub(crate) fn new(settings: &RedisSettings, link: Link) -> RedisLimiter {
        link.warm_up();
        RedisLimiter {
            link,
            prefix: settings.prefix.clone(),
            timeout: settings.timeout(),
            take: redis::Script::new(TAKE),
        }
    }
}

/// A duration in whole microseconds (rounded to the nearest, at least 1).
fn micros(d: Duration) -> u64 {
    u64::try_from((d.as_nanos() + 500) / 1000)
        .unwrap_or(u64::MAX)
        .max(1)
}

#[async_trait]
impl SharedLimiter for RedisLimiter {
    fn kind(&self) -> &'static str {
        "redis"
    }

    async fn take(
        &self,
        key: &str,
        rule: LimitRule,
        cost: u32,
    ) -> Result<Result<(), Duration>, SharedLimitError> {
        let interval = micros(rule.interval);
        let burst = rule.burst.max(1);
        let tolerance = interval.saturating_mul(u64::from(burst));
        let mut invocation = self.take.prepare_invoke();
        invocation
            .key(format!("{}:rl:{key}", self.prefix))
            .arg(interval)
            .arg(tolerance)
            .arg(cost.clamp(1, burst));
        let invocation = &invocation;
        let called = self
            .link
            .call(self.timeout, |mut m| async move {
                invocation.invoke_async::<u64>(&mut m).await
            })
            .await;
        let wait = match called {
            Ok(wait) => wait,
            Err(failure) => {
                if let Failure::Timeout(_) = failure {
                    // a stalled Redis must not hold every request for the timeout
                    self.link.stalled(self.timeout);
                }
                return Err(failure.into());
            }
        };
        Ok(match wait {
            0 => Ok(()),
            micros => Err(Duration::from_micros(micros)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_round_to_whole_microseconds() {
        assert_eq!(micros(Duration::from_secs(1) / 3), 333_333);
        assert_eq!(micros(Duration::from_nanos(1_500)), 2);
        assert_eq!(micros(Duration::from_nanos(10)), 1);
        assert_eq!(micros(Duration::from_secs(1000)), 1_000_000_000);
    }
}
