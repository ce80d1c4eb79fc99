//! TLS to a MongoDB-wire server: FerretDB with its TLS listener (`scripts/services/ferretdb.sh`,
//! a server of this test's own on ports of its own, stopped and its database dropped at the
//! end). The driver's URI options `tls`, `tlsCAFile` and `tlsAllowInvalidCertificates`; the
//! TLS port speaks nothing but TLS, so a session there is encrypted.

use meshql_core::{
    NewDocument, ReadContext, Store, StoreError, StoreReader, StoreWriter, WriteContext,
};
use meshql_store_mongo::{MongoDatabase, MongoOptions, MongoStore};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

struct Server {
    port: u16,
    tls_port: u16,
    tls: PathBuf,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Server {
    fn run(&self, action: &str) -> std::process::Output {
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/services/ferretdb.sh");
        Command::new("bash")
            .arg(script)
            .arg(action)
            .env("MESHQL_FERRETDB_PORT", self.port.to_string())
            .env("MESHQL_FERRETDB_TLS_PORT", self.tls_port.to_string())
            .stdin(std::process::Stdio::null())
            .output()
            .expect("ferretdb.sh")
    }

    fn start() -> Self {
        let mut server = Self {
            port: free_port(),
            tls_port: free_port(),
            tls: PathBuf::new(),
        };
        let out = server.run("start");
        assert!(
            out.status.success(),
            "FerretDB did not start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        server.tls = PathBuf::from(String::from_utf8(server.run("tls").stdout).unwrap().trim());
        server
    }

    fn tls_uri(&self, host: &str, options: &str) -> String {
        format!(
            "mongodb://{host}:{}/?serverSelectionTimeoutMS=3000&{options}",
            self.tls_port
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.run("destroy");
    }
}

async fn round_trip(uri: String) -> Result<(), StoreError> {
    let db = MongoDatabase::connect(&MongoOptions::new(uri, "meshql_tls")).await?;
    let collection = format!("tls_{}", uuid::Uuid::new_v4().simple());
    let store = MongoStore::new(Arc::clone(&db), &collection);
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
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_uri_options_against_ferretdb() {
    let server = Server::start();
    let ca = server.tls.join("ca.crt");
    let other = server.tls.join("other-ca.crt");

    // verified, by IP address and by name
    for host in ["127.0.0.1", "localhost"] {
        round_trip(server.tls_uri(host, &format!("tls=true&tlsCAFile={}", ca.display())))
            .await
            .unwrap_or_else(|e| panic!("{host}: {e}"));
    }
    // a CA that did not sign the certificate: unavailable (503, retried), with the reason
    let err = round_trip(server.tls_uri(
        "127.0.0.1",
        &format!("tls=true&tlsCAFile={}", other.display()),
    ))
    .await
    .expect_err("a certificate from another CA");
    let StoreError::Unavailable(message) = &err else {
        panic!("{err:?} is not 'unavailable'")
    };
    assert!(message.contains("UnknownIssuer"), "{message}");
    // ... unless certificates are not checked
    round_trip(server.tls_uri(
        "127.0.0.1",
        &format!(
            "tls=true&tlsAllowInvalidCertificates=true&tlsCAFile={}",
            other.display()
        ),
    ))
    .await
    .expect("tlsAllowInvalidCertificates");
    // plain text on the TLS port: no answer a driver can use
    round_trip(server.tls_uri("127.0.0.1", "tls=false"))
        .await
        .expect_err("plain text to the TLS listener");
    // the plain port still serves plain clients
    round_trip(format!("mongodb://127.0.0.1:{}/", server.port))
        .await
        .expect("plain");
}
