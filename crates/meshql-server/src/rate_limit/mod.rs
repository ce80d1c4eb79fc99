//! `[server.rate_limit]`: token buckets per caller and per class of request.
//!
//! Each request belongs to one class — `reads` (REST GETs), `writes` (REST POST, PUT,
//! DELETE; a bulk create is one write) or `graphql` (a GraphQL request, charged its planned
//! cost; without a `graphql` class GraphQL requests are reads of cost 1) — and counts
//! against its caller's bucket in that class ([`caller`]: the subject of a valid token, else
//! the client's address). A bucket is one atomic word ([`gcra`]); the buckets of a class
//! live in a sharded table bounded by `max_callers` ([`table`]: a bucket that refilled is
//! dropped first — forgetting it then changes nothing — else the one owing least). So a
//! request costs a shard's read lock, one hash lookup and one compare-and-swap, and the
//! memory stays bounded whatever the number of callers.
//!
//! With `redis = { … }` ([`shared`]), the buckets are kept in Redis instead, for every
//! process naming it: one round trip per request (one Lua script), and when Redis cannot
//! answer within its timeout the request is decided by the table above (the limit per
//! process) rather than waiting.
//!
//! A server without `[server.rate_limit]` builds no limiter: its requests take none of these
//! steps.

mod caller;
mod gcra;
mod refusal;
mod shared;
mod table;

pub(crate) use caller::{CallerKey, ClientAddr};
pub(crate) use refusal::{caller_from, graphql_refusal, limit_rest, rest_refusal, RestLimit};

use caller::Callers;
use gcra::Rule;
use meshql_config::resolve::{BucketSpec, RateLimitSpec};
use meshql_core::{Authorizer, LimitRule, SharedLimiter};
use shared::Shared;
use std::fmt::Write;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The classes of requests, each with its own buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    Reads,
    Writes,
    Graphql,
}

impl Class {
    const ALL: [Class; 3] = [Class::Reads, Class::Writes, Class::Graphql];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Class::Reads => "reads",
            Class::Writes => "writes",
            Class::Graphql => "graphql",
        }
    }
}

/// A request over its limit.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Refusal {
    pub(crate) class: Class,
    /// How long until the request would be admitted.
    pub(crate) retry_after: Duration,
    pub(crate) spec: BucketSpec,
}

impl Refusal {
    /// The `Retry-After` value: whole seconds, rounded up, at least 1.
    pub(crate) fn retry_after_seconds(&self) -> u64 {
        let d = self.retry_after;
        (d.as_secs() + u64::from(d.subsec_nanos() > 0)).max(1)
    }
}

/// One class's buckets and counters.
struct Limit {
    spec: BucketSpec,
    rule: Rule,
    buckets: table::Table,
    allowed: AtomicU64,
    limited: AtomicU64,
}

impl Limit {
    fn new(spec: BucketSpec, max_callers: u64) -> Limit {
        let rule = Rule::new(spec.interval, spec.burst);
        Limit {
            spec,
            rule,
            buckets: table::Table::new(max_callers),
            allowed: AtomicU64::new(0),
            limited: AtomicU64::new(0),
        }
    }
}

/// The server's rate limits (built only when the config has some).
pub(crate) struct RateLimiter {
    /// By [`Class`] index; `None`: the class is not limited.
    limits: [Option<Limit>; 3],
    callers: Callers,
    /// The buckets' clock starts here.
    epoch: Instant,
    /// The store keeping the buckets for several processes (`None`: the table only).
    shared: Option<Shared>,
}

impl RateLimiter {
    /// The limits of `spec`, callers known by `authorizer`, the buckets kept in `shared`
    /// when there is a shared store (the in-process table then decides only what the store
    /// cannot).
    pub(crate) fn new(
        spec: &RateLimitSpec,
        authorizer: Arc<dyn Authorizer>,
        shared: Option<Arc<dyn SharedLimiter>>,
    ) -> RateLimiter {
        let limit = |b: Option<BucketSpec>| b.map(|b| Limit::new(b, spec.max_callers));
        RateLimiter {
            limits: [limit(spec.reads), limit(spec.writes), limit(spec.graphql)],
            callers: Callers::new(authorizer),
            epoch: Instant::now(),
            shared: shared.map(Shared::new),
        }
    }

