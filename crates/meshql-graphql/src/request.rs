//! The GraphQL-over-HTTP request and the per-request context (the leaf of the crate).

use meshql_core::TokenFilter;
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

/// Who is asking, and what to forward to remote graphlettes.
#[derive(Debug, Clone)]
pub struct RequestContext {
    pub filter: TokenFilter,
    /// The caller's `Authorization` header, forwarded on HTTP resolver calls.
    pub authorization: Option<String>,
}

impl Default for RequestContext {
    fn default() -> Self {
        Self {
            filter: TokenFilter::All,
            authorization: None,
        }
    }
}
