//! A graphlette as declared, in plain data: its root queries, its relationship fields and
//! where they lead, and what one request may cost. The config loader produces them; the
//! GraphQL engine runs them; neither depends on the other.

use crate::template::QueryTemplate;
use schemars::JsonSchema;
use serde::Deserialize;
use std::num::{NonZeroU64, NonZeroUsize};

/// See [`ServiceConfig::graphql`]. Every limit is at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GraphqlLimits {
    /// Field nesting, fragments expanded (`{ a { b } }` is 2).
    #[serde(default = "default_max_depth")]
    pub max_depth: NonZeroUsize,
    /// Relationship fields along any path, so that a cycle (`hens { coop { hens { ... } } }`)
    /// stops here.
    #[serde(default = "default_max_relationship_depth")]
    pub max_relationship_depth: NonZeroUsize,
    /// Field selections once fragments are expanded (aliases count).
    #[serde(default = "default_max_fields")]
    pub max_fields: NonZeroUsize,
    /// Relationship fields in the whole operation (each costs one batched fetch).
    #[serde(default = "default_max_relationships")]
    pub max_relationships: NonZeroUsize,
    /// Root fields (MeshQL's batched lookups send one aliased root field per key).
    #[serde(default = "default_max_root_fields")]
    pub max_root_fields: NonZeroUsize,
    /// Objects in a response: documents fetched, and objects written (a document that
    /// several parents share is written, and counted, once per parent). A vector query
    /// without `limit` that matches more is refused rather than cut short.
    #[serde(default = "default_max_objects")]
    pub max_objects: NonZeroUsize,
    /// Bytes of a response body.
    #[serde(default = "default_max_response_bytes")]
    pub max_response_bytes: NonZeroUsize,
    /// How long a request may run (storage reads and federated calls included).
    #[serde(default = "default_graphql_timeout")]
    pub timeout_ms: NonZeroU64,
}

impl Default for GraphqlLimits {
    fn default() -> Self {
        Self {
            max_depth: default_max_depth(),
            max_relationship_depth: default_max_relationship_depth(),
            max_fields: default_max_fields(),
            max_relationships: default_max_relationships(),
            max_root_fields: default_max_root_fields(),
            max_objects: default_max_objects(),
            max_response_bytes: default_max_response_bytes(),
            timeout_ms: default_graphql_timeout(),
        }
    }
}

fn nonzero(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).expect("defaults are not zero")
}
fn default_max_depth() -> NonZeroUsize {
    nonzero(15)
}
fn default_max_relationship_depth() -> NonZeroUsize {
    nonzero(8)
}
fn default_max_fields() -> NonZeroUsize {
    nonzero(5_000)
}
fn default_max_relationships() -> NonZeroUsize {
    nonzero(256)
}
fn default_max_root_fields() -> NonZeroUsize {
    nonzero(1_000)
}
fn default_max_objects() -> NonZeroUsize {
    nonzero(100_000)
}
fn default_max_response_bytes() -> NonZeroUsize {
    nonzero(32 * 1024 * 1024)
}
fn default_graphql_timeout() -> NonZeroU64 {
    NonZeroU64::new(30_000).expect("not zero")
}

#[derive(Debug, Clone)]
/// A root query bound to a template.
pub struct GraphQuery {
    pub name: String,
    pub vector: bool,
    pub template: QueryTemplate,
}

#[derive(Debug, Clone)]
/// A relationship field: the query of another graphlette it calls with a key.
pub struct Resolver {
    pub field: String,
    pub key: String,
    pub query: String,
    pub vector: bool,
    pub target: ResolverTarget,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ResolverTarget {
    /// A graphlette of this service, by path.
    InProcess { graph_path: String },
    /// A remote graphlette.
    Http { url: String },
}
