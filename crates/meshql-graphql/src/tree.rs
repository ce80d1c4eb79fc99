//! The result tree of an execution: fetched documents ([`Node`]) and their resolved
//! relationships ([`Link`]), per root field ([`RootResult`]). Execution builds it,
//! the response writer reads it; neither needs the other to know its shape.

use meshql_core::{Mask, NestedRow, Row};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::sync::Arc;

/// A fetched document and its resolved relationships (one link per resolver of the
/// selection that fetched it).
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub map: Map<String, Value>,
    pub links: Vec<Link>,
    /// The fields the caller may read of this document (`None`: all of them).
    pub mask: Option<Arc<Mask>>,
}

#[derive(Debug, Clone)]
pub(crate) enum Link {
    /// In-process results (a singleton resolver has at most one).
    Nodes(Vec<Arc<Node>>),
    /// A remote graphlette's JSON for this field, spliced as it is (`None`: null).
    Raw(Option<Arc<RawValue>>),
    /// A remote graphlette's JSON with field errors inside it that do not fail the
    /// relationship (a field the caller's read mask hides: null with `FORBIDDEN` there, as
    /// in-process), each at its path below this field.
    Remote(Arc<RawValue>, Arc<[(Vec<Step>, FieldError)]>),
    /// The relationship could not be resolved.
    Error(FieldError),
}

/// A step of a path inside a remote answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Step {
    Key(Arc<str>),
    Index(usize),
}

/// Why a field has no value: the message, and the code of the failure's kind when it has one
/// (published as the error's `extensions.code`).
#[derive(Debug, Clone)]
pub(crate) struct FieldError {
    pub message: Arc<str>,
    pub code: Option<&'static str>,
}

/// `extensions.code` of a field the caller may not read.
pub(crate) const FORBIDDEN: &str = "FORBIDDEN";

impl FieldError {
    pub(crate) fn new(message: impl Into<Arc<str>>, code: Option<&'static str>) -> Self {
        Self {
            message: message.into(),
            code,
        }
    }

    /// A read the engine refused or could not serve, with its kind's code (`FORBIDDEN`,
    /// `UNAVAILABLE`, `BAD_REQUEST`…).
    pub(crate) fn engine(e: &meshql_engine::EngineError) -> Self {
        Self::new(e.to_string(), Some(e.kind().code()))
    }
}

/// The result of one root field.
pub(crate) enum RootResult {
    Nodes(Vec<Node>),
    Error(FieldError),
}

impl Node {
    /// A row of a nested search, with its relationships already fetched.
    pub(crate) fn from_nested(row: NestedRow) -> Node {
        let mut map = row.payload;
        if map.get("id").and_then(Value::as_str) != Some(row.id.as_str()) {
            map.insert("id".into(), Value::String(row.id));
        }
        Node {
            map,
            links: row
                .children
                .into_iter()
                .map(|rows| {
                    Link::Nodes(
                        rows.into_iter()
                            .map(|r| Arc::new(Node::from_nested(r)))
                            .collect(),
                    )
                })
                .collect(),
            mask: None,
        }
    }

    /// Tells the writer which fields the caller may read (`None`: every field). The map
    /// keeps them: relationships still resolve through a hidden key field, as the target
    /// entity's own read permission allows.
    pub(crate) fn masked(mut self, mask: Option<&Arc<Mask>>) -> Node {
        self.mask = mask.cloned();
        self
    }

    /// A stored row, parsed into the fields `reads` names (a selection's
    /// [`crate::plan::SelectionPlan::reads`]); its relationships are resolved later.
    pub(crate) fn from_row(row: Row, reads: &[String]) -> Node {
        let map = match meshql_core::parse_payload(&row.payload, Some(reads)) {
            Ok(mut m) => {
                // the envelope id is authoritative
                if m.get("id").and_then(Value::as_str) != Some(row.id.as_str()) {
                    m.insert("id".into(), Value::String(row.id));
                }
                m
            }
            Err(e) => {
                tracing::error!(id = %row.id, error = %e, "stored payload is not a JSON object");
                let mut m = Map::new();
                m.insert("id".into(), Value::String(row.id));
                m
            }
        };
        Node {
            map,
            links: Vec::new(),
            mask: None,
        }
    }
}
