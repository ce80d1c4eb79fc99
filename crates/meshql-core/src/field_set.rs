//! Parsing a stored payload into only the fields a reader uses.
//!
//! A GraphQL selection reads a few fields of each document (`{ name breed }`), and a
//! document's payload holds all of them. Parsing every field builds a [`Value`] per field —
//! strings copied, objects and arrays built — only for most of them to be dropped unread.
//! [`parse_payload`] walks the whole text once (a payload that is not a JSON object is still
//! refused) but builds values only for the fields named; the others are skipped in place
//! (serde's `IgnoredAny`: no allocation). The fields kept are exactly those of the full
//! parse: same values, same order, a repeated key keeping its last value.
//!
//! A [`FieldSet`] is a hint: a reader that is given one may still receive more fields (a
//! store that does not project returns the whole payload), never fewer.

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::{Map, Value};
use std::fmt;
use std::sync::Arc;

/// The top-level payload fields a reader uses (`None` where one is expected: all of them).
pub type FieldSet = Arc<[String]>;

/// The payload `text` as a JSON object, with only the fields in `fields` (all of them for
/// `None`). Fails as a full parse would: on text that is not JSON, or not an object.
pub fn parse_payload(
    text: &str,
    fields: Option<&[String]>,
) -> serde_json::Result<Map<String, Value>> {
    match fields {
        None => serde_json::from_str(text),
        Some(fields) => {
            let mut de = serde_json::Deserializer::from_str(text);
            let map = Only(fields).deserialize(&mut de)?;
            de.end()?;
            Ok(map)
        }
    }
}

/// Deserializes a JSON object keeping the fields it names.
struct Only<'f>(&'f [String]);

impl<'de> DeserializeSeed<'de> for Only<'_> {
    type Value = Map<String, Value>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Only<'_> {
    type Value = Map<String, Value>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
        let mut map = Map::new();
        while let Some(key) = access.next_key_seed(Wanted(self.0))? {
            match key {
                Some(name) => {
                    map.insert(name, access.next_value::<Value>()?);
                }
                None => {
                    access.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(map)
    }
}

/// A key: `Some(owned)` when it is one of the fields, else `None` (not copied).
struct Wanted<'f>(&'f [String]);

impl<'de> DeserializeSeed<'de> for Wanted<'_> {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Wanted<'_> {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<Self::Value, E> {
        Ok(self.0.iter().any(|f| f == key).then(|| key.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    /// The projected parse keeps what the full parse has for the named fields, in the same
    /// order, and nothing else.
    #[test]
    fn keeps_the_named_fields_as_the_full_parse_has_them() {
        let text = r#"{"name":"hen-1","coop_id":"c1","breed":"leghorn","tags":["a",{"b":[1,2.5]}],
            "nested":{"x":{"y":null}},"n":18446744073709551615,"esc\"aped":"v\u00e9","flag":true}"#;
        let full: Map<String, Value> = serde_json::from_str(text).unwrap();
        for names in [
            vec![],
            vec!["name"],
            vec!["breed", "name"],
            vec!["tags", "nested", "missing"],
            vec!["esc\"aped", "n", "flag"],
        ] {
            let got = parse_payload(text, Some(&fields(&names))).unwrap();
            let want: Map<String, Value> = full
                .iter()
                .filter(|(k, _)| names.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            assert_eq!(got, want, "fields {names:?}");
            let order: Vec<&String> = got.keys().collect();
            let want_order: Vec<&String> = want.keys().collect();
            assert_eq!(order, want_order, "order of {names:?}");
        }
        assert_eq!(parse_payload(text, None).unwrap(), full);
    }

    /// A repeated key keeps its last value, as in the full parse.
    #[test]
    fn a_repeated_key_keeps_its_last_value() {
        let text = r#"{"a":1,"b":2,"a":3}"#;
        let full: Map<String, Value> = serde_json::from_str(text).unwrap();
        let got = parse_payload(text, Some(&fields(&["a"]))).unwrap();
        assert_eq!(got.get("a"), full.get("a"));
        assert_eq!(Value::Object(got), json!({"a": 3}));
    }

    /// Text the full parse refuses is refused too, even when the bad part is in a field
    /// that is skipped.
    #[test]
    fn refuses_what_the_full_parse_refuses() {
        let only = fields(&["name"]);
        for bad in [
            "",
            "[1,2]",
            "\"text\"",
            "{\"name\":\"x\"",
            "{\"name\":\"x\",\"other\":tru}",
            "{\"name\":\"x\",\"other\":\"\\q\"}",
            "{\"name\":\"x\"} trailing",
        ] {
            assert!(
                serde_json::from_str::<Map<String, Value>>(bad).is_err(),
                "{bad}"
            );
            assert!(parse_payload(bad, Some(&only)).is_err(), "{bad}");
        }
    }
}
