//! Query templates: how a GraphQL root query's arguments select documents.
//!
//! Two forms are accepted, both parsed once at start-up:
//!
//! * **Filter** (Mongo-style JSON, every backend): `{"id": "{{id}}"}`,
//!   `{"payload.farm_id": "{{id}}"}`, `{}` for all documents. Each key is `id` or
//!   `payload.<dotted.path>`; each value is a literal, a whole placeholder `"{{arg}}"`
//!   (bound to the argument's JSON value), or a string with placeholders inside
//!   (`"zone-{{zone}}"`, bound as the rendered string). Keys combine with AND. A value may
//!   also be an object of MongoDB operators (`{"$gte": "{{min}}", "$lt": 10}`, `$ne`, `$in`,
//!   `$nin`, `$regex` + `$options`, `$exists`), and `$and`/`$or` take lists of filters: such
//!   templates (and any with a sort, [`QueryTemplate::with_sort`]) become
//!   [`TemplateKind::Query`], a typed predicate tree whose semantics [`Cond`] defines and
//!   every backend follows; plain equalities stay [`TemplateKind::Filter`].
//! * **Sql** (raw SQL fragments, SQL backends, for configs written for MeshQL's Java/TS
//!   servers): `id = '{{id}}'`, `json_extract(payload, '$.farm_id') = '{{id}}'`. Placeholders
//!   are never spliced into the SQL text: `'{{x}}'` becomes a bound parameter, and a string
//!   literal with a placeholder inside becomes a concatenation of literals and parameters.
//!
//! Templates are evaluated against the latest visible version of each document
//! ("latest, then filter"), see the storage contract.

use serde_json::{Map, Value};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use thiserror::Error;

/// Arguments of a query, by name (GraphQL argument values as JSON).
pub type BoundArgs = Map<String, Value>;

#[derive(Debug, Error, PartialEq)]
pub enum TemplateError {
    #[error("template is not a JSON object: {0}")]
    NotAnObject(String),
    #[error("unsupported template key `{0}`: use `id` or `payload.<field>`")]
    UnsupportedKey(String),
    #[error("unsupported template value for `{key}`: {reason}")]
    UnsupportedValue { key: String, reason: String },
    #[error("unterminated placeholder in `{0}`")]
    Unterminated(String),
    #[error("unterminated string literal in SQL fragment `{0}`")]
    UnterminatedLiteral(String),
    #[error("unsupported operator `{op}` on `{key}`: meshql supports $eq, $ne, $gt, $gte, $lt, $lte, $in, $nin, $regex (+ $options \"i\"), $exists, $and, $or")]
    UnknownOperator { key: String, op: String },
    #[error("bad operand of `{op}` on `{key}`: {reason}")]
    BadOperand {
        key: String,
        op: String,
        reason: String,
    },
    #[error("regular expression `{pattern}`: {reason}")]
    Regex { pattern: String, reason: String },
    #[error("bad sort `{sort}`: {reason}")]
    BadSort { sort: String, reason: String },
}

/// Where a filter looks in a document.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum FieldPath {
    /// The envelope id.
    Id,
    /// A (possibly nested) payload field: `payload.a.b` is `["a", "b"]`.
    Payload(Vec<String>),
}

impl FieldPath {
    /// The SQL/JSON path of a payload field, e.g. `$.farm_id`; `None` for the envelope id.
    pub fn json_path(&self) -> Option<String> {
        match self {
            FieldPath::Id => None,
            FieldPath::Payload(segments) => {
                let mut path = String::from("$");
                for s in segments {
                    path.push('.');
                    path.push_str(s);
                }
                Some(path)
            }
        }
    }

    /// Looks the field up in a payload map.
    pub fn lookup<'a>(&self, id: &'a str, payload: &'a Map<String, Value>) -> Option<Value> {
        match self {
            FieldPath::Id => Some(Value::String(id.to_owned())),
            FieldPath::Payload(segments) => {
                let mut cur = payload.get(segments.first()?)?;
                for s in &segments[1..] {
                    cur = cur.as_object()?.get(s)?;
                }
                Some(cur.clone())
            }
        }
    }
}

/// One piece of a string with placeholders.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Text(String),
    Arg(String),
}

/// The right-hand side of a filter predicate.
#[derive(Debug, Clone, PartialEq)]
pub enum ArgValue {
    /// `"{{name}}"`: the argument's JSON value.
    Arg(String),
    /// A fixed JSON value.
    Literal(Value),
    /// A string with placeholders inside, rendered with the arguments.
    Interpolated(Vec<Piece>),
}

impl ArgValue {
    /// The value to compare against, given the query's arguments. Missing arguments are
    /// `Null`, which matches nothing.
    pub fn bind(&self, args: &BoundArgs) -> Value {
        match self {
            ArgValue::Arg(name) => args.get(name).cloned().unwrap_or(Value::Null),
            ArgValue::Literal(v) => v.clone(),
            ArgValue::Interpolated(pieces) => Value::String(render(pieces, args)),
        }
    }
}

/// Renders pieces with the arguments (strings as they are, other values as JSON).
pub fn render(pieces: &[Piece], args: &BoundArgs) -> String {
    let mut out = String::new();
    for p in pieces {
        match p {
            Piece::Text(t) => out.push_str(t),
            Piece::Arg(name) => match args.get(name) {
                Some(Value::String(s)) => out.push_str(s),
                Some(Value::Null) | None => {}
                Some(other) => out.push_str(&other.to_string()),
            },
        }
    }
    out
}

/// One piece of a raw SQL fragment.
#[derive(Debug, Clone, PartialEq)]
pub enum SqlPiece {
    /// SQL text, copied as it is.
    Text(String),
    /// A bound parameter holding the argument's value (as text when it stands in quotes).
    Param { arg: String, as_text: bool },
}

static NEXT_TEMPLATE_ID: AtomicU64 = AtomicU64::new(1);

/// A parsed query template.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryTemplate {
    /// Unique per parsed template: backends key compiled statements by it.
    pub id: u64,
    /// The text as written in the config.
    pub source: String,
    pub kind: TemplateKind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum TemplateKind {
    /// Conjunction of equality predicates (empty = all documents).
    Filter(Vec<(FieldPath, ArgValue)>),
    /// A raw SQL boolean expression over the columns `id` and `payload`.
    Sql(Vec<SqlPiece>),
    /// A template with Mongo query operators (`$gt`, `$in`, `$regex`, `$or`, …) and/or a
    /// sort order. Templates of plain equalities without a sort stay [`TemplateKind::Filter`]
    /// (and so keep their statements); see [`crate::template::Cond`] for the semantics.
    Query(QuerySpec),
}

