//! `[server.rate_limit]`: each class's token bucket checked and turned into the two numbers
//! the limiter works with — the time one token takes to come back and the most tokens a
//! caller may hold.

use super::Resolver;
use crate::model::{BucketConfig, RateLimitConfig};
use std::time::Duration;
use toml::Spanned;

/// The most tokens per second a class may be given.
const MAX_PER_SECOND: f64 = 1_000_000.0;
/// The fewest: one token every 1000 s (a bucket's refill time stays far from overflowing
/// the limiter's nanosecond clock).
const MIN_PER_SECOND: f64 = 0.001;
/// The largest burst.
const MAX_BURST: u64 = 1_000_000;
/// The most callers remembered per class.
const MAX_CALLERS: u64 = 10_000_000;

/// `[server.rate_limit]`, checked; a class that is `None` is not limited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitSpec {
    /// REST GETs, and GraphQL requests when `graphql` is `None`.
    pub reads: Option<BucketSpec>,
    /// REST POST, PUT and DELETE.
    pub writes: Option<BucketSpec>,
    /// GraphQL requests, by cost.
    pub graphql: Option<BucketSpec>,
    /// Callers remembered at once per class (in process).
    pub max_callers: u64,
    /// A store shared by several processes keeping the buckets (`None`: in process only).
    pub shared: Option<SharedLimitSpec>,
}

/// A shared store's block: its kind (`"redis"`), its settings as written (checked by the
/// crate registered for the kind) and the line it starts at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedLimitSpec {
    pub kind: &'static str,
    pub settings: serde_json::Value,
    pub line: Option<usize>,
}

impl RateLimitSpec {
    pub const DEFAULT_MAX_CALLERS: u64 = 100_000;
}

/// One class's bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketSpec {
    /// How long one token takes to come back (1 / `per_second`).
    pub interval: Duration,
    /// The most tokens a caller holds (a full bucket).
    pub burst: u32,
}

impl BucketSpec {
    /// Tokens added per second.
    pub fn per_second(&self) -> f64 {
        1.0 / self.interval.as_secs_f64()
    }
}

impl Resolver {
    /// `[server.rate_limit]`; `None` when it is absent or limits no class (a warning then).
    pub(super) fn resolve_rate_limit(
        &mut self,
        at: &Spanned<RateLimitConfig>,
    ) -> Option<RateLimitSpec> {
        let r = at.get_ref();
        let reads = self.resolve_bucket(&r.reads, "reads");
        let writes = self.resolve_bucket(&r.writes, "writes");
        let graphql = self.resolve_bucket(&r.graphql, "graphql");
        let mut max_callers = RateLimitSpec::DEFAULT_MAX_CALLERS;
        if let Some(n) = &r.max_callers {
            let v = *n.get_ref();
            if (1..=MAX_CALLERS).contains(&v) {
                max_callers = v;
            } else {
                self.error(
                    Some(n),
                    "server.rate_limit.max_callers",
                    format!("must be between 1 and {MAX_CALLERS}"),
                );
            }
        }
        if r.reads.is_none() && r.writes.is_none() && r.graphql.is_none() {
            self.warn(
                at,
                "server.rate_limit",
                "limits nothing: give it `reads`, `writes` or `graphql` (e.g. `reads = { per_second = 100, burst = 200 }`)",
            );
            return None;
        }
        let shared = r.redis.as_ref().map(|settings| SharedLimitSpec {
            kind: "redis",
            settings: settings.get_ref().clone(),
            line: Some(crate::error::line_of(&self.text, settings.span().start)),
        });
        Some(RateLimitSpec {
            reads,
            writes,
            graphql,
            max_callers,
            shared,
        })
    }

