//! `[server.tls]` through the binary: HTTPS with a certificate from a test CA, plain HTTP
//! and silent clients on the TLS port, and a replaced certificate picked up without restart.

mod common;

use common::{example_copy, free_port, meshql_bin, run_meshql};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A CA and a certificate it signed for `localhost`: (CA PEM, leaf PEM, leaf key PEM).
fn ca_and_leaf(name: &str) -> (String, String, String) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, format!("meshql test CA {name}"));
    let ca = ca.self_signed(&ca_key).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &ca, &ca_key)
        .unwrap();
    (ca.pem(), leaf.pem(), leaf_key.serialize_pem())
}

/// Writes a file the way a certificate deployment should: a temporary file renamed over it.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A `meshql serve` of the farm example with `[server.tls]`, talked to over HTTPS.
struct TlsServer {
    child: Child,
    dir: tempfile::TempDir,
    _data: tempfile::TempDir,
    port: u16,
}

impl TlsServer {
    fn start(header_timeout_ms: u64) -> (TlsServer, String) {
        let (ca, cert, key) = ca_and_leaf("one");
        let dir = example_copy("farm", |text| {
            format!(
                "{text}\n[server]\nheader_read_timeout_ms = {header_timeout_ms}\n\n\
                 [server.tls]\ncert = \"tls/cert.pem\"\nkey = \"tls/key.pem\"\n"
            )
        });
        std::fs::create_dir(dir.path().join("tls")).unwrap();
        std::fs::write(dir.path().join("tls/cert.pem"), &cert).unwrap();
        std::fs::write(dir.path().join("tls/key.pem"), &key).unwrap();
        let data = tempfile::tempdir().unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("server.log")).unwrap();
        let child = Command::new(meshql_bin())
            .arg("serve")
            .arg(dir.path().join("meshql.toml"))
            .arg("--port")
            .arg(port.to_string())
            .arg("--data-dir")
            .arg(data.path())
            .arg("--log-level")
            .arg("info")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn meshql serve");
        (
            TlsServer {
                child,
                dir,
                _data: data,
                port,
            },
            ca,
        )
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    fn url(&self, path: &str) -> String {
        format!("https://localhost:{}{path}", self.port)
    }