/// The predicate tree and sort order of a [`TemplateKind::Query`] template.
#[derive(Debug, Clone, PartialEq)]
pub struct QuerySpec {
    /// Conditions that must all hold (empty = every document).
    pub conds: Vec<Cond>,
    /// Sort keys, most significant first; ties keep the default (creation) order.
    pub sort: Vec<SortKey>,
}

/// One sort key: a field and its direction.
#[derive(Debug, Clone, PartialEq)]
pub struct SortKey {
    pub path: FieldPath,
    pub descending: bool,
}

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Gt,
    Gte,
    Lt,
    Lte,
}

impl CmpOp {
    /// The SQL operator of an ordering comparison (`Eq`/`Ne` are compiled differently).
    pub fn sql(self) -> &'static str {
        match self {
            CmpOp::Eq => "=",
            CmpOp::Ne => "<>",
            CmpOp::Gt => ">",
            CmpOp::Gte => ">=",
            CmpOp::Lt => "<",
            CmpOp::Lte => "<=",
        }
    }

    /// The Mongo operator name.
    pub fn mongo(self) -> &'static str {
        match self {
            CmpOp::Eq => "$eq",
            CmpOp::Ne => "$ne",
            CmpOp::Gt => "$gt",
            CmpOp::Gte => "$gte",
            CmpOp::Lt => "$lt",
            CmpOp::Lte => "$lte",
        }
    }
}

/// A list operand (`$in`, `$nin`).
#[derive(Debug, Clone, PartialEq)]
pub enum ListValue {
    /// `"{{ids}}"`: the argument, which should be a list (a single value is a list of one;
    /// a missing or null argument is the empty list).
    Arg(String),
    /// `["a", "{{x}}"]`: items written in the template.
    Items(Vec<ArgValue>),
}

impl ListValue {
    /// The list's values for these arguments (nulls dropped: they match nothing).
    pub fn bind(&self, args: &BoundArgs) -> Vec<Value> {
        let mut out = match self {
            ListValue::Arg(name) => match args.get(name) {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(items)) => items.clone(),
                Some(other) => vec![other.clone()],
            },
            ListValue::Items(items) => items.iter().map(|i| i.bind(args)).collect(),
        };
        out.retain(|v| !v.is_null());
        out
    }
}

/// One condition of a [`QuerySpec`]. The semantics are the same on every backend:
///
/// * `Cmp` `Eq`: the field equals the bound value (a missing or null bound value matches
///   nothing, as equality templates always did). `Ne`: not `Eq` — a document without the
///   field matches.
/// * `Cmp` `Gt`/`Gte`/`Lt`/`Lte`: only values of the same JSON type compare: a number with a
///   number (numerically), a string with a string (by Unicode code point, i.e. UTF-8 bytes).
///   Anything else — a missing field, a field of another type, a bound value that is not a
///   number or a string — does not match (Mongo's type bracketing).
/// * `In`: the field equals one of the list's values; `negate` (`$nin`): it equals none of
///   them (a missing field matches). Fields holding arrays are compared as whole values.
/// * `Regex`: the field is a string matching the pattern (portable subset, see
///   [`check_portable_regex`]), anywhere in the string unless anchored; `ignore_case` is
///   Mongo's `$options: "i"`.
/// * `Exists`: the field is present (with any value, `null` included) or absent.
#[derive(Debug, Clone, PartialEq)]
pub enum Cond {
    Cmp {
        path: FieldPath,
        op: CmpOp,
        value: ArgValue,
    },
    In {
        path: FieldPath,
        list: ListValue,
        negate: bool,
    },
    Regex {
        path: FieldPath,
        pattern: ArgValue,
        ignore_case: bool,
    },
    Exists {
        path: FieldPath,
        exists: bool,
    },
    And(Vec<Cond>),
    Or(Vec<Cond>),
}

impl Cond {
    fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Cond)) {
        f(self);
        if let Cond::And(cs) | Cond::Or(cs) = self {
            for c in cs {
                c.visit(f);
            }
        }
    }

    /// The field the condition looks at (`None` for `And`/`Or`).
    pub fn path(&self) -> Option<&FieldPath> {
        match self {
            Cond::Cmp { path, .. }
            | Cond::In { path, .. }
            | Cond::Regex { path, .. }
            | Cond::Exists { path, .. } => Some(path),
            Cond::And(_) | Cond::Or(_) => None,
        }
    }

    /// Evaluates the condition against one document.
    pub fn matches(&self, args: &BoundArgs, id: &str, payload: &Map<String, Value>) -> bool {
        match self {
            Cond::Cmp { path, op, value } => {
                let expected = value.bind(args);
                let actual = path.lookup(id, payload);
                match op {
                    CmpOp::Eq => !expected.is_null() && json_eq(actual.as_ref(), &expected),
                    CmpOp::Ne => expected.is_null() || !json_eq(actual.as_ref(), &expected),
                    _ => match actual.and_then(|a| compare_same_type(&a, &expected)) {
                        Some(o) => match op {
                            CmpOp::Gt => o.is_gt(),
                            CmpOp::Gte => o.is_ge(),
                            CmpOp::Lt => o.is_lt(),
                            _ => o.is_le(),
                        },
                        None => false,
                    },
                }
            }
            Cond::In { path, list, negate } => {
                let actual = path.lookup(id, payload);
                let found = list.bind(args).iter().any(|v| json_eq(actual.as_ref(), v));
                found != *negate
            }
            Cond::Regex {
                path,
                pattern,
                ignore_case,
            } => {
                let Some(Value::String(s)) = path.lookup(id, payload) else {
                    return false;
                };
                let Value::String(p) = pattern.bind(args) else {
                    return false;
                };
                compile_regex(&p, *ignore_case).is_ok_and(|re| re.is_match(&s))
            }
            Cond::Exists { path, exists } => path.lookup(id, payload).is_some() == *exists,
            Cond::And(cs) => cs.iter().all(|c| c.matches(args, id, payload)),
            Cond::Or(cs) => cs.iter().any(|c| c.matches(args, id, payload)),
        }
    }
}

/// Equality of a field's value (if any) and a bound value: JSON equality, except that
/// numbers are equal by value (`5` equals `5.0`, as in SQLite and MongoDB).
pub fn json_eq(actual: Option<&Value>, expected: &Value) -> bool {
    match (actual, expected) {
        (Some(Value::Number(a)), Value::Number(b)) => {
            a == b
                || compare_same_type(&Value::Number(a.clone()), expected).is_some_and(|o| o.is_eq())
        }
        (Some(a), b) => a == b,
        (None, _) => false,
    }
}

