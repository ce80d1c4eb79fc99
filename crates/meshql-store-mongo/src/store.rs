//! [`MongoStore`]: one entity collection.

use async_trait::async_trait;
use futures::TryStreamExt;
use meshql_core::template::TemplateKind;
use meshql_core::{
    in_request_order, now_millis, ArgValue, BoundArgs, Envelope, FieldPath, KeyedRows, Millis,
    NewDocument, Placement, QueryTemplate, RemoveOutcome, Row, Store, StoreError, StoreStats,
    TokenFilter,
};
use mongodb::bson::{self, doc, oid::ObjectId, Bson, DateTime, Document};
use mongodb::options::{ClientOptions, IndexOptions};
use mongodb::{Client, Collection, IndexModel};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, Semaphore, SemaphorePermit};

/// How a [`MongoDatabase`] connects.
#[derive(Debug, Clone)]
pub struct MongoOptions {
    /// `mongodb://…` with any driver options (`replicaSet`, `readPreference`, `maxPoolSize`).
    pub uri: String,
    /// Database name.
    pub database: String,
    /// Operations in flight at once; the URI's `maxPoolSize` when `None`, else 16.
    pub pool_size: Option<usize>,
    /// How long an operation waits for a free connection before failing with 503.
    pub pool_wait: Duration,
}

impl MongoOptions {
    pub fn new(uri: impl Into<String>, database: impl Into<String>) -> Self {
        Self {
            uri: uri.into(),
            database: database.into(),
            pool_size: None,
            pool_wait: Duration::from_secs(5),
        }
    }
}

/// A MongoDB client and database.
///
/// The driver queues operations for a connection without a bound, so every operation first
/// takes one of `pool_size` permits (the driver's `maxPoolSize` is set to the same number),
/// waiting at most `pool_wait`: past that the request is answered 503 instead of queueing
/// for ever.
pub struct MongoDatabase {
    client: Client,
    db: mongodb::Database,
    permits: Semaphore,
    pool_wait: Duration,
}

impl std::fmt::Debug for MongoDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MongoDatabase")
    }
}

fn error(e: mongodb::error::Error) -> StoreError {
    use mongodb::error::ErrorKind;
    match *e.kind {
        ErrorKind::Io(_)
        | ErrorKind::ServerSelection { .. }
        | ErrorKind::ConnectionPoolCleared { .. }
        | ErrorKind::Shutdown => StoreError::Unavailable(format!("MongoDB unavailable: {e}")),
        _ => StoreError::Query(format!("MongoDB: {e}")),
    }
}

/// E11000: an insert hit a unique index.
fn is_duplicate_key(e: &mongodb::error::Error) -> bool {
    use mongodb::error::{ErrorKind, WriteFailure};
    match &*e.kind {
        ErrorKind::Write(WriteFailure::WriteError(w)) => w.code == 11000,
        ErrorKind::Command(c) => c.code == 11000,
        _ => false,
    }
}

impl MongoDatabase {
    /// Parses the URI (replicaSet, readPreference, maxPoolSize... are honoured) and builds
    /// the client; connections are made in the background.
    pub async fn connect(o: &MongoOptions) -> Result<Arc<Self>, StoreError> {
        let mut options = ClientOptions::parse(&o.uri)
            .await
            .map_err(|e| StoreError::Invalid(format!("bad MongoDB URI: {e}")))?;
        let pool_size = o
            .pool_size
            .or(options.max_pool_size.map(|n| n as usize))
            .unwrap_or(16)
            .max(1);
        options.max_pool_size = Some(pool_size as u32);
        if options.server_selection_timeout.is_none() {
            options.server_selection_timeout = Some(Duration::from_secs(5));
        }
        if options.app_name.is_none() {
            options.app_name = Some("meshql".into());
        }
        let client = Client::with_options(options).map_err(error)?;
        let db = client.database(&o.database);
        Ok(Arc::new(Self {
            client,
            db,
            permits: Semaphore::new(pool_size),
            pool_wait: o.pool_wait,
        }))
    }

