//! JWT verification through the binary: `meshql serve` with an HS256 secret and with a JWKS
//! URL (served by a small HTTP server in the test), the attacks every verifying server must
//! refuse (401 JSON with `WWW-Authenticate`, nothing written) on REST, GraphQL and
//! `/_changes`, required tokens, key rotation, and the explicit trusted-gateway mode.

mod common;

use base64::Engine;
use common::{bearer_with, Client, Server, JWT_SECRET};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const ISSUER: &str = "https://idp.test";
const AUDIENCE: &str = "meshql";

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s)
}

/// A copy of the farm example with these `[auth]` lines.
fn farm_with_auth(auth: &str) -> (tempfile::TempDir, PathBuf) {
    let auth = auth.to_owned();
    let dir = common::example_copy("farm", move |t| {
        t.replacen("\n[storage.", &format!("\n[auth]\n{auth}\n[storage."), 1)
    });
    let config = dir.path().join("meshql.toml");
    (dir, config)
}

async fn call(
    c: &Client,
    method: &str,
    path: &str,
    body: Option<Value>,
    auth: Option<&str>,
) -> common::Response {
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", *a)).collect();
    c.request(
        method,
        path,
        body.map(|b| b.to_string().into_bytes()),
        &headers,
    )
    .await
}

/// Panics unless `r` is a 401 whose JSON body carries `code` UNAUTHENTICATED (REST and
/// `/_changes`: `{"error", "code"}`; GraphQL: `errors[0].extensions.code`) and whose
/// `WWW-Authenticate` starts with `challenge`.
#[track_caller]
fn assert_refused(r: &common::Response, challenge: &str, what: &str) {
    assert_eq!(r.status, 401, "{what}: {} {}", r.status, r.text);
    assert_eq!(r.content_type(), "application/json", "{what}");
    let body = r.json();
    let code = body["code"]
        .as_str()
        .or(body["errors"][0]["extensions"]["code"].as_str());
    assert_eq!(code, Some("UNAUTHENTICATED"), "{what}: {body}");
    let www = r.header("www-authenticate").unwrap_or_default();
    assert!(
        www.starts_with(challenge),
        "{what}: WWW-Authenticate {www:?}"
    );
}

