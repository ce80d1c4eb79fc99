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
//! 2. **Fetch** (`execute`, `fetch`): run the root queries, then resolve relationship
//!    fields **level by level**: for every resolver field, the keys of all parents at that
//!    level are de-duplicated and fetched in one storage query (`find_batch`) or one aliased
//!    HTTP request. A depth-3 query costs three storage queries whatever the fan-out.
//! 3. **Write** ([`output`]): walk the plan over the fetched rows and write the response
//!    JSON directly, with GraphQL's null propagation for non-null fields.
//!
//! # Modules, bottom up
//!
//! Each module uses only modules above it in this list (no cycles):
//!
//! 1. `request`: the GraphQL-over-HTTP request and the per-request context (leaf).
//! 2. `tree`: the result tree execution builds and the writer reads (nodes, links,
//!    root results) (leaf).
//! 3. `catalog`: [`Graphlette`]s and the [`Catalog`] view planning needs (leaf).
//! 4. [`plan`]: compiling an operation into a plan (uses `catalog`).
//! 5. [`output`]: writing the response (uses `plan`, `tree`).
//! 6. `fetch`: the `Fetcher` trait for a relationship level and its in-process and HTTP
//!    implementations (uses `plan`, `tree`, `request`).
//! 7. `execute`: running a plan level by level (uses `catalog`, `plan`, `tree`, `fetch`,
//!    `output`, `request`).
//! 8. `registry`: the [`Registry`]: graphlettes, plan caches, fetchers; plans and runs
//!    requests (uses all of the above).

mod catalog;
mod execute;
mod fetch;
pub mod output;
pub mod plan;
mod registry;
mod request;
mod subscribe;
mod tree;

pub use catalog::{Catalog, Graphlette, GraphletteQuery, GraphletteSpec};
pub use registry::{Registry, RegistryError};
pub use request::{Budget, GraphqlRequest, RequestContext};
pub use subscribe::{version_before, Before, ChangeEvent, Subscribed, Subscription};
