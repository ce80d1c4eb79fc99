//! Where the engine's outcomes become HTTP: the one table from an error's kind to its
//! status, and the `WWW-Authenticate` challenge of refused credentials. Every HTTP frontend
//! (REST, GraphQL over HTTP, `/_changes`, the console, processor admin) answers through it;
//! the core and the engine know kinds, never statuses.

use axum::http::StatusCode;
use meshql_core::{AuthError, ErrorKind};

/// The HTTP status that answers an error of `kind`.
pub fn status(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Conflict => StatusCode::CONFLICT,
        ErrorKind::Invalid => StatusCode::BAD_REQUEST,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorKind::Unauthenticated => StatusCode::UNAUTHORIZED,
        ErrorKind::Forbidden => StatusCode::FORBIDDEN,
        ErrorKind::RateLimited => StatusCode::TOO_MANY_REQUESTS,
    }
}

/// The `WWW-Authenticate` value of a 401 for this error (RFC 6750 §3): `Bearer` alone
/// when no credentials came, with `error` and `error_description` otherwise. `None` when
/// the answer is not a 401.
pub fn www_authenticate(e: &AuthError) -> Option<String> {
    let error = match e {
        AuthError::KeysUnavailable(_) => return None,
        AuthError::Missing => return Some("Bearer".to_owned()),
        AuthError::NotBearer => "invalid_request",
        _ => "invalid_token",
    };
    // a quoted-string of RFC 6750's description characters: no `"` or `\`, printable ASCII
    let description: String = e
        .to_string()
        .chars()
        .map(|c| match c {
            '"' | '\\' => '\'',
            ' '..='~' => c,
            _ => '?',
        })
        .collect();
    Some(format!(
        "Bearer error=\"{error}\", error_description=\"{description}\""
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_status_and_code() {
        for (kind, status_code, code) in [
            (ErrorKind::Unavailable, 503, "UNAVAILABLE"),
            (ErrorKind::Conflict, 409, "CONFLICT"),
            (ErrorKind::Invalid, 400, "BAD_REQUEST"),
            (ErrorKind::NotFound, 404, "NOT_FOUND"),
            (ErrorKind::Internal, 500, "INTERNAL_SERVER_ERROR"),
            (ErrorKind::Unauthenticated, 401, "UNAUTHENTICATED"),
            (ErrorKind::Forbidden, 403, "FORBIDDEN"),
            (ErrorKind::RateLimited, 429, "RATE_LIMITED"),
        ] {
            assert_eq!((status(kind).as_u16(), kind.code()), (status_code, code));
        }
    }

    #[test]
    fn auth_errors_are_401_with_a_bearer_challenge() {
        assert_eq!(status(AuthError::Missing.kind()), StatusCode::UNAUTHORIZED);
        assert_eq!(
            www_authenticate(&AuthError::Missing).as_deref(),
            Some("Bearer")
        );
        assert_eq!(
            www_authenticate(&AuthError::Expired).as_deref(),
            Some("Bearer error=\"invalid_token\", error_description=\"the token has expired\"")
        );
        let odd = AuthError::Malformed("bad \"x\" \\ é".into());
        assert_eq!(
            www_authenticate(&odd).as_deref(),
            Some("Bearer error=\"invalid_token\", error_description=\"malformed token: bad 'x' ' ?\"")
        );
        assert!(www_authenticate(&AuthError::NotBearer)
            .unwrap()
            .contains("invalid_request"));
        let down = AuthError::KeysUnavailable("down".into());
        assert_eq!(
            (status(down.kind()), www_authenticate(&down)),
            (StatusCode::SERVICE_UNAVAILABLE, None)
        );
    }
}