/// The names of the farms `auth` can list.
async fn farm_names(c: &Client, auth: &str) -> Vec<String> {
    let r = call(c, "GET", "/farm/api", None, Some(auth)).await;
    r.expect_status(200);
    let mut names: Vec<String> = r
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn hs256_tokens_are_verified_and_attacks_refused() {
    let (_dir, config) = farm_with_auth(&format!(
        "type = \"jwt\"\nsecret = \"{JWT_SECRET}\"\nissuer = \"{ISSUER}\"\naudience = \"{AUDIENCE}\"\n"
    ));
    let server = Server::start(&config, &[]);
    let c = server.client();
    let claims = |extra: Value| {
        let mut c = json!({"sub": "alice", "iss": ISSUER, "aud": AUDIENCE});
        for (k, v) in extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        c
    };
    let alice = bearer_with(&claims(json!({})));

    // a valid token writes and reads
    let r = call(
        &c,
        "POST",
        "/farm/api",
        Some(json!({"name": "alices"})),
        Some(&alice),
    )
    .await;
    r.expect_status(201);
    let path = format!("/farm/api/{}", r.json()["id"].as_str().unwrap());
    call(&c, "GET", &path, None, Some(&alice))
        .await
        .expect_status(200);
    assert_eq!(farm_names(&c, &alice).await, ["alices"]);
    let q = json!({"query": "{ getAll { name } }"});
    let r = call(&c, "POST", "/farm/graph", Some(q.clone()), Some(&alice)).await;
    assert_eq!(r.json(), json!({"data": {"getAll": [{"name": "alices"}]}}));
    let feed = call(&c, "GET", "/_changes?since=0", None, Some(&alice)).await;
    feed.expect_status(200);
    let last = feed.json()["last"].clone();

    // tokens claiming to be alice that must all be refused
    let t = now();
    let forged = format!(
        "Bearer {}",
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims(json!({"exp": t + 3600})),
            &EncodingKey::from_secret(b"not the service's secret, long enough"),
        )
        .unwrap()
    );
    let good = alice.trim_start_matches("Bearer ").to_owned();
    let mut parts: Vec<String> = good.split('.').map(str::to_owned).collect();
    parts[1] = b64(&claims(json!({"sub": "mallory", "exp": t + 3600})).to_string());
    let tampered = format!("Bearer {}", parts.join("."));
    let unsigned = |alg: &str, sig: &str| {
        format!(
            "Bearer {}.{}.{sig}",
            b64(&format!(r#"{{"alg":"{alg}","typ":"JWT"}}"#)),
            b64(&claims(json!({"exp": t + 3600})).to_string())
        )
    };
    let attacks: Vec<(&str, String)> = vec![
        ("alg none", unsigned("none", "")),
        ("alg none with a signature", unsigned("none", "c2ln")),
        ("alg None", unsigned("None", "")),
        ("forged signature", forged),
        ("tampered claims", tampered),
        ("expired", bearer_with(&claims(json!({"exp": t - 3600})))),
        (
            "not yet valid",
            bearer_with(&claims(json!({"nbf": t + 3600}))),
        ),
        (
            "wrong issuer",
            bearer_with(&claims(json!({"iss": "https://evil.test"}))),
        ),
        (
            "no issuer",
            bearer_with(&json!({"sub": "alice", "aud": AUDIENCE})),
        ),
        (
            "wrong audience",
            bearer_with(&claims(json!({"aud": "someone-else"}))),
        ),
        (
            "no subject",
            bearer_with(&json!({"iss": ISSUER, "aud": AUDIENCE})),
        ),
        ("not a JWT", "Bearer not-a-jwt".to_owned()),
    ];
    for (what, token) in &attacks {
        let token = Some(token.as_str());
        let w = |s: &str| format!("{what}: {s}");
        assert_refused(
            &call(&c, "POST", "/farm/api", Some(json!({"name": what})), token).await,
            "Bearer error=\"invalid_token\"",
            &w("POST"),
        );
        assert_refused(
            &call(
                &c,
                "POST",
                "/farm/api/bulk",
                Some(json!([{"name": what}])),
                token,
            )
            .await,
            "Bearer error=\"invalid_token\"",
            &w("POST bulk"),
        );
        assert_refused(
            &call(&c, "PUT", &path, Some(json!({"name": "taken"})), token).await,
            "Bearer error=\"invalid_token\"",
            &w("PUT"),
        );
        assert_refused(
            &call(&c, "DELETE", &path, None, token).await,
            "Bearer error=\"invalid_token\"",
            &w("DELETE"),
        );
        assert_refused(
            &call(&c, "GET", "/farm/api", None, token).await,
            "Bearer error=\"invalid_token\"",
            &w("GET list"),
        );
        assert_refused(
            &call(&c, "POST", "/farm/graph", Some(q.clone()), token).await,
            "Bearer error=\"invalid_token\"",
            &w("GraphQL POST"),
        );
        assert_refused(
            &call(
                &c,
                "GET",
                "/farm/graph?query=%7BgetAll%7Bname%7D%7D",
                None,
                token,
            )
            .await,
            "Bearer error=\"invalid_token\"",
            &w("GraphQL GET"),
        );
        assert_refused(
            &call(&c, "GET", "/_changes?since=0", None, token).await,
            "Bearer error=\"invalid_token\"",
            &w("/_changes"),
        );
    }
    // another scheme is an invalid request, not an anonymous one
    assert_refused(
        &call(&c, "GET", "/farm/api", None, Some("Basic YWxpY2U6cHc=")).await,
        "Bearer error=\"invalid_request\"",
        "Basic",
    );
    // the description says what was wrong
    let r = call(&c, "GET", "/farm/api", None, Some(&attacks[5].1)).await;
    assert!(
        r.header("www-authenticate").unwrap().contains("expired"),
        "{:?}",
        r.headers
    );
    assert!(
        r.json()["error"].as_str().unwrap().contains("expired"),
        "{}",
        r.text
    );

    // nothing was written, changed or deleted
    assert_eq!(farm_names(&c, &alice).await, ["alices"]);
    let feed = call(&c, "GET", "/_changes?since=0", None, Some(&alice)).await;
    assert_eq!(feed.json()["last"], last, "no new change: {}", feed.text);
    // without a token (not required): served, public documents only
    assert_eq!(c.list("/farm/api").await, Vec::<Value>::new());
    c.get(&path).await.expect_status(404);
    // the server is fine
    call(&c, "GET", &path, None, Some(&alice))
        .await
        .expect_status(200);
    assert!(server.stop_gracefully().success());
}

#[tokio::test]
async fn a_missing_token_is_refused_when_required() {
    let (_dir, config) = farm_with_auth(&format!(
        "type = \"jwt\"\nsecret = \"{JWT_SECRET}\"\nrequired = true\n"
    ));
    let server = Server::start(&config, &[]);
    let c = server.client();
    for (method, path, body) in [
        ("GET", "/farm/api", None),
        ("POST", "/farm/api", Some(json!({"name": "anon"}))),
        (
            "POST",
            "/farm/graph",
            Some(json!({"query": "{ getAll { name } }"})),
        ),
        ("GET", "/_changes", None),
    ] {
        let r = call(&c, method, path, body, None).await;
        assert_refused(&r, "Bearer", &format!("{method} {path}"));
        assert_eq!(
            r.header("www-authenticate"),
            Some("Bearer"),
            "no error code without a token"
        );
    }
    let alice = common::bearer("alice");
    call(
        &c,
        "POST",
        "/farm/api",
        Some(json!({"name": "a"})),
        Some(&alice),
    )
    .await
    .expect_status(201);
    assert_eq!(farm_names(&c, &alice).await, ["a"]);
    // health and readiness stay open
    c.get("/health").await.expect_status(200);
    c.get("/ready").await.expect_status(200);
}

/// A JWKS endpoint on a std TcpListener thread: answers every request with `doc`, counts them.
struct JwksServer {
    url: String,
    doc: Arc<Mutex<String>>,
    hits: Arc<AtomicUsize>,
}

fn jwks_server(doc: Value) -> JwksServer {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "http://{}/.well-known/jwks.json",
        listener.local_addr().unwrap()
    );
    let doc = Arc::new(Mutex::new(doc.to_string()));
    let hits = Arc::new(AtomicUsize::new(0));
    let (d, h) = (doc.clone(), hits.clone());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let mut got = Vec::new();
            let mut buf = [0u8; 2048];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            h.fetch_add(1, Ordering::SeqCst);
            let body = d.lock().unwrap().clone();
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    JwksServer { url, doc, hits }
}

fn testdata(name: &str) -> String {
    std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../meshql-auth/testdata")
            .join(name),
    )
    .unwrap()
}

