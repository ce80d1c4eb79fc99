//! Verifying one token: header, algorithm, key, signature, then the claims.

use crate::keys::{self, Key};
use crate::settings::{algorithm_name, VerifySettings, ALGORITHM_NAMES};
use base64::Engine;
use jsonwebtoken::errors::ErrorKind as JwtErrorKind;
use jsonwebtoken::{Algorithm, Validation};
use meshql_core::AuthError;
use parking_lot::{Mutex, RwLock};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The largest JWKS document read.
const MAX_JWKS_BYTES: usize = 1024 * 1024;
/// Keys taken from one JWKS document (a token without `kid` may be tried against each).
const MAX_JWKS_KEYS: usize = 64;

/// Checks tokens against keys held in memory.
///
/// Verification is synchronous and never waits for the network: keys from a JWKS URL are
/// fetched at start and then by a background task, into a key set that requests read under a
/// short read lock. A token naming a `kid` the set lacks is refused at once (401) and starts a
/// refresh, at most one per `jwks_min_refresh`, so that unknown key ids from an attacker cannot
/// turn requests into JWKS fetches, and no runtime worker ever waits on the identity provider;
/// the client's retry after the refresh succeeds. Providers publish a new key before they
/// sign with it, and the periodic refresh (`jwks_refresh`) picks it up ahead of the first
/// token, so the refused first token is the exception of an unannounced rotation.
pub(crate) struct Verifier {
    /// Keys from the config (secret, PEM files).
    static_keys: Vec<Key>,
    /// `static_keys` and the last JWKS fetched.
    keys: RwLock<Arc<Vec<Key>>>,
    /// Accepted algorithms; empty: any the verifying key supports.
    allowed: Vec<Algorithm>,
    /// One prepared validation per algorithm (claims checks are the same for all).
    validations: Vec<(Algorithm, Validation)>,
    pub(crate) jwks: Option<Jwks>,
}

/// A JWKS URL and the state of its refreshes.
pub(crate) struct Jwks {
    pub url: String,
    client: reqwest::Client,
    pub refresh: Duration,
    pub min_refresh: Duration,
    state: Mutex<JwksState>,
    runtime: Option<tokio::runtime::Handle>,
}

#[derive(Default)]
struct JwksState {
    last_attempt: Option<Instant>,
    in_flight: bool,
    loaded: bool,
    last_error: Option<String>,
}

/// The claims meshql reads; `sub` is checked for presence and type by the validation.
#[derive(serde::Deserialize)]
struct Claims {
    #[serde(default)]
    sub: Option<serde_json::Value>,
}

impl Verifier {
    /// A verifier with the configured static keys; JWKS keys arrive by [`Verifier::refresh`].
    pub fn new(settings: &VerifySettings) -> Result<Verifier, String> {
        let mut static_keys = Vec::new();
        if let Some(secret) = &settings.secret {
            static_keys.push(Key::secret(&secret.0));
        }
        for pem in &settings.public_keys {
            let (algorithms, decoding) = keys::inspect_public_key(&pem.pem)
                .map_err(|e| format!("{}: {e}", pem.file.display()))?;
            static_keys.push(Key {
                kid: None,
                algorithms,
                decoding,
            });
        }
        let mut required = vec!["sub"];
        if settings.require_exp {
            required.push("exp");
        }
        if !settings.issuers.is_empty() {
            required.push("iss");
        }
        if !settings.audiences.is_empty() {
            required.push("aud");
        }
        let validations = ALGORITHM_NAMES
            .iter()
            .filter_map(|n| crate::parse_algorithm(n))
            .map(|alg| {
                let mut v = Validation::new(alg);
                v.leeway = settings.leeway_secs;
                v.validate_exp = true;
                v.validate_nbf = true;
                v.set_required_spec_claims(&required);
                if !settings.issuers.is_empty() {
                    v.set_issuer(&settings.issuers);
                }
                if settings.audiences.is_empty() {
                    v.validate_aud = false;
                } else {
                    v.set_audience(&settings.audiences);
                }
                (alg, v)
            })
            .collect();
        let jwks = match &settings.jwks_url {
            None => None,
            Some(url) => Some(Jwks {
                url: url.clone(),
                client: reqwest::Client::builder()
                    .connect_timeout(Duration::from_secs(5))
                    .timeout(Duration::from_secs(10))
                    .build()
                    .map_err(|e| format!("HTTP client for the JWKS: {e}"))?,
                refresh: settings.jwks_refresh,
                min_refresh: settings.jwks_min_refresh,
                state: Mutex::new(JwksState::default()),
                runtime: tokio::runtime::Handle::try_current().ok(),
            }),
        };
        if static_keys.is_empty() && jwks.is_none() {
            return Err("no verification key: give `secret`, `public_keys` or `jwks_url`".into());
        }
        Ok(Verifier {
            keys: RwLock::new(Arc::new(static_keys.clone())),
            static_keys,
            allowed: settings.algorithms.clone(),
            validations,
            jwks,
        })
    }

