//! `[auth]`: the caller identification a service starts with, checked: Casbin files, and for
//! JWTs the keys (secret length, PEM files, JWKS URL), algorithms and claims settings — or the
//! explicit `trusted_gateway` mode, which is warned about.

use super::Resolver;
use crate::model::{AuthConfig, AuthKind};
use meshql_auth::{
    algorithm_name, inspect_public_key, parse_algorithm, Algorithm, JwtSettings, PublicKeyPem,
    Secret, Verification, VerifySettings, ALGORITHM_NAMES, MIN_SECRET_BYTES,
};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use toml::Spanned;

/// How callers are identified (`[auth]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthSpec {
    None,
    /// The `sub` of a Bearer JWT is the caller's token.
    Jwt(JwtSettings),
    /// JWT subjects and the roles a Casbin policy gives them.
    Casbin {
        jwt: JwtSettings,
        roles: BTreeMap<String, Vec<String>>,
        /// The model and policy files' text (for the enforcer).
        files: CasbinFiles,
    },
}

impl AuthSpec {
    /// The JWT settings of `jwt` and `casbin`.
    pub fn jwt(&self) -> Option<&JwtSettings> {
        match self {
            AuthSpec::None => None,
            AuthSpec::Jwt(jwt) | AuthSpec::Casbin { jwt, .. } => Some(jwt),
        }
    }
}

/// A Casbin model and policy as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CasbinFiles {
    pub model: String,
    pub model_file: PathBuf,
    pub policy: String,
    pub policy_file: PathBuf,
}

/// The settings that only JWT modes read, by name, where they are set.
fn jwt_only_settings(a: &AuthConfig) -> Vec<(&'static str, usize)> {
    let mut set = Vec::new();
    let mut note = |name: &'static str, span: Option<std::ops::Range<usize>>| {
        if let Some(span) = span {
            set.push((name, span.start));
        }
    };
    note("required", a.required.as_ref().map(Spanned::span));
    note("roles_claim", a.roles_claim.as_ref().map(Spanned::span));
    note(
        "trusted_gateway",
        a.trusted_gateway.as_ref().map(Spanned::span),
    );
    // an empty secret counts as none (a config may take it from an optional variable)
    note(
        "secret",
        a.secret
            .as_ref()
            .filter(|s| !s.get_ref().is_empty())
            .map(Spanned::span),
    );
    note("public_keys", a.public_keys.first().map(Spanned::span));
    note("jwks_url", a.jwks_url.as_ref().map(Spanned::span));
    note("algorithms", a.algorithms.as_ref().map(Spanned::span));
    note("issuer", a.issuer.as_ref().map(Spanned::span));
    note("audience", a.audience.as_ref().map(Spanned::span));
    note("leeway_secs", a.leeway_secs.as_ref().map(Spanned::span));
    note("require_exp", a.require_exp.as_ref().map(Spanned::span));
    note(
        "jwks_refresh_secs",
        a.jwks_refresh_secs.as_ref().map(Spanned::span),
    );
    note(
        "jwks_min_refresh_secs",
        a.jwks_min_refresh_secs.as_ref().map(Spanned::span),
    );
    set
}

impl Resolver {
    /// A warning at a byte offset of the config file.
    fn warn_at(&mut self, offset: usize, field: String, message: String) {
        self.warnings.push(crate::ConfigError {
            file: self.file.clone(),
            line: Some(crate::error::line_of(&self.text, offset)),
            field,
            message,
        });
    }

    /// `[auth]`; `None` after reporting an error.
    pub(super) fn resolve_auth(&mut self, a: &AuthConfig) -> Option<AuthSpec> {
        let kind = a.kind();
        if kind != AuthKind::Casbin {
            // a config switching `type` through the environment may keep its Casbin files
            for (key, at) in [("model", &a.model), ("policy", &a.policy)] {
                if let Some(at) = at {
                    self.warn(
                        at,
                        format!("auth.{key}"),
                        "ignored: Casbin files are read only with type = \"casbin\"",
                    );
                }
            }
        }
        if kind == AuthKind::None {
            for (key, offset) in jwt_only_settings(a) {
                self.warn_at(
                    offset,
                    format!("auth.{key}"),
                    "ignored: JWT settings are read only with type = \"jwt\" or \"casbin\"".into(),
                );
            }
            return Some(AuthSpec::None);
        }
        let jwt = self.resolve_jwt(a);
        if kind == AuthKind::Jwt {
            return jwt.map(AuthSpec::Jwt);
        }
        let (roles, files) = self.resolve_casbin(a)?;
        Some(AuthSpec::Casbin {
            jwt: jwt?,
            roles,
            files,
        })
    }

