use super::*;
use jsonwebtoken::{encode, EncodingKey, Header};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef-test-secret";

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(name)
}

fn read(name: &str) -> String {
    std::fs::read_to_string(testdata(name)).unwrap()
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Claims with `sub` and an `exp` an hour ahead, with `extra` merged in (null removes).
fn claims(sub: &str, extra: Value) -> Value {
    let mut c = json!({"sub": sub, "exp": now() + 3600});
    for (k, v) in extra.as_object().unwrap() {
        if v.is_null() {
            c.as_object_mut().unwrap().remove(k);
        } else {
            c[k] = v.clone();
        }
    }
    c
}

fn sign(alg: Algorithm, kid: Option<&str>, key: &EncodingKey, claims: &Value) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    format!("Bearer {}", encode(&header, claims, key).unwrap())
}

fn hs(alg: Algorithm, claims: &Value) -> String {
    sign(alg, None, &EncodingKey::from_secret(SECRET), claims)
}

fn private_key(name: &str) -> EncodingKey {
    let pem = read(&format!("{name}.key.pem"));
    match name {
        "rsa" => EncodingKey::from_rsa_pem(pem.as_bytes()),
        "ed25519" => EncodingKey::from_ed_pem(pem.as_bytes()),
        _ => EncodingKey::from_ec_pem(pem.as_bytes()),
    }
    .unwrap()
}

fn public_key(name: &str) -> PublicKeyPem {
    let pem = read(&format!("{name}.pub.pem"));
    let (algorithms, _) = inspect_public_key(&pem).unwrap();
    PublicKeyPem {
        file: testdata(&format!("{name}.pub.pem")),
        pem,
        algorithms,
    }
}

fn verify_settings() -> VerifySettings {
    VerifySettings::new(
        Some(Secret(SECRET.to_vec())),
        ["rsa", "ec256", "ec384", "ed25519"]
            .into_iter()
            .map(public_key)
            .collect(),
        None,
    )
}

fn authorizer_with(edit: impl FnOnce(&mut VerifySettings)) -> JwtAuthorizer {
    let mut v = verify_settings();
    edit(&mut v);
    JwtAuthorizer::new(
        &JwtSettings {
            required: false,
            verification: Verification::Verify(v),
        },
        None,
    )
    .unwrap()
}

