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
//! Anything else is an [`AuthError`] (401). `trusted_gateway = true` keeps MeshQL's model —
//! tokens decoded, never verified, because a gateway in front verified them — and is named so
//! that nobody runs it by accident.

mod keys;
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
use meshql_core::{AuthError, Authorizer, Credentials};
use std::collections::HashMap;
use std::sync::Arc;
use verify::Verifier;

/// Identifies callers by the `sub` of their Bearer JWT (see the crate docs).
pub struct JwtAuthorizer {
    mode: Mode,
    required: bool,
    /// Casbin: the caller's tokens are its subject's roles; `None`: the subject itself.
    roles: Option<HashMap<String, Vec<String>>>,
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
        })
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
                Ok(self.tokens_of(v.verify(token)?))
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
    let token = bearer_token(authorization)?;
    let mut parts = token.split('.');
    let (_header, claims, _sig) = (parts.next()?, parts.next()?, parts.next()?);
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(claims.trim_end_matches('='))
        .ok()?;
    let value: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    value
        .get("sub")?
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

#[cfg(test)]
mod tests;
