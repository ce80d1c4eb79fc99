//! The GraphQL SDL diff: what a new version of an entity's schema does to the queries that
//! clients already send.
//!
//! The levels follow the categories of graphql-inspector and of Apollo's schema checks:
//! removing or incompatibly retyping anything a query can name is breaking; additions that
//! a client may have to handle (an enum value, a union member, an interface, an optional
//! argument) and changed defaults are dangerous; other additions, descriptions and new
//! deprecations are safe. Output types may become stricter (`String` → `String!`) but not
//! looser; input types (arguments, input fields) may become looser but not stricter.

use crate::change::{Change, Level};
use crate::error::{DiffError, Side};
use apollo_compiler::ast::{self, DirectiveList, FieldDefinition, InputValueDefinition, Type};
use apollo_compiler::schema::{Component, ComponentName, ExtendedType};
use apollo_compiler::{Name, Node, Schema};

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

/// Whether a client reading `old` can read `new` unchanged: the same named type, as strict
/// or stricter about null (`T` → `T!` is safe, `T!` → `T` is not).
fn safe_for_output(old: &Type, new: &Type) -> bool {
    match (old, new) {
        (Type::Named(a), Type::Named(b) | Type::NonNullNamed(b))
        | (Type::NonNullNamed(a), Type::NonNullNamed(b)) => a == b,
        (Type::List(a), Type::List(b) | Type::NonNullList(b))
        | (Type::NonNullList(a), Type::NonNullList(b)) => safe_for_output(a, b),
        _ => false,
    }
}

/// Whether every value a client sent for `old` is still accepted by `new`: the same named
/// type, as strict or more lenient about null (`T!` → `T` is safe, `T` → `T!` is not).
fn safe_for_input(old: &Type, new: &Type) -> bool {
    match (old, new) {
        (Type::Named(a) | Type::NonNullNamed(a), Type::Named(b))
        | (Type::NonNullNamed(a), Type::NonNullNamed(b)) => a == b,
        (Type::List(a) | Type::NonNullList(a), Type::List(b))
        | (Type::NonNullList(a), Type::NonNullList(b)) => safe_for_input(a, b),
        _ => false,
    }
}

fn value_text(v: &Option<Node<ast::Value>>) -> Option<String> {
    v.as_ref().map(|v| v.to_string())
}