    /// Nanoseconds of the buckets' clock.
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn limit(&self, class: Class) -> Option<&Limit> {
        self.limits[class as usize].as_ref()
    }

    /// The caller presenting `authorization` from `client`.
    pub(crate) fn caller(&self, authorization: Option<&str>, client: Option<IpAddr>) -> CallerKey {
        self.callers.key(authorization, client)
    }

    /// The class GraphQL requests count against, and whether they are charged their cost
    /// (`graphql`) or 1 (`reads`); `None` when neither is limited.
    pub(crate) fn graphql_class(&self) -> Option<Class> {
        [Class::Graphql, Class::Reads]
            .into_iter()
            .find(|c| self.limit(*c).is_some())
    }

    /// Whether `class` is limited at all.
    pub(crate) fn limits(&self, class: Class) -> bool {
        self.limit(class).is_some()
    }

    /// Takes `cost` tokens from `caller`'s bucket in `class` (nothing when the class is not
    /// limited), and counts the request as allowed or limited.
    pub(crate) async fn admit(
        &self,
        class: Class,
        caller: &CallerKey,
        cost: u32,
    ) -> Result<(), Refusal> {
        let taken = self.take(class, caller, cost).await;
        self.count(class, taken.is_ok());
        taken
    }

    /// Takes `cost` tokens (at least 1, at most the burst) without counting the request: from
    /// the shared store when there is one and it answers, else from the in-process table.
    async fn take(&self, class: Class, caller: &CallerKey, cost: u32) -> Result<(), Refusal> {
        let Some(limit) = self.limit(class) else {
            return Ok(());
        };
        let refusal = |retry_after| Refusal {
            class,
            retry_after,
            spec: limit.spec,
        };
        if let Some(shared) = &self.shared {
            let rule = LimitRule {
                interval: limit.spec.interval,
                burst: limit.spec.burst,
            };
            if let Some(decision) = shared.take(class, caller, rule, cost).await {
                return decision.map_err(refusal);
            }
        }
        let now = self.now();
        limit
            .buckets
            .take(caller, &limit.rule, cost, now)
            .map_err(refusal)
    }

