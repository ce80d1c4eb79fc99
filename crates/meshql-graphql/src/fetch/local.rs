//! The in-process fetcher: a graphlette's store, queried with its bound templates.

use super::{Batch, Fetched, Fetcher};
use crate::plan::TargetPlan;
use crate::tree::FieldError;
use futures::future::BoxFuture;
use meshql_core::{
    BatchSearch, BoundArgs, DynReader, FieldSet, KeyedRows, Nested, NestedRow, QueryTemplate,
    ReadContext, Row, Search, StoreError,
};

/// A graphlette's store and the templates of its root queries (same indexes as the
/// graphlette's `queries`).
pub(crate) struct InProcess {
    store: DynReader,
    templates: Vec<QueryTemplate>,
}

/// The rows of a root query.
pub(crate) enum RootRows {
    /// With the relationships below, fetched in the same statement.
    Nested(Vec<NestedRow>),
    /// The rows alone: relationships are resolved level by level.
    Flat(Vec<Row>),
}

impl InProcess {
    pub fn new(store: DynReader, templates: Vec<QueryTemplate>) -> Self {
        Self { store, templates }
    }

    /// Root query `query`: in one statement with the relationships in `nested` when the
    /// store can, else its rows alone; `reads` are the payload fields the caller reads.
    pub async fn query(
        &self,
        query: usize,
        args: &BoundArgs,
        limit: Option<usize>,
        nested: Option<&[Nested]>,
        reads: &FieldSet,
        ctx: &ReadContext<'_>,
    ) -> Result<RootRows, StoreError> {
        let search = Search::new(&self.templates[query], args, limit).reading(Some(reads));
        if let Some(nested) = nested {
            if let Some(rows) = self.store.find_nested(&search, nested, ctx).await? {
                return Ok(RootRows::Nested(rows));
            }
            // the store cannot: level by level
        }
        self.store.find(&search, ctx).await.map(RootRows::Flat)
    }

    /// Query `query` for many ids (bound to its `id` argument) in one storage query.
    pub async fn find_batch(
        &self,
        query: usize,
        keys: &[String],
        ctx: &ReadContext<'_>,
    ) -> Result<KeyedRows, StoreError> {
        self.store
            .find_batch(&BatchSearch::new(&self.templates[query], "id", keys), ctx)
            .await
    }
}

impl Fetcher for InProcess {
    fn fetch<'a>(&'a self, batch: Batch<'a>) -> BoxFuture<'a, Fetched> {
        Box::pin(async move {
            let TargetPlan::InProcess { query, .. } = &batch.resolver.target else {
                unreachable!("the in-process fetcher is only given in-process targets");
            };
            let ctx = ReadContext::new(&batch.ctx.filter, batch.at);
            match self.find_batch(*query, batch.keys, &ctx).await {
                Ok(rows) => Fetched::Rows(rows),
                Err(e) => Fetched::Failed(FieldError::store(&e)),
            }
        })
    }
}
