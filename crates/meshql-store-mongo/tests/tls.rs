//! TLS to a MongoDB-wire server: FerretDB with its TLS listener (`scripts/services/ferretdb.sh`,
//! a server of this test's own on ports of its own, stopped and its database dropped at the
//! end). The driver's URI options `tls`, `tlsCAFile` and `tlsAllowInvalidCertificates`, in
//! `uri` and in `read_url`; the TLS port speaks nothing but TLS, so a session there is
//! encrypted.

use meshql_core::{
    Database, NewDocument, ReadContext, Store, StoreError, StoreReader, StoreWriter, WriteContext,
};
use meshql_store_mongo::{MongoDatabase, MongoOptions, MongoStore};
use serde_json::json;
use std::sync::Arc;

mod common;
use common::Server;

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
    round_trip(server.uri()).await.expect("plain");

    // a `read_url` takes the same TLS options: the plain port for writes, the TLS port (the
    // same server) for the API's reads
    let read_over_tls = |ca: &std::path::Path| {
        let read_url = server.tls_uri("127.0.0.1", &format!("tls=true&tlsCAFile={}", ca.display()));
        MongoOptions {
            read_url: Some(read_url),
            ..MongoOptions::new(server.uri(), "meshql_tls")
        }
    };
    let db = MongoDatabase::connect(&read_over_tls(&ca)).await.unwrap();
    let collection = format!("tls_{}", uuid::Uuid::new_v4().simple());
    let store = MongoStore::new(Arc::clone(&db), &collection);
    store.prepare(&[]).await.unwrap();
    let payload = json!({"name": "read over tls"})
        .as_object()
        .unwrap()
        .clone();
    let created = store
        .create(NewDocument::new(payload), &WriteContext::SYSTEM)
        .await
        .unwrap();
    let replica = Database::replica(Arc::clone(&db), &collection).expect("a read_url");
    let read = replica
        .read(&created.id, &ReadContext::LATEST)
        .await
        .unwrap()
        .expect("read through the read_url's TLS client");
    assert!(read.payload.contains("read over tls"), "{}", read.payload);
    db.close().await;
    // a read_url trusting the wrong CA: its reads are unavailable, with the reason
    let db = MongoDatabase::connect(&read_over_tls(&other))
        .await
        .unwrap();
    let replica = Database::replica(Arc::clone(&db), &collection).expect("a read_url");
    let err = replica
        .read(&created.id, &ReadContext::LATEST)
        .await
        .expect_err("a certificate from another CA");
    let StoreError::Unavailable(message) = &err else {
        panic!("{err:?} is not 'unavailable'")
    };
    assert!(message.contains("UnknownIssuer"), "{message}");
    db.close().await;
}
