//! A restlette of a read-role process (`meshql serve --role read`): reads are served, every
//! write is a 405 with a JSON error that names the write role, and nothing is written.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use meshql_core::{DynStore, NewDocument, NoAuth, ReadContext, WriteContext};
use meshql_engine::EntityService;
use meshql_rest::{router, Restlette};
use meshql_store_memory::MemoryStore;
use serde_json::{json, Value};
use std::sync::Arc;
use tower::ServiceExt;

async fn send(
    app: &axum::Router,
    method: &str,
    uri: &str,
    body: &str,
) -> (StatusCode, String, Value) {
    let resp = app
        .clone()
        .oneshot(
            Request::builder()
                .method(method)
                .uri(uri)
                .header("content-type", "application/json")
                .body(Body::from(body.to_owned()))
                .unwrap(),
        )
        .await
        .unwrap();
    let status = resp.status();
    let allow = resp
        .headers()
        .get("allow")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    (
        status,
        allow,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn a_read_role_restlette_reads_and_refuses_every_write() {
    let store: DynStore = Arc::new(MemoryStore::new());
    let doc = store
        .create(
            NewDocument::new(json!({"name": "kept"}).as_object().unwrap().clone()),
            &WriteContext::SYSTEM,
        )
        .await
        .unwrap();
    let app = router(Arc::new(Restlette {
        path: "/farm/api".into(),
        service: Arc::new(EntityService::new(
            "farm",
            store.clone(),
            None,
            vec![],
            Arc::new(NoAuth),
        )),
        openapi: Default::default(),
        docs_page: None,
        body_limit: 1 << 20,
        see_other: false,
        read_only: true,
        read_after: None,
    }));

    let (status, _, body) = send(&app, "GET", &format!("/farm/api/{}", doc.id), "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["name"], "kept");
    let (status, _, body) = send(&app, "GET", "/farm/api", "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body.as_array().unwrap().len(), 1);
    let (status, _, _) = send(&app, "GET", &format!("/farm/api/bulk?ids={}", doc.id), "").await;
    assert_eq!(status, StatusCode::OK);

    let one = format!("/farm/api/{}", doc.id);
    let writes = [
        ("POST", "/farm/api", r#"{"name":"new"}"#),
        ("POST", "/farm/api/bulk", r#"[{"name":"new"}]"#),
        ("PUT", one.as_str(), r#"{"name":"changed"}"#),
        ("DELETE", one.as_str(), ""),
        ("PATCH", one.as_str(), r#"{"name":"changed"}"#),
    ];
    for (method, uri, body) in writes {
        let (status, allow, answer) = send(&app, method, uri, body).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {uri}");
        assert_eq!(allow, "GET, OPTIONS", "{method} {uri}");
        let message = answer["error"].as_str().unwrap();
        assert!(
            message.contains(method) && message.contains("write role"),
            "{method} {uri}: {message}"
        );
    }

    // nothing was written: the one document, unchanged
    let all = store.list(&ReadContext::LATEST).await.unwrap();
    assert_eq!(all.len(), 1);
    assert!(all[0].payload.as_str().contains("kept"));
}
