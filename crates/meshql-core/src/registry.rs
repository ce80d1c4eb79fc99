//! What every registry of config-selected parts shares (storage backends, relays): entries
//! by the `type` a config block names, later registrations replacing earlier ones, the list
//! of known types for error messages and the JSON Schema of each.

use crate::SettingError;
use std::sync::Arc;

/// A part a config block selects by its `type`.
pub trait Kind: Send + Sync {
    /// The `type` value that selects it.
    fn kind(&self) -> &'static str;
    /// The JSON Schema of the block's own fields.
    fn schema(&self) -> serde_json::Value;
}

/// Parts by kind, in registration order.
pub struct Registry<B: ?Sized> {
    entries: Vec<Arc<B>>,
}

impl<B: ?Sized> Default for Registry<B> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
        }
    }
}

impl<B: ?Sized> Clone for Registry<B> {
    fn clone(&self) -> Self {
        Self {
            entries: self.entries.clone(),
        }
    }
}

impl<B: ?Sized + Kind> Registry<B> {
    /// Adds a part; one registered earlier with the same kind is replaced.
    pub fn insert(&mut self, part: Arc<B>) {
        self.entries.retain(|b| b.kind() != part.kind());
        self.entries.push(part);
    }

    pub fn get(&self, kind: &str) -> Option<&B> {
        self.entries
            .iter()
            .find(|b| b.kind() == kind)
            .map(|b| b.as_ref())
    }

    /// Every part, in registration order.
    pub fn iter(&self) -> impl Iterator<Item = &B> {
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

    /// The error on `type` for a kind nobody registered; `what` names the part (`storage`).
    pub fn unknown(&self, what: &str, kind: &str) -> SettingError {
        SettingError::new(
            "type",
            format!(
                "unknown {what} type `{kind}` (this build has: {})",
                self.kinds().join(", ")
            ),
        )
    }
}

impl<B: ?Sized + Kind> std::fmt::Debug for Registry<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.kinds()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Part(&'static str, u8);

    impl Kind for Part {
        fn kind(&self) -> &'static str {
            self.0
        }
        fn schema(&self) -> serde_json::Value {
            serde_json::json!({ "version": self.1 })
        }
    }

    #[test]
    fn later_registrations_replace_earlier_ones_of_the_same_kind() {
        let mut r: Registry<Part> = Registry::default();
        r.insert(Arc::new(Part("a", 1)));
        r.insert(Arc::new(Part("b", 1)));
        r.insert(Arc::new(Part("a", 2)));
        assert_eq!(r.kinds(), ["b", "a"]);
        assert_eq!(r.get("a").unwrap().1, 2);
        assert!(r.get("c").is_none());
        assert_eq!(r.schemas()[1], ("a", serde_json::json!({ "version": 2 })));
        let e = r.unknown("relay", "c");
        assert_eq!(e.field.as_deref(), Some("type"));
        assert_eq!(e.message, "unknown relay type `c` (this build has: b, a)");
        assert_eq!(format!("{r:?}"), r#"["b", "a"]"#);
    }
}