/// The public JWK of a test key, with a `kid`.
fn jwk(name: &str, kid: &str) -> Value {
    let all: Value = serde_json::from_str(&testdata("public.jwk.json")).unwrap();
    let mut k = all[name].clone();
    k["kid"] = json!(kid);
    k
}

fn signed(alg: Algorithm, key: &str, kid: &str, sub: &str) -> String {
    let pem = testdata(&format!("{key}.key.pem"));
    let key = match alg {
        Algorithm::EdDSA => EncodingKey::from_ed_pem(pem.as_bytes()),
        Algorithm::RS256 => EncodingKey::from_rsa_pem(pem.as_bytes()),
        _ => EncodingKey::from_ec_pem(pem.as_bytes()),
    }
    .unwrap();
    let mut header = Header::new(alg);
    header.kid = Some(kid.to_owned());
    let token =
        jsonwebtoken::encode(&header, &json!({"sub": sub, "exp": now() + 3600}), &key).unwrap();
    format!("Bearer {token}")
}

#[tokio::test]
async fn jwks_keys_verify_and_rotate() {
    let jwks = jwks_server(json!({"keys": [jwk("ec256", "k1"), jwk("rsa", "r1")]}));
    let (_dir, config) = farm_with_auth(&format!(
        "type = \"jwt\"\njwks_url = \"{}\"\njwks_min_refresh_secs = 1\n",
        jwks.url
    ));
    let server = Server::start(&config, &[]);
    let c = server.client();
    assert_eq!(jwks.hits.load(Ordering::SeqCst), 1, "fetched once at start");
    let k1 = signed(Algorithm::ES256, "ec256", "k1", "alice");
    call(
        &c,
        "POST",
        "/farm/api",
        Some(json!({"name": "es"})),
        Some(&k1),
    )
    .await
    .expect_status(201);
    let r1 = signed(Algorithm::RS256, "rsa", "r1", "alice");
    call(
        &c,
        "POST",
        "/farm/api",
        Some(json!({"name": "rs"})),
        Some(&r1),
    )
    .await
    .expect_status(201);
    assert_eq!(farm_names(&c, &k1).await, ["es", "rs"]);
    // a key of the set under another key's kid, and a key the set does not have
    let lying = signed(Algorithm::ES256, "ec256b", "k1", "alice");
    assert_refused(
        &call(&c, "GET", "/farm/api", None, Some(&lying)).await,
        "Bearer error=\"invalid_token\"",
        "wrong key for k1",
    );

    // rotation: the provider publishes k2 (Ed25519) and signs with it
    tokio::time::sleep(Duration::from_millis(1100)).await;
    *jwks.doc.lock().unwrap() =
        json!({"keys": [jwk("ec256", "k1"), jwk("ed25519", "k2")]}).to_string();
    let k2 = signed(Algorithm::EdDSA, "ed25519", "k2", "alice");
    let first = call(&c, "GET", "/farm/api", None, Some(&k2)).await;
    assert_refused(
        &first,
        "Bearer error=\"invalid_token\"",
        "k2 before the refresh",
    );
    assert!(first.text.contains("k2"), "{}", first.text);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = call(&c, "GET", "/farm/api", None, Some(&k2)).await;
        if r.status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "k2 never accepted: {}", r.text);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    call(
        &c,
        "POST",
        "/farm/api",
        Some(json!({"name": "ed"})),
        Some(&k2),
    )
    .await
    .expect_status(201);
    assert_eq!(farm_names(&c, &k1).await, ["ed", "es", "rs"]);

    // a flood of unknown kids cannot make the server hammer the JWKS endpoint
    let before = jwks.hits.load(Ordering::SeqCst);
    let started = Instant::now();
    for i in 0..100 {
        let t = signed(Algorithm::ES256, "ec256", &format!("bogus-{i}"), "alice");
        assert_eq!(
            call(&c, "GET", "/farm/api", None, Some(&t)).await.status,
            401
        );
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let fetches = jwks.hits.load(Ordering::SeqCst) - before;
    let allowed = started.elapsed().as_secs() as usize + 1;
    assert!(
        fetches <= allowed,
        "{fetches} JWKS fetches in {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn the_trusted_gateway_mode_warns_and_accepts_unsigned_tokens() {
    let (_dir, config) = farm_with_auth("type = \"jwt\"\ntrusted_gateway = true\n");
    let server = Server::start(&config, &[]);
    let log = server.log();
    assert!(
        log.contains("WARN")
            && log.contains("auth.trusted_gateway")
            && log.contains("NOT verified"),
        "{log}"
    );
    let c = server.client();
    let unsigned = |sub: &str| {
        format!(
            "Bearer {}.{}.",
            b64(r#"{"alg":"none"}"#),
            b64(&json!({"sub": sub}).to_string())
        )
    };
    let r = call(
        &c,
        "POST",
        "/farm/api",
        Some(json!({"name": "gw"})),
        Some(&unsigned("alice")),
    )
    .await;
    r.expect_status(201);
    let path = format!("/farm/api/{}", r.json()["id"].as_str().unwrap());
    call(&c, "GET", &path, None, Some(&unsigned("alice")))
        .await
        .expect_status(200);
    call(&c, "GET", &path, None, Some(&unsigned("bob")))
        .await
        .expect_status(404);
    call(&c, "GET", &path, None, None).await.expect_status(404);
    // `meshql check` shows the same warning
    let out = common::run_meshql(
        &["check", config.to_str().unwrap()],
        Duration::from_secs(30),
    );
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("warning:") && stderr.contains("NOT verified"),
        "{stderr}"
    );
}

#[test]
fn check_refuses_a_jwt_config_without_keys() {
    let (_dir, config) = farm_with_auth("type = \"jwt\"\n");
    let out = common::run_meshql(
        &["check", config.to_str().unwrap()],
        Duration::from_secs(30),
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("meshql.toml:")
            && stderr.contains("auth.type")
            && stderr.contains("trusted_gateway"),
        "{stderr}"
    );
}
