//! Permission policies: what a caller's roles (or a Casbin policy) allow per entity.
//!
//! * [`RolePolicy`] (`[entity.permissions.<role>]` tables): a caller may do an action on an
//!   entity when one of its roles grants it; it sees a field when one of the roles that grant
//!   it `read` shows it. An entity without a table allows everything to everyone. The roles
//!   come from the token's `auth.roles_claim`; [`EVERYONE`] names every caller and
//!   [`ANONYMOUS`] callers without a token.
//! * [`CasbinPolicy`] (`auth.type = "casbin"`): actions are the `casbin` crate's
//!   `enforce(subject, entity, action)` on the model and policy files (`p` lines, with the
//!   RBAC `g` lines); a caller without a token is the subject [`ANONYMOUS`]. Field masks come
//!   from the entity's permissions tables, by role.
//!
//! Enforcing through Casbin evaluates the model's matcher (an embedded script engine) for
//! every policy line: microseconds per call. Neither policy decides on the request path
//! more than once per caller: the [`Grants`] of a caller (every entity, every action) are
//! computed on its first request and kept in a bounded cache ([`GrantCache`]) keyed by what
//! the decision depends on (the subject for Casbin, the role set for roles), so a request
//! costs one hash lookup.

use casbin::{CoreApi, DefaultModel, Enforcer, MgmtApi, StringAdapter};
use meshql_core::{Action, Actions, Grant, Grants, Mask, Policy, Principal};
use parking_lot::RwLock;
use std::collections::HashSet;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// The role every caller has, with or without a token.
pub const EVERYONE: &str = "*";
/// The role (and, for Casbin, the subject) of a caller without a token.
pub const ANONYMOUS: &str = "anonymous";

/// What one role may do with one entity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolePermission {
    pub actions: Actions,
    /// The fields it reads (with `read`).
    pub mask: Mask,
}

/// Per entity, per role (the tables of a config). Entities not named allow everything.
pub type PermissionTables = BTreeMap<String, BTreeMap<String, RolePermission>>;

/// Callers' [`Grants`], by a key naming what decided them; at most `2 × capacity` entries.
///
/// Two generations: lookups read the current one, then the previous (an entry found there
/// moves up); when the current one is full it becomes the previous and the older one is
/// dropped. So the callers seen recently stay, and memory is bounded whatever the number of
/// distinct subjects.
pub struct GrantCache {
    capacity: usize,
    /// (current, previous)
    generations: RwLock<(Generation, Generation)>,
}

type Generation = HashMap<String, Arc<Grants>>;

/// Entries per generation of a [`GrantCache`].
pub const GRANT_CACHE_CAPACITY: usize = 4096;

impl GrantCache {
    pub fn new(capacity: usize) -> GrantCache {
        GrantCache {
            capacity: capacity.max(1),
            generations: RwLock::new((HashMap::new(), HashMap::new())),
        }
    }

    /// The grants cached under `key`, or `decide()`'s (then cached).
    pub fn get_or_insert(&self, key: &str, decide: impl FnOnce() -> Grants) -> Arc<Grants> {
        if let Some(g) = self.generations.read().0.get(key) {
            return g.clone();
        }
        let found = self.generations.read().1.get(key).cloned();
        let grants = found.unwrap_or_else(|| Arc::new(decide()));
        let mut generations = self.generations.write();
        if generations.0.len() >= self.capacity {
            let current = std::mem::take(&mut generations.0);
            generations.1 = current;
        }
        generations.0.insert(key.to_owned(), grants.clone());
        grants
    }

