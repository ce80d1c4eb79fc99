//! Declarative projections: a document per key, its fields aggregates of input documents.
//!
//! # State
//!
//! For every input document and every `[[processor.from]]` it feeds, the projection keeps
//! what it needs to know the input's *contribution* again — the key it counted under and one
//! accumulator piece per field ([`crate::acc`]) — and for every key a *group*: the merged
//! accumulators and how many inputs count. Both are state rows of the output store,
//! committed with the documents and the input position in one transaction
//! ([`meshql_core::output`]):
//!
//! ```text
//! c/<from>/<input id>  (group = key)  {"o":[time,position],"d":{field: value, …}}
//! g/<key>                             {"key":…,"n":3,"f":[acc, …]}
//! ```
//!
//! A contribution row keeps the input's *fields that the `from` reads* (its key, filters,
//! defaults, aggregated fields and times; top-level names) and its order, not the pieces
//! themselves: the pieces are a function of those, recomputed when the input is updated or
//! deleted or its group folded again — which is rare — while every input pays for the row.
//! Measured on egg-economy's `farm_output`: 404 bytes of pieces against ~170 of fields, and
//! the pieces' serialisation was the larger cost. Rows written by earlier versions
//! (`{"key":…,"p":[…]}`) are still read.
//!
//! # One batch
//!
//! 1. each input change becomes its new contributions (none for a delete, a filtered-out
//!    document or a missing key); an input that cannot be read (a field that is not a number,
//!    a time that does not parse) is a dead letter and changes nothing;
//! 2. the old contributions and the groups they and the new ones touch are read, each once;
//! 3. inputs are applied in log order: the old piece is subtracted where the aggregate allows
//!    it ([`crate::acc::Acc::unmerge`]) — else the group is marked to be folded again from
//!    its stored contributions —, and the new piece merged;
//! 4. every touched group becomes one document version (a tombstone when no input counts any
//!    more): its key, aggregates, lookups and derived fields. A batch of 500 lay reports of 50
//!    hens writes 50 versions, not 500.
//!
//! # Lookups
//!
//! A derived field may read a related document (`[processor.lookup.<name>]`), which is read
//! when its group is written. So that a related document that changes — or arrives after the
//! inputs that name it — reaches the groups that read it, the projection also reads the
//! lookup entities' changes, and every group keeps an index row per lookup:
//!
//! ```text
//! l/<lookup>/<key>   (group = r/<lookup>/<related id>)   "1"
//! ```
//!
//! A change of a related document reads the rows of its `r/` group and writes those groups'
//! documents again. The ids the rows name are kept in the group row (`l`), so a row is
//! written only when a group's related id changes.
//!
//! An update of an input therefore moves its contribution (a corrected report does not count
//! twice, a report moved to another key leaves the first), a delete removes it, and a change
//! seen again after a crash finds its contribution already there and changes nothing.

pub mod spec;

use crate::acc::Acc;
use crate::plan::{Input, Outcome, PlanIo, Planner};
use crate::FieldPath;
use meshql_core::{ChangeOp, OutputWrite, StateWrite, StoreError};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use spec::ProjectionSpec;
use std::collections::{HashMap, HashSet};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Contribution {
    key: Value,
    /// One piece per field of its `from`, in order.
    p: Vec<Acc>,
    /// The state row's text (see the module docs), for a contribution computed from an input.
    #[serde(skip)]
    row: Option<String>,
}

impl PartialEq for Contribution {
    /// The same key and pieces: it counts the same (however it is stored).
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key && self.p == other.p
    }
}

/// An input's contributions: `(from, contribution)`, none where it no longer counts.
type Contributions = Vec<(usize, Option<Contribution>)>;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Group {
    key: Value,
    n: i64,
    /// One accumulator per aggregate of the projection, in order.
    f: Vec<Acc>,
    /// Per lookup, the related id its index row names (see the module docs); empty for a
    /// group written before lookups were indexed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    l: Vec<Option<String>>,
}

/// The text of a key: a string as it is, anything else as JSON.
pub fn key_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn contribution_key(from: usize, id: &str) -> String {
    format!("c/{from}/{id}")
}

/// The `from` of a contribution row's key (`c/<from>/<id>`).
fn from_of(ck: &str) -> Option<usize> {
    ck.split('/').nth(1).and_then(|f| f.parse().ok())
}

