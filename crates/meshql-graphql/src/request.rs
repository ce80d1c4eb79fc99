//! The GraphQL-over-HTTP request and the per-request context (the leaf of the crate).

use meshql_core::Millis;
use meshql_engine::Access;
use serde::Deserialize;

/// A GraphQL request as POSTed (or sent as GET parameters).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GraphqlRequest {
    #[serde(default)]
    pub query: Option<String>,
    #[serde(default)]
    pub operation_name: Option<String>,
    #[serde(default)]
    pub variables: Option<serde_json::Value>,
}

/// Who is asking, as of when, and what to forward to remote graphlettes.
#[derive(Debug, Clone)]
pub struct RequestContext {
    /// Who is asking and what they may read: the engine decides with it (a root query or an
    /// in-process relationship into an entity the caller may not read answers `FORBIDDEN`;
    /// a selected field its read mask hides is null with a `FORBIDDEN` error at its path).
    pub access: Access,
    /// The caller's `Authorization` header, forwarded on HTTP resolver calls (the remote
    /// service decides its own permissions from it).
    pub authorization: Option<String>,
    /// What a root field without `at` reads as of, and every level below it: the request's
    /// start ([`meshql_engine::EntityService::read_snapshot`]), so that one answer is one
    /// snapshot however its levels interleave with writes.
    pub snapshot: Millis,
    /// What a calling meshql left of its bounds, when this request is one of its federated
    /// hops (empty otherwise).
    pub budget: Budget,
    /// The caller's consistency token (`x-meshql-consistency`), forwarded on HTTP resolver
    /// calls so that the remote service reads what the caller wrote too.
    pub consistency: Option<String>,
}

impl RequestContext {
    /// A request by `access`, reading as of `snapshot`.
    pub fn new(access: Access, authorization: Option<String>, snapshot: Millis) -> Self {
        Self {
            access,
            authorization,
            snapshot,
            budget: Budget::default(),
            consistency: None,
        }
    }

    /// The same request, within what a calling service left of its bounds.
    pub fn within(mut self, budget: Budget) -> Self {
        self.budget = budget;
        self
    }
}

impl Default for RequestContext {
    /// A caller who may read everything, as of now (tests, tools).
    fn default() -> Self {
        Self::new(
            Access::unrestricted(),
            None,
            meshql_core::time::now_millis(),
        )
    }
}

/// What is left of a federated request's bounds when it reaches a remote graphlette: sent by
/// an HTTP resolver in the [`Budget::HEADER`] header and applied by the receiving meshql on
/// top of its own limits (the smaller wins; a budget can only lower them). Without it each hop
/// of a relationship cycle through `url` resolvers would start again at depth 0 with a whole
/// object budget, and a small query could fan out without bound across services.
///
/// `depth`: field levels left below and including the remote root field; `relationships`:
/// relationship fields left along one path below it; `objects`: documents the remote may
/// fetch; `ms`: milliseconds left before the caller gives up. Text form:
/// `depth=4, relationships=2, objects=900, ms=4200` (any subset, any order).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Budget {
    pub depth: Option<usize>,
    pub relationships: Option<usize>,
    pub objects: Option<usize>,
    pub ms: Option<u64>,
}

impl Budget {
    /// The header an HTTP resolver sends it in.
    pub const HEADER: &'static str = "x-meshql-budget";

    /// Parses the header's value; a malformed one is refused (a caller that means to lower
    /// the bounds must not silently get the full ones).
    pub fn parse(text: &str) -> Result<Budget, String> {
        let mut budget = Budget::default();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("`{part}` is not key=value"))?;
            let number = || {
                value
                    .trim()
                    .parse::<u64>()
                    .map_err(|_| format!("`{}` must be a non-negative integer", key.trim()))
            };
            match key.trim() {
                "depth" => budget.depth = Some(number()? as usize),
                "relationships" => budget.relationships = Some(number()? as usize),
                "objects" => budget.objects = Some(number()? as usize),
                "ms" => budget.ms = Some(number()?),
                other => return Err(format!("unknown budget `{other}`")),
            }
        }
        Ok(budget)
    }

    /// The header's value.
    pub fn to_header(&self) -> String {
        let mut parts = Vec::with_capacity(4);
        if let Some(d) = self.depth {
            parts.push(format!("depth={d}"));
        }
        if let Some(r) = self.relationships {
            parts.push(format!("relationships={r}"));
        }
        if let Some(o) = self.objects {
            parts.push(format!("objects={o}"));
        }
        if let Some(ms) = self.ms {
            parts.push(format!("ms={ms}"));
        }
        parts.join(", ")
    }

    /// `limit`, lowered to this budget's `value` when it has one.
    pub(crate) fn lower(limit: usize, value: Option<usize>) -> usize {
        value.map_or(limit, |v| v.min(limit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_reads_back_what_it_writes_and_refuses_malformed_text() {
        let b = Budget {
            depth: Some(4),
            relationships: Some(0),
            objects: Some(900),
            ms: Some(4200),
        };
        assert_eq!(
            b.to_header(),
            "depth=4, relationships=0, objects=900, ms=4200"
        );
        assert_eq!(Budget::parse(&b.to_header()), Ok(b));
        assert_eq!(
            Budget::parse("objects=5").unwrap(),
            Budget {
                objects: Some(5),
                ..Budget::default()
            }
        );
        assert_eq!(Budget::parse("").unwrap(), Budget::default());
        assert!(Budget::parse("depth").is_err());
        assert!(Budget::parse("depth=-1").is_err());
        assert!(Budget::parse("width=3").is_err());
        assert_eq!(Budget::lower(10, Some(3)), 3);
        assert_eq!(Budget::lower(10, Some(30)), 10);
        assert_eq!(Budget::lower(10, None), 10);
    }
}
