//! A projection's declaration (`[[processor]] type = "projection"`), checked and compiled.
//!
//! ```toml
//! [[processor]]
//! name = "hen_productivity"
//! type = "projection"
//! output = "hen_productivity"   # the entity written: one document per key
//! key = "hen_id"                # its field holding the key
//!
//! [[processor.from]]            # an input entity; several may feed one projection
//! entity = "lay_report"
//! key = "hen_id"                # the input field whose value is the key
//! defaults = { quality = "grade_a" }      # values of missing input fields
//! [processor.from.fields]       # output field = aggregate of this input's documents
//! total_eggs = { sum = "eggs" }
//! eggs_today = { sum = "eggs", window = "day", time = "timestamp" }
//! quality_rate = { ratio = "eggs", where = { quality = ["grade_a", "double_yolk"] } }
//! _weeks = { count_distinct = "timestamp", bucket = "week" }   # weeks with a report
//!
//! [processor.lookup.farm]       # a related document, read by id when a key changes
//! entity = "farm"
//! id = "farm_id"                # the output field holding its id
//!
//! [processor.derive]            # output fields computed from the others (crate::expr)
//! farm_type = "coalesce(farm.farm_type, 'local_farm')"
//! ```
//!
//! An aggregate whose name starts with `_` is kept for derived fields but not written to the
//! document (`_net = { sum = "eggs" }`, `current_eggs = "max(0, _net)"`).

use crate::acc::{Aggregate, Kind, Window};
use crate::expr::Expr;
use crate::{EntityInfo, FieldPath};
use meshql_core::{parse_settings, SettingError};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    output: String,
    key: String,
    #[serde(default)]
    batch: Option<usize>,
    #[serde(default = "yes")]
    enabled: bool,
    from: Vec<FromSettings>,
    #[serde(default)]
    lookup: BTreeMap<String, LookupSettings>,
    #[serde(default)]
    derive: Map<String, Value>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FromSettings {
    entity: String,
    key: String,
    #[serde(default)]
    defaults: Map<String, Value>,
    #[serde(default, rename = "where")]
    filter: BTreeMap<String, OneOrMany>,
    fields: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    Many(Vec<Value>),
    One(Value),
}

