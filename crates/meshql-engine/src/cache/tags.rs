//! Tags: what a cached answer depends on, and the generation each tag is at.
//!
//! Every write advances two tags before it is acknowledged: its entity's (lists, searches
//! and relationship levels of the entity depend on it) and its document's (a read by id
//! depends on that alone). Documents share a fixed number of tags ([`STRIPES`], by hash of
//! the id), so the table is bounded whatever the number of documents; two documents on one
//! stripe only invalidate each other's reads by id, never serve a stale one. A tag also keeps
//! the newest stamp of the writes that advanced it (`changed_at`), which decides whether an
//! answer read as of a moment may be kept as the latest one, and when it was last advanced
//! (`advanced_at`, after the write committed), which decides whether a replica has applied
//! it: a write is stamped before it commits, by as long as its transaction takes, so a
//! replica known to have applied every commit up to a moment after the stamp may still lack
//! it.

use meshql_core::Millis;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// Document tags kept in process (a power of two).
pub const STRIPES: usize = 1 << 16;
/// Document tags kept in a shared cache per entity (a power of two; fewer keys there).
pub const SHARED_STRIPES: u32 = 1 << 12;

/// One tag of an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TagRef {
    /// Every answer about the entity (by index in the cache's entity list).
    Entity(u32),
    /// The answers about one stripe of the entity's documents.
    Document { entity: u32, stripe: u32 },
    /// Every answer in a shared cache (advanced when a process may have missed an update).
    Epoch,
}

/// A tag's generation, the newest stamp of the writes that advanced it, and the newest
/// moment it was advanced at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct TagState {
    pub generation: u64,
    pub changed_at: Millis,
    /// When it was last advanced: after the writes that advanced it had committed (0 when
    /// unknown: a shared cache's tag advanced by an older process).
    #[serde(default)]
    pub advanced_at: Millis,
}

impl TagState {
    /// A moment by which every write that advanced the tag had committed.
    pub fn committed_by(&self) -> Millis {
        self.advanced_at.max(self.changed_at)
    }
}

#[derive(Default)]
struct Tag {
    generation: AtomicU64,
    changed_at: AtomicI64,
    advanced_at: AtomicI64,
}

impl Tag {
    fn advance(&self, stamp: Millis, now: Millis) {
        self.changed_at.fetch_max(stamp, Ordering::AcqRel);
        self.advanced_at.fetch_max(now, Ordering::AcqRel);
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    fn state(&self) -> TagState {
        let generation = self.generation.load(Ordering::Acquire);
        TagState {
            generation,
            changed_at: self.changed_at.load(Ordering::Acquire),
            advanced_at: self.advanced_at.load(Ordering::Acquire),
        }
    }
}

/// The in-process tags of a cache's entities.
pub struct Tags {
    names: Vec<String>,
    index: HashMap<String, u32>,
    entities: Vec<Tag>,
    documents: Box<[Tag]>,
    epoch: Tag,
}

impl Tags {
    pub fn new(entities: impl IntoIterator<Item = String>) -> Tags {
        let names: Vec<String> = entities.into_iter().collect();
        let index = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i as u32))
            .collect();
        Tags {
            entities: names.iter().map(|_| Tag::default()).collect(),
            names,
            index,
            documents: (0..STRIPES).map(|_| Tag::default()).collect(),
            epoch: Tag::default(),
        }
    }

    pub fn entity(&self, name: &str) -> Option<u32> {
        self.index.get(name).copied()
    }

    pub fn entity_name(&self, entity: u32) -> &str {
        &self.names[entity as usize]
    }

    /// The tag of document `id` of `entity`.
    pub fn document(&self, entity: u32, id: &str) -> TagRef {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        entity.hash(&mut h);
        id.hash(&mut h);
        TagRef::Document {
            entity,
            stripe: (h.finish() as usize & (STRIPES - 1)) as u32,
        }
    }

    fn tag(&self, tag: TagRef) -> &Tag {
        match tag {
            TagRef::Entity(e) => &self.entities[e as usize],
            TagRef::Document { stripe, .. } => &self.documents[stripe as usize],
            TagRef::Epoch => &self.epoch,
        }
    }

    /// Advances the entity's tag and the tags of `ids`, with the writes' newest stamp (the
    /// writes have committed).
    pub fn advance<'a>(&self, entity: u32, ids: impl IntoIterator<Item = &'a str>, stamp: Millis) {
        let now = meshql_core::time::now_millis();
        for id in ids {
            self.tag(self.document(entity, id)).advance(stamp, now);
        }
        self.entities[entity as usize].advance(stamp, now);
    }

    pub fn advance_epoch(&self) {
        let now = meshql_core::time::now_millis();
        self.epoch.advance(now, now);
    }

    pub fn state(&self, tag: TagRef) -> TagState {
        self.tag(tag).state()
    }

    /// The name of `tag` in a shared cache.
    pub fn shared_name(&self, tag: TagRef) -> String {
        match tag {
            TagRef::Entity(e) => format!("e:{}", self.entity_name(e)),
            TagRef::Document { entity, stripe } => format!(
                "d:{}:{}",
                self.entity_name(entity),
                stripe & (SHARED_STRIPES - 1)
            ),
            TagRef::Epoch => "epoch".to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_advances_its_entity_and_its_document_only() {
        let tags = Tags::new(["hen".to_owned(), "coop".to_owned()]);
        let hen = tags.entity("hen").unwrap();
        let coop = tags.entity("coop").unwrap();
        let a = tags.document(hen, "a");
        let before = (tags.state(a), tags.state(TagRef::Entity(hen)));
        tags.advance(hen, ["a"], 42);
        assert_eq!(tags.state(a).generation, before.0.generation + 1);
        assert_eq!(tags.state(a).changed_at, 42);
        assert!(tags.state(a).advanced_at >= meshql_core::time::now_millis() - 1000);
        assert_eq!(
            tags.state(a).committed_by(),
            tags.state(a).advanced_at,
            "advanced after the write was stamped"
        );
        assert_eq!(tags.state(TagRef::Entity(hen)).generation, 1);
        assert_eq!(tags.state(TagRef::Entity(coop)).generation, 0);
        // an older stamp never moves changed_at back
        tags.advance(hen, ["a"], 7);
        assert_eq!(tags.state(a).changed_at, 42);
        assert_eq!(tags.state(a).generation, before.0.generation + 2);
    }

    #[test]
    fn a_documents_tag_is_the_same_for_the_same_id_and_bounded() {
        let tags = Tags::new(["hen".to_owned()]);
        assert_eq!(tags.document(0, "x"), tags.document(0, "x"));
        let TagRef::Document { stripe, .. } = tags.document(0, "y") else {
            panic!("a document tag")
        };
        assert!((stripe as usize) < STRIPES);
        assert!(tags
            .shared_name(tags.document(0, "y"))
            .starts_with("d:hen:"));
    }
}