/// Orders two values of the same comparable JSON type (number or string); `None` otherwise.
pub fn compare_same_type(a: &Value, b: &Value) -> Option<std::cmp::Ordering> {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => Some(x.cmp(&y)),
            _ => x.as_f64()?.partial_cmp(&y.as_f64()?),
        },
        (Value::String(x), Value::String(y)) => Some(x.as_bytes().cmp(y.as_bytes())),
        _ => None,
    }
}

/// The rank of a value's type in sort order: missing and null, numbers, strings, objects,
/// arrays, booleans (Mongo's order, restricted to JSON types).
pub fn sort_rank(v: Option<&Value>) -> u8 {
    match v {
        None | Some(Value::Null) => 0,
        Some(Value::Number(_)) => 1,
        Some(Value::String(_)) => 2,
        Some(Value::Object(_)) => 3,
        Some(Value::Array(_)) => 4,
        Some(Value::Bool(_)) => 5,
    }
}

/// Compares two documents' values of one sort key (ascending): by type rank, then numbers
/// numerically, strings by code point, booleans false first; objects and arrays by their
/// JSON text (an order the backends do not promise to share).
pub fn sort_compare(a: Option<&Value>, b: Option<&Value>) -> std::cmp::Ordering {
    let (ra, rb) = (sort_rank(a), sort_rank(b));
    if ra != rb {
        return ra.cmp(&rb);
    }
    match (a, b) {
        (Some(Value::Bool(x)), Some(Value::Bool(y))) => x.cmp(y),
        (Some(x), Some(y)) => {
            compare_same_type(x, y).unwrap_or_else(|| x.to_string().cmp(&y.to_string()))
        }
        _ => std::cmp::Ordering::Equal,
    }
}

/// Compiles a pattern for `$regex` (`ignore_case`: `$options: "i"`).
pub fn compile_regex(pattern: &str, ignore_case: bool) -> Result<regex::Regex, TemplateError> {
    check_portable_regex(pattern)?;
    regex::RegexBuilder::new(pattern)
        .case_insensitive(ignore_case)
        .build()
        .map_err(|e| TemplateError::Regex {
            pattern: pattern.to_owned(),
            reason: e.to_string(),
        })
}

/// Checks that a `$regex` pattern stays in the subset that SQLite (evaluated in Rust),
/// PostgreSQL (ARE), MySQL/MariaDB (ICU/PCRE) and MongoDB (PCRE) read the same way:
/// literal characters, `\` + an ASCII punctuation character, `.`, `^`, `$`, `*`, `+`, `?`,
/// `{m}`, `{m,}`, `{m,n}`, `|`, `( … )` groups and `[ … ]` classes (ranges, `^` negation,
/// escaped punctuation). Not allowed: `\<`, `\>`, `(?…)` constructs, back-references, `\d`, `\w`,
/// `\s`, `\b` and other letter escapes, POSIX `[:classes:]`.
pub fn check_portable_regex(pattern: &str) -> Result<(), TemplateError> {
    let bad = |reason: &str| TemplateError::Regex {
        pattern: pattern.to_owned(),
        reason: reason.to_owned(),
    };
    let chars: Vec<char> = pattern.chars().collect();
    let mut i = 0;
    let mut depth = 0usize;
    let mut in_class = false;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '\\' => {
                let Some(&n) = chars.get(i + 1) else {
                    return Err(bad("a trailing backslash"));
                };
                // `\<` and `\>` are word boundaries in Rust's regex, literals elsewhere
                if !n.is_ascii_punctuation() || n == '<' || n == '>' {
                    return Err(bad(&format!(
                        "`\\{n}` is not portable: only punctuation may be escaped"
                    )));
                }
                i += 2;
                continue;
            }
            _ if in_class => {
                if c == '[' && chars.get(i + 1) == Some(&':') {
                    return Err(bad("POSIX classes `[:name:]` are not portable"));
                }
                if c == '[' {
                    return Err(bad("escape `[` inside a class as `\\[`"));
                }
                if c == ']' {
                    in_class = false;
                }
            }
            '[' => {
                in_class = true;
                // `[]` and `[^]` openers: a `]` first in the class is a literal in POSIX
                // but not in Rust, so refuse it
                let mut j = i + 1;
                if chars.get(j) == Some(&'^') {
                    j += 1;
                }
                if chars.get(j) == Some(&']') {
                    return Err(bad("escape `]` inside a class as `\\]`"));
                }
                i = j;
                continue;
            }
            '(' => {
                if chars.get(i + 1) == Some(&'?') {
                    return Err(bad("`(?…)` constructs are not portable"));
                }
                depth += 1;
            }
            ')' => {
                if depth == 0 {
                    return Err(bad("unbalanced `)`"));
                }
                depth -= 1;
            }
            '{' => {
                let close = chars[i..]
                    .iter()
                    .position(|&c| c == '}')
                    .ok_or_else(|| bad("escape a literal `{` as `\\{`"))?;
                let inner: String = chars[i + 1..i + close].iter().collect();
                let ok = match inner.split_once(',') {
                    None => inner.parse::<u16>().is_ok(),
                    Some((a, b)) => {
                        a.parse::<u16>().is_ok() && (b.is_empty() || b.parse::<u16>().is_ok())
                    }
                };
                if !ok || i == 0 {
                    return Err(bad("escape a literal `{` as `\\{`"));
                }
                i += close + 1;
                continue;
            }
            '}' => return Err(bad("escape a literal `}` as `\\}`")),
            _ => {}
        }
        i += 1;
    }
    if in_class {
        return Err(bad("an unterminated `[` class"));
    }
    if depth != 0 {
        return Err(bad("unbalanced `(`"));
    }
    regex::Regex::new(pattern).map_err(|e| bad(&e.to_string()))?;
    Ok(())
}

impl QueryTemplate {
    /// Parses a Mongo-style JSON template: equalities (`{"payload.zone": "{{zone}}"}`), or
    /// Mongo query operators (`{"payload.price": {"$gte": "{{min}}"}}`, `$or`, …).
    pub fn filter(source: &str) -> Result<Self, TemplateError> {
        let value: Value =
            serde_json::from_str(source).map_err(|e| TemplateError::NotAnObject(e.to_string()))?;
        let Value::Object(map) = value else {
            return Err(TemplateError::NotAnObject(source.to_owned()));
        };
        let conds = parse_conds(map)?;
        // plain equalities keep the `Filter` form (and the statements compiled for it)
        let all_eq = conds
            .iter()
            .all(|c| matches!(c, Cond::Cmp { op: CmpOp::Eq, .. }));
        if all_eq {
            let predicates = conds
                .into_iter()
                .map(|c| match c {
                    Cond::Cmp { path, value, .. } => (path, value),
                    _ => unreachable!("checked above"),
                })
                .collect();
            Ok(Self::new(source, TemplateKind::Filter(predicates)))
        } else {
            Ok(Self::new(
                source,
                TemplateKind::Query(QuerySpec {
                    conds,
                    sort: Vec::new(),
                }),
            ))
        }
    }

