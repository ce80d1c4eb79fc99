//! Reads by a caller's [`Access`] (no write session): GraphQL's root queries, its batched
//! relationship levels and its nested single-statement reads, the change feed's filters.
//! Each is allowed and masked by [`EntityService::read_grant`], the one place read
//! permissions are decided, and served by the service's reader (a replica or a cache when
//! the deployment puts one in front of the primary).
//!
//! The rows come back with the mask that applies, not with the hidden fields removed: a
//! frontend may still need a hidden field (GraphQL resolves a relationship through a key
//! field the caller cannot see, as the target entity's own permission allows) and reports a
//! selected hidden field in its own protocol (GraphQL: null, with `FORBIDDEN` at its path).

use crate::{Access, EngineError, EntityService};
use meshql_core::{
    BatchSearch, KeyedRows, Mask, Millis, Nested, NestedRow, ReadContext, Row, Search,
};
use std::sync::Arc;

/// Rows the caller may read, with the fields it may see of them (`None`: all).
#[derive(Debug)]
pub struct Granted<T> {
    pub rows: T,
    pub mask: Option<Arc<Mask>>,
}

impl EntityService {
    /// A query template's rows, as of `at`.
    pub async fn find(
        &self,
        access: &Access,
        search: &Search<'_>,
        at: Option<Millis>,
    ) -> Result<Granted<Vec<Row>>, EngineError> {
        let mask = self.read_grant(&access.grants)?;
        let rows = self
            .reader_for(access.from_primary)
            .find(search, &ReadContext::new(&access.filter, at))
            .await?;
        Ok(Granted { rows, mask })
    }

    /// A query template for many keys at once (one relationship level), as of `at`.
    pub async fn find_batch(
        &self,
        access: &Access,
        search: &BatchSearch<'_>,
        at: Option<Millis>,
    ) -> Result<Granted<KeyedRows>, EngineError> {
        let mask = self.read_grant(&access.grants)?;
        let rows = self
            .reader_for(access.from_primary)
            .find_batch(search, &ReadContext::new(&access.filter, at))
            .await?;
        Ok(Granted { rows, mask })
    }

    /// A root query with the relationship tree `nested` in one statement, as of `at`. Only
    /// for a caller who may read every entity without a mask (the statement reads other
    /// entities' tables and cannot mask them), and only when the store can: `Ok(None)`
    /// otherwise, and the caller reads level by level.
    pub async fn find_nested(
        &self,
        access: &Access,
        search: &Search<'_>,
        nested: &[Nested],
        at: Option<Millis>,
    ) -> Result<Option<Vec<NestedRow>>, EngineError> {
        if !access.grants.is_unrestricted() {
            return Ok(None);
        }
        Ok(self
            .reader_for(access.from_primary)
            .find_nested(search, nested, &ReadContext::new(&access.filter, at))
            .await?)
    }
}
