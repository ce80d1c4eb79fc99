//! What a config says about JWTs (`[auth]`), checked: the plain data the config crate
//! resolves and a server starts an authorizer from.

use jsonwebtoken::Algorithm;
use std::path::PathBuf;
use std::time::Duration;

/// Every algorithm name accepted in `auth.algorithms` and in token headers.
pub const ALGORITHM_NAMES: [&str; 12] = [
    "HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256",
    "ES384", "EdDSA",
];

/// The algorithm of a name in [`ALGORITHM_NAMES`] (exact spelling, as in a JWT header).
pub fn parse_algorithm(name: &str) -> Option<Algorithm> {
    if !ALGORITHM_NAMES.contains(&name) {
        return None;
    }
    name.parse().ok()
}

/// The name of an algorithm as a JWT header spells it.
pub fn algorithm_name(alg: Algorithm) -> &'static str {
    match alg {
        Algorithm::HS256 => "HS256",
        Algorithm::HS384 => "HS384",
        Algorithm::HS512 => "HS512",
        Algorithm::RS256 => "RS256",
        Algorithm::RS384 => "RS384",
        Algorithm::RS512 => "RS512",
        Algorithm::PS256 => "PS256",
        Algorithm::PS384 => "PS384",
        Algorithm::PS512 => "PS512",
        Algorithm::ES256 => "ES256",
        Algorithm::ES384 => "ES384",
        Algorithm::EdDSA => "EdDSA",
    }
}

/// The shortest HMAC secret accepted, in bytes (RFC 7518 §3.2: at least the hash size; 32
/// bytes for HS256).
pub const MIN_SECRET_BYTES: usize = 32;

/// How JWT callers are identified (`auth.type = "jwt"` or `"casbin"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtSettings {
    /// A request without a token is refused (401) instead of seeing public documents only.
    pub required: bool,
    pub verification: Verification,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verification {
    /// `trusted_gateway = true`: tokens are decoded, never verified (a gateway in front of
    /// the service verified them: MeshQL's model).
    TrustedGateway,
    /// Signature, `exp`, `nbf`, and `iss`/`aud` when configured, are checked.
    Verify(VerifySettings),
}

/// Keys and claims checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifySettings {
    /// An HMAC secret (HS256/384/512).
    pub secret: Option<Secret>,
    /// Public keys read from PEM files (RS*/PS*, ES256/ES384, EdDSA).
    pub public_keys: Vec<PublicKeyPem>,
    /// A JSON Web Key Set fetched at start, refreshed every `jwks_refresh` and when a token
    /// names an unknown `kid` (at most once per `jwks_min_refresh`).
    pub jwks_url: Option<String>,
    /// Accepted algorithms; empty: whatever the key that verifies a token supports.
    pub algorithms: Vec<Algorithm>,
    /// Accepted `iss` values; empty: not checked.
    pub issuers: Vec<String>,
    /// Accepted `aud` values (a token naming any one of them passes); empty: not checked.
    pub audiences: Vec<String>,
    /// Clock skew allowed on `exp` and `nbf`.
    pub leeway_secs: u64,
    /// Tokens without `exp` are refused.
    pub require_exp: bool,
    pub jwks_refresh: Duration,
    pub jwks_min_refresh: Duration,
}

impl VerifySettings {
    /// Settings with these keys and the defaults for everything else.
    pub fn new(
        secret: Option<Secret>,
        public_keys: Vec<PublicKeyPem>,
        jwks_url: Option<String>,
    ) -> Self {
        VerifySettings {
            secret,
            public_keys,
            jwks_url,
            algorithms: Vec::new(),
            issuers: Vec::new(),
            audiences: Vec::new(),
            leeway_secs: DEFAULT_LEEWAY_SECS,
            require_exp: true,
            jwks_refresh: Duration::from_secs(DEFAULT_JWKS_REFRESH_SECS),
            jwks_min_refresh: Duration::from_secs(DEFAULT_JWKS_MIN_REFRESH_SECS),
        }
    }
}

pub const DEFAULT_LEEWAY_SECS: u64 = 60;
pub const DEFAULT_JWKS_REFRESH_SECS: u64 = 300;
pub const DEFAULT_JWKS_MIN_REFRESH_SECS: u64 = 30;

/// An HMAC secret; its `Debug` shows only its length.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

/// A public key file, read and checked by [`crate::inspect_public_key`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKeyPem {
    pub file: PathBuf,
    pub pem: String,
    /// The algorithms the key can verify.
    pub algorithms: Vec<Algorithm>,
}