impl OneOrMany {
    fn values(self) -> Vec<Value> {
        match self {
            OneOrMany::Many(v) => v,
            OneOrMany::One(v) => vec![v],
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AggregateSettings {
    #[serde(default)]
    count: Option<bool>,
    #[serde(default)]
    sum: Option<String>,
    #[serde(default)]
    min: Option<String>,
    #[serde(default)]
    max: Option<String>,
    #[serde(default)]
    last: Option<String>,
    #[serde(default)]
    avg: Option<String>,
    #[serde(default)]
    ratio: Option<String>,
    #[serde(default)]
    count_distinct: Option<String>,
    /// Subtract the field instead of adding it (`sum`).
    #[serde(default)]
    negate: bool,
    #[serde(default, rename = "where")]
    filter: BTreeMap<String, OneOrMany>,
    #[serde(default)]
    window: Option<Window>,
    #[serde(default)]
    time: Option<String>,
    /// `count_distinct` of a time field: distinct days, weeks or months.
    #[serde(default)]
    bucket: Option<Window>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LookupSettings {
    entity: String,
    id: String,
}

/// One input of a projection, compiled.
#[derive(Debug, Clone)]
pub struct From {
    pub entity: String,
    pub key: FieldPath,
    pub defaults: Map<String, Value>,
    pub filter: Vec<(FieldPath, Vec<Value>)>,
    /// `(output field, aggregate)`, in declaration order.
    pub fields: Vec<(String, Aggregate)>,
}

/// A related document read by id.
#[derive(Debug, Clone)]
pub struct Lookup {
    pub name: String,
    pub entity: String,
    /// The output field holding the id.
    pub id: String,
}

/// A checked projection.
#[derive(Debug, Clone)]
pub struct ProjectionSpec {
    pub name: String,
    pub output: String,
    pub key: String,
    pub batch: usize,
    pub enabled: bool,
    pub from: Vec<From>,
    /// Every aggregate field of the output, with its kind (the same from every input),
    /// in declaration order.
    pub aggregates: Vec<(String, Aggregate)>,
    pub lookups: Vec<Lookup>,
    pub derive: Vec<(String, Expr)>,
    /// Kafka topics or a NATS stream to read instead of the service's change log.
    pub source: Option<std::sync::Arc<dyn crate::source::Source>>,
}

impl ProjectionSpec {
    /// The entities whose changes the projection reads.
    pub fn inputs(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for f in &self.from {
            if !out.contains(&f.entity) {
                out.push(f.entity.clone());
            }
        }
        out
    }

    /// The entities whose changes the projection reads: its inputs and, when derived
    /// fields read related documents, the lookups' entities (so a related document that
    /// changes or arrives late reaches the groups that read it). A projection fed by a
    /// `source` reads only the source's tables: its related documents are read when a group
    /// is written, and not followed.
    pub fn reads(&self) -> Vec<String> {
        let mut out = self.inputs();
        if !self.derive.is_empty() {
            for l in &self.lookups {
                if !out.contains(&l.entity) {
                    out.push(l.entity.clone());
                }
            }
        }
        out
    }
}

fn err(field: impl Into<String>, message: impl Into<String>) -> SettingError {
    SettingError::new(field, message)
}

fn entity<'e>(
    entities: &'e [EntityInfo],
    name: &str,
    field: &str,
) -> Result<&'e EntityInfo, SettingError> {
    entities.iter().find(|e| e.name == name).ok_or_else(|| {
        let known: Vec<&str> = entities.iter().map(|e| e.name.as_str()).collect();
        err(
            field,
            format!(
                "unknown entity `{name}` (this config has: {})",
                known.join(", ")
            ),
        )
    })
}

/// The field must be one of the entity's JSON Schema properties (when it declares them).
fn has_field(e: &EntityInfo, path: &str, field: &str) -> Result<(), SettingError> {
    let top = path.split('.').next().unwrap_or(path);
    match &e.fields {
        Some(fields) if top != "id" && !fields.iter().any(|f| f == top) => Err(err(
            field,
            format!(
                "entity `{}` has no field `{top}` (its JSON Schema has: {})",
                e.name,
                fields.join(", ")
            ),
        )),
        _ => Ok(()),
    }
}

/// Checks a projection's fields against the service's entities.
pub fn compile(
    name: &str,
    settings: &Value,
    entities: &[EntityInfo],
) -> Result<ProjectionSpec, SettingError> {
    let s: Settings = parse_settings(settings)?;
    let output = entity(entities, &s.output, "output")?;
    has_field(output, &s.key, "key")?;
    if s.from.is_empty() {
        return Err(err(
            "from",
            "a projection needs at least one `[[processor.from]]`",
        ));
    }
    if let Some(b) = s.batch {
        if !(1..=10_000).contains(&b) {
            return Err(err("batch", "must be between 1 and 10000"));
        }
    }
    let mut from = Vec::new();
    let mut kinds: Vec<(String, Aggregate)> = Vec::new();
    for (i, f) in s.from.into_iter().enumerate() {
        let at = |rest: &str| format!("from[{i}].{rest}");
        let input = entity(entities, &f.entity, &at("entity"))?;
        has_field(input, &f.key, &at("key"))?;
        let mut filter = Vec::new();
        for (field, values) in f.filter {
            has_field(input, &field, &at(&format!("where.{field}")))?;
            filter.push((FieldPath::new(&field), values.values()));
        }
        for field in f.defaults.keys() {
            has_field(input, field, &at(&format!("defaults.{field}")))?;
        }
        if f.fields.is_empty() {
            return Err(err(at("fields"), "name at least one output field"));
        }
        let mut fields = Vec::new();
        for (out_field, decl) in f.fields {
            let here = at(&format!("fields.{out_field}"));
            if out_field == s.key || out_field == "id" {
                return Err(err(
                    here,
                    format!("`{out_field}` is set by the projection itself"),
                ));
            }
            // `_name`: kept for derived fields, not written to the document
            if !out_field.starts_with('_') {
                has_field(output, &out_field, &here)?;
            }
            let decl: AggregateSettings = parse_settings(&decl).map_err(|e| SettingError {
                field: Some(match e.field {
                    Some(f) => format!("{here}.{f}"),
                    None => here.clone(),
                }),
                message: e.message,
            })?;
            let aggregate = aggregate(decl, input, &here)?;
            match kinds.iter().find(|(f, _)| *f == out_field) {
                Some((_, other)) if other.kind != aggregate.kind || other.window.as_ref().map(|w| w.0) != aggregate.window.as_ref().map(|w| w.0) => {
                    return Err(err(
                        here,
                        format!(
                            "`{out_field}` is a {} here and a {} from another input: one field, one aggregate",
                            describe(&aggregate),
                            describe(other)
                        ),
                    ))
                }
                Some(_) => {}
                None => kinds.push((out_field.clone(), aggregate.clone())),
            }
            fields.push((out_field, aggregate));
        }
        from.push(From {
            entity: f.entity,
            key: FieldPath::new(&f.key),
            defaults: f.defaults,
            filter,
            fields,
        });
    }
    let mut lookups = Vec::new();
    for (lname, l) in s.lookup {
        let here = format!("lookup.{lname}");
        entity(entities, &l.entity, &format!("{here}.entity"))?;
        if l.id != s.key && !kinds.iter().any(|(f, _)| *f == l.id) {
            return Err(err(
                format!("{here}.id"),
                format!(
                    "`{}` is neither the key nor an aggregate field of this projection",
                    l.id
                ),
            ));
        }
        lookups.push(Lookup {
            name: lname,
            entity: l.entity,
            id: l.id,
        });
    }
    let mut derive = Vec::new();
    for (field, text) in s.derive {
        let here = format!("derive.{field}");
        let Value::String(text) = text else {
            return Err(err(here, "an expression is a string"));
        };
        has_field(output, &field, &here)?;
        if field == s.key || kinds.iter().any(|(f, _)| *f == field) {
            return Err(err(
                here,
                format!("`{field}` is already an aggregate or the key"),
            ));
        }
        let expr = Expr::parse(&text).map_err(|e| err(here.clone(), e.to_string()))?;
        for (lookup, name) in expr.references() {
            match lookup {
                None if name == s.key || kinds.iter().any(|(f, _)| f == name) => {}
                None => {
                    return Err(err(
                        here,
                        format!(
                            "`{name}` is neither the key nor an aggregate field of this projection"
                        ),
                    ))
                }
                Some(l) => {
                    let Some(lk) = lookups.iter().find(|x| x.name == l) else {
                        return Err(err(
                            here,
                            format!("no `[processor.lookup.{l}]` is declared"),
                        ));
                    };
                    let target = entity(entities, &lk.entity, &here)?;
                    has_field(target, name, &here)?;
                }
            }
        }
        derive.push((field, expr));
    }
    Ok(ProjectionSpec {
        name: name.to_owned(),
        output: s.output,
        key: s.key,
        batch: s.batch.unwrap_or(500),
        enabled: s.enabled,
        from,
        aggregates: kinds,
        lookups,
        derive,
        source: None,
    })
}

fn describe(a: &Aggregate) -> String {
    match a.window {
        Some((w, _)) => format!("`{}` over a {w:?} window", a.kind.name()).to_lowercase(),
        None => format!("`{}`", a.kind.name()),
    }
}

fn aggregate(
    d: AggregateSettings,
    input: &EntityInfo,
    here: &str,
) -> Result<Aggregate, SettingError> {
    let mut chosen: Vec<(Kind, Option<String>)> = Vec::new();
    if let Some(c) = d.count {
        if !c {
            return Err(err(
                here.to_owned() + ".count",
                "`count = true` or leave it out",
            ));
        }
        chosen.push((Kind::Count, None));
    }
    for (kind, f) in [
        (Kind::Sum, d.sum),
        (Kind::Min, d.min),
        (Kind::Max, d.max),
        (Kind::Last, d.last),
        (Kind::Avg, d.avg),
        (Kind::Ratio, d.ratio),
        (Kind::CountDistinct, d.count_distinct),
    ] {
        if let Some(f) = f {
            chosen.push((kind, Some(f)));
        }
    }
    if chosen.len() != 1 {
        return Err(err(
            here,
            "name exactly one aggregate: count, sum, min, max, last, avg, ratio or count_distinct",
        ));
    }
    let (kind, of) = chosen.pop().expect("one");
    if let Some(of) = &of {
        has_field(input, of, &format!("{here}.{}", kind.name()))?;
    }
    if d.negate && !matches!(kind, Kind::Sum) {
        return Err(err(
            here.to_owned() + ".negate",
            "only a `sum` can be negated",
        ));
    }
    let mut filter = Vec::new();
    for (field, values) in d.filter {
        has_field(input, &field, &format!("{here}.where.{field}"))?;
        filter.push((FieldPath::new(&field), values.values()));
    }
    if kind == Kind::Ratio && filter.is_empty() {
        return Err(err(
            here.to_owned() + ".where",
            "a ratio is the share of inputs matching `where`: give one",
        ));
    }
    let window = match (d.window, d.time) {
        (Some(w), Some(t)) => {
            has_field(input, &t, &format!("{here}.time"))?;
            if !matches!(
                kind,
                Kind::Sum | Kind::Count | Kind::CountDistinct | Kind::Avg
            ) {
                return Err(err(
                    here.to_owned() + ".window",
                    "windows apply to count, sum, avg and count_distinct",
                ));
            }
            Some((w, FieldPath::new(&t)))
        }
        (Some(_), None) => {
            return Err(err(
                here.to_owned() + ".time",
                "a window needs the input field holding each input's `time`",
            ))
        }
        (None, Some(_)) => {
            return Err(err(
                here.to_owned() + ".time",
                "`time` goes with a `window`",
            ))
        }
        (None, None) => None,
    };
    if d.bucket.is_some() && kind != Kind::CountDistinct {
        return Err(err(
            here.to_owned() + ".bucket",
            "`bucket` goes with `count_distinct` of a time field",
        ));
    }
    Ok(Aggregate {
        kind,
        of: of.map(|f| FieldPath::new(&f)),
        negate: d.negate,
        filter,
        window,
        bucket: d.bucket,
    })
}

/// Several projections may not write one entity: their documents' ids would collide.
pub fn check_outputs(specs: &[&ProjectionSpec]) -> Result<(), (usize, SettingError)> {
    let mut seen: HashMap<&str, &str> = HashMap::new();
    for (i, s) in specs.iter().enumerate() {
        if let Some(other) = seen.insert(&s.output, &s.name) {
            return Err((
                i,
                err(
                    "output",
                    format!("projection \"{other}\" writes `{}` already", s.output),
                ),
            ));
        }
    }
    Ok(())
}
