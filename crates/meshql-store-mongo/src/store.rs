//! [`MongoStore`]: one entity collection.

use crate::error::{error, is_duplicate_key};
use crate::feed::{Feed, Hold, CLOCK_COLLECTION, DEFAULT_FEED_GRACE};
use async_trait::async_trait;
use futures::TryStreamExt;
use meshql_core::template::{CmpOp, Cond, TemplateKind};
use meshql_core::{
    in_request_order, now_millis, ArgValue, BoundArgs, ChangeOp, CommitSignal, Cursor, Envelope,
    FieldPath, KeyedRows, Millis, NewDocument, Placement, QueryTemplate, RemoveOutcome, Row, Store,
    StoreChange, StoreError, StoreStats, TokenFilter, WriteContext,
};
use meshql_core::{BatchSearch, ChangeFeed, ReadContext, Search, StoreReader, StoreWriter};
use mongodb::bson::{self, doc, oid::ObjectId, Bson, DateTime, Document};
use mongodb::options::{ClientOptions, IndexOptions, ReadPreference, SelectionCriteria};
use mongodb::{Client, Collection, IndexModel};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, OwnedMutexGuard, OwnedSemaphorePermit, Semaphore, SemaphorePermit};

/// How a [`MongoDatabase`] connects.
#[derive(Debug, Clone)]
pub struct MongoOptions {
    /// `mongodb://…` with any driver options (`replicaSet`, `readPreference`, `maxPoolSize`).
    pub uri: String,
    /// A second client for the API's reads (a replica set's secondaries, say), the same
    /// database name through it; reads use `uri` when absent. Without a `readPreference` of
    /// its own it reads with `secondaryPreferred` (see [`MongoDatabase::connect`]).
    pub read_url: Option<String>,
    /// Database name.
    pub database: String,
    /// Operations in flight at once; the URI's `maxPoolSize` when `None`, else 16.
    pub pool_size: Option<usize>,
    /// How long an operation waits for a free connection before failing with 503.
    pub pool_wait: Duration,
    /// How long a change-feed reader waits for a position another process drew before
    /// skipping it (see [`crate::feed`]).
    pub feed_grace: Duration,
    /// Bounds on the `read_url` client's servers (see `replica.rs`).
    pub replica: meshql_core::replica::ReplicaSettings,
}

impl MongoOptions {
    pub fn new(uri: impl Into<String>, database: impl Into<String>) -> Self {
        Self {
            uri: uri.into(),
            database: database.into(),
            read_url: None,
            pool_size: None,
            pool_wait: Duration::from_secs(5),
            feed_grace: DEFAULT_FEED_GRACE,
            replica: Default::default(),
        }
    }
}

/// A MongoDB client and database.
///
/// The driver queues operations for a connection without a bound, so every operation first
/// takes one of `pool_size` permits (the driver's `maxPoolSize` is one more: the change feed's
/// reader takes no permit and has that connection to itself),
/// waiting at most `pool_wait`: past that the request is answered 503 instead of queueing
/// for ever.
///
/// With a `read_url`, the database holds a second one for the API's reads: a client of its
/// own with permits of its own (the same `pool_size` and `pool_wait`), whose collections are
/// the readers [`meshql_core::Database::replica`] hands out ([`MongoStore::replica`]). Stores
/// made by [`meshql_core::Database::store`] never read through it.
pub struct MongoDatabase {
    client: Client,
    db: mongodb::Database,
    permits: Arc<Semaphore>,
    /// The permits there are (`pool_size`).
    pool_size: usize,
    pool_wait: Duration,
    feed_grace: Duration,
    /// The client for the API's reads (`read_url`); it has no replica of its own.
    replica: Option<Arc<MongoDatabase>>,
    /// Bounds on `replica`.
    replica_settings: meshql_core::replica::ReplicaSettings,
}

impl std::fmt::Debug for MongoDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MongoDatabase")
    }
}

impl MongoDatabase {
    /// Parses the URI (replicaSet, readPreference, maxPoolSize... are honoured) and builds
    /// the client; connections are made in the background. With a `read_url`, builds its
    /// client too, the same way, except that a `read_url` without a `readPreference` reads
    /// with `secondaryPreferred` (a secondary when one is available, else the primary), not
    /// the driver's default `primary`, which would make the second client pointless on a
    /// replica set.
    pub async fn connect(o: &MongoOptions) -> Result<Arc<Self>, StoreError> {
        let mut primary = Self::client(&o.uri, o, false).await?;
        if let Some(url) = &o.read_url {
            primary.replica = Some(Arc::new(Self::client(url, o, true).await?));
        }
        Ok(Arc::new(primary))
    }

    /// One client, without a replica: the primary's, or (`for_reads`) the `read_url`'s.
    async fn client(uri: &str, o: &MongoOptions, for_reads: bool) -> Result<Self, StoreError> {
        let what = if for_reads { "read_url" } else { "URI" };
        let mut options = ClientOptions::parse(uri)
            .await
            .map_err(|e| StoreError::Invalid(format!("bad MongoDB {what}: {e}")))?;
        if for_reads && options.selection_criteria.is_none() {
            options.selection_criteria = Some(SelectionCriteria::ReadPreference(
                ReadPreference::SecondaryPreferred { options: None },
            ));
        }
        let pool_size = o
            .pool_size
            .or(options.max_pool_size.map(|n| n as usize))
            .unwrap_or(16)
            .max(1);
        // one connection more than request permits: the change feed's reader has its own,
        // so a service tailing its feed never takes a connection a request is waiting for
        options.max_pool_size = Some(pool_size as u32 + 1);
        if options.server_selection_timeout.is_none() {
            options.server_selection_timeout = Some(Duration::from_secs(5));
        }
        if options.app_name.is_none() {
            options.app_name = Some("meshql".into());
        }
        let client = Client::with_options(options).map_err(error)?;
        let db = client.database(&o.database);
        Ok(Self {
            client,
            db,
            permits: Arc::new(Semaphore::new(pool_size)),
            pool_size,
            pool_wait: o.pool_wait,
            feed_grace: o.feed_grace,
            replica: None,
            replica_settings: o.replica,
        })
    }

