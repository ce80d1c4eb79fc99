//! `[server.rate_limit]` with a shared store (`redis = { … }`): each request's bucket is
//! taken from in the store, so that a caller's limit holds across every process naming it.
//!
//! **Failing open to the local limit.** The store is bounded by its timeout, and when it
//! cannot decide (down, slow, an unexpected answer) the request is decided by this process's
//! own buckets instead — the same limit, per process — rather than waiting or refusing it.
//! Each such request is counted (`meshql_rate_limit_shared_fallbacks_total{class}`); the log
//! says so at most once a minute, and once when the store answers again.
//!
//! **Bucket names.** A bucket is `<class>:<caller>` in the store (which adds its own prefix):
//! `reads:s:<subject>` for a token's subject, `reads:a:10.1.2.3` for an IPv4 client,
//! `reads:a:2001:db8:1:2::/64` for an IPv6 one, `reads:u` for a request with neither.

use super::{CallerKey, Class};
use meshql_core::{LimitRule, SharedLimitError, SharedLimiter};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// While the store fails, a warning at most this often.
const WARN_EVERY: Duration = Duration::from_secs(60);

pub(super) struct Shared {
    store: Arc<dyn SharedLimiter>,
    /// Requests decided in process because the store could not, by [`Class`] index.
    fallbacks: [AtomicU64; 3],
    /// A warning was logged and the store has not answered since.
    failing: AtomicBool,
    /// Milliseconds after `epoch` of the last warning, plus one (0: none yet).
    warned_at: AtomicU64,
    epoch: Instant,
}

impl Shared {
    pub(super) fn new(store: Arc<dyn SharedLimiter>) -> Shared {
        Shared {
            store,
            fallbacks: Default::default(),
            failing: AtomicBool::new(false),
            warned_at: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    pub(super) fn kind(&self) -> &'static str {
        self.store.kind()
    }

    /// Takes `cost` tokens from `caller`'s bucket in `class` in the store: `None` when the
    /// store could not decide (counted, and logged at most once a minute).
    pub(super) async fn take(
        &self,
        class: Class,
        caller: &CallerKey,
        rule: LimitRule,
        cost: u32,
    ) -> Option<Result<(), Duration>> {
        match self.store.take(&bucket(class, caller), rule, cost).await {
            Ok(decision) => {
                if self.failing.load(Ordering::Relaxed)
                    && self.failing.swap(false, Ordering::Relaxed)
                {
                    tracing::info!(
                        store = self.store.kind(),
                        "shared rate limits answering again: requests are limited across processes again"
                    );
                }
                Some(decision)
            }
            Err(e) => {
                self.fallbacks[class as usize].fetch_add(1, Ordering::Relaxed);
                self.warn(&e);
                None
            }
        }
    }

    /// Logs the store's failure unless a warning was logged less than a minute ago.
    fn warn(&self, e: &SharedLimitError) {
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1;
        let last = self.warned_at.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= WARN_EVERY.as_millis() as u64;
        if due
            && self
                .warned_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.failing.store(true, Ordering::Relaxed);
            tracing::warn!(
                store = self.store.kind(),
                error = %e,
                fallbacks = self.fallbacks_total(),
                "shared rate limits unavailable: requests are limited by this process's own buckets until it answers (logged at most once a minute; see meshql_rate_limit_shared_fallbacks_total)"
            );
        }
    }

    /// Requests of `class` decided in process.
    pub(super) fn fallbacks(&self, class: Class) -> u64 {
        self.fallbacks[class as usize].load(Ordering::Relaxed)
    }

    fn fallbacks_total(&self) -> u64 {
        Class::ALL.iter().map(|c| self.fallbacks(*c)).sum()
    }
}

/// The name of `caller`'s bucket in `class`.
fn bucket(class: Class, caller: &CallerKey) -> String {
    let class = class.name();
    match caller {
        CallerKey::Subject(subject) => format!("{class}:s:{subject}"),
        CallerKey::Address(a) => match u32::try_from(*a) {
            Ok(v4) => format!("{class}:a:{}", Ipv4Addr::from(v4)),
            Err(_) => format!("{class}:a:{}/64", Ipv6Addr::from(*a)),
        },
        CallerKey::Unknown => format!("{class}:u"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_named_by_class_and_caller() {
        let subject = CallerKey::Subject(Arc::from("alice"));
        assert_eq!(bucket(Class::Reads, &subject), "reads:s:alice");
        let v4 = CallerKey::Address(u128::from(u32::from(Ipv4Addr::new(10, 1, 2, 3))));
        assert_eq!(bucket(Class::Writes, &v4), "writes:a:10.1.2.3");
        let v6: Ipv6Addr = "2001:db8:1:2::".parse().unwrap();
        let v6 = CallerKey::Address(u128::from(v6));
        assert_eq!(bucket(Class::Graphql, &v6), "graphql:a:2001:db8:1:2::/64");
        assert_eq!(bucket(Class::Reads, &CallerKey::Unknown), "reads:u");
    }
}
