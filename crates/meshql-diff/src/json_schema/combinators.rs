//! Combining keywords: `allOf`, `anyOf`, `oneOf`, `not`, `if`/`then`/`else` and the
//! dependency keywords. Only the clear cases are decided; the rest is dangerous.

use super::refs::has_ref;
use super::{child, list, names, Differ, TRUE};
use crate::change::Level;
use serde_json::{Map, Value};

impl Differ<'_> {
    pub(super) fn all_of(&mut self, o: &Map<String, Value>, n: &Map<String, Value>, path: &str) {
        let no_members = Vec::new();
        let old = o
            .get("allOf")
            .and_then(Value::as_array)
            .unwrap_or(&no_members);
        let new = n
            .get("allOf")
            .and_then(Value::as_array)
            .unwrap_or(&no_members);
        if old == new && !old.iter().any(has_ref) {
            return;
        }
        let base = child(path, "allOf");
        // members found unchanged on both sides are set aside; the others pair up in order
        let mut old_left: Vec<&Value> = old.iter().collect();
        let mut new_left: Vec<(usize, &Value)> = Vec::new();
        for (j, member) in new.iter().enumerate() {
            match old_left.iter().position(|m| *m == member && !has_ref(m)) {
                Some(i) => {
                    old_left.remove(i);
                }
                None => new_left.push((j, member)),
            }
        }
        let pairs = old_left.len().min(new_left.len());
        for (old_member, (j, new_member)) in old_left.iter().zip(&new_left) {
            self.schema(old_member, new_member, &child(&base, &j.to_string()));
        }
        for (j, _) in &new_left[pairs..] {
            self.push(
                Level::Breaking,
                &child(&base, &j.to_string()),
                "allOf member added: documents must satisfy it too",
            );
        }
        for _ in &old_left[pairs..] {
            self.push(Level::Safe, &base, "allOf member removed (loosened)");
        }
    }

    /// `anyOf` and `oneOf`: only the clear cases are decided; the rest is dangerous.
    pub(super) fn alternatives(
        &mut self,
        o: &Map<String, Value>,
        n: &Map<String, Value>,
        path: &str,
        kw: &str,
    ) {
        let at = child(path, kw);
        let (old, new) = match (
            o.get(kw).and_then(Value::as_array),
            n.get(kw).and_then(Value::as_array),
        ) {
            (None, None) => return,
            (None, Some(_)) => {
                self.push(
                    Level::Breaking,
                    &at,
                    format!("{kw} added: documents must now match its alternatives"),
                );
                return;
            }
            (Some(_), None) => {
                self.push(Level::Safe, &at, format!("{kw} removed (loosened)"));
                return;
            }
            (Some(old), Some(new)) => (old, new),
        };
        if old == new && !old.iter().any(has_ref) {
            return;
        }
        let kept = |member: &Value, among: &[Value]| !has_ref(member) && among.contains(member);
        let added: Vec<usize> = (0..new.len()).filter(|&j| !kept(&new[j], old)).collect();
        let removed = old.iter().filter(|m| !kept(m, new)).count();
        if removed == 0 {
            for j in added {
                let at = child(&at, &j.to_string());
                if kw == "anyOf" {
                    self.push(Level::Safe, &at, "anyOf alternative added (loosened)");
                } else {
                    self.push(
                        Level::Dangerous,
                        &at,
                        "oneOf alternative added: a document that matched exactly one \
                         alternative may now match two and be rejected",
                    );
                }
            }
            return;
        }
        if old.len() != new.len() {
            self.push(
                Level::Dangerous,
                &at,
                format!(
                    "{kw} alternatives changed ({} before, {} now, {removed} no longer \
                     present); cannot decide whether every document still matches, review it",
                    old.len(),
                    new.len()
                ),
            );
            return;
        }
        // same number of alternatives: compare them position by position
        let inner = self.capture(|d| {
            for (i, (a, b)) in old.iter().zip(new).enumerate() {
                d.schema(a, b, &child(&at, &i.to_string()));
            }
        });
        for mut change in inner {
            if change.level == Level::Breaking {
                change.level = Level::Dangerous;
                change.message.push_str(&format!(
                    " (within {kw}: another alternative may still accept the document; \
                     cannot decide)"
                ));
            }
            self.changes.push(change);
        }
    }

    /// `not` and `if`/`then`/`else`: added constrains, removed loosens, changed is undecided.
    pub(super) fn conditions(
        &mut self,
        o: &Map<String, Value>,
        n: &Map<String, Value>,
        path: &str,
    ) {
        let at = child(path, "not");
        match (o.get("not"), n.get("not")) {
            (None, None) => {}
            (None, Some(_)) => self.push(
                Level::Breaking,
                &at,
                "not added: documents matching it are rejected",
            ),
            (Some(_), None) => self.push(Level::Safe, &at, "not removed (loosened)"),
            (Some(a), Some(b)) => {
                if a != b || has_ref(a) || has_ref(b) {
                    let inner = self.capture(|d| d.schema(a, b, &at));
                    if !inner.is_empty() {
                        self.push(
                            Level::Dangerous,
                            &at,
                            "the schema under `not` changed; cannot decide (a wider `not` \
                             rejects more), review it",
                        );
                    }
                }
            }
        }
        fn conditional(m: &Map<String, Value>) -> [Option<&Value>; 3] {
            [m.get("if"), m.get("then"), m.get("else")]
        }
        let (old, new) = (conditional(o), conditional(n));
        let at = child(path, "if");
        match (old[0].is_some(), new[0].is_some()) {
            (false, false) => {}
            (false, true) => self.push(
                Level::Breaking,
                &at,
                "conditional (if/then/else) added: documents must satisfy it",
            ),
            (true, false) => self.push(Level::Safe, &at, "conditional (if/then/else) removed"),
            (true, true) => {
                if old != new || old.iter().flatten().any(|v| has_ref(v)) {
                    let inner = self.capture(|d| {
                        for (kw, (a, b)) in ["if", "then", "else"].iter().zip(old.iter().zip(&new))
                        {
                            d.schema(a.unwrap_or(&TRUE), b.unwrap_or(&TRUE), &child(path, kw));
                        }
                    });
                    if !inner.is_empty() {
                        self.push(
                            Level::Dangerous,
                            &at,
                            "conditional (if/then/else) changed; cannot decide, review it",
                        );
                    }
                }
            }
        }
    }

    /// `dependentRequired`, `dependentSchemas`, draft-07 `dependencies`, per property.
    pub(super) fn dependencies(
        &mut self,
        o: &Map<String, Value>,
        n: &Map<String, Value>,
        path: &str,
    ) {
        let empty = Map::new();
        for kw in ["dependentRequired", "dependentSchemas", "dependencies"] {
            let old = o.get(kw).and_then(Value::as_object).unwrap_or(&empty);
            let new = n.get(kw).and_then(Value::as_object).unwrap_or(&empty);
            let base = child(path, kw);
            for (name, before) in old {
                let at = child(&base, name);
                match new.get(name) {
                    None => self.push(
                        Level::Safe,
                        &at,
                        format!("{kw} of `{name}` removed (loosened)"),
                    ),
                    Some(after) if after == before && !has_ref(after) => {}
                    Some(after) => match (before, after) {
                        (Value::Array(_), Value::Array(_)) => {
                            let (b, a) = (names(Some(before)), names(Some(after)));
                            let more: Vec<&str> =
                                a.iter().filter(|x| !b.contains(x)).copied().collect();
                            if !more.is_empty() {
                                self.push(
                                    Level::Breaking,
                                    &at,
                                    format!(
                                        "with `{name}` present, {} now required too",
                                        list(&more)
                                    ),
                                );
                            } else {
                                self.push(Level::Safe, &at, format!("{kw} of `{name}` loosened"));
                            }
                        }
                        (before, after) => self.schema(before, after, &at),
                    },
                }
            }
            for name in new.keys().filter(|k| !old.contains_key(*k)) {
                self.push(
                    Level::Breaking,
                    &child(&base, name),
                    format!("{kw} of `{name}` added: documents with `{name}` must satisfy it"),
                );
            }
        }
    }
}
