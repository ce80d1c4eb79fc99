//! [`EntityService`]: validate, authorize, write with a write context, read through a reader.
//!
//! Permissions: every operation first asks the session's [`Grants`] whether the caller may
//! do it to this entity ([`EngineError::Forbidden`], a 403, when not), and every document
//! read (or returned by a write) loses the fields the caller's read mask hides. A caller
//! who may write but not read gets back only the `id` of what it wrote. Row filtering by
//! authorized tokens applies on top, unchanged.

use crate::cache::Cache;
use crate::error::EngineError;
use crate::validate::PayloadValidator;
use meshql_core::time::Acknowledged;
use meshql_core::{
    Action, AllowAll, Authorizer, Credentials, DeadLetter, DynReader, DynStore, Envelope,
    Forbidden, Grants, Mask, Millis, NewDocument, Policy, ReadContext, RemoveOutcome, StoreReader,
    TokenFilter, Visibility, WriteContext,
};
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// Who is asking, what they may do, and what their writes are tied to in the change feed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub credentials: Credentials,
    /// What the caller may do, per entity (from the service's [`Policy`]).
    pub grants: Arc<Grants>,
    /// The caller's correlation id; a fresh one is made when a write first asks for it
    /// ([`Session::correlation_id`]), so a read does not pay for a UUID it never uses.
    pub correlation_id: std::sync::OnceLock<String>,
    /// Read from the primary, not a replica or a cache: the request carries a consistency
    /// token they have not applied ([`crate::ReadAfter`]).
    pub from_primary: bool,
}

impl Session {
    /// The documents this caller may see.
    pub fn filter(&self) -> TokenFilter {
        self.credentials.filter()
    }

    /// A session that may do everything, with these credentials (tests, tools).
    pub fn unrestricted(credentials: Credentials) -> Session {
        Session {
            credentials,
            grants: Arc::new(Grants::unrestricted()),
            correlation_id: std::sync::OnceLock::new(),
            from_primary: false,
        }
    }

    /// The id the change feed ties this caller's writes to: the caller's, or one made the
    /// first time it is asked for (the same for the rest of the request).
    pub fn correlation_id(&self) -> &str {
        self.correlation_id
            .get_or_init(|| uuid::Uuid::now_v7().to_string())
    }
}

/// A reader's identity without a correlation id (GraphQL, the change feed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    pub credentials: Credentials,
    pub grants: Arc<Grants>,
    /// The documents this caller may see (from `credentials`, computed once).
    pub filter: TokenFilter,
    /// Read from the primary (see [`Session::from_primary`]).
    pub from_primary: bool,
}

impl Access {
    /// A caller that may read everything (tests, tools, in-process consumers).
    pub fn unrestricted() -> Access {
        Access {
            credentials: Credentials::Unrestricted,
            grants: Arc::new(Grants::unrestricted()),
            filter: TokenFilter::All,
            from_primary: false,
        }
    }

    fn new(credentials: Credentials, grants: Arc<Grants>) -> Access {
        Access {
            filter: credentials.filter(),
            credentials,
            grants,
            from_primary: false,
        }
    }
}

/// One entity's service.
pub struct EntityService {
    pub(crate) name: String,
    /// Where the API's reads go: the primary store, or a replica or cache the deployment
    /// put in front of it ([`EntityService::with_reader`]).
    pub(crate) reader: DynReader,
    /// `reader` is not the primary store (a replica or a cache: [`EntityService::with_reader`]).
    pub(crate) replicated: bool,
    /// The primary store: every write, and every read a write depends on.
    pub(crate) writer: DynStore,
    /// The stamps of the writes this service acknowledged, shared by the services of one
    /// process: what a read snapshot must cover.
    pub(crate) acknowledged: Arc<Acknowledged>,
    validator: Option<Arc<PayloadValidator>>,
    /// Tokens stamped on every write (when empty: the writer's own).
    tokens: Vec<String>,
    authorizer: Arc<dyn Authorizer>,
    policy: Arc<dyn Policy>,
    /// The grants of every caller when the policy allows everything (no per-request work).
    everything: Option<Arc<Grants>>,
    /// The read cache in front of `reader`, whose tags every write advances before it is
    /// acknowledged.
    cache: Option<Arc<Cache>>,
}

impl std::fmt::Debug for EntityService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EntityService")
            .field("name", &self.name)
            .finish()
    }
}

impl EntityService {
    pub fn new(
        name: impl Into<String>,
        store: DynStore,
        validator: Option<PayloadValidator>,
        tokens: Vec<String>,
        authorizer: Arc<dyn Authorizer>,
    ) -> Self {
        Self {
            name: name.into(),
            reader: store.clone(),
            replicated: false,
            writer: store,
            validator: validator.map(Arc::new),
            tokens,
            authorizer,
            policy: Arc::new(AllowAll::default()),
            everything: Some(AllowAll::default().grants()),
            acknowledged: Arc::default(),
            cache: None,
        }
    }

    /// Records acknowledged writes in `clock`, shared with the other services of the process,
    /// so that a read snapshot taken from any of them covers every write any of them answered.
    pub fn with_acknowledged(mut self, clock: Arc<Acknowledged>) -> Self {
        self.acknowledged = clock;
        self
    }

