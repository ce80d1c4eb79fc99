//! The one way a config-selected part plugs in: storage backends, relays, shared caches,
//! processor sources and processor types are each a [`Family`], and every part of a family is
//! a [`Component`] registered with one line in that family's [`Registry`].
//!
//! A component owns its settings: a `serde` + `schemars` struct whose JSON Schema is
//! `meshql config-schema`'s, read from the block with the failing field named
//! ([`parse_settings`]), then checked and turned into what the family builds
//! ([`Component::build`]). The registry finds a component by the `type` a block names, lists
//! the known kinds in errors, and says which other kind a misplaced field belongs to.
//!
//! ```text
//! [storage.main] type = "postgres", url = …     ──Registry<Storage>::configure──▶ Box<dyn StorageTarget>
//! [[changes.relay]] type = "nats", url = …      ──Registry<Relay>::configure────▶ Box<dyn RelayTarget>
//! [[processor]] source = { type = "kafka", … }  ──Registry<SourceFamily>::configure──▶ …
//! ```

use std::sync::Arc;

/// A config block that does not check out: the field (relative to the block; `None` for the
/// block as a whole) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingError {
    pub field: Option<String>,
    pub message: String,
}

impl SettingError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: Some(field.into()),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for SettingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.field {
            Some(field) => write!(f, "{field}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// Reads a block's fields into a component's settings struct, naming the field a type error
/// is about (serde's own message does not).
pub fn parse_settings<C: serde::de::DeserializeOwned>(
    settings: &serde_json::Value,
) -> Result<C, SettingError> {
    serde_path_to_error::deserialize(settings).map_err(|e| {
        let path = e.path().to_string();
        SettingError {
            field: (path != ".").then_some(path),
            message: e.into_inner().to_string(),
        }
    })
}

/// A family of parts a config block selects by its `type`.
pub trait Family: 'static {
    /// What the parts are called in messages: "unknown {WHAT} type `x`".
    const WHAT: &'static str;
    /// What a part may need besides the block's own fields.
    type Context<'a>;
    /// What a checked block becomes (nothing is opened or connected yet).
    type Built;
}

/// One part of a family: its settings and what a block of them builds. Registering it is
/// one line: `registry.register(MyPart)`.
pub trait Component<F: Family>: Send + Sync + 'static {
    /// The `type` value that selects it.
    const KIND: &'static str;
    /// The block's own fields (`deny_unknown_fields`, defaults, docs for the schema).
    type Settings: serde::de::DeserializeOwned + schemars::JsonSchema;

    /// Checks the settings and builds the part.
    fn build(
        &self,
        settings: Self::Settings,
        context: &F::Context<'_>,
    ) -> Result<F::Built, SettingError>;

    /// Fields a block must have, each with the message that says so (friendlier than
    /// `serde`'s "missing field").
    const REQUIRED: &'static [(&'static str, &'static str)] = &[];

    /// Reads the block into [`Component::Settings`]: [`Component::REQUIRED`] first, then
    /// `serde` with the failing field named. Override for other checks before `serde`'s.
    fn parse(&self, settings: &serde_json::Value) -> Result<Self::Settings, SettingError> {
        for (field, message) in Self::REQUIRED {
            if settings.get(field).is_none() {
                return Err(SettingError::new(*field, *message));
            }
        }
        parse_settings(settings)
    }

    /// The JSON Schema of the block's fields; override only for a schema `schemars` cannot
    /// derive.
    fn schema(&self) -> serde_json::Value {
        schema_of::<Self::Settings>()
    }
}

/// The JSON Schema of a settings struct.
pub fn schema_of<S: schemars::JsonSchema>() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(S)).expect("schemas serialise")
}

/// What a registry keeps of a component (object safe; implemented for every [`Component`]).
pub trait Part<F: Family>: Send + Sync {
    fn kind(&self) -> &'static str;
    fn schema(&self) -> serde_json::Value;
    fn configure(
        &self,
        settings: &serde_json::Value,
        context: &F::Context<'_>,
    ) -> Result<F::Built, SettingError>;
}

impl<F: Family, C: Component<F>> Part<F> for C {
    fn kind(&self) -> &'static str {
        C::KIND
    }

    fn schema(&self) -> serde_json::Value {
        Component::schema(self)
    }

    fn configure(
        &self,
        settings: &serde_json::Value,
        context: &F::Context<'_>,
    ) -> Result<F::Built, SettingError> {
        let parsed = self.parse(settings)?;
        self.build(parsed, context)
    }
}

/// A family's parts by kind, in registration order.
pub struct Registry<F: Family> {
    entries: Vec<Arc<dyn Part<F>>>,
}

impl<F: Family> Default for Registry<F> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
        }
    }
}

impl<F: Family> Clone for Registry<F> {
    fn clone(&self) -> Self {
        Self {
            entries: self.entries.clone(),
        }
    }
}

