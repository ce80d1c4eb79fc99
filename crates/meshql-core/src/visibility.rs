//! What one caller may see of documents that reach it without a store read — the change
//! log (`/_changes`), subscription events, the version before an update: rows by their
//! authorized tokens, entities by read grant ([`Grants::read_view`]), fields by mask. The
//! engine makes one from the caller's access; consumers only ask it.

use crate::access::{Action, Forbidden, Grants, Mask};
use crate::auth::is_visible;
use crate::TokenFilter;
use std::sync::Arc;

/// A caller's view of documents that come without a store read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Visibility {
    tokens: TokenFilter,
    /// `None`: every entity, every field; `Some`: the readable entities, each with its mask
    /// (`None`: every field).
    entities: Option<Vec<(String, Option<Arc<Mask>>)>>,
}

impl Default for Visibility {
    fn default() -> Self {
        Self::everything()
    }
}

impl Visibility {
    /// Everything (the service's own consumers: processors, relays, `meshql changes`).
    pub fn everything() -> Visibility {
        Visibility {
            tokens: TokenFilter::All,
            entities: None,
        }
    }

    /// What a caller holding `tokens` and `grants` sees of `entities` (the service's), or
    /// only of `asked` among them: [`Forbidden`] for an asked entity it may not read, or when
    /// it may read none.
    pub fn decide(
        tokens: TokenFilter,
        grants: &Grants,
        entities: &[&str],
        asked: Option<&[String]>,
    ) -> Result<Visibility, Forbidden> {
        if grants.is_unrestricted() {
            return Ok(Visibility {
                tokens,
                entities: asked.map(|a| a.iter().map(|e| (e.clone(), None)).collect()),
            });
        }
        let mut readable = Vec::new();
        for entity in entities {
            if asked.is_some_and(|a| !a.iter().any(|n| n == entity)) {
                continue;
            }
            match grants.read_view(entity) {
                Ok(mask) => readable.push(((*entity).to_owned(), mask)),
                Err(e) if asked.is_some() => return Err(e),
                Err(_) => {}
            }
        }
        if readable.is_empty() {
            return Err(Forbidden {
                entity: "any entity of this service".into(),
                action: Action::Read,
            });
        }
        Ok(Visibility {
            tokens,
            entities: Some(readable),
        })
    }

    /// This view narrowed to `entities` (never widened).
    pub fn only(self, entities: &[String]) -> Visibility {
        let narrowed = match self.entities {
            None => entities.iter().map(|e| (e.clone(), None)).collect(),
            Some(mine) => mine
                .into_iter()
                .filter(|(e, _)| entities.contains(e))
                .collect(),
        };
        Visibility {
            tokens: self.tokens,
            entities: Some(narrowed),
        }
    }

    /// Whether a document of `entity` stamped with `authorized_tokens` may be seen.
    pub fn admits(&self, entity: &str, authorized_tokens: &[String]) -> bool {
        self.entities
            .as_ref()
            .is_none_or(|es| es.iter().any(|(e, _)| e == entity))
            && is_visible(&self.tokens, authorized_tokens)
    }

    /// The fields of `entity` it shows (`None`: every field).
    pub fn mask(&self, entity: &str) -> Option<&Arc<Mask>> {
        self.entities
            .as_ref()?
            .iter()
            .find(|(e, _)| e == entity)
            .and_then(|(_, m)| m.as_ref())
    }

    /// The entities it is narrowed to (`None`: every entity).
    pub fn entities(&self) -> Option<Vec<&str>> {
        self.entities
            .as_ref()
            .map(|es| es.iter().map(|(e, _)| e.as_str()).collect())
    }

    /// The caller's tokens.
    pub fn tokens(&self) -> &TokenFilter {
        &self.tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::Grant;
    use std::collections::HashMap;

    fn grants() -> Grants {
        let hide = Grant {
            actions: crate::access::Actions::of([Action::Read]),
            mask: Arc::new(Mask::Hide(["eggs".to_owned()].into())),
        };
        Grants::new(
            HashMap::from([("hen".to_owned(), hide), ("coop".to_owned(), Grant::full())]),
            Grant::none(),
        )
    }

    #[test]
    fn the_read_decision_names_entities_fields_and_rows() {
        let mine = TokenFilter::AnyOf(vec!["a".into()]);
        let all = ["hen", "coop", "farm"];
        let v = Visibility::decide(mine.clone(), &grants(), &all, None).unwrap();
        assert_eq!(v.entities(), Some(vec!["hen", "coop"]));
        assert!(v.admits("hen", &[]) && v.admits("hen", &["a".into()]));
        assert!(!v.admits("hen", &["b".into()]) && !v.admits("farm", &[]));
        assert!(!v.mask("hen").unwrap().allows("eggs"));
        assert!(v.mask("coop").is_none());
        // asking for an entity it may not read is refused; for readable ones, narrowed
        let e = Visibility::decide(mine.clone(), &grants(), &all, Some(&["farm".into()]));
        assert_eq!(e.unwrap_err().to_string(), "not allowed to read farm");
        let v = Visibility::decide(mine.clone(), &grants(), &all, Some(&["coop".into()])).unwrap();
        assert_eq!(v.entities(), Some(vec!["coop"]));
        // nothing readable at all
        let none = Grants::new(HashMap::new(), Grant::none());
        let e = Visibility::decide(mine, &none, &all, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "not allowed to read any entity of this service"
        );
        // everything, narrowed
        let v = Visibility::everything().only(&["hen".into()]);
        assert!(v.admits("hen", &["z".into()]) && !v.admits("coop", &[]));
    }
}