fn group_key(key: &str) -> String {
    format!("g/{key}")
}

/// The index row of group `key` for lookup `lookup` (see the module docs).
fn lookup_row(lookup: &str, key: &str) -> String {
    format!("l/{lookup}/{key}")
}

/// The group of the index rows naming related document `id` of lookup `lookup`.
fn lookup_group(lookup: &str, id: &str) -> String {
    format!("r/{lookup}/{id}")
}

/// A compiled projection.
#[derive(Debug, Clone)]
pub struct Projection {
    pub spec: ProjectionSpec,
    /// Per `from`, per field: the index of its aggregate in `spec.aggregates`.
    slots: Vec<Vec<usize>>,
    /// Per `from`: the top-level input fields it reads, sorted (what a contribution row keeps).
    reads: Vec<Vec<String>>,
}

/// The top-level input fields a `from` reads.
fn fields_read(from: &spec::From) -> Vec<String> {
    let mut paths: Vec<&FieldPath> = vec![&from.key];
    paths.extend(from.filter.iter().map(|(p, _)| p));
    for (_, agg) in &from.fields {
        paths.extend(agg.of.iter());
        paths.extend(agg.filter.iter().map(|(p, _)| p));
        paths.extend(agg.window.iter().map(|(_, p)| p));
    }
    let mut names: Vec<String> = paths
        .into_iter()
        .map(|p| p.text.split('.').next().unwrap_or_default().to_owned())
        .chain(from.defaults.keys().cloned())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// A group being changed by a batch.
struct Touched {
    group: Group,
    refold: bool,
    inputs: Vec<usize>,
}

impl Projection {
    pub fn new(spec: ProjectionSpec) -> Self {
        let slots = spec
            .from
            .iter()
            .map(|f| {
                f.fields
                    .iter()
                    .map(|(name, _)| {
                        spec.aggregates
                            .iter()
                            .position(|(a, _)| a == name)
                            .expect("every field has an aggregate")
                    })
                    .collect()
            })
            .collect();
        let reads = spec.from.iter().map(fields_read).collect();
        Self { spec, slots, reads }
    }

    /// The id of the document of `key`: the same on every run and rebuild.
    pub fn document_id(&self, key: &str) -> String {
        uuid::Uuid::new_v5(
            &uuid::Uuid::NAMESPACE_OID,
            format!("meshql:{}:{key}", self.spec.output).as_bytes(),
        )
        .to_string()
    }

    fn empty_group(&self, key: Value) -> Group {
        Group {
            key,
            n: 0,
            f: self
                .spec
                .aggregates
                .iter()
                .map(|(_, a)| a.empty())
                .collect(),
            l: Vec::new(),
        }
    }

    /// Whether documents read related documents (then lookups are indexed).
    fn looks_up(&self) -> bool {
        !self.spec.lookups.is_empty() && !self.spec.derive.is_empty()
    }

    /// Per lookup, the id of the related document a group reads (a string, or none).
    fn related_ids(&self, group: &Group) -> Vec<Option<String>> {
        self.spec
            .lookups
            .iter()
            .map(|l| {
                let v = if l.id == self.spec.key {
                    group.key.clone()
                } else {
                    let slot = self.spec.aggregates.iter().position(|(a, _)| *a == l.id);
                    slot.map(|s| group.f[s].value()).unwrap_or(Value::Null)
                };
                match v {
                    Value::String(id) => Some(id),
                    _ => None,
                }
            })
            .collect()
    }

    /// The contributions of one input (`(from, contribution)`), or why it cannot be read.
    fn contributions(&self, input: &Input) -> Result<Contributions, String> {
        let mut out = Vec::new();
        for (fi, from) in self.spec.from.iter().enumerate() {
            if from.entity != input.entity {
                continue;
            }
            if input.op == ChangeOp::Delete {
                out.push((fi, None));
                continue;
            }
            let c = self.contribution_of(fi, &input.payload, input.order)?;
            out.push((fi, c));
        }
        Ok(out)
    }

    /// What a document counts for `from` `fi` (`None`: it does not count), with its state
    /// row; or why it cannot be read.
    fn contribution_of(
        &self,
        fi: usize,
        payload: &Map<String, Value>,
        order: (i64, u64),
    ) -> Result<Option<Contribution>, String> {
        let from = &self.spec.from[fi];
        let missing = |k: &String| payload.get(k).is_none_or(Value::is_null);
        // a copy only when a default fills a gap
        let filled;
        let doc = if from.defaults.keys().any(missing) {
            let mut d = payload.clone();
            for (k, v) in &from.defaults {
                if d.get(k).is_none_or(Value::is_null) {
                    d.insert(k.clone(), v.clone());
                }
            }
            filled = d;
            &filled
        } else {
            payload
        };
        let admitted = from.filter.iter().all(|(path, allowed)| {
            let v = path.get(doc).unwrap_or(&Value::Null);
            allowed.iter().any(|a| a == v)
        });
        let key = from.key.get(doc).filter(|k| !k.is_null());
        let (true, Some(key)) = (admitted, key) else {
            return Ok(None);
        };
        let pieces = from
            .fields
            .iter()
            .map(|(name, agg)| {
                agg.piece(doc, order)
                    .map_err(|e| format!("field `{name}`: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some(Contribution {
            key: key.clone(),
            p: pieces,
            row: Some(self.row(fi, doc, order)),
        }))
    }

    /// A contribution's state row: the input's order and the fields `from` `fi` reads.
    fn row(&self, fi: usize, doc: &Map<String, Value>, order: (i64, u64)) -> String {
        let mut out = Vec::with_capacity(160);
        out.extend_from_slice(format!("{{\"o\":[{},{}],\"d\":{{", order.0, order.1).as_bytes());
        let mut first = true;
        for name in &self.reads[fi] {
            if let Some(v) = doc.get(name) {
                if !first {
                    out.push(b',');
                }
                first = false;
                serde_json::to_writer(&mut out, name).expect("a string serialises");
                out.push(b':');
                serde_json::to_writer(&mut out, v).expect("a value serialises");
            }
        }
        out.extend_from_slice(b"}}");
        String::from_utf8(out).expect("JSON is UTF-8")
    }

    /// A stored contribution row `ck` again (`None`: it no longer counts under this config).
    fn stored(&self, ck: &str, text: &str) -> Result<Option<Contribution>, StoreError> {
        #[derive(Deserialize)]
        struct Row {
            o: (i64, u64),
            d: Map<String, Value>,
        }
        let corrupt = |e: String| StoreError::Corrupt(format!("projection state `{ck}`: {e}"));
        if text.starts_with("{\"key\"") {
            // written by an earlier version: the pieces themselves
            return serde_json::from_str::<Contribution>(text)
                .map(Some)
                .map_err(|e| corrupt(e.to_string()));
        }
        let row: Row = serde_json::from_str(text).map_err(|e| corrupt(e.to_string()))?;
        let Some(fi) = from_of(ck).filter(|fi| *fi < self.spec.from.len()) else {
            return Ok(None); // a `from` no longer declared
        };
        let mut c = self
            .contribution_of(fi, &row.d, row.o)
            .map_err(|e| corrupt(format!("{e} (the projection changed? rebuild it)")))?;
        if let Some(c) = &mut c {
            c.row = Some(text.to_owned());
        }
        Ok(c)
    }

    /// Plans one batch (see the module docs).
    pub async fn plan_batch(
        &self,
        io: &dyn PlanIo,
        inputs: &[Input],
    ) -> Result<Outcome, StoreError> {
        let mut outcome = Outcome::default();
        // 1. new contributions
        let mut planned: Vec<(usize, Contributions)> = Vec::new();
        for (i, input) in inputs.iter().enumerate() {
            match self.contributions(input) {
                Ok(c) if !c.is_empty() => planned.push((i, c)),
                Ok(_) => {}
                Err(reason) => outcome.dead.push((i, reason)),
            }
        }
        // 2. old contributions and the groups, each read once
        let mut ckeys: Vec<String> = Vec::new();
        let mut absent: Vec<String> = Vec::new();
        let mut seen = HashSet::new();
        for (i, cs) in &planned {
            for (fi, _) in cs {
                let k = contribution_key(*fi, &inputs[*i].id);
                if seen.insert(k.clone()) {
                    // a fresh create has no stored contribution: one read less per input
                    if inputs[*i].fresh {
                        absent.push(k);
                    } else {
                        ckeys.push(k);
                    }
                }
            }
        }
        let mut staged: HashMap<String, Option<Contribution>> = HashMap::new();
        for k in absent {
            staged.insert(k, None);
        }
        let stored = io.state(&ckeys).await?;
        for k in &ckeys {
            let c = match stored.get(k) {
                Some(text) => self.stored(k, text)?,
                None => None,
            };
            staged.insert(k.clone(), c);
        }
        let committed: HashMap<String, Option<Contribution>> = staged.clone();
        let mut gkeys: Vec<String> = Vec::new();
        let mut gseen = HashSet::new();
        let mut want_group = |key: &Value| {
            let g = group_key(&key_text(key));
            if gseen.insert(g.clone()) {
                gkeys.push(g);
            }
        };
        for c in staged.values().flatten() {
            want_group(&c.key);
        }
        for (_, cs) in &planned {
            for (_, c) in cs.iter() {
                if let Some(c) = c {
                    want_group(&c.key);
                }
            }
        }
        // groups whose related documents changed: `(input, key)`
        let mut relooked: Vec<(usize, String)> = Vec::new();
        if self.looks_up() {
            for (i, input) in inputs.iter().enumerate() {
                for l in self
                    .spec
                    .lookups
                    .iter()
                    .filter(|l| l.entity == input.entity)
                {
                    let prefix = lookup_row(&l.name, "");
                    for (row, _) in io.group(&lookup_group(&l.name, &input.id)).await? {
                        if let Some(key) = row.strip_prefix(&prefix) {
                            let g = group_key(key);
                            if gseen.insert(g.clone()) {
                                gkeys.push(g);
                            }
                            relooked.push((i, key.to_owned()));
                        }
                    }
                }
            }
        }
        let stored_groups = io.state(&gkeys).await?;
        let mut groups: HashMap<String, Touched> = HashMap::new();
        let mut order: Vec<String> = Vec::new();
        // 3. apply in order
        for (i, cs) in planned {
            for (fi, new) in cs {
                let ck = contribution_key(fi, &inputs[i].id);
                let old = staged.get(&ck).cloned().flatten();
                if old == new {
                    continue; // a replay, or an update that changes nothing counted
                }
                if let Some(old) = &old {
                    let g = self.touch(
                        &mut groups,
                        &mut order,
                        &stored_groups,
                        &key_text(&old.key),
                        &old.key,
                        i,
                    )?;
                    g.group.n -= 1;
                    for (piece, slot) in old.p.iter().zip(&self.slots[fi]) {
                        if !g.group.f[*slot].unmerge(piece) {
                            g.refold = true;
                        }
                    }
                }
                if let Some(new) = &new {
                    let g = self.touch(
                        &mut groups,
                        &mut order,
                        &stored_groups,
                        &key_text(&new.key),
                        &new.key,
                        i,
                    )?;
                    g.group.n += 1;
                    for (piece, slot) in new.p.iter().zip(&self.slots[fi]) {
                        g.group.f[*slot].merge(piece);
                    }
                }
                staged.insert(ck, new);
            }
        }
        for (i, key) in relooked {
            // a group that no longer exists has no document to write again
            if groups.contains_key(&key) || stored_groups.contains_key(&group_key(&key)) {
                self.touch(
                    &mut groups,
                    &mut order,
                    &stored_groups,
                    &key,
                    &Value::Null,
                    i,
                )?;
            }
        }
        // refold what could not be undone, from the stored contributions and this batch's
        for key in &order {
            let touched = groups.get_mut(key).expect("ordered groups are touched");
            if !touched.refold {
                continue;
            }
            let mut fresh = self.empty_group(touched.group.key.clone());
            let mut counted: HashSet<String> = HashSet::new();
            for (ck, text) in io.group(key).await? {
                if !ck.starts_with("c/") {
                    continue; // an index row whose related id happens to equal a key
                }
                if let Some(now) = staged.get(&ck) {
                    // this batch changed it: its staged value is counted below
                    let _ = now;
                    continue;
                }
                if let Some(c) = self.stored(&ck, &text)? {
                    self.fold_into(&mut fresh, &ck, &c);
                }
                counted.insert(ck);
            }
            for (ck, c) in &staged {
                if let Some(c) = c {
                    if key_text(&c.key) == *key && counted.insert(ck.clone()) {
                        self.fold_into(&mut fresh, ck, c);
                    }
                }
            }
            fresh.l = std::mem::take(&mut touched.group.l);
            touched.group = fresh;
        }
        // state rows: contributions that changed, and groups
        let mut ck_sorted: Vec<&String> = staged.keys().collect();
        ck_sorted.sort();
        for ck in ck_sorted {
            let now = &staged[ck];
            if committed.get(ck) == Some(now) {
                continue;
            }
            outcome.state.push(StateWrite {
                key: ck.clone(),
                group: now.as_ref().map(|c| key_text(&c.key)),
                value: now.as_ref().map(|c| match &c.row {
                    Some(row) => row.clone(),
                    None => serde_json::to_string(c).expect("state serialises"),
                }),
            });
        }
        // 4. one document per touched group
        let mut looked_up: HashMap<(String, String), Option<Map<String, Value>>> = HashMap::new();
        for key in order {
            let touched = groups.get_mut(&key).expect("ordered groups are touched");
            let id = self.document_id(&key);
            if self.looks_up() {
                let now = if touched.group.n <= 0 {
                    vec![None; self.spec.lookups.len()]
                } else {
                    self.related_ids(&touched.group)
                };
                for (li, l) in self.spec.lookups.iter().enumerate() {
                    let was = touched.group.l.get(li).cloned().flatten();
                    if touched.group.l.len() == now.len() && was == now[li] {
                        continue;
                    }
                    outcome.state.push(StateWrite {
                        key: lookup_row(&l.name, &key),
                        group: now[li].as_deref().map(|id| lookup_group(&l.name, id)),
                        value: now[li].as_ref().map(|_| "1".to_owned()),
                    });
                }
                touched.group.l = now;
            }
            let touched = &groups[&key];
            if touched.group.n <= 0 {
                outcome.state.push(StateWrite {
                    key: group_key(&key),
                    group: None,
                    value: None,
                });
                outcome
                    .writes
                    .push((OutputWrite::Delete { id }, touched.inputs.clone()));
                continue;
            }
            outcome.state.push(StateWrite {
                key: group_key(&key),
                group: None,
                value: Some(serde_json::to_string(&touched.group).expect("state serialises")),
            });
            let doc = self.document(&touched.group, io, &mut looked_up).await?;
            outcome.writes.push((
                OutputWrite::Put {
                    id,
                    payload: serde_json::to_string(&doc).expect("a map serialises"),
                },
                touched.inputs.clone(),
            ));
        }
        Ok(outcome)
    }

    fn fold_into(&self, group: &mut Group, ck: &str, c: &Contribution) {
        let fi = from_of(ck).unwrap_or(usize::MAX);
        let Some(slots) = self.slots.get(fi) else {
            return; // a `from` no longer declared
        };
        group.n += 1;
        for (piece, slot) in c.p.iter().zip(slots) {
            group.f[*slot].merge(piece);
        }
    }

    fn touch<'g>(
        &self,
        groups: &'g mut HashMap<String, Touched>,
        order: &mut Vec<String>,
        stored: &HashMap<String, String>,
        k: &str,
        key: &Value,
        input: usize,
    ) -> Result<&'g mut Touched, StoreError> {
        if !groups.contains_key(k) {
            let group = match stored.get(&group_key(k)) {
                Some(text) => serde_json::from_str(text)
                    .map_err(|e| StoreError::Corrupt(format!("projection state `g/{k}`: {e}")))?,
                None => self.empty_group(key.clone()),
            };
            order.push(k.to_owned());
            groups.insert(
                k.to_owned(),
                Touched {
                    group,
                    refold: false,
                    inputs: Vec::new(),
                },
            );
        }
        let t = groups.get_mut(k).expect("inserted above");
        if t.inputs.last() != Some(&input) {
            t.inputs.push(input);
        }
        Ok(t)
    }

    /// The document of a group: key, aggregates, derived fields (nulls left out).
    async fn document(
        &self,
        group: &Group,
        io: &dyn PlanIo,
        cache: &mut HashMap<(String, String), Option<Map<String, Value>>>,
    ) -> Result<Map<String, Value>, StoreError> {
        let mut doc = Map::new();
        doc.insert(self.spec.key.clone(), group.key.clone());
        let mut hidden = Map::new();
        for ((name, _), acc) in self.spec.aggregates.iter().zip(&group.f) {
            let v = acc.value();
            if name.starts_with('_') {
                hidden.insert(name.clone(), v);
            } else if !v.is_null() {
                doc.insert(name.clone(), v);
            }
        }
        if self.spec.derive.is_empty() {
            return Ok(doc);
        }
        let mut related: HashMap<&str, Option<Map<String, Value>>> = HashMap::new();
        // the related ids were read off the group once, when its index rows were written
        for (l, id) in self.spec.lookups.iter().zip(group.l.iter().cloned()) {
            let found = match id {
                Some(id) => {
                    let k = (l.entity.clone(), id.clone());
                    if !cache.contains_key(&k) {
                        let d = io.lookup(&l.entity, &id).await?;
                        cache.insert(k.clone(), d);
                    }
                    cache[&k].clone()
                }
                _ => None,
            };
            related.insert(&l.name, found);
        }
        let mut own = doc.clone();
        own.extend(hidden);
        for (name, expr) in &self.spec.derive {
            let v = expr.eval(&|f| own.get(f).cloned().unwrap_or(Value::Null), &|l, f| {
                related
                    .get(l)
                    .and_then(|d| d.as_ref())
                    .and_then(|d| FieldPath::new(f).get(d).cloned())
                    .unwrap_or(Value::Null)
            });
            if !v.is_null() {
                doc.insert(name.clone(), v);
            }
        }
        Ok(doc)
    }
}