    /// A permit to run one operation: waits at most `pool_wait` for one to be free.
    async fn checkout(&self) -> Result<SemaphorePermit<'_>, StoreError> {
        match tokio::time::timeout(self.pool_wait, self.permits.acquire()).await {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(_)) => Err(StoreError::Unavailable(
                "the MongoDB client is closed".into(),
            )),
            Err(_) => Err(StoreError::Unavailable(
                "no MongoDB connection became free in time (pool exhausted)".into(),
            )),
        }
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        let _permit = self.checkout().await?;
        self.db
            .run_command(doc! {"ping": 1})
            .await
            .map(|_| ())
            .map_err(error)
    }

    pub async fn close(&self) {
        self.permits.close();
        self.client.clone().shutdown().await;
    }
}

/// One entity's collection.
pub struct MongoStore {
    db: Arc<MongoDatabase>,
    coll: Collection<Document>,
    locks: Vec<Mutex<()>>,
    reads: AtomicU64,
    writes: AtomicU64,
    commits: AtomicU64,
}

fn json_to_bson(v: &serde_json::Value) -> Bson {
    bson::to_bson(v).unwrap_or(Bson::Null)
}

fn payload_doc(text: &str) -> Result<Document, StoreError> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| StoreError::Invalid(e.to_string()))?;
    match json_to_bson(&v) {
        Bson::Document(d) => Ok(d),
        _ => Err(StoreError::Invalid("payload must be an object".into())),
    }
}

fn payload_text(d: &Document) -> Result<String, StoreError> {
    let payload = d
        .get_document("payload")
        .map_err(|e| StoreError::Corrupt(format!("payload: {e}")))?;
    let v: serde_json::Value = Bson::Document(payload.clone()).into_relaxed_extjson();
    Ok(v.to_string())
}

