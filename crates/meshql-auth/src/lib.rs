//! meshql's JWT authorizers (`auth.type = "jwt"` and `"casbin"`).
//!
//! A caller's identity is the `sub` claim of its `Authorization: Bearer <JWT>`; with Casbin
//! roles, its tokens are the roles the policy gives that subject. By default a token counts
//! only once it verifies:
//!
//! * the signature, with an HMAC secret (HS256/384/512), PEM public keys (RS256/384/512,
//!   PS256/384/512, ES256, ES384, EdDSA) or the keys of a JWKS URL (fetched at start, refreshed
//!   periodically and when a token names an unknown `kid`, rate limited);
//! * the algorithm: one the verifying key supports, and among `algorithms` when configured
//!   (`none` never);
//! * `exp` (required by default) and `nbf`, with a leeway; `iss` and `aud` when configured;
//!   `sub` present, a non-empty string.
//!
//! Roles for permissions come from a claim (`auth.roles_claim`, [`JwtAuthorizer::with_roles_claim`])
//! or from the Casbin policy; [`permissions`] turns them into grants per entity.
//!
//! Anything else is an [`AuthError`] (401). `trusted_gateway = true` keeps MeshQL's model —
//! tokens decoded, never verified, because a gateway in front verified them — and is named so
//! that nobody runs it by accident.

mod keys;
pub mod permissions;
mod settings;
mod verify;

pub use jsonwebtoken::Algorithm;
pub use keys::inspect_public_key;
pub use settings::{
    algorithm_name, parse_algorithm, JwtSettings, PublicKeyPem, Secret, Verification,
    VerifySettings, ALGORITHM_NAMES, DEFAULT_JWKS_MIN_REFRESH_SECS, DEFAULT_JWKS_REFRESH_SECS,
    DEFAULT_LEEWAY_SECS, MIN_SECRET_BYTES,
};

use base64::Engine;
use meshql_core::{AuthError, Authorizer, Caller, Credentials, Principal};
use std::collections::HashMap;
use std::sync::Arc;
use verify::Verifier;

/// Identifies callers by the `sub` of their Bearer JWT (see the crate docs).
pub struct JwtAuthorizer {
    mode: Mode,
    required: bool,
    /// Casbin: the caller's tokens are its subject's roles; `None`: the subject itself.
    roles: Option<HashMap<String, Vec<String>>>,
    /// `auth.roles_claim`, split at dots: where a token carries its roles.
    roles_claim: Option<Vec<String>>,
}

enum Mode {
    Trusted,
    Verify(Arc<Verifier>),
}

impl std::fmt::Debug for JwtAuthorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtAuthorizer")
            .field("verified", &matches!(self.mode, Mode::Verify(_)))
            .field("required", &self.required)
            .field("roles", &self.roles.is_some())
            .finish()
    }
}

impl JwtAuthorizer {
    /// An authorizer ready to verify: a JWKS URL is fetched before this returns (a failure is
    /// logged, and the fetch retried every `jwks_min_refresh` while tokens get 503s), and a
    /// task refreshes it every `jwks_refresh` for as long as the authorizer lives. Must run
    /// inside a Tokio runtime when a JWKS URL is configured.
    pub async fn start(
        settings: &JwtSettings,
        roles: Option<HashMap<String, Vec<String>>>,
    ) -> Result<JwtAuthorizer, String> {
        let authorizer = Self::new(settings, roles)?;
        if let Mode::Verify(v) = &authorizer.mode {
            if let Some(jwks) = &v.jwks {
                if let Err(e) = v.refresh().await {
                    tracing::error!(
                        "auth.jwks_url: {e}; tokens are refused (503) until the key set can be read"
                    );
                }
                let (refresh, min_refresh) = (jwks.refresh, jwks.min_refresh);
                let weak = Arc::downgrade(v);
                tokio::spawn(async move {
                    loop {
                        let loaded = match weak.upgrade() {
                            Some(v) => v.jwks_loaded(),
                            None => return,
                        };
                        tokio::time::sleep(if loaded { refresh } else { min_refresh }).await;
                        let Some(v) = weak.upgrade() else { return };
                        let _ = v.refresh().await;
                    }
                });
            }
        }
        Ok(authorizer)
    }

    /// An authorizer with the configured static keys only: a JWKS URL is fetched only when a
    /// token asks for it, on the current Tokio runtime if there is one. Use [`Self::start`]
    /// in a server.
    pub fn new(
        settings: &JwtSettings,
        roles: Option<HashMap<String, Vec<String>>>,
    ) -> Result<JwtAuthorizer, String> {
        let mode = match &settings.verification {
            Verification::TrustedGateway => Mode::Trusted,
            Verification::Verify(v) => Mode::Verify(Arc::new(Verifier::new(v)?)),
        };
        Ok(JwtAuthorizer {
            mode,
            required: settings.required,
            roles,
            roles_claim: None,
        })
    }

