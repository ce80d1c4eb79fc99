//! Writing the response JSON straight from the plan and the fetched rows, with GraphQL's
//! null propagation: a null (or an error) in a non-null position nulls the nearest
//! nullable ancestor; the bytes already written for it are truncated. Reads the plan and
//! the result tree (`tree`); knows nothing of how the tree was fetched.

use crate::plan::{
    self, FieldKind, LeafKind, OperationPlan, RootKind, SelectionPlan, Shape, TargetPlan,
};
use crate::tree::{FieldError, Link, Node, RootResult, Step};
use meshql_core::Mask;
use serde_json::{Map, Value};

/// A null reached a non-null position; the parent must become null.
struct Bubble;

/// A step of the response path, borrowed from the plan (no allocation per field written).
#[derive(Clone)]
enum Seg<'v> {
    Key(&'v str),
    Index(usize),
    /// A key inside a remote graphlette's answer (errors it reported below a field).
    Name(std::sync::Arc<str>),
}

/// Names a field for error messages (`Farm.coops`); formatted only when an error is raised.
struct What<'a> {
    owner: &'a str,
    field: &'a str,
}

impl std::fmt::Display for What<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.owner, self.field)
    }
}

/// `extensions.code` of a request whose result is over `max_objects` or `max_response_bytes`.
pub const TOO_LARGE: &str = "RESPONSE_TOO_LARGE";
/// `extensions.code` of a request that ran out of time.
pub const TIMEOUT: &str = "TIMEOUT";

/// The largest magnitude served as `Int`: 2^53 − 1, the integers every JSON client reads
/// exactly. GraphQL's `Int` is 32 bits; meshql serves it wider on purpose, because MeshQL
/// schemas declare epoch-millisecond timestamps as `Int` (see docs/SECURITY.md). A larger
/// stored value is a field error, never a rounded number.
const MAX_SAFE_INT: i64 = (1 << 53) - 1;

/// Field errors kept per response; the rest are counted in one last error.
const MAX_ERRORS: usize = 100;

pub(crate) struct Writer<'v> {
    buf: Vec<u8>,
    errors: Vec<(String, Option<&'static str>, Vec<Seg<'v>>)>,
    /// Errors beyond [`MAX_ERRORS`], not kept.
    errors_dropped: usize,
    path: Vec<Seg<'v>>,
    variables: &'v Map<String, Value>,
    /// Objects the response may hold, and bytes it may take.
    max_objects: usize,
    max_bytes: usize,
    objects: usize,
    /// Set once a limit is passed: the response becomes this error alone.
    over: Option<String>,
    /// Advice about the request that is not an error (`extensions.hints`).
    hints: Vec<String>,
}

/// A request-level error (no `data`, or `data: null`).
pub(crate) struct RequestError {
    pub message: String,
    pub locations: Vec<(usize, usize)>,
    pub code: Option<&'static str>,
}

impl RequestError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            locations: Vec::new(),
            code: None,
        }
    }

    pub(crate) fn coded(message: impl Into<String>, code: &'static str) -> Self {
        Self {
            code: Some(code),
            ..Self::new(message)
        }
    }
}

fn push_json_str(buf: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(&mut *buf, s).expect("writing to a Vec cannot fail");
}