fn envelope(d: &Document) -> Result<Envelope, StoreError> {
    Ok(Envelope {
        id: d.get_str("id").unwrap_or_default().to_owned(),
        payload: payload_text(d)?,
        created_at: d
            .get_datetime("created_at")
            .map(|t| t.timestamp_millis())
            .unwrap_or_default(),
        deleted: d.get_bool("deleted").unwrap_or(false),
        authorized_tokens: d
            .get_array("authorized_tokens")
            .map(|a| {
                a.iter()
                    .filter_map(|t| t.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default(),
    })
}

fn path_key(path: &FieldPath) -> String {
    match path {
        FieldPath::Id => "id".into(),
        FieldPath::Payload(s) => format!("payload.{}", s.join(".")),
    }
}

fn token_filter(filter: &TokenFilter) -> Option<Document> {
    match filter {
        TokenFilter::All => None,
        TokenFilter::AnyOf(t) => Some(doc! {"$or": [
            {"authorized_tokens": {"$size": 0}},
            {"authorized_tokens": {"$in": t.clone()}},
        ]}),
    }
}

/// The filter of a template with its arguments bound (`prefix` addresses the fields,
/// e.g. `doc.` after a `$group`).
fn template_filter(
    template: &QueryTemplate,
    args: &BoundArgs,
    prefix: &str,
) -> Result<Document, StoreError> {
    let TemplateKind::Filter(preds) = &template.kind else {
        return Err(StoreError::Invalid(format!(
            "SQL fragment `{}` needs a SQL backend; MongoDB takes JSON templates",
            template.source
        )));
    };
    let mut d = Document::new();
    for (path, value) in preds {
        let v = value.bind(args);
        // a missing argument matches nothing
        let v = if v.is_null() {
            Bson::Document(doc! {"$in": []})
        } else {
            json_to_bson(&v)
        };
        d.insert(format!("{prefix}{}", path_key(path)), v);
    }
    Ok(d)
}

/// Evaluates a filter built by [`template_filter`] (equalities and `$in`) on a version.
fn matches_doc(version: &Document, filter: &Document) -> bool {
    filter.iter().all(|(key, expected)| {
        let mut cur: Option<&Bson> = None;
        for (i, seg) in key.split('.').enumerate() {
            cur = if i == 0 {
                version.get(seg)
            } else {
                cur.and_then(Bson::as_document).and_then(|d| d.get(seg))
            };
        }
        match (expected, cur) {
            (Bson::Document(op), Some(actual)) if op.contains_key("$in") => op
                .get_array("$in")
                .map(|vals| vals.iter().any(|v| v == actual))
                .unwrap_or(false),
            (Bson::Document(op), None) if op.contains_key("$in") => false,
            (e, Some(actual)) => e == actual,
            (_, None) => false,
        }
    })
}

/// Versions sorted by `seq` where one id may (after a failed or concurrent write, until its
/// flag is cleared) have several flagged `latest`: its versions share a `seq`, so they are
/// adjacent; keeps the newest of each run.
fn newest_per_seq(docs: Vec<Document>) -> Vec<Document> {
    let created = |d: &Document| d.get_datetime("created_at").ok().copied();
    let mut out: Vec<Document> = Vec::with_capacity(docs.len());
    for d in docs {
        match out.last_mut() {
            Some(prev) if prev.get_object_id("seq").ok() == d.get_object_id("seq").ok() => {
                if created(&d) > created(prev) {
                    *prev = d;
                }
            }
            _ => out.push(d),
        }
    }
    out
}

/// `e` unless it is a tombstone or hidden from the caller's tokens.
fn visible(e: Envelope, filter: &TokenFilter) -> Option<Envelope> {
    (!e.deleted && meshql_core::auth::is_visible(filter, &e.authorized_tokens)).then_some(e)
}

/// See [`MongoStore::supersede`].
async fn settle_latest(
    coll: &Collection<Document>,
    id: &str,
    oid: ObjectId,
    stamp: Millis,
) -> Result<(), mongodb::error::Error> {
    coll.update_many(
        doc! {
            "id": id,
            "latest": true,
            "_id": {"$ne": oid},
            "created_at": {"$lt": DateTime::from_millis(stamp)},
        },
        doc! {"$set": {"latest": false}},
    )
    .await?;
    let newer = coll
        .find_one(doc! {"id": id, "created_at": {"$gt": DateTime::from_millis(stamp)}})
        .projection(doc! {"_id": 1})
        .await?;
    if newer.is_some() {
        coll.update_one(doc! {"_id": oid}, doc! {"$set": {"latest": false}})
            .await?;
    }
    Ok(())
}

struct Current {
    payload: Document,
    created_at: Millis,
    deleted: bool,
    tokens: Vec<String>,
    seq: ObjectId,
}

impl MongoStore {
    pub fn new(db: Arc<MongoDatabase>, collection: &str) -> Self {
        Self {
            coll: db.db.collection(collection),
            db,
            locks: (0..64).map(|_| Mutex::new(())).collect(),
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            commits: AtomicU64::new(0),
        }
    }

    fn lock_for(&self, id: &str) -> &Mutex<()> {
        let h = id.bytes().fold(0xcbf29ce484222325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100000001b3)
        });
        &self.locks[(h % self.locks.len() as u64) as usize]
    }

    async fn current(&self, id: &str) -> Result<Option<Current>, StoreError> {
        let d = self
            .coll
            .find_one(doc! {"id": id, "latest": true})
            .sort(doc! {"created_at": -1})
            .await
            .map_err(error)?;
        Ok(d.map(|d| Current {
            payload: d.get_document("payload").cloned().unwrap_or_default(),
            created_at: d
                .get_datetime("created_at")
                .map(|t| t.timestamp_millis())
                .unwrap_or_default(),
            deleted: d.get_bool("deleted").unwrap_or(false),
            tokens: d
                .get_array("authorized_tokens")
                .map(|a| {
                    a.iter()
                        .filter_map(|t| t.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default(),
            seq: d.get_object_id("seq").unwrap_or_default(),
        }))
    }

    /// Appends a version (the caller holds the id's lock unless the id is fresh).
    async fn append(
        &self,
        id: &str,
        payload: Document,
        created_at: Option<Millis>,
        deleted: bool,
        tokens: &[String],
        fresh_id: bool,
    ) -> Result<Envelope, StoreError> {
        let current = if fresh_id {
            None
        } else {
            self.current(id).await?
        };
        let cur_time = current.as_ref().map(|c| c.created_at);
        let mut place = Placement::new(created_at, cur_time, now_millis());
        if place.check_collisions {
            let mut stamp = place.stamp;
            while self
                .coll
                .find_one(doc! {"id": id, "created_at": DateTime::from_millis(stamp)})
                .await
                .map_err(error)?
                .is_some()
            {
                stamp += 1;
            }
            place = place.settle(stamp, cur_time);
        }
        let (mut stamp, is_latest) = (place.stamp, place.latest);
        let oid = ObjectId::new();
        let seq = current.as_ref().map(|c| c.seq).unwrap_or(oid);
        let text = Bson::Document(payload.clone())
            .into_relaxed_extjson()
            .to_string();
        let mut version = doc! {
            "_id": oid,
            "id": id,
            "payload": payload,
            "created_at": DateTime::from_millis(stamp),
            "deleted": deleted,
            "authorized_tokens": tokens.to_vec(),
            "latest": is_latest,
            "seq": seq,
        };
        // The insert is the commit point. Another process may have taken this millisecond
        // for the same id (unique {id, created_at}): a server-stamped version moves on.
        let mut attempts = 0;
        loop {
            match self.coll.insert_one(&version).await {
                Ok(_) => break,
                Err(e) if is_duplicate_key(&e) && created_at.is_none() && attempts < 8 => {
                    attempts += 1;
                    stamp += 1;
                    version.insert("created_at", DateTime::from_millis(stamp));
                }
                Err(e) => return Err(error(e)),
            }
        }
        // A server-generated id has no other version to supersede.
        if is_latest && !fresh_id {
            self.supersede(id, oid, stamp).await;
        }
        Ok(Envelope {
            id: id.to_owned(),
            payload: text,
            created_at: stamp,
            deleted,
            authorized_tokens: tokens.to_vec(),
        })
    }

    /// Leaves the version `oid` (stamped `stamp`) flagged `latest` only if it is the newest
    /// of `id`: clears the flag of every older version (one statement, so a stale flag left
    /// by an earlier failure goes too), then, should a newer version exist (another process
    /// inserted one while this write's stamp was being chosen), clears its own. Each step is
    /// a single-document-atomic operation, and whichever of two concurrent writers inserts
    /// last sees the other's version, so they end with exactly the newer one flagged.
    ///
    /// The new version is already stored, so a failure here does not fail the write: readers
    /// keep the newest of several flagged versions, and the flags are fixed in the background.
    async fn supersede(&self, id: &str, oid: ObjectId, stamp: Millis) {
        if let Err(e) = settle_latest(&self.coll, id, oid, stamp).await {
            tracing::warn!(id, error = %e, "MongoDB: version stored, settling the `latest` flags failed; retrying in the background");
            let (coll, id) = (self.coll.clone(), id.to_owned());
            tokio::spawn(async move {
                for _ in 0..600 {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    if settle_latest(&coll, &id, oid, stamp).await.is_ok() {
                        return;
                    }
                }
                tracing::error!(id, "MongoDB: gave up settling `latest` flags after 10 minutes; the next write of the id settles them");
            });
        }
    }

    async fn remove_one(
        &self,
        id: &str,
        filter: &TokenFilter,
    ) -> Result<RemoveOutcome, StoreError> {
        let _guard = self.lock_for(id).lock().await;
        match self.current(id).await? {
            None => Ok(RemoveOutcome::NotFound),
            Some(cur) if !meshql_core::auth::is_visible(filter, &cur.tokens) => {
                Ok(RemoveOutcome::NotFound)
            }
            Some(cur) if cur.deleted => Ok(RemoveOutcome::AlreadyDeleted),
            Some(cur) => {
                self.append(id, cur.payload, None, true, &cur.tokens, false)
                    .await?;
                self.writes.fetch_add(1, Ordering::Relaxed);
                self.commits.fetch_add(1, Ordering::Relaxed);
                Ok(RemoveOutcome::Removed)
            }
        }
    }

    async fn find_rows(
        &self,
        template: &QueryTemplate,
        args: &BoundArgs,
        filter: &TokenFilter,
        at: Option<Millis>,
        limit: Option<usize>,
    ) -> Result<Vec<Row>, StoreError> {
        let matching = template_filter(template, args, "")?;
        self.visible_docs(matching, filter, at, limit)
            .await?
            .iter()
            .map(|d| {
                Ok(Row {
                    id: d.get_str("id").unwrap_or_default().to_owned(),
                    payload: payload_text(d)?,
                })
            })
            .collect()
    }

    /// Visible versions matching `filter` (a Document over the version's fields), at `at`.
    async fn visible_docs(
        &self,
        matching: Document,
        tokens: &TokenFilter,
        at: Option<Millis>,
        limit: Option<usize>,
    ) -> Result<Vec<Document>, StoreError> {
        let tokens_filter = tokens;
        self.reads.fetch_add(1, Ordering::Relaxed);
        match at {
            None => {
                let mut f = doc! {"latest": true, "deleted": false};
                f.extend(matching);
                if let Some(t) = token_filter(tokens) {
                    f.extend(t);
                }
                let mut find = self.coll.find(f).sort(doc! {"seq": 1});
                if let Some(l) = limit {
                    find = find.limit(l as i64);
                }
                let docs: Vec<Document> = find
                    .await
                    .map_err(error)?
                    .try_collect()
                    .await
                    .map_err(error)?;
                Ok(newest_per_seq(docs))
            }
            Some(at) => {
                // Portable "latest ≤ at, then filter" without $group/$first (FerretDB lacks
                // them): ids with some matching version ≤ at, then their newest version
                // ≤ at, checked in process.
                let before = DateTime::from_millis(at);
                let mut f = doc! {"created_at": {"$lte": before}};
                f.extend(matching.clone());
                let candidates: Vec<Document> = self
                    .coll
                    .find(f)
                    .projection(doc! {"id": 1})
                    .await
                    .map_err(error)?
                    .try_collect()
                    .await
                    .map_err(error)?;
                let mut ids: Vec<String> = candidates
                    .iter()
                    .filter_map(|d| d.get_str("id").ok().map(str::to_owned))
                    .collect();
                ids.sort();
                ids.dedup();
                if ids.is_empty() {
                    return Ok(Vec::new());
                }
                let versions: Vec<Document> = self
                    .coll
                    .find(doc! {"id": {"$in": ids}, "created_at": {"$lte": before}})
                    .sort(doc! {"id": 1, "created_at": -1})
                    .await
                    .map_err(error)?
                    .try_collect()
                    .await
                    .map_err(error)?;
                let mut newest: Vec<Document> = Vec::new();
                let mut last_id: Option<String> = None;
                for v in versions {
                    let id = v.get_str("id").unwrap_or_default().to_owned();
                    if last_id.as_deref() == Some(id.as_str()) {
                        continue;
                    }
                    last_id = Some(id);
                    let tokens: Vec<String> = v
                        .get_array("authorized_tokens")
                        .map(|a| {
                            a.iter()
                                .filter_map(|t| t.as_str().map(str::to_owned))
                                .collect()
                        })
                        .unwrap_or_default();
                    if !v.get_bool("deleted").unwrap_or(false)
                        && meshql_core::auth::is_visible(tokens_filter, &tokens)
                        && matches_doc(&v, &matching)
                    {
                        newest.push(v);
                    }
                }
                newest.sort_by_key(|d| d.get_object_id("seq").unwrap_or_default());
                if let Some(l) = limit {
                    newest.truncate(l);
                }
                Ok(newest)
            }
        }
    }
}

#[async_trait]
impl Store for MongoStore {
    async fn prepare(&self, templates: &[QueryTemplate]) -> Result<(), StoreError> {
        let _permit = self.db.checkout().await?;
        let mut indexes = vec![
            IndexModel::builder()
                .keys(doc! {"id": 1, "created_at": -1})
                .options(IndexOptions::builder().unique(true).build())
                .build(),
            IndexModel::builder()
                .keys(doc! {"latest": 1, "deleted": 1, "seq": 1})
                .build(),
        ];
        let mut fields = std::collections::BTreeSet::new();
        for t in templates {
            if let TemplateKind::Sql(_) = t.kind {
                return Err(StoreError::Invalid(format!(
                    "SQL fragment `{}` needs a SQL backend; MongoDB takes JSON templates",
                    t.source
                )));
            }
            fields.extend(t.filtered_paths().iter().map(path_key));
        }
        for field in fields {
            indexes.push(IndexModel::builder().keys(doc! {field: 1}).build());
        }
        // Only the missing ones: a restart finds them in place (and FerretDB v1 drops the
        // connection on a createIndexes naming indexes that already exist).
        let existing: Vec<Document> = match self.coll.list_indexes().await {
            Ok(cursor) => cursor
                .map_ok(|m| m.keys)
                .try_collect()
                .await
                .map_err(error)?,
            // a collection that does not exist yet has no indexes
            Err(e) if matches!(&*e.kind, mongodb::error::ErrorKind::Command(c) if c.code == 26) => {
                Vec::new()
            }
            Err(e) => return Err(error(e)),
        };
        indexes.retain(|i| !existing.contains(&i.keys));
        if !indexes.is_empty() {
            self.coll.create_indexes(indexes).await.map_err(error)?;
        }
        Ok(())
    }

    async fn create(
        &self,
        mut doc: NewDocument,
        tokens: &[String],
    ) -> Result<Envelope, StoreError> {
        let _permit = self.db.checkout().await?;
        let fresh_id = doc.id.is_none();
        let id = doc.resolve_id();
        let created_at = doc.created_at;
        let payload = payload_doc(&doc.into_payload_text(&id))?;
        let _guard = if fresh_id {
            None
        } else {
            Some(self.lock_for(&id).lock().await)
        };
        let env = self
            .append(&id, payload, created_at, false, tokens, fresh_id)
            .await?;
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.commits.fetch_add(1, Ordering::Relaxed);
        Ok(env)
    }

    async fn create_many(
        &self,
        docs: Vec<NewDocument>,
        tokens: &[String],
    ) -> Result<Vec<Envelope>, StoreError> {
        let _permit = self.db.checkout().await?;
        // no transactions without a replica set: validate everything first, then write
        let mut prepared = Vec::with_capacity(docs.len());
        for mut d in docs {
            let fresh = d.id.is_none();
            let id = d.resolve_id();
            let at = d.created_at;
            prepared.push((
                id.clone(),
                payload_doc(&d.into_payload_text(&id))?,
                at,
                fresh,
            ));
        }
        let mut out = Vec::with_capacity(prepared.len());
        for (id, payload, at, fresh) in prepared {
            let _guard = if fresh {
                None
            } else {
                Some(self.lock_for(&id).lock().await)
            };
            out.push(self.append(&id, payload, at, false, tokens, fresh).await?);
        }
        self.writes.fetch_add(out.len() as u64, Ordering::Relaxed);
        self.commits.fetch_add(1, Ordering::Relaxed);
        Ok(out)
    }

    async fn update(
        &self,
        id: &str,
        doc: NewDocument,
        tokens: Option<&[String]>,
        filter: &TokenFilter,
    ) -> Result<Option<Envelope>, StoreError> {
        let _permit = self.db.checkout().await?;
        let created_at = doc.created_at;
        let payload = payload_doc(&doc.into_payload_text(id))?;
        let _guard = self.lock_for(id).lock().await;
        let Some(cur) = self.current(id).await? else {
            return Ok(None);
        };
        if cur.deleted || !meshql_core::auth::is_visible(filter, &cur.tokens) {
            return Ok(None);
        }
        let tokens = tokens.map(<[String]>::to_vec).unwrap_or(cur.tokens);
        let env = self
            .append(id, payload, created_at, false, &tokens, false)
            .await?;
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.commits.fetch_add(1, Ordering::Relaxed);
        Ok(Some(env))
    }

    async fn read(
        &self,
        id: &str,
        filter: &TokenFilter,
        at: Option<Millis>,
    ) -> Result<Option<Envelope>, StoreError> {
        let _permit = self.db.checkout().await?;
        self.reads.fetch_add(1, Ordering::Relaxed);
        let f = match at {
            None => doc! {"id": id, "latest": true},
            Some(at) => doc! {"id": id, "created_at": {"$lte": DateTime::from_millis(at)}},
        };
        let d = self
            .coll
            .find_one(f)
            .sort(doc! {"created_at": -1})
            .await
            .map_err(error)?;
        let Some(d) = d else { return Ok(None) };
        let e = envelope(&d)?;
        Ok(visible(e, filter))
    }

    async fn read_many(
        &self,
        ids: &[String],
        filter: &TokenFilter,
        at: Option<Millis>,
    ) -> Result<Vec<Envelope>, StoreError> {
        let _permit = self.db.checkout().await?;
        self.reads.fetch_add(1, Ordering::Relaxed);
        // one query: each id's candidate versions, newest first, then the first per id
        let f = match at {
            None => doc! {"id": {"$in": ids}, "latest": true},
            Some(at) => {
                doc! {"id": {"$in": ids}, "created_at": {"$lte": DateTime::from_millis(at)}}
            }
        };
        let docs: Vec<Document> = self
            .coll
            .find(f)
            .sort(doc! {"id": 1, "created_at": -1})
            .await
            .map_err(error)?
            .try_collect()
            .await
            .map_err(error)?;
        // newest first within each id: keep the first of each
        let mut found: Vec<Envelope> = Vec::with_capacity(ids.len());
        for d in &docs {
            if found.last().map(|e| e.id.as_str()) != d.get_str("id").ok() {
                found.push(envelope(d)?);
            }
        }
        Ok(in_request_order(ids, found, filter))
    }

    async fn list(
        &self,
        filter: &TokenFilter,
        at: Option<Millis>,
    ) -> Result<Vec<Envelope>, StoreError> {
        let _permit = self.db.checkout().await?;
        self.visible_docs(Document::new(), filter, at, None)
            .await?
            .iter()
            .map(envelope)
            .collect()
    }

    async fn remove(&self, id: &str, filter: &TokenFilter) -> Result<RemoveOutcome, StoreError> {
        let _permit = self.db.checkout().await?;
        self.remove_one(id, filter).await
    }

    async fn remove_many(
        &self,
        ids: &[String],
        filter: &TokenFilter,
    ) -> Result<Vec<(String, RemoveOutcome)>, StoreError> {
        let _permit = self.db.checkout().await?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            out.push((id.clone(), self.remove_one(id, filter).await?));
        }
        Ok(out)
    }

    async fn versions(&self, id: &str) -> Result<Vec<Envelope>, StoreError> {
        let _permit = self.db.checkout().await?;
        self.reads.fetch_add(1, Ordering::Relaxed);
        let docs: Vec<Document> = self
            .coll
            .find(doc! {"id": id})
            .sort(doc! {"created_at": 1})
            .await
            .map_err(error)?
            .try_collect()
            .await
            .map_err(error)?;
        docs.iter().map(envelope).collect()
    }

    async fn find(
        &self,
        template: &QueryTemplate,
        args: &BoundArgs,
        filter: &TokenFilter,
        at: Option<Millis>,
        limit: Option<usize>,
    ) -> Result<Vec<Row>, StoreError> {
        let _permit = self.db.checkout().await?;
        self.find_rows(template, args, filter, at, limit).await
    }

    async fn find_batch(
        &self,
        template: &QueryTemplate,
        key_arg: &str,
        keys: &[String],
        filter: &TokenFilter,
        at: Option<Millis>,
    ) -> Result<KeyedRows, StoreError> {
        let _permit = self.db.checkout().await?;
        let TemplateKind::Filter(preds) = &template.kind else {
            return Err(StoreError::Invalid(format!(
                "SQL fragment `{}` needs a SQL backend",
                template.source
            )));
        };
        // the predicate the key binds to: one `$in` query for all keys
        let key_path = preds.iter().find_map(|(path, v)| match v {
            ArgValue::Arg(name) if name == key_arg => Some(path.clone()),
            _ => None,
        });
        let Some(key_path) = key_path else {
            // the key is not a whole predicate value: one query per key
            let mut out = Vec::new();
            for k in keys {
                let mut args = BoundArgs::new();
                args.insert(key_arg.to_owned(), serde_json::Value::String(k.clone()));
                for row in self.find_rows(template, &args, filter, at, None).await? {
                    out.push((k.clone(), row));
                }
            }
            return Ok(out);
        };
        let mut matching = template_filter(template, &BoundArgs::new(), "")?;
        matching.insert(path_key(&key_path), doc! {"$in": keys.to_vec()});
        let docs = self.visible_docs(matching, filter, at, None).await?;
        let mut out = Vec::with_capacity(docs.len());
        for d in &docs {
            let id = d.get_str("id").unwrap_or_default().to_owned();
            let payload = payload_text(d)?;
            let key = match &key_path {
                FieldPath::Id => Some(id.clone()),
                FieldPath::Payload(_) => {
                    let map: serde_json::Map<String, serde_json::Value> =
                        serde_json::from_str(&payload).unwrap_or_default();
                    key_path.lookup(&id, &map).and_then(|v| match v {
                        serde_json::Value::String(s) => Some(s),
                        serde_json::Value::Null => None,
                        other => Some(other.to_string()),
                    })
                }
            };
            if let Some(key) = key {
                out.push((key, Row { id, payload }));
            }
        }
        Ok(out)
    }

    async fn ready(&self) -> Result<(), StoreError> {
        self.db.ping().await
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            reads: self.reads.load(Ordering::Relaxed),
            commits: self.commits.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
        }
    }

    async fn shutdown(&self) {
        self.db.close().await;
    }
}