    /// Entries held (both generations).
    pub fn len(&self) -> usize {
        let g = self.generations.read();
        g.0.len() + g.1.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The names a caller's role rows may be listed under: its roles, [`EVERYONE`], and
/// [`ANONYMOUS`] without a token.
fn names_of(principal: &Principal) -> impl Iterator<Item = &str> {
    principal
        .roles
        .iter()
        .map(String::as_str)
        .chain(std::iter::once(EVERYONE))
        .chain(principal.subject.is_none().then_some(ANONYMOUS))
}

/// The cache key of a role set: sorted, de-duplicated, `\0`-separated, with a mark for
/// anonymous callers.
fn roles_key(principal: &Principal) -> String {
    let mut roles: Vec<&str> = principal.roles.iter().map(String::as_str).collect();
    roles.sort_unstable();
    roles.dedup();
    let mut key = String::from(if principal.subject.is_none() {
        "a"
    } else {
        "s"
    });
    for r in roles {
        key.push('\0');
        key.push_str(r);
    }
    key
}

/// Permissions from `[entity.permissions.<role>]` tables and the caller's roles.
pub struct RolePolicy {
    tables: PermissionTables,
    cache: GrantCache,
}

impl RolePolicy {
    pub fn new(tables: PermissionTables) -> RolePolicy {
        RolePolicy {
            tables,
            cache: GrantCache::new(GRANT_CACHE_CAPACITY),
        }
    }

    fn decide(&self, principal: &Principal) -> Grants {
        let mut entities = HashMap::new();
        for (entity, roles) in &self.tables {
            let mut actions = Actions::NONE;
            let mut mask: Option<Mask> = None;
            for name in names_of(principal) {
                let Some(p) = roles.get(name) else { continue };
                actions = actions.union(p.actions);
                if p.actions.contains(Action::Read) {
                    mask = Some(match mask {
                        None => p.mask.clone(),
                        Some(m) => m.union(&p.mask),
                    });
                }
            }
            entities.insert(
                entity.clone(),
                Grant {
                    actions,
                    mask: Arc::new(mask.unwrap_or(Mask::All)),
                },
            );
        }
        Grants::new(entities, Grant::full())
    }
}

impl Policy for RolePolicy {
    fn grants(&self, principal: &Principal) -> Arc<Grants> {
        self.cache
            .get_or_insert(&roles_key(principal), || self.decide(principal))
    }
}

/// Permissions from a Casbin model and policy (`p` lines enforced), with field masks by role.
pub struct CasbinPolicy {
    enforcer: Enforcer,
    entities: Vec<String>,
    /// Per entity, per role (or subject): the fields shown.
    masks: BTreeMap<String, BTreeMap<String, Mask>>,
    /// Whether `p` lines decide actions (else every action is allowed: MeshQL's use of
    /// Casbin, roles only).
    enforce: bool,
    /// When decisions depend on a subject only through its roles (see [`role_keyed`]): the
    /// subjects that `p` lines name themselves, which keep a decision of their own.
    role_keyed: Option<HashSet<String>>,
    cache: GrantCache,
}

/// Whether a Casbin model and policy decide a subject only through its roles, so that
/// subjects with the same roles share one decision (one cache entry, computed once) instead
/// of each paying its own enforces: the matcher mentions `r.sub` only in `g(r.sub, p.sub)`,
/// and no role is itself given a role (the roles of a subject are then exactly its `g`
/// lines, the roles meshql already knows). Subjects named by `p` lines are excepted.
fn role_keyed(model: &str, enforcer: &Enforcer) -> Option<HashSet<String>> {
    let matcher: String = model
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with('m') && l[1..].trim_start().starts_with('='))
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let uses = matcher.matches("r.sub").count();
    if uses == 0 || uses != matcher.matches("g(r.sub,p.sub)").count() {
        return None;
    }
    let grouping = enforcer.get_grouping_policy();
    let users: HashSet<&str> = grouping
        .iter()
        .filter_map(|g| g.first())
        .map(String::as_str)
        .collect();
    if grouping
        .iter()
        .filter_map(|g| g.get(1))
        .any(|role| users.contains(role.as_str()))
    {
        return None;
    }
    Some(enforcer.get_all_subjects().into_iter().collect())
}

impl CasbinPolicy {
    /// `false`: the policy's `p` lines are not enforced (every action allowed); its roles
    /// still select field masks.
    pub fn enforcing(mut self, enforce: bool) -> Self {
        self.enforce = enforce;
        self
    }

