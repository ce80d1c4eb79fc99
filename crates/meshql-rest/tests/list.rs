//! `GET P` through the router, on the memory store: the streamed list is the whole array in
//! id order, byte for byte; pages with `limit`/`after` walk it once with `Link` headers; bad
//! parameters are 400s naming the parameter; a storage error after the body began cuts it
//! short instead of ending it as valid JSON.

use async_trait::async_trait;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use meshql_core::{
    AuthError, Authorizer, BatchSearch, Credentials, DynReader, DynStore, Envelope, KeyedRows,
    NewDocument, NoAuth, ReadContext, Row, Search, StoreError, StoreReader, WriteContext,
};
use meshql_engine::EntityService;
use meshql_rest::{router, Restlette};
use meshql_store_memory::MemoryStore;
use serde_json::{json, Value};
use std::sync::Arc;
use tower::ServiceExt;

async fn store_with(n: usize) -> DynStore {
    let store: DynStore = Arc::new(MemoryStore::new());
    let docs = (0..n)
        .map(|i| {
            NewDocument::new(
                json!({"name": format!("farm-{i}"), "n": i})
                    .as_object()
                    .unwrap()
                    .clone(),
            )
        })
        .collect();
    store
        .create_many(docs, &WriteContext::SYSTEM)
        .await
        .unwrap();
    store
}

fn app(store: DynStore, reader: Option<DynReader>) -> axum::Router {
    let mut service = EntityService::new("farm", store, None, vec![], Arc::new(NoAuth));
    if let Some(r) = reader {
        service = service.with_reader(r);
    }
    router(Arc::new(Restlette {
        path: "/farm/api".into(),
        service: Arc::new(service),
        openapi: Default::default(),
        docs_page: None,
        body_limit: 1 << 20,
        see_other: false,
        read_only: false,
        read_after: None,
    }))
}

struct Answer {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Result<Vec<u8>, String>,
}

async fn get(app: &axum::Router, uri: &str) -> Answer {
    let resp = app
        .clone()
        .oneshot(Request::get(uri).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .map(|b| b.to_vec())
        .map_err(|e| e.to_string());
    Answer {
        status,
        headers,
        body,
    }
}

/// The store's list sorted by id, as the array REST answered before pages.
async fn expected(store: &DynStore) -> Vec<u8> {
    let mut all = store.list(&ReadContext::LATEST).await.unwrap();
    all.sort_by(|a, b| a.id.cmp(&b.id));
    let mut out = b"[".to_vec();
    for (i, e) in all.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(e.payload.as_bytes());
    }
    out.push(b']');
    out
}

#[tokio::test]
async fn a_small_list_is_one_body_and_a_large_one_is_streamed_whole() {
    let small = store_with(20).await;
    let a = get(&app(small.clone(), None), "/farm/api").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.headers["content-type"], "application/json");
    let body = a.body.unwrap();
    assert_eq!(a.headers["content-length"], body.len().to_string().as_str());
    assert_eq!(body, expected(&small).await);
    assert_eq!(
        get(&app(store_with(0).await, None), "/farm/api")
            .await
            .body
            .unwrap(),
        b"[]"
    );

    for n in [1_000, 1_001, 2_000, 3_456] {
        let store = store_with(n).await;
        let a = get(&app(store.clone(), None), "/farm/api/").await;
        assert_eq!(a.status, StatusCode::OK);
        assert!(
            n == 1_000 || !a.headers.contains_key("content-length"),
            "{n} documents are streamed"
        );
        let body = a.body.unwrap();
        assert_eq!(body, expected(&store).await, "{n} documents");
        let items: Vec<Value> = serde_json::from_slice(&body).unwrap();
        assert_eq!(items.len(), n);
    }
}

