//! Cache keys: an answer is cached under everything that decides it — the entity, the
//! operation and its arguments (a query template's text, its bound arguments, the limit and
//! the fields read; a relationship tree), whose documents the caller may see (the token
//! filter its credentials give), and for a read at a past moment, that moment. Field masks
//! are applied by the engine after the reader, so callers with one filter share answers.
//!
//! Keys are text (the same in every process sharing a cache), with `\u{1f}` between parts.

use meshql_core::{BatchSearch, Millis, Nested, Search, TokenFilter};
use std::fmt::Write;

const SEP: char = '\u{1f}';

/// A key under construction.
pub struct Key(String);

impl Key {
    pub fn new(entity: &str, op: &str, filter: &TokenFilter) -> Key {
        let mut s = String::with_capacity(64);
        s.push_str(entity);
        s.push(SEP);
        s.push_str(op);
        s.push(SEP);
        match filter {
            TokenFilter::All => s.push('*'),
            TokenFilter::AnyOf(tokens) => {
                let _ = serde_json::to_writer(json_into(&mut s), tokens);
            }
        }
        Key(s)
    }

    pub fn part(mut self, part: impl std::fmt::Display) -> Key {
        self.0.push(SEP);
        let _ = write!(self.0, "{part}");
        self
    }

    pub fn search(mut self, search: &Search<'_>) -> Key {
        self.0.push(SEP);
        self.0.push_str(&search.template.source);
        self.0.push(SEP);
        let _ = serde_json::to_writer(json_into(&mut self.0), search.args);
        let _ = write!(self.0, "{SEP}{:?}", search.limit);
        self.fields(search.fields.map(|f| &f[..]))
    }

    pub fn batch(mut self, batch: &BatchSearch<'_>) -> Key {
        self.0.push(SEP);
        self.0.push_str(&batch.template.source);
        self.0.push(SEP);
        self.0.push_str(batch.key_arg);
        self.0.push(SEP);
        let _ = serde_json::to_writer(json_into(&mut self.0), batch.keys);
        self
    }

    /// The relationship tree; `None` when a level's reader is not a cache that tags its
    /// answers (such an answer cannot be invalidated, so it is not cached).
    pub fn nested(mut self, nested: &[Nested]) -> Option<Key> {
        for level in nested {
            let entity = level.store.cached_entity()?;
            let _ = write!(
                self.0,
                "{SEP}[{entity}{SEP}{}{SEP}{}{SEP}{}",
                level.key_field, level.vector, level.template.source
            );
            self = self.fields(level.fields.as_ref().map(|f| &f[..]));
            self = self.nested(&level.children)?;
            self.0.push(']');
        }
        Some(self)
    }

    fn fields(mut self, fields: Option<&[String]>) -> Key {
        self.0.push(SEP);
        match fields {
            None => self.0.push('*'),
            Some(f) => {
                let _ = serde_json::to_writer(json_into(&mut self.0), f);
            }
        }
        self
    }

    /// The key of the answer as of the past moment `at`.
    pub fn at(self, at: Millis) -> Key {
        self.part(format_args!("@{at}"))
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

/// The entities a relationship tree reads (each level's cache), in order.
pub fn nested_entities<'a>(nested: &'a [Nested], into: &mut Vec<&'a str>) {
    for level in nested {
        if let Some(e) = level.store.cached_entity() {
            into.push(e);
        }
        nested_entities(&level.children, into);
    }
}

/// A writer appending JSON to a `String` (serde_json writes valid UTF-8).
fn json_into(s: &mut String) -> impl std::io::Write + '_ {
    struct W<'a>(&'a mut String);
    impl std::io::Write for W<'_> {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.push_str(
                std::str::from_utf8(buf)
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?,
            );
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    W(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshql_core::QueryTemplate;
    use serde_json::json;

    #[test]
    fn keys_differ_by_caller_arguments_limit_fields_and_moment() {
        let t = QueryTemplate::filter(r#"{"payload.name": "{{name}}"}"#).unwrap();
        let a = json!({"name": "a"}).as_object().unwrap().clone();
        let b = json!({"name": "b"}).as_object().unwrap().clone();
        let key = |filter: &TokenFilter, args, limit, at: Option<Millis>| {
            let k = Key::new("hen", "find", filter).search(&Search::new(&t, args, limit));
            match at {
                Some(at) => k.at(at).into_string(),
                None => k.into_string(),
            }
        };
        let all = TokenFilter::All;
        let some = TokenFilter::AnyOf(vec!["x".into()]);
        let base = key(&all, &a, None, None);
        assert_eq!(base, key(&all, &a, None, None));
        for other in [
            key(&some, &a, None, None),
            key(&all, &b, None, None),
            key(&all, &a, Some(1), None),
            key(&all, &a, None, Some(5)),
        ] {
            assert_ne!(base, other);
        }
        let fields: meshql_core::FieldSet = vec!["name".to_owned()].into();
        let narrowed = Key::new("hen", "find", &all)
            .search(&Search::new(&t, &a, None).reading(Some(&fields)))
            .into_string();
        assert_ne!(base, narrowed);
    }
}