    /// Adds a sort order, a JSON object of fields and directions (`1` ascending, `-1`
    /// descending), e.g. `{"payload.price": -1, "id": 1}`. Only JSON templates sort.
    pub fn with_sort(self, sort: &str) -> Result<Self, TemplateError> {
        let bad = |reason: &str| TemplateError::BadSort {
            sort: sort.to_owned(),
            reason: reason.to_owned(),
        };
        let value: Value = serde_json::from_str(sort).map_err(|e| bad(&e.to_string()))?;
        let Value::Object(map) = value else {
            return Err(bad("not a JSON object"));
        };
        let mut keys = Vec::with_capacity(map.len());
        for (key, dir) in map {
            let path = parse_path(&key)
                .map_err(|_| bad(&format!("`{key}` is not `id` or `payload.<field>`")))?;
            let descending = match dir.as_i64() {
                Some(1) => false,
                Some(-1) => true,
                _ => {
                    return Err(bad(&format!(
                        "`{key}`: the direction is 1 or -1, not {dir}"
                    )))
                }
            };
            keys.push(SortKey { path, descending });
        }
        let conds = match self.kind {
            _ if keys.is_empty() => return Ok(self),
            TemplateKind::Filter(preds) => preds
                .into_iter()
                .map(|(path, value)| Cond::Cmp {
                    path,
                    op: CmpOp::Eq,
                    value,
                })
                .collect(),
            TemplateKind::Query(spec) => spec.conds,
            TemplateKind::Sql(_) => {
                return Err(bad("a SQL fragment cannot be sorted; use a JSON `query`"))
            }
        };
        Ok(Self::new(
            &self.source,
            TemplateKind::Query(QuerySpec { conds, sort: keys }),
        ))
    }

    /// Checks the arguments a query binds where the template needs more than a value: a
    /// `$regex` pattern must be a string in the portable subset.
    pub fn check_args(&self, args: &BoundArgs) -> Result<(), TemplateError> {
        let TemplateKind::Query(spec) = &self.kind else {
            return Ok(());
        };
        let mut result = Ok(());
        for c in &spec.conds {
            c.visit(&mut |c| {
                if let Cond::Regex { pattern, .. } = c {
                    if let Value::String(p) = pattern.bind(args) {
                        if let Err(e) = check_portable_regex(&p) {
                            if result.is_ok() {
                                result = Err(e);
                            }
                        }
                    }
                }
            });
        }
        result
    }

    /// Parses a raw SQL fragment template.
    pub fn sql(source: &str) -> Result<Self, TemplateError> {
        Ok(Self::new(source, TemplateKind::Sql(parse_sql(source)?)))
    }

    fn new(source: &str, kind: TemplateKind) -> Self {
        Self {
            id: NEXT_TEMPLATE_ID.fetch_add(1, Ordering::Relaxed),
            source: source.to_owned(),
            kind,
        }
    }

    /// Every argument name the template refers to.
    pub fn placeholders(&self) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        match &self.kind {
            TemplateKind::Filter(preds) => {
                for (_, v) in preds {
                    match v {
                        ArgValue::Arg(n) => {
                            names.insert(n.clone());
                        }
                        ArgValue::Interpolated(pieces) => {
                            for p in pieces {
                                if let Piece::Arg(n) = p {
                                    names.insert(n.clone());
                                }
                            }
                        }
                        ArgValue::Literal(_) => {}
                    }
                }
            }
            TemplateKind::Sql(pieces) => {
                for p in pieces {
                    if let SqlPiece::Param { arg, .. } = p {
                        names.insert(arg.clone());
                    }
                }
            }
            TemplateKind::Query(spec) => {
                let mut add = |v: &ArgValue| match v {
                    ArgValue::Arg(n) => {
                        names.insert(n.clone());
                    }
                    ArgValue::Interpolated(pieces) => {
                        for p in pieces {
                            if let Piece::Arg(n) = p {
                                names.insert(n.clone());
                            }
                        }
                    }
                    ArgValue::Literal(_) => {}
                };
                for c in &spec.conds {
                    c.visit(&mut |c| match c {
                        Cond::Cmp { value, .. } => add(value),
                        Cond::Regex { pattern, .. } => add(pattern),
                        Cond::In {
                            list: ListValue::Arg(n),
                            ..
                        } => add(&ArgValue::Arg(n.clone())),
                        Cond::In {
                            list: ListValue::Items(items),
                            ..
                        } => items.iter().for_each(&mut add),
                        _ => {}
                    });
                }
            }
        }
        names
    }

    /// The payload fields this template filters on (backends index them).
    pub fn filtered_paths(&self) -> Vec<FieldPath> {
        match &self.kind {
            TemplateKind::Filter(preds) => preds
                .iter()
                .filter(|(p, _)| *p != FieldPath::Id)
                .map(|(p, _)| p.clone())
                .collect(),
            TemplateKind::Sql(pieces) => sql_json_paths(pieces),
            TemplateKind::Query(spec) => {
                let mut paths: Vec<FieldPath> = Vec::new();
                let mut add = |p: &FieldPath| {
                    if *p != FieldPath::Id && !paths.contains(p) {
                        paths.push(p.clone());
                    }
                };
                for c in &spec.conds {
                    c.visit(&mut |c| {
                        if let Some(p) = c.path() {
                            add(p);
                        }
                    });
                }
                for k in &spec.sort {
                    add(&k.path);
                }
                paths
            }
        }
    }

    /// Whether the template matches at most one document: it requires the id to equal a
    /// value (`{"id": "{{id}}"}`, alone or with other conditions). Backends read such a
    /// template `at` a moment through the id's versions alone.
    pub fn selects_by_id(&self) -> bool {
        match &self.kind {
            TemplateKind::Filter(preds) => preds.iter().any(|(p, _)| *p == FieldPath::Id),
            TemplateKind::Query(spec) => spec.conds.iter().any(|c| {
                matches!(
                    c,
                    Cond::Cmp {
                        path: FieldPath::Id,
                        op: CmpOp::Eq,
                        ..
                    }
                )
            }),
            TemplateKind::Sql(_) => false,
        }
    }

    /// The payload fields this template compares with `$gt`, `$gte`, `$lt` or `$lte` (backends
    /// whose equality index cannot serve a range add indexes for them).
    pub fn range_paths(&self) -> Vec<FieldPath> {
        let mut paths: Vec<FieldPath> = Vec::new();
        if let TemplateKind::Query(spec) = &self.kind {
            for c in &spec.conds {
                c.visit(&mut |c| {
                    if let Cond::Cmp { path, op, .. } = c {
                        let range = !matches!(op, CmpOp::Eq | CmpOp::Ne);
                        if range && *path != FieldPath::Id && !paths.contains(path) {
                            paths.push(path.clone());
                        }
                    }
                });
            }
        }
        paths
    }

    /// The sort keys (empty: the default, creation order).
    pub fn sort(&self) -> &[SortKey] {
        match &self.kind {
            TemplateKind::Query(spec) => &spec.sort,
            _ => &[],
        }
    }

    /// Whether the template uses operators or a sort (anything beyond equality).
    pub fn has_operators(&self) -> bool {
        matches!(self.kind, TemplateKind::Query(_))
    }

    /// Whether this is a raw SQL template (which [`Self::matches`] cannot evaluate).
    pub fn is_sql(&self) -> bool {
        matches!(self.kind, TemplateKind::Sql(_))
    }

    /// Evaluates a filter template against one document (used by in-memory evaluation and
    /// by backends without a query language). SQL templates cannot be evaluated here.
    pub fn matches(&self, args: &BoundArgs, id: &str, payload: &Map<String, Value>) -> bool {
        match &self.kind {
            TemplateKind::Filter(preds) => preds.iter().all(|(path, arg)| {
                let expected = arg.bind(args);
                !expected.is_null() && json_eq(path.lookup(id, payload).as_ref(), &expected)
            }),
            TemplateKind::Sql(_) => false,
            TemplateKind::Query(spec) => spec.conds.iter().all(|c| c.matches(args, id, payload)),
        }
    }

    /// Sorts rows (in their default order) by the template's sort keys; `value_of` gives a
    /// row's id and payload. A stable sort: ties keep the default order.
    pub fn sort_rows<T>(
        &self,
        rows: &mut [T],
        value_of: impl Fn(&T) -> (&str, &Map<String, Value>),
    ) {
        let keys = self.sort();
        if keys.is_empty() {
            return;
        }
        rows.sort_by(|a, b| {
            let (ia, pa) = value_of(a);
            let (ib, pb) = value_of(b);
            for k in keys {
                let va = k.path.lookup(ia, pa);
                let vb = k.path.lookup(ib, pb);
                let o = sort_compare(va.as_ref(), vb.as_ref());
                let o = if k.descending { o.reverse() } else { o };
                if o.is_ne() {
                    return o;
                }
            }
            std::cmp::Ordering::Equal
        });
    }
}