    /// The moment a read without an explicit `at` reads as of (one snapshot for all levels
    /// of a GraphQL answer): now, or later if a write this process acknowledged was stamped
    /// ahead of the clock.
    pub fn read_snapshot(&self) -> Millis {
        self.acknowledged.read_snapshot()
    }

    fn acknowledge(&self, envelopes: &[Envelope]) {
        if let Some(latest) = envelopes.iter().map(|e| e.created_at).max() {
            self.acknowledged.record(latest);
        }
    }

    /// Decides what callers may do with `policy` (default: everything).
    pub fn with_policy(mut self, policy: Arc<dyn Policy>) -> Self {
        self.everything = policy
            .allows_everything()
            .then(|| Arc::new(Grants::unrestricted()));
        self.policy = policy;
        self
    }

    /// The same service (validation, tokens, caller rules) over another store: what a
    /// projection rebuild writes before its table takes the entity's place.
    pub fn on_store(&self, store: DynStore) -> EntityService {
        EntityService {
            name: self.name.clone(),
            reader: store.clone(),
            replicated: false,
            writer: store,
            validator: self.validator.clone(),
            tokens: self.tokens.clone(),
            authorizer: self.authorizer.clone(),
            policy: self.policy.clone(),
            everything: self.everything.clone(),
            acknowledged: self.acknowledged.clone(),
            cache: None,
        }
    }

    /// Serves reads from `reader` (a replica, a cache) instead of the writer's store.
    pub fn with_reader(mut self, reader: DynReader) -> Self {
        self.reader = reader;
        self.replicated = true;
        self
    }

    /// Serves reads through `cache` in front of the current reader (the primary or a replica);
    /// every write advances the cache's tags before it is acknowledged. Unchanged when the
    /// cache was not made for this entity.
    pub fn with_cache(mut self, cache: Arc<Cache>) -> Self {
        if let Some(reader) = cache.reader(&self.name, self.reader.clone()) {
            self.reader = Arc::new(reader);
            self.replicated = true;
            self.cache = Some(cache);
        }
        self
    }

    /// Writes to `ids` (every document when empty) were attempted: the cache's tags advance
    /// before the caller hears of it. Also after a failed write, whose outcome may be unknown.
    async fn invalidate(&self, ids: &[&str], stamp: Millis) {
        if let Some(cache) = &self.cache {
            cache.invalidate(&self.name, ids, stamp).await;
        }
    }

    /// The entity's stored versions were replaced wholesale (a projection rebuild swapped its
    /// table in): no cached answer of the process may be served any more.
    pub async fn storage_replaced(&self) {
        if let Some(cache) = &self.cache {
            cache.clear().await;
        }
    }

    /// Whether reads go somewhere other than the primary (a replica, a cache).
    pub fn replicated(&self) -> bool {
        self.replicated
    }

