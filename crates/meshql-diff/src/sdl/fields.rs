//! Fields, arguments and input fields: their types, defaults, descriptions, deprecations.

use super::{description, SdlDiffer};
use crate::change::Level;
use apollo_compiler::ast::{self, FieldDefinition, InputValueDefinition, Type};
use apollo_compiler::collections::IndexMap;
use apollo_compiler::schema::Component;
use apollo_compiler::{Name, Node};

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

pub(super) fn required(input: &InputValueDefinition) -> bool {
    input.ty.is_non_null() && input.default_value.is_none()
}

impl SdlDiffer<'_> {
    pub(super) fn fields(
        &mut self,
        type_name: &Name,
        old: &IndexMap<Name, Component<FieldDefinition>>,
        new: &IndexMap<Name, Component<FieldDefinition>>,
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

    pub(super) fn arguments(
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
    pub(super) fn input_value(
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
}
