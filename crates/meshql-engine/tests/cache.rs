//! The read cache through the engine: answers served from it, never stale after an
//! acknowledged write, past moments immutable, replicas that have not caught up not cached.

use async_trait::async_trait;
use meshql_core::time::now_millis;
use meshql_core::{
    BatchSearch, Credentials, DynReader, DynStore, Envelope, KeyedRows, Millis, NoAuth,
    QueryTemplate, ReadContext, Row, Search, StoreError, StoreReader,
};
use meshql_engine::{Cache, CacheSettings, EntityService, Session};
use meshql_store_memory::MemoryStore;
use serde_json::json;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// Permits of the gate: taking them all holds every read at storage.
const GATE: u32 = 1 << 20;

/// The reader behind the cache: counts the reads that reach it, can hold them at a gate, and
/// can claim to be a replica applied up to a moment.
struct Behind {
    store: DynStore,
    reads: AtomicU64,
    gate: Semaphore,
    /// `i64::MAX`: the primary (`applied_through` is `None`).
    applied: AtomicI64,
}

impl Behind {
    fn new(store: DynStore) -> Arc<Behind> {
        Arc::new(Behind {
            store,
            reads: AtomicU64::new(0),
            gate: Semaphore::new(GATE as usize),
            applied: AtomicI64::new(i64::MAX),
        })
    }

    fn reads(&self) -> u64 {
        self.reads.load(Ordering::SeqCst)
    }

    async fn enter(&self) {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let _permit = self.gate.acquire().await.unwrap();
    }
}

