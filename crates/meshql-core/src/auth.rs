//! Authorization: who is asking (credentials from the `Authorization` header) and which
//! stored documents they may see (overlap with the document's authorized tokens).
//!
//! The [`Authorizer`] trait takes the raw header value, so that signature-verifying JWT
//! authorizers and role mappings (Casbin-style) can be added without touching callers.

use base64::Engine;

/// What a caller may read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// Everything is visible (NoAuth).
    Unrestricted,
    /// Documents whose authorized tokens are empty, or overlap these tokens.
    Tokens(Vec<String>),
}

impl Credentials {
    /// The storage-level filter these credentials imply.
    pub fn filter(&self) -> crate::TokenFilter {
        match self {
            Credentials::Unrestricted => crate::TokenFilter::All,
            Credentials::Tokens(t) => crate::TokenFilter::AnyOf(t.clone()),
        }
    }

    /// The tokens stamped on documents written by this caller when the entity configures none.
    pub fn write_tokens(&self) -> Vec<String> {
        match self {
            Credentials::Unrestricted => Vec::new(),
            Credentials::Tokens(t) => t.clone(),
        }
    }
}

/// Turns a request's `Authorization` header into credentials.
pub trait Authorizer: Send + Sync + 'static {
    fn credentials(&self, authorization: Option<&str>) -> Credentials;
}

/// Everyone sees everything (MeshQL's default for the egg-economy/k6 deployments).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoAuth;

impl Authorizer for NoAuth {
    fn credentials(&self, _authorization: Option<&str>) -> Credentials {
        Credentials::Unrestricted
    }
}

/// Reads the `sub` claim of a `Bearer` JWT. The signature is **not** verified: as in MeshQL,
/// token validation is the gateway's job. A missing or malformed token yields no tokens, so
/// the caller sees only documents without authorized tokens.
#[derive(Debug, Default, Clone, Copy)]
pub struct JwtSubAuthorizer;

impl JwtSubAuthorizer {
    /// The `sub` claim of a `Bearer <jwt>` header value, if any.
    pub fn subject(authorization: &str) -> Option<String> {
        let token = authorization.strip_prefix("Bearer ")?.trim();
        let mut parts = token.split('.');
        let (_header, claims, _sig) = (parts.next()?, parts.next()?, parts.next()?);
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(claims.trim_end_matches('='))
            .ok()?;
        let value: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
        value.get("sub")?.as_str().map(str::to_owned)
    }
}

impl Authorizer for JwtSubAuthorizer {
    fn credentials(&self, authorization: Option<&str>) -> Credentials {
        Credentials::Tokens(authorization.and_then(Self::subject).into_iter().collect())
    }
}

/// MeshQL's Casbin authorizer: the caller's tokens are the roles a Casbin policy gives the
/// `sub` of its `Bearer` JWT (Casbin's `getRolesForUser`; unverified, as in
/// [`JwtSubAuthorizer`]). No token, or a subject without roles, yields no tokens.
#[derive(Debug, Default, Clone)]
pub struct RoleAuthorizer {
    roles: std::collections::HashMap<String, Vec<String>>,
}

impl RoleAuthorizer {
    pub fn new(roles: impl IntoIterator<Item = (String, Vec<String>)>) -> Self {
        Self {
            roles: roles.into_iter().collect(),
        }
    }
}

impl Authorizer for RoleAuthorizer {
    fn credentials(&self, authorization: Option<&str>) -> Credentials {
        let roles = authorization
            .and_then(JwtSubAuthorizer::subject)
            .and_then(|sub| self.roles.get(&sub))
            .cloned()
            .unwrap_or_default();
        Credentials::Tokens(roles)
    }
}

/// The visibility rule shared by every backend: no authorized tokens means public;
/// otherwise at least one token must be among the caller's.
pub fn is_visible(filter: &crate::TokenFilter, authorized_tokens: &[String]) -> bool {
    match filter {
        crate::TokenFilter::All => true,
        crate::TokenFilter::AnyOf(tokens) => {
            authorized_tokens.is_empty() || authorized_tokens.iter().any(|t| tokens.contains(t))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(claims: &str) -> String {
        let enc = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        format!(
            "Bearer {}.{}.sig",
            enc.encode(r#"{"alg":"none"}"#),
            enc.encode(claims)
        )
    }

    #[test]
    fn jwt_sub_is_read_without_verification() {
        let a = JwtSubAuthorizer;
        assert_eq!(
            a.credentials(Some(&jwt(r#"{"sub":"alice"}"#))),
            Credentials::Tokens(vec!["alice".into()])
        );
        assert_eq!(a.credentials(None), Credentials::Tokens(vec![]));
        assert_eq!(
            a.credentials(Some("Basic abc")),
            Credentials::Tokens(vec![])
        );
        assert_eq!(
            a.credentials(Some("Bearer not-a-jwt")),
            Credentials::Tokens(vec![])
        );
    }

    #[test]
    fn visibility_rule() {
        let any = crate::TokenFilter::AnyOf(vec!["a".into()]);
        assert!(is_visible(&any, &[]));
        assert!(is_visible(&any, &["a".into(), "b".into()]));
        assert!(!is_visible(&any, &["b".into()]));
        assert!(is_visible(&crate::TokenFilter::All, &["b".into()]));
    }
}