    /// An enforcer on the model and policy texts (read by the config loader), deciding for
    /// `entities`.
    pub async fn new(
        model: &str,
        policy: &str,
        entities: Vec<String>,
        masks: BTreeMap<String, BTreeMap<String, Mask>>,
    ) -> Result<CasbinPolicy, String> {
        let model_text = model;
        let model = DefaultModel::from_str(model_text)
            .await
            .map_err(|e| format!("Casbin model: {e}"))?;
        let enforcer = Enforcer::new(model, StringAdapter::new(policy))
            .await
            .map_err(|e| format!("Casbin policy: {e}"))?;
        Ok(CasbinPolicy {
            role_keyed: role_keyed(model_text, &enforcer),
            enforcer,
            entities,
            masks,
            enforce: true,
            cache: GrantCache::new(GRANT_CACHE_CAPACITY),
        })
    }

    /// [`CasbinPolicy::new`] without a runtime (the enforcer reads only the strings given):
    /// for `meshql check`.
    pub fn load(
        model: &str,
        policy: &str,
        entities: Vec<String>,
        masks: BTreeMap<String, BTreeMap<String, Mask>>,
    ) -> Result<CasbinPolicy, String> {
        futures::executor::block_on(Self::new(model, policy, entities, masks))
    }

    /// The enforcer's answer for one request (uncached: what [`Policy::grants`] caches).
    pub fn enforce(&self, subject: &str, entity: &str, action: Action) -> Result<bool, String> {
        self.enforcer
            .enforce((subject, entity, action.name()))
            .map_err(|e| e.to_string())
    }