    /// Reads callers' roles from the claim at the dotted `path` (e.g. `realm_access.roles`):
    /// a string or an array of strings.
    pub fn with_roles_claim(mut self, path: Option<&str>) -> Self {
        self.roles_claim = path.map(|p| p.split('.').map(str::to_owned).collect());
        self
    }

    /// The caller of a verified (or, trusted, decoded) subject with its claim roles.
    fn caller_of(&self, subject: String, claim_roles: Vec<String>) -> Caller {
        let roles = match &self.roles {
            // Casbin: the policy's roles of the subject
            Some(roles) => roles.get(&subject).cloned().unwrap_or_default(),
            None => claim_roles,
        };
        Caller {
            credentials: self.tokens_of(subject.clone()),
            principal: Principal {
                subject: Some(subject),
                roles,
            },
        }
    }

    fn anonymous(&self) -> Result<Credentials, AuthError> {
        if self.required {
            Err(AuthError::Missing)
        } else {
            Ok(Credentials::Tokens(Vec::new()))
        }
    }

    fn tokens_of(&self, subject: String) -> Credentials {
        Credentials::Tokens(match &self.roles {
            None => vec![subject],
            Some(roles) => roles.get(&subject).cloned().unwrap_or_default(),
        })
    }
}

impl Authorizer for JwtAuthorizer {
    fn caller(&self, authorization: Option<&str>) -> Result<Caller, AuthError> {
        let Some(header) = authorization.map(str::trim).filter(|h| !h.is_empty()) else {
            return self.anonymous().map(|credentials| Caller {
                credentials,
                principal: Principal::default(),
            });
        };
        match &self.mode {
            Mode::Trusted => match unverified_claims(header) {
                Some((sub, claims)) => {
                    let roles = match &self.roles_claim {
                        Some(path) => permissions::roles_at(&claims, path),
                        None => Vec::new(),
                    };
                    Ok(self.caller_of(sub, roles))
                }
                None => self.anonymous().map(|credentials| Caller {
                    credentials,
                    principal: Principal::default(),
                }),
            },
            Mode::Verify(v) => {
                let token = bearer_token(header).ok_or(AuthError::NotBearer)?;
                if token.is_empty() {
                    return Err(AuthError::Malformed("empty Bearer token".into()));
                }
                let (sub, roles) = v.verify_claims(token, self.roles_claim.as_deref())?;
                Ok(self.caller_of(sub, roles))
            }
        }
    }

    fn credentials(&self, authorization: Option<&str>) -> Result<Credentials, AuthError> {
        let Some(header) = authorization.map(str::trim).filter(|h| !h.is_empty()) else {
            return self.anonymous();
        };
        match &self.mode {
            // as MeshQL: whatever cannot be read is no identity
            Mode::Trusted => match unverified_subject(header) {
                Some(sub) => Ok(self.tokens_of(sub)),
                None => self.anonymous(),
            },
            Mode::Verify(v) => {
                let token = bearer_token(header).ok_or(AuthError::NotBearer)?;
                if token.is_empty() {
                    return Err(AuthError::Malformed("empty Bearer token".into()));
                }
                Ok(self.tokens_of(v.verify_claims(token, None)?.0))
            }
        }
    }
}

/// The token of a `Bearer <token>` header value (the scheme is case-insensitive).
fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, token) = header.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

/// The `sub` claim of a `Bearer <jwt>` header value, read **without any verification**
/// (`trusted_gateway = true` only).
pub fn unverified_subject(authorization: &str) -> Option<String> {
    unverified_claims(authorization).map(|(sub, _)| sub)
}

/// The `sub` and every claim of a `Bearer <jwt>` header value, read **without any
/// verification** (`trusted_gateway = true` only).
fn unverified_claims(
    authorization: &str,
) -> Option<(String, serde_json::Map<String, serde_json::Value>)> {
    let token = bearer_token(authorization)?;
    let mut parts = token.split('.');
    let (_header, claims, _sig) = (parts.next()?, parts.next()?, parts.next()?);
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(claims.trim_end_matches('='))
        .ok()?;
    let value: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&bytes).ok()?;
    let sub = value
        .get("sub")?
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_owned)?;
    Some((sub, value))
}

#[cfg(test)]
mod tests;
