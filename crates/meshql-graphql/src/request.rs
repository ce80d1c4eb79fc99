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
}

impl RequestContext {
    /// A request by `access`, reading as of `snapshot`.
    pub fn new(access: Access, authorization: Option<String>, snapshot: Millis) -> Self {
        Self {
            access,
            authorization,
            snapshot,
        }
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