    /// Whether the API's reads have a client of their own (`read_url`).
    pub fn has_replica(&self) -> bool {
        self.replica.is_some()
    }

    /// Permits held by operations right now, the reader's (`read_url`) included.
    pub(crate) fn connections_in_use(&self) -> u64 {
        let held = |db: &MongoDatabase| db.pool_size.saturating_sub(db.permits.available_permits());
        let replica = self.replica.as_deref().map_or(0, held);
        (held(self) + replica) as u64
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

    /// A permit a write carries into its own task (see [`Writer`]).
    async fn checkout_owned(&self) -> Result<OwnedSemaphorePermit, StoreError> {
        match tokio::time::timeout(self.pool_wait, self.permits.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(_)) => Err(StoreError::Unavailable(
                "the MongoDB client is closed".into(),
            )),
            Err(_) => Err(StoreError::Unavailable(
                "no MongoDB connection became free in time (pool exhausted)".into(),
            )),
        }
    }

    /// Pings the primary's server. The `read_url`'s does not make the database unready:
    /// reads leave it while it is down (its probe, `replica.rs`, watches it).
    pub async fn ping(&self) -> Result<(), StoreError> {
        let _permit = self.checkout().await?;
        self.db
            .run_command(doc! {"ping": 1})
            .await
            .map(|_| ())
            .map_err(error)
    }

    /// Whether every permit is held, so that the next operation would wait for one (a look
    /// at the semaphore: no I/O).
    pub(crate) fn saturated(&self) -> bool {
        self.permits.available_permits() == 0
    }

    /// Pings a server this client reads from (by its read preference: a `read_url` client's
    /// `secondaryPreferred` picks a secondary where there is one, as its reads do), if a permit
    /// is free right now: `None`, without waiting, when every permit is held.
    pub(crate) async fn ping_reads_if_free(&self) -> Option<Result<(), StoreError>> {
        let _permit = match self.permits.try_acquire() {
            Ok(permit) => permit,
            Err(tokio::sync::TryAcquireError::NoPermits) => return None,
            Err(tokio::sync::TryAcquireError::Closed) => {
                return Some(Err(StoreError::Unavailable(
                    "the MongoDB client is closed".into(),
                )))
            }
        };
        let mut ping = self.db.run_command(doc! {"ping": 1});
        if let Some(criteria) = self.db.selection_criteria() {
            ping = ping.selection_criteria(criteria.clone());
        }
        Some(ping.await.map(|_| ()).map_err(error))
    }

    /// Shuts the client down, and the `read_url`'s when there is one.
    pub async fn close(&self) {
        self.close_own().await;
        if let Some(replica) = &self.replica {
            replica.close_own().await;
        }
    }

    async fn close_own(&self) {
        self.permits.close();
        self.client.clone().shutdown().await;
    }
}

/// One entity's collection.
pub struct MongoStore {
    db: Arc<MongoDatabase>,
    coll: Collection<Document>,
    w: Arc<Writer>,
    reads: AtomicU64,
    /// Queries of the change feed (not counted in `reads`, which count what requests cost).
    feed_reads: AtomicU64,
    /// Cursors of list pages read at a fixed time, kept for the page after (see
    /// [`Parked`]).
    parked: std::sync::Mutex<Vec<Parked>>,
}

/// The cursor of a [`StoreReader::list_page`] read at a fixed time, parked after a full
/// page so that the page after it (`after` = the page's last id, same time and tokens)
/// continues it instead of querying again. The continuation is what a new query would
/// return — versions at or before a past time do not change — so this only saves work; but
/// that work is large where the server cannot seek by id: FerretDB v1 pushes neither `$gt` on
/// strings nor sorts down to PostgreSQL, so there each new page query reads and sorts the
/// whole collection, and a streamed list of N documents would cost N² / page.
struct Parked {
    filter: TokenFilter,
    at: Millis,
    /// The last id returned: the `after` of the page that may continue this cursor.
    after: String,
    cursor: mongodb::Cursor<Document>,
    since: std::time::Instant,
}

/// Parked cursors kept at most (the oldest is dropped), and for at most how long.
const PARKED_MAX: usize = 32;
const PARKED_FOR: Duration = Duration::from_secs(30);

/// What writes share. Once a write holds the locks of its ids it runs in a task of its own
/// ([`detached`]) to the end: stored (and in the feed), or failed and undone, even should its
/// caller go away meanwhile (a cancelled request drops its future). Without that, an insert
/// already sent could land after the compensation meant to remove it.
struct Writer {
    coll: Collection<Document>,
    feed: Arc<Feed>,
    locks: Vec<Arc<Mutex<()>>>,
    signal: CommitSignal,
    writes: AtomicU64,
    commits: AtomicU64,
}

