//! `[cache] redis = { … }`: the block's fields, their checks and their registration.

use meshql_core::{parse_settings, SettingError};
use schemars::JsonSchema;
use serde::Deserialize;
use std::time::Duration;

/// The longest `timeout_ms` or `connect_timeout_ms` accepted (a minute).
const MAX_TIMEOUT_MS: u64 = 60_000;

/// The longest prefix accepted.
const MAX_PREFIX_LEN: usize = 128;

/// A Redis shared by several meshql processes as their read cache (`[cache] redis`) or their
/// rate limits' store (`[server.rate_limit] redis`). Keys start with `<prefix>:`. For the
/// cache, tag generations and stamps have no expiry, answers expire after the cache's `ttl`,
/// so the server must not evict keys without an expiry (`maxmemory-policy` `noeviction` or
/// one of the `volatile-*` policies); rate limits' buckets all expire.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    /// Server URL: `redis://[user:password@]host[:port][/db]`, e.g. `redis://127.0.0.1:6379`,
    /// or `rediss://…` for TLS (the server's certificate is verified, its name included).
    pub url: String,
    /// With `rediss://`: a PEM file of the certificate authorities to trust instead of the
    /// system's (a path relative to the working directory, as libpq's `sslrootcert`).
    #[serde(default)]
    pub ca_file: Option<std::path::PathBuf>,
    /// Every key starts with `<prefix>:`, so several services can share one Redis
    /// (letters, digits, `_`, `-`, `.` and inner `:`; default `meshql`).
    #[serde(default = "default_prefix")]
    pub prefix: String,
    /// Every call to Redis is bounded by this many milliseconds; a slower answer counts as a
    /// failure: a read goes to storage, a rate-limited request is decided by the process's own
    /// buckets (default 100, at most 60000).
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// A connection attempt is bounded by this many milliseconds (default 1000, at most
    /// 60000).
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
}

fn default_prefix() -> String {
    "meshql".into()
}
fn default_timeout_ms() -> u64 {
    100
}
fn default_connect_timeout_ms() -> u64 {
    1000
}

impl RedisSettings {
    /// Reads and checks a `[cache] redis` block.
    pub fn from_value(settings: &serde_json::Value) -> Result<RedisSettings, SettingError> {
        let settings = Self::read(settings)?;
        settings.check()?;
        Ok(settings)
    }

    /// The fields as written, not yet checked.
    pub(crate) fn read(settings: &serde_json::Value) -> Result<RedisSettings, SettingError> {
        if settings.get("url").is_none() {
            return Err(SettingError::new(
                "url",
                "`redis` needs `url = \"redis://host:port\"`",
            ));
        }
        parse_settings(settings)
    }

    pub(crate) fn check(&self) -> Result<(), SettingError> {
        let url = self.url.trim();
        if url.is_empty() {
            return Err(SettingError::new(
                "url",
                "name the server, e.g. `redis://127.0.0.1:6379`",
            ));
        }
        if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
            return Err(SettingError::new(
                "url",
                "must start with `redis://`, e.g. `redis://127.0.0.1:6379`",
            ));
        }
        if self.ca_file.is_some() && !url.starts_with("rediss://") {
            return Err(SettingError::new(
                "ca_file",
                "is for TLS: the url must start with `rediss://`",
            ));
        }
        // The client library's own parser (the URL is not repeated: it may hold a password).
        self.client()?;
        check_prefix(&self.prefix)?;
        for (field, value) in [
            ("timeout_ms", self.timeout_ms),
            ("connect_timeout_ms", self.connect_timeout_ms),
        ] {
            if value == 0 || value > MAX_TIMEOUT_MS {
                return Err(SettingError::new(
                    field,
                    format!("must be between 1 and {MAX_TIMEOUT_MS} milliseconds, not {value}"),
                ));
            }
        }
        Ok(())
    }

    /// The client of these settings: the URL parsed, and for `rediss://` with a `ca_file`,
    /// its certificates read. Errors name the field.
    pub(crate) fn client(&self) -> Result<redis::Client, SettingError> {
        let url = self.url.trim();
        let Some(path) = &self.ca_file else {
            return redis::Client::open(url)
                .map_err(|e| SettingError::new("url", format!("not a usable Redis URL: {e}")));
        };
        let pem = std::fs::read(path).map_err(|e| {
            SettingError::new("ca_file", format!("cannot read {}: {e}", path.display()))
        })?;
        if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
            return Err(SettingError::new(
                "ca_file",
                format!("{} holds no PEM certificate", path.display()),
            ));
        }
        let certificates = redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pem),
        };
        redis::Client::build_with_tls(url, certificates).map_err(|e| {
            let field = if e.to_string().contains("certificate") {
                "ca_file"
            } else {
                "url"
            };
            SettingError::new(field, format!("not usable: {e}"))
        })
    }

    /// The bound of every call.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// The bound of a connection attempt.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }
}

fn check_prefix(prefix: &str) -> Result<(), SettingError> {
    if prefix.is_empty() {
        return Err(SettingError::new(
            "prefix",
            "must not be empty (keys are `<prefix>:…`)",
        ));
    }
    if prefix.len() > MAX_PREFIX_LEN {
        return Err(SettingError::new(
            "prefix",
            format!("must be at most {MAX_PREFIX_LEN} characters"),
        ));
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':');
    if !prefix.chars().all(allowed) || prefix.starts_with(':') || prefix.ends_with(':') {
        return Err(SettingError::new(
            "prefix",
            format!(
                "`{prefix}` is not a key prefix (letters, digits, `_`, `-`, `.` and `:` \
                 not at either end)"
            ),
        ));
    }
    Ok(())
}

/// The URL with any password replaced by `***` (for `Debug` and logs).
pub(crate) fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => {
            let user = rest[..at].split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{}", &rest[at + 1..])
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn settings_resolve_with_their_defaults() {
        let s = RedisSettings::from_value(&json!({ "url": "redis://127.0.0.1:6379" })).unwrap();
        assert_eq!(s.prefix, "meshql");
        assert_eq!(s.timeout(), Duration::from_millis(100));
        assert_eq!(s.connect_timeout(), Duration::from_millis(1000));

        let s = RedisSettings::from_value(&json!({
            "url": "redis://:pw@h:1/2",
            "prefix": "eggs:cache",
            "timeout_ms": 60000,
            "connect_timeout_ms": 5,
        }))
        .unwrap();
        assert_eq!(s.prefix, "eggs:cache");
        assert_eq!(s.timeout_ms, 60000);
        assert_eq!(s.connect_timeout_ms, 5);
    }
}