/// A response with request errors only (no `data`).
pub(crate) fn request_errors(errors: &[RequestError]) -> Vec<u8> {
    let list: Vec<Value> = errors
        .iter()
        .map(|error| {
            let mut e = serde_json::json!({ "message": error.message });
            if !error.locations.is_empty() {
                e["locations"] = error
                    .locations
                    .iter()
                    .map(|(l, c)| serde_json::json!({"line": l, "column": c}))
                    .collect();
            }
            if let Some(code) = error.code {
                e["extensions"] = serde_json::json!({ "code": code });
            }
            e
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({ "errors": list })).expect("JSON serialises")
}

impl<'v> Writer<'v> {
    /// A writer of at most `max_objects` objects and about `max_bytes` bytes (checked
    /// before each object: one object's leaves may go past it).
    pub(crate) fn new(
        variables: &'v Map<String, Value>,
        max_objects: usize,
        max_bytes: usize,
    ) -> Self {
        Self {
            buf: Vec::with_capacity(1024),
            errors: Vec::new(),
            errors_dropped: 0,
            path: Vec::new(),
            variables,
            max_objects,
            max_bytes,
            objects: 0,
            over: None,
            hints: Vec::new(),
        }
    }

    fn push_error(&mut self, message: String, code: Option<&'static str>) {
        if self.errors.len() < MAX_ERRORS {
            self.errors.push((message, code, self.path.clone()));
        } else {
            self.errors_dropped += 1;
        }
    }

    fn error(&mut self, message: impl Into<String>) {
        self.push_error(message.into(), None);
    }

    /// An error with the code of its kind (`extensions.code`).
    fn coded_error(&mut self, e: &FieldError) {
        self.push_error(e.message.to_string(), e.code);
    }

    /// Counts one more object; false (and the response is abandoned) past a limit.
    fn admit_object(&mut self) -> bool {
        if self.over.is_some() {
            return false;
        }
        self.objects += 1;
        if self.objects > self.max_objects {
            self.over = Some(format!(
                "the response would hold more than {} objects (graphql.max_objects); select less or pass `limit`",
                self.max_objects
            ));
        } else if self.buf.len() > self.max_bytes {
            self.over = Some(format!(
                "the response would be larger than {} bytes (graphql.max_response_bytes); select less or pass `limit`",
                self.max_bytes
            ));
        }
        self.over.is_none()
    }

    fn null_in(&mut self, shape_non_null: bool, what: &What<'_>) -> Result<(), Bubble> {
        if shape_non_null {
            self.error(format!("Cannot return null for non-nullable field {what}."));
            Err(Bubble)
        } else {
            self.buf.extend_from_slice(b"null");
            Ok(())
        }
    }

    pub(crate) fn write_response(
        &mut self,
        plan: &'v OperationPlan,
        results: Vec<Option<RootResult>>,
        introspection: Option<&Map<String, Value>>,
    ) {
        self.buf.extend_from_slice(b"{\"data\":{");
        let data_start = self.buf.len() - 1;
        let mut first = true;
        let mut bubbled = false;
        for (root, result) in plan.roots.iter().zip(results) {
            let Some(result) = result else { continue };
            if !first {
                self.buf.push(b',');
            }
            first = false;
            push_json_str(&mut self.buf, &root.key);
            self.buf.push(b':');
            self.path.push(Seg::Key(&root.key));
            let start = self.buf.len();
            let what = What {
                owner: "Query",
                field: &root.field_name,
            };
            let r = match (&root.kind, result) {
                (RootKind::Typename, _) => {
                    self.buf.extend_from_slice(b"\"Query\"");
                    Ok(())
                }
                (RootKind::Introspection, _) => {
                    let v = introspection
                        .and_then(|m| m.get(&root.key))
                        .unwrap_or(&Value::Null);
                    serde_json::to_writer(&mut self.buf, v).expect("JSON serialises");
                    Ok(())
                }
                (RootKind::Unbound, _) => self.null_in(root.shape.non_null, &what),
                (_, RootResult::Error(e)) => {
                    self.coded_error(&e);
                    self.null_in(root.shape.non_null, &what).or(Err(Bubble))
                }
                (
                    RootKind::Query {
                        selection,
                        composite,
                        ..
                    },
                    RootResult::Nodes(nodes),
                ) => self.write_root_nodes(&nodes, selection, *composite, root.shape, &what),
            };
            self.path.pop();
            if r.is_err() {
                if root.shape.non_null {
                    bubbled = true;
                    break;
                }
                self.buf.truncate(start);
                self.buf.extend_from_slice(b"null");
            }
        }
        if bubbled {
            self.buf.truncate(data_start);
            self.buf.extend_from_slice(b"null");
        } else {
            self.buf.push(b'}');
        }
    }

    fn write_root_nodes(
        &mut self,
        nodes: &[Node],
        selection: &'v SelectionPlan,
        composite: bool,
        shape: Shape,
        what: &What<'_>,
    ) -> Result<(), Bubble> {
        if !composite {
            // a root field of a leaf type bound to a query: write the ids
            return self.null_in(shape.non_null, what);
        }
        if shape.list {
            self.buf.push(b'[');
            for (i, node) in nodes.iter().enumerate() {
                if i > 0 {
                    self.buf.push(b',');
                }
                self.path.push(Seg::Index(i));
                let start = self.buf.len();
                let r = self.write_object(selection, &node.map, &node.links, node.mask.as_deref());
                self.path.pop();
                if r.is_err() {
                    if shape.item_non_null {
                        return Err(Bubble);
                    }
                    self.buf.truncate(start);
                    self.buf.extend_from_slice(b"null");
                }
            }
            self.buf.push(b']');
            Ok(())
        } else {
            match nodes.first() {
                Some(node) => {
                    self.write_object(selection, &node.map, &node.links, node.mask.as_deref())
                }
                None => self.null_in(shape.non_null, what),
            }
        }
    }

    fn write_object(
        &mut self,
        selection: &'v SelectionPlan,
        map: &Map<String, Value>,
        links: &[Link],
        mask: Option<&Mask>,
    ) -> Result<(), Bubble> {
        if !self.admit_object() {
            return Err(Bubble);
        }
        self.buf.push(b'{');
        let mut first = true;
        for field in &selection.fields {
            if !plan::included(&field.include, self.variables) {
                continue;
            }
            if !first {
                self.buf.push(b',');
            }
            first = false;
            push_json_str(&mut self.buf, &field.key);
            self.buf.push(b':');
            self.path.push(Seg::Key(&field.key));
            let start = self.buf.len();
            let what = What {
                owner: &field.type_name,
                field: &field.field_name,
            };
            let hidden = mask.is_some_and(|m| {
                !matches!(field.kind, FieldKind::Typename(_)) && !m.allows(&field.field_name)
            });
            let r = match &field.kind {
                _ if hidden => {
                    self.push_error(
                        format!("not allowed to read {what}"),
                        Some(crate::tree::FORBIDDEN),
                    );
                    self.null_in(field.shape.non_null, &what).or(Err(Bubble))
                }
                FieldKind::Typename(name) => {
                    push_json_str(&mut self.buf, name);
                    Ok(())
                }
                FieldKind::Leaf(kind) => {
                    self.write_leaf(map.get(&field.field_name), *kind, field.shape, &what)
                }
                FieldKind::Embedded(sub) => {
                    self.write_embedded(map.get(&field.field_name), sub, field.shape, &what)
                }
                FieldKind::Resolver(i) => match links.get(*i) {
                    Some(link) => self.write_link(link, selection, *i, field.shape, &what),
                    None => self.null_in(field.shape.non_null, &what),
                },
            };
            self.path.pop();
            if r.is_err() {
                if field.shape.non_null {
                    return Err(Bubble);
                }
                self.buf.truncate(start);
                self.buf.extend_from_slice(b"null");
            }
        }
        self.buf.push(b'}');
        Ok(())
    }

    fn write_link(
        &mut self,
        link: &Link,
        parent: &'v SelectionPlan,
        index: usize,
        shape: Shape,
        what: &What<'_>,
    ) -> Result<(), Bubble> {
        let TargetPlan::InProcess { selection, .. } = &parent.resolvers[index].target else {
            // HTTP target: the remote JSON is spliced as it is
            return match link {
                Link::Raw(Some(raw)) => {
                    if !self.admit_object() {
                        return Err(Bubble);
                    }
                    self.buf.extend_from_slice(raw.get().as_bytes());
                    Ok(())
                }
                Link::Remote(raw, errors) => {
                    if !self.admit_object() {
                        return Err(Bubble);
                    }
                    self.buf.extend_from_slice(raw.get().as_bytes());
                    for (steps, e) in errors.iter() {
                        let depth = self.path.len();
                        self.path.extend(steps.iter().map(|s| match s {
                            Step::Key(k) => Seg::Name(k.clone()),
                            Step::Index(i) => Seg::Index(*i),
                        }));
                        self.coded_error(e);
                        self.path.truncate(depth);
                    }
                    Ok(())
                }
                Link::Raw(None) | Link::Nodes(_) if shape.list => {
                    self.buf.extend_from_slice(b"[]");
                    Ok(())
                }
                Link::Raw(None) | Link::Nodes(_) => self.null_in(shape.non_null, what),
                Link::Error(e) => {
                    self.coded_error(e);
                    self.null_in(shape.non_null, what).or(Err(Bubble))
                }
            };
        };
        match link {
            Link::Nodes(nodes) => {
                if shape.list {
                    self.buf.push(b'[');
                    for (i, node) in nodes.iter().enumerate() {
                        if i > 0 {
                            self.buf.push(b',');
                        }
                        self.path.push(Seg::Index(i));
                        let start = self.buf.len();
                        let r = self.write_object(
                            selection,
                            &node.map,
                            &node.links,
                            node.mask.as_deref(),
                        );
                        self.path.pop();
                        if r.is_err() {
                            if shape.item_non_null {
                                return Err(Bubble);
                            }
                            self.buf.truncate(start);
                            self.buf.extend_from_slice(b"null");
                        }
                    }
                    self.buf.push(b']');
                    Ok(())
                } else {
                    match nodes.first() {
                        Some(node) => self.write_object(
                            selection,
                            &node.map,
                            &node.links,
                            node.mask.as_deref(),
                        ),
                        None => self.null_in(shape.non_null, what),
                    }
                }
            }
            Link::Raw(_) | Link::Remote(..) => self.null_in(shape.non_null, what),
            Link::Error(e) => {
                self.coded_error(e);
                if shape.non_null {
                    Err(Bubble)
                } else {
                    self.buf.extend_from_slice(b"null");
                    Ok(())
                }
            }
        }
    }

    fn write_embedded(
        &mut self,
        value: Option<&Value>,
        selection: &'v SelectionPlan,
        shape: Shape,
        what: &What<'_>,
    ) -> Result<(), Bubble> {
        match value {
            None | Some(Value::Null) => self.null_in(shape.non_null, what),
            Some(Value::Array(items)) if shape.list => {
                self.buf.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        self.buf.push(b',');
                    }
                    self.path.push(Seg::Index(i));
                    let start = self.buf.len();
                    let inner = Shape {
                        non_null: shape.item_non_null,
                        list: false,
                        item_non_null: false,
                    };
                    let r = self.write_embedded(Some(item), selection, inner, what);
                    self.path.pop();
                    if r.is_err() {
                        if shape.item_non_null {
                            return Err(Bubble);
                        }
                        self.buf.truncate(start);
                        self.buf.extend_from_slice(b"null");
                    }
                }
                self.buf.push(b']');
                Ok(())
            }
            Some(Value::Object(map)) if !shape.list => self.write_object(selection, map, &[], None),
            Some(_) => {
                self.error(format!(
                    "{what} holds a value that is not of its declared type"
                ));
                self.null_in(shape.non_null, what).or(Err(Bubble))
            }
        }
    }

    fn write_leaf(
        &mut self,
        value: Option<&Value>,
        kind: LeafKind,
        shape: Shape,
        what: &What<'_>,
    ) -> Result<(), Bubble> {
        let value = match value {
            None | Some(Value::Null) => return self.null_in(shape.non_null, what),
            Some(v) => v,
        };
        if shape.list {
            let Value::Array(items) = value else {
                // a single stored value where a list is declared: a list of one
                self.buf.push(b'[');
                let r = self.write_scalar(value, kind, what);
                self.buf.push(b']');
                return r;
            };
            self.buf.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    self.buf.push(b',');
                }
                if item.is_null() {
                    if shape.item_non_null {
                        self.error(format!("Cannot return null for non-nullable field {what}."));
                        return Err(Bubble);
                    }
                    self.buf.extend_from_slice(b"null");
                } else {
                    self.path.push(Seg::Index(i));
                    let r = self.write_scalar(item, kind, what);
                    self.path.pop();
                    r?;
                }
            }
            self.buf.push(b']');
            return Ok(());
        }
        self.write_scalar(value, kind, what).or_else(|_| {
            if shape.non_null {
                Err(Bubble)
            } else {
                self.buf.extend_from_slice(b"null");
                Ok(())
            }
        })
    }

    /// Writes one non-null scalar, coercing where GraphQL allows it.
    fn write_scalar(
        &mut self,
        value: &Value,
        kind: LeafKind,
        what: &What<'_>,
    ) -> Result<(), Bubble> {
        match (kind, value) {
            (LeafKind::String | LeafKind::Id, Value::String(s)) => push_json_str(&mut self.buf, s),
            (LeafKind::String | LeafKind::Id, Value::Number(n)) => {
                push_json_str(&mut self.buf, &n.to_string())
            }
            (LeafKind::String, Value::Bool(b)) => push_json_str(&mut self.buf, &b.to_string()),
            (LeafKind::Int, Value::Number(n))
                if n.as_i64().is_some_and(|i| i.abs() <= MAX_SAFE_INT) =>
            {
                self.buf.extend_from_slice(n.to_string().as_bytes())
            }
            (LeafKind::Int, Value::Number(n))
                if n.as_f64()
                    .is_some_and(|f| f.fract() == 0.0 && f.abs() <= MAX_SAFE_INT as f64) =>
            {
                self.buf
                    .extend_from_slice((n.as_f64().unwrap_or(0.0) as i64).to_string().as_bytes())
            }
            (LeafKind::Float, Value::Number(n)) => {
                self.buf.extend_from_slice(n.to_string().as_bytes())
            }
            (LeafKind::Boolean, Value::Bool(b)) => {
                self.buf
                    .extend_from_slice(if *b { b"true" } else { b"false" })
            }
            (LeafKind::PassThrough, v) => {
                serde_json::to_writer(&mut self.buf, v).expect("JSON serialises")
            }
            (_, v) => {
                let kind_name = match kind {
                    LeafKind::Int => "Int",
                    LeafKind::Float => "Float",
                    LeafKind::Boolean => "Boolean",
                    LeafKind::Id => "ID",
                    _ => "String",
                };
                let why = if kind == LeafKind::Int && v.is_number() {
                    format!(
                        "Int cannot represent value {v} ({what}): meshql serves Int from -{MAX_SAFE_INT} to {MAX_SAFE_INT}"
                    )
                } else {
                    format!("{kind_name} cannot represent value {v} ({what})")
                };
                self.error(why);
                return Err(Bubble);
            }
        }
        Ok(())
    }

    /// Advice for the caller, in the response's `extensions.hints`.
    pub(crate) fn hint(&mut self, text: String) {
        self.hints.push(text);
    }

    pub(crate) fn finish(mut self) -> Vec<u8> {
        if let Some(message) = self.over.take() {
            return request_errors(&[RequestError::coded(message, TOO_LARGE)]);
        }
        if self.errors_dropped > 0 {
            let more = self.errors_dropped;
            self.path.clear();
            self.errors
                .push((format!("... and {more} more errors"), None, Vec::new()));
        }
        if !self.errors.is_empty() {
            self.buf.extend_from_slice(b",\"errors\":[");
            for (i, (message, code, path)) in self.errors.iter().enumerate() {
                if i > 0 {
                    self.buf.push(b',');
                }
                self.buf.extend_from_slice(b"{\"message\":");
                push_json_str(&mut self.buf, message);
                self.buf.extend_from_slice(b",\"path\":[");
                for (j, seg) in path.iter().enumerate() {
                    if j > 0 {
                        self.buf.push(b',');
                    }
                    match seg {
                        Seg::Key(k) => push_json_str(&mut self.buf, k),
                        Seg::Name(k) => push_json_str(&mut self.buf, k),
                        Seg::Index(n) => self.buf.extend_from_slice(n.to_string().as_bytes()),
                    }
                }
                self.buf.push(b']');
                if let Some(code) = code {
                    self.buf.extend_from_slice(b",\"extensions\":{\"code\":");
                    push_json_str(&mut self.buf, code);
                    self.buf.push(b'}');
                }
                self.buf.push(b'}');
            }
            self.buf.push(b']');
        }
        if !self.hints.is_empty() {
            self.buf.extend_from_slice(b",\"extensions\":{\"hints\":");
            serde_json::to_writer(&mut self.buf, &self.hints)
                .expect("writing to a Vec cannot fail");
            self.buf.push(b'}');
        }
        self.buf.push(b'}');
        self.buf
    }
}
