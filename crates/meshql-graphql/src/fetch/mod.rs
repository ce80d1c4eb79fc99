//! Where rows come from. A relationship field is resolved one level at a time: the keys of
//! all parents at that level go to the field's [`Fetcher`] in one [`Batch`], and the
//! fetcher answers with one storage query or one aliased HTTP request (a `dyn` call per
//! level, never per row). Two implementations:
//!
//! * [`InProcess`] (`local`): a graphlette's own entity service
//!   ([`meshql_engine::EntityService`], which decides what the caller may read); it also
//!   answers root queries, which are always the graphlette's own.
//! * [`Http`] (`http`): a remote graphlette, with the keys as aliased root fields.
//!
//! [`Fetchers`] holds one in-process fetcher per graphlette and the shared HTTP one, and
//! picks the fetcher of a resolver's target. Fetchers return rows or finished links; what
//! to do with them (nodes, the next level below) is execution's business.

mod http;
mod local;

pub(crate) use http::Http;
pub(crate) use local::{InProcess, RootRows};

use crate::plan::{ResolverPlan, TargetPlan};
use crate::request::{Budget, RequestContext};
use crate::tree::{FieldError, Link};
use futures::future::BoxFuture;
use meshql_core::{KeyedRows, Millis};
use meshql_engine::Granted;
use serde_json::{Map, Value};

/// One batched level: the distinct keys of every parent of one resolver field.
#[derive(Clone, Copy)]
pub(crate) struct Batch<'a> {
    pub resolver: &'a ResolverPlan,
    pub keys: &'a [String],
    pub at: Option<Millis>,
    pub ctx: &'a RequestContext,
    /// The request's coerced variables (a remote sub-selection may use some).
    pub variables: &'a Map<String, Value>,
    /// What is left of the request's bounds, for a remote graphlette.
    pub budget: Budget,
}

/// What a fetcher brings back for a [`Batch`].
pub(crate) enum Fetched {
    /// Stored rows, each with the key it answers, in storage order, and the fields the
    /// caller may read of them: execution turns them into nodes and resolves the level below.
    Rows(Granted<KeyedRows>),
    /// One finished link per key, in key order (a remote graphlette's JSON).
    Links(Vec<Link>),
    /// The whole level failed; every key gets this error.
    Failed(FieldError),
}

/// Fetches a relationship level.
pub(crate) trait Fetcher: Send + Sync {
    fn fetch<'a>(&'a self, batch: Batch<'a>) -> BoxFuture<'a, Fetched>;
}

/// The fetchers of a registry: one [`InProcess`] per graphlette (same index) and one
/// [`Http`] for every remote target.
pub(crate) struct Fetchers {
    local: Vec<InProcess>,
    http: Http,
}

impl Fetchers {
    pub fn new(local: Vec<InProcess>, http: Http) -> Self {
        Self { local, http }
    }

    /// The fetcher of graphlette `index`'s own store (root queries).
    pub fn local(&self, index: usize) -> &InProcess {
        &self.local[index]
    }

    /// The fetcher that resolves `target`.
    pub fn for_target(&self, target: &TargetPlan) -> &dyn Fetcher {
        match target {
            TargetPlan::InProcess { graphlette, .. } => &self.local[*graphlette],
            TargetPlan::Http { .. } => &self.http,
        }
    }
}