    fn decide(&self, principal: &Principal) -> Grants {
        let subject = principal.subject.as_deref().unwrap_or(ANONYMOUS);
        let mut entities = HashMap::new();
        for entity in &self.entities {
            let actions = Actions::of(Action::ALL.into_iter().filter(|a| {
                !self.enforce || self.enforce(subject, entity, *a).unwrap_or_else(|e| {
                    tracing::error!(subject, entity, action = a.name(), error = %e, "Casbin enforce failed: denied");
                    false
                })
            }));
            let mask = self.masks.get(entity).and_then(|by_name| {
                names_of(principal)
                    .chain(principal.subject.as_deref())
                    .filter_map(|n| by_name.get(n))
                    .fold(None, |acc: Option<Mask>, m| {
                        Some(acc.map_or_else(|| m.clone(), |a| a.union(m)))
                    })
            });
            entities.insert(
                entity.clone(),
                Grant {
                    actions,
                    mask: Arc::new(mask.unwrap_or(Mask::All)),
                },
            );
        }
        Grants::new(entities, Grant::none())
    }
}

impl Policy for CasbinPolicy {
    fn grants(&self, principal: &Principal) -> Arc<Grants> {
        // the roles are the subject's (from the policy's `g` lines): the subject decides,
        // or, where only its roles can matter, its role set
        let key = match (&principal.subject, &self.role_keyed) {
            (Some(s), Some(own)) if !own.contains(s) => format!("r{}", roles_key(principal)),
            (Some(s), _) => format!("s{s}"),
            (None, _) => "a".to_owned(),
        };
        self.cache.get_or_insert(&key, || self.decide(principal))
    }
}

/// The roles at a dotted `path` of a token's claims: a string (one role, or several separated
/// by spaces or commas, as in OAuth's `scope`) or an array of strings; anything else is none.
pub fn roles_at(
    claims: &serde_json::Map<String, serde_json::Value>,
    path: &[String],
) -> Vec<String> {
    let mut value = None;
    let mut map = Some(claims);
    for key in path {
        value = map.and_then(|m| m.get(key));
        map = value.and_then(|v| v.as_object());
    }
    match value {
        Some(serde_json::Value::String(s)) => s
            .split([' ', ','])
            .filter(|r| !r.is_empty())
            .map(str::to_owned)
            .collect(),
        Some(serde_json::Value::Array(items)) => items
            .iter()
            .filter_map(|i| i.as_str())
            .filter(|r| !r.is_empty())
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::time::Instant;

    const MODEL: &str = "[request_definition]\nr = sub, obj, act\n[policy_definition]\np = sub, obj, act\n[role_definition]\ng = _, _\n[policy_effect]\ne = some(where (p.eft == allow))\n[matchers]\nm = g(r.sub, p.sub) && r.obj == p.obj && r.act == p.act\n";

    fn principal(subject: Option<&str>, roles: &[&str]) -> Principal {
        Principal {
            subject: subject.map(str::to_owned),
            roles: roles.iter().map(|r| r.to_string()).collect(),
        }
    }

    fn fields(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    fn tables() -> PermissionTables {
        let mut farm = BTreeMap::new();
        farm.insert(
            "reader".to_owned(),
            RolePermission {
                actions: Actions::of([Action::Read]),
                mask: Mask::Hide(fields(&["zone"])),
            },
        );
        farm.insert(
            "editor".to_owned(),
            RolePermission {
                actions: Actions::ALL,
                mask: Mask::All,
            },
        );
        farm.insert(
            ANONYMOUS.to_owned(),
            RolePermission {
                actions: Actions::of([Action::Read]),
                mask: Mask::Only(fields(&["name"])),
            },
        );
        let mut t = BTreeMap::new();
        t.insert("farm".to_owned(), farm);
        t
    }

    #[test]
    fn roles_grant_actions_and_masks() {
        let p = RolePolicy::new(tables());
        let reader = p.grants(&principal(Some("u"), &["reader"]));
        assert!(reader.allows("farm", Action::Read));
        assert!(!reader.allows("farm", Action::Create));
        assert!(!reader.mask("farm").allows("zone"));
        assert!(
            reader.allows("coop", Action::Delete),
            "no table: everything"
        );
        let both = p.grants(&principal(Some("u"), &["reader", "editor"]));
        assert!(both.allows("farm", Action::Delete));
        assert!(both.mask("farm").allows("zone"), "the editor sees it");
        let nobody = p.grants(&principal(Some("u"), &[]));
        assert!(!nobody.allows("farm", Action::Read));
        let anonymous = p.grants(&principal(None, &[]));
        assert!(anonymous.allows("farm", Action::Read));
        assert_eq!(**anonymous.mask("farm"), Mask::Only(fields(&["name"])));
        // one decision per role set
        let again = p.grants(&principal(Some("v"), &["editor", "reader", "reader"]));
        assert!(Arc::ptr_eq(&both, &again));
    }

    #[test]
    fn casbin_p_lines_decide() {
        let policy = "p, admin, farm, read\np, admin, farm, create\np, viewer, farm, read\np, alice, coop, delete\ng, alice, admin\ng, bob, viewer\np, anonymous, coop, read\n";
        let mut masks = BTreeMap::new();
        masks.insert(
            "farm".to_owned(),
            BTreeMap::from([("viewer".to_owned(), Mask::Hide(fields(&["zone"])))]),
        );
        let p =
            CasbinPolicy::load(MODEL, policy, vec!["farm".into(), "coop".into()], masks).unwrap();
        let alice = p.grants(&principal(Some("alice"), &["admin"]));
        assert!(alice.allows("farm", Action::Create) && alice.allows("farm", Action::Read));
        assert!(!alice.allows("farm", Action::Delete));
        assert!(alice.allows("coop", Action::Delete) && !alice.allows("coop", Action::Read));
        assert!(alice.mask("farm").is_all());
        let bob = p.grants(&principal(Some("bob"), &["viewer"]));
        assert!(bob.allows("farm", Action::Read) && !bob.allows("farm", Action::Create));
        assert!(!bob.mask("farm").allows("zone"));
        let stranger = p.grants(&principal(Some("eve"), &[]));
        assert!(!stranger.allows("farm", Action::Read));
        // subjects with the same roles share one decision; alice has a `p` line of her own
        let carl = p.grants(&principal(Some("carl"), &["viewer"]));
        assert!(Arc::ptr_eq(&bob, &carl));
        let ann = p.grants(&principal(Some("ann"), &["admin"]));
        assert!(
            !ann.allows("coop", Action::Delete),
            "alice's own line is hers"
        );
        assert!(!Arc::ptr_eq(&alice, &ann));
        let anonymous = p.grants(&principal(None, &[]));
        assert!(anonymous.allows("coop", Action::Read) && !anonymous.allows("farm", Action::Read));
        assert!(
            !anonymous.allows("hen", Action::Read),
            "not an entity of the policy"
        );
    }

    #[test]
    fn decisions_are_shared_by_role_only_when_roles_alone_decide() {
        let policy = "p, admin, farm, read\ng, alice, admin\n";
        let load = |model: &str, policy: &str| {
            CasbinPolicy::load(model, policy, vec!["farm".into()], BTreeMap::new()).unwrap()
        };
        assert!(load(MODEL, policy).role_keyed.is_some());
        let by_name = MODEL.replace("r.act == p.act", "r.act == p.act || r.sub == \"root\"");
        assert!(load(&by_name, policy).role_keyed.is_none());
        let hierarchy = format!("{policy}g, admin, staff\n");
        assert!(load(MODEL, &hierarchy).role_keyed.is_none());
    }

    #[test]
    fn the_cache_is_bounded() {
        let cache = GrantCache::new(4);
        for i in 0..100 {
            cache.get_or_insert(&i.to_string(), Grants::unrestricted);
        }
        assert!(cache.len() <= 8, "{}", cache.len());
        let mut decided = 0;
        cache.get_or_insert("99", || {
            decided += 1;
            Grants::unrestricted()
        });
        assert_eq!(decided, 0, "a recent caller stays");
    }

    #[test]
    fn roles_claims_at_a_dotted_path() {
        let claims: serde_json::Map<String, serde_json::Value> = serde_json::from_value(
            serde_json::json!({"realm_access": {"roles": ["a", "b", 3]}, "scope": "x y,z", "n": 1}),
        )
        .unwrap();
        let path = |p: &str| p.split('.').map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(roles_at(&claims, &path("realm_access.roles")), ["a", "b"]);
        assert_eq!(roles_at(&claims, &path("scope")), ["x", "y", "z"]);
        assert!(roles_at(&claims, &path("n")).is_empty());
        assert!(roles_at(&claims, &path("realm_access.nope")).is_empty());
        assert!(roles_at(&claims, &path("scope.deeper")).is_empty());
    }

    /// Not a timing assertion: prints what a decision costs uncached (one Casbin enforce)
    /// and what a request pays (the cached lookup), for docs/SECURITY.md.
    #[test]
    fn what_a_permission_decision_costs() {
        let mut policy = String::new();
        let entities: Vec<String> = (0..13).map(|i| format!("entity{i}")).collect();
        for e in &entities {
            for a in ["read", "create", "update", "delete"] {
                policy.push_str(&format!("p, admin, {e}, {a}\np, viewer, {e}, read\n"));
            }
        }
        for u in 0..200 {
            policy.push_str(&format!(
                "g, user{u}, {}\n",
                if u % 2 == 0 { "admin" } else { "viewer" }
            ));
        }
        let p = CasbinPolicy::load(MODEL, &policy, entities.clone(), BTreeMap::new()).unwrap();
        let n = 2_000;
        let start = Instant::now();
        for i in 0..n {
            let _ = p.enforce(&format!("user{}", i % 200), &entities[i % 13], Action::Read);
        }
        let enforce = start.elapsed() / n as u32;
        let who = principal(Some("user7"), &["viewer"]);
        let _ = p.grants(&who);
        let start = Instant::now();
        for _ in 0..n {
            std::hint::black_box(p.grants(std::hint::black_box(&who)));
        }
        let cached = start.elapsed() / n as u32;
        let roles = RolePolicy::new(tables());
        let reader = principal(Some("u"), &["reader", "other"]);
        let _ = roles.grants(&reader);
        let start = Instant::now();
        for _ in 0..n {
            std::hint::black_box(roles.grants(std::hint::black_box(&reader)));
        }
        let by_roles = start.elapsed() / n as u32;
        println!(
            "one Casbin enforce (416 p lines, 200 g lines): {enforce:?}; a caller's first request (13 entities x 4 actions): ~{:?}; a cached request: {cached:?} (Casbin), {by_roles:?} (roles claim)",
            enforce * 52
        );
    }
}