fn parse_path(key: &str) -> Result<FieldPath, TemplateError> {
    if key == "id" {
        Ok(FieldPath::Id)
    } else if let Some(rest) = key.strip_prefix("payload.") {
        if rest.is_empty() || rest.split('.').any(|s| s.is_empty() || !is_ident(s)) {
            return Err(TemplateError::UnsupportedKey(key.to_owned()));
        }
        Ok(FieldPath::Payload(
            rest.split('.').map(str::to_owned).collect(),
        ))
    } else {
        Err(TemplateError::UnsupportedKey(key.to_owned()))
    }
}

/// A scalar operand: a literal, a placeholder, or a string with placeholders.
fn parse_value(key: &str, op: &str, value: Value) -> Result<ArgValue, TemplateError> {
    Ok(match value {
        Value::String(s) => {
            let pieces = parse_pieces(&s)?;
            match pieces.as_slice() {
                [Piece::Arg(name)] => ArgValue::Arg(name.clone()),
                [] => ArgValue::Literal(Value::String(String::new())),
                [Piece::Text(t)] => ArgValue::Literal(Value::String(t.clone())),
                _ => ArgValue::Interpolated(pieces),
            }
        }
        Value::Object(_) | Value::Array(_) => {
            return Err(if op == "$eq" {
                TemplateError::UnsupportedValue {
                    key: key.to_owned(),
                    reason: "objects and arrays are not supported as values; use $in for lists"
                        .into(),
                }
            } else {
                TemplateError::BadOperand {
                    key: key.to_owned(),
                    op: op.to_owned(),
                    reason: "a value (string, number, boolean or \"{{placeholder}}\") is expected"
                        .into(),
                }
            })
        }
        other => ArgValue::Literal(other),
    })
}