    /// The token's `sub`, and the roles at `roles_claim` (a dotted path, split) when given,
    /// if the token verifies.
    pub fn verify_claims(
        self: &Arc<Self>,
        token: &str,
        roles_claim: Option<&[String]>,
    ) -> Result<(String, Vec<String>), AuthError> {
        let header = jsonwebtoken::decode_header(token).map_err(|e| header_error(token, e))?;
        let alg = header.alg;
        if !self.allowed.is_empty() && !self.allowed.contains(&alg) {
            return Err(AuthError::Algorithm(algorithm_name(alg).to_owned()));
        }
        let kid = header.kid.as_deref();
        let keys = self.keys.read().clone();
        let mut tried = false;
        for key in keys.iter().filter(|k| {
            k.algorithms.contains(&alg)
                && (k.kid.is_none() || kid.is_none() || k.kid.as_deref() == kid)
        }) {
            tried = true;
            let validation = self.validation(alg);
            let decoded = match roles_claim {
                // the whole claims object, for the roles inside it (measured: cheaper than
                // decoding `sub` alone and reading the claims segment a second time)
                Some(path) => jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(
                    token,
                    &key.decoding,
                    validation,
                )
                .map(|data| {
                    let roles = crate::permissions::roles_at(&data.claims, path);
                    (data.claims.get("sub").cloned(), roles)
                }),
                None => jsonwebtoken::decode::<Claims>(token, &key.decoding, validation)
                    .map(|data| (data.claims.sub, Vec::new())),
            };
            match decoded {
                Ok((sub, roles)) => {
                    return match sub {
                        Some(serde_json::Value::String(s)) if !s.is_empty() => Ok((s, roles)),
                        _ => Err(AuthError::MissingClaim("sub".into())),
                    }
                }
                // another key may have made it
                Err(e)
                    if matches!(
                        e.kind(),
                        JwtErrorKind::InvalidSignature
                            | JwtErrorKind::InvalidKeyFormat
                            | JwtErrorKind::InvalidEcdsaKey
                            | JwtErrorKind::InvalidRsaKey(_)
                            | JwtErrorKind::Crypto(_)
                    ) => {}
                Err(e) => return Err(claims_error(e)),
            }
        }
        if tried {
            return Err(AuthError::Signature);
        }
        // no key could have made this token: perhaps one the key set URL has by now
        if let Some(jwks) = &self.jwks {
            let unloaded = {
                let state = jwks.state.lock();
                (!state.loaded && self.static_keys.is_empty()).then(|| {
                    state
                        .last_error
                        .clone()
                        .unwrap_or_else(|| "not fetched yet".into())
                })
            };
            self.refresh_soon();
            if let Some(why) = unloaded {
                return Err(AuthError::KeysUnavailable(format!("{}: {why}", jwks.url)));
            }
            if let Some(kid) = kid {
                return Err(AuthError::UnknownKey(kid.to_owned()));
            }
        } else if let Some(kid) = kid {
            if keys.iter().any(|k| k.algorithms.contains(&alg)) {
                return Err(AuthError::UnknownKey(kid.to_owned()));
            }
        }
        Err(AuthError::Algorithm(algorithm_name(alg).to_owned()))
    }

    fn validation(&self, alg: Algorithm) -> &Validation {
        &self
            .validations
            .iter()
            .find(|(a, _)| *a == alg)
            .expect("a validation per algorithm")
            .1
    }

    /// Starts a JWKS refresh in the background unless one ran within `min_refresh` or is
    /// running.
    pub fn refresh_soon(self: &Arc<Self>) {
        let Some(jwks) = &self.jwks else { return };
        let Some(runtime) = &jwks.runtime else { return };
        if !self.claim_attempt() {
            return;
        }
        let me = self.clone();
        runtime.spawn(async move { me.fetch_and_install().await });
    }

    /// Marks an attempt as started, if the rate limit allows one now.
    fn claim_attempt(&self) -> bool {
        let Some(jwks) = &self.jwks else { return false };
        let mut state = jwks.state.lock();
        let now = Instant::now();
        if state.in_flight
            || state
                .last_attempt
                .is_some_and(|t| now.duration_since(t) < jwks.min_refresh)
        {
            return false;
        }
        state.in_flight = true;
        state.last_attempt = Some(now);
        true
    }

