//! TLS to a real MariaDB: `ssl-mode` and `ssl-ca`, with proof from the server (`Ssl_cipher`)
//! that the session is encrypted or not. The test starts its own MariaDB (with
//! `scripts/services/mariadb.sh`, in a temporary directory on a port of its own) so that it
//! has TLS whatever state the shared test server is in; it is stopped at the end.

use meshql_core::{
    NewDocument, ReadContext, Store, StoreError, StoreReader, StoreWriter, WriteContext,
};
use meshql_store_mysql::{MysqlDatabase, MysqlOptions, MysqlStore};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

struct Server {
    url: String,
    tls: PathBuf,
    services: tempfile::TempDir,
    port: u16,
}

impl Server {
    fn run(services: &Path, port: u16, action: &str) -> std::process::Output {
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/services/mariadb.sh");
        Command::new("bash")
            .arg(script)
            .arg(action)
            .env("MESHQL_SERVICES_DIR", services)
            .env("MESHQL_MARIADB_PORT", port.to_string())
            .stdin(std::process::Stdio::null())
            .output()
            .expect("mariadb.sh")
    }

    fn start() -> Self {
        let services = tempfile::tempdir().unwrap();
        // the server runs as `mysql`: it must be able to reach its directory
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(services.path(), std::fs::Permissions::from_mode(0o755))
                .unwrap();
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let out = Self::run(services.path(), port, "start");
        assert!(
            out.status.success(),
            "MariaDB did not start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let url = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        let tls = PathBuf::from(
            String::from_utf8(Self::run(services.path(), port, "tls").stdout)
                .unwrap()
                .trim(),
        );
        Self {
            url,
            tls,
            services,
            port,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Self::run(self.services.path(), self.port, "stop");
    }
}

/// Writes and reads a document on `url`; answers the session's TLS cipher (`None`: plain).
async fn round_trip(url: String) -> Result<Option<String>, StoreError> {
    let mut options = MysqlOptions::new(url);
    options.pool_size = 2;
    let db = MysqlDatabase::connect(&options)?;
    let cipher = db.tls_cipher().await?;
    let table = format!("tls_{}", uuid::Uuid::new_v4().simple());
    let store = MysqlStore::new(Arc::clone(&db), &table);
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
    Ok(cipher)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_modes_against_a_real_mariadb() {
    let server = Server::start();
    let url = &server.url;
    let ca = server.tls.join("ca.crt");
    let other = server.tls.join("other-ca.crt");

    // verified, by IP address and by name: the certificate names both
    for base in [url.clone(), url.replace("127.0.0.1", "localhost")] {
        let cipher = round_trip(format!(
            "{base}?ssl-mode=VERIFY_IDENTITY&ssl-ca={}",
            ca.display()
        ))
        .await
        .expect("VERIFY_IDENTITY with the server's CA");
        assert!(cipher.is_some(), "{base}: Ssl_cipher is empty: not TLS");
    }
    let cipher = round_trip(format!("{url}?ssl-mode=VERIFY_CA&ssl-ca={}", ca.display()))
        .await
        .expect("VERIFY_CA");
    assert!(cipher.is_some());
    // encrypted, certificate unchecked
    for mode in ["REQUIRED", "PREFERRED", "required"] {
        let cipher = round_trip(format!("{url}?ssl-mode={mode}"))
            .await
            .expect(mode);
        assert!(cipher.is_some(), "{mode}: not TLS");
    }
    // mysql_async's own parameters still work
    let cipher = round_trip(format!("{url}?require_ssl=true&verify_ca=false"))
        .await
        .expect("require_ssl");
    assert!(cipher.is_some());
    // plain: explicitly, and by default (as before)
    assert_eq!(
        round_trip(format!("{url}?ssl-mode=DISABLED"))
            .await
            .unwrap(),
        None
    );
    assert_eq!(round_trip(url.clone()).await.unwrap(), None);

    // reach the server as 127.0.0.2 (a proxy), an address its certificate does not name:
    // VERIFY_IDENTITY refuses it. So does VERIFY_CA, which should not compare names: mysql_async
    // 0.37.1 recognises a name mismatch by the text "NotValidForName", which rustls 0.23.x no
    // longer prints (docs/SECURITY.md); stricter than asked, never weaker. Should this start
    // to connect, the driver was fixed: update the docs.
    let port: u16 = url
        .rsplit(':')
        .next()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let proxy = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
    let proxy_port = proxy.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut inbound, _)) = proxy.accept().await else {
                return;
            };
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await
                {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    let elsewhere = url.replace(
        &format!("127.0.0.1:{port}"),
        &format!("127.0.0.2:{proxy_port}"),
    );
    let err = round_trip(format!(
        "{elsewhere}?ssl-mode=VERIFY_IDENTITY&ssl-ca={}",
        ca.display()
    ))
    .await
    .expect_err("the certificate does not name 127.0.0.2");
    assert!(err.to_string().contains("not valid for name"), "{err}");
    let err = round_trip(format!(
        "{elsewhere}?ssl-mode=VERIFY_CA&ssl-ca={}",
        ca.display()
    ))
    .await
    .expect_err("VERIFY_CA compares names too (driver limitation)");
    assert!(err.to_string().contains("not valid for name"), "{err}");

    // a CA that did not sign the server's certificate: refused, as "unavailable" (503 and
    // retried), with the reason
    for mode in ["VERIFY_IDENTITY", "VERIFY_CA", "REQUIRED"] {
        let err = round_trip(format!("{url}?ssl-mode={mode}&ssl-ca={}", other.display()))
            .await
            .expect_err(mode);
        let StoreError::Unavailable(message) = &err else {
            panic!("{mode}: {err:?} is not 'unavailable'")
        };
        assert!(
            message.contains("TLS handshake failed") && message.contains("UnknownIssuer"),
            "{mode}: {message}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_refuses_a_server_without_tls_preferred_goes_plain() {
    // a fake server whose greeting offers no TLS: enough for the client to decide
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let _ = s.write_all(&greeting_without_tls()).await;
                let mut rest = [0u8; 512];
                let _ = s.read(&mut rest).await;
            });
        }
    });
    let url = format!("mysql://u:p@127.0.0.1:{port}/db");
    let err = round_trip(format!("{url}?ssl-mode=REQUIRED"))
        .await
        .expect_err("REQUIRED against a server without TLS");
    assert!(
        err.to_string().contains("TLS") || err.to_string().contains("SSL"),
        "{err}"
    );
    let err = round_trip(format!("{url}?ssl-mode=PREFERRED"))
        .await
        .expect_err("the fake serves nothing after its greeting");
    assert!(
        !err.to_string().contains("TLS") && !err.to_string().contains("SSL"),
        "PREFERRED did not go on without TLS: {err}"
    );
}