#[async_trait]
impl StoreReader for Behind {
    async fn read(&self, id: &str, ctx: &ReadContext<'_>) -> Result<Option<Envelope>, StoreError> {
        self.enter().await;
        self.store.read(id, ctx).await
    }
    async fn read_many(
        &self,
        ids: &[String],
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Envelope>, StoreError> {
        self.enter().await;
        self.store.read_many(ids, ctx).await
    }
    async fn list(&self, ctx: &ReadContext<'_>) -> Result<Vec<Envelope>, StoreError> {
        self.enter().await;
        self.store.list(ctx).await
    }
    async fn list_page(
        &self,
        after: Option<&str>,
        limit: usize,
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Envelope>, StoreError> {
        self.enter().await;
        self.store.list_page(after, limit, ctx).await
    }
    async fn versions(&self, id: &str) -> Result<Vec<Envelope>, StoreError> {
        self.store.versions(id).await
    }
    async fn find(
        &self,
        search: &Search<'_>,
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Row>, StoreError> {
        self.enter().await;
        self.store.find(search, ctx).await
    }
    async fn find_batch(
        &self,
        batch: &BatchSearch<'_>,
        ctx: &ReadContext<'_>,
    ) -> Result<KeyedRows, StoreError> {
        self.enter().await;
        self.store.find_batch(batch, ctx).await
    }
    fn applied_through(&self) -> Option<Millis> {
        match self.applied.load(Ordering::SeqCst) {
            i64::MAX => None,
            t => Some(t),
        }
    }
}

struct World {
    service: EntityService,
    behind: Arc<Behind>,
    cache: Arc<Cache>,
    session: Session,
}

impl World {
    async fn create(&self, doc: serde_json::Value) -> Envelope {
        self.service.create(&self.session, doc).await.unwrap()
    }

    async fn update(&self, id: &str, doc: serde_json::Value) -> Envelope {
        self.service.update(&self.session, id, doc).await.unwrap()
    }

    /// The version of `id` the service answers as of `at` (it must have one).
    async fn read(&self, id: &str, at: Option<Millis>) -> Envelope {
        self.service
            .read(&self.session, id, at)
            .await
            .unwrap()
            .unwrap()
    }
}

fn world_with(settings: CacheSettings) -> World {
    world_on(Cache::local(settings, ["hen".to_owned()]))
}

/// A world whose service reads through `cache` (made for `hen`).
fn world_on(cache: Arc<Cache>) -> World {
    let store: DynStore = Arc::new(MemoryStore::new());
    let behind = Behind::new(store.clone());
    let service = EntityService::new("hen", store, None, vec![], Arc::new(NoAuth))
        .with_reader(behind.clone() as DynReader)
        .with_cache(cache.clone());
    World {
        service,
        behind,
        cache,
        session: Session::unrestricted(Credentials::Unrestricted),
    }
}

fn world() -> World {
    world_with(CacheSettings::default())
}

fn name_of(e: &Envelope) -> String {
    e.payload_map().unwrap()["name"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn a_read_by_id_is_served_from_the_cache_until_its_document_is_written() {
    let w = world();
    let a = w.create(json!({"name": "a1"})).await;
    let b = w.create(json!({"name": "b1"})).await;
    for _ in 0..3 {
        let got = w.read(&a.id, None).await;
        assert_eq!(name_of(&got), "a1");
    }
    assert_eq!(w.behind.reads(), 1, "one read reached storage");
    w.service.read(&w.session, &b.id, None).await.unwrap();
    assert_eq!(w.behind.reads(), 2);

    w.update(&a.id, json!({"name": "a2"})).await;
    let got = w.read(&a.id, None).await;
    assert_eq!(name_of(&got), "a2", "the write is seen at once");
    assert_eq!(w.behind.reads(), 3);
    // b's answer does not depend on a's document
    w.service.read(&w.session, &b.id, None).await.unwrap();
    assert_eq!(w.behind.reads(), 3, "b still cached");

    w.service.remove(&w.session, &a.id).await.unwrap();
    assert!(w
        .service
        .read(&w.session, &a.id, None)
        .await
        .unwrap()
        .is_none());
    let counts = w.cache.counts();
    assert_eq!((counts.hits, counts.misses), (3, 4), "{counts:?}");
}

/// "Not found" is cached under the document's tag like any answer, and every way a document
/// can come to be under an id it was asked for before advances that tag: a processor's
/// output (ids chosen by the writer), and another process's write arriving by the feed.
#[tokio::test]
async fn a_missing_document_is_cached_until_a_write_names_its_id() {
    let w = world();
    let missing = |id: &'static str| {
        let w = &w;
        async move { w.service.read(&w.session, id, None).await.unwrap() }
    };
    for _ in 0..3 {
        assert!(missing("chosen-1").await.is_none());
    }
    assert_eq!(w.behind.reads(), 1, "the second and third reads were hits");

    let mut batch = meshql_core::OutputBatch::new("test", 1);
    batch.writes.push(meshql_core::OutputWrite::Put {
        id: "chosen-1".into(),
        payload: json!({"name": "made"}).to_string(),
    });
    w.service.apply_output(&w.session, batch).await.unwrap();
    let got = missing("chosen-1")
        .await
        .expect("the output is seen at once");
    assert_eq!(name_of(&got), "made");
    assert_eq!(w.behind.reads(), 2);

    // another process creates `chosen-2` in the same store; its change comes by the feed
    assert!(missing("chosen-2").await.is_none());
    let ctx = meshql_core::WriteContext::default();
    let doc = meshql_core::NewDocument::with_id(
        "chosen-2",
        json!({"name": "elsewhere"}).as_object().unwrap().clone(),
    );
    let made = w.service.writer().create(doc, &ctx).await.unwrap();
    assert!(
        missing("chosen-2").await.is_none(),
        "until the feed brings the change, the answer stands"
    );
    w.cache.invalidated("hen", "chosen-2", made.created_at);
    let got = missing("chosen-2")
        .await
        .expect("seen once the feed brought it");
    assert_eq!(name_of(&got), "elsewhere");

    // a delete brings "not found" back at once, and it is cached again
    w.service.remove(&w.session, "chosen-2").await.unwrap();
    let before = w.behind.reads();
    assert!(missing("chosen-2").await.is_none());
    assert!(missing("chosen-2").await.is_none());
    assert_eq!(w.behind.reads(), before + 1);
}

#[tokio::test]
async fn lists_and_searches_are_invalidated_by_any_write_to_their_entity() {
    let w = world();
    let template = QueryTemplate::filter(r#"{"payload.kind": "{{kind}}"}"#).unwrap();
    let args = json!({"kind": "brown"}).as_object().unwrap().clone();
    let access = meshql_engine::Access::unrestricted();
    w.create(json!({"name": "a", "kind": "brown"})).await;
    let find = || async {
        w.service
            .find(&access, &Search::new(&template, &args, None), None)
            .await
            .unwrap()
            .rows
            .len()
    };
    assert_eq!(find().await, 1);
    assert_eq!(find().await, 1);
    assert_eq!(w.service.list(&w.session, None).await.unwrap().len(), 1);
    assert_eq!(w.service.list(&w.session, None).await.unwrap().len(), 1);
    assert_eq!(w.behind.reads(), 2);
    w.create(json!({"name": "b", "kind": "brown"})).await;
    assert_eq!(find().await, 2, "a create is seen by the search at once");
    assert_eq!(w.service.list(&w.session, None).await.unwrap().len(), 2);
    assert_eq!(w.behind.reads(), 4);
}

#[tokio::test]
async fn an_answer_as_of_before_a_write_is_not_kept_as_the_latest() {
    let w = world();
    let old = w.create(json!({"name": "v1"})).await;
    tokio::time::sleep(Duration::from_millis(2)).await;
    w.update(&old.id, json!({"name": "v2"})).await;
    // a request whose snapshot was taken before the write reads v1 (its moment) ...
    let then = w.read(&old.id, Some(old.created_at)).await;
    assert_eq!(name_of(&then), "v1");
    // ... and that answer is not what later reads get
    for at in [None, Some(w.service.read_snapshot())] {
        let now = w
            .service
            .read(&w.session, &old.id, at)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            name_of(&now),
            "v2",
            "never the version before an acknowledged write"
        );
    }
}

#[tokio::test]
async fn a_read_held_across_a_write_does_not_leave_its_answer_behind() {
    let w = Arc::new(world());
    let a = w.create(json!({"name": "v1"})).await;
    let held = w.behind.gate.acquire_many(GATE).await.unwrap();
    // the read misses and waits at storage; the cache's tags were taken before it
    let reader = {
        let (w, id) = (w.clone(), a.id.clone());
        tokio::spawn(async move { w.service.read(&w.session, &id, None).await })
    };
    while w.behind.reads() < 1 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // the write commits and is acknowledged; then the held read goes on
    w.update(&a.id, json!({"name": "v2"})).await;
    drop(held);
    reader.await.unwrap().unwrap();
    let now = w.read(&a.id, None).await;
    assert_eq!(name_of(&now), "v2");
}

#[tokio::test]
async fn a_recent_moment_reads_the_latest_answer_and_an_earlier_one_does_not() {
    let w = world();
    let a = w.create(json!({"name": "v1"})).await;
    let t1 = w.service.read_snapshot();
    w.service.read(&w.session, &a.id, Some(t1)).await.unwrap();
    w.service
        .read(&w.session, &a.id, Some(t1 + 1))
        .await
        .unwrap();
    assert_eq!(w.behind.reads(), 1, "a later snapshot uses the answer");
    w.service
        .read(&w.session, &a.id, Some(t1 - 1))
        .await
        .unwrap();
    assert_eq!(w.behind.reads(), 2, "an earlier one may differ: storage");
    tokio::time::sleep(Duration::from_millis(2)).await;
    let v2 = w.update(&a.id, json!({"name": "v2"})).await;
    let t3 = w.service.read_snapshot();
    let got = w.read(&a.id, Some(t3)).await;
    assert_eq!(name_of(&got), "v2");
    // as of t1 (recent, before the write): v1, from storage, and not kept as the latest
    let then = w.read(&a.id, Some(t1)).await;
    assert_eq!(name_of(&then), "v1");
    let got = w.read(&a.id, Some(v2.created_at)).await;
    assert_eq!(name_of(&got), "v2");
}

#[tokio::test]
async fn a_read_at_a_past_moment_is_cached_and_never_changes() {
    let w = world_with(CacheSettings {
        settle: Duration::from_millis(100),
        ..CacheSettings::default()
    });
    let a = w.create(json!({"name": "old"})).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let past = now_millis() - 120;
    for _ in 0..3 {
        let got = w.read(&a.id, Some(past)).await;
        assert_eq!(name_of(&got), "old");
    }
    assert_eq!(w.behind.reads(), 1);
    w.update(&a.id, json!({"name": "new"})).await;
    let got = w.read(&a.id, Some(past)).await;
    assert_eq!(name_of(&got), "old");
    assert_eq!(
        w.behind.reads(),
        1,
        "a past moment is not invalidated by a later write"
    );
    let got = w.read(&a.id, None).await;
    assert_eq!(name_of(&got), "new");
}

#[tokio::test]
async fn a_replica_that_has_not_applied_the_last_write_is_not_cached() {
    let w = world();
    w.behind.applied.store(0, Ordering::SeqCst);
    let a = w.create(json!({"name": "v1"})).await;
    for n in 1..=3 {
        w.service.read(&w.session, &a.id, None).await.unwrap();
        assert_eq!(
            w.behind.reads(),
            n,
            "nothing stored: the replica may be behind"
        );
    }
    assert_eq!(w.cache.counts().unfilled, 3);
    // once the replica is known to have applied it, its answers are kept
    w.behind
        .applied
        .store(now_millis() + 1000, Ordering::SeqCst);
    w.service.read(&w.session, &a.id, None).await.unwrap();
    w.service.read(&w.session, &a.id, None).await.unwrap();
    assert_eq!(w.behind.reads(), 4);
}

#[tokio::test]
async fn a_replica_that_applied_commits_past_a_writes_stamp_but_not_its_commit_is_not_cached() {
    // the replica is a store of its own, which gets the document only when told to
    let primary: DynStore = Arc::new(MemoryStore::new());
    let replica: DynStore = Arc::new(MemoryStore::new());
    let behind = Behind::new(replica.clone());
    let cache = Cache::local(CacheSettings::default(), ["hen".to_owned()]);
    let service = EntityService::new("hen", primary, None, vec![], Arc::new(NoAuth))
        .with_reader(behind.clone() as DynReader)
        .with_cache(cache.clone());
    let session = Session::unrestricted(Credentials::Unrestricted);
    // a create of `x` stamped 200 ms before it committed (a long transaction) has just been
    // acknowledged; the replica has applied every commit up to 100 ms ago: after the stamp,
    // before the commit, so not this one
    let stamp = now_millis() - 200;
    cache.invalidate("hen", &["x"], stamp).await;
    behind.applied.store(now_millis() - 100, Ordering::SeqCst);
    assert!(service.read(&session, "x", None).await.unwrap().is_none());
    assert_eq!(cache.counts().unfilled, 1, "{:?}", cache.counts());
    // the replica applies it: the next read finds it (no "not found" was kept)
    let doc = meshql_core::NewDocument {
        id: Some("x".into()),
        payload: json!({"name": "x1"}).as_object().unwrap().clone(),
        created_at: Some(stamp),
    };
    replica
        .create(doc, &meshql_core::WriteContext::default())
        .await
        .unwrap();
    behind.applied.store(now_millis() + 1000, Ordering::SeqCst);
    let got = service.read(&session, "x", None).await.unwrap();
    assert_eq!(got.map(|e| name_of(&e)), Some("x1".to_owned()));
}

#[tokio::test]
async fn a_change_from_the_feed_invalidates_and_marks_what_the_cache_has_seen() {
    let w = world();
    let a = w.create(json!({"name": "v1"})).await;
    w.service.read(&w.session, &a.id, None).await.unwrap();
    // another process writes the same store; its change arrives through the feed
    let ctx = meshql_core::WriteContext::default();
    let v2 = w
        .service
        .writer()
        .update(
            &a.id,
            meshql_core::NewDocument::new(json!({"name": "v2"}).as_object().unwrap().clone()),
            &ctx,
        )
        .await
        .unwrap()
        .unwrap();
    let reader = w.service.reader().clone();
    assert!(
        !reader.has_version(&a.id, v2.created_at).await.unwrap(),
        "not seen yet"
    );
    let got = w.read(&a.id, None).await;
    assert_eq!(
        name_of(&got),
        "v1",
        "until the feed brings the change, the answer stands"
    );
    // another document's change stamped later arrives first (the feed is in commit order):
    // this one's is still not seen
    w.cache.invalidated("hen", "another", v2.created_at + 5);
    assert!(
        !reader.has_version(&a.id, v2.created_at).await.unwrap(),
        "a later change of another document says nothing of this one"
    );
    w.cache.invalidated("hen", &a.id, v2.created_at);
    assert!(reader.has_version(&a.id, v2.created_at).await.unwrap());
    let got = w.read(&a.id, None).await;
    assert_eq!(name_of(&got), "v2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_and_reads_never_see_an_older_version_than_acknowledged() {
    let w = Arc::new(world());
    let ids: Vec<String> = futures_ids(&w, 4).await;
    let mut tasks = Vec::new();
    for id in ids.clone() {
        // a writer per document: each acknowledged version is read back at once, by id and
        // through a search, never older
        let w = w.clone();
        tasks.push(tokio::spawn(async move {
            let template = QueryTemplate::filter(r#"{"id": "{{id}}"}"#).unwrap();
            let args = json!({"id": id}).as_object().unwrap().clone();
            let access = meshql_engine::Access::unrestricted();
            for n in 1..=150u64 {
                w.update(&id, json!({"name": "x", "n": n})).await;
                let got = w.read(&id, None).await;
                let seen = got.payload_map().unwrap()["n"].as_u64().unwrap();
                assert!(seen >= n, "read {seen} after acknowledging {n}");
                let rows = w
                    .service
                    .find(
                        &access,
                        &Search::new(&template, &args, None),
                        Some(w.service.read_snapshot()),
                    )
                    .await
                    .unwrap()
                    .rows;
                let row: serde_json::Value = serde_json::from_str(&rows[0].payload).unwrap();
                assert!(row["n"].as_u64().unwrap() >= n);
            }
        }));
    }
    // readers keep the cache full meanwhile
    for _ in 0..2 {
        let (w, ids) = (w.clone(), ids.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..600 {
                let id = &ids[round % ids.len()];
                w.service.read(&w.session, id, None).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(w.cache.counts().hits > 0);
}

async fn futures_ids(w: &World, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(
            w.service
                .create(&w.session, json!({"name": format!("d{i}"), "n": 0}))
                .await
                .unwrap()
                .id,
        );
    }
    ids
}

#[tokio::test]
async fn the_in_process_cache_stays_within_its_bytes() {
    let w = world_with(CacheSettings {
        max_bytes: 1 << 20,
        ..CacheSettings::default()
    });
    let big = "x".repeat(2000);
    for i in 0..2000 {
        let e = w
            .service
            .create(&w.session, json!({"name": format!("{i}"), "pad": big}))
            .await
            .unwrap();
        w.service.read(&w.session, &e.id, None).await.unwrap();
    }
    let bytes = w.cache.weighted_bytes();
    assert!(bytes <= 1 << 20, "{bytes} bytes held");
    assert!(bytes > 256 << 10, "{bytes}: the cache is used");
}

#[tokio::test]
async fn a_get_by_id_search_depends_on_its_document_only() {
    let w = world();
    let by_id = QueryTemplate::filter(r#"{"id": "{{id}}"}"#).unwrap();
    let access = meshql_engine::Access::unrestricted();
    let a = w.create(json!({"name": "a1"})).await;
    let args = json!({"id": a.id}).as_object().unwrap().clone();
    let find = || async {
        let rows = w
            .service
            .find(&access, &Search::new(&by_id, &args, None), None)
            .await
            .unwrap()
            .rows;
        serde_json::from_str::<serde_json::Value>(&rows[0].payload).unwrap()["name"].clone()
    };
    assert_eq!(find().await, "a1");
    // writes to other documents leave it cached
    for i in 0..5 {
        w.service
            .create(&w.session, json!({"name": format!("other{i}")}))
            .await
            .unwrap();
        assert_eq!(find().await, "a1");
    }
    assert_eq!(w.behind.reads(), 1);
    w.update(&a.id, json!({"name": "a2"})).await;
    assert_eq!(find().await, "a2", "its own write is seen at once");
    // a batch by id (a relationship to parents) likewise
    let key = "id";
    let keys = vec![a.id.clone()];
    let batch = BatchSearch::new(&by_id, key, &keys);
    let reads = w.behind.reads();
    for _ in 0..3 {
        w.service.find_batch(&access, &batch, None).await.unwrap();
    }
    assert_eq!(w.behind.reads(), reads + 1);
    w.create(json!({"name": "unrelated"})).await;
    w.service.find_batch(&access, &batch, None).await.unwrap();
    assert_eq!(
        w.behind.reads(),
        reads + 1,
        "a write to another document leaves it"
    );
    w.update(&a.id, json!({"name": "a3"})).await;
    let rows = w
        .service
        .find_batch(&access, &batch, None)
        .await
        .unwrap()
        .rows;
    assert!(rows[0].1.payload.contains("a3"));
}

#[tokio::test]
async fn replaced_storage_retires_every_cached_answer() {
    let w = world();
    let a = w.create(json!({"name": "a"})).await;
    w.service.read(&w.session, &a.id, None).await.unwrap();
    w.service.list(&w.session, None).await.unwrap();
    w.service.read(&w.session, &a.id, None).await.unwrap();
    assert_eq!(w.behind.reads(), 2);
    w.service.storage_replaced().await;
    w.service.read(&w.session, &a.id, None).await.unwrap();
    w.service.list(&w.session, None).await.unwrap();
    assert_eq!(w.behind.reads(), 4, "both answered by storage again");
}

/// A shared tier kept in this process (the Redis client is tested against a real Redis in
/// meshql-cache-redis and through the binary): here only to restart it empty at a chosen step.
#[derive(Default)]
struct Shared {
    values: std::sync::Mutex<std::collections::HashMap<String, Vec<u8>>>,
    tags: std::sync::Mutex<std::collections::HashMap<String, meshql_engine::cache::TagState>>,
}

impl Shared {
    fn restart(&self) {
        self.values.lock().unwrap().clear();
        self.tags.lock().unwrap().clear();
    }
}

#[async_trait]
impl meshql_engine::SharedCache for Shared {
    fn kind(&self) -> &'static str {
        "test"
    }
    async fn get(
        &self,
        key: &str,
        tags: &[String],
    ) -> Result<
        (Vec<meshql_engine::cache::TagState>, Option<Vec<u8>>),
        meshql_engine::SharedCacheError,
    > {
        let t = self.tags.lock().unwrap();
        Ok((
            tags.iter()
                .map(|n| t.get(n).copied().unwrap_or_default())
                .collect(),
            self.values.lock().unwrap().get(key).cloned(),
        ))
    }
    async fn put(
        &self,
        key: &str,
        entry: Vec<u8>,
        _: Duration,
    ) -> Result<(), meshql_engine::SharedCacheError> {
        self.values.lock().unwrap().insert(key.to_owned(), entry);
        Ok(())
    }
    async fn advance(
        &self,
        tags: &[String],
        stamp: Millis,
    ) -> Result<(), meshql_engine::SharedCacheError> {
        let mut t = self.tags.lock().unwrap();
        for n in tags {
            let s = t.entry(n.clone()).or_default();
            s.generation += 1;
            s.changed_at = s.changed_at.max(stamp);
            s.advanced_at = s.advanced_at.max(now_millis());
        }
        Ok(())
    }
}

#[tokio::test]
async fn an_answer_stored_across_a_shared_cache_restart_is_never_served() {
    let store: DynStore = Arc::new(MemoryStore::new());
    let behind = Behind::new(store.clone());
    let shared = Arc::new(Shared::default());
    let cache = Cache::shared(CacheSettings::default(), ["hen".to_owned()], shared.clone());
    let service = Arc::new(
        EntityService::new("hen", store, None, vec![], Arc::new(NoAuth))
            .with_reader(behind.clone() as DynReader)
            .with_cache(cache.clone()),
    );
    let session = Session::unrestricted(Credentials::Unrestricted);
    let a = service
        .create(&session, json!({"name": "v1"}))
        .await
        .unwrap();
    // the first lookup finds a fresh shared cache and sets its epoch; the next ones fill and
    // hit (a shared cache is filled on a task of its own, after the answer)
    for _ in 0..3 {
        service.read(&session, &a.id, None).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(cache.counts().hits >= 1, "{:?}", cache.counts());
    // a write makes the next read miss; that read is held at storage after its lookup ...
    service
        .update(&session, &a.id, json!({"name": "v1b"}))
        .await
        .unwrap();
    let held = behind.gate.acquire_many(GATE).await.unwrap();
    let reader = {
        let (service, session, id) = (service.clone(), session.clone(), a.id.clone());
        tokio::spawn(async move { service.read(&session, &id, None).await })
    };
    let reads = behind.reads();
    while behind.reads() == reads {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // ... while the shared cache restarts empty; its answer lands in the fresh one (the fill
    // runs on a task of its own: wait until it has, or the rest proves nothing)
    shared.restart();
    drop(held);
    let held_answer = reader.await.unwrap().unwrap().unwrap();
    assert_eq!(name_of(&held_answer), "v1b");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while shared.values.lock().unwrap().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the held read's answer was never stored in the restarted cache: {:?}",
            cache.counts()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    {
        let values = shared.values.lock().unwrap();
        assert_eq!(
            values.len(),
            1,
            "only the held read filled the restarted cache"
        );
        let stored = String::from_utf8_lossy(values.values().next().unwrap()).into_owned();
        assert!(
            stored.contains("v1b"),
            "the stale fill is the held answer: {stored}"
        );
    }
    // writes bring the generations back to what that answer was stored under
    service
        .update(&session, &a.id, json!({"name": "v2"}))
        .await
        .unwrap();
    service
        .update(&session, &a.id, json!({"name": "v3"}))
        .await
        .unwrap();
    for _ in 0..3 {
        let got = service.read(&session, &a.id, None).await.unwrap().unwrap();
        assert_eq!(
            name_of(&got),
            "v3",
            "never an answer from before the restart"
        );
    }
}

#[tokio::test]
async fn a_shared_cache_that_rarely_hits_is_consulted_by_a_sample_of_reads_until_they_hit() {
    let shared = Arc::new(Shared::default());
    let w = world_on(Cache::shared(
        CacheSettings::default(),
        ["hen".to_owned()],
        shared,
    ));
    let (service, behind, cache, session) = (&w.service, &w.behind, &w.cache, &w.session);
    let mut ids = Vec::new();
    for i in 0..400 {
        let e = service
            .create(session, json!({"name": format!("h{i}")}))
            .await
            .unwrap();
        ids.push(e.id);
    }
    // every id read once: nothing ever hits, so after a window of misses most reads skip
    // the shared cache (and still answer, from storage)
    for (i, id) in ids.iter().enumerate() {
        let got = service.read(session, id, None).await.unwrap().unwrap();
        assert_eq!(name_of(&got), format!("h{i}"));
    }
    let c = cache.counts();
    assert_eq!(c.hits, 0, "{c:?}");
    assert_eq!(behind.reads(), 400, "every read answered by storage");
    assert!(c.misses >= 64 && c.misses < 100, "{c:?}");
    assert_eq!(c.misses + c.skipped + c.bypassed, 400, "{c:?}");
    // a write while reads skip the cache is seen at once
    service
        .update(session, &ids[7], json!({"name": "h7b"}))
        .await
        .unwrap();
    let got = service.read(session, &ids[7], None).await.unwrap().unwrap();
    assert_eq!(name_of(&got), "h7b");
    // a hot document: the sampled reads fill it and hit, and consulting resumes for all
    let mut consulting_again = None;
    for n in 0..8_000 {
        let before = cache.counts();
        service.read(session, &ids[0], None).await.unwrap();
        tokio::task::yield_now().await; // the shared fill runs on a task of its own
        if cache.counts().skipped == before.skipped && n > 100 {
            let since = consulting_again.get_or_insert(n);
            if n - *since >= 64 {
                break;
            }
        } else {
            consulting_again = None;
        }
    }
    let resumed = cache.counts();
    assert!(
        consulting_again.is_some(),
        "64 reads in a row consulted the cache: {resumed:?}"
    );
    for _ in 0..100 {
        service.read(session, &ids[0], None).await.unwrap();
    }
    let last = cache.counts();
    assert_eq!(last.hits - resumed.hits, 100, "{last:?}");
    assert_eq!(last.skipped, resumed.skipped);
}
