//! The GraphQL SDL diff: what a new version of an entity's schema does to the queries that
//! clients already send.
//!
//! The levels follow the categories of graphql-inspector and of Apollo's schema checks:
//! removing or incompatibly retyping anything a query can name is breaking; additions that
//! a client may have to handle (an enum value, a union member, an interface, an optional
//! argument) and changed defaults are dangerous; other additions, descriptions and new
//! deprecations are safe. Output types may become stricter (`String` → `String!`) but not
//! looser; input types (arguments, input fields) may become looser but not stricter.

mod directives;
mod fields;

use crate::change::{Change, Level};
use crate::error::{DiffError, Side};
use apollo_compiler::ast::DirectiveList;
use apollo_compiler::schema::{ComponentName, ExtendedType};
use apollo_compiler::{Name, Node, Schema};
use fields::required;

/// Compares two versions of one SDL. Paths are schema coordinates: `Type`, `Type.field`,
/// `Type.field.argument`, `Enum.VALUE`, `@directive`.
pub fn diff_sdl(old: &str, new: &str) -> Result<Vec<Change>, DiffError> {
    let old = parse(old, Side::Old)?;
    let new = parse(new, Side::New)?;
    let mut differ = SdlDiffer {
        old: &old,
        new: &new,
        changes: Vec::new(),
    };
    differ.roots();
    differ.types();
    differ.directives();
    Ok(differ.changes)
}

fn parse(sdl: &str, side: Side) -> Result<Schema, DiffError> {
    Schema::parse(sdl, format!("{side}.graphql")).map_err(|with_errors| {
        let message = with_errors
            .errors
            .iter()
            .map(|d| match d.line_column_range() {
                Some(range) => format!("line {}: {}", range.start.line, d.error),
                None => d.error.to_string(),
            })
            .collect::<Vec<_>>()
            .join("; ");
        DiffError::Sdl { side, message }
    })
}

/// The names in a set of interfaces or union members.
fn names_of<'a>(set: impl IntoIterator<Item = &'a ComponentName>) -> Vec<&'a str> {
    set.into_iter().map(|c| c.name.as_str()).collect()
}

struct SdlDiffer<'s> {
    old: &'s Schema,
    new: &'s Schema,
    changes: Vec<Change>,
}

fn kind(ty: &ExtendedType) -> &'static str {
    match ty {
        ExtendedType::Scalar(_) => "scalar",
        ExtendedType::Object(_) => "object type",
        ExtendedType::Interface(_) => "interface",
        ExtendedType::Union(_) => "union",
        ExtendedType::Enum(_) => "enum",
        ExtendedType::InputObject(_) => "input object",
    }
}

fn description(d: &Option<Node<str>>) -> Option<&str> {
    d.as_deref()
}

/// `None` when not deprecated, else the reason given (if any).
fn deprecation(directives: &DirectiveList) -> Option<Option<String>> {
    directives.get("deprecated").map(|d| {
        d.specified_argument_by_name("reason")
            .and_then(|v| v.as_str())
            .map(str::to_owned)
    })
}

fn type_description(ty: &ExtendedType) -> Option<&str> {
    match ty {
        ExtendedType::Scalar(t) => description(&t.description),
        ExtendedType::Object(t) => description(&t.description),
        ExtendedType::Interface(t) => description(&t.description),
        ExtendedType::Union(t) => description(&t.description),
        ExtendedType::Enum(t) => description(&t.description),
        ExtendedType::InputObject(t) => description(&t.description),
    }
}

