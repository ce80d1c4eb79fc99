//! [`CachedReader`]: one entity's reads through the [`Cache`] (see the module docs).

use super::key::{nested_entities, Key};
use super::worth::Worth;
use super::{Answer, Cache, Entry, Lookup, TagRef, TagState};
use async_trait::async_trait;
use meshql_core::template::{ArgValue, FieldPath, TemplateKind};
use meshql_core::time::now_millis;
use meshql_core::{
    BatchSearch, BoundArgs, DynReader, Envelope, KeyedRows, Millis, Nested, NestedRow,
    QueryTemplate, ReadContext, Relation, Row, Search, StoreError, StoreReader,
};
use std::future::Future;
use std::sync::Arc;

/// What a read is as of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Moment {
    /// The latest state (no `at`).
    Latest,
    /// A recent moment (a request's snapshot): the latest state unless a newer write is known.
    Recent(Millis),
    /// A moment older than the cache's `settle`: immutable.
    Past(Millis),
}

/// A reader operation that goes through the cache (each keeps its own hit rate).
#[derive(Debug, Clone, Copy)]
enum Op {
    Read,
    ReadMany,
    List,
    ListPage,
    Find,
    Batch,
    Nested,
}

/// The number of [`Op`]s.
const OPS: usize = Op::Nested as usize + 1;

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::ReadMany => "read_many",
            Op::List => "list",
            Op::ListPage => "list_page",
            Op::Find => "find",
            Op::Batch => "batch",
            Op::Nested => "nested",
        }
    }
}

/// What a read asks the cache: the answer under `key` of operation `op`, depending on `tags`,
/// as of `at`.
struct Ask {
    op: Op,
    key: Key,
    tags: Vec<TagRef>,
    at: Option<Millis>,
}

/// An entity's reader answering from the cache and, on a miss, from the reader behind it (the
/// primary or a replica).
pub struct CachedReader {
    cache: Arc<Cache>,
    entity: u32,
    name: String,
    inner: DynReader,
    /// Whether a shared cache is worth consulting, per [`Op`].
    worth: [Worth; OPS],
}

impl CachedReader {
    pub(crate) fn new(cache: Arc<Cache>, entity: u32, name: &str, inner: DynReader) -> Self {
        CachedReader {
            cache,
            entity,
            name: name.to_owned(),
            inner,
            worth: Default::default(),
        }
    }

    fn moment(&self, at: Option<Millis>) -> Moment {
        match at {
            None => Moment::Latest,
            Some(t) if t < now_millis() - self.cache.settings.settle.as_millis() as Millis => {
                Moment::Past(t)
            }
            Some(t) => Moment::Recent(t),
        }
    }

    /// The answer to `ask`, or `fetch`'s, stored when it is current.
    async fn through<T>(
        &self,
        Ask { op, key, tags, at }: Ask,
        fetch: impl Future<Output = Result<T, StoreError>>,
        wrap: impl FnOnce(&T) -> Option<Answer>,
        unwrap: impl FnOnce(&Answer) -> Option<T>,
    ) -> Result<T, StoreError> {
        let worth = &self.worth[op as usize];
        let min_hits = self.cache.min_hits();
        if min_hits.is_some() && !worth.consult() {
            self.cache.skipped();
            return fetch.await;
        }
        let moment = self.moment(at);
        let (key, tags) = match moment {
            Moment::Past(t) => (key.at(t).into_string(), Vec::new()),
            _ => (key.into_string(), tags),
        };
        let (states, entry) = match self.cache.lookup(&key, &tags).await {
            Lookup::Found(states, entry) => (states, entry),
            Lookup::Bypass => return fetch.await,
        };
        let hit = entry
            .filter(|e| fits(e, &states, moment) && !self.cache.changed_after(&tags, e.as_of))
            .and_then(|e| unwrap(&e.answer));
        if let Some(min_hits) = min_hits {
            worth.record(hit.is_some(), min_hits);
        }
        if let Some(answer) = hit {
            self.cache.hit();
            return Ok(answer);
        }
        self.cache.miss();
        let started = now_millis();
        let answer = fetch.await?;
        // the epoch (the last state) is not a write: its moment says nothing of the answer
        let changed_at = states[..states.len().saturating_sub(1)]
            .iter()
            .map(|s| s.changed_at)
            .max()
            .unwrap_or(0);
        let as_of = match moment {
            Moment::Latest => Some(started.max(changed_at)),
            // an answer as of `t` is the latest only if no write after `t` is known
            Moment::Recent(t) => (changed_at <= t).then_some(t),
            Moment::Past(t) => Some(t),
        };
        // a replica must have applied what the tags have seen (for a past moment: the moment):
        // every commit up to when the tags were last advanced, not only up to the writes'
        // stamps, which precede their commits
        let needed = match moment {
            Moment::Past(t) => t,
            _ => states[..states.len().saturating_sub(1)]
                .iter()
                .map(TagState::committed_by)
                .max()
                .unwrap_or(0),
        };
        let applied = self.inner.applied_through().is_none_or(|a| a >= needed);
        match (as_of, applied, wrap(&answer)) {
            (Some(as_of), true, Some(cached)) => {
                let entry = Entry {
                    generations: states.iter().map(|s| s.generation).collect(),
                    epoch_at: states.last().map_or(0, |e| e.changed_at),
                    as_of,
                    answer: cached,
                };
                self.cache.store(key, entry);
            }
            _ => self.cache.unfilled(),
        }
        Ok(answer)
    }