    /// Fetches the JWKS now (at start, and from the periodic task), whatever the rate limit.
    pub async fn refresh(self: &Arc<Self>) -> Result<usize, String> {
        if let Some(jwks) = &self.jwks {
            let mut state = jwks.state.lock();
            state.in_flight = true;
            state.last_attempt = Some(Instant::now());
        }
        self.fetch_and_install().await
    }

    async fn fetch_and_install(self: &Arc<Self>) -> Result<usize, String> {
        let Some(jwks) = &self.jwks else { return Ok(0) };
        let result = fetch(&jwks.client, &jwks.url).await;
        let mut state = jwks.state.lock();
        state.in_flight = false;
        match result {
            Ok((fetched, skipped)) => {
                for s in &skipped {
                    tracing::warn!(url = %jwks.url, "JWKS key left out: {s}");
                }
                let count = fetched.len();
                let kids: Vec<&str> = fetched.iter().filter_map(|k| k.kid.as_deref()).collect();
                tracing::info!(url = %jwks.url, keys = count, kids = ?kids, "JWKS loaded");
                let mut all = self.static_keys.clone();
                all.extend(fetched);
                *self.keys.write() = Arc::new(all);
                state.loaded = true;
                state.last_error = None;
                Ok(count)
            }
            Err(e) => {
                tracing::warn!(url = %jwks.url, "JWKS fetch failed (known keys are kept): {e}");
                state.last_error = Some(e.clone());
                Err(e)
            }
        }
    }

    /// Whether the JWKS has been fetched at least once.
    pub fn jwks_loaded(&self) -> bool {
        self.jwks.as_ref().is_some_and(|j| j.state.lock().loaded)
    }
}

/// The usable keys of the JWKS at `url` (and notes on keys left out).
async fn fetch(client: &reqwest::Client, url: &str) -> Result<(Vec<Key>, Vec<String>), String> {
    let mut response = client
        .get(url)
        .header(reqwest::header::ACCEPT, "application/json")
        .send()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    if !response.status().is_success() {
        return Err(format!("GET {url}: HTTP {}", response.status()));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?
    {
        if body.len() + chunk.len() > MAX_JWKS_BYTES {
            return Err(format!(
                "GET {url}: the key set is larger than {MAX_JWKS_BYTES} bytes"
            ));
        }
        body.extend_from_slice(&chunk);
    }
    let (mut keys, skipped) = keys::parse_jwks(&body)?;
    if keys.is_empty() {
        return Err(format!(
            "{url} has no usable signing key ({})",
            skipped.join("; ")
        ));
    }
    keys.truncate(MAX_JWKS_KEYS);
    Ok((keys, skipped))
}

/// Why a token's header does not parse: an algorithm jsonwebtoken does not know (`none`
/// above all) is named as such, anything else is malformed.
fn header_error(token: &str, e: jsonwebtoken::errors::Error) -> AuthError {
    let alg = token
        .split('.')
        .next()
        .and_then(|h| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(h.trim_end_matches('='))
                .ok()
        })
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v.get("alg").and_then(|a| a.as_str()).map(str::to_owned));
    match alg {
        Some(alg) if !ALGORITHM_NAMES.contains(&alg.as_str()) => AuthError::Algorithm(alg),
        _ => AuthError::Malformed(describe(&e)),
    }
}

fn describe(e: &jsonwebtoken::errors::Error) -> String {
    match e.kind() {
        JwtErrorKind::InvalidToken => "not a JWT (three base64url segments)".into(),
        JwtErrorKind::Base64(_) => "a segment is not base64url".into(),
        JwtErrorKind::Json(j) => format!("not JSON: {j}"),
        JwtErrorKind::Utf8(_) => "a segment is not UTF-8".into(),
        _ => e.to_string(),
    }
}

/// A failure after the signature verified, or of the token's shape.
fn claims_error(e: jsonwebtoken::errors::Error) -> AuthError {
    match e.kind() {
        JwtErrorKind::ExpiredSignature => AuthError::Expired,
        JwtErrorKind::ImmatureSignature => AuthError::NotYetValid,
        JwtErrorKind::InvalidIssuer => AuthError::Issuer,
        JwtErrorKind::InvalidAudience => AuthError::Audience,
        JwtErrorKind::MissingRequiredClaim(c) => AuthError::MissingClaim(c.clone()),
        JwtErrorKind::InvalidAlgorithm
        | JwtErrorKind::MissingAlgorithm
        | JwtErrorKind::InvalidAlgorithmName => AuthError::Algorithm("?".into()),
        _ => AuthError::Malformed(describe(&e)),
    }
}
