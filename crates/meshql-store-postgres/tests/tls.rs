//! TLS to a real PostgreSQL (`scripts/services/postgres.sh`, which turns `ssl = on` with a
//! throw-away CA): `sslmode` and `sslrootcert` as libpq reads them, and proof from the server
//! (`pg_stat_ssl`) that the session is encrypted or not.

use meshql_core::{
    NewDocument, ReadContext, Store, StoreError, StoreReader, StoreWriter, WriteContext,
};
use meshql_store_postgres::{PostgresDatabase, PostgresOptions, PostgresStore};
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The script's server (always: its CA is needed, so `MESHQL_TEST_POSTGRES_URL` does not
/// apply): its URL, without a query string, and its certificate directory.
fn server() -> (String, PathBuf) {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/services/postgres.sh");
    let run = |command: &str| {
        let out = std::process::Command::new("bash")
            .arg(&script)
            .arg(command)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("postgres.sh");
        assert!(
            out.status.success(),
            "postgres.sh {command}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    let url = run("start");
    let dir = PathBuf::from(run("tls"));
    assert!(dir.join("ca.crt").is_file(), "no CA at {}", dir.display());
    (url, dir)
}

fn options(url: String) -> PostgresOptions {
    let mut o = PostgresOptions::new(url);
    o.pool_size = 2;
    o.connect_timeout = Duration::from_secs(5);
    o
}

/// Writes and reads a document through a store on `url`; answers whether the server saw TLS.
async fn round_trip(url: String) -> Result<bool, StoreError> {
    let db = PostgresDatabase::connect(&options(url))?;
    let (write_tls, read_tls) = db.tls_in_use().await?;
    assert_eq!(write_tls, read_tls);
    let table = format!("tls_{}", uuid::Uuid::new_v4().simple());
    let store = PostgresStore::new(Arc::clone(&db), &table);
    store.prepare(&[]).await?;
    let payload = json!({"name": "over tls"}).as_object().unwrap().clone();
    let created = store
        .create(NewDocument::new(payload), &WriteContext::SYSTEM)
        .await?;
    let read = store
        .read(&created.id, &ReadContext::LATEST)
        .await?
        .expect("the document just written");
    assert!(read.payload.contains("over tls"), "{}", read.payload);
    store.shutdown().await;
    Ok(write_tls)
}

#[tokio::test]
async fn verify_full_with_the_servers_ca_reads_and_writes_over_tls() {
    let (url, dir) = server();
    let ca = dir.join("ca.crt");
    let tls = round_trip(format!(
        "{url}?sslmode=verify-full&sslrootcert={}",
        ca.display()
    ))
    .await
    .expect("verify-full with the right CA");
    assert!(tls, "pg_stat_ssl says the session is not encrypted");
    // by name as well as by IP address: the certificate is for both
    let by_name = url.replace("127.0.0.1", "localhost");
    assert!(round_trip(format!(
        "{by_name}?sslmode=verify-full&sslrootcert={}",
        ca.display()
    ))
    .await
    .expect("verify-full to localhost"));
}

#[tokio::test]
async fn require_prefer_and_the_default_encrypt_disable_does_not() {
    let (url, _) = server();
    assert!(round_trip(format!("{url}?sslmode=require")).await.unwrap());
    assert!(round_trip(format!("{url}?sslmode=prefer")).await.unwrap());
    // no sslmode: libpq's default, prefer
    assert!(round_trip(url.clone()).await.unwrap());
    assert!(!round_trip(format!("{url}?sslmode=disable")).await.unwrap());
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_refused_with_the_reason() {
    let (url, dir) = server();
    let other = dir.join("other-ca.crt");
    for mode in ["verify-full", "verify-ca", "require"] {
        let err = round_trip(format!(
            "{url}?sslmode={mode}&sslrootcert={}",
            other.display()
        ))
        .await
        .expect_err(mode);
        let StoreError::Unavailable(message) = &err else {
            panic!("{mode}: {err:?} is not 'unavailable' (the entity's 503 and retry)")
        };
        assert!(
            message.contains("TLS handshake failed") && message.contains("UnknownIssuer"),
            "{mode}: {message}"
        );
    }
}

#[tokio::test]
async fn verify_full_checks_the_name_verify_ca_does_not() {
    let (url, dir) = server();
    let ca = dir.join("ca.crt");
    // connect to 127.0.0.1 while expecting the certificate to name `db.invalid`
    let elsewhere = url.replace("127.0.0.1", "db.invalid");
    let named = |mode: &str| {
        format!(
            "{elsewhere}?hostaddr=127.0.0.1&sslmode={mode}&sslrootcert={}",
            ca.display()
        )
    };
    let err = round_trip(named("verify-full"))
        .await
        .expect_err("a certificate for localhost/127.0.0.1 is not one for db.invalid");
    assert!(err.to_string().contains("not valid for name"), "{err}");
    assert!(round_trip(named("verify-ca"))
        .await
        .expect("verify-ca ignores the name"));
}

/// A fake server: answers an SSLRequest with `answer` (`N`: no TLS; `S` followed by bytes
/// that are no TLS handshake), closes after anything else. Enough to see what a client does
/// before authentication.
async fn fake_server(answer: &'static [u8]) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut request = [0u8; 8];
                // SSLRequest: length 8, code 80877103
                if s.read_exact(&mut request).await.is_ok()
                    && request == [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]
                {
                    let _ = s.write_all(answer).await;
                    let mut rest = [0u8; 256];
                    let _ = s.read(&mut rest).await;
                }
            });
        }
    });
    format!("postgres://postgres@127.0.0.1:{port}/x")
}

#[tokio::test]
async fn require_fails_against_a_server_without_tls_and_prefer_falls_back() {
    // the server says it has no TLS
    let url = fake_server(b"N").await;
    let err = round_trip(format!("{url}?sslmode=require"))
        .await
        .expect_err("require against a server without TLS");
    assert!(err.to_string().contains("TLS"), "{err}");
    // prefer goes on in plain text (which the fake does not serve: it fails, but not on TLS)
    let err = round_trip(format!("{url}?sslmode=prefer"))
        .await
        .expect_err("the fake serves nothing");
    assert!(!err.to_string().contains("TLS"), "{err}");

    // the server says yes, then its handshake is garbage
    let url = fake_server(b"Sthis is not a TLS ServerHello, not at all").await;
    let err = round_trip(format!("{url}?sslmode=require"))
        .await
        .expect_err("require with a broken handshake");
    assert!(err.to_string().contains("TLS handshake failed"), "{err}");
    // prefer: the handshake failed, so it connected again without TLS, as libpq does
    let err = round_trip(format!("{url}?sslmode=prefer"))
        .await
        .expect_err("the fake serves nothing");
    assert!(!err.to_string().contains("TLS"), "{err}");
}

#[test]
fn bad_tls_parameters_are_refused_when_the_pool_is_built() {
    for (url, expected) in [
        ("postgres://h/db?sslmode=always", "is not one of"),
        (
            "postgres://h/db?sslmode=verify-ca&sslrootcert=/nonexistent/ca.pem",
            "cannot be read",
        ),
    ] {
        let err = PostgresDatabase::connect(&options(url.into())).expect_err(url);
        assert!(err.to_string().contains(expected), "{url}: {err}");
    }
}
