//! Permissions: what a caller may do with each entity (read, create, update, delete) and
//! which fields of what it reads it may see.
//!
//! Identity ([`crate::Authorizer`]) says who is asking: the [`Caller`], with the tokens that
//! filter rows, its subject and its roles. A [`Policy`] turns a caller into [`Grants`]: per
//! entity, the [`Action`]s allowed and a [`Mask`] of the fields it may read. The engine
//! consults the grants before every storage call, and every frontend (REST, GraphQL roots
//! and relationships, the change feed) reads them from the same place, so a decision is made
//! once per request and applied identically everywhere. Row filtering by authorized tokens
//! is separate and applies on top: an allowed read still sees only the documents its tokens
//! admit.
//!
//! A service without permissions uses [`AllowAll`]: every caller may do everything (as
//! before permissions existed).

use serde_json::{Map, Value};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// An operation on an entity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    Read,
    Create,
    Update,
    Delete,
}

impl Action {
    pub const ALL: [Action; 4] = [Action::Read, Action::Create, Action::Update, Action::Delete];

    /// The name used in configs and Casbin policies.
    pub fn name(self) -> &'static str {
        match self {
            Action::Read => "read",
            Action::Create => "create",
            Action::Update => "update",
            Action::Delete => "delete",
        }
    }

    /// The action of a name in [`Action::name`]'s spelling.
    pub fn parse(name: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.name() == name)
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A set of actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Actions(u8);

impl Actions {
    pub const NONE: Actions = Actions(0);
    pub const ALL: Actions = Actions(0b1111);

    pub fn of(actions: impl IntoIterator<Item = Action>) -> Actions {
        Actions(actions.into_iter().fold(0, |bits, a| bits | a.bit()))
    }

    pub fn contains(self, action: Action) -> bool {
        self.0 & action.bit() != 0
    }

    pub fn with(self, action: Action) -> Actions {
        Actions(self.0 | action.bit())
    }

    pub fn union(self, other: Actions) -> Actions {
        Actions(self.0 | other.0)
    }
}

/// Which top-level payload fields a caller may read. `id` is always visible (it is the
/// document's key, in URLs and relationships).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Mask {
    /// Every field.
    All,
    /// Every field except these.
    Hide(BTreeSet<String>),
    /// Only these fields.
    Only(BTreeSet<String>),
}

impl Mask {
    /// Whether `field` is readable.
    pub fn allows(&self, field: &str) -> bool {
        match self {
            Mask::All => true,
            Mask::Hide(hidden) => field == "id" || !hidden.contains(field),
            Mask::Only(shown) => field == "id" || shown.contains(field),
        }
    }

    pub fn is_all(&self) -> bool {
        matches!(self, Mask::All)
    }

    /// What a caller holding both masks sees: a field visible through either.
    pub fn union(&self, other: &Mask) -> Mask {
        match (self, other) {
            (Mask::All, _) | (_, Mask::All) => Mask::All,
            (Mask::Hide(a), Mask::Hide(b)) => hide(a.intersection(b).cloned().collect()),
            (Mask::Only(a), Mask::Only(b)) => Mask::Only(a.union(b).cloned().collect()),
            (Mask::Hide(h), Mask::Only(o)) | (Mask::Only(o), Mask::Hide(h)) => {
                hide(h.difference(o).cloned().collect())
            }
        }
    }

    /// Removes the fields this mask hides from `payload`.
    pub fn apply(&self, payload: &mut Map<String, Value>) {
        if !self.is_all() {
            payload.retain(|k, _| self.allows(k));
        }
    }

    /// A stored payload's JSON text with the hidden fields removed (the text itself when
    /// nothing is hidden, or when it is not a JSON object).
    pub fn apply_text(&self, payload: String) -> String {
        if self.is_all() {
            return payload;
        }
        match serde_json::from_str::<Map<String, Value>>(&payload) {
            Ok(mut map) => {
                self.apply(&mut map);
                serde_json::to_string(&map).expect("JSON serialises")
            }
            Err(_) => payload,
        }
    }
}

fn hide(fields: BTreeSet<String>) -> Mask {
    if fields.is_empty() {
        Mask::All
    } else {
        Mask::Hide(fields)
    }
}

/// What a caller may do with one entity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub actions: Actions,
    /// The readable fields (meaningful when `actions` holds [`Action::Read`]).
    pub mask: Arc<Mask>,
}

impl Grant {
    /// Everything, every field.
    pub fn full() -> Grant {
        Grant {
            actions: Actions::ALL,
            mask: Arc::new(Mask::All),
        }
    }

    /// Nothing.
    pub fn none() -> Grant {
        Grant {
            actions: Actions::NONE,
            mask: Arc::new(Mask::All),
        }
    }

    pub fn allows(&self, action: Action) -> bool {
        self.actions.contains(action)
    }
}

/// What one caller may do, per entity: decided once per request by a [`Policy`] (usually
/// taken from its cache) and shared by every frontend the request touches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grants {
    /// `None`: everything is allowed on every entity ([`AllowAll`]).
    entities: Option<HashMap<String, Grant>>,
    /// For an entity missing from `entities`.
    otherwise: Grant,
}

impl Grants {
    /// Everything on every entity.
    pub fn unrestricted() -> Grants {
        Grants {
            entities: None,
            otherwise: Grant::full(),
        }
    }

    /// These grants per entity; entities not named get `otherwise`.
    pub fn new(entities: HashMap<String, Grant>, otherwise: Grant) -> Grants {
        Grants {
            entities: Some(entities),
            otherwise,
        }
    }