fn required(input: &InputValueDefinition) -> bool {
    input.ty.is_non_null() && input.default_value.is_none()
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

    fn fields(
        &mut self,
        type_name: &Name,
        old: &apollo_compiler::collections::IndexMap<Name, Component<FieldDefinition>>,
        new: &apollo_compiler::collections::IndexMap<Name, Component<FieldDefinition>>,
    ) {
        let root = self.root_kind(type_name);
        for (field, def) in old {
            let at = format!("{type_name}.{field}");
            match new.get(field) {
                None => {
                    let message = match root {
                        Some(operation) => format!(
                            "root {operation} field `{field}` removed: clients calling it fail"
                        ),
                        None => format!("field `{field}` removed from `{type_name}`"),
                    };
                    self.push(Level::Breaking, at, message);
                }
                Some(after) => self.field(&at, def, after),
            }
        }
        for field in new.keys().filter(|f| !old.contains_key(*f)) {
            let message = match root {
                Some(operation) => format!("root {operation} field `{field}` added"),
                None => format!("field `{field}` added to `{type_name}`"),
            };
            self.push(Level::Safe, format!("{type_name}.{field}"), message);
        }
    }

    fn field(&mut self, at: &str, old: &FieldDefinition, new: &FieldDefinition) {
        let what = format!("field `{at}`");
        if old.ty != new.ty {
            let (level, note) = if safe_for_output(&old.ty, &new.ty) {
                (Level::Safe, "")
            } else if old.ty.inner_named_type() == new.ty.inner_named_type() {
                (
                    Level::Breaking,
                    ": clients may receive null or another shape",
                )
            } else {
                (Level::Breaking, "")
            };
            self.push(
                level,
                at,
                format!(
                    "{what} changed type from `{}` to `{}`{note}",
                    old.ty, new.ty
                ),
            );
        }
        self.description(
            at,
            &what,
            description(&old.description),
            description(&new.description),
        );
        self.deprecation(at, &what, &old.directives, &new.directives);
        self.arguments(at, &old.arguments, &new.arguments);
    }

    fn arguments(
        &mut self,
        at: &str,
        old: &[Node<InputValueDefinition>],
        new: &[Node<InputValueDefinition>],
    ) {
        let find = |list: &'_ [Node<InputValueDefinition>], name: &Name| {
            list.iter().find(|a| &a.name == name).cloned()
        };
        for arg in old {
            let path = format!("{at}.{}", arg.name);
            match find(new, &arg.name) {
                None => self.push(
                    Level::Breaking,
                    path,
                    format!("argument `{}` removed from `{at}`", arg.name),
                ),
                Some(after) => self.input_value(&path, "argument", arg, &after),
            }
        }
        for arg in new.iter().filter(|a| find(old, &a.name).is_none()) {
            let path = format!("{at}.{}", arg.name);
            if required(arg) {
                self.push(
                    Level::Breaking,
                    path,
                    format!(
                        "required argument `{}: {}` added to `{at}`: queries without it fail",
                        arg.name, arg.ty
                    ),
                );
            } else {
                self.push(
                    Level::Dangerous,
                    path,
                    format!(
                        "optional argument `{}: {}` added to `{at}`: the field may now answer \
                         differently when it is given",
                        arg.name, arg.ty
                    ),
                );
            }
        }
    }

    /// An argument or input field present on both sides.
    fn input_value(
        &mut self,
        at: &str,
        noun: &str,
        old: &InputValueDefinition,
        new: &InputValueDefinition,
    ) {
        let what = format!("{noun} `{at}`");
        if old.ty != new.ty {
            let level = if safe_for_input(&old.ty, &new.ty) {
                Level::Safe
            } else {
                Level::Breaking
            };
            self.push(
                level,
                at,
                format!("{what} changed type from `{}` to `{}`", old.ty, new.ty),
            );
        }
        match (
            value_text(&old.default_value),
            value_text(&new.default_value),
        ) {
            (a, b) if a == b => {}
            (Some(a), None) if new.ty.is_non_null() => self.push(
                Level::Breaking,
                at,
                format!("default value `{a}` of {what} removed: it is now required"),
            ),
            (a, b) => self.push(
                Level::Dangerous,
                at,
                format!(
                    "default value of {what} changed from {} to {}",
                    a.map_or("none".to_owned(), |v| format!("`{v}`")),
                    b.map_or("none".to_owned(), |v| format!("`{v}`"))
                ),
            ),
        }
        self.description(
            at,
            &what,
            description(&old.description),
            description(&new.description),
        );
        self.deprecation(at, &what, &old.directives, &new.directives);
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

    fn directives(&mut self) {
        let custom = |schema: &'_ Schema| {
            schema
                .directive_definitions
                .iter()
                .filter(|(_, d)| !d.is_built_in())
                .map(|(n, d)| (n.clone(), d.clone()))
                .collect::<Vec<_>>()
        };
        let (old, new) = (custom(self.old), custom(self.new));
        for (name, def) in &old {
            let at = format!("@{name}");
            let Some((_, after)) = new.iter().find(|(n, _)| n == name) else {
                self.push(Level::Breaking, at, format!("directive `@{name}` removed"));
                continue;
            };
            for location in def
                .locations
                .iter()
                .filter(|l| !after.locations.contains(l))
            {
                self.push(
                    Level::Breaking,
                    &at,
                    format!("directive `@{name}` no longer allowed on {location}"),
                );
            }
            for location in after
                .locations
                .iter()
                .filter(|l| !def.locations.contains(l))
            {
                self.push(
                    Level::Safe,
                    &at,
                    format!("directive `@{name}` now allowed on {location}"),
                );
            }
            match (def.repeatable, after.repeatable) {
                (true, false) => self.push(
                    Level::Breaking,
                    &at,
                    format!("directive `@{name}` is no longer repeatable"),
                ),
                (false, true) => self.push(
                    Level::Safe,
                    &at,
                    format!("directive `@{name}` is now repeatable"),
                ),
                _ => {}
            }
            self.description(
                &at,
                &format!("directive `@{name}`"),
                description(&def.description),
                description(&after.description),
            );
            self.arguments(&at, &def.arguments, &after.arguments);
        }
        for (name, _) in new.iter().filter(|(n, _)| !old.iter().any(|(o, _)| o == n)) {
            self.push(
                Level::Safe,
                format!("@{name}"),
                format!("directive `@{name}` added"),
            );
        }
    }
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
