//! Verification keys: an HMAC secret, PEM public keys, and JSON Web Keys, each with the
//! algorithms it can verify (so that a key is never used with an algorithm of another family:
//! no RSA public key as an HMAC secret).

use base64::Engine;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};

pub(crate) const HMAC: [Algorithm; 3] = [Algorithm::HS256, Algorithm::HS384, Algorithm::HS512];
pub(crate) const RSA: [Algorithm; 6] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
];

/// One key a token may be verified with.
#[derive(Clone)]
pub(crate) struct Key {
    /// The key id a token names in its header (`kid`); `None`: any token may try this key.
    pub kid: Option<String>,
    pub algorithms: Vec<Algorithm>,
    pub decoding: DecodingKey,
}

impl Key {
    pub fn secret(secret: &[u8]) -> Key {
        Key {
            kid: None,
            algorithms: HMAC.to_vec(),
            decoding: DecodingKey::from_secret(secret),
        }
    }
}

// DER encodings of the named-curve OIDs in an EC SubjectPublicKeyInfo
const P256_OID: [u8; 10] = [0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
const P384_OID: [u8; 7] = [0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22];

/// A PEM public key's verification key and the algorithms it can verify: an RSA key (`PUBLIC
/// KEY` or `RSA PUBLIC KEY`) RS*/PS*, an EC key ES256 (P-256) or ES384 (P-384), an Ed25519
/// key EdDSA. Private keys are refused, so that a signing key is not deployed by mistake.
pub fn inspect_public_key(pem: &str) -> Result<(Vec<Algorithm>, DecodingKey), String> {
    if pem.contains("PRIVATE KEY-----") {
        return Err(
            "this is a private key; give the issuer's public key (`openssl pkey -pubout`)".into(),
        );
    }
    if !pem.contains("-----BEGIN ") {
        return Err("not a PEM file (no `-----BEGIN` line)".into());
    }
    let bytes = pem.as_bytes();
    if let Ok(key) = DecodingKey::from_rsa_pem(bytes) {
        return Ok((RSA.to_vec(), key));
    }
    if let Ok(key) = DecodingKey::from_ec_pem(bytes) {
        let der = pem_body(pem).unwrap_or_default();
        let alg = if contains(&der, &P256_OID) {
            Algorithm::ES256
        } else if contains(&der, &P384_OID) {
            Algorithm::ES384
        } else {
            return Err("EC key of an unsupported curve (P-256 and P-384 are supported)".into());
        };
        return Ok((vec![alg], key));
    }
    if let Ok(key) = DecodingKey::from_ed_pem(bytes) {
        return Ok((vec![Algorithm::EdDSA], key));
    }
    Err("not a supported public key (RSA, EC P-256/P-384 or Ed25519 `PUBLIC KEY`)".into())
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The DER bytes of the first PEM block.
fn pem_body(pem: &str) -> Option<Vec<u8>> {
    let mut body = String::new();
    let mut inside = false;
    for line in pem.lines() {
        let line = line.trim();
        if line.starts_with("-----BEGIN ") {
            inside = true;
        } else if line.starts_with("-----END ") {
            break;
        } else if inside && !line.contains(':') {
            body.push_str(line);
        }
    }
    base64::engine::general_purpose::STANDARD.decode(body).ok()
}

/// A key of a JWKS, or why it is left out (encryption keys, symmetric keys, unsupported
/// curves and algorithms).
pub(crate) fn from_jwk(jwk: &Jwk) -> Result<Key, String> {
    if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
        return Err("an encryption key (`use`: `enc`)".into());
    }
    let family: Vec<Algorithm> = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => RSA.to_vec(),
        AlgorithmParameters::EllipticCurve(p) => match p.curve {
            EllipticCurve::P256 => vec![Algorithm::ES256],
            EllipticCurve::P384 => vec![Algorithm::ES384],
            _ => return Err(format!("EC curve {:?} is not supported", p.curve)),
        },
        AlgorithmParameters::OctetKeyPair(p) => match p.curve {
            EllipticCurve::Ed25519 => vec![Algorithm::EdDSA],
            _ => return Err(format!("OKP curve {:?} is not supported", p.curve)),
        },
        AlgorithmParameters::OctetKey(_) => {
            return Err("a symmetric key (`kty`: `oct`): HMAC secrets come from `secret`".into())
        }
    };
    let algorithms = match jwk.common.key_algorithm {
        None => family,
        Some(ka) => {
            let alg = key_algorithm(ka).ok_or_else(|| format!("`alg` {ka:?} does not sign"))?;
            if !family.contains(&alg) {
                return Err(format!("`alg` {ka:?} does not fit the key type"));
            }
            vec![alg]
        }
    };
    let decoding = DecodingKey::from_jwk(jwk).map_err(|e| format!("unusable key: {e}"))?;
    Ok(Key {
        kid: jwk.common.key_id.clone(),
        algorithms,
        decoding,
    })
}

fn key_algorithm(ka: KeyAlgorithm) -> Option<Algorithm> {
    Some(match ka {
        KeyAlgorithm::HS256 => Algorithm::HS256,
        KeyAlgorithm::HS384 => Algorithm::HS384,
        KeyAlgorithm::HS512 => Algorithm::HS512,
        KeyAlgorithm::ES256 => Algorithm::ES256,
        KeyAlgorithm::ES384 => Algorithm::ES384,
        KeyAlgorithm::RS256 => Algorithm::RS256,
        KeyAlgorithm::RS384 => Algorithm::RS384,
        KeyAlgorithm::RS512 => Algorithm::RS512,
        KeyAlgorithm::PS256 => Algorithm::PS256,
        KeyAlgorithm::PS384 => Algorithm::PS384,
        KeyAlgorithm::PS512 => Algorithm::PS512,
        KeyAlgorithm::EdDSA => Algorithm::EdDSA,
        KeyAlgorithm::RSA1_5 | KeyAlgorithm::RSA_OAEP | KeyAlgorithm::RSA_OAEP_256 => return None,
    })
}

/// The usable keys of a JWKS document and a note per key left out. Keys are parsed one by
/// one, so that one key of a type this server does not know leaves the others usable.
pub(crate) fn parse_jwks(body: &[u8]) -> Result<(Vec<Key>, Vec<String>), String> {
    #[derive(serde::Deserialize)]
    struct Set {
        keys: Vec<serde_json::Value>,
    }
    let set: Set = serde_json::from_slice(body)
        .map_err(|e| format!("not a JWK Set (`{{\"keys\": [...]}}`): {e}"))?;
    let mut keys = Vec::new();
    let mut skipped = Vec::new();
    for (i, value) in set.keys.into_iter().enumerate() {
        let kid = value
            .get("kid")
            .and_then(|k| k.as_str())
            .map(|k| format!(" (kid `{k}`)"))
            .unwrap_or_default();
        match serde_json::from_value::<Jwk>(value)
            .map_err(|e| format!("not a supported JWK: {e}"))
            .and_then(|jwk| from_jwk(&jwk))
        {
            Ok(key) => keys.push(key),
            Err(why) => skipped.push(format!("key {i}{kid}: {why}")),
        }
    }
    Ok((keys, skipped))
}
