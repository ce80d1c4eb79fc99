//! Breaking, dangerous and safe changes between two versions of a meshql service.
//!
//! Every entity of a config has up to two contracts: a JSON Schema that validates what
//! clients write over REST (and so describes every stored document), and a GraphQL SDL that
//! says what clients can read (its `Query` fields are the root queries clients call).
//! [`diff_service`] matches the entities of two versions by name and compares both, giving a
//! [`Report`] that renders as text for people ([`Report::to_text`]) and as JSON for CI
//! ([`Report::to_json`]). `meshql diff OLD NEW` exits 1 when [`Report::has_breaking`].
//!
//! # Levels
//!
//! - [`Level::Breaking`]: a request or a stored document that worked before no longer does.
//! - [`Level::Dangerous`]: everything still validates, but a client may behave differently
//!   (a new enum value it switches over, a changed default), or the change could not be
//!   classified for certain (`anyOf`/`oneOf`, `not`, `if`/`then`/`else`, unknown keywords).
//! - [`Level::Safe`]: nothing a client or a stored document can notice (additions,
//!   loosened constraints, descriptions).
//!
//! # JSON Schema ([`diff_json_schema`])
//!
//! Seen from writers and stored documents: a change is breaking when the set of valid
//! documents shrinks. A property made required or a new required property, a narrowed type
//! (`["string","null"]` → `"string"`, `number` → `integer`, no `type` → `"string"`), an enum
//! value removed, `additionalProperties` turned `false`, a tightened bound (`minimum`,
//! `maxLength`, ...), a `pattern` or `format` added or changed (meshql enforces formats), a
//! `const` added, a property removed while additional properties are not allowed: breaking.
//! An enum value added, a property removed (stored documents still carry it), a `default`
//! changed: dangerous. An optional property added, a requirement dropped, a widened type, a
//! loosened constraint, a description: safe. Local `$ref`s are followed, nested objects and
//! `items` are compared at their JSON Pointer (`/properties/address/properties/zip`).
//!
//! # GraphQL SDL ([`diff_sdl`])
//!
//! Seen from the queries clients send; the categories are those of graphql-inspector and of
//! Apollo's schema checks. Breaking: a type, field (root query fields included), argument,
//! enum value, union member or implemented interface removed; a required argument or
//! required input field added; a field's type changed incompatibly. An output field may
//! become stricter (`String` → `String!` is safe) but not looser; an argument or input field
//! may become looser (`ID!` → `ID` is safe) but not stricter. Dangerous: an enum value,
//! union member, implemented interface or optional argument added, a default value changed,
//! a deprecation withdrawn. Safe: types, fields and optional input fields added,
//! descriptions, deprecations added.
//!
//! `docs/SCHEMA-EVOLUTION.md` has the full table of rules with an example of each.

mod change;
mod error;
mod json_schema;
mod report;
mod sdl;
mod service;

pub use change::{Change, Level};
pub use error::{DiffError, Side};
pub use json_schema::diff_json_schema;
pub use report::{EntityChange, EntityReport, Report, Source};
pub use sdl::diff_sdl;
pub use service::{diff_service, EntitySchemas};
