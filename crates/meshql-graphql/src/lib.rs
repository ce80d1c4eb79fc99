//! Graphlettes: one GraphQL endpoint per entity, built from its SDL and bound to storage.
//!
//! A request goes through three steps:
//!
//! 1. **Plan** ([`plan`]): parse and validate the document against the graphlette's SDL
//!    (apollo-compiler, spec-compliant), then compile the operation into a tree of
//!    field plans. Resolver fields are bound at plan time to the target graphlette's query
//!    and store (in-process) or to a prepared remote query text (HTTP). Plans are cached
//!    by `(query text, operation name)`, so a repeated query is neither parsed nor
//!    validated again.
//! 2. **Fetch** ([`execute`]): run the root queries, then resolve relationship fields
//!    **level by level**: for every resolver field, the keys of all parents at that level
//!    are de-duplicated and fetched in one storage query (`find_batch`) or one aliased HTTP
//!    request. A depth-3 query costs three storage queries whatever the fan-out.
//! 3. **Write** ([`output`]): walk the plan over the fetched rows and write the response
//!    JSON directly, with GraphQL's null propagation for non-null fields.

mod execute;
mod http;
pub mod output;
pub mod plan;
mod registry;
mod request;

pub use registry::{Graphlette, GraphletteQuery, Registry, RegistryError};
pub use request::{GraphqlRequest, RequestContext};