#[async_trait::async_trait]
impl Planner for Projection {
    fn kind(&self) -> &'static str {
        "projection"
    }

    async fn plan(&self, io: &dyn PlanIo, inputs: &[Input]) -> Result<Outcome, StoreError> {
        self.plan_batch(io, inputs).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EntityInfo;
    use serde_json::json;

    fn projection() -> Projection {
        let entities =
            [("lay_report", None), ("hen_productivity", None)].map(|(name, fields)| EntityInfo {
                name: name.into(),
                fields,
                properties: None,
                required: Vec::new(),
            });
        let settings = json!({
            "output": "hen_productivity", "key": "hen_id",
            "from": [{
                "entity": "lay_report", "key": "hen_id", "defaults": { "quality": "grade_a" },
                "fields": {
                    "farm_id": { "last": "farm_id" },
                    "total_eggs": { "sum": "eggs" },
                    "eggs_week": { "sum": "eggs", "window": "week", "time": "timestamp" },
                    "quality_rate": { "ratio": "eggs", "where": { "quality": ["grade_a"] } },
                    "meta": { "max": "meta.size" }
                }
            }]
        });
        Projection::new(spec::compile("hp", &settings, &entities).unwrap())
    }

    #[test]
    fn a_contribution_row_keeps_the_fields_read_and_gives_the_same_pieces_back() {
        let p = projection();
        assert_eq!(
            p.reads[0],
            ["eggs", "farm_id", "hen_id", "meta", "quality", "timestamp"]
        );
        let doc = json!({"hen_id": "h1", "farm_id": "f1", "eggs": 3, "timestamp": "2026-11-12T06:00:00Z",
            "meta": {"size": 4, "note": "kept whole"}, "coop_id": "not read"});
        let c = p
            .contribution_of(0, doc.as_object().unwrap(), (5, 9))
            .unwrap()
            .unwrap();
        let row = c.row.clone().unwrap();
        let stored: Value = serde_json::from_str(&row).unwrap();
        assert_eq!(stored["o"], json!([5, 9]));
        assert_eq!(stored["d"]["quality"], "grade_a", "the default, filled in");
        assert!(stored["d"].get("coop_id").is_none(), "{row}");
        assert_eq!(stored["d"]["meta"]["note"], "kept whole");
        // read back: the same key and pieces
        let again = p.stored("c/0/r1", &row).unwrap().unwrap();
        assert_eq!(again, c);
        assert_eq!(again.row.as_deref(), Some(row.as_str()));
        // a row of an earlier version (the pieces themselves) reads the same
        let old = serde_json::to_string(&c).unwrap();
        assert!(old.starts_with("{\"key\""), "{old}");
        assert_eq!(p.stored("c/0/r1", &old).unwrap().unwrap(), c);
        // a `from` no longer declared counts nothing; a row that is not JSON is an error
        assert_eq!(p.stored("c/7/r1", &row).unwrap(), None);
        assert!(p.stored("c/0/r1", "nope").is_err());
    }
}