    /// Whether nothing is denied and nothing hidden anywhere (frontends may take shortcuts,
    /// such as one SQL statement for a whole nested query).
    pub fn is_unrestricted(&self) -> bool {
        match &self.entities {
            None => true,
            Some(entities) => {
                let full = Grant::full();
                entities.values().all(|g| *g == full) && self.otherwise == full
            }
        }
    }

    /// The grant of `entity`.
    pub fn entity(&self, entity: &str) -> &Grant {
        self.entities
            .as_ref()
            .and_then(|e| e.get(entity))
            .unwrap_or(&self.otherwise)
    }

    pub fn allows(&self, entity: &str, action: Action) -> bool {
        self.entity(entity).allows(action)
    }

    /// The readable fields of `entity`.
    pub fn mask(&self, entity: &str) -> &Arc<Mask> {
        &self.entity(entity).mask
    }
}

/// Who is asking, as a policy sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Principal {
    /// The verified subject (`sub`); `None` for a caller without a token.
    pub subject: Option<String>,
    /// The caller's roles (from a token claim), in the token's order.
    pub roles: Vec<String>,
}

/// Decides what callers may do.
///
/// Called once per request, on the request's task: implementations must be quick (cache
/// what is slow to decide) and must not block.
pub trait Policy: Send + Sync + 'static {
    fn grants(&self, principal: &Principal) -> Arc<Grants>;

    /// Whether every caller may do everything (no per-request work needed).
    fn allows_everything(&self) -> bool {
        false
    }
}

/// Every caller may do everything: the policy of a service without permissions.
#[derive(Debug, Clone)]
pub struct AllowAll(Arc<Grants>);

impl Default for AllowAll {
    fn default() -> Self {
        AllowAll(Arc::new(Grants::unrestricted()))
    }
}

impl AllowAll {
    /// The shared unrestricted grants.
    pub fn grants(&self) -> Arc<Grants> {
        self.0.clone()
    }
}

impl Policy for AllowAll {
    fn grants(&self, _principal: &Principal) -> Arc<Grants> {
        self.0.clone()
    }

    fn allows_everything(&self) -> bool {
        true
    }
}

impl Grants {
    /// The read decision for one entity, the one every read path takes: `Ok(None)` every
    /// field; `Ok(Some(mask))` the fields `mask` shows; [`Forbidden`] when the caller may not
    /// read the entity at all.
    pub fn read_view(&self, entity: &str) -> Result<Option<Arc<Mask>>, Forbidden> {
        if self.is_unrestricted() {
            return Ok(None);
        }
        if !self.allows(entity, Action::Read) {
            return Err(Forbidden {
                entity: entity.to_owned(),
                action: Action::Read,
            });
        }
        let mask = self.mask(entity);
        Ok((!mask.is_all()).then(|| mask.clone()))
    }
}

/// Why an action was refused ([`crate::ErrorKind::Forbidden`], code `FORBIDDEN`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not allowed to {action} {entity}", action = .action.name())]
pub struct Forbidden {
    pub entity: String,
    pub action: Action,
}

impl Forbidden {
    pub fn kind(&self) -> crate::ErrorKind {
        crate::ErrorKind::Forbidden
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(fields: &[&str]) -> BTreeSet<String> {
        fields.iter().map(|f| f.to_string()).collect()
    }

    #[test]
    fn masks_combine_as_a_union_of_what_each_shows() {
        let hide_ab = Mask::Hide(set(&["a", "b"]));
        let hide_bc = Mask::Hide(set(&["b", "c"]));
        let only_ab = Mask::Only(set(&["a", "b"]));
        let only_c = Mask::Only(set(&["c"]));
        assert_eq!(hide_ab.union(&hide_bc), Mask::Hide(set(&["b"])));
        assert_eq!(only_ab.union(&only_c), Mask::Only(set(&["a", "b", "c"])));
        assert_eq!(hide_ab.union(&only_ab), Mask::All);
        assert_eq!(hide_bc.union(&only_ab), Mask::Hide(set(&["c"])));
        assert_eq!(Mask::All.union(&only_c), Mask::All);
        assert!(only_c.allows("id") && only_c.allows("c") && !only_c.allows("a"));
        assert!(hide_ab.allows("id") && !hide_ab.allows("a") && hide_ab.allows("z"));
    }

    #[test]
    fn masks_apply_to_payload_text() {
        let mask = Mask::Hide(set(&["secret"]));
        assert_eq!(
            mask.apply_text(r#"{"id":"1","name":"x","secret":"s"}"#.into()),
            r#"{"id":"1","name":"x"}"#
        );
        let only = Mask::Only(set(&["name"]));
        assert_eq!(
            only.apply_text(r#"{"id":"1","name":"x","secret":"s"}"#.into()),
            r#"{"id":"1","name":"x"}"#
        );
        assert_eq!(Mask::All.apply_text("{\"a\":1}".into()), "{\"a\":1}");
    }

    #[test]
    fn grants_per_entity() {
        let mut entities = HashMap::new();
        entities.insert(
            "farm".to_owned(),
            Grant {
                actions: Actions::of([Action::Read]),
                mask: Arc::new(Mask::All),
            },
        );
        let g = Grants::new(entities, Grant::none());
        assert!(g.allows("farm", Action::Read));
        assert!(!g.allows("farm", Action::Create));
        assert!(!g.allows("hen", Action::Read));
        assert!(!g.is_unrestricted());
        assert!(Grants::unrestricted().is_unrestricted());
        assert_eq!(Action::parse("update"), Some(Action::Update));
        assert_eq!(Action::parse("write"), None);
        let e = Forbidden {
            entity: "farm".into(),
            action: Action::Create,
        };
        assert_eq!(e.to_string(), "not allowed to create farm");
        assert_eq!(e.kind(), crate::ErrorKind::Forbidden);
    }
}
