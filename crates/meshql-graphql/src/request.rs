//! The GraphQL-over-HTTP request and the per-request context (the leaf of the crate).

use meshql_core::{Grants, TokenFilter};
use serde::Deserialize;
use std::sync::Arc;

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

/// Who is asking, and what to forward to remote graphlettes.
#[derive(Debug, Clone)]
pub struct RequestContext {
    pub filter: TokenFilter,
    /// The caller's `Authorization` header, forwarded on HTTP resolver calls (the remote
    /// service decides its own permissions from it).
    pub authorization: Option<String>,
    /// What the caller may read, per entity: a root query or an in-process relationship
    /// into an entity it may not read answers `FORBIDDEN`, and a selected field its read
    /// mask hides is null with a `FORBIDDEN` error at its path.
    pub grants: Arc<Grants>,
}

impl Default for RequestContext {
    fn default() -> Self {
        Self {
            filter: TokenFilter::All,
            authorization: None,
            grants: Arc::new(Grants::unrestricted()),
        }
    }
}