/// Runs a write in its own task, to the end whatever becomes of the caller (see [`Writer`]).
async fn detached<T: Send + 'static>(
    write: impl Future<Output = Result<T, StoreError>> + Send + 'static,
) -> Result<T, StoreError> {
    match tokio::spawn(write).await {
        Ok(result) => result,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(StoreError::Unavailable(
            "the write was cancelled: the runtime is shutting down".into(),
        )),
    }
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

pub(crate) fn envelope(d: &Document) -> Result<Envelope, StoreError> {
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
    let preds = match &template.kind {
        TemplateKind::Filter(preds) => preds,
        TemplateKind::Query(spec) => {
            // every condition in one `$and`: two operators on one field stay two conditions
            let conds: Vec<Bson> = spec
                .conds
                .iter()
                .map(|c| Bson::Document(cond_filter(c, args, prefix)))
                .collect();
            return Ok(if conds.is_empty() {
                Document::new()
            } else {
                doc! {"$and": conds}
            });
        }
        TemplateKind::Sql(_) => {
            return Err(StoreError::Invalid(format!(
                "SQL fragment `{}` needs a SQL backend; MongoDB takes JSON templates",
                template.source
            )))
        }
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

/// A filter that matches nothing.
fn nothing() -> Bson {
    Bson::Document(doc! {"$in": []})
}

/// One condition of an operator template as a MongoDB filter (semantics:
/// `meshql_core::template::Cond`; where Mongo's own differ — `$ne` of null, comparisons
/// with a value that is not a number or a string — the filter says what meshql means).
fn cond_filter(cond: &Cond, args: &BoundArgs, prefix: &str) -> Document {
    use serde_json::Value;
    let key = |path: &FieldPath| format!("{prefix}{}", path_key(path));
    match cond {
        Cond::Cmp { path, op, value } => {
            let v = value.bind(args);
            let test = match (op, &v) {
                (CmpOp::Eq, Value::Null) => nothing(),
                (CmpOp::Eq, v) => json_to_bson(v),
                (CmpOp::Ne, Value::Null) => return Document::new(),
                (CmpOp::Ne, v) => Bson::Document(doc! {"$ne": json_to_bson(v)}),
                (op, v @ (Value::Number(_) | Value::String(_))) => {
                    Bson::Document(doc! {op.mongo(): json_to_bson(v)})
                }
                _ => nothing(),
            };
            doc! {key(path): test}
        }
        Cond::In { path, list, negate } => {
            let items: Vec<Bson> = list.bind(args).iter().map(json_to_bson).collect();
            doc! {key(path): {if *negate { "$nin" } else { "$in" }: items}}
        }
        Cond::Regex {
            path,
            pattern,
            ignore_case,
        } => match pattern.bind(args) {
            Value::String(p) => doc! {key(path): {
                "$regex": p,
                "$options": if *ignore_case { "i" } else { "" },
            }},
            _ => doc! {key(path): nothing()},
        },
        Cond::Exists { path, exists } => match path {
            FieldPath::Id if *exists => Document::new(),
            _ => doc! {key(path): {"$exists": *exists}},
        },
        Cond::And(cs) | Cond::Or(cs) => {
            let parts: Vec<Bson> = cs
                .iter()
                .map(|c| Bson::Document(cond_filter(c, args, prefix)))
                .collect();
            doc! {if matches!(cond, Cond::And(_)) { "$and" } else { "$or" }: parts}
        }
    }
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

/// How the `at` path re-checks a version's newest state in process: the equality filter
/// document itself, or an operator template evaluated on the payload.
enum Matcher<'a> {
    Filter,
    Template(&'a QueryTemplate, &'a BoundArgs),
}

impl<'a> Matcher<'a> {
    fn of(template: &'a QueryTemplate, args: &'a BoundArgs) -> Self {
        match template.kind {
            TemplateKind::Query(_) => Matcher::Template(template, args),
            _ => Matcher::Filter,
        }
    }

    fn matches(&self, version: &Document, filter: &Document) -> bool {
        match self {
            Matcher::Filter => matches_doc(version, filter),
            Matcher::Template(t, args) => {
                let id = version.get_str("id").unwrap_or_default();
                let payload: serde_json::Map<String, serde_json::Value> = payload_text(version)
                    .ok()
                    .and_then(|p| serde_json::from_str(&p).ok())
                    .unwrap_or_default();
                t.matches(args, id, &payload)
            }
        }
    }
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

/// See [`Writer::supersede`].
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

/// A version about to be appended by a single write.
struct NewVersion<'a> {
    id: &'a str,
    payload: Document,
    created_at: Option<Millis>,
    deleted: bool,
    tokens: &'a [String],
    /// The id was generated for this write, so no earlier version can exist.
    fresh_id: bool,
    correlation_id: Option<&'a str>,
}

/// A document of a `create_many`, ready to be placed.
struct BatchItem {
    id: String,
    payload: Document,
    text: String,
    created_at: Option<Millis>,
    fresh_id: bool,
}

/// The versions of a `create_many`, placed: what to insert, what to answer, and the
/// `latest` flags to settle once every version is in.
struct PlannedBatch {
    versions: Vec<Document>,
    envelopes: Vec<Envelope>,
    oids: Vec<ObjectId>,
    settle: Vec<(String, ObjectId, Millis)>,
}

/// Why a batch insert failed.
enum BatchFailure {
    Mongo(mongodb::error::Error),
    Store(StoreError),
}

/// The stored text of a payload: what reads answer.
fn stored_text(payload: &Document) -> String {
    Bson::Document(payload.clone())
        .into_relaxed_extjson()
        .to_string()
}

/// The change a version is.
fn change_of(d: &Document, pos: u64) -> Result<StoreChange, StoreError> {
    let env = envelope(d)?;
    let first_version = match (d.get_object_id("_id"), d.get_object_id("seq")) {
        (Ok(oid), Ok(seq)) => oid == seq,
        _ => true,
    };
    Ok(StoreChange {
        cursor: Cursor::seq(pos),
        op: ChangeOp::of_version(env.deleted, first_version),
        id: env.id,
        created_at: env.created_at,
        payload: env.payload,
        authorized_tokens: env.authorized_tokens,
        correlation_id: d.get_str("correlation_id").ok().map(str::to_owned),
    })
}

impl MongoStore {
    pub fn new(db: Arc<MongoDatabase>, collection: &str) -> Self {
        let coll: Collection<Document> = db.db.collection(collection);
        let feed = Feed::new(
            coll.clone(),
            db.db.collection(CLOCK_COLLECTION),
            collection,
            db.feed_grace,
        );
        let w = Arc::new(Writer {
            coll: coll.clone(),
            feed,
            locks: (0..64).map(|_| Arc::new(Mutex::new(()))).collect(),
            signal: CommitSignal::default(),
            writes: AtomicU64::new(0),
            commits: AtomicU64::new(0),
        });
        Self {
            coll,
            db,
            w,
            reads: AtomicU64::new(0),
            feed_reads: AtomicU64::new(0),
            parked: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// The collection as the database's `read_url` client serves it, for reads only (what
    /// [`meshql_core::Database::replica`] hands out); `None` without a `read_url`. The store
    /// made by [`Self::new`] keeps reading through the primary's client, so a write, and
    /// every read it depends on, never sees a replica's stale version.
    pub fn replica(db: Arc<MongoDatabase>, collection: &str) -> Option<Self> {
        let replica = db.replica.clone()?;
        Some(Self::new(replica, collection))
    }

    /// The parked cursor continuing a page of `ctx` after `after`, if any; expired ones are
    /// dropped on the way.
    fn unpark(
        &self,
        after: Option<&str>,
        ctx: &ReadContext<'_>,
    ) -> Option<mongodb::Cursor<Document>> {
        let mut parked = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        parked.retain(|p| p.since.elapsed() < PARKED_FOR);
        let (after, at) = (after?, ctx.at?);
        let i = parked
            .iter()
            .position(|p| p.at == at && p.after == after && p.filter == *ctx.filter)?;
        Some(parked.swap_remove(i).cursor)
    }

    fn park(&self, cursor: mongodb::Cursor<Document>, after: String, ctx: &ReadContext<'_>) {
        let Some(at) = ctx.at else { return };
        let mut parked = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        if parked.len() >= PARKED_MAX {
            let oldest = (0..parked.len()).min_by_key(|&i| parked[i].since);
            if let Some(i) = oldest {
                parked.swap_remove(i);
            }
        }
        parked.push(Parked {
            filter: ctx.filter.clone(),
            at,
            after,
            cursor,
            since: std::time::Instant::now(),
        });
    }
}

impl Writer {
    fn stripe(&self, id: &str) -> usize {
        let h = id.bytes().fold(0xcbf29ce484222325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100000001b3)
        });
        (h % self.locks.len() as u64) as usize
    }

    async fn lock(&self, id: &str) -> OwnedMutexGuard<()> {
        self.locks[self.stripe(id)].clone().lock_owned().await
    }

    /// The locks of several ids, taken in one order (so that two batches cannot deadlock),
    /// each once (two ids may share a stripe).
    async fn lock_all<'a>(&self, ids: impl Iterator<Item = &'a str>) -> Vec<OwnedMutexGuard<()>> {
        let mut stripes: Vec<usize> = ids.map(|id| self.stripe(id)).collect();
        stripes.sort_unstable();
        stripes.dedup();
        let mut guards = Vec::with_capacity(stripes.len());
        for s in stripes {
            guards.push(self.locks[s].clone().lock_owned().await);
        }
        guards
    }

    /// Counts a committed write of `versions` versions and wakes the feed's tailers.
    fn committed(&self, versions: u64) {
        self.writes.fetch_add(versions, Ordering::Relaxed);
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.signal.notify();
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

    async fn version_at(&self, id: &str, stamp: Millis) -> Result<bool, StoreError> {
        Ok(self
            .coll
            .find_one(doc! {"id": id, "created_at": DateTime::from_millis(stamp)})
            .projection(doc! {"_id": 1})
            .await
            .map_err(error)?
            .is_some())
    }

    /// Appends a version (the caller holds the id's lock unless the id is fresh).
    async fn append(&self, v: NewVersion<'_>) -> Result<Envelope, StoreError> {
        let NewVersion {
            id,
            payload,
            created_at,
            deleted,
            tokens,
            fresh_id,
            correlation_id,
        } = v;
        let current = if fresh_id {
            None
        } else {
            self.current(id).await?
        };
        let cur_time = current.as_ref().map(|c| c.created_at);
        let mut place = Placement::new(created_at, cur_time, now_millis());
        if place.check_collisions {
            let mut stamp = place.stamp;
            while self.version_at(id, stamp).await? {
                stamp += 1;
            }
            place = place.settle(stamp, cur_time);
        }
        let (mut stamp, is_latest) = (place.stamp, place.latest);
        let oid = ObjectId::new();
        let seq = current.as_ref().map(|c| c.seq).unwrap_or(oid);
        let text = stored_text(&payload);
        // The version's place in the change feed, drawn before the insert (see `feed`).
        let mut hold = self.feed.draw(1).await?;
        let mut version = doc! {
            "_id": oid,
            "id": id,
            "payload": payload,
            "created_at": DateTime::from_millis(stamp),
            "deleted": deleted,
            "authorized_tokens": tokens.to_vec(),
            "latest": is_latest,
            "seq": seq,
            "pos": hold.first() as i64,
        };
        if let Some(c) = correlation_id {
            version.insert("correlation_id", c);
        }
        if let Err(e) = meshql_core::fault::check(&text) {
            hold.abandon(false).await;
            return Err(e);
        }
        hold.will_insert(vec![oid]);
        // The insert is the commit point. Another process may have taken this millisecond
        // for the same id (unique {id, created_at}): a server-stamped version moves on. Or,
        // on FerretDB, another client may have drawn the same position (unique `pos`): the
        // version draws again. FerretDB does not say which index refused the insert, so the
        // position is looked up.
        let mut attempts = 0;
        loop {
            let e = match self.coll.insert_one(&version).await {
                Ok(_) => break,
                Err(e) => e,
            };
            if is_duplicate_key(&e) && attempts < 8 {
                attempts += 1;
                let taken = match self.feed.taken_by_other(hold.first(), oid).await {
                    Ok(taken) => taken,
                    Err(lookup) => {
                        hold.abandon(false).await;
                        return Err(lookup);
                    }
                };
                if taken {
                    let fresh = match self.feed.draw(1).await {
                        Ok(fresh) => fresh,
                        Err(draw) => {
                            hold.taken();
                            return Err(draw);
                        }
                    };
                    std::mem::replace(&mut hold, fresh).taken();
                    hold.will_insert(vec![oid]);
                    version.insert("pos", hold.first() as i64);
                    continue;
                }
                if created_at.is_none() {
                    stamp += 1;
                    version.insert("created_at", DateTime::from_millis(stamp));
                    continue;
                }
            }
            // whether the server applied the insert is not always known (an I/O error, a
            // retried write): the version is deleted by its `_id` should it be there
            hold.abandon(true).await;
            return Err(error(e));
        }
        hold.stored();
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

    /// Places the versions of a batch: as consecutive single writes would, each seeing the
    /// ones before it (an id may come more than once). Only the newest version of an id in
    /// the batch is inserted flagged `latest`.
    async fn plan_batch(
        &self,
        items: &[BatchItem],
        tokens: &[String],
        correlation_id: Option<&str>,
    ) -> Result<PlannedBatch, StoreError> {
        struct Seen {
            newest: Option<Millis>,
            seq: Option<ObjectId>,
            stamps: HashSet<Millis>,
            latest: Option<usize>,
            fresh_id: bool,
        }
        let now = now_millis();
        let mut seen: HashMap<&str, Seen> = HashMap::new();
        let mut plan = PlannedBatch {
            versions: Vec::with_capacity(items.len()),
            envelopes: Vec::with_capacity(items.len()),
            oids: Vec::with_capacity(items.len()),
            settle: Vec::new(),
        };
        for (i, item) in items.iter().enumerate() {
            let id = item.id.as_str();
            if !seen.contains_key(id) {
                let current = if item.fresh_id {
                    None
                } else {
                    self.current(id).await?
                };
                seen.insert(
                    id,
                    Seen {
                        newest: current.as_ref().map(|c| c.created_at),
                        seq: current.map(|c| c.seq),
                        stamps: HashSet::new(),
                        latest: None,
                        fresh_id: item.fresh_id,
                    },
                );
            }
            let s = seen.get_mut(id).expect("inserted above");
            let mut place = Placement::new(item.created_at, s.newest, now);
            if place.check_collisions {
                let mut stamp = place.stamp;
                while s.stamps.contains(&stamp) || self.version_at(id, stamp).await? {
                    stamp += 1;
                }
                place = place.settle(stamp, s.newest);
            }
            let oid = ObjectId::new();
            let seq = *s.seq.get_or_insert(oid);
            s.stamps.insert(place.stamp);
            if place.latest {
                s.newest = Some(place.stamp);
                if let Some(earlier) = s.latest.replace(i) {
                    plan.versions[earlier].insert("latest", false);
                }
            }
            let mut version = doc! {
                "_id": oid,
                "id": id,
                "payload": item.payload.clone(),
                "created_at": DateTime::from_millis(place.stamp),
                "deleted": false,
                "authorized_tokens": tokens.to_vec(),
                "latest": place.latest,
                "seq": seq,
            };
            if let Some(c) = correlation_id {
                version.insert("correlation_id", c);
            }
            plan.versions.push(version);
            plan.oids.push(oid);
            plan.envelopes.push(Envelope {
                id: item.id.clone(),
                payload: item.text.clone(),
                created_at: place.stamp,
                deleted: false,
                authorized_tokens: tokens.to_vec(),
            });
        }
        // A server-generated id has no other version to supersede.
        for s in seen.values().filter(|s| !s.fresh_id) {
            if let Some(i) = s.latest {
                plan.settle.push((
                    items[i].id.clone(),
                    plan.oids[i],
                    plan.envelopes[i].created_at,
                ));
            }
        }
        Ok(plan)
    }

    /// Inserts a planned batch with one ordered `insert_many` under `hold`'s positions. With
    /// the fault marker on document `k` (test builds), the documents before it are inserted
    /// for real and the write then fails, as when the server refuses document `k` of an
    /// ordered insert: the caller's compensation runs on what was inserted.
    async fn insert_batch(
        &self,
        plan: &mut PlannedBatch,
        items: &[BatchItem],
        hold: &mut Hold,
    ) -> Result<(), BatchFailure> {
        let n = plan.versions.len() as u64;
        for (i, v) in plan.versions.iter_mut().enumerate() {
            v.insert("pos", (hold.first() + i as u64) as i64);
            if n > 1 {
                v.insert("batch", hold.first() as i64);
                v.insert("batch_n", n as i64);
            }
        }
        hold.will_insert(plan.oids.clone());
        let poisoned = items
            .iter()
            .enumerate()
            .find_map(|(k, item)| meshql_core::fault::check(&item.text).err().map(|e| (k, e)));
        let upto = poisoned.as_ref().map_or(plan.versions.len(), |(k, _)| *k);
        if upto > 0 {
            self.coll
                .insert_many(&plan.versions[..upto])
                .ordered(true)
                .await
                .map_err(BatchFailure::Mongo)?;
        }
        match poisoned {
            Some((_, e)) => Err(BatchFailure::Store(e)),
            None => Ok(()),
        }
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

    /// Removes `id` (the caller holds its lock).
    async fn remove_locked(
        &self,
        id: &str,
        ctx: &WriteContext,
    ) -> Result<RemoveOutcome, StoreError> {
        match self.current(id).await? {
            None => Ok(RemoveOutcome::NotFound),
            Some(cur) if !meshql_core::auth::is_visible(&ctx.filter, &cur.tokens) => {
                Ok(RemoveOutcome::NotFound)
            }
            Some(cur) if cur.deleted => Ok(RemoveOutcome::AlreadyDeleted),
            Some(cur) => {
                self.append(NewVersion {
                    id,
                    payload: cur.payload,
                    created_at: None,
                    deleted: true,
                    tokens: &cur.tokens,
                    fresh_id: false,
                    correlation_id: ctx.correlation_id.as_deref(),
                })
                .await?;
                self.committed(1);
                Ok(RemoveOutcome::Removed)
            }
        }
    }

    /// Appends a version of `id` if a current version visible to the writer exists (the
    /// caller holds the id's lock).
    async fn update_locked(
        &self,
        id: &str,
        payload: Document,
        created_at: Option<Millis>,
        ctx: &WriteContext,
    ) -> Result<Option<Envelope>, StoreError> {
        let Some(cur) = self.current(id).await? else {
            return Ok(None);
        };
        if cur.deleted || !meshql_core::auth::is_visible(&ctx.filter, &cur.tokens) {
            return Ok(None);
        }
        let tokens = ctx.tokens.clone().unwrap_or(cur.tokens);
        let env = self
            .append(NewVersion {
                id,
                payload,
                created_at,
                deleted: false,
                tokens: &tokens,
                fresh_id: false,
                correlation_id: ctx.correlation_id.as_deref(),
            })
            .await?;
        self.committed(1);
        Ok(Some(env))
    }

    /// See [`Store::create_many`] (the caller holds the locks of the batch's given ids).
    async fn create_many_locked(
        &self,
        items: Vec<BatchItem>,
        ctx: &WriteContext,
    ) -> Result<Vec<Envelope>, StoreError> {
        let tokens = ctx.create_tokens();
        let mut attempts = 0;
        let plan = loop {
            let mut plan = self
                .plan_batch(&items, tokens, ctx.correlation_id.as_deref())
                .await?;
            let mut hold = self.feed.draw(plan.versions.len() as u64).await?;
            match self.insert_batch(&mut plan, &items, &mut hold).await {
                Ok(()) => {
                    hold.stored();
                    break plan;
                }
                Err(BatchFailure::Mongo(e)) => {
                    hold.abandon(true).await;
                    if is_duplicate_key(&e) && attempts < 8 {
                        attempts += 1;
                        continue;
                    }
                    return Err(error(e));
                }
                Err(BatchFailure::Store(e)) => {
                    hold.abandon(true).await;
                    return Err(e);
                }
            }
        };
        for (id, oid, stamp) in &plan.settle {
            self.supersede(id, *oid, *stamp).await;
        }
        self.committed(plan.envelopes.len() as u64);
        Ok(plan.envelopes)
    }
}

impl MongoStore {
    /// Removes one id: its lock taken here, the write detached (see [`Writer`]).
    async fn remove_one(
        &self,
        id: &str,
        ctx: &WriteContext,
        permit: OwnedSemaphorePermit,
    ) -> Result<RemoveOutcome, StoreError> {
        let guard = self.w.lock(id).await;
        let (w, id, ctx) = (self.w.clone(), id.to_owned(), ctx.clone());
        detached(async move {
            let _held = (permit, guard);
            w.remove_locked(&id, &ctx).await
        })
        .await
    }

    async fn find_rows(
        &self,
        template: &QueryTemplate,
        args: &BoundArgs,
        filter: &TokenFilter,
        at: Option<Millis>,
        limit: Option<usize>,
    ) -> Result<Vec<Row>, StoreError> {
        template
            .check_args(args)
            .map_err(|e| StoreError::Invalid(e.to_string()))?;
        let matching = template_filter(template, args, "")?;
        let check = Matcher::of(template, args);
        if template.sort().is_empty() {
            return self
                .visible_docs(matching, &check, filter, at, limit)
                .await?
                .iter()
                .map(|d| {
                    Ok(Row {
                        id: d.get_str("id").unwrap_or_default().to_owned(),
                        payload: payload_text(d)?,
                    })
                })
                .collect();
        }
        // sorted here, with the comparison every backend shares, then cut to `limit`
        let mut rows: Vec<(Row, serde_json::Map<String, serde_json::Value>)> = self
            .visible_docs(matching, &check, filter, at, None)
            .await?
            .iter()
            .map(|d| {
                let payload = payload_text(d)?;
                let parsed = serde_json::from_str(&payload).unwrap_or_default();
                let id = d.get_str("id").unwrap_or_default().to_owned();
                Ok((Row { id, payload }, parsed))
            })
            .collect::<Result<_, StoreError>>()?;
        template.sort_rows(&mut rows, |(r, p)| (r.id.as_str(), p));
        Ok(rows
            .into_iter()
            .take(limit.unwrap_or(usize::MAX))
            .map(|(r, _)| r)
            .collect())
    }

    /// Visible versions matching `filter` (a Document over the version's fields), at `at`.
    /// The ids of the versions matching `filter`, sorted, each once.
    async fn distinct_ids(&self, filter: Document) -> Result<Vec<String>, StoreError> {
        let found: Vec<Document> = self
            .coll
            .find(filter)
            .projection(doc! {"id": 1})
            .await
            .map_err(error)?
            .try_collect()
            .await
            .map_err(error)?;
        let mut ids: Vec<String> = found
            .iter()
            .filter_map(|d| d.get_str("id").ok().map(str::to_owned))
            .collect();
        ids.sort();
        ids.dedup();
        Ok(ids)
    }

    async fn visible_docs(
        &self,
        matching: Document,
        check: &Matcher<'_>,
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
                // In two parts, so that the cost follows the current documents and the
                // versions written after `at`, not every version stored (an `at` close to
                // now is what every GraphQL request reads with): documents unchanged since
                // `at` are their latest version; those changed since are read as below.
                let before = DateTime::from_millis(at);
                // a condition on the id reads those ids' versions alone, as it always did
                let by_id = matching.contains_key("id");
                let mut newest: Vec<Document> = Vec::new();
                let changed = if by_id {
                    None
                } else {
                    let changed = self
                        .distinct_ids(doc! {"created_at": {"$gt": before}})
                        .await?;
                    let mut unchanged =
                        doc! {"latest": true, "deleted": false, "created_at": {"$lte": before}};
                    unchanged.extend(matching.clone());
                    if let Some(t) = token_filter(tokens) {
                        unchanged.extend(t);
                    }
                    newest = self
                        .coll
                        .find(unchanged)
                        .sort(doc! {"seq": 1})
                        .await
                        .map_err(error)?
                        .try_collect()
                        .await
                        .map_err(error)?;
                    // a version whose `latest` flag is not yet settled (see `settle_latest`):
                    // the newer of the two, or, if that is after `at`, neither (the document
                    // changed since, and is read with those below)
                    newest = newest_per_seq(newest);
                    newest.retain(|d| {
                        d.get_str("id").is_ok_and(|id| {
                            changed.binary_search_by(|c| c.as_str().cmp(id)).is_err()
                        })
                    });
                    if changed.is_empty() {
                        if let Some(l) = limit {
                            newest.truncate(l);
                        }
                        return Ok(newest);
                    }
                    Some(changed)
                };
                // Portable "latest ≤ at, then filter" without $group/$first (FerretDB lacks
                // them): of the documents changed since, ids with some matching version
                // ≤ at, then their newest version ≤ at, checked in process.
                let mut f = doc! {"created_at": {"$lte": before}};
                if let Some(changed) = &changed {
                    f.insert("id", doc! {"$in": changed});
                }
                f.extend(matching.clone());
                let ids = self.distinct_ids(f).await?;
                let versions: Vec<Document> = if ids.is_empty() {
                    Vec::new()
                } else {
                    self.coll
                        .find(doc! {"id": {"$in": ids}, "created_at": {"$lte": before}})
                        .sort(doc! {"id": 1, "created_at": -1})
                        .await
                        .map_err(error)?
                        .try_collect()
                        .await
                        .map_err(error)?
                };
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
                        && check.matches(&v, &matching)
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
impl StoreReader for MongoStore {
    async fn read(&self, id: &str, ctx: &ReadContext<'_>) -> Result<Option<Envelope>, StoreError> {
        let (filter, at) = (ctx.filter, ctx.at);
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
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Envelope>, StoreError> {
        let (filter, at) = (ctx.filter, ctx.at);
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

    async fn list(&self, ctx: &ReadContext<'_>) -> Result<Vec<Envelope>, StoreError> {
        let (filter, at) = (ctx.filter, ctx.at);
        let _permit = self.db.checkout().await?;
        self.visible_docs(Document::new(), &Matcher::Filter, filter, at, None)
            .await?
            .iter()
            .map(envelope)
            .collect()
    }

    /// Walks the unique `(id, created_at desc)` index from `after`: the first version of each
    /// id at or before `at` is its visible one (whatever `latest` flags say). A page read at a
    /// fixed time parks its cursor when full, for the next page to continue ([`Parked`]).
    async fn list_page(
        &self,
        after: Option<&str>,
        limit: usize,
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Envelope>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let _permit = self.db.checkout().await?;
        self.reads.fetch_add(1, Ordering::Relaxed);
        let mut cursor = match self.unpark(after, ctx) {
            Some(c) => c,
            None => {
                let mut f = Document::new();
                if let Some(after) = after {
                    f.insert("id", doc! {"$gt": after});
                }
                if let Some(at) = ctx.at {
                    f.insert("created_at", doc! {"$lte": DateTime::from_millis(at)});
                }
                self.coll
                    .find(f)
                    .sort(doc! {"id": 1, "created_at": -1})
                    .batch_size(u32::try_from(limit.saturating_add(16)).unwrap_or(u32::MAX))
                    .await
                    .map_err(error)?
            }
        };
        let mut out: Vec<Envelope> = Vec::with_capacity(limit.min(1024));
        // the id whose newest version was taken; a parked cursor stopped right after it
        let mut last: Option<String> = after.map(str::to_owned);
        while out.len() < limit {
            let Some(d) = cursor.try_next().await.map_err(error)? else {
                return Ok(out);
            };
            let id = d.get_str("id").unwrap_or_default();
            if last.as_deref() == Some(id) {
                continue; // an older version of the id just taken
            }
            last = Some(id.to_owned());
            if let Some(e) = visible(envelope(&d)?, ctx.filter) {
                out.push(e);
            }
        }
        if let Some(e) = out.last() {
            self.park(cursor, e.id.clone(), ctx);
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
        search: &Search<'_>,
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Row>, StoreError> {
        let Search {
            template,
            args,
            limit,
            ..
        } = *search;
        let (filter, at) = (ctx.filter, ctx.at);
        let _permit = self.db.checkout().await?;
        self.find_rows(template, args, filter, at, limit).await
    }

    async fn find_batch(
        &self,
        batch: &BatchSearch<'_>,
        ctx: &ReadContext<'_>,
    ) -> Result<KeyedRows, StoreError> {
        let BatchSearch {
            template,
            key_arg,
            keys,
        } = *batch;
        let (filter, at) = (ctx.filter, ctx.at);
        let _permit = self.db.checkout().await?;
        let no_preds = Vec::new();
        let preds = match &template.kind {
            TemplateKind::Filter(preds) => preds,
            // operators: one query per key (below)
            TemplateKind::Query(_) => &no_preds,
            TemplateKind::Sql(_) => {
                return Err(StoreError::Invalid(format!(
                    "SQL fragment `{}` needs a SQL backend",
                    template.source
                )))
            }
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
        let docs = self
            .visible_docs(matching, &Matcher::Filter, filter, at, None)
            .await?;
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
}

#[async_trait]
impl StoreWriter for MongoStore {
    async fn create(
        &self,
        mut doc: NewDocument,
        ctx: &WriteContext,
    ) -> Result<Envelope, StoreError> {
        let permit = self.db.checkout_owned().await?;
        let fresh_id = doc.id.is_none();
        let id = doc.resolve_id();
        let created_at = doc.created_at;
        let payload = payload_doc(&doc.into_payload_text(&id))?;
        let guard = if fresh_id {
            None
        } else {
            Some(self.w.lock(&id).await)
        };
        let (w, ctx) = (self.w.clone(), ctx.clone());
        detached(async move {
            let _held = (permit, guard);
            let env = w
                .append(NewVersion {
                    id: &id,
                    payload,
                    created_at,
                    deleted: false,
                    tokens: ctx.create_tokens(),
                    fresh_id,
                    correlation_id: ctx.correlation_id.as_deref(),
                })
                .await?;
            w.committed(1);
            Ok(env)
        })
        .await
    }

    /// All or nothing without transactions: the versions are placed, then inserted with one
    /// ordered `insert_many` under one range of feed positions; only once every one is in are
    /// the `latest` flags settled. Should the insert fail part-way, what it inserted is
    /// deleted again and the positions become void (see [`crate::feed`] for what readers see
    /// meanwhile). A clash with another process on a unique index places the batch again.
    async fn create_many(
        &self,
        docs: Vec<NewDocument>,
        ctx: &WriteContext,
    ) -> Result<Vec<Envelope>, StoreError> {
        let permit = self.db.checkout_owned().await?;
        if docs.is_empty() {
            return Ok(Vec::new());
        }
        // validate everything first
        let mut items = Vec::with_capacity(docs.len());
        for mut d in docs {
            let fresh_id = d.id.is_none();
            let id = d.resolve_id();
            let created_at = d.created_at;
            let payload = payload_doc(&d.into_payload_text(&id))?;
            items.push(BatchItem {
                text: stored_text(&payload),
                id,
                payload,
                created_at,
                fresh_id,
            });
        }
        let guards = self
            .w
            .lock_all(items.iter().filter(|i| !i.fresh_id).map(|i| i.id.as_str()))
            .await;
        let (w, ctx) = (self.w.clone(), ctx.clone());
        detached(async move {
            let _held = (permit, guards);
            w.create_many_locked(items, &ctx).await
        })
        .await
    }

    async fn update(
        &self,
        id: &str,
        doc: NewDocument,
        ctx: &WriteContext,
    ) -> Result<Option<Envelope>, StoreError> {
        let permit = self.db.checkout_owned().await?;
        let created_at = doc.created_at;
        let payload = payload_doc(&doc.into_payload_text(id))?;
        let guard = self.w.lock(id).await;
        let (w, id, ctx) = (self.w.clone(), id.to_owned(), ctx.clone());
        detached(async move {
            let _held = (permit, guard);
            w.update_locked(&id, payload, created_at, &ctx).await
        })
        .await
    }

    async fn remove(&self, id: &str, ctx: &WriteContext) -> Result<RemoveOutcome, StoreError> {
        let permit = self.db.checkout_owned().await?;
        self.remove_one(id, ctx, permit).await
    }

    async fn remove_many(
        &self,
        ids: &[String],
        ctx: &WriteContext,
    ) -> Result<Vec<(String, RemoveOutcome)>, StoreError> {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let permit = self.db.checkout_owned().await?;
            out.push((id.clone(), self.remove_one(id, ctx, permit).await?));
        }
        Ok(out)
    }
}

#[async_trait]
impl ChangeFeed for MongoStore {
    /// The gap-free prefix of the versions' feed positions (see [`crate::feed`]).
    async fn changes(&self, after: Cursor, limit: usize) -> Result<Vec<StoreChange>, StoreError> {
        // this store's cursors are all `Cursor(0, pos)`: nothing comes after a larger one
        if after.0 > 0 || limit == 0 {
            return Ok(Vec::new());
        }
        // no request permit: the feed reader uses the connection kept for it (see `connect`)
        self.w
            .feed
            .changes(after.1, limit, &self.feed_reads, change_of)
            .await
    }

    fn commit_signal(&self) -> Option<meshql_core::CommitReceiver> {
        Some(self.w.signal.subscribe())
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
            // the versions written after a moment, for reads `at` it (see `visible_docs`)
            IndexModel::builder().keys(doc! {"created_at": 1}).build(),
            // the change feed; sparse for versions older than the feed (FerretDB ignores
            // `sparse`, and its unique indexes let any number of documents lack the field)
            IndexModel::builder()
                .keys(doc! {"pos": 1})
                .options(IndexOptions::builder().unique(true).sparse(true).build())
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
        self.w.feed.prepare().await
    }

    async fn ready(&self) -> Result<(), StoreError> {
        self.db.ping().await
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            reads: self.reads.load(Ordering::Relaxed),
            commits: self.w.commits.load(Ordering::Relaxed),
            writes: self.w.writes.load(Ordering::Relaxed),
            read_connections: None,
            connections_in_use: Some(self.db.connections_in_use()),
            log: None,
        }
    }

    async fn shutdown(&self) {
        self.db.close().await;
    }
}

#[async_trait]
impl meshql_core::Database for MongoDatabase {
    fn backend(&self) -> &'static str {
        "mongo"
    }
    fn store(self: Arc<Self>, collection: &str) -> meshql_core::DynStore {
        Arc::new(MongoStore::new(self, collection))
    }
    fn replica(self: Arc<Self>, collection: &str) -> Option<meshql_core::DynReader> {
        MongoStore::replica(self, collection).map(|s| Arc::new(s) as meshql_core::DynReader)
    }
    fn replica_probe(self: Arc<Self>) -> Option<Arc<dyn meshql_core::replica::ReplicaProbe>> {
        let replica = self.replica.clone()?;
        Some(Arc::new(crate::replica::MongoReplicaProbe::new(
            replica,
            self.replica_settings,
        )))
    }
    async fn close(&self) {
        MongoDatabase::close(self).await;
    }
}

/// Processor outputs are not supported: no multi-document transactions on the servers this
/// store is tested against (see the crate docs, "Processor outputs: not supported").
impl meshql_core::OutputStore for MongoStore {}

#[cfg(test)]
mod tests {
    use super::{MongoDatabase, MongoOptions};
    use mongodb::options::{ReadPreference, SelectionCriteria};

    fn read_preference(db: &MongoDatabase) -> Option<&'static str> {
        match db.client.selection_criteria() {
            None => None,
            Some(SelectionCriteria::ReadPreference(p)) => Some(match p {
                ReadPreference::Primary => "primary",
                ReadPreference::PrimaryPreferred { .. } => "primaryPreferred",
                ReadPreference::Secondary { .. } => "secondary",
                ReadPreference::SecondaryPreferred { .. } => "secondaryPreferred",
                ReadPreference::Nearest { .. } => "nearest",
                _ => "another",
            }),
            Some(_) => Some("a predicate"),
        }
    }

    /// No server needed: clients connect in the background, at their first operation.
    #[tokio::test]
    async fn the_read_url_client_reads_secondaries_unless_told_otherwise() {
        let primary = "mongodb://127.0.0.1:1/";
        let without = MongoDatabase::connect(&MongoOptions::new(primary, "d"))
            .await
            .unwrap();
        assert!(without.replica.is_none());
        assert_eq!(read_preference(&without), None, "the driver's default");

        for (read_url, expected) in [
            ("mongodb://127.0.0.1:2/", "secondaryPreferred"),
            ("mongodb://127.0.0.1:2/?readPreference=nearest", "nearest"),
            ("mongodb://127.0.0.1:2/?readPreference=primary", "primary"),
        ] {
            let db = MongoDatabase::connect(&MongoOptions {
                read_url: Some(read_url.into()),
                ..MongoOptions::new(primary, "d")
            })
            .await
            .unwrap();
            assert_eq!(read_preference(&db), None, "{read_url}: the primary's own");
            let replica = db.replica.as_deref().expect("a read_url client");
            assert!(replica.replica.is_none());
            assert_eq!(replica.db.name(), "d", "the same database");
            assert_eq!(read_preference(replica), Some(expected), "{read_url}");
            db.close().await;
        }

        let e = MongoDatabase::connect(&MongoOptions {
            read_url: Some("mongodb://127.0.0.1:2/?readPreference=sometimes".into()),
            ..MongoOptions::new(primary, "d")
        })
        .await
        .expect_err("a bad readPreference");
        assert!(e.to_string().contains("read_url"), "{e}");
    }
}