impl SdlDiffer<'_> {
    fn push(&mut self, level: Level, path: impl Into<String>, message: impl Into<String>) {
        self.changes.push(Change::new(level, path, message));
    }

    fn root_kind(&self, type_name: &str) -> Option<&'static str> {
        let def = &self.old.schema_definition;
        let is = |root: &Option<ComponentName>| root.as_ref().is_some_and(|r| r.name == type_name);
        if is(&def.query) {
            Some("query")
        } else if is(&def.mutation) {
            Some("mutation")
        } else if is(&def.subscription) {
            Some("subscription")
        } else {
            None
        }
    }

    fn roots(&mut self) {
        let (old, new) = (&self.old.schema_definition, &self.new.schema_definition);
        for (operation, a, b) in [
            ("query", &old.query, &new.query),
            ("mutation", &old.mutation, &new.mutation),
            ("subscription", &old.subscription, &new.subscription),
        ] {
            let (a, b) = (a.as_ref().map(|c| &c.name), b.as_ref().map(|c| &c.name));
            match (a, b) {
                (Some(a), Some(b)) if a == b => {}
                (None, None) => {}
                (Some(a), Some(b)) => self.push(
                    Level::Breaking,
                    "schema",
                    format!("the {operation} root type changed from `{a}` to `{b}`"),
                ),
                (Some(a), None) => self.push(
                    Level::Breaking,
                    "schema",
                    format!("the {operation} root (`{a}`) removed: every {operation} fails"),
                ),
                (None, Some(b)) => self.push(
                    Level::Safe,
                    "schema",
                    format!("a {operation} root (`{b}`) added"),
                ),
            }
        }
    }

    fn types(&mut self) {
        for (name, old_ty) in self.old.types.iter().filter(|(_, t)| !t.is_built_in()) {
            match self.new.types.get(name) {
                None => self.push(
                    Level::Breaking,
                    name.as_str(),
                    format!("{} `{name}` removed", kind(old_ty)),
                ),
                Some(new_ty) => self.type_pair(name, old_ty, new_ty),
            }
        }
        for (name, new_ty) in self.new.types.iter().filter(|(_, t)| !t.is_built_in()) {
            if !self.old.types.contains_key(name) {
                self.push(
                    Level::Safe,
                    name.as_str(),
                    format!("{} `{name}` added", kind(new_ty)),
                );
            }
        }
    }

    fn type_pair(&mut self, name: &Name, old: &ExtendedType, new: &ExtendedType) {
        let path = name.as_str();
        if kind(old) != kind(new) {
            self.push(
                Level::Breaking,
                path,
                format!("`{name}` changed from {} to {}", kind(old), kind(new)),
            );
            return;
        }
        self.description(
            path,
            &format!("type `{name}`"),
            type_description(old),
            type_description(new),
        );
        match (old, new) {
            (ExtendedType::Object(a), ExtendedType::Object(b)) => {
                self.interfaces(
                    path,
                    names_of(&a.implements_interfaces),
                    names_of(&b.implements_interfaces),
                );
                self.fields(name, &a.fields, &b.fields);
            }
            (ExtendedType::Interface(a), ExtendedType::Interface(b)) => {
                self.interfaces(
                    path,
                    names_of(&a.implements_interfaces),
                    names_of(&b.implements_interfaces),
                );
                self.fields(name, &a.fields, &b.fields);
            }
            (ExtendedType::Union(a), ExtendedType::Union(b)) => {
                let (before, after) = (names_of(&a.members), names_of(&b.members));
                for member in before.iter().filter(|m| !after.contains(m)) {
                    self.push(
                        Level::Breaking,
                        path,
                        format!("member `{member}` removed from union `{name}`"),
                    );
                }
                for member in after.iter().filter(|m| !before.contains(m)) {
                    self.push(
                        Level::Dangerous,
                        path,
                        format!(
                            "member `{member}` added to union `{name}`: clients may receive a \
                             type they do not expect"
                        ),
                    );
                }
            }
            (ExtendedType::Enum(a), ExtendedType::Enum(b)) => {
                for (value, def) in &a.values {
                    let at = format!("{name}.{value}");
                    match b.values.get(value) {
                        None => self.push(
                            Level::Breaking,
                            at,
                            format!("enum value `{value}` removed from `{name}`"),
                        ),
                        Some(after) => {
                            let what = format!("enum value `{name}.{value}`");
                            self.description(
                                &at,
                                &what,
                                description(&def.description),
                                description(&after.description),
                            );
                            self.deprecation(&at, &what, &def.directives, &after.directives);
                        }
                    }
                }
                for value in b.values.keys().filter(|v| !a.values.contains_key(*v)) {
                    self.push(
                        Level::Dangerous,
                        format!("{name}.{value}"),
                        format!(
                            "enum value `{value}` added to `{name}`: clients that switch over \
                             the values may not handle it"
                        ),
                    );
                }
            }
            (ExtendedType::InputObject(a), ExtendedType::InputObject(b)) => {
                for (field, def) in &a.fields {
                    let at = format!("{name}.{field}");
                    match b.fields.get(field) {
                        None => self.push(
                            Level::Breaking,
                            at,
                            format!("input field `{field}` removed from `{name}`"),
                        ),
                        Some(after) => self.input_value(&at, "input field", def, after),
                    }
                }
                for (field, def) in b.fields.iter().filter(|(f, _)| !a.fields.contains_key(*f)) {
                    let at = format!("{name}.{field}");
                    if required(def) {
                        self.push(
                            Level::Breaking,
                            at,
                            format!(
                                "required input field `{field}: {}` added to `{name}`",
                                def.ty
                            ),
                        );
                    } else {
                        self.push(
                            Level::Safe,
                            at,
                            format!(
                                "optional input field `{field}: {}` added to `{name}`",
                                def.ty
                            ),
                        );
                    }
                }
            }
            _ => {} // scalars: the description only
        }
    }

    fn interfaces(&mut self, path: &str, before: Vec<&str>, after: Vec<&str>) {
        for interface in before.iter().filter(|i| !after.contains(i)) {
            self.push(
                Level::Breaking,
                path,
                format!("`{path}` no longer implements interface `{interface}`"),
            );
        }
        for interface in after.iter().filter(|i| !before.contains(i)) {
            self.push(
                Level::Dangerous,
                path,
                format!(
                    "`{path}` now implements interface `{interface}`: queries on the interface \
                     may receive it"
                ),
            );
        }
    }

    fn description(&mut self, at: &str, what: &str, old: Option<&str>, new: Option<&str>) {
        let how = match (old, new) {
            (a, b) if a == b => return,
            (None, _) => "added",
            (_, None) => "removed",
            _ => "changed",
        };
        self.push(Level::Safe, at, format!("description of {what} {how}"));
    }

    fn deprecation(&mut self, at: &str, what: &str, old: &DirectiveList, new: &DirectiveList) {
        match (deprecation(old), deprecation(new)) {
            (None, None) => {}
            (None, Some(reason)) => self.push(
                Level::Safe,
                at,
                match reason {
                    Some(reason) => format!("{what} deprecated: {reason}"),
                    None => format!("{what} deprecated"),
                },
            ),
            (Some(_), None) => self.push(
                Level::Dangerous,
                at,
                format!("{what} is no longer deprecated"),
            ),
            (Some(a), Some(b)) => {
                if a != b {
                    self.push(
                        Level::Safe,
                        at,
                        format!("deprecation reason of {what} changed"),
                    );
                }
            }
        }
    }
}
