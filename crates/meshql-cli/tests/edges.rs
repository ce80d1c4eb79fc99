//! The HTTP edge through the binary: request bodies must be JSON (415 otherwise, nothing
//! written), and every error answers a JSON body, whichever layer produced it.

mod common;

use common::{example_copy, Server};
use serde_json::Value;
use std::io::{Read, Write};

const FARM: &str = r#"{"name": "Emerdale", "farm_type": "megafarm", "zone": "north"}"#;

/// One raw HTTP/1.1 exchange (for requests a client library will not send as they are).
fn raw(server: &Server, request: &[u8]) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", server.port())).unwrap();
    s.write_all(request).unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).unwrap();
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, text)
}

fn body_of(http: &str) -> Value {
    let body = http.split("\r\n\r\n").nth(1).unwrap_or("");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {http}"))
}

#[tokio::test]
async fn bodies_that_are_not_json_are_refused_and_nothing_is_written() {
    let dir = example_copy("egg-economy", |c| c);
    let server = Server::start(dir.path(), &[]);
    let c = server.client();
    for content_type in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ] {
        let r = c
            .request(
                "POST",
                "/farm/api",
                Some(FARM.as_bytes().to_vec()),
                &[("content-type", content_type)],
            )
            .await;
        r.expect_status(415);
        assert!(
            r.json()["error"].as_str().unwrap().contains(content_type),
            "{}",
            r.text
        );
        assert!(r.header("access-control-allow-origin").is_some());
        // GraphQL too
        let q = r#"{"query": "{ getAll { name } }"}"#;
        c.request(
            "POST",
            "/farm/graph",
            Some(q.as_bytes().to_vec()),
            &[("content-type", content_type)],
        )
        .await
        .expect_status(415);
    }
    // no Content-Type at all
    let request = format!(
        "POST /farm/api HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{FARM}",
        FARM.len()
    );
    let (status, text) = raw(&server, request.as_bytes());
    assert_eq!(status, 415, "{text}");
    assert!(body_of(&text)["error"].as_str().is_some());
    assert_eq!(c.list("/farm/api").await.len(), 0, "nothing was written");

    // JSON media types are accepted, parameters and +json included
    for content_type in [
        "application/json; charset=utf-8",
        "application/merge-patch+json",
    ] {
        c.request(
            "POST",
            "/farm/api",
            Some(FARM.as_bytes().to_vec()),
            &[("content-type", content_type)],
        )
        .await
        .expect_status(201);
    }
    assert_eq!(c.list("/farm/api").await.len(), 2);
}

#[tokio::test]
async fn any_content_type_is_accepted_when_configured() {
    let dir = example_copy("egg-economy", |c| {
        format!("require_json_content_type = false\n{c}")
    });
    let server = Server::start(dir.path(), &[]);
    let c = server.client();
    c.request(
        "POST",
        "/farm/api",
        Some(FARM.as_bytes().to_vec()),
        &[("content-type", "text/plain")],
    )
    .await
    .expect_status(201);
}

#[tokio::test]
async fn every_error_has_a_json_body() {
    let dir = example_copy("egg-economy", |c| c);
    let server = Server::start(dir.path(), &[]);
    let c = server.client();
    // a method the route does not take: 405 with its Allow header, and JSON
    let r = c
        .request("POST", "/health", Some(b"{}".to_vec()), &[])
        .await;
    r.expect_status(405);
    assert!(r.json()["error"].is_string(), "{}", r.text);
    // invalid UTF-8 in a path parameter
    let (status, text) = raw(
        &server,
        b"GET /farm/api/%ff HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 400, "{text}");
    assert!(
        body_of(&text)["error"].as_str().unwrap().contains("UTF-8"),
        "{text}"
    );
    // an unknown route, a bad id, an invalid body
    for (method, path, body) in [
        ("GET", "/nowhere", None),
        ("POST", "/farm/api", Some(b"{not json".to_vec())),
        ("PUT", "/farm/api/missing", Some(FARM.as_bytes().to_vec())),
    ] {
        let r = c.request(method, path, body, &[]).await;
        assert!(r.status >= 400, "{method} {path}: {}", r.status);
        let v: Value = serde_json::from_str(&r.text)
            .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {}", r.text));
        assert!(v.get("error").is_some() || v.get("errors").is_some(), "{v}");
    }
}