/// Parses a template object into conditions (its keys combine with AND).
fn parse_conds(map: Map<String, Value>) -> Result<Vec<Cond>, TemplateError> {
    let mut conds = Vec::with_capacity(map.len());
    for (key, value) in map {
        if key == "$and" || key == "$or" {
            let Value::Array(items) = value else {
                return Err(TemplateError::BadOperand {
                    key: key.clone(),
                    op: key,
                    reason: "a non-empty array of query objects is expected".into(),
                });
            };
            if items.is_empty() {
                return Err(TemplateError::BadOperand {
                    key: key.clone(),
                    op: key,
                    reason: "a non-empty array of query objects is expected".into(),
                });
            }
            let mut branches = Vec::with_capacity(items.len());
            for item in items {
                let Value::Object(m) = item else {
                    return Err(TemplateError::BadOperand {
                        key: key.clone(),
                        op: key,
                        reason: "every item must be a query object".into(),
                    });
                };
                let mut cs = parse_conds(m)?;
                branches.push(if cs.len() == 1 {
                    cs.remove(0)
                } else {
                    Cond::And(cs)
                });
            }
            conds.push(if key == "$and" {
                Cond::And(branches)
            } else {
                Cond::Or(branches)
            });
            continue;
        }
        if key.starts_with('$') {
            return Err(TemplateError::UnknownOperator {
                op: key.clone(),
                key,
            });
        }
        let path = parse_path(&key)?;
        let ops = match value {
            Value::Object(ops) if ops.keys().any(|k| k.starts_with('$')) => ops,
            Value::Object(_) | Value::Array(_) => {
                return Err(TemplateError::UnsupportedValue {
                    key,
                    reason: "objects and arrays are not supported as values; use an operator ($in for lists)".into(),
                })
            }
            other => {
                conds.push(Cond::Cmp {
                    path,
                    op: CmpOp::Eq,
                    value: parse_value(&key, "$eq", other)?,
                });
                continue;
            }
        };
        let options = ops.get("$options").cloned();
        if options.is_some() && !ops.contains_key("$regex") {
            return Err(TemplateError::BadOperand {
                key,
                op: "$options".into(),
                reason: "`$options` goes with `$regex`".into(),
            });
        }
        for (op, operand) in ops {
            let cond = match op.as_str() {
                "$eq" | "$ne" | "$gt" | "$gte" | "$lt" | "$lte" => {
                    let cmp = match op.as_str() {
                        "$eq" => CmpOp::Eq,
                        "$ne" => CmpOp::Ne,
                        "$gt" => CmpOp::Gt,
                        "$gte" => CmpOp::Gte,
                        "$lt" => CmpOp::Lt,
                        _ => CmpOp::Lte,
                    };
                    let value = parse_value(&key, &op, operand)?;
                    if let ArgValue::Literal(v) = &value {
                        if !(matches!(cmp, CmpOp::Eq | CmpOp::Ne) || v.is_number() || v.is_string())
                        {
                            return Err(TemplateError::BadOperand {
                                key,
                                op,
                                reason: "compare with a number or a string".into(),
                            });
                        }
                    }
                    Cond::Cmp {
                        path: path.clone(),
                        op: cmp,
                        value,
                    }
                }
                "$in" | "$nin" => {
                    let list = match operand {
                        Value::Array(items) => ListValue::Items(
                            items
                                .into_iter()
                                .map(|i| parse_value(&key, &op, i))
                                .collect::<Result<_, _>>()?,
                        ),
                        Value::String(s) => match parse_pieces(&s)?.as_slice() {
                            [Piece::Arg(name)] => ListValue::Arg(name.clone()),
                            _ => {
                                return Err(TemplateError::BadOperand {
                                    key,
                                    op,
                                    reason: "an array or a whole \"{{placeholder}}\" bound to a list is expected".into(),
                                })
                            }
                        },
                        _ => {
                            return Err(TemplateError::BadOperand {
                                key,
                                op,
                                reason: "an array or a whole \"{{placeholder}}\" bound to a list is expected".into(),
                            })
                        }
                    };
                    Cond::In {
                        path: path.clone(),
                        list,
                        negate: op == "$nin",
                    }
                }
                "$regex" => {
                    let Value::String(_) = operand else {
                        return Err(TemplateError::BadOperand {
                            key,
                            op,
                            reason: "a string pattern (or \"{{placeholder}}\") is expected".into(),
                        });
                    };
                    let pattern = parse_value(&key, &op, operand)?;
                    if let ArgValue::Literal(Value::String(p)) = &pattern {
                        check_portable_regex(p)?;
                    }
                    let ignore_case = match &options {
                        None => false,
                        Some(Value::String(o)) if o.is_empty() => false,
                        Some(Value::String(o)) if o == "i" => true,
                        Some(other) => {
                            return Err(TemplateError::BadOperand {
                                key,
                                op: "$options".into(),
                                reason: format!(
                                    "only \"i\" (case-insensitive) is supported, not {other}"
                                ),
                            })
                        }
                    };
                    Cond::Regex {
                        path: path.clone(),
                        pattern,
                        ignore_case,
                    }
                }
                "$options" => continue,
                "$exists" => {
                    let Value::Bool(exists) = operand else {
                        return Err(TemplateError::BadOperand {
                            key,
                            op,
                            reason: "true or false is expected".into(),
                        });
                    };
                    Cond::Exists {
                        path: path.clone(),
                        exists,
                    }
                }
                _ => return Err(TemplateError::UnknownOperator { key, op }),
            };
            conds.push(cond);
        }
    }
    Ok(conds)
}

