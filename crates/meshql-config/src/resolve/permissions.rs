//! Permissions (issue 11, item 5): `[entity.permissions.<role>]` tables, `auth.roles_claim`,
//! and with Casbin the policy's `p` lines, checked into a [`PermissionsSpec`].
//!
//! Errors name the file, line and field: an unknown action, a mask field the entity does not
//! have, `hidden_fields` with `fields`, a role no caller can ever have (no role source), a `p`
//! line naming an entity the service does not serve or an action meshql never asks about.
//! Without any permissions the service allows everything, as before.

use super::{AuthSpec, ResolvedEntity, Resolver};
use crate::model::{AuthConfig, AuthKind, PermissionConfig, ServiceConfig};
use meshql_auth::permissions::{PermissionTables, RolePermission, ANONYMOUS, EVERYONE};
use meshql_core::{Action, Actions, Mask};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// What decides permissions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PermissionsSpec {
    /// Nothing configured: every caller may do everything.
    None,
    /// `[entity.permissions.<role>]` tables; roles from `roles_claim` (split at dots).
    Roles {
        roles_claim: Option<String>,
        tables: PermissionTables,
    },
    /// The Casbin enforcer on the model and policy (`enforce`: its `p` lines decide actions;
    /// else everything is allowed), field masks by role.
    Casbin {
        model: String,
        policy: String,
        enforce: bool,
        masks: BTreeMap<String, BTreeMap<String, Mask>>,
    },
}

fn action_names() -> String {
    Action::ALL.map(Action::name).join(", ")
}

impl Resolver {
    /// Permissions of every entity, once `[auth]` is resolved.
    pub(super) fn resolve_permissions(
        &mut self,
        model: &ServiceConfig,
        entities: &[ResolvedEntity],
        auth: &AuthSpec,
    ) -> PermissionsSpec {
        let a = &model.auth;
        let kind = a.kind();
        let roles_claim = self.roles_claim(a, kind);
        let casbin = matches!(auth, AuthSpec::Casbin { .. });
        if let (Some(at), false) = (&a.enforce_policy, casbin) {
            self.warn(
                at,
                "auth.enforce_policy",
                "ignored: a Casbin policy is read only with type = \"casbin\"",
            );
        }
        let mut tables: PermissionTables = BTreeMap::new();
        let mut masks: BTreeMap<String, BTreeMap<String, Mask>> = BTreeMap::new();
        for entity in &model.entities {
            let Some(table) = &entity.permissions else {
                continue;
            };
            let name = entity.name.get_ref();
            let field = format!("entity \"{name}\" permissions");
            let Some(resolved) = entities.iter().find(|e| e.name == *name) else {
                continue;
            };
            let known = known_fields(resolved);
            if table.get_ref().is_empty() {
                self.error(
                    Some(table),
                    field.clone(),
                    "names no role: add `[entity.permissions.<role>]` tables, or remove it to allow everything",
                );
            }
            let mut roles = BTreeMap::new();
            for (role, p) in table.get_ref() {
                let rfield = format!("{field}.{role}");
                if role.is_empty() {
                    self.error(Some(p), rfield.clone(), "a role name cannot be empty");
                }
                if role != EVERYONE && role != ANONYMOUS && !casbin && roles_claim.is_none() {
                    self.error(
                        Some(p),
                        rfield.clone(),
                        format!(
                            "no caller can have role `{role}`: set `auth.roles_claim` (the token claim holding roles){}, or use `{EVERYONE}` (every caller) or `{ANONYMOUS}` (callers without a token)",
                            if kind == AuthKind::None { " with auth.type = \"jwt\"" } else { "" }
                        ),
                    );
                }
                let actions = self.actions(p.get_ref(), casbin, &rfield);
                let mask = self.mask(p.get_ref(), &known, &rfield);
                if casbin {
                    masks
                        .entry(name.clone())
                        .or_default()
                        .insert(role.clone(), mask);
                } else {
                    roles.insert(role.clone(), RolePermission { actions, mask });
                }
            }
            if !casbin {
                tables.insert(name.clone(), roles);
            }
        }
        match auth {
            AuthSpec::Casbin { files, .. } => {
                let lines = crate::casbin::permission_lines(&files.policy);
                let enforce = match &a.enforce_policy {
                    Some(e) => *e.get_ref(),
                    None => !lines.is_empty(),
                };
                if enforce {
                    self.check_policy_lines(&lines, entities, &files.policy_file);
                    if lines.is_empty() {
                        if let Some(at) = &a.enforce_policy {
                            self.warn(
                                at,
                                "auth.enforce_policy",
                                "the policy has no `p` line: every action is refused",
                            );
                        }
                    }
                }
                if let Err(e) = meshql_auth::permissions::CasbinPolicy::load(
                    &files.model,
                    &files.policy,
                    Vec::new(),
                    BTreeMap::new(),
                ) {
                    self.error_in(&files.model_file, None, "auth.model".into(), e);
                }
                PermissionsSpec::Casbin {
                    model: files.model.clone(),
                    policy: files.policy.clone(),
                    enforce,
                    masks,
                }
            }
            _ if tables.is_empty() => PermissionsSpec::None,
            _ => PermissionsSpec::Roles {
                roles_claim,
                tables,
            },
        }
    }