/// A protocol-10 handshake packet whose capabilities lack CLIENT_SSL.
fn greeting_without_tls() -> Vec<u8> {
    let caps: u32 = 0x0000_0001 // LONG_PASSWORD
        | 0x0000_0008 // CONNECT_WITH_DB
        | 0x0000_0200 // PROTOCOL_41
        | 0x0000_8000 // SECURE_CONNECTION
        | 0x0008_0000; // PLUGIN_AUTH
    let mut p = vec![10];
    p.extend_from_slice(b"10.11.0-fake\0");
    p.extend_from_slice(&1u32.to_le_bytes()); // connection id
    p.extend_from_slice(b"abcdefgh\0"); // auth data, part 1
    p.extend_from_slice(&((caps & 0xffff) as u16).to_le_bytes());
    p.push(45); // utf8mb4
    p.extend_from_slice(&2u16.to_le_bytes()); // status: autocommit
    p.extend_from_slice(&((caps >> 16) as u16).to_le_bytes());
    p.push(21); // auth data length
    p.extend_from_slice(&[0; 10]);
    p.extend_from_slice(b"ijklmnopqrst\0"); // auth data, part 2
    p.extend_from_slice(b"mysql_native_password\0");
    let mut packet = (p.len() as u32).to_le_bytes()[..3].to_vec();
    packet.push(0); // sequence id
    packet.extend_from_slice(&p);
    packet
}
