//! Authorization: who is asking (credentials from the `Authorization` header) and which
//! stored documents they may see (overlap with the document's authorized tokens).
//!
//! The [`Authorizer`] trait takes the raw header value and may refuse it: a JWT authorizer
//! that verifies signatures (crate `meshql-auth`) answers an [`AuthError`] for a forged,
//! expired or otherwise unacceptable token; the edge turns the error's
//! [`ErrorKind`](crate::ErrorKind) into its protocol's answer (HTTP: `meshql_rest::edge`).

use crate::ErrorKind;

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

/// Why a request's credentials were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No token, and the service requires one.
    #[error("authentication required: send `Authorization: Bearer <token>`")]
    Missing,
    /// An `Authorization` header of another scheme than `Bearer`.
    #[error("the Authorization header is not a Bearer token")]
    NotBearer,
    /// Not a JWT (segments, base64, JSON).
    #[error("malformed token: {0}")]
    Malformed(String),
    /// The token's `alg` is not accepted (`none`, an unknown name, one no key can verify, or
    /// one left out of the configured algorithms).
    #[error("token algorithm `{0}` is not accepted")]
    Algorithm(String),
    /// The token names a key id (`kid`) no known key has.
    #[error("unknown signing key `{0}`")]
    UnknownKey(String),
    /// The signature does not verify with any key that could have made it.
    #[error("invalid token signature")]
    Signature,
    /// `exp` is past (beyond the leeway).
    #[error("the token has expired")]
    Expired,
    /// `nbf` is ahead (beyond the leeway).
    #[error("the token is not valid yet")]
    NotYetValid,
    /// `iss` is not one of the configured issuers.
    #[error("the token's issuer is not accepted")]
    Issuer,
    /// `aud` names none of the configured audiences.
    #[error("the token's audience is not accepted")]
    Audience,
    /// A claim the service requires is absent (or not of its type).
    #[error("the token has no `{0}` claim")]
    MissingClaim(String),
    /// No signing key is available yet (the key set URL could not be read): the server's
    /// problem, not the caller's.
    #[error("signing keys are not available: {0}")]
    KeysUnavailable(String),
}

impl AuthError {
    /// [`ErrorKind::Unauthenticated`], except for a server without keys
    /// ([`ErrorKind::Unavailable`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            AuthError::KeysUnavailable(_) => ErrorKind::Unavailable,
            _ => ErrorKind::Unauthenticated,
        }
    }
}

/// A caller as identified from its `Authorization` header: the credentials that filter rows,
/// and who it is for permission decisions ([`crate::Policy`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub credentials: Credentials,
    pub principal: crate::Principal,
}

/// Turns a request's `Authorization` header into credentials, or refuses it.
///
/// Called once per request on the request's task, so implementations must not block: a JWT
/// authorizer verifies against keys it holds in memory.
pub trait Authorizer: Send + Sync + 'static {
    fn credentials(&self, authorization: Option<&str>) -> Result<Credentials, AuthError>;

    /// The credentials and the principal (subject, roles). The default knows no subject and
    /// no roles.
    fn caller(&self, authorization: Option<&str>) -> Result<Caller, AuthError> {
        Ok(Caller {
            credentials: self.credentials(authorization)?,
            principal: crate::Principal::default(),
        })
    }
}

/// Everyone sees everything (MeshQL's default for the egg-economy/k6 deployments).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoAuth;

impl Authorizer for NoAuth {
    fn credentials(&self, _authorization: Option<&str>) -> Result<Credentials, AuthError> {
        Ok(Credentials::Unrestricted)
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

    #[test]
    fn no_auth_sees_everything() {
        assert_eq!(
            NoAuth.credentials(Some("Bearer x")),
            Ok(Credentials::Unrestricted)
        );
    }

    #[test]
    fn auth_errors_are_unauthenticated_or_unavailable() {
        assert_eq!(AuthError::Missing.kind(), crate::ErrorKind::Unauthenticated);
        assert_eq!(AuthError::Missing.kind().code(), "UNAUTHENTICATED");
        assert_eq!(
            AuthError::KeysUnavailable("down".into()).kind(),
            crate::ErrorKind::Unavailable
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