    /// `auth.roles_claim`, checked (read with `type = "jwt"` only).
    fn roles_claim(&mut self, a: &AuthConfig, kind: AuthKind) -> Option<String> {
        let at = a.roles_claim.as_ref()?;
        let path = at.get_ref();
        if kind == AuthKind::Casbin {
            self.warn(
                at,
                "auth.roles_claim",
                "ignored with type = \"casbin\": roles come from the policy's `g` lines",
            );
            return None;
        }
        if kind == AuthKind::None {
            return None;
        }
        if path.split('.').any(str::is_empty) {
            self.error(
                Some(at),
                "auth.roles_claim",
                format!(
                    "`{path}` is not a dotted claim path (e.g. `roles` or `realm_access.roles`)"
                ),
            );
        }
        Some(path.clone())
    }

    fn actions(&mut self, p: &PermissionConfig, casbin: bool, field: &str) -> Actions {
        let Some(list) = &p.actions else {
            if !casbin {
                return Actions::NONE;
            }
            return Actions::ALL;
        };
        if casbin {
            self.error(
                Some(list),
                format!("{field}.actions"),
                "with auth.type = \"casbin\" the policy's `p` lines decide actions; here a role can only have a field mask",
            );
            return Actions::NONE;
        }
        let mut actions = Actions::NONE;
        for (i, name) in list.get_ref().iter().enumerate() {
            match Action::parse(name.get_ref()) {
                Some(a) => actions = actions.with(a),
                None => self.error(
                    Some(name),
                    format!("{field}.actions[{i}]"),
                    format!(
                        "unknown action `{}` (known: {})",
                        name.get_ref(),
                        action_names()
                    ),
                ),
            }
        }
        actions
    }

    fn mask(
        &mut self,
        p: &PermissionConfig,
        known: &Option<BTreeSet<String>>,
        field: &str,
    ) -> Mask {
        if let (Some(_), Some(fields)) = (&p.hidden_fields, &p.fields) {
            self.error(
                Some(fields),
                format!("{field}.fields"),
                "give `hidden_fields` (fields it may not read) or `fields` (the only ones it may read), not both",
            );
            return Mask::All;
        }
        let (list, key) = match (&p.hidden_fields, &p.fields) {
            (Some(h), _) => (h, "hidden_fields"),
            (_, Some(f)) => (f, "fields"),
            _ => return Mask::All,
        };
        let mut names = BTreeSet::new();
        for (i, name) in list.get_ref().iter().enumerate() {
            let n = name.get_ref();
            let at = format!("{field}.{key}[{i}]");
            if n == "id" {
                if key == "hidden_fields" {
                    self.error(
                        Some(name),
                        at,
                        "`id` is always readable (it names the document)",
                    );
                }
                continue;
            }
            match known {
                Some(fields) if !fields.contains(n) => self.error(
                    Some(name),
                    at,
                    format!(
                        "unknown field `{n}` (the entity's GraphQL type and JSON Schema have: {})",
                        fields.iter().cloned().collect::<Vec<_>>().join(", ")
                    ),
                ),
                Some(_) => {}
                None => self.warn(
                    name,
                    at,
                    format!("cannot check field `{n}`: the entity has neither a GraphQL type nor JSON Schema properties"),
                ),
            }
            names.insert(n.clone());
        }
        if key == "hidden_fields" {
            if names.is_empty() {
                Mask::All
            } else {
                Mask::Hide(names)
            }
        } else {
            Mask::Only(names)
        }
    }

    /// Each `p` line must name an entity of this service (or a pattern with `*`) and an
    /// action meshql asks about (or `*`).
    fn check_policy_lines(
        &mut self,
        lines: &[crate::casbin::PermissionLine],
        entities: &[ResolvedEntity],
        policy_file: &Path,
    ) {
        let names: Vec<&str> = entities.iter().map(|e| e.name.as_str()).collect();
        for l in lines {
            let (Some(object), Some(action)) = (l.fields.get(1), l.fields.get(2)) else {
                self.error_in(
                    policy_file,
                    Some(l.line),
                    "auth.policy".into(),
                    "a permission line is `p, <subject or role>, <entity>, <action>`".into(),
                );
                continue;
            };
            if !object.contains('*') && !names.contains(&object.as_str()) {
                self.error_in(
                    policy_file,
                    Some(l.line),
                    "auth.policy".into(),
                    format!(
                        "unknown entity `{object}` (this service has: {}); set auth.enforce_policy = false to ignore `p` lines as MeshQL does",
                        names.join(", ")
                    ),
                );
            }
            if !action.contains('*') && Action::parse(action).is_none() {
                self.error_in(
                    policy_file,
                    Some(l.line),
                    "auth.policy".into(),
                    format!("unknown action `{action}` (known: {})", action_names()),
                );
            }
        }
    }
}

/// The fields an entity is known to have: its GraphQL type's and its JSON Schema's
/// properties (`None` when neither tells).
fn known_fields(entity: &ResolvedEntity) -> Option<BTreeSet<String>> {
    let mut known = BTreeSet::new();
    let mut told = false;
    if let Some(g) = &entity.graph {
        if let Some(t) = g.schema.get_object(g.entity_type.as_str()) {
            told = true;
            known.extend(t.fields.keys().map(|k| k.to_string()));
        }
    }
    let properties = entity
        .rest
        .as_ref()
        .and_then(|rest| rest.schema.as_ref())
        .and_then(|schema| schema.get("properties"))
        .and_then(serde_json::Value::as_object);
    if let Some(p) = properties {
        told = true;
        known.extend(p.keys().cloned());
    }
    told.then_some(known)
}