fn subject(c: Result<Credentials, AuthError>) -> Result<String, AuthError> {
    match c? {
        Credentials::Tokens(t) if t.len() == 1 => Ok(t[0].clone()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn every_algorithm_family_verifies() {
    let a = authorizer_with(|_| {});
    let c = claims("alice", json!({}));
    for alg in [Algorithm::HS256, Algorithm::HS384, Algorithm::HS512] {
        assert_eq!(
            subject(a.credentials(Some(&hs(alg, &c)))),
            Ok("alice".into()),
            "{alg:?}"
        );
    }
    for (alg, key) in [
        (Algorithm::RS256, "rsa"),
        (Algorithm::RS384, "rsa"),
        (Algorithm::RS512, "rsa"),
        (Algorithm::PS256, "rsa"),
        (Algorithm::ES256, "ec256"),
        (Algorithm::ES384, "ec384"),
        (Algorithm::EdDSA, "ed25519"),
    ] {
        let token = sign(alg, None, &private_key(key), &c);
        assert_eq!(
            subject(a.credentials(Some(&token))),
            Ok("alice".into()),
            "{alg:?}"
        );
    }
}

#[test]
fn forged_and_unsigned_tokens_are_refused() {
    let a = authorizer_with(|_| {});
    let c = claims("alice", json!({}));
    // another secret
    let forged = sign(
        Algorithm::HS256,
        None,
        &EncodingKey::from_secret(b"another secret that is long enough!!"),
        &c,
    );
    assert_eq!(a.credentials(Some(&forged)), Err(AuthError::Signature));
    // a valid token with its claims swapped for another subject's
    let good = hs(Algorithm::HS256, &c);
    let mut parts: Vec<&str> = good.split('.').collect();
    let mallory = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(claims("mallory", json!({})).to_string());
    parts[1] = &mallory;
    assert_eq!(
        a.credentials(Some(&parts.join("."))),
        Err(AuthError::Signature)
    );
    // another key of the same family
    let other_ec = sign(Algorithm::ES256, None, &private_key("ec256b"), &c);
    assert_eq!(a.credentials(Some(&other_ec)), Err(AuthError::Signature));
    // alg none, with and without a signature segment
    let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    for alg in ["none", "None", "NONE"] {
        for sig in ["", "sig"] {
            let token = format!(
                "Bearer {}.{}.{sig}",
                b64(&format!(r#"{{"alg":"{alg}","typ":"JWT"}}"#)),
                b64(&c.to_string())
            );
            assert_eq!(
                a.credentials(Some(&token)),
                Err(AuthError::Algorithm(alg.into())),
                "{token}"
            );
        }
    }
    // the RSA public key used as an HMAC secret (algorithm confusion)
    let confused = sign(
        Algorithm::HS256,
        None,
        &EncodingKey::from_secret(read("rsa.pub.pem").as_bytes()),
        &c,
    );
    assert_eq!(a.credentials(Some(&confused)), Err(AuthError::Signature));
    let only_rsa = authorizer_with(|v| v.secret = None);
    assert_eq!(
        only_rsa.credentials(Some(&confused)),
        Err(AuthError::Algorithm("HS256".into()))
    );
}

#[test]
fn time_issuer_and_audience_claims_are_checked() {
    let a = authorizer_with(|v| {
        v.issuers = vec!["https://idp.example".into()];
        v.audiences = vec!["meshql".into(), "other".into()];
    });
    let ok = json!({"iss": "https://idp.example", "aud": "meshql"});
    let token = |extra: Value| {
        let mut e = ok.clone();
        for (k, v) in extra.as_object().unwrap() {
            e[k] = v.clone();
        }
        hs(Algorithm::HS256, &claims("alice", e))
    };
    assert_eq!(
        subject(a.credentials(Some(&token(json!({}))))),
        Ok("alice".into())
    );
    assert_eq!(
        subject(a.credentials(Some(&token(json!({"aud": ["x", "other"]}))))),
        Ok("alice".into()),
        "one accepted audience among several"
    );
    let t = now();
    for (extra, expected) in [
        (json!({"exp": t - 3600}), AuthError::Expired),
        (json!({"nbf": t + 3600}), AuthError::NotYetValid),
        (json!({"iss": "https://evil.example"}), AuthError::Issuer),
        (json!({"aud": "someone-else"}), AuthError::Audience),
        (json!({"aud": ["a", "b"]}), AuthError::Audience),
        (json!({"iss": null}), AuthError::MissingClaim("iss".into())),
        (json!({"aud": null}), AuthError::MissingClaim("aud".into())),
        (json!({"exp": null}), AuthError::MissingClaim("exp".into())),
        (json!({"sub": null}), AuthError::MissingClaim("sub".into())),
        (json!({"sub": 42}), AuthError::MissingClaim("sub".into())),
        (json!({"sub": ""}), AuthError::MissingClaim("sub".into())),
    ] {
        assert_eq!(
            a.credentials(Some(&token(extra.clone()))),
            Err(expected),
            "{extra}"
        );
    }
    // within the leeway (60 s by default)
    assert!(a.credentials(Some(&token(json!({"exp": t - 30})))).is_ok());
    assert!(a.credentials(Some(&token(json!({"nbf": t + 30})))).is_ok());
    let strict = authorizer_with(|v| v.leeway_secs = 0);
    assert_eq!(
        strict.credentials(Some(&hs(
            Algorithm::HS256,
            &claims("a", json!({"exp": t - 5}))
        ))),
        Err(AuthError::Expired)
    );
    // unconfigured iss/aud are not checked
    let open = authorizer_with(|_| {});
    assert!(open
        .credentials(Some(&hs(
            Algorithm::HS256,
            &claims("a", json!({"aud": "x", "iss": "y"}))
        )))
        .is_ok());
    // tokens without exp, when allowed
    let lax = authorizer_with(|v| v.require_exp = false);
    assert!(lax
        .credentials(Some(&hs(
            Algorithm::HS256,
            &claims("a", json!({"exp": null}))
        )))
        .is_ok());
}

#[test]
fn configured_algorithms_restrict_what_is_accepted() {
    let a = authorizer_with(|v| v.algorithms = vec![Algorithm::RS256]);
    let c = claims("alice", json!({}));
    assert!(a
        .credentials(Some(&sign(Algorithm::RS256, None, &private_key("rsa"), &c)))
        .is_ok());
    assert_eq!(
        a.credentials(Some(&hs(Algorithm::HS256, &c))),
        Err(AuthError::Algorithm("HS256".into()))
    );
    assert_eq!(
        a.credentials(Some(&sign(Algorithm::PS256, None, &private_key("rsa"), &c))),
        Err(AuthError::Algorithm("PS256".into()))
    );
}

#[test]
fn malformed_headers_and_missing_tokens() {
    let a = authorizer_with(|_| {});
    assert_eq!(a.credentials(None), Ok(Credentials::Tokens(vec![])));
    assert_eq!(a.credentials(Some("  ")), Ok(Credentials::Tokens(vec![])));
    assert_eq!(
        a.credentials(Some("Basic YWxpY2U6eA==")),
        Err(AuthError::NotBearer)
    );
    assert!(matches!(
        a.credentials(Some("Bearer ")),
        Err(AuthError::NotBearer | AuthError::Malformed(_))
    ));
    assert!(matches!(
        a.credentials(Some("Bearer not-a-jwt")),
        Err(AuthError::Malformed(_))
    ));
    assert!(matches!(
        a.credentials(Some("Bearer a.b.c")),
        Err(AuthError::Malformed(_))
    ));
    // the scheme is case-insensitive
    let token = hs(Algorithm::HS256, &claims("alice", json!({})));
    let lower = token.replacen("Bearer", "bearer", 1);
    assert_eq!(subject(a.credentials(Some(&lower))), Ok("alice".into()));

    let required = JwtAuthorizer::new(
        &JwtSettings {
            required: true,
            verification: Verification::Verify(verify_settings()),
        },
        None,
    )
    .unwrap();
    assert_eq!(required.credentials(None), Err(AuthError::Missing));
    assert_eq!(
        subject(required.credentials(Some(&token))),
        Ok("alice".into())
    );
}

#[test]
fn roles_replace_the_subject() {
    let roles = HashMap::from([("user1".to_owned(), vec!["admin".to_owned()])]);
    let a = JwtAuthorizer::new(
        &JwtSettings {
            required: false,
            verification: Verification::Verify(verify_settings()),
        },
        Some(roles),
    )
    .unwrap();
    let t = |sub: &str| hs(Algorithm::HS256, &claims(sub, json!({})));
    assert_eq!(
        a.credentials(Some(&t("user1"))),
        Ok(Credentials::Tokens(vec!["admin".into()]))
    );
    assert_eq!(
        a.credentials(Some(&t("stranger"))),
        Ok(Credentials::Tokens(vec![]))
    );
    let forged = sign(
        Algorithm::HS256,
        None,
        &EncodingKey::from_secret(b"not the secret, but long enough...."),
        &claims("user1", json!({})),
    );
    assert_eq!(a.credentials(Some(&forged)), Err(AuthError::Signature));
}

#[test]
fn the_trusted_gateway_mode_decodes_without_verifying() {
    let a = JwtAuthorizer::new(
        &JwtSettings {
            required: false,
            verification: Verification::TrustedGateway,
        },
        None,
    )
    .unwrap();
    let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    let unsigned = format!(
        "Bearer {}.{}.sig",
        b64(r#"{"alg":"none"}"#),
        b64(r#"{"sub":"alice","exp":1}"#)
    );
    assert_eq!(subject(a.credentials(Some(&unsigned))), Ok("alice".into()));
    assert_eq!(a.credentials(None), Ok(Credentials::Tokens(vec![])));
    assert_eq!(
        a.credentials(Some("Basic abc")),
        Ok(Credentials::Tokens(vec![]))
    );
    assert_eq!(
        a.credentials(Some("Bearer junk")),
        Ok(Credentials::Tokens(vec![]))
    );
    let required = JwtAuthorizer::new(
        &JwtSettings {
            required: true,
            verification: Verification::TrustedGateway,
        },
        None,
    )
    .unwrap();
    assert_eq!(
        required.credentials(Some("Bearer junk")),
        Err(AuthError::Missing)
    );
    assert_eq!(
        subject(required.credentials(Some(&unsigned))),
        Ok("alice".into())
    );
}

#[test]
fn public_keys_are_inspected() {
    let algs = |name: &str| inspect_public_key(&read(name)).map(|(a, _)| a);
    assert_eq!(algs("ec256.pub.pem"), Ok(vec![Algorithm::ES256]));
    assert_eq!(algs("ec384.pub.pem"), Ok(vec![Algorithm::ES384]));
    assert_eq!(algs("ed25519.pub.pem"), Ok(vec![Algorithm::EdDSA]));
    assert_eq!(algs("rsa.pub.pem").unwrap().len(), 6);
    assert!(algs("ec521.pub.pem").unwrap_err().contains("curve"));
    assert!(algs("rsa.key.pem").unwrap_err().contains("private key"));
    assert!(algs("README.md").unwrap_err().contains("not a PEM"));
    assert!(
        inspect_public_key("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n").is_err()
    );
    assert_eq!(parse_algorithm("RS256"), Some(Algorithm::RS256));
    assert_eq!(parse_algorithm("none"), None);
    assert_eq!(parse_algorithm("rs256"), None);
    assert_eq!(parse_algorithm("ES512"), None);
}

fn jwk(name: &str, kid: &str) -> Value {
    let all: Value = serde_json::from_str(&read("public.jwk.json")).unwrap();
    let mut k = all[name].clone();
    k["kid"] = json!(kid);
    k
}

#[test]
fn jwks_documents_keep_the_usable_keys() {
    let mut rsa_enc = jwk("rsa", "enc");
    rsa_enc["use"] = json!("enc");
    let mut wrong_alg = jwk("ec256", "wrong");
    wrong_alg["alg"] = json!("RS256");
    let mut es256 = jwk("ec256", "k1");
    es256["alg"] = json!("ES256");
    let doc = json!({"keys": [
        es256,
        jwk("rsa", "k2"),
        jwk("ed25519", "k3"),
        rsa_enc,
        wrong_alg,
        {"kty": "oct", "k": "c2VjcmV0", "kid": "sym"},
        {"kty": "EC", "crv": "P-521", "x": "AA", "y": "AA", "kid": "p521"},
        {"kty": "weird", "kid": "w"},
    ]});
    let (keys, skipped) = keys::parse_jwks(doc.to_string().as_bytes()).unwrap();
    let kids: Vec<_> = keys.iter().map(|k| k.kid.clone().unwrap()).collect();
    assert_eq!(kids, ["k1", "k2", "k3"]);
    assert_eq!(skipped.len(), 5, "{skipped:?}");
    assert!(keys::parse_jwks(b"[]").is_err());
}

/// A JWKS endpoint on a local port: serves whatever `doc` holds at the time, counts requests.
struct JwksServer {
    url: String,
    doc: Arc<parking_lot::Mutex<Value>>,
    hits: Arc<std::sync::atomic::AtomicUsize>,
}

async fn jwks_server(doc: Value) -> JwksServer {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/jwks.json", listener.local_addr().unwrap());
    let doc = Arc::new(parking_lot::Mutex::new(doc));
    let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (d, h) = (doc.clone(), hits.clone());
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let (d, h) = (d.clone(), h.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                h.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let body = d.lock().to_string();
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    JwksServer { url, doc, hits }
}

fn jwks_settings(url: &str, min_refresh: Duration) -> JwtSettings {
    let mut v = VerifySettings::new(None, Vec::new(), Some(url.to_owned()));
    v.jwks_min_refresh = min_refresh;
    JwtSettings {
        required: false,
        verification: Verification::Verify(v),
    }
}

async fn eventually_ok(a: &JwtAuthorizer, token: &str) -> Result<String, AuthError> {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let r = subject(a.credentials(Some(token)));
        if r.is_ok() || std::time::Instant::now() > deadline {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn jwks_keys_are_fetched_rotated_and_refreshed_at_a_bounded_rate() {
    let server = jwks_server(json!({"keys": [jwk("ec256", "k1")]})).await;
    let a = JwtAuthorizer::start(
        &jwks_settings(&server.url, Duration::from_millis(300)),
        None,
    )
    .await
    .unwrap();
    assert_eq!(server.hits.load(std::sync::atomic::Ordering::SeqCst), 1);
    let c = claims("alice", json!({}));
    let k1 = sign(Algorithm::ES256, Some("k1"), &private_key("ec256"), &c);
    assert_eq!(subject(a.credentials(Some(&k1))), Ok("alice".into()));
    // the same key without a kid: tried against every key that fits the algorithm
    let no_kid = sign(Algorithm::ES256, None, &private_key("ec256"), &c);
    assert_eq!(subject(a.credentials(Some(&no_kid))), Ok("alice".into()));
    // a kid naming the wrong key
    let lying = sign(Algorithm::ES256, Some("k1"), &private_key("ec256b"), &c);
    assert_eq!(a.credentials(Some(&lying)), Err(AuthError::Signature));

    // rotation: the provider adds k2 (and later drops k1)
    *server.doc.lock() = json!({"keys": [jwk("ec256", "k1"), jwk("ec256b", "k2")]});
    let k2 = sign(Algorithm::ES256, Some("k2"), &private_key("ec256b"), &c);
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(
        a.credentials(Some(&k2)),
        Err(AuthError::UnknownKey("k2".into())),
        "refused at once, the refresh runs in the background"
    );
    assert_eq!(eventually_ok(&a, &k2).await, Ok("alice".into()));
    let hits = server.hits.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(hits, 2);

    // unknown kids in a burst: at most one fetch per min_refresh
    for i in 0..200 {
        let t = sign(
            Algorithm::ES256,
            Some(&format!("bogus{i}")),
            &private_key("ec256"),
            &c,
        );
        assert_eq!(
            a.credentials(Some(&t)),
            Err(AuthError::UnknownKey(format!("bogus{i}")))
        );
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let burst = server.hits.load(std::sync::atomic::Ordering::SeqCst) - hits;
    assert!(burst <= 1, "{burst} fetches for a burst of unknown kids");

    // k1 retired: after the next refresh its tokens are unknown
    *server.doc.lock() = json!({"keys": [jwk("ec256b", "k2")]});
    tokio::time::sleep(Duration::from_millis(350)).await;
    let _ = a.credentials(Some(&sign(
        Algorithm::ES256,
        Some("k3"),
        &private_key("ec256"),
        &c,
    )));
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while a.credentials(Some(&k1)).is_ok() {
        assert!(std::time::Instant::now() < deadline, "k1 still accepted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        a.credentials(Some(&k1)),
        Err(AuthError::UnknownKey("k1".into()))
    );
    assert_eq!(subject(a.credentials(Some(&k2))), Ok("alice".into()));
}

#[tokio::test]
async fn an_unreachable_jwks_answers_unavailable_until_it_loads() {
    // a port nobody listens on
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/jwks.json");
    let a = JwtAuthorizer::start(&jwks_settings(&url, Duration::from_millis(100)), None)
        .await
        .unwrap();
    let token = sign(
        Algorithm::ES256,
        Some("k1"),
        &private_key("ec256"),
        &claims("alice", json!({})),
    );
    let e = a.credentials(Some(&token)).unwrap_err();
    assert!(matches!(e, AuthError::KeysUnavailable(_)), "{e:?}");
    assert_eq!(e.kind(), meshql_core::ErrorKind::Unavailable);
}

#[test]
fn verifying_an_hs256_token_takes_microseconds() {
    let a = authorizer_with(|v| v.public_keys.clear());
    let token = hs(Algorithm::HS256, &claims("alice", json!({"iss": "x"})));
    let n = 20_000;
    let started = std::time::Instant::now();
    for _ in 0..n {
        assert!(a.credentials(Some(&token)).is_ok());
    }
    let per = started.elapsed() / n;
    println!("HS256 verification: {per:?} per token");
    // a debug build on a slow machine stays far below this
    assert!(per < Duration::from_millis(1), "{per:?}");
}

/// Not a timing assertion: what identifying a caller costs with permissions on (the roles
/// claim read, then the policy's cached grants) against without, for docs/SECURITY.md.
#[test]
fn what_a_request_pays_for_permissions() {
    use crate::permissions::{PermissionTables, RolePermission, RolePolicy};
    use meshql_core::{Action, Actions, Mask, Policy};
    let plain = authorizer_with(|v| v.public_keys.clear());
    let with_roles =
        authorizer_with(|v| v.public_keys.clear()).with_roles_claim(Some("realm_access.roles"));
    let token = hs(
        Algorithm::HS256,
        &claims(
            "alice",
            json!({"iss": "x", "realm_access": {"roles": ["reader", "x"]}}),
        ),
    );
    let mut tables = PermissionTables::new();
    for e in 0..13 {
        tables.insert(
            format!("entity{e}"),
            [(
                "reader".to_owned(),
                RolePermission {
                    actions: Actions::of([Action::Read]),
                    mask: Mask::All,
                },
            )]
            .into(),
        );
    }
    let policy = RolePolicy::new(tables);
    let n = 20_000;
    let started = std::time::Instant::now();
    for _ in 0..n {
        std::hint::black_box(plain.credentials(Some(&token)).unwrap());
    }
    let before = started.elapsed() / n;
    let started = std::time::Instant::now();
    for _ in 0..n {
        let caller = with_roles.caller(Some(&token)).unwrap();
        let grants = policy.grants(&caller.principal);
        assert!(grants.allows("entity3", Action::Read));
    }
    let after = started.elapsed() / n;
    println!("per request: {before:?} identifying only, {after:?} with the roles claim and cached grants");
}

#[test]
fn callers_carry_their_subject_and_roles() {
    use meshql_core::{Caller, Principal};
    // verified, roles from a nested claim; a forged token is refused as before
    let a = authorizer_with(|v| v.public_keys.clear()).with_roles_claim(Some("realm_access.roles"));
    let token = hs(
        Algorithm::HS256,
        &claims(
            "alice",
            json!({"realm_access": {"roles": ["reader", 7, "editor"]}}),
        ),
    );
    let token = format!("Bearer {}", token.trim_start_matches("Bearer "));
    assert_eq!(
        a.caller(Some(&token)),
        Ok(Caller {
            credentials: Credentials::Tokens(vec!["alice".into()]),
            principal: Principal {
                subject: Some("alice".into()),
                roles: vec!["reader".into(), "editor".into()],
            },
        })
    );
    assert_eq!(
        a.caller(None).map(|c| c.principal),
        Ok(Principal::default()),
        "anonymous"
    );
    let mut forged = token.clone();
    forged.pop();
    forged.push(if token.ends_with('A') { 'B' } else { 'A' });
    assert!(a.caller(Some(&forged)).is_err());
    // trusted gateway: the roles of the unverified token
    let trusted = JwtAuthorizer::new(
        &JwtSettings {
            required: false,
            verification: Verification::TrustedGateway,
        },
        None,
    )
    .unwrap()
    .with_roles_claim(Some("roles"));
    let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    let unsigned = format!(
        "Bearer {}.{}.sig",
        b64(r#"{"alg":"none"}"#),
        b64(r#"{"sub":"bob","roles":"a b,c"}"#)
    );
    assert_eq!(
        trusted.caller(Some(&unsigned)).unwrap().principal.roles,
        ["a", "b", "c"]
    );
    // Casbin: the policy's roles, whatever the token claims
    let casbin = JwtAuthorizer::new(
        &JwtSettings {
            required: false,
            verification: Verification::TrustedGateway,
        },
        Some([("bob".to_owned(), vec!["admin".to_owned()])].into()),
    )
    .unwrap();
    let bob = casbin.caller(Some(&unsigned)).unwrap();
    assert_eq!(bob.principal.roles, ["admin"]);
    assert_eq!(bob.credentials, Credentials::Tokens(vec!["admin".into()]));
}