impl<F: Family> Registry<F> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a part; one registered earlier with the same kind is replaced.
    pub fn register(mut self, part: impl Component<F>) -> Self {
        self.insert(Arc::new(part));
        self
    }

    /// [`Registry::register`] for a part already shared.
    pub fn insert(&mut self, part: Arc<dyn Part<F>>) {
        self.entries.retain(|b| b.kind() != part.kind());
        self.entries.push(part);
    }

    pub fn get(&self, kind: &str) -> Option<&dyn Part<F>> {
        self.entries
            .iter()
            .find(|b| b.kind() == kind)
            .map(|b| b.as_ref())
    }

    /// Every part, in registration order.
    pub fn iter(&self) -> impl Iterator<Item = &dyn Part<F>> {
        self.entries.iter().map(|b| b.as_ref())
    }

    /// The registered kinds, in registration order.
    pub fn kinds(&self) -> Vec<&'static str> {
        self.iter().map(|b| b.kind()).collect()
    }

    /// Each kind with the JSON Schema of its fields.
    pub fn schemas(&self) -> Vec<(&'static str, serde_json::Value)> {
        self.iter().map(|b| (b.kind(), b.schema())).collect()
    }

    /// The error on `type` for a kind nobody registered.
    pub fn unknown(&self, kind: &str) -> SettingError {
        SettingError::new(
            "type",
            format!(
                "unknown {} type `{kind}` (this build has: {})",
                F::WHAT,
                self.kinds().join(", ")
            ),
        )
    }

    /// Checks a block of the given kind: an unknown kind is an error on `type`, and a field
    /// the kind does not have but another registered kind does says which kind it is for.
    pub fn configure(
        &self,
        kind: &str,
        settings: &serde_json::Value,
        context: &F::Context<'_>,
    ) -> Result<F::Built, SettingError> {
        let Some(part) = self.get(kind) else {
            return Err(self.unknown(kind));
        };
        part.configure(settings, context)
            .map_err(|e| self.other_kinds_field(kind, e))
    }

    /// `unknown field` errors about a field of other kinds name those kinds instead.
    fn other_kinds_field(&self, kind: &str, e: SettingError) -> SettingError {
        let Some(field) = e.field.as_deref() else {
            return e;
        };
        if !e.message.starts_with("unknown field") {
            return e;
        }
        let owners: Vec<String> = self
            .iter()
            .filter(|b| b.kind() != kind)
            .filter(|b| b.schema()["properties"].get(field).is_some())
            .map(|b| format!("`type = \"{}\"`", b.kind()))
            .collect();
        if owners.is_empty() {
            return e;
        }
        SettingError::new(
            field,
            format!(
                "applies to {} {} only",
                owners.join(" and "),
                plural(F::WHAT)
            ),
        )
    }
}

/// `relay` → `relays`, `storage` → `storage blocks`.
fn plural(what: &str) -> String {
    match what {
        "storage" => "storage blocks".into(),
        "cache" => "caches".into(),
        other => format!("{other}s"),
    }
}

impl<F: Family> std::fmt::Debug for Registry<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.kinds()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    struct Things;

    impl Family for Things {
        const WHAT: &'static str = "relay";
        type Context<'a> = &'a str;
        type Built = String;
    }

    #[derive(Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct UrlSettings {
        url: String,
    }

    #[derive(Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct BrokerSettings {
        brokers: String,
    }

    struct A(u8);
    struct B;

    impl Component<Things> for A {
        const KIND: &'static str = "a";
        type Settings = UrlSettings;
        fn build(&self, s: UrlSettings, context: &&str) -> Result<String, SettingError> {
            if s.url.is_empty() {
                return Err(SettingError::new("url", "name a URL"));
            }
            Ok(format!("{context}:{}:{}", self.0, s.url))
        }
    }

    impl Component<Things> for B {
        const KIND: &'static str = "b";
        type Settings = BrokerSettings;
        fn build(&self, s: BrokerSettings, _: &&str) -> Result<String, SettingError> {
            Ok(s.brokers)
        }
    }

    #[test]
    fn later_registrations_replace_earlier_ones_of_the_same_kind() {
        let r = Registry::<Things>::new()
            .register(A(1))
            .register(B)
            .register(A(2));
        assert_eq!(r.kinds(), ["b", "a"]);
        assert_eq!(format!("{r:?}"), r#"["b", "a"]"#);
        let built = r
            .configure("a", &serde_json::json!({"url": "u"}), &"ctx")
            .unwrap();
        assert_eq!(built, "ctx:2:u");
        assert!(r.get("c").is_none());
        assert_eq!(
            r.schemas()[1].1["properties"]["url"]["type"],
            serde_json::json!("string")
        );
    }

    #[test]
    fn errors_name_the_field_the_kinds_and_the_owner_of_a_misplaced_field() {
        let r = Registry::<Things>::new().register(A(1)).register(B);
        let e = r.configure("c", &serde_json::json!({}), &"x").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("type"));
        assert_eq!(e.message, "unknown relay type `c` (this build has: a, b)");
        let e = r
            .configure("a", &serde_json::json!({"url": 3}), &"x")
            .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("url"));
        let e = r
            .configure("a", &serde_json::json!({"url": ""}), &"x")
            .unwrap_err();
        assert_eq!(
            (e.field.as_deref(), e.message.as_str()),
            (Some("url"), "name a URL")
        );
        let e = r
            .configure("a", &serde_json::json!({"url": "u", "brokers": "h"}), &"x")
            .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("brokers"));
        assert_eq!(e.message, "applies to `type = \"b\"` relays only");
        let e = r
            .configure("a", &serde_json::json!({"url": "u", "nope": 1}), &"x")
            .unwrap_err();
        assert!(e.message.starts_with("unknown field `nope`"), "{e:?}");
    }
}
