//! The in-process fetcher: a graphlette's entity service, queried with its bound templates.
//! Whether the caller may read, and which fields, is the service's decision: the rows come
//! back with their mask.

use super::{Batch, Fetched, Fetcher};
use crate::plan::TargetPlan;
use crate::tree::FieldError;
use futures::future::BoxFuture;
use meshql_core::{
    BatchSearch, BoundArgs, FieldSet, KeyedRows, Millis, Nested, NestedRow, QueryTemplate, Row,
    Search,
};
use meshql_engine::{Access, EngineError, EntityService, Granted};
use std::sync::Arc;

/// A graphlette's service and the templates of its root queries (same indexes as the
/// graphlette's `queries`).
pub(crate) struct InProcess {
    service: Arc<EntityService>,
    templates: Vec<QueryTemplate>,
}

/// The rows of a root query.
pub(crate) enum RootRows {
    /// With the relationships below, fetched in the same statement.
    Nested(Vec<NestedRow>),
    /// The rows alone (with the fields the caller may read): relationships are resolved
    /// level by level.
    Flat(Granted<Vec<Row>>),
}

impl InProcess {
    pub fn new(service: Arc<EntityService>, templates: Vec<QueryTemplate>) -> Self {
        Self { service, templates }
    }

    /// Root query `query` as of `at`: in one statement with the relationships in `nested`
    /// when the engine allows it and the store can, else its rows alone; `reads` are the
    /// payload fields the caller reads.
    #[allow(clippy::too_many_arguments)]
    pub async fn query(
        &self,
        access: &Access,
        query: usize,
        args: &BoundArgs,
        limit: Option<usize>,
        nested: Option<&[Nested]>,
        reads: &FieldSet,
        at: Option<Millis>,
    ) -> Result<RootRows, EngineError> {
        let search = Search::new(&self.templates[query], args, limit).reading(Some(reads));
        if let Some(nested) = nested {
            if let Some(rows) = self
                .service
                .find_nested(access, &search, nested, at)
                .await?
            {
                return Ok(RootRows::Nested(rows));
            }
            // not allowed, or the store cannot: level by level
        }
        self.service
            .find(access, &search, at)
            .await
            .map(RootRows::Flat)
    }

    /// Query `query` for many ids (bound to its `id` argument) in one storage query.
    pub async fn find_batch(
        &self,
        access: &Access,
        query: usize,
        keys: &[String],
        at: Option<Millis>,
    ) -> Result<Granted<KeyedRows>, EngineError> {
        self.service
            .find_batch(
                access,
                &BatchSearch::new(&self.templates[query], "id", keys),
                at,
            )
            .await
    }
}

impl Fetcher for InProcess {
    fn fetch<'a>(&'a self, batch: Batch<'a>) -> BoxFuture<'a, Fetched> {
        Box::pin(async move {
            let TargetPlan::InProcess { query, .. } = &batch.resolver.target else {
                unreachable!("the in-process fetcher is only given in-process targets");
            };
            match self
                .find_batch(&batch.ctx.access, *query, batch.keys, batch.at)
                .await
            {
                Ok(granted) => Fetched::Rows(granted),
                Err(e) => Fetched::Failed(FieldError::engine(&e)),
            }
        })
    }
}