    /// Counts one request of `class` as allowed or limited.
    fn count(&self, class: Class, allowed: bool) {
        if let Some(limit) = self.limit(class) {
            let counter = if allowed {
                &limit.allowed
            } else {
                &limit.limited
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Callers with a bucket in `class` now.
    fn callers_in(&self, class: Class) -> u64 {
        let now = self.now();
        self.limit(class).map_or(0, |l| l.buckets.len(now))
    }
}

/// A GraphQL request past the door of its class: one token taken when it arrived (before
/// its credentials are checked or its body read, so that a flood of bad requests empties the
/// bucket too); the rest of its cost is taken once it is planned ([`GraphqlGate::charge`]).
/// Counted as allowed when dropped, unless the rest was refused.
pub(crate) struct GraphqlGate {
    limiter: Arc<RateLimiter>,
    class: Class,
    caller: CallerKey,
    refused: bool,
}

impl GraphqlGate {
    /// Takes the first token of a GraphQL request; `Ok(None)` when GraphQL is not limited.
    pub(crate) async fn enter(
        limiter: &Arc<RateLimiter>,
        authorization: Option<&str>,
        client: Option<IpAddr>,
    ) -> Result<Option<GraphqlGate>, Refusal> {
        let Some(class) = limiter.graphql_class() else {
            return Ok(None);
        };
        let caller = limiter.caller(authorization, client);
        if let Err(refusal) = limiter.take(class, &caller, 1).await {
            limiter.count(class, false);
            return Err(refusal);
        }
        Ok(Some(GraphqlGate {
            limiter: limiter.clone(),
            class,
            caller,
            refused: false,
        }))
    }

    /// Whether requests are charged their cost (`graphql`), not 1 (`reads`).
    pub(crate) fn by_cost(&self) -> bool {
        self.class == Class::Graphql
    }

    /// Takes the rest of a planned request's `cost` (capped at the burst; the first token
    /// was taken at the door).
    pub(crate) async fn charge(&mut self, cost: usize) -> Result<(), Refusal> {
        let Some(limit) = self.limiter.limit(self.class) else {
            return Ok(());
        };
        let total = u32::try_from(cost)
            .unwrap_or(u32::MAX)
            .min(limit.spec.burst);
        if total <= 1 {
            return Ok(());
        }
        let interval = limit.spec.interval;
        self.limiter
            .take(self.class, &self.caller, total - 1)
            .await
            .map_err(|mut refusal| {
                self.refused = true;
                // the retry pays the door's token again
                refusal.retry_after += interval;
                refusal
            })
    }
}

impl Drop for GraphqlGate {
    fn drop(&mut self) {
        self.limiter.count(self.class, !self.refused);
    }
}

impl meshql_core::metrics::Collect for RateLimiter {
    fn collect(&self, out: &mut String) {
        let name = "meshql_rate_limit_requests_total";
        let _ = writeln!(
            out,
            "# HELP {name} Requests counted by [server.rate_limit], by class and outcome (limited: answered 429).\n# TYPE {name} counter"
        );
        for class in Class::ALL {
            if let Some(l) = self.limit(class) {
                for (outcome, n) in [("allowed", &l.allowed), ("limited", &l.limited)] {
                    let _ = writeln!(
                        out,
                        "{name}{{class=\"{}\",outcome=\"{outcome}\"}} {}",
                        class.name(),
                        n.load(Ordering::Relaxed)
                    );
                }
            }
        }
        if let Some(shared) = &self.shared {
            let name = "meshql_rate_limit_shared_fallbacks_total";
            let _ = writeln!(
                out,
                "# HELP {name} Requests decided by this process's own buckets because the shared store ({}) could not answer in time, by class.\n# TYPE {name} counter",
                shared.kind()
            );
            for class in Class::ALL {
                if self.limits(class) {
                    let _ = writeln!(
                        out,
                        "{name}{{class=\"{}\"}} {}",
                        class.name(),
                        shared.fallbacks(class)
                    );
                }
            }
        }
        let name = "meshql_rate_limit_callers";
        let _ = writeln!(
            out,
            "# HELP {name} Callers with a bucket in this process, by class (at most max_callers each; with a shared store, those of requests it could not decide).\n# TYPE {name} gauge"
        );
        for class in Class::ALL {
            if self.limits(class) {
                let _ = writeln!(
                    out,
                    "{name}{{class=\"{}\"}} {}",
                    class.name(),
                    self.callers_in(class)
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::executor::block_on;
    use meshql_core::metrics::Collect;

    fn spec(per_second: u64, burst: u32, max_callers: u64) -> RateLimitSpec {
        RateLimitSpec {
            reads: Some(BucketSpec {
                interval: Duration::from_secs(1) / per_second as u32,
                burst,
            }),
            writes: None,
            graphql: None,
            max_callers,
            shared: None,
        }
    }

    fn ip(n: u32) -> Option<IpAddr> {
        Some(IpAddr::V4(n.into()))
    }

    #[test]
    fn callers_have_buckets_of_their_own() {
        let limiter = RateLimiter::new(&spec(1, 2, 100), Arc::new(meshql_core::NoAuth), None);
        let a = limiter.caller(None, ip(1));
        let b = limiter.caller(None, ip(2));
        assert!(block_on(limiter.admit(Class::Reads, &a, 1)).is_ok());
        assert!(block_on(limiter.admit(Class::Reads, &a, 1)).is_ok());
        let refusal = block_on(limiter.admit(Class::Reads, &a, 1)).unwrap_err();
        assert_eq!(refusal.class, Class::Reads);
        assert_eq!(refusal.retry_after_seconds(), 1);
        assert!(block_on(limiter.admit(Class::Reads, &b, 1)).is_ok());
        // a class without a limit admits everything
        for _ in 0..100 {
            assert!(block_on(limiter.admit(Class::Writes, &a, 1)).is_ok());
        }
        assert_eq!(limiter.graphql_class(), Some(Class::Reads));
        let mut text = String::new();
        limiter.collect(&mut text);
        assert!(
            text.contains(
                "meshql_rate_limit_requests_total{class=\"reads\",outcome=\"allowed\"} 3"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "meshql_rate_limit_requests_total{class=\"reads\",outcome=\"limited\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("meshql_rate_limit_callers{class=\"reads\"} 2"),
            "{text}"
        );
        assert!(!text.contains("class=\"writes\""), "{text}");
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        let refusal = |retry_after| Refusal {
            class: Class::Reads,
            retry_after,
            spec: BucketSpec {
                interval: Duration::from_secs(1),
                burst: 1,
            },
        };
        for (wait, seconds) in [
            (Duration::from_nanos(1), 1),
            (Duration::from_millis(999), 1),
            (Duration::from_secs(1), 1),
            (Duration::from_millis(1001), 2),
            (Duration::from_secs(30), 30),
        ] {
            assert_eq!(refusal(wait).retry_after_seconds(), seconds, "{wait:?}");
        }
    }

    #[test]
    fn a_graphql_request_pays_its_cost_and_counts_once() {
        let spec = RateLimitSpec {
            reads: None,
            writes: None,
            graphql: Some(BucketSpec {
                interval: Duration::from_secs(1),
                burst: 10,
            }),
            max_callers: 10,
            shared: None,
        };
        let limiter = Arc::new(RateLimiter::new(&spec, Arc::new(meshql_core::NoAuth), None));
        let client = ip(7);
        // cost 4: 1 at the door, 3 once planned
        let mut gate = block_on(GraphqlGate::enter(&limiter, None, client))
            .unwrap()
            .unwrap();
        assert!(gate.by_cost());
        block_on(gate.charge(4)).unwrap();
        drop(gate);
        // 6 left: a cost of 7 passes the door, then is refused
        let mut gate = block_on(GraphqlGate::enter(&limiter, None, client))
            .unwrap()
            .unwrap();
        let refusal = block_on(gate.charge(7)).unwrap_err();
        assert_eq!(refusal.class, Class::Graphql);
        drop(gate);
        // a cost above the burst is charged the burst: 5 left, so refused too
        let mut gate = block_on(GraphqlGate::enter(&limiter, None, client))
            .unwrap()
            .unwrap();
        assert!(block_on(gate.charge(1_000)).is_err());
        drop(gate);
        // cost 1 takes nothing more
        for _ in 0..4 {
            let mut gate = block_on(GraphqlGate::enter(&limiter, None, client))
                .unwrap()
                .unwrap();
            block_on(gate.charge(1)).unwrap();
        }
        // empty now: refused at the door
        assert!(block_on(GraphqlGate::enter(&limiter, None, client)).is_err());
        let mut text = String::new();
        limiter.collect(&mut text);
        assert!(
            text.contains("{class=\"graphql\",outcome=\"allowed\"} 5"),
            "{text}"
        );
        assert!(
            text.contains("{class=\"graphql\",outcome=\"limited\"} 3"),
            "{text}"
        );
    }

    /// A shared store counting tokens per bucket (never refilling), or failing.
    #[derive(Default)]
    struct Store {
        fail: std::sync::atomic::AtomicBool,
        taken: parking_lot::Mutex<std::collections::HashMap<String, u32>>,
    }

    #[async_trait::async_trait]
    impl SharedLimiter for Store {
        fn kind(&self) -> &'static str {
            "test"
        }

        async fn take(
            &self,
            key: &str,
            rule: LimitRule,
            cost: u32,
        ) -> Result<Result<(), Duration>, meshql_core::SharedLimitError> {
            if self.fail.load(Ordering::Relaxed) {
                return Err(meshql_core::SharedLimitError("down".into()));
            }
            let mut taken = self.taken.lock();
            let held = taken.entry(key.to_owned()).or_default();
            if *held + cost > rule.burst {
                return Ok(Err(rule.interval));
            }
            *held += cost;
            Ok(Ok(()))
        }
    }

    /// Two processes sharing a store share each caller's bucket; when the store fails, each
    /// decides by its own buckets (the limit per process) and counts the fallbacks.
    #[test]
    fn a_shared_store_decides_and_its_failures_fall_back_to_the_table() {
        let store = Arc::new(Store::default());
        let process = || {
            RateLimiter::new(
                &spec(1, 3, 100),
                Arc::new(meshql_core::NoAuth),
                Some(store.clone() as Arc<dyn SharedLimiter>),
            )
        };
        let (one, two) = (process(), process());
        let alice = one.caller(None, ip(1));
        let bob = one.caller(None, ip(2));
        assert!(block_on(one.admit(Class::Reads, &alice, 1)).is_ok());
        assert!(block_on(two.admit(Class::Reads, &alice, 1)).is_ok());
        assert!(block_on(one.admit(Class::Reads, &alice, 1)).is_ok());
        // the burst of 3 is spent across both processes
        let refusal = block_on(two.admit(Class::Reads, &alice, 1)).unwrap_err();
        assert_eq!(refusal.retry_after_seconds(), 1);
        assert!(block_on(one.admit(Class::Reads, &alice, 1)).is_err());
        assert!(block_on(two.admit(Class::Reads, &bob, 1)).is_ok());
        assert_eq!(
            store.taken.lock().get("reads:a:0.0.0.1").copied(),
            Some(3),
            "{:?}",
            store.taken.lock()
        );
        // the store fails: each process allows alice its own burst, then refuses
        store.fail.store(true, Ordering::Relaxed);
        for process in [&one, &two] {
            for _ in 0..3 {
                assert!(block_on(process.admit(Class::Reads, &alice, 1)).is_ok());
            }
            assert!(block_on(process.admit(Class::Reads, &alice, 1)).is_err());
        }
        let mut text = String::new();
        one.collect(&mut text);
        assert!(
            text.contains("meshql_rate_limit_shared_fallbacks_total{class=\"reads\"} 4"),
            "{text}"
        );
        assert!(
            text.contains("{class=\"reads\",outcome=\"allowed\"} 5"),
            "{text}"
        );
        assert!(
            text.contains("{class=\"reads\",outcome=\"limited\"} 2"),
            "{text}"
        );
        // it answers again: the shared bucket decides again
        store.fail.store(false, Ordering::Relaxed);
        assert!(block_on(one.admit(Class::Reads, &alice, 1)).is_err());
        let mut text = String::new();
        one.collect(&mut text);
        assert!(
            text.contains("meshql_rate_limit_shared_fallbacks_total{class=\"reads\"} 4"),
            "{text}"
        );
        // without a store, no fallback series
        let mut text = String::new();
        RateLimiter::new(&spec(1, 3, 100), Arc::new(meshql_core::NoAuth), None).collect(&mut text);
        assert!(!text.contains("fallbacks"), "{text}");
    }

    /// A flood of distinct callers leaves at most `max_callers` buckets.
    #[test]
    fn the_bucket_table_stays_within_max_callers() {
        let limiter = RateLimiter::new(&spec(1, 1, 1_000), Arc::new(meshql_core::NoAuth), None);
        for n in 0..50_000 {
            let caller = limiter.caller(None, ip(n));
            assert!(block_on(limiter.admit(Class::Reads, &caller, 1)).is_ok());
        }
        let held = limiter.callers_in(Class::Reads);
        assert!(held <= 1_000, "{held} buckets for max_callers = 1000");
        assert!(held > 0);
    }

    /// A bucket left alone until it is full again is dropped.
    #[test]
    fn idle_full_buckets_are_forgotten() {
        // 1000 per second, burst 1: full again after 1 ms, forgotten after the 1 s floor
        let limiter = RateLimiter::new(&spec(1000, 1, 100), Arc::new(meshql_core::NoAuth), None);
        for n in 0..10 {
            let caller = limiter.caller(None, ip(n));
            block_on(limiter.admit(Class::Reads, &caller, 1)).unwrap();
        }
        assert_eq!(limiter.callers_in(Class::Reads), 10);
        std::thread::sleep(Duration::from_millis(1_200));
        assert_eq!(limiter.callers_in(Class::Reads), 0);
    }
}