    /// A client trusting only `ca`, one new connection per request.
    fn client(&self, ca: &str) -> reqwest::Client {
        reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes()).unwrap())
            .resolve("localhost", SocketAddr::from(([127, 0, 0, 1], self.port)))
            .pool_max_idle_per_host(0)
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap()
    }

    async fn wait_healthy(&mut self, client: &reqwest::Client) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = client.get(self.url("/health")).send().await {
                if r.status() == 200 {
                    return;
                }
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("meshql exited with {status}:\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "no 200 from /health over HTTPS:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn metric(&self, client: &reqwest::Client, line_start: &str) -> u64 {
        let text = client
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(line_start))
            .unwrap_or_else(|| panic!("no {line_start} in /metrics:\n{text}"))
            .trim()
            .parse()
            .unwrap()
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads what the server sends until it closes the connection (or `limit` passes: then
/// `None`).
async fn read_until_closed(stream: &mut TcpStream, limit: Duration) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .ok()?;
    Some(got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_serves_and_plain_or_silent_clients_are_closed() {
    let (mut server, ca) = TlsServer::start(1000);
    let client = server.client(&ca);
    server.wait_healthy(&client).await;
    assert!(server.log().contains("on https://"), "{}", server.log());

    // REST over HTTPS
    let created = client
        .post(server.url("/farm/api"))
        .json(&json!({"name": "over tls"}))
        .send()
        .await
        .unwrap();
    assert!(created.status().is_success(), "{created:?}");
    let body: Value = created.json().await.unwrap();
    let id = body["id"].as_str().expect("an id").to_owned();
    let read: Value = client
        .get(server.url(&format!("/farm/api/{id}")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(read["name"], "over tls", "{read}");

    // a client that does not trust the CA is refused
    let (other_ca, _, _) = ca_and_leaf("other");
    assert!(server
        .client(&other_ca)
        .get(server.url("/health"))
        .send()
        .await
        .is_err());

    // plain HTTP on the TLS port: no HTTP answer, the connection is closed
    let failures_before = server
        .metric(&client, "meshql_http_tls_handshake_failures_total ")
        .await;
    let mut plain = TcpStream::connect(("127.0.0.1", server.port))
        .await
        .unwrap();
    plain
        .write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let answer = read_until_closed(&mut plain, Duration::from_secs(10))
        .await
        .expect("the plain-HTTP connection is closed");
    assert!(
        !answer.starts_with(b"HTTP/"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    let failures = server
        .metric(&client, "meshql_http_tls_handshake_failures_total ")
        .await;
    assert!(
        failures > failures_before,
        "{failures} vs {failures_before}"
    );

    // a TCP connection that never sends a ClientHello: closed by the header timeout (1 s)
    let header_timeouts_before = server
        .metric(
            &client,
            "meshql_http_connections_timed_out_total{reason=\"header\"} ",
        )
        .await;
    let started = Instant::now();
    let mut silent = TcpStream::connect(("127.0.0.1", server.port))
        .await
        .unwrap();
    let sent = read_until_closed(&mut silent, Duration::from_secs(15))
        .await
        .expect("a silent connection is closed by the header timeout");
    assert!(sent.is_empty());
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(900),
        "closed after {waited:?}"
    );
    let header_timeouts = server
        .metric(
            &client,
            "meshql_http_connections_timed_out_total{reason=\"header\"} ",
        )
        .await;
    assert!(header_timeouts > header_timeouts_before);

    // still serving
    let r = client.get(server.url("/health")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(server.child.try_wait().unwrap().is_none());

    // graceful shutdown with an idle keep-alive TLS connection and one mid-handshake open:
    // both are closed at once and the process exits 0
    let pooled = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes()).unwrap())
        .resolve("localhost", SocketAddr::from(([127, 0, 0, 1], server.port)))
        .build()
        .unwrap();
    let r = pooled.get(server.url("/health")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let _ = r.bytes().await;
    let mut half = TcpStream::connect(("127.0.0.1", server.port))
        .await
        .unwrap();
    half.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let status = Command::new("kill")
        .arg("-TERM")
        .arg(server.child.id().to_string())
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "no exit after SIGTERM:\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status}:\n{}", server.log());
    // nothing was left for the shutdown deadline to cut
    assert!(
        !server.log().contains("shutdown deadline"),
        "{}",
        server.log()
    );
}

#[test]
fn a_key_that_does_not_match_the_certificate_stops_the_start() {
    let (_, cert, _) = ca_and_leaf("cert");
    let (_, _, other_key) = ca_and_leaf("key");
    let dir = example_copy("farm", |text| {
        format!("{text}\n[server.tls]\ncert = \"cert.pem\"\nkey = \"key.pem\"\n")
    });
    std::fs::write(dir.path().join("cert.pem"), cert).unwrap();
    std::fs::write(dir.path().join("key.pem"), other_key).unwrap();
    let data = tempfile::tempdir().unwrap();
    let port = free_port().to_string();
    let out = run_meshql(
        &[
            "serve",
            dir.path().join("meshql.toml").to_str().unwrap(),
            "--port",
            &port,
            "--data-dir",
            data.path().to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    let stderr =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("key.pem"), "{stderr}");
    assert!(stderr.contains("does not belong"), "{stderr}");
    // `meshql check` finds it too
    let out = run_meshql(
        &["check", dir.path().join("meshql.toml").to_str().unwrap()],
        Duration::from_secs(60),
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("server.tls"), "{stderr}");
    assert!(stderr.contains("does not belong"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_certificate_is_served_without_restart() {
    let (mut server, ca_one) = TlsServer::start(10_000);
    let one = server.client(&ca_one);
    server.wait_healthy(&one).await;
    let cert = server.dir.path().join("tls/cert.pem");
    let key = server.dir.path().join("tls/key.pem");

    // a broken replacement is logged and the old pair kept
    replace(&cert, "not a certificate\n");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !server.log().contains("does not load") {
        assert!(
            Instant::now() < deadline,
            "no reload error:\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = one.get(server.url("/health")).send().await.unwrap();
    assert_eq!(r.status(), 200);

    // a new pair from another CA: a client trusting only the new CA gets in
    let (ca_two, cert_two, key_two) = ca_and_leaf("two");
    replace(&key, &key_two);
    replace(&cert, &cert_two);
    let two = server.client(&ca_two);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = two.get(server.url("/health")).send().await {
            assert_eq!(r.status(), 200);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new certificate was not picked up:\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(server.log().contains("certificate reloaded"));
    // and a new client trusting only the old CA no longer does (a fresh one: `one` may
    // resume its TLS session, which is not verified again)
    assert!(server
        .client(&ca_one)
        .get(server.url("/health"))
        .send()
        .await
        .is_err());
}

#[test]
fn check_reports_bad_tls_files() {
    let dir = example_copy("farm", |text| {
        format!("{text}\n[server.tls]\ncert = \"cert.pem\"\nkey = \"key.pem\"\n")
    });
    let (_, cert, _) = ca_and_leaf("check");
    std::fs::write(dir.path().join("cert.pem"), cert).unwrap();
    let config = dir.path().join("meshql.toml");
    let config = config.to_str().unwrap();
    // the key file is missing
    let out = run_meshql(&["check", config], Duration::from_secs(30));
    let stderr =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("server.tls.key"), "{stderr}");
    assert!(stderr.contains("cannot read"), "{stderr}");
    // garbage where the key should be
    std::fs::write(
        dir.path().join("key.pem"),
        "-----BEGIN PRIVATE KEY-----\n%%%\n",
    )
    .unwrap();
    let out = run_meshql(&["check", config], Duration::from_secs(30));
    let stderr =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("meshql.toml:"), "{stderr}");
    assert!(stderr.contains("server.tls.key"), "{stderr}");
    assert!(stderr.contains("invalid PEM"), "{stderr}");
}
