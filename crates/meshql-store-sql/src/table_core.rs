//! What every SQL store keeps per table, whatever its driver: its compiled searches and
//! nested statements, the templates it was prepared with, and its counters.

use crate::dialect::Dialect;
use crate::param::{Compiled, Shape};
use meshql_core::lru::{Lru, Slot};
use meshql_core::memo::Memo;
use meshql_core::nested::{signature, Level};
use meshql_core::{BatchSearch, CommitSignal, Millis, QueryTemplate, Relation, Search, StoreError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// One table's compiled statements and state, as every SQL store keeps them.
pub struct TableCore {
    d: &'static dyn Dialect,
    table: String,
    compiled: Memo<(u64, Shape), Compiled>,
    /// The templates [`meshql_core::Store::prepare`] was given (a rebuild table gets the
    /// same indexes).
    templates: Mutex<Vec<QueryTemplate>>,
    /// Reads (what requests cost: feed reads are not counted).
    pub reads: Arc<AtomicU64>,
    /// Versions written.
    pub writes: Arc<AtomicU64>,
    /// Transactions committed (where the store counts them itself).
    pub commits: AtomicU64,
    /// Woken when writes commit (the change feed's readers wait on it).
    pub signal: CommitSignal,
}

impl TableCore {
    pub fn new(d: &'static dyn Dialect, table: &str) -> Self {
        Self {
            d,
            table: table.to_owned(),
            compiled: Memo::default(),
            templates: Mutex::new(Vec::new()),
            reads: Arc::new(AtomicU64::new(0)),
            writes: Arc::new(AtomicU64::new(0)),
            commits: AtomicU64::new(0),
            signal: CommitSignal::default(),
        }
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    /// This table as a [`Relation`] of the database `database`, when the store reads
    /// relationships with the searches that lead to them (`enabled`).
    pub fn relation(&self, enabled: bool, database: usize) -> Option<Relation> {
        enabled.then(|| Relation {
            backend: self.d.backend(),
            database,
            table: self.table.clone(),
        })
    }

    /// The shape of a search: `at` a moment, for some tokens, with a limit the statement
    /// binds (where the dialect limits in SQL, and not for a batch).
    pub fn shape(
        &self,
        at: Option<Millis>,
        tokens: bool,
        limit: Option<usize>,
        batch: bool,
    ) -> Shape {
        Shape {
            at: at.is_some(),
            tokens,
            limit: limit.is_some() && !batch && self.d.limit_in_sql(),
            batch,
        }
    }

    /// The statement of a search of this table, compiled once per template and shape.
    pub fn compiled(&self, template: &QueryTemplate, shape: Shape) -> Arc<Compiled> {
        self.compiled.get_or_insert_with((template.id, shape), || {
            crate::search::search(self.d, &self.table, template, shape)
        })
    }

    /// The statement of a search `at` a moment, for some tokens, once its arguments are
    /// checked ([`QueryTemplate::check_args`]).
    pub fn search_statement(
        &self,
        search: &Search<'_>,
        at: Option<Millis>,
        tokens: bool,
    ) -> Result<Arc<Compiled>, StoreError> {
        search
            .template
            .check_args(search.args)
            .map_err(|e| StoreError::Invalid(e.to_string()))?;
        let shape = self.shape(at, tokens, search.limit, false);
        Ok(self.compiled(search.template, shape))
    }

    /// The statement of a batched lookup `at` a moment, for some tokens; `None` when it has
    /// no keys (nothing to read). Only lookups by the `id` argument batch.
    pub fn batch_statement(
        &self,
        batch: &BatchSearch<'_>,
        at: Option<Millis>,
        tokens: bool,
    ) -> Result<Option<Arc<Compiled>>, StoreError> {
        if batch.keys.is_empty() {
            return Ok(None);
        }
        batch.require_id_key()?;
        let shape = self.shape(at, tokens, None, true);
        Ok(Some(self.compiled(batch.template, shape)))
    }

    /// Remembers the templates [`meshql_core::Store::prepare`] was given.
    pub fn remember(&self, templates: &[QueryTemplate]) {
        *self
            .templates
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = templates.to_vec();
    }

    /// The templates [`Self::remember`] kept.
    pub fn templates(&self) -> Vec<QueryTemplate> {
        self.templates
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The indexes (and generated columns) that serve `templates`' filters and ranges on
    /// `table`, in the templates' order.
    pub fn index_ddl(d: &dyn Dialect, table: &str, templates: &[QueryTemplate]) -> Vec<String> {
        let mut out = Vec::new();
        for t in templates {
            for path in t.filtered_paths() {
                out.extend(d.field_ddl(table, &path));
            }
            for path in t.range_paths() {
                out.extend(d.range_ddl(table, &path));
            }
        }
        out
    }

    /// The statements a store prepares at start-up, so that a bad SQL fragment fails then:
    /// every template's search and batched lookup, with no optional clause.
    pub fn startup_statements(&self, templates: &[QueryTemplate]) -> Vec<Arc<Compiled>> {
        templates
            .iter()
            .flat_map(|t| {
                [false, true].map(|batch| {
                    let shape = Shape {
                        batch,
                        ..Shape::default()
                    };
                    self.compiled(t, shape)
                })
            })
            .collect()
    }

    /// A statement prepared at start-up did not compile: the error names it.
    pub fn invalid_statement(error: impl std::fmt::Display, sql: &str) -> StoreError {
        StoreError::Invalid(format!("{error} in statement `{sql}`"))
    }

    pub fn count_read(&self) {
        self.reads.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` versions written (the caller wakes the feed's readers itself).
    pub fn count_writes(&self, n: u64) {
        self.writes.fetch_add(n, Ordering::Relaxed);
    }

    /// `n` versions written and committed: counted, and the feed's readers woken when
    /// there are any.
    pub fn wrote(&self, n: u64) {
        self.count_writes(n);
        if n > 0 {
            self.signal.notify();
        }
    }

    /// A transaction committed (for a store that counts its commits itself).
    pub fn committed(&self) {
        self.commits.fetch_add(1, Ordering::Relaxed);
    }
}

/// A store's nested statements ([`crate::nested`]), by [`signature`]: at most a fixed
/// number, the least recently used evicted first.
pub struct NestedStatements {
    lru: Lru<Compiled>,
}

impl NestedStatements {
    pub fn new(capacity: usize) -> Self {
        Self {
            lru: Lru::new(capacity),
        }
    }

    /// The nested statement of a search of `table` with `levels` below it; `evicted` is
    /// called with a statement that leaves the cache (a store closes it on its connections).
    pub fn get(
        &self,
        d: &dyn Dialect,
        table: &str,
        template: &QueryTemplate,
        shape: Shape,
        levels: &[Level<'_>],
        evicted: impl FnOnce(&Compiled),
    ) -> Arc<Slot<Compiled>> {
        let key = signature((template.id, shape), levels);
        self.lru.get_or_insert_with(
            key,
            || crate::nested::nested_search(d, table, template, shape, levels),
            evicted,
        )
    }

    pub fn len(&self) -> usize {
        self.lru.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lru.is_empty()
    }
}