    /// One class's `{ per_second, burst }`.
    fn resolve_bucket(
        &mut self,
        at: &Option<Spanned<BucketConfig>>,
        class: &str,
    ) -> Option<BucketSpec> {
        let at = at.as_ref()?;
        let b = at.get_ref();
        let field = |key: &str| format!("server.rate_limit.{class}.{key}");
        let Some(rate) = &b.per_second else {
            self.error(
                Some(at),
                field("per_second"),
                "required: the tokens added per second (e.g. `per_second = 50`)",
            );
            return None;
        };
        let per_second = *rate.get_ref();
        if !(MIN_PER_SECOND..=MAX_PER_SECOND).contains(&per_second) {
            self.error(
                Some(rate),
                field("per_second"),
                format!("must be between {MIN_PER_SECOND} and {MAX_PER_SECOND}, not {per_second}"),
            );
            return None;
        }
        let burst = match &b.burst {
            None => per_second.ceil() as u64,
            Some(burst) => {
                let v = *burst.get_ref();
                if !(1..=MAX_BURST).contains(&v) {
                    self.error(
                        Some(burst),
                        field("burst"),
                        format!("must be between 1 and {MAX_BURST}"),
                    );
                    return None;
                }
                v
            }
        };
        Some(BucketSpec {
            interval: Duration::from_secs_f64(1.0 / per_second),
            burst: burst as u32,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resolve::load_with_env;
    use crate::{ConfigErrors, ResolvedConfig};

    fn load(server: &str) -> Result<ResolvedConfig, ConfigErrors> {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("meshql.toml");
        std::fs::write(
            &f,
            format!("port = 1\n{server}\n[[entity]]\nname = \"thing\"\n[entity.rest]\n"),
        )
        .unwrap();
        load_with_env(&f, |_| None)
    }

    #[test]
    fn absent_means_no_limit() {
        assert_eq!(load("").expect("valid").server.rate_limit, None);
    }

    #[test]
    fn every_class_is_read_with_its_defaults() {
        let c = load(
            "[server.rate_limit]\nreads = { per_second = 100, burst = 150 }\n\
             writes = { per_second = 2.5 }\ngraphql = { per_second = 0.5, burst = 3 }\n\
             max_callers = 1000\n",
        )
        .expect("valid");
        let spec = c.server.rate_limit.expect("limits");
        assert_eq!(
            spec.reads,
            Some(BucketSpec {
                interval: Duration::from_millis(10),
                burst: 150
            })
        );
        // the burst defaults to the rate, rounded up
        assert_eq!(
            spec.writes,
            Some(BucketSpec {
                interval: Duration::from_millis(400),
                burst: 3
            })
        );
        assert_eq!(spec.graphql.unwrap().interval, Duration::from_secs(2));
        assert_eq!(spec.max_callers, 1000);
        let only_reads = load("[server.rate_limit]\nreads = { per_second = 1 }\n")
            .expect("valid")
            .server
            .rate_limit
            .unwrap();
        assert_eq!((only_reads.writes, only_reads.graphql), (None, None));
        assert_eq!(only_reads.max_callers, RateLimitSpec::DEFAULT_MAX_CALLERS);
    }

    #[test]
    fn a_redis_block_is_kept_for_its_crate_with_its_line() {
        let spec = load(
            "[server.rate_limit]\nreads = { per_second = 10 }\n\
             redis = { url = \"redis://127.0.0.1:6379\", prefix = \"eggs\" }\n",
        )
        .expect("valid")
        .server
        .rate_limit
        .expect("limits");
        let shared = spec.shared.expect("shared");
        assert_eq!(shared.kind, "redis");
        assert_eq!(shared.settings["prefix"], "eggs");
        assert_eq!(shared.line, Some(4));
        // the table form names its own line too
        let spec = load(
            "[server.rate_limit]\nreads = { per_second = 10 }\n\
             [server.rate_limit.redis]\nurl = \"redis://h:1\"\n",
        )
        .expect("valid")
        .server
        .rate_limit
        .expect("limits");
        assert_eq!(spec.shared.expect("shared").line, Some(4));
        let none = load("[server.rate_limit]\nreads = { per_second = 10 }\n")
            .expect("valid")
            .server
            .rate_limit
            .expect("limits");
        assert_eq!(none.shared, None);
    }

    #[test]
    fn a_table_without_classes_is_warned_about_and_limits_nothing() {
        let c = load("[server.rate_limit]\nmax_callers = 10\n").expect("valid");
        assert_eq!(c.server.rate_limit, None);
        assert!(
            c.warnings
                .iter()
                .any(|w| w.field == "server.rate_limit" && w.message.contains("limits nothing")),
            "{:?}",
            c.warnings
        );
    }

    #[test]
    fn errors_name_the_line_and_field() {
        for (table, field, line, message) in [
            (
                "reads = { burst = 5 }",
                "server.rate_limit.reads.per_second",
                3,
                "required",
            ),
            (
                "writes = { per_second = 0 }",
                "server.rate_limit.writes.per_second",
                3,
                "between 0.001 and",
            ),
            (
                "graphql = { per_second = -3 }",
                "server.rate_limit.graphql.per_second",
                3,
                "between 0.001 and",
            ),
            (
                "reads = { per_second = 2000000 }",
                "server.rate_limit.reads.per_second",
                3,
                "and 1000000, not 2000000",
            ),
            (
                "reads = { per_second = 10, burst = 0 }",
                "server.rate_limit.reads.burst",
                3,
                "between 1 and",
            ),
            (
                "reads = { per_second = 10 }\nmax_callers = 0",
                "server.rate_limit.max_callers",
                4,
                "between 1 and",
            ),
            (
                "[server.rate_limit.writes]\nper_second = \"fast\"",
                "server.rate_limit.writes.per_second",
                4,
                "",
            ),
        ] {
            let errors = load(&format!("[server.rate_limit]\n{table}\n"))
                .expect_err(table)
                .0;
            assert_eq!(errors.len(), 1, "{table}: {errors:?}");
            let e = &errors[0];
            assert_eq!(e.field, field, "{table}: {e:?}");
            assert_eq!(e.line, Some(line), "{table}: {e:?}");
            assert!(e.message.contains(message), "{table}: {}", e.message);
        }
        let e = load("[server.rate_limit]\nreads = { per_second = 1, rate = 2 }\n")
            .expect_err("unknown field")
            .0;
        assert!(e[0].message.contains("unknown field"), "{e:?}");
        assert_eq!(e[0].line, Some(3), "{e:?}");
    }
}