#[tokio::test]
async fn pages_walk_the_list_once_with_next_links() {
    let store = store_with(2_345).await;
    let app = app(store.clone(), None);
    let mut uri = "/farm/api?limit=500".to_owned();
    let mut seen: Vec<Value> = Vec::new();
    let mut pages = 0;
    loop {
        let a = get(&app, &uri).await;
        assert_eq!(a.status, StatusCode::OK, "{uri}");
        let items: Vec<Value> = serde_json::from_slice(&a.body.unwrap()).unwrap();
        pages += 1;
        seen.extend(items);
        let Some(link) = a.headers.get("link") else {
            break;
        };
        assert_eq!(a.headers["access-control-expose-headers"], "Link");
        let link = link.to_str().unwrap();
        let last = seen.last().unwrap()["id"].as_str().unwrap();
        assert_eq!(
            link,
            format!("</farm/api?limit=500&after={last}>; rel=\"next\"")
        );
        uri = link[1..link.find('>').unwrap()].to_owned();
    }
    assert_eq!(pages, 5);
    assert_eq!(serde_json::to_vec(&seen).unwrap(), expected(&store).await);

    // exactly a page's worth: no link on the page that ends the list
    let a = get(&app, "/farm/api?limit=2345").await;
    assert!(a.headers.get("link").is_none());
    // `after` alone: up to 1,000 from there; past the end: empty, no link
    let ids: Vec<String> = seen
        .iter()
        .map(|v| v["id"].as_str().unwrap().to_owned())
        .collect();
    let a = get(&app, &format!("/farm/api?after={}", ids[100])).await;
    let items: Vec<Value> = serde_json::from_slice(&a.body.unwrap()).unwrap();
    assert_eq!(items.len(), 1_000);
    assert_eq!(items[0]["id"], ids[101]);
    assert!(a.headers.contains_key("link"));
    let a = get(&app, &format!("/farm/api?after={}&limit=10", ids[2_344])).await;
    assert_eq!(a.body.unwrap(), b"[]");
    assert!(a.headers.get("link").is_none());
    // an unknown parameter is refused, never ignored (a misspelt `limit` is not the whole list)
    let a = get(&app, "/farm/api?lmit=1").await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn bad_parameters_are_refused_naming_them() {
    let app = app(store_with(3).await, None);
    for (query, name) in [
        ("limit=0", "limit"),
        ("limit=10001", "limit"),
        ("limit=-5", "limit"),
        ("limit=abc", "limit"),
        ("limit=", "limit"),
        ("limit=1&limit=2", "limit"),
        ("after=", "after"),
        ("after=a&after=b", "after"),
        ("at=yesterday", "at"),
        ("at=1&at=2", "at"),
        ("lmit=1", "lmit"),
        ("foo=bar&limit=1", "foo"),
    ] {
        let a = get(&app, &format!("/farm/api?{query}")).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{query}");
        let v: Value = serde_json::from_slice(&a.body.unwrap()).unwrap();
        assert_eq!(v["parameter"], name, "{query}: {v}");
        assert!(v["error"].as_str().unwrap().contains(name), "{v}");
    }
}

/// The memory store, failing every page after the first.
struct FailsAfterFirstPage(DynStore);

#[async_trait]
impl StoreReader for FailsAfterFirstPage {
    async fn read(&self, id: &str, ctx: &ReadContext<'_>) -> Result<Option<Envelope>, StoreError> {
        self.0.read(id, ctx).await
    }
    async fn read_many(
        &self,
        ids: &[String],
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Envelope>, StoreError> {
        self.0.read_many(ids, ctx).await
    }
    async fn list(&self, ctx: &ReadContext<'_>) -> Result<Vec<Envelope>, StoreError> {
        self.0.list(ctx).await
    }
    async fn list_page(
        &self,
        after: Option<&str>,
        limit: usize,
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Envelope>, StoreError> {
        match after {
            None => self.0.list_page(after, limit, ctx).await,
            Some(_) => Err(StoreError::Unavailable("the database went away".into())),
        }
    }
    async fn versions(&self, id: &str) -> Result<Vec<Envelope>, StoreError> {
        self.0.versions(id).await
    }
    async fn find(&self, s: &Search<'_>, ctx: &ReadContext<'_>) -> Result<Vec<Row>, StoreError> {
        self.0.find(s, ctx).await
    }
    async fn find_batch(
        &self,
        b: &BatchSearch<'_>,
        ctx: &ReadContext<'_>,
    ) -> Result<KeyedRows, StoreError> {
        self.0.find_batch(b, ctx).await
    }
}

#[tokio::test]
async fn a_storage_error_mid_stream_cuts_the_body_short() {
    let store = store_with(1_500).await;
    let failing = Arc::new(FailsAfterFirstPage(store.clone()));
    let app = app(store, Some(failing));
    let a = get(&app, "/farm/api").await;
    assert_eq!(
        a.status,
        StatusCode::OK,
        "the status left with the first page"
    );
    assert!(a.body.is_err(), "the body ends in an error, not in `]`");
    // before anything was sent, an error is an ordinary error response
    let a = get(&app, "/farm/api?after=x").await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
}

/// `Bearer <name>` is the caller `name`.
struct Named;

impl Authorizer for Named {
    fn credentials(&self, authorization: Option<&str>) -> Result<Credentials, AuthError> {
        Ok(
            match authorization.and_then(|h| h.strip_prefix("Bearer ")) {
                Some(name) => Credentials::Tokens(vec![name.to_owned()]),
                None => Credentials::Unrestricted,
            },
        )
    }
}

#[tokio::test]
async fn every_page_of_a_streamed_list_is_filtered_by_the_callers_tokens() {
    let store: DynStore = Arc::new(MemoryStore::new());
    for (owner, n) in [("alice", 1_500), ("bob", 1_500)] {
        let docs = (0..n)
            .map(|i| NewDocument::new(json!({"owner": owner, "n": i}).as_object().unwrap().clone()))
            .collect();
        store
            .create_many(
                docs,
                &WriteContext::SYSTEM.with_tokens(vec![owner.to_owned()]),
            )
            .await
            .unwrap();
    }
    let service = EntityService::new("farm", store, None, vec![], Arc::new(Named));
    let app = router(Arc::new(Restlette {
        path: "/farm/api".into(),
        service: Arc::new(service),
        openapi: Default::default(),
        docs_page: None,
        body_limit: 1 << 20,
        see_other: false,
        read_only: false,
        read_after: None,
    }));
    for (who, uri) in [("alice", "/farm/api"), ("bob", "/farm/api?limit=2000")] {
        let resp = app
            .clone()
            .oneshot(
                Request::get(uri)
                    .header("authorization", format!("Bearer {who}"))
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        let items: Vec<Value> = serde_json::from_slice(&body).unwrap();
        assert_eq!(items.len(), 1_500, "{who}");
        assert!(items.iter().all(|v| v["owner"] == who), "{who}");
    }
    let everyone = get(&app, "/farm/api").await;
    let items: Vec<Value> = serde_json::from_slice(&everyone.body.unwrap()).unwrap();
    assert_eq!(items.len(), 3_000, "unrestricted: everything");
}