    fn document(&self, id: &str) -> TagRef {
        self.cache.tags().document(self.entity, id)
    }

    /// What a search's answer depends on: the one document it names when its template is an
    /// equality on the id alone (`{"id": "{{id}}"}`: a getById), else every document of the
    /// entity.
    fn search_tags(&self, template: &QueryTemplate, args: &BoundArgs) -> Vec<TagRef> {
        if let TemplateKind::Filter(predicates) = &template.kind {
            if let [(FieldPath::Id, value)] = predicates.as_slice() {
                if let serde_json::Value::String(id) = value.bind(args) {
                    return vec![self.document(&id)];
                }
            }
        }
        vec![TagRef::Entity(self.entity)]
    }

    /// A batch's: the documents its keys name when its template is an equality on the id
    /// bound to the key (a relationship to a parent by its id), for a bounded number of keys.
    fn batch_tags(&self, batch: &BatchSearch<'_>) -> Vec<TagRef> {
        const MAX_DOCUMENT_TAGS: usize = 64;
        if let TemplateKind::Filter(predicates) = &batch.template.kind {
            if let [(FieldPath::Id, ArgValue::Arg(arg))] = predicates.as_slice() {
                if arg == batch.key_arg && batch.keys.len() <= MAX_DOCUMENT_TAGS {
                    let mut tags: Vec<TagRef> =
                        batch.keys.iter().map(|k| self.document(k)).collect();
                    tags.sort_unstable_by_key(|t| match t {
                        TagRef::Document { stripe, .. } => *stripe,
                        _ => 0,
                    });
                    tags.dedup();
                    return tags;
                }
            }
        }
        vec![TagRef::Entity(self.entity)]
    }

    fn key(&self, op: Op, ctx: &ReadContext<'_>) -> Key {
        Key::new(&self.name, op.name(), ctx.filter)
    }
}

/// Whether `entry` answers a read at `moment` given its tags' current `states`.
fn fits(entry: &Entry, states: &[TagState], moment: Moment) -> bool {
    let current = entry.generations.len() == states.len()
        && states.last().map_or(0, |e| e.changed_at) == entry.epoch_at
        && entry
            .generations
            .iter()
            .zip(states)
            .all(|(g, s)| *g == s.generation);
    current
        && match moment {
            Moment::Latest | Moment::Past(_) => true,
            Moment::Recent(t) => t >= entry.as_of,
        }
}

#[async_trait]
impl StoreReader for CachedReader {
    async fn read(&self, id: &str, ctx: &ReadContext<'_>) -> Result<Option<Envelope>, StoreError> {
        // "not found" is cached too, under the document's tag, as a search by id's empty
        // answer is: an id is named to the cache by every write that may create it. Ids the
        // engine generates are fresh (UUIDv7), so no read can have asked for one before its
        // create, whatever that create's outcome; ids chosen by the writer (processor outputs,
        // legacy mappings) are advanced on every outcome (`EntityService::apply_output`).
        self.through(
            Ask {
                op: Op::Read,
                key: self.key(Op::Read, ctx).part(id),
                tags: vec![self.document(id)],
                at: ctx.at,
            },
            self.inner.read(id, ctx),
            |found| {
                Some(match found {
                    Some(e) => Answer::One(e.clone()),
                    None => Answer::Absent,
                })
            },
            |a| match a {
                Answer::One(e) => Some(Some(e.clone())),
                Answer::Absent => Some(None),
                _ => None,
            },
        )
        .await
    }