    fn resolve_casbin(
        &mut self,
        a: &AuthConfig,
    ) -> Option<(BTreeMap<String, Vec<String>>, CasbinFiles)> {
        let (Some(model), Some(policy)) = (&a.model, &a.policy) else {
            let missing = if a.model.is_none() { "model" } else { "policy" };
            self.error::<()>(
                None,
                format!("auth.{missing}"),
                format!("type = \"casbin\" needs `{missing}`: the Casbin {missing} file"),
            );
            return None;
        };
        let mut read = |at: &Spanned<String>, key: &str| -> Option<(PathBuf, String)> {
            let path = self.path_of(at.get_ref());
            match std::fs::read_to_string(&path) {
                Ok(text) => Some((path, text)),
                Err(e) => {
                    self.error(
                        Some(at),
                        format!("auth.{key}"),
                        format!("cannot read {}: {e}", path.display()),
                    );
                    None
                }
            }
        };
        let ((model_path, model_text), (policy_path, policy_text)) =
            (read(model, "model")?, read(policy, "policy")?);
        if let Err(p) = crate::casbin::check_model(&model_text) {
            self.error_in(&model_path, p.line, "auth.model".into(), p.message);
            return None;
        }
        match crate::casbin::roles(&policy_text) {
            Ok(roles) => Some((
                roles,
                CasbinFiles {
                    model: model_text,
                    model_file: model_path,
                    policy: policy_text,
                    policy_file: policy_path,
                },
            )),
            Err(p) => {
                self.error_in(&policy_path, p.line, "auth.policy".into(), p.message);
                None
            }
        }
    }