    /// Where a read goes: the reader, or the primary when the request must see what a
    /// replica or cache may not have applied yet.
    pub(crate) fn reader_for(&self, from_primary: bool) -> &dyn StoreReader {
        if from_primary {
            &*self.writer
        } else {
            &*self.reader
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the API's reads go (a replica or a cache when the deployment configures one).
    pub fn reader(&self) -> &DynReader {
        &self.reader
    }

    /// Where writes go: the primary store, whose change feed the service publishes and whose
    /// readiness is the entity's.
    pub fn writer(&self) -> &DynStore {
        &self.writer
    }

    /// Who identifies the callers (the server's rate limiter keys callers by subject).
    pub fn authorizer(&self) -> &Arc<dyn Authorizer> {
        &self.authorizer
    }

    /// Who is asking and what they may do, for reads (GraphQL, the change feed).
    pub fn access(&self, authorization: Option<&str>) -> Result<Access, meshql_core::AuthError> {
        if let Some(everything) = &self.everything {
            return Ok(Access::new(
                self.authorizer.credentials(authorization)?,
                everything.clone(),
            ));
        }
        let caller = self.authorizer.caller(authorization)?;
        Ok(Access::new(
            caller.credentials,
            self.policy.grants(&caller.principal),
        ))
    }

    /// [`EngineError::Forbidden`] unless `session` may do `action` to this entity.
    pub fn check(&self, session: &Session, action: Action) -> Result<(), EngineError> {
        self.allowed(&session.grants, action)
    }

    /// [`EngineError::Forbidden`] unless `grants` allow `action` on this entity.
    pub(crate) fn allowed(&self, grants: &Grants, action: Action) -> Result<(), EngineError> {
        if grants.allows(&self.name, action) {
            Ok(())
        } else {
            Err(Forbidden {
                entity: self.name.clone(),
                action,
            }
            .into())
        }
    }

    /// Whether `grants` let their caller read this entity, and which of its fields: the one
    /// place every frontend's read permission is decided (REST, GraphQL, the change feed).
    /// `Ok(None)`: every field; `Ok(Some(mask))`: the fields `mask` shows;
    /// [`EngineError::Forbidden`] when the caller may not read the entity at all.
    pub fn read_grant(&self, grants: &Grants) -> Result<Option<Arc<Mask>>, EngineError> {
        Ok(grants.read_view(&self.name)?)
    }

    /// What `access` may see of this entity's documents that come without a store read (a
    /// subscription's events): [`EngineError::Forbidden`] when it may not read the entity.
    pub fn visibility(&self, access: &Access) -> Result<Visibility, EngineError> {
        Ok(Visibility::decide(
            access.filter.clone(),
            &access.grants,
            &[self.name.as_str()],
            None,
        )?)
    }

    /// The fields `session` may read of this entity's documents: its read mask, or only the
    /// `id` when it may not read them (what a write returns to a write-only caller).
    pub fn read_mask(&self, session: &Session) -> Arc<Mask> {
        let grant = session.grants.entity(&self.name);
        if grant.allows(Action::Read) {
            grant.mask.clone()
        } else {
            Arc::new(Mask::Only(Default::default()))
        }
    }

    /// What a write returns to `session`: the fields it may read (the `id` alone when it may
    /// read none).
    fn masked(&self, session: &Session, envelope: Envelope) -> Envelope {
        let mask = self.read_mask(session);
        apply_mask((!mask.is_all()).then_some(&*mask), envelope)
    }

    fn masked_all(&self, session: &Session, envelopes: Vec<Envelope>) -> Vec<Envelope> {
        let mask = self.read_mask(session);
        apply_mask_all((!mask.is_all()).then_some(&*mask), envelopes)
    }

    /// The caller of a request: `authorization` is the `Authorization` header's value,
    /// `correlation_id` the caller's (a fresh one is made when it has none usable). Fails when
    /// the authorizer refuses the credentials (a forged or expired token, a missing one where
    /// required).
    pub fn session(
        &self,
        authorization: Option<&str>,
        correlation_id: Option<&str>,
    ) -> Result<Session, EngineError> {
        let access = self.access(authorization)?;
        Ok(Session {
            credentials: access.credentials,
            grants: access.grants,
            correlation_id: correlation_id
                .map(str::trim)
                .filter(|c| !c.is_empty() && c.len() <= 200)
                .map(|c| std::sync::OnceLock::from(c.to_owned()))
                .unwrap_or_default(),
            from_primary: false,
        })
    }

    /// What a write by `session` carries. A create stamps the configured tokens, or else the
    /// writer's own; an update or delete keeps the document's owner unless tokens are
    /// configured.
    pub fn write_context(&self, session: &Session, creating: bool) -> WriteContext {
        let tokens = if !self.tokens.is_empty() {
            Some(self.tokens.clone())
        } else if creating {
            Some(session.credentials.write_tokens())
        } else {
            None
        };
        WriteContext {
            tokens,
            filter: session.filter(),
            correlation_id: Some(session.correlation_id().to_owned()),
        }
    }

    /// The payload as a document, if it is an object the entity's schema accepts.
    pub fn validate(&self, value: Value) -> Result<Map<String, Value>, EngineError> {
        let Value::Object(map) = value else {
            return Err(EngineError::WrongShape("object"));
        };
        if let Some(v) = &self.validator {
            // validation needs a Value; the map goes back out of it untouched
            let value = Value::Object(map);
            let violations = v.violations(&value);
            if !violations.is_empty() {
                return Err(EngineError::Invalid(violations));
            }
            let Value::Object(map) = value else {
                unreachable!("built as an object above")
            };
            return Ok(map);
        }
        Ok(map)
    }

    pub async fn create(&self, session: &Session, value: Value) -> Result<Envelope, EngineError> {
        self.check(session, Action::Create)?;
        let doc = self.validate(value)?;
        let created = self
            .writer
            .create(NewDocument::new(doc), &self.write_context(session, true))
            .await;
        if self.cache.is_some() {
            match &created {
                Ok(e) => self.invalidate(&[e.id.as_str()], e.created_at).await,
                Err(_) => self.invalidate(&[], self.read_snapshot()).await,
            }
        }
        let created = created?;
        self.acknowledge(std::slice::from_ref(&created));
        Ok(self.masked(session, created))
    }

    /// All or nothing: every item is validated first (all violations reported, per index),
    /// then the batch is stored in one transaction.
    pub async fn create_many(
        &self,
        session: &Session,
        values: Vec<Value>,
    ) -> Result<Vec<Envelope>, EngineError> {
        self.check(session, Action::Create)?;
        let mut docs = Vec::with_capacity(values.len());
        let mut problems = Vec::new();
        for (index, value) in values.into_iter().enumerate() {
            match self.validate(value) {
                Ok(d) => docs.push(NewDocument::new(d)),
                Err(EngineError::Invalid(v)) => {
                    problems.push(json!({"index": index, "errors": v}))
                }
                Err(EngineError::WrongShape(_)) => problems.push(
                    json!({"index": index, "errors": [{"path": "/", "message": "not a JSON object"}]}),
                ),
                Err(e) => return Err(e),
            }
        }
        if !problems.is_empty() {
            return Err(EngineError::InvalidBatch(problems));
        }
        let created = self
            .writer
            .create_many(docs, &self.write_context(session, true))
            .await;
        if self.cache.is_some() {
            match &created {
                Ok(written) => {
                    let ids: Vec<&str> = written.iter().map(|e| e.id.as_str()).collect();
                    let stamp = written.iter().map(|e| e.created_at).max().unwrap_or(0);
                    self.invalidate(&ids, stamp).await;
                }
                Err(_) => self.invalidate(&[], self.read_snapshot()).await,
            }
        }
        let created = created?;
        self.acknowledge(&created);
        Ok(self.masked_all(session, created))
    }

    /// A new version of `id`; [`EngineError::NotFound`] when the caller sees no current one.
    pub async fn update(
        &self,
        session: &Session,
        id: &str,
        value: Value,
    ) -> Result<Envelope, EngineError> {
        self.check(session, Action::Update)?;
        let value = self.keep_hidden_fields(session, id, value).await?;
        let doc = self.validate(value)?;
        let updated = self
            .writer
            .update(
                id,
                NewDocument::new(doc),
                &self.write_context(session, false),
            )
            .await;
        if self.cache.is_some() {
            let stamp = match &updated {
                Ok(Some(e)) => e.created_at,
                _ => self.read_snapshot(),
            };
            self.invalidate(&[id], stamp).await;
        }
        let updated = updated?.ok_or(EngineError::NotFound)?;
        self.acknowledge(std::slice::from_ref(&updated));
        Ok(self.masked(session, updated))
    }

    /// An update replaces the whole document, but a caller cannot replace what it cannot
    /// see: the fields its read mask hides are copied from the current version (when the
    /// new payload does not name them), so a masked role's PUT never erases them.
    async fn keep_hidden_fields(
        &self,
        session: &Session,
        id: &str,
        value: Value,
    ) -> Result<Value, EngineError> {
        let mask = self.read_mask(session);
        let Value::Object(mut map) = value else {
            return Ok(value);
        };
        if mask.is_all() {
            return Ok(Value::Object(map));
        }
        let current = self
            .writer
            .read(id, &ReadContext::new(&session.filter(), None))
            .await?;
        if let Some(Ok(stored)) = current.map(|e| e.payload_map()) {
            for (field, v) in stored {
                if !mask.allows(&field) && !map.contains_key(&field) {
                    map.insert(field, v);
                }
            }
        }
        Ok(Value::Object(map))
    }

    /// A processor's outputs, committed with its input position in one transaction
    /// ([`meshql_core::output`]): every `Put` is checked against the entity's JSON Schema and
    /// the caller's grants (create, update; delete for a `Delete`) before anything is
    /// written. A `Put` of an id with a current version keeps its tokens unless the entity
    /// configures tokens.
    pub async fn apply_output(
        &self,
        session: &Session,
        batch: meshql_core::OutputBatch,
    ) -> Result<Vec<Envelope>, EngineError> {
        use meshql_core::OutputWrite;
        let mut checked_put = false;
        let mut checked_delete = false;
        for write in &batch.writes {
            match write {
                OutputWrite::Put { payload, .. } => {
                    if !checked_put {
                        self.check(session, Action::Create)?;
                        self.check(session, Action::Update)?;
                        checked_put = true;
                    }
                    let value: Value = serde_json::from_str(payload)
                        .map_err(|_| EngineError::WrongShape("object"))?;
                    self.validate(value)?;
                }
                OutputWrite::Delete { .. } => {
                    if !checked_delete {
                        self.check(session, Action::Delete)?;
                        checked_delete = true;
                    }
                }
            }
        }
        let ids: Vec<String> = match self.cache {
            Some(_) => batch.writes.iter().map(|w| w.id().to_owned()).collect(),
            None => Vec::new(),
        };
        let written = self
            .writer
            .apply_output(batch, &self.write_context(session, false))
            .await;
        if self.cache.is_some() {
            let stamp = match &written {
                Ok(w) => w.iter().map(|e| e.created_at).max().unwrap_or(0),
                Err(_) => 0,
            }
            .max(self.read_snapshot());
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            self.invalidate(&ids, stamp).await;
        }
        let written = written?;
        self.acknowledge(&written);
        Ok(written)
    }

    pub async fn remove(&self, session: &Session, id: &str) -> Result<RemoveOutcome, EngineError> {
        self.check(session, Action::Delete)?;
        let removed = self
            .writer
            .remove(id, &self.write_context(session, false))
            .await;
        if self.cache.is_some() {
            // the tombstone's stamp is not returned: the moment after it was written covers it
            self.invalidate(&[id], self.read_snapshot()).await;
        }
        Ok(removed?)
    }

    pub async fn read(
        &self,
        session: &Session,
        id: &str,
        at: Option<Millis>,
    ) -> Result<Option<Envelope>, EngineError> {
        let mask = self.read_grant(&session.grants)?;
        Ok(self
            .reader_for(session.from_primary)
            .read(id, &ReadContext::new(&session.filter(), at))
            .await?
            .map(|e| apply_mask(mask.as_deref(), e)))
    }

    /// Every stored version of `id` that `session` may see, oldest first, tombstones
    /// included, masked as its reads are: each version kept when its own tokens admit the
    /// caller (what a read at that version's moment returns), none when the caller may not
    /// read the entity ([`EngineError::Forbidden`]). Read where the API's reads go (the cache
    /// never holds versions).
    pub async fn versions(
        &self,
        session: &Session,
        id: &str,
    ) -> Result<Vec<Envelope>, EngineError> {
        let mask = self.read_grant(&session.grants)?;
        let filter = session.filter();
        let stored = self.reader.versions(id).await?;
        Ok(stored
            .into_iter()
            .filter(|v| meshql_core::is_visible(&filter, &v.authorized_tokens))
            .map(|v| apply_mask(mask.as_deref(), v))
            .collect())
    }

    /// The newest dead letters (at most `limit`) of `processor`, whose output this entity
    /// is, as `session` may see them: [`EngineError::Forbidden`] unless it may read this
    /// entity; only the letters of inputs it may read, entity and row (the input's own
    /// authorized tokens); and for a caller whose grants hide some of the input entity's
    /// fields, the input's payload masked and the reason withheld (a reason is the
    /// processor's free text: it may quote any field).
    pub async fn dead_letters(
        &self,
        session: &Session,
        processor: &str,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, EngineError> {
        self.read_grant(&session.grants)?;
        // trusted read of the output store's own rows; the caller's grants decide below
        let letters = self.writer.dead_letters(Some(processor), limit).await?;
        let filter = session.filter();
        Ok(letters
            .into_iter()
            .filter_map(|(_, mut letter)| {
                let mask = session.grants.read_view(&letter.entity).ok()?;
                let mut input: Option<Map<String, Value>> =
                    serde_json::from_str(&letter.input).ok();
                let tokens: Vec<String> = input
                    .as_ref()
                    .and_then(|i| i.get("authorized_tokens"))
                    .and_then(|t| serde_json::from_value(t.clone()).ok())
                    .unwrap_or_default();
                if !meshql_core::is_visible(&filter, &tokens) {
                    return None;
                }
                if let Some(mask) = mask {
                    letter.reason = format!(
                        "(withheld: the caller may not read every field of {})",
                        letter.entity
                    );
                    letter.input = match input.as_mut() {
                        Some(i) => {
                            match i.get_mut("payload") {
                                Some(Value::Object(payload)) => mask.apply(payload),
                                // an input read as a row is its payload
                                _ => mask.apply(i),
                            }
                            Value::Object(std::mem::take(i)).to_string()
                        }
                        None => String::new(),
                    };
                }
                Some(letter)
            })
            .collect())
    }

    /// [`EngineError::Forbidden`] unless `grants` let their caller read this entity (no I/O):
    /// for endpoints that show something about the entity other than its documents.
    pub fn may_read(&self, grants: &Grants) -> Result<(), EngineError> {
        self.read_grant(grants).map(|_| ())
    }

    /// The version of `id` current just before `at`, from the primary: read once for every
    /// subscriber of a change (a document that left a query's match is told by it), and
    /// opaque until a [`Visibility`] admits it ([`Prior::seen_by`]).
    pub async fn prior_version(&self, id: &str, at: Millis) -> Result<Option<Prior>, EngineError> {
        let found = self
            .reader_for(true)
            .read(
                id,
                &ReadContext::new(&meshql_core::TokenFilter::All, Some(at - 1)),
            )
            .await?;
        Ok(found.and_then(|e| {
            Some(Prior {
                entity: self.name.clone(),
                document: e.payload_map().ok()?,
                authorized_tokens: e.authorized_tokens,
            })
        }))
    }

    pub async fn read_many(
        &self,
        session: &Session,
        ids: &[String],
        at: Option<Millis>,
    ) -> Result<Vec<Envelope>, EngineError> {
        let mask = self.read_grant(&session.grants)?;
        let found = self
            .reader_for(session.from_primary)
            .read_many(ids, &ReadContext::new(&session.filter(), at))
            .await?;
        Ok(apply_mask_all(mask.as_deref(), found))
    }

    pub async fn list(
        &self,
        session: &Session,
        at: Option<Millis>,
    ) -> Result<Vec<Envelope>, EngineError> {
        let mask = self.read_grant(&session.grants)?;
        let found = self
            .reader_for(session.from_primary)
            .list(&ReadContext::new(&session.filter(), at))
            .await?;
        Ok(apply_mask_all(mask.as_deref(), found))
    }

    /// One page of the list in id order: the documents after `after`, at most `limit`, as
    /// of `at` (see [`meshql_core::StoreReader::list_page`]). Pages read with one `at` form
    /// one snapshot.
    pub async fn list_page(
        &self,
        session: &Session,
        after: Option<&str>,
        limit: usize,
        at: Option<Millis>,
    ) -> Result<Vec<Envelope>, EngineError> {
        let mask = self.read_grant(&session.grants)?;
        let found = self
            .reader_for(session.from_primary)
            .list_page(after, limit, &ReadContext::new(&session.filter(), at))
            .await?;
        Ok(apply_mask_all(mask.as_deref(), found))
    }
}

/// `envelope` with only the fields `mask` shows (`None`: all of them).
fn apply_mask(mask: Option<&Mask>, mut envelope: Envelope) -> Envelope {
    if let Some(mask) = mask {
        envelope.payload = mask.apply_text(std::mem::take(&mut envelope.payload));
    }
    envelope
}

fn apply_mask_all(mask: Option<&Mask>, envelopes: Vec<Envelope>) -> Vec<Envelope> {
    match mask {
        None => envelopes,
        Some(_) => envelopes.into_iter().map(|e| apply_mask(mask, e)).collect(),
    }
}

/// A document's version before a change, read without regard to who asks: only a
/// [`Visibility`] that admits it shows it.
#[derive(Debug, Clone)]
pub struct Prior {
    entity: String,
    document: Map<String, Value>,
    authorized_tokens: Vec<String>,
}

impl Prior {
    /// The prior document, for matching a query against it (never output), when `visibility`
    /// admits its entity and its tokens.
    pub fn seen_by(&self, visibility: &Visibility) -> Option<&Map<String, Value>> {
        visibility
            .admits(&self.entity, &self.authorized_tokens)
            .then_some(&self.document)
    }
}

/// What `access` may see of the documents of `services` that come without a store read (the
/// change log), or of only the `asked` entities among them: [`EngineError::Forbidden`] for an
/// asked entity it may not read, or when it may read none.
pub fn visibility(
    services: &[Arc<EntityService>],
    access: &Access,
    asked: Option<&[String]>,
) -> Result<Visibility, EngineError> {
    let names: Vec<&str> = services.iter().map(|s| s.name()).collect();
    Ok(Visibility::decide(
        access.filter.clone(),
        &access.grants,
        &names,
        asked,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshql_core::{AuthError, Credentials, NoAuth};
    use meshql_core::{Grants, Mask, Policy};

    /// `Bearer <name>` is the caller `name`; `Bearer` alone is refused (what a verifying
    /// authorizer does with a bad token).
    struct NamedCallers;

    impl Authorizer for NamedCallers {
        fn credentials(&self, authorization: Option<&str>) -> Result<Credentials, AuthError> {
            match authorization.map(|h| h.strip_prefix("Bearer").unwrap_or(h).trim()) {
                None => Ok(Credentials::Tokens(vec![])),
                Some("") => Err(AuthError::Signature),
                Some(name) => Ok(Credentials::Tokens(vec![name.to_owned()])),
            }
        }
    }
    use meshql_store_memory::MemoryStore;

    fn service(tokens: Vec<String>, auth: Arc<dyn Authorizer>) -> EntityService {
        let schema = json!({
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string"}},
            "additionalProperties": false
        });
        EntityService::new(
            "hen",
            Arc::new(MemoryStore::new()),
            Some(PayloadValidator::new(&schema).unwrap()),
            tokens,
            auth,
        )
    }

    fn jwt(sub: &str) -> String {
        format!("Bearer {sub}")
    }

    #[tokio::test]
    async fn writes_are_validated_authorized_and_correlated() {
        let s = service(vec![], Arc::new(NamedCallers));
        let alice = s.session(Some(&jwt("alice")), Some("req-1")).unwrap();
        let bob = s.session(Some(&jwt("bob")), None).unwrap();
        let refused = s.session(Some("Bearer"), None).unwrap_err();
        assert_eq!(refused.kind(), meshql_core::ErrorKind::Unauthenticated);
        assert!(bob.correlation_id().len() >= 32, "a fresh correlation id");
        assert!(matches!(
            s.create(&alice, json!({"nope": 1})).await,
            Err(EngineError::Invalid(v)) if !v.is_empty()
        ));
        assert!(matches!(
            s.create(&alice, json!([1])).await,
            Err(EngineError::WrongShape("object"))
        ));
        let env = s.create(&alice, json!({"name": "a"})).await.unwrap();
        assert_eq!(env.authorized_tokens, vec!["alice".to_owned()]);
        assert!(s.read(&bob, &env.id, None).await.unwrap().is_none());
        assert!(matches!(
            s.update(&bob, &env.id, json!({"name": "b"})).await,
            Err(EngineError::NotFound)
        ));
        let v2 = s
            .update(&alice, &env.id, json!({"name": "a2"}))
            .await
            .unwrap();
        assert_eq!(
            v2.authorized_tokens,
            vec!["alice".to_owned()],
            "the owner stays"
        );
        let feed = s
            .writer()
            .changes(meshql_core::Cursor::START, 10)
            .await
            .unwrap();
        assert_eq!(feed.len(), 2);
        assert!(feed
            .iter()
            .all(|c| c.correlation_id.as_deref() == Some("req-1")));
        assert_eq!(
            EngineError::NotFound.kind(),
            meshql_core::ErrorKind::NotFound
        );
    }

    #[tokio::test]
    async fn a_bulk_write_reports_every_bad_item_and_stores_nothing() {
        let s = service(vec!["team".into()], Arc::new(NoAuth));
        let session = s.session(None, None).unwrap();
        let err = s
            .create_many(
                &session,
                vec![json!({"name": "ok"}), json!({"x": 1}), json!(3)],
            )
            .await
            .unwrap_err();
        let EngineError::InvalidBatch(problems) = err else {
            panic!("{err:?}")
        };
        assert_eq!(problems.len(), 2);
        assert_eq!(problems[1]["index"], 2);
        assert!(s.list(&session, None).await.unwrap().is_empty());
        let made = s
            .create_many(&session, vec![json!({"name": "a"}), json!({"name": "b"})])
            .await
            .unwrap();
        assert!(made
            .iter()
            .all(|e| e.authorized_tokens == vec!["team".to_owned()]));
    }

    /// Grants by the caller's first role: `reader` reads `hen` without `secret`; `writer`
    /// creates and updates it without reading; `keeper` reads (without `secret`) and
    /// updates; anyone else nothing.
    struct ByRole;

    impl Authorizer for ByRole {
        fn credentials(&self, _: Option<&str>) -> Result<Credentials, AuthError> {
            Ok(Credentials::Unrestricted)
        }

        fn caller(&self, authorization: Option<&str>) -> Result<meshql_core::Caller, AuthError> {
            Ok(meshql_core::Caller {
                credentials: Credentials::Unrestricted,
                principal: meshql_core::Principal {
                    subject: authorization.map(str::to_owned),
                    roles: authorization.into_iter().map(str::to_owned).collect(),
                },
            })
        }
    }

    impl Policy for ByRole {
        fn grants(&self, principal: &meshql_core::Principal) -> Arc<Grants> {
            use meshql_core::{Actions, Grant};
            let hide = || Arc::new(Mask::Hide(["secret".to_owned()].into()));
            let grant = match principal.roles.first().map(String::as_str) {
                Some("reader") => Grant {
                    actions: Actions::of([Action::Read]),
                    mask: hide(),
                },
                Some("writer") => Grant {
                    actions: Actions::of([Action::Create, Action::Update]),
                    mask: Arc::new(Mask::All),
                },
                Some("keeper") => Grant {
                    actions: Actions::of([Action::Read, Action::Update]),
                    mask: hide(),
                },
                Some("admin") => Grant::full(),
                _ => Grant::none(),
            };
            Arc::new(Grants::new(
                [("hen".to_owned(), grant)].into(),
                Grant::none(),
            ))
        }
    }

    #[tokio::test]
    async fn permissions_refuse_actions_and_mask_fields() {
        let s = EntityService::new(
            "hen",
            Arc::new(MemoryStore::new()),
            None,
            vec![],
            Arc::new(ByRole),
        )
        .with_policy(Arc::new(ByRole));
        let as_role = |r: &str| s.session(Some(r), None).unwrap();
        let (admin, reader, writer, keeper, nobody) = (
            as_role("admin"),
            as_role("reader"),
            as_role("writer"),
            as_role("keeper"),
            as_role("nobody"),
        );
        let forbidden = |r: Result<_, EngineError>| match r {
            Err(e @ EngineError::Forbidden(_)) => {
                assert_eq!(
                    (e.kind(), e.kind().code()),
                    (meshql_core::ErrorKind::Forbidden, "FORBIDDEN")
                )
            }
            other => panic!("{other:?}"),
        };
        let hen = s
            .create(&admin, json!({"name": "a", "secret": "s"}))
            .await
            .unwrap();
        forbidden(s.create(&reader, json!({"name": "b"})).await.map(|_| ()));
        forbidden(s.remove(&writer, &hen.id).await.map(|_| ()));
        forbidden(s.read(&nobody, &hen.id, None).await.map(|_| ()));
        forbidden(s.list(&writer, None).await.map(|_| ()));
        assert!(s.check(&reader, Action::Read).is_ok());
        // the reader's copy has no secret, everywhere
        let read = s.read(&reader, &hen.id, None).await.unwrap().unwrap();
        assert_eq!(read.payload_map().unwrap().get("secret"), None);
        assert_eq!(read.payload_map().unwrap()["name"], "a");
        let page = s.list_page(&reader, None, 10, None).await.unwrap();
        assert_eq!(page[0].payload_map().unwrap().get("secret"), None);
        let many = s
            .read_many(&reader, std::slice::from_ref(&hen.id), None)
            .await
            .unwrap();
        assert_eq!(many[0].payload_map().unwrap().get("secret"), None);
        // a write-only caller gets back the id alone
        let made = s.create(&writer, json!({"name": "w"})).await.unwrap();
        assert_eq!(
            made.payload_map().unwrap(),
            *json!({"id": made.id}).as_object().unwrap()
        );
        // an update by a masked role keeps what it cannot see
        let v2 = s
            .update(&keeper, &hen.id, json!({"name": "a2"}))
            .await
            .unwrap();
        assert_eq!(v2.payload_map().unwrap().get("secret"), None);
        let stored = s.read(&admin, &hen.id, None).await.unwrap().unwrap();
        assert_eq!(stored.payload_map().unwrap()["secret"], "s");
        assert_eq!(stored.payload_map().unwrap()["name"], "a2");
        // the grants travel with reads (GraphQL, the change feed)
        let access = s.access(Some("reader")).unwrap();
        assert!(!access.grants.mask("hen").allows("secret"));
    }

    /// History and dead letters go through the same read decision as documents: the
    /// console's versions are masked and refused like reads, and a processor's dead letters
    /// are shown only to callers who may read its output, and only those of readable inputs.
    #[tokio::test]
    async fn versions_and_dead_letters_are_read_with_the_caller_s_grants() {
        let store: DynStore = Arc::new(MemoryStore::new());
        let s = EntityService::new("hen", store.clone(), None, vec![], Arc::new(ByRole))
            .with_policy(Arc::new(ByRole));
        let as_role = |r: &str| s.session(Some(r), None).unwrap();
        let (admin, reader, nobody) = (as_role("admin"), as_role("reader"), as_role("nobody"));
        let hen = s
            .create(&admin, json!({"name": "a", "secret": "s"}))
            .await
            .unwrap();
        s.update(&admin, &hen.id, json!({"name": "b", "secret": "t"}))
            .await
            .unwrap();
        let all = s.versions(&admin, &hen.id).await.unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].payload_map().unwrap()["secret"], "t");
        let masked = s.versions(&reader, &hen.id).await.unwrap();
        assert_eq!(masked.len(), 2);
        assert!(masked
            .iter()
            .all(|v| v.payload_map().unwrap().get("secret").is_none()));
        assert!(matches!(
            s.versions(&nobody, &hen.id).await,
            Err(EngineError::Forbidden(_))
        ));
        assert!(s.may_read(&reader.grants).is_ok());
        assert!(s.may_read(&nobody.grants).is_err());

        let letter = |entity: &str, position: u64| meshql_core::DeadLetter {
            position,
            change_id: format!("{entity}:x:1"),
            entity: entity.to_owned(),
            reason: "bad".into(),
            input: "{}".into(),
            at: 1,
        };
        let mut batch = meshql_core::OutputBatch::new("p", 2);
        batch.dead_letters = vec![letter("hen", 1), letter("coop", 2)];
        store
            .apply_output(batch, &WriteContext::default())
            .await
            .unwrap();
        let seen = |session: &Session| {
            let s = &s;
            let session = session.clone();
            async move {
                s.dead_letters(&session, "p", 5)
                    .await
                    .map(|l| l.into_iter().map(|l| l.entity).collect::<Vec<_>>())
            }
        };
        // without permissions every letter shows
        let open = EntityService::new("hen", store.clone(), None, vec![], Arc::new(NoAuth));
        let anyone = open.session(None, None).unwrap();
        let mut everything: Vec<String> = open
            .dead_letters(&anyone, "p", 5)
            .await
            .unwrap()
            .into_iter()
            .map(|l| l.entity)
            .collect();
        everything.sort();
        assert_eq!(everything, ["coop", "hen"]);
        // the admin and the reader may read hen, not coop: coop's letter stays hidden
        assert_eq!(seen(&admin).await.unwrap(), ["hen"]);
        assert_eq!(seen(&reader).await.unwrap(), ["hen"]);
        assert!(matches!(
            seen(&nobody).await,
            Err(EngineError::Forbidden(_))
        ));
    }

    /// A replica that lags (here: one that never received anything) serves the API's reads,
    /// never a write's own: a masked update keeps the hidden fields of the primary's current
    /// version, and a snapshot covers what the service acknowledged.
    #[tokio::test]
    async fn reads_go_to_the_reader_and_the_write_path_to_the_primary() {
        let primary: DynStore = Arc::new(MemoryStore::new());
        let stale: DynStore = Arc::new(MemoryStore::new());
        let clock = Arc::new(Acknowledged::new());
        let s = EntityService::new("hen", primary.clone(), None, vec![], Arc::new(ByRole))
            .with_policy(Arc::new(ByRole))
            .with_reader(stale.clone())
            .with_acknowledged(clock.clone());
        let admin = s.session(Some("admin"), None).unwrap();
        let keeper = s.session(Some("keeper"), None).unwrap();
        let hen = s
            .create(&admin, json!({"name": "a", "secret": "s"}))
            .await
            .unwrap();
        assert!(
            clock.read_snapshot() >= hen.created_at,
            "the write is acknowledged"
        );
        assert_eq!(s.read_snapshot(), clock.read_snapshot());
        assert!(
            s.read(&admin, &hen.id, None).await.unwrap().is_none(),
            "reads are the reader's (the replica has not caught up)"
        );
        s.update(&keeper, &hen.id, json!({"name": "a2"}))
            .await
            .unwrap();
        let stored = primary
            .read(&hen.id, &ReadContext::LATEST)
            .await
            .unwrap()
            .unwrap();
        let stored = stored.payload_map().unwrap();
        assert_eq!(stored["name"], "a2");
        assert_eq!(
            stored["secret"], "s",
            "the hidden field was read from the primary, not the stale replica"
        );
        // GraphQL's reads: the reader too, with the caller's mask
        let access = s.access(Some("keeper")).unwrap();
        let template = meshql_core::QueryTemplate::filter(r#"{"id": "{{id}}"}"#).unwrap();
        let args = [("id".to_owned(), json!(hen.id))].into_iter().collect();
        let search = meshql_core::Search::new(&template, &args, None);
        let found = s.find(&access, &search, None).await.unwrap();
        assert!(found.rows.is_empty(), "found on the reader");
        assert!(!found.mask.unwrap().allows("secret"));
        stale
            .create(
                NewDocument::with_id(&hen.id, json!({"name": "old"}).as_object().unwrap().clone()),
                &WriteContext::SYSTEM,
            )
            .await
            .unwrap();
        let found = s.find(&access, &search, None).await.unwrap();
        assert_eq!(found.rows.len(), 1);
        let nobody = s.access(Some("nobody")).unwrap();
        assert!(matches!(
            s.find(&nobody, &search, None).await,
            Err(EngineError::Forbidden(_))
        ));
        assert!(
            s.find_nested(&access, &search, &[], None)
                .await
                .unwrap()
                .is_none(),
            "one statement over several entities only for a caller who may read everything"
        );
    }
}