fn is_ident(s: &str) -> bool {
    s.chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Splits `a{{x}}b` into pieces. `{{{x}}}` (Handlebars' unescaped form) is accepted too.
fn parse_pieces(s: &str) -> Result<Vec<Piece>, TemplateError> {
    let mut pieces = Vec::new();
    let mut rest = s;
    while let Some(start) = rest.find("{{") {
        if start > 0 {
            pieces.push(Piece::Text(rest[..start].to_owned()));
        }
        let after = &rest[start + 2..];
        let (triple, after) = match after.strip_prefix('{') {
            Some(a) => (true, a),
            None => (false, after),
        };
        let close = if triple { "}}}" } else { "}}" };
        let end = after
            .find(close)
            .ok_or_else(|| TemplateError::Unterminated(s.to_owned()))?;
        let name = after[..end].trim();
        if name.is_empty() || !is_ident(name) {
            return Err(TemplateError::Unterminated(s.to_owned()));
        }
        pieces.push(Piece::Arg(name.to_owned()));
        rest = &after[end + close.len()..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest.to_owned()));
    }
    Ok(pieces)
}

/// Parses a SQL fragment: placeholders inside string literals become parameters joined to
/// the literal's other text with `||`; bare placeholders become parameters.
fn parse_sql(source: &str) -> Result<Vec<SqlPiece>, TemplateError> {
    let mut out: Vec<SqlPiece> = Vec::new();
    let push_text = |out: &mut Vec<SqlPiece>, t: &str| {
        if t.is_empty() {
            return;
        }
        if let Some(SqlPiece::Text(prev)) = out.last_mut() {
            prev.push_str(t);
        } else {
            out.push(SqlPiece::Text(t.to_owned()));
        }
    };
    let bytes = source.as_bytes();
    let mut i = 0;
    let mut text_start = 0;
    while i < bytes.len() {
        if bytes[i] == b'\'' {
            // find the end of the literal ('' is an escaped quote)
            let lit_start = i;
            let mut j = i + 1;
            loop {
                if j >= bytes.len() {
                    return Err(TemplateError::UnterminatedLiteral(source.to_owned()));
                }
                if bytes[j] == b'\'' {
                    if j + 1 < bytes.len() && bytes[j + 1] == b'\'' {
                        j += 2;
                        continue;
                    }
                    break;
                }
                j += 1;
            }
            let inner = &source[lit_start + 1..j];
            if inner.contains("{{") {
                push_text(&mut out, &source[text_start..lit_start]);
                let pieces = parse_pieces(inner)?;
                let parts: Vec<SqlPiece> = pieces
                    .into_iter()
                    .map(|p| match p {
                        Piece::Text(t) => SqlPiece::Text(format!("'{t}'")),
                        Piece::Arg(arg) => SqlPiece::Param { arg, as_text: true },
                    })
                    .collect();
                let multi = parts.len() > 1;
                if multi {
                    push_text(&mut out, "(");
                }
                for (k, part) in parts.into_iter().enumerate() {
                    if k > 0 {
                        push_text(&mut out, " || ");
                    }
                    match part {
                        SqlPiece::Text(t) => push_text(&mut out, &t),
                        p => out.push(p),
                    }
                }
                if multi {
                    push_text(&mut out, ")");
                }
                text_start = j + 1;
            }
            i = j + 1;
        } else if bytes[i..].starts_with(b"{{") {
            push_text(&mut out, &source[text_start..i]);
            let rest = &source[i..];
            let pieces = parse_pieces(rest)?;
            let Some(Piece::Arg(arg)) = pieces.first() else {
                return Err(TemplateError::Unterminated(source.to_owned()));
            };
            let triple = rest.starts_with("{{{");
            let end = rest
                .find(if triple { "}}}" } else { "}}" })
                .ok_or_else(|| TemplateError::Unterminated(source.to_owned()))?;
            out.push(SqlPiece::Param {
                arg: arg.clone(),
                as_text: false,
            });
            i += end + if triple { 3 } else { 2 };
            text_start = i;
        } else {
            i += 1;
        }
    }
    push_text(&mut out, &source[text_start..]);
    Ok(out)
}

/// JSON paths that a SQL fragment extracts (`json_extract(payload, '$.x')`, `payload->>'x'`),
/// so that backends can index them.
fn sql_json_paths(pieces: &[SqlPiece]) -> Vec<FieldPath> {
    let mut paths = Vec::new();
    for p in pieces {
        let SqlPiece::Text(t) = p else { continue };
        let mut rest = t.as_str();
        while let Some(pos) = rest.find("'$.") {
            let after = &rest[pos + 3..];
            if let Some(end) = after.find('\'') {
                let path = &after[..end];
                if !path.is_empty() && path.split('.').all(|s| !s.is_empty() && is_ident(s)) {
                    let fp = FieldPath::Payload(path.split('.').map(str::to_owned).collect());
                    if !paths.contains(&fp) {
                        paths.push(fp);
                    }
                }
                rest = &after[end..];
            } else {
                break;
            }
        }
    }
    paths
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn args(v: Value) -> BoundArgs {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn filter_templates_parse() {
        let t = QueryTemplate::filter(r#"{"payload.farm_id": "{{id}}"}"#).unwrap();
        assert_eq!(
            t.kind,
            TemplateKind::Filter(vec![(
                FieldPath::Payload(vec!["farm_id".into()]),
                ArgValue::Arg("id".into())
            )])
        );
        assert_eq!(t.placeholders().into_iter().collect::<Vec<_>>(), ["id"]);
        assert_eq!(
            t.filtered_paths()[0].json_path().as_deref(),
            Some("$.farm_id")
        );
        let all = QueryTemplate::filter("{}").unwrap();
        assert_eq!(all.kind, TemplateKind::Filter(vec![]));
        let id = QueryTemplate::filter(r#"{"id":"{{id}}"}"#).unwrap();
        assert!(id.filtered_paths().is_empty());
    }

    #[test]
    fn filter_templates_reject_what_they_cannot_do() {
        assert!(matches!(
            QueryTemplate::filter(r#"{"name": "x"}"#),
            Err(TemplateError::UnsupportedKey(_))
        ));
        assert!(matches!(
            QueryTemplate::filter(r#"{"payload.a": {"b": 1}}"#),
            Err(TemplateError::UnsupportedValue { .. })
        ));
        assert!(matches!(
            QueryTemplate::filter(r#"{"payload.a": ["x"]}"#),
            Err(TemplateError::UnsupportedValue { .. })
        ));
        assert!(matches!(
            QueryTemplate::filter(r#"["x"]"#),
            Err(TemplateError::NotAnObject(_))
        ));
        assert!(matches!(
            QueryTemplate::filter(r#"{"id": "{{id"}"#),
            Err(TemplateError::Unterminated(_))
        ));
    }

    #[test]
    fn filter_templates_match_documents() {
        let t = QueryTemplate::filter(r#"{"payload.zone": "{{zone}}", "payload.kind": "z-{{k}}"}"#)
            .unwrap();
        let doc = args(json!({"zone": "north", "kind": "z-1"}));
        assert!(t.matches(&args(json!({"zone": "north", "k": 1})), "x", &doc));
        assert!(!t.matches(&args(json!({"zone": "south", "k": 1})), "x", &doc));
        assert!(!t.matches(&args(json!({})), "x", &doc));
    }

    #[test]
    fn operator_templates_parse_into_conditions() {
        let t = QueryTemplate::filter(
            r#"{"payload.price": {"$gte": "{{min}}", "$lt": 10}, "$or": [{"id": "{{id}}"}, {"payload.tag": {"$regex": "^a", "$options": "i"}}], "payload.n": {"$in": "{{ns}}"}}"#,
        )
        .unwrap();
        let TemplateKind::Query(spec) = &t.kind else {
            panic!("operators make a Query template: {:?}", t.kind)
        };
        assert_eq!(spec.conds.len(), 4);
        assert_eq!(
            spec.conds[0],
            Cond::Cmp {
                path: FieldPath::Payload(vec!["price".into()]),
                op: CmpOp::Gte,
                value: ArgValue::Arg("min".into())
            }
        );
        assert!(matches!(&spec.conds[2], Cond::Or(b) if b.len() == 2));
        assert_eq!(
            spec.conds[3],
            Cond::In {
                path: FieldPath::Payload(vec!["n".into()]),
                list: ListValue::Arg("ns".into()),
                negate: false
            }
        );
        assert_eq!(
            t.placeholders().into_iter().collect::<Vec<_>>(),
            ["id", "min", "ns"]
        );
        let paths: Vec<_> = t
            .filtered_paths()
            .iter()
            .filter_map(|p| p.json_path())
            .collect();
        assert_eq!(paths, ["$.price", "$.tag", "$.n"]);
        // equalities alone keep the Filter form; `$eq` is an equality
        let eq = QueryTemplate::filter(r#"{"payload.a": {"$eq": "{{a}}"}, "id": "x"}"#).unwrap();
        assert!(matches!(eq.kind, TemplateKind::Filter(ref p) if p.len() == 2));
        // a sort makes a Query template and indexes its field
        let s = eq.with_sort(r#"{"payload.b": -1}"#).unwrap();
        assert_eq!(s.sort().len(), 1);
        assert!(s.sort()[0].descending);
        assert_eq!(s.filtered_paths().len(), 2);
    }

    #[test]
    fn operator_templates_reject_what_meshql_cannot_do() {
        for (source, op) in [
            (r#"{"$where": "this.a > 1"}"#, "$where"),
            (r#"{"$expr": {"$gt": ["$a", 1]}}"#, "$expr"),
            (r#"{"$text": {"$search": "x"}}"#, "$text"),
            (r#"{"payload.a": {"$elemMatch": {"b": 1}}}"#, "$elemMatch"),
            (r#"{"payload.a": {"$not": {"$gt": 1}}}"#, "$not"),
        ] {
            match QueryTemplate::filter(source) {
                Err(TemplateError::UnknownOperator { op: o, .. }) => assert_eq!(o, op),
                other => panic!("{source}: {other:?}"),
            }
        }
        for source in [
            r#"{"payload.a": {"$gt": true}}"#,
            r#"{"payload.a": {"$gt": [1]}}"#,
            r#"{"payload.a": {"$in": 3}}"#,
            r#"{"payload.a": {"$in": "x-{{y}}"}}"#,
            r#"{"payload.a": {"$exists": "yes"}}"#,
            r#"{"payload.a": {"$regex": 3}}"#,
            r#"{"payload.a": {"$regex": "a", "$options": "m"}}"#,
            r#"{"payload.a": {"$options": "i"}}"#,
            r#"{"$or": []}"#,
            r#"{"$and": {"payload.a": 1}}"#,
        ] {
            assert!(
                matches!(
                    QueryTemplate::filter(source),
                    Err(TemplateError::BadOperand { .. })
                ),
                "{source}"
            );
        }
        assert!(matches!(
            QueryTemplate::filter(r#"{"payload.a": {"$regex": "(?i)a"}}"#),
            Err(TemplateError::Regex { .. })
        ));
        assert!(matches!(
            QueryTemplate::filter(r#"{"name": {"$gt": 1}}"#),
            Err(TemplateError::UnsupportedKey(_))
        ));
        let t = QueryTemplate::filter("{}").unwrap();
        assert!(t.clone().with_sort(r#"{"payload.a": 2}"#).is_err());
        assert!(t.clone().with_sort(r#"{"a": 1}"#).is_err());
        assert!(t.with_sort("[1]").is_err());
        assert!(QueryTemplate::sql("1 = 1")
            .unwrap()
            .with_sort(r#"{"id": 1}"#)
            .is_err());
    }

    #[test]
    fn portable_regexes() {
        for ok in [
            "abc",
            "^a.c$",
            "a|b",
            "(ab)+c?",
            "[a-z0-9_]{2,5}",
            "[^\\]]",
            "\\.\\*",
            "x{3}",
            "x{2,}",
        ] {
            assert!(check_portable_regex(ok).is_ok(), "{ok}");
        }
        for bad in [
            "\\<a",
            "a\\>",
            "(?i)a",
            "\\d+",
            "\\w",
            "\\bx",
            "[[:alpha:]]",
            "[]a]",
            "a{",
            "}",
            "(a",
            "a)",
            "\\1",
            "[a",
        ] {
            assert!(check_portable_regex(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn operator_semantics_in_process() {
        let doc = args(json!({"n": 5, "f": 2.5, "s": "b", "nil": null, "t": "Hello"}));
        let m = |src: &str, a: Value| {
            QueryTemplate::filter(src)
                .unwrap()
                .matches(&args(a), "id-1", &doc)
        };
        assert!(m(r#"{"payload.n": {"$gt": "{{x}}"}}"#, json!({"x": 4.5})));
        assert!(!m(r#"{"payload.n": {"$gt": "{{x}}"}}"#, json!({"x": "4"})));
        assert!(!m(r#"{"payload.s": {"$gt": "{{x}}"}}"#, json!({"x": 1})));
        assert!(m(r#"{"payload.s": {"$gte": "b"}}"#, json!({})));
        assert!(m(r#"{"payload.f": {"$lte": 2.5}}"#, json!({})));
        assert!(m(r#"{"payload.n": {"$in": [5.0]}}"#, json!({})));
        assert!(!m(r#"{"payload.n": {"$ne": 5.0}}"#, json!({})));
        assert!(QueryTemplate::filter(r#"{"payload.n": "{{n}}"}"#)
            .unwrap()
            .matches(&args(json!({"n": 5.0})), "id-1", &doc));
        assert!(m(r#"{"payload.missing": {"$ne": "x"}}"#, json!({})));
        assert!(m(r#"{"payload.missing": {"$nin": ["x"]}}"#, json!({})));
        assert!(!m(r#"{"payload.n": {"$nin": [5]}}"#, json!({})));
        assert!(m(
            r#"{"payload.n": {"$in": "{{l}}"}}"#,
            json!({"l": [1, 5]})
        ));
        assert!(m(r#"{"payload.nil": {"$exists": true}}"#, json!({})));
        assert!(m(r#"{"payload.missing": {"$exists": false}}"#, json!({})));
        assert!(m(
            r#"{"payload.t": {"$regex": "ell", "$options": "i"}}"#,
            json!({})
        ));
        assert!(m(
            r#"{"payload.t": {"$regex": "^HEL", "$options": "i"}}"#,
            json!({})
        ));
        assert!(!m(r#"{"payload.t": {"$regex": "^HEL"}}"#, json!({})));
        assert!(!m(r#"{"payload.n": {"$regex": "5"}}"#, json!({})));
        assert!(m(r#"{"id": {"$gt": "id-0"}}"#, json!({})));
        assert!(m(
            r#"{"$or": [{"payload.n": {"$lt": 0}}, {"$and": [{"payload.s": "b"}, {"payload.f": {"$gt": 2}}]}]}"#,
            json!({})
        ));
    }

    #[test]
    fn sql_fragments_become_parameters() {
        let t = QueryTemplate::sql("json_extract(payload, '$.farm_id') = '{{id}}'").unwrap();
        assert_eq!(
            t.kind,
            TemplateKind::Sql(vec![
                SqlPiece::Text("json_extract(payload, '$.farm_id') = ".into()),
                SqlPiece::Param {
                    arg: "id".into(),
                    as_text: true
                },
            ])
        );
        assert_eq!(
            t.filtered_paths(),
            vec![FieldPath::Payload(vec!["farm_id".into()])]
        );
        let t = QueryTemplate::sql("name LIKE '%{{n}}%' AND x = {{y}} AND q = 'it''s'").unwrap();
        assert_eq!(
            t.kind,
            TemplateKind::Sql(vec![
                SqlPiece::Text("name LIKE ('%' || ".into()),
                SqlPiece::Param {
                    arg: "n".into(),
                    as_text: true
                },
                SqlPiece::Text(" || '%') AND x = ".into()),
                SqlPiece::Param {
                    arg: "y".into(),
                    as_text: false
                },
                SqlPiece::Text(" AND q = 'it''s'".into()),
            ])
        );
        assert!(QueryTemplate::sql("a = 'open").is_err());
        // multi-byte characters around placeholders
        let t = QueryTemplate::sql("\"größe\" = {{x}} AND name = 'é{{y}}ü'").unwrap();
        assert_eq!(t.placeholders().len(), 2);
    }
}