    async fn read_many(
        &self,
        ids: &[String],
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Envelope>, StoreError> {
        let key = self
            .key(Op::ReadMany, ctx)
            .part(serde_json::to_string(ids).expect("ids serialise"));
        self.through(
            Ask {
                op: Op::ReadMany,
                key,
                tags: vec![TagRef::Entity(self.entity)],
                at: ctx.at,
            },
            self.inner.read_many(ids, ctx),
            |v| Some(Answer::Envelopes(v.clone())),
            |a| match a {
                Answer::Envelopes(v) => Some(v.clone()),
                _ => None,
            },
        )
        .await
    }

    async fn list(&self, ctx: &ReadContext<'_>) -> Result<Vec<Envelope>, StoreError> {
        self.through(
            Ask {
                op: Op::List,
                key: self.key(Op::List, ctx),
                tags: vec![TagRef::Entity(self.entity)],
                at: ctx.at,
            },
            self.inner.list(ctx),
            |v| Some(Answer::Envelopes(v.clone())),
            |a| match a {
                Answer::Envelopes(v) => Some(v.clone()),
                _ => None,
            },
        )
        .await
    }

    async fn list_page(
        &self,
        after: Option<&str>,
        limit: usize,
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Envelope>, StoreError> {
        let key = self
            .key(Op::ListPage, ctx)
            .part(format_args!("{after:?}"))
            .part(limit);
        self.through(
            Ask {
                op: Op::ListPage,
                key,
                tags: vec![TagRef::Entity(self.entity)],
                at: ctx.at,
            },
            self.inner.list_page(after, limit, ctx),
            |v| Some(Answer::Envelopes(v.clone())),
            |a| match a {
                Answer::Envelopes(v) => Some(v.clone()),
                _ => None,
            },
        )
        .await
    }

    /// Not cached: the whole history of one document, read rarely.
    async fn versions(&self, id: &str) -> Result<Vec<Envelope>, StoreError> {
        self.inner.versions(id).await
    }

    async fn find(
        &self,
        search: &Search<'_>,
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Row>, StoreError> {
        self.through(
            Ask {
                op: Op::Find,
                key: self.key(Op::Find, ctx).search(search),
                tags: self.search_tags(search.template, search.args),
                at: ctx.at,
            },
            self.inner.find(search, ctx),
            |v| Some(Answer::Rows(v.clone())),
            |a| match a {
                Answer::Rows(v) => Some(v.clone()),
                _ => None,
            },
        )
        .await
    }

    async fn find_batch(
        &self,
        batch: &BatchSearch<'_>,
        ctx: &ReadContext<'_>,
    ) -> Result<KeyedRows, StoreError> {
        self.through(
            Ask {
                op: Op::Batch,
                key: self.key(Op::Batch, ctx).batch(batch),
                tags: self.batch_tags(batch),
                at: ctx.at,
            },
            self.inner.find_batch(batch, ctx),
            |v| Some(Answer::Keyed(v.clone())),
            |a| match a {
                Answer::Keyed(v) => Some(v.clone()),
                _ => None,
            },
        )
        .await
    }

    async fn find_nested(
        &self,
        search: &Search<'_>,
        nested: &[Nested],
        ctx: &ReadContext<'_>,
    ) -> Result<Option<Vec<NestedRow>>, StoreError> {
        let Some(key) = self.key(Op::Nested, ctx).search(search).nested(nested) else {
            return self.inner.find_nested(search, nested, ctx).await;
        };
        let mut entities = Vec::new();
        nested_entities(nested, &mut entities);
        let mut tags = self.search_tags(search.template, search.args);
        for e in entities {
            match self.cache.tags().entity(e) {
                Some(i) if !tags.contains(&TagRef::Entity(i)) => tags.push(TagRef::Entity(i)),
                Some(_) => {}
                None => return self.inner.find_nested(search, nested, ctx).await,
            }
        }
        self.through(
            Ask {
                op: Op::Nested,
                key,
                tags,
                at: ctx.at,
            },
            self.inner.find_nested(search, nested, ctx),
            |v| v.clone().map(Answer::Nested),
            |a| match a {
                Answer::Nested(v) => Some(Some(v.clone())),
                _ => None,
            },
        )
        .await
    }

    fn relation(&self) -> Option<Relation> {
        self.inner.relation()
    }

    fn applied_through(&self) -> Option<Millis> {
        self.inner.applied_through()
    }

    fn cached_entity(&self) -> Option<&str> {
        Some(&self.name)
    }

    /// The reader behind has the version, and the cache has seen a change of the document at
    /// least as new (its own write, or the change feed's), so no answer it serves is older.
    /// The document's tag, not the entity's: the feed brings changes in commit order, so
    /// another document's write stamped later may arrive before this one.
    async fn has_version(&self, id: &str, stamp: Millis) -> Result<bool, StoreError> {
        if self.cache.tags().state(self.document(id)).changed_at < stamp {
            return Ok(false);
        }
        self.inner.has_version(id, stamp).await
    }
}
