//! `[cache]`: bounds checked and defaulted; a shared cache's own settings are kept opaque for
//! its crate to check (see `meshql_engine::SharedCaches`).

use super::Resolver;
use crate::model::CacheConfig;
use std::time::Duration;
use toml::Spanned;

/// The read cache, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheSpec {
    pub max_bytes: u64,
    pub ttl: Duration,
    pub settle: Duration,
    /// A shared cache is consulted by every read of an operation while this share hit.
    pub min_hit_rate: f64,
    /// A shared cache: its kind (`"redis"`), its settings, and the line they start at.
    pub shared: Option<SharedCacheSpec>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SharedCacheSpec {
    pub kind: &'static str,
    pub settings: serde_json::Value,
    pub line: Option<usize>,
}

impl CacheSpec {
    pub const DEFAULT_MAX_BYTES: u64 = 64 << 20;
    pub const DEFAULT_TTL_MS: u64 = 300_000;
    pub const DEFAULT_SETTLE_MS: u64 = 5_000;
    pub const DEFAULT_MIN_HIT_RATE: f64 = 0.1;
}

impl Resolver {
    fn cache_setting(
        &mut self,
        at: &Option<Spanned<u64>>,
        key: &str,
        low: u64,
        high: u64,
        default: u64,
    ) -> u64 {
        let Some(at) = at.as_ref() else {
            return default;
        };
        let v = *at.get_ref();
        if v < low {
            self.error(
                Some(at),
                format!("cache.{key}"),
                format!("must be at least {low}"),
            );
        } else if v > high {
            self.error(Some(at), format!("cache.{key}"), format!("at most {high}"));
        }
        v.clamp(low, high)
    }

    /// `[cache]`, or `None` when absent or disabled.
    pub(super) fn resolve_cache(
        &mut self,
        cache: &Option<Spanned<CacheConfig>>,
    ) -> Option<CacheSpec> {
        let c = cache.as_ref()?.get_ref();
        let max_bytes = self.cache_setting(
            &c.max_bytes,
            "max_bytes",
            1 << 20,
            1 << 40,
            CacheSpec::DEFAULT_MAX_BYTES,
        );
        let ttl = self.cache_setting(
            &c.ttl_ms,
            "ttl_ms",
            1,
            86_400_000,
            CacheSpec::DEFAULT_TTL_MS,
        );
        let settle = self.cache_setting(
            &c.settle_ms,
            "settle_ms",
            100,
            86_400_000,
            CacheSpec::DEFAULT_SETTLE_MS,
        );
        let min_hit_rate = match &c.min_hit_rate {
            None => CacheSpec::DEFAULT_MIN_HIT_RATE,
            Some(at) => {
                let v = *at.get_ref();
                if !(0.0..=1.0).contains(&v) {
                    self.error(
                        Some(at),
                        "cache.min_hit_rate",
                        "must be between 0 and 1 (a share of reads)",
                    );
                }
                if c.redis.is_none() {
                    self.warn(
                        at,
                        "cache.min_hit_rate",
                        "has no effect without a shared cache (redis): the in-process cache \
                         is always consulted",
                    );
                }
                if v.is_nan() {
                    CacheSpec::DEFAULT_MIN_HIT_RATE
                } else {
                    v.clamp(0.0, 1.0)
                }
            }
        };
        let shared = c.redis.as_ref().map(|r| SharedCacheSpec {
            kind: "redis",
            settings: r.get_ref().clone(),
            line: Some(crate::error::line_of(&self.text, r.span().start)),
        });
        if c.enabled == Some(false) {
            return None;
        }
        Some(CacheSpec {
            max_bytes,
            ttl: Duration::from_millis(ttl),
            settle: Duration::from_millis(settle),
            min_hit_rate,
            shared,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::resolve::load_with_env;
    use crate::{ConfigErrors, ResolvedConfig};

    const ENTITY: &str = "[[entity]]\nname = \"hen\"\n[entity.rest]\n";

    fn load_str(text: &str, _: &str) -> Result<ResolvedConfig, ConfigErrors> {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("meshql.toml");
        std::fs::write(&f, text).unwrap();
        load_with_env(&f, |_| None)
    }

    #[test]
    fn a_cache_block_resolves_with_defaults_and_its_shared_settings() {
        let c = load_str(&format!("[cache]\n{ENTITY}"), "meshql.toml").unwrap();
        let cache = c.cache.expect("a cache");
        assert_eq!(cache.max_bytes, 64 << 20);
        assert_eq!(cache.ttl.as_millis(), 300_000);
        assert!(cache.shared.is_none());
        let c = load_str(
            &format!(
                "[cache]\nttl_ms = 1000\nredis = {{ url = \"redis://127.0.0.1:16379\" }}\n{ENTITY}"
            ),
            "meshql.toml",
        )
        .unwrap();
        let shared = c.cache.unwrap().shared.unwrap();
        assert_eq!(shared.kind, "redis");
        assert_eq!(shared.settings["url"], "redis://127.0.0.1:16379");
        assert_eq!(shared.line, Some(3));
        let off = load_str(
            &format!("[cache]\nenabled = false\n{ENTITY}"),
            "meshql.toml",
        )
        .unwrap();
        assert!(off.cache.is_none());
        assert!(load_str(ENTITY, "meshql.toml").unwrap().cache.is_none());
    }

    #[test]
    fn a_minimum_hit_rate_is_for_a_shared_cache() {
        let c = load_str(&format!("[cache]\n{ENTITY}"), "meshql.toml").unwrap();
        assert_eq!(c.cache.unwrap().min_hit_rate, 0.1);
        let c = load_str(
            &format!(
                "[cache]\nmin_hit_rate = 0\nredis = {{ url = \"redis://127.0.0.1:16379\" }}\n{ENTITY}"
            ),
            "meshql.toml",
        )
        .unwrap();
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        assert_eq!(c.cache.unwrap().min_hit_rate, 0.0);
        let c = load_str(
            &format!("[cache]\nmin_hit_rate = 0.3\n{ENTITY}"),
            "meshql.toml",
        )
        .unwrap();
        let w = &c.warnings[0];
        assert_eq!((w.field.as_str(), w.line), ("cache.min_hit_rate", Some(2)));
        assert!(
            w.message.contains("without a shared cache"),
            "{}",
            w.message
        );
    }

    #[test]
    fn cache_bounds_are_checked_at_their_line() {
        for (setting, field, message) in [
            ("max_bytes = 10", "cache.max_bytes", "at least"),
            ("ttl_ms = 0", "cache.ttl_ms", "at least 1"),
            ("settle_ms = 99999999999", "cache.settle_ms", "at most"),
            (
                "min_hit_rate = 1.5",
                "cache.min_hit_rate",
                "between 0 and 1",
            ),
            (
                "min_hit_rate = -0.1",
                "cache.min_hit_rate",
                "between 0 and 1",
            ),
        ] {
            let e = load_str(&format!("[cache]\n{setting}\n{ENTITY}"), "meshql.toml").unwrap_err();
            let e = &e.0[0];
            assert_eq!(e.field, field, "{setting}");
            assert_eq!(e.line, Some(2), "{setting}");
            assert!(e.message.contains(message), "{setting}: {}", e.message);
        }
        let e = load_str(&format!("[cache]\nsize = 3\n{ENTITY}"), "meshql.toml").unwrap_err();
        assert!(e.to_string().contains("size"), "{e}");
    }
}