    /// The JWT settings of `jwt` and `casbin`; `None` after reporting errors.
    fn resolve_jwt(&mut self, a: &AuthConfig) -> Option<JwtSettings> {
        let errors_before = self.errors.len();
        let required = a.required.as_ref().is_some_and(|r| *r.get_ref());
        if let Some(trusted) = a.trusted_gateway.as_ref().filter(|t| *t.get_ref()) {
            self.warn(
                trusted,
                "auth.trusted_gateway",
                "JWTs are NOT verified (no signature, exp, nbf, iss or aud check): meshql \
                 trusts a gateway in front of it to have verified every token, and anyone who \
                 reaches this port directly can act as any user",
            );
            for (key, offset) in jwt_only_settings(a) {
                if !matches!(key, "required" | "trusted_gateway") {
                    self.warn_at(
                        offset,
                        format!("auth.{key}"),
                        "ignored: tokens are not verified with trusted_gateway = true".into(),
                    );
                }
            }
            return Some(JwtSettings {
                required,
                verification: Verification::TrustedGateway,
            });
        }

        let secret = match a.secret.as_ref().filter(|s| !s.get_ref().is_empty()) {
            None => None,
            Some(s) if s.get_ref().len() < MIN_SECRET_BYTES => {
                self.error(
                    Some(s),
                    "auth.secret",
                    format!(
                        "the HMAC secret is {} bytes; at least {MIN_SECRET_BYTES} are needed \
                         (e.g. `openssl rand -base64 48`)",
                        s.get_ref().len()
                    ),
                );
                None
            }
            Some(s) => Some(Secret(s.get_ref().as_bytes().to_vec())),
        };
        let mut public_keys = Vec::new();
        for (i, at) in a.public_keys.iter().enumerate() {
            let field = format!("auth.public_keys[{i}]");
            let file = self.path_of(at.get_ref());
            let pem = match std::fs::read_to_string(&file) {
                Ok(pem) => pem,
                Err(e) => {
                    self.error(
                        Some(at),
                        field,
                        format!("cannot read key file {}: {e}", file.display()),
                    );
                    continue;
                }
            };
            match inspect_public_key(&pem) {
                Ok((algorithms, _)) => public_keys.push(PublicKeyPem {
                    file,
                    pem,
                    algorithms,
                }),
                Err(e) => self.error(Some(at), field, format!("{}: {e}", file.display())),
            }
        }
        let jwks_url = a.jwks_url.as_ref().and_then(|u| {
            let url = u.get_ref();
            let rest = url
                .strip_prefix("https://")
                .or_else(|| url.strip_prefix("http://"));
            if rest.is_none_or(|r| r.is_empty() || r.starts_with('/')) {
                self.error(
                    Some(u),
                    "auth.jwks_url",
                    format!("`{url}` is not an http(s) URL"),
                );
                return None;
            }
            Some(url.clone())
        });
        if a.secret.as_ref().is_none_or(|s| s.get_ref().is_empty())
            && a.public_keys.is_empty()
            && a.jwks_url.is_none()
        {
            self.error(
                a.kind.as_ref(),
                "auth.type",
                format!(
                    "type = \"{}\" verifies tokens and needs a key: `secret` (HS256/384/512), \
                     `public_keys` (PEM files) or `jwks_url`; or set `trusted_gateway = true` \
                     when a gateway in front of meshql verifies them",
                    if a.kind() == AuthKind::Casbin {
                        "casbin"
                    } else {
                        "jwt"
                    }
                ),
            );
        }

        let mut algorithms = Vec::new();
        if let Some(list) = &a.algorithms {
            if list.get_ref().is_empty() {
                self.error(
                    Some(list),
                    "auth.algorithms",
                    "names no algorithm (leave it out to accept what the keys support)",
                );
            }
            for (i, name) in list.get_ref().iter().enumerate() {
                let field = format!("auth.algorithms[{i}]");
                let Some(alg) = parse_algorithm(name.get_ref()) else {
                    self.error(
                        Some(name),
                        field,
                        format!(
                            "unknown algorithm `{}` (known: {}; `none` is never accepted)",
                            name.get_ref(),
                            ALGORITHM_NAMES.join(", ")
                        ),
                    );
                    continue;
                };
                // with fixed keys only, every algorithm listed must have a key to verify it
                let fits = |algs: &[Algorithm]| algs.contains(&alg);
                let verifiable = a.jwks_url.is_some()
                    || (secret.is_some()
                        && fits(&[Algorithm::HS256, Algorithm::HS384, Algorithm::HS512]))
                    || public_keys.iter().any(|k| fits(&k.algorithms));
                let keys_ok = self.errors.len() == errors_before;
                if !verifiable && keys_ok {
                    self.error(
                        Some(name),
                        field,
                        format!(
                            "no configured key verifies {} ({})",
                            algorithm_name(alg),
                            key_summary(secret.is_some(), &public_keys)
                        ),
                    );
                }
                algorithms.push(alg);
            }
        }

        let mut values = |at: &Option<Spanned<crate::model::OneOrMany>>, key: &str| {
            let Some(at) = at else { return Vec::new() };
            let values = at.get_ref().values();
            if values.is_empty() || values.iter().any(|v| v.is_empty()) {
                self.error(
                    Some(at),
                    format!("auth.{key}"),
                    "give one or more non-empty values",
                );
            }
            values
        };
        let issuers = values(&a.issuer, "issuer");
        let audiences = values(&a.audience, "audience");

        let mut settings = VerifySettings::new(secret, public_keys, jwks_url);
        settings.algorithms = algorithms;
        settings.issuers = issuers;
        settings.audiences = audiences;
        if let Some(l) = &a.leeway_secs {
            if *l.get_ref() > 3600 {
                self.error(
                    Some(l),
                    "auth.leeway_secs",
                    "at most 3600: a larger leeway keeps expired tokens valid",
                );
            }
            settings.leeway_secs = *l.get_ref();
        }
        if let Some(r) = &a.require_exp {
            settings.require_exp = *r.get_ref();
        }
        for (at, key, target) in [
            (
                &a.jwks_refresh_secs,
                "jwks_refresh_secs",
                &mut settings.jwks_refresh,
            ),
            (
                &a.jwks_min_refresh_secs,
                "jwks_min_refresh_secs",
                &mut settings.jwks_min_refresh,
            ),
        ] {
            if let Some(at) = at {
                if *at.get_ref() == 0 {
                    self.error(Some(at), format!("auth.{key}"), "must be at least 1");
                }
                *target = Duration::from_secs(*at.get_ref());
            }
        }
        if a.jwks_url.is_none() {
            for (key, at) in [
                ("jwks_refresh_secs", &a.jwks_refresh_secs),
                ("jwks_min_refresh_secs", &a.jwks_min_refresh_secs),
            ] {
                if let Some(at) = at {
                    self.warn(at, format!("auth.{key}"), "ignored without `jwks_url`");
                }
            }
        }
        (self.errors.len() == errors_before).then_some(JwtSettings {
            required,
            verification: Verification::Verify(settings),
        })
    }
}

/// What the configured fixed keys verify, for error messages.
fn key_summary(secret: bool, public_keys: &[PublicKeyPem]) -> String {
    let mut parts = Vec::new();
    if secret {
        parts.push("secret: HS256, HS384, HS512".to_owned());
    }
    for k in public_keys {
        let names: Vec<&str> = k.algorithms.iter().map(|a| algorithm_name(*a)).collect();
        parts.push(format!("{}: {}", k.file.display(), names.join(", ")));
    }
    parts.join("; ")
}
