//! [`PostgresStore`]: one entity table.

use crate::db::{pg_error, pool_error, PostgresDatabase};
use crate::dialect::DIALECT;
use crate::pipeline::{pipelined, pipelined_all};
use crate::sql::{self, quote_ident, Compiled, Shape, SqlParam};
use async_trait::async_trait;
use deadpool_postgres::GenericClient;
use meshql_core::nested::Level;
use meshql_core::{
    in_request_order, now_millis, BoundArgs, Cursor, Envelope, KeyedRows, Millis, Nested,
    NestedRow, NewDocument, Placement, QueryTemplate, Relation, RemoveOutcome, Row, Store,
    StoreChange, StoreError, StoreStats, WriteContext,
};
use meshql_core::{BatchSearch, ChangeFeed, ReadContext, Search, StoreReader, StoreWriter};
use meshql_store_sql::nested::{nested_plan, NestedPlan};
use meshql_store_sql::param::{Binding, ListArg};
use meshql_store_sql::rules::{
    token_list as filter_tokens, updatable, visible, Current, RemoveStep, Version,
};
use meshql_store_sql::table::{list_index, page_index, PageParam, Pager};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio_postgres::types::ToSql;

#[cfg(test)]
mod golden;
mod outputs;

use meshql_core::lru::Slot;
use meshql_store_sql::table_core::{NestedStatements, TableCore};

/// One entity's table.
pub struct PostgresStore {
    db: Arc<PostgresDatabase>,
    /// Reads go to the replica's pool (`read_url`): a store made by [`Self::replica`], which
    /// the engine only ever reads through. Otherwise every read goes to the primary, so that
    /// a write path never reads a replica's stale version.
    on_replica: bool,
    /// The table's compiled searches, templates and counters.
    core: TableCore,
    sql: TableSql,
    /// Nested statements: at most [`Self::NESTED_STATEMENTS`], the least recently used
    /// evicted first, and its prepared statement with it ([`Self::nested_compiled`]).
    nested: NestedStatements,
}

/// The table's statements: those every SQL store shares ([`meshql_store_sql::table`]), and
/// PostgreSQL's locks, batch reads and change feed.
struct TableSql {
    common: meshql_store_sql::table::TableSql,
    /// [`Self::current`] of several ids: the id first, then the same columns.
    current_many: String,
    lock: String,
    changes: String,
}

impl std::ops::Deref for TableSql {
    type Target = meshql_store_sql::table::TableSql;

    fn deref(&self) -> &Self::Target {
        &self.common
    }
}

const COLUMNS: &str = "t.id, t.payload::text, t.created_at, t.deleted, t.authorized_tokens";

impl TableSql {
    fn new(table: &str) -> Self {
        let t = quote_ident(table);
        Self {
            common: meshql_store_sql::table::TableSql::new(&DIALECT, table),
            current_many: format!(
                "SELECT id, _id, payload::text, created_at, deleted, authorized_tokens, \
                 COALESCE(seq, _id) FROM {t} WHERE id = ANY($1::text[]) AND latest"
            ),
            lock: "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))".to_owned(),
            // The feed's order is (transaction id, row id), and its visibility horizon the
            // oldest transaction still running: every row of a transaction older than that
            // has committed or never will, and every transaction not yet finished gets a
            // larger id, so a reader resuming after a cursor can miss nothing. Writes of one
            // document take its lock before their transaction gets an id, so they are in
            // commit order; so is a write that began after another was acknowledged.
            changes: format!(
                "SELECT {COLUMNS}, t.tx::text::bigint, t._id, t.seq IS NULL, t.correlation_id \
                 FROM {t} t WHERE (t.tx, t._id) > ($1::text::xid8, $2) \
                 AND t.tx < pg_snapshot_xmin(pg_current_snapshot()) \
                 ORDER BY t.tx, t._id LIMIT $3"
            ),
        }
    }
}

fn envelope(row: &tokio_postgres::Row) -> Envelope {
    Envelope {
        id: row.get(0),
        payload: row.get(1),
        created_at: row.get(2),
        deleted: row.get(3),
        authorized_tokens: row.get(4),
    }
}

/// `sql` prepared on this connection, from its statement cache after the first time.
async fn prepared<C: GenericClient>(
    client: &C,
    sql: &str,
) -> Result<tokio_postgres::Statement, StoreError> {
    client.prepare_cached(sql).await.map_err(pg_error)
}

fn current_of_row(r: &tokio_postgres::Row) -> Current {
    current_of_row_at(r, 0)
}

/// The columns of [`TableSql::current`] from column `k` on.
fn current_of_row_at(r: &tokio_postgres::Row, k: usize) -> Current {
    Current {
        rowid: r.get(k),
        payload: r.get(k + 1),
        created_at: r.get(k + 2),
        deleted: r.get(k + 3),
        tokens: r.get(k + 4),
        seq: r.get(k + 5),
    }
}

impl PostgresStore {
    /// How many nested statements ([`StoreReader::find_nested`]) a store keeps. There is one per
    /// selection shape (the root template; `at`, tokens and `limit`; the tree of
    /// relationships below), and clients choose their shapes. An application sends some
    /// tens of shapes per root entity (each with the one or two combinations of `at`,
    /// tokens and `limit` it uses), so 256 keeps its working set, while a client sending
    /// shape after shape costs at most 256 statement texts (a few KB each) per entity here,
    /// and 256 prepared statements per entity and connection on the server: an evicted
    /// statement is closed on every connection of the read pool.
    pub const NESTED_STATEMENTS: usize = 256;

    pub fn new(db: Arc<PostgresDatabase>, table: &str) -> Self {
        Self::with_reads(db, table, false)
    }

    /// The table as the database's replica serves it (`read_url`), for reads only; `None`
    /// without a replica.
    pub fn replica(db: Arc<PostgresDatabase>, table: &str) -> Option<Self> {
        db.has_replica().then(|| Self::with_reads(db, table, true))
    }

    fn with_reads(db: Arc<PostgresDatabase>, table: &str, on_replica: bool) -> Self {
        Self {
            db,
            on_replica,
            core: TableCore::new(&DIALECT, table),
            sql: TableSql::new(table),
            nested: NestedStatements::new(Self::NESTED_STATEMENTS),
        }
    }

    /// This store's database, as [`Relation::database`].
    fn database_id(&self) -> usize {
        Arc::as_ptr(&self.db) as usize
    }

    /// The nested statement of a shape. The statement cache of a connection (deadpool's
    /// `prepare_cached`) is unbounded, so a statement evicted here leaves the statement
    /// caches of the read pool's connections too, which closes it on the server; the other
    /// statements a connection caches are the table's and its templates', a fixed number.
    fn nested_compiled(
        &self,
        template: &QueryTemplate,
        shape: Shape,
        levels: &[Level<'_>],
    ) -> Arc<Slot<Compiled>> {
        let table = self.core.table();
        self.nested
            .get(&DIALECT, table, template, shape, levels, |evicted| {
                for manager in self.read_pool().managers() {
                    manager.statement_caches.remove(&evicted.sql, &[]);
                }
            })
    }

    /// The pool this store reads from: the replica's or the primary's.
    fn read_pool(&self) -> &crate::pools::Pools {
        if self.on_replica {
            &self.db.read
        } else {
            &self.db.write
        }
    }

    /// Nested statements cached ([`Self::NESTED_STATEMENTS`] at most), for tests.
    #[doc(hidden)]
    pub fn nested_statements_cached(&self) -> usize {
        self.nested.len()
    }

    /// Statements in the statement cache of a connection of the read pool, for tests (with
    /// a pool of one connection, of that connection).
    #[doc(hidden)]
    pub async fn statements_prepared_on_a_read_connection(&self) -> Result<usize, StoreError> {
        let client = self.read_pool().get().await.map_err(pool_error)?;
        Ok(client.statement_cache.size())
    }

    fn bind(
        compiled: &Compiled,
        args: &BoundArgs,
        at: Option<Millis>,
        tokens: &Option<Vec<String>>,
        limit: Option<usize>,
        keys: Option<&[String]>,
    ) -> Vec<SqlParam> {
        let binding = Binding {
            args,
            at,
            tokens: tokens.as_deref().map(ListArg::Items),
            keys: keys.map(ListArg::Items),
            limit,
        };
        meshql_store_sql::param::bind(sql::BIND, compiled, &binding, sql::to_driver)
    }

    async fn current<C: GenericClient>(
        &self,
        client: &C,
        id: &str,
    ) -> Result<Option<Current>, StoreError> {
        let stmt = prepared(client, &self.sql.current).await?;
        let row = client.query_opt(&stmt, &[&id]).await.map_err(pg_error)?;
        Ok(row.as_ref().map(current_of_row))
    }

    /// The id's lock, then its newest version, in one round trip: the two statements are
    /// pipelined, and PostgreSQL runs the read (with its own snapshot) once the lock is held.
    /// Not [`Self::current`] inside `pipelined`: both statements must be prepared
    /// before either is sent, so that each goes out on its first poll (see `pipeline.rs`).
    async fn locked_current<C: GenericClient>(
        &self,
        client: &C,
        id: &str,
    ) -> Result<Option<Current>, StoreError> {
        let lock = prepared(client, &self.sql.lock).await?;
        let current = prepared(client, &self.sql.current).await?;
        let key = self.lock_key(id);
        let (_, row) = pipelined(
            client.execute(&lock, &[&key]),
            client.query_opt(&current, &[&id]),
        )
        .await
        .map_err(pg_error)?;
        Ok(row.as_ref().map(current_of_row))
    }

    /// Appends a version after `current` (the id's newest version, read under its lock;
    /// `None` for a fresh id) inside the caller's transaction.
    async fn append<C: GenericClient>(
        &self,
        client: &C,
        v: Version<'_>,
        current: Option<&Current>,
    ) -> Result<Envelope, StoreError> {
        let cur_time = current.map(|c| c.created_at);
        let mut place = Placement::new(v.created_at, cur_time, now_millis());
        if place.check_collisions {
            let mut stamp = place.stamp;
            let exists = prepared(client, &self.sql.version_exists).await?;
            while client
                .query_opt(&exists, &[&v.id, &stamp])
                .await
                .map_err(pg_error)?
                .is_some()
            {
                stamp += 1;
            }
            place = place.settle(stamp, cur_time);
        }
        let (stamp, is_latest) = (place.stamp, place.latest);
        let insert = prepared(client, &self.sql.insert).await?;
        let seq = current.map(|c| c.seq);
        let tokens = v.tokens.to_vec();
        meshql_core::fault::check(&v.payload)?;
        let params: [&(dyn ToSql + Sync); 8] = [
            &v.id,
            &v.payload,
            &stamp,
            &v.deleted,
            &tokens,
            &is_latest,
            &seq,
            &v.correlation_id,
        ];
        let row = match (is_latest, current) {
            (true, Some(cur)) => {
                // the older version's flag is cleared and the new one inserted in one round
                // trip: pipelined, run in this order
                let clear = prepared(client, &self.sql.clear_latest).await?;
                let older: [&(dyn ToSql + Sync); 1] = [&cur.rowid];
                let (_, row) = pipelined(
                    client.execute(&clear, &older),
                    client.query_one(&insert, &params),
                )
                .await
                .map_err(pg_error)?;
                row
            }
            _ => client.query_one(&insert, &params).await.map_err(pg_error)?,
        };
        Ok(Envelope {
            id: v.id.to_owned(),
            payload: row.get(0),
            created_at: stamp,
            deleted: v.deleted,
            authorized_tokens: tokens,
        })
    }

    /// The key of an id's advisory lock (hashed by the lock statement).
    fn lock_key(&self, id: &str) -> String {
        format!("{}/{}", self.core.table(), id)
    }

    /// Takes the locks of several ids, in one order whatever the caller's (so that two
    /// batches cannot deadlock), before the transaction writes anything: it gets its id only
    /// then, which keeps the feed in commit order per document.
    async fn lock_all<C: GenericClient>(&self, client: &C, ids: &[&str]) -> Result<(), StoreError> {
        let mut ids = ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        let lock = prepared(client, &self.sql.lock).await?;
        let keys: Vec<String> = ids.into_iter().map(|id| self.lock_key(id)).collect();
        // pipelined: sent, and taken, in this order
        let params: Vec<[&(dyn ToSql + Sync); 1]> = keys.iter().map(|key| [key as _]).collect();
        pipelined_all(params.iter().map(|p| client.execute(&lock, p)))
            .await
            .map_err(pg_error)?;
        Ok(())
    }

    async fn remove_in<C: GenericClient>(
        &self,
        client: &C,
        id: &str,
        ctx: &WriteContext,
    ) -> Result<RemoveOutcome, StoreError> {
        match RemoveStep::of(self.locked_current(client, id).await?, &ctx.filter) {
            RemoveStep::Done(outcome) => Ok(outcome),
            RemoveStep::Tombstone(cur) => {
                self.tombstone(client, id, cur, ctx.correlation_id.as_deref())
                    .await?;
                Ok(RemoveOutcome::Removed)
            }
        }
    }

    /// Appends the tombstone of `id` after `cur`, its current (not deleted) version, read
    /// under its lock.
    async fn tombstone<C: GenericClient>(
        &self,
        client: &C,
        id: &str,
        mut cur: Current,
        correlation_id: Option<&str>,
    ) -> Result<Envelope, StoreError> {
        // the tombstone keeps the last payload (`append` reads no payload of `cur`)
        let payload = std::mem::take(&mut cur.payload);
        let tombstone = Version::tombstone(id, payload, &cur.tokens, correlation_id);
        self.append(client, tombstone, Some(&cur)).await
    }

    async fn query_envelopes(
        &self,
        sql_text: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Envelope>, StoreError> {
        self.core.count_read();
        let client = self.read_pool().get().await.map_err(pool_error)?;
        let stmt = prepared(&client, sql_text).await?;
        let rows = client.query(&stmt, params).await.map_err(pg_error)?;
        Ok(rows.iter().map(envelope).collect())
    }
}

#[async_trait]
impl StoreReader for PostgresStore {
    async fn read(&self, id: &str, ctx: &ReadContext<'_>) -> Result<Option<Envelope>, StoreError> {
        let (filter, at) = (ctx.filter, ctx.at);
        let rows = match at {
            None => self.query_envelopes(&self.sql.read_latest, &[&id]).await?,
            Some(at) => self.query_envelopes(&self.sql.read_at, &[&id, &at]).await?,
        };
        Ok(rows.into_iter().next().filter(|e| visible(filter, e)))
    }

    async fn read_many(
        &self,
        ids: &[String],
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Envelope>, StoreError> {
        let (filter, at) = (ctx.filter, ctx.at);
        let found = match at {
            None => {
                self.query_envelopes(&self.sql.read_many_latest, &[&ids])
                    .await?
            }
            Some(at) => {
                self.query_envelopes(&self.sql.read_many_at, &[&ids, &at])
                    .await?
            }
        };
        Ok(in_request_order(ids, found, filter))
    }

    async fn list(&self, ctx: &ReadContext<'_>) -> Result<Vec<Envelope>, StoreError> {
        let (filter, at) = (ctx.filter, ctx.at);
        let tokens = filter_tokens(filter);
        let text = &self.sql.list[list_index(at.is_some(), tokens.is_some())];
        match (at, tokens) {
            (None, None) => self.query_envelopes(text, &[]).await,
            (Some(at), None) => self.query_envelopes(text, &[&at]).await,
            (None, Some(t)) => self.query_envelopes(text, &[&t]).await,
            (Some(at), Some(t)) => self.query_envelopes(text, &[&at, &t]).await,
        }
    }

    async fn list_page(
        &self,
        after: Option<&str>,
        limit: usize,
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Envelope>, StoreError> {
        let tokens = filter_tokens(ctx.filter);
        let mut pager = Pager::new(after, limit, ctx.at, ctx.filter);
        while let Some((after, want)) = pager.next_page() {
            let page =
                &self.sql.page[page_index(ctx.at.is_some(), tokens.is_some(), after.is_some())];
            let limit = i64::try_from(want).unwrap_or(i64::MAX);
            let params: Vec<&(dyn ToSql + Sync)> = page
                .order
                .iter()
                .filter_map(|p| -> Option<&(dyn ToSql + Sync)> {
                    match p {
                        PageParam::At => ctx.at.as_ref().map(|a| a as _),
                        PageParam::After => after.as_ref().map(|a| a as _),
                        PageParam::Tokens => tokens.as_ref().map(|t| t as _),
                        PageParam::Limit => Some(&limit),
                    }
                })
                .collect();
            let rows = self.query_envelopes(&page.sql, &params).await?;
            let since = pager.written_since(&rows);
            let older = match (since.is_empty(), ctx.at) {
                (false, Some(at)) => {
                    self.query_envelopes(&self.sql.read_many_at, &[&since, &at])
                        .await?
                }
                _ => Vec::new(),
            };
            pager.add(want, rows, older);
        }
        Ok(pager.finish())
    }

    async fn versions(&self, id: &str) -> Result<Vec<Envelope>, StoreError> {
        self.query_envelopes(&self.sql.versions, &[&id]).await
    }

    async fn find(
        &self,
        search: &Search<'_>,
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Row>, StoreError> {
        let (args, limit, at) = (search.args, search.limit, ctx.at);
        let tokens = filter_tokens(ctx.filter);
        let compiled = self.core.search_statement(search, at, tokens.is_some())?;
        let params = Self::bind(&compiled, args, at, &tokens, limit, None);
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p.as_ref() as _).collect();
        self.core.count_read();
        let client = self.read_pool().get().await.map_err(pool_error)?;
        let stmt = prepared(&client, &compiled.sql).await?;
        let rows = client.query(&stmt, &refs).await.map_err(pg_error)?;
        Ok(rows
            .iter()
            .map(|r| Row {
                id: r.get(0),
                payload: r.get(1),
            })
            .collect())
    }

    async fn find_batch(
        &self,
        batch: &BatchSearch<'_>,
        ctx: &ReadContext<'_>,
    ) -> Result<KeyedRows, StoreError> {
        let (keys, at) = (batch.keys, ctx.at);
        let tokens = filter_tokens(ctx.filter);
        let Some(compiled) = self.core.batch_statement(batch, at, tokens.is_some())? else {
            return Ok(Vec::new());
        };
        let params = Self::bind(&compiled, &BoundArgs::new(), at, &tokens, None, Some(keys));
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p.as_ref() as _).collect();
        self.core.count_read();
        let client = self.read_pool().get().await.map_err(pool_error)?;
        let stmt = prepared(&client, &compiled.sql).await?;
        let rows = client.query(&stmt, &refs).await.map_err(pg_error)?;
        Ok(rows
            .iter()
            .map(|r| {
                (
                    r.get(0),
                    Row {
                        id: r.get(1),
                        payload: r.get(2),
                    },
                )
            })
            .collect())
    }

    async fn find_nested(
        &self,
        search: &Search<'_>,
        nested: &[Nested],
        ctx: &ReadContext<'_>,
    ) -> Result<Option<Vec<NestedRow>>, StoreError> {
        let Search {
            template,
            args,
            limit,
            fields,
        } = *search;
        let (enabled, database) = (self.db.nested_sql, self.database_id());
        let tokens = filter_tokens(ctx.filter);
        let at = ctx.at;
        let Some(NestedPlan { levels, shape }) = nested_plan(
            &DIALECT,
            enabled,
            search,
            nested,
            database,
            at,
            tokens.is_some(),
        ) else {
            return Ok(None);
        };
        let compiled = self.nested_compiled(template, shape, &levels);
        let params = Self::bind(&compiled, args, at, &tokens, limit, None);
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p.as_ref() as _).collect();
        self.core.count_read();
        let client = self.read_pool().get().await.map_err(pool_error)?;
        let stmt = prepared(&client, &compiled.sql).await?;
        if compiled.evicted() {
            // evicted while this request prepared it: the removal from the statement caches
            // may have come before the statement entered this connection's
            drop(client.statement_cache.remove(&compiled.sql, &[]));
        }
        let rows = client.query(&stmt, &refs).await.map_err(pg_error)?;
        let rows = rows.iter().map(|row| {
            let payload: &str = row.get(3);
            let relationship = row.get::<_, i32>(0) as usize;
            (relationship, row.get(1), row.get(2), payload, row.get(4))
        });
        meshql_core::nested::assemble_text(nested, fields, rows).map(Some)
    }

    fn relation(&self) -> Option<Relation> {
        self.core.relation(self.db.nested_sql, self.database_id())
    }
}

#[async_trait]
impl StoreWriter for PostgresStore {
    async fn import_versions(&self, versions: &[Envelope]) -> Result<u64, StoreError> {
        let mut client = self.db.write.get().await.map_err(pool_error)?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let ids: Vec<&str> = versions.iter().map(|v| v.id.as_str()).collect();
        self.lock_all(&tx, &ids).await?;
        let exists = prepared(&tx, &self.sql.version_exists).await?;
        let mut written = 0u64;
        for v in versions {
            if tx
                .query_opt(&exists, &[&v.id, &v.created_at])
                .await
                .map_err(pg_error)?
                .is_some()
            {
                continue;
            }
            let payload = meshql_store_sql::outputs::with_id(&v.id, &v.payload)?;
            let current = self.current(&tx, &v.id).await?;
            self.append(
                &tx,
                Version {
                    id: &v.id,
                    payload,
                    created_at: Some(v.created_at),
                    deleted: v.deleted,
                    tokens: &v.authorized_tokens,
                    fresh_id: false,
                    correlation_id: None,
                },
                current.as_ref(),
            )
            .await?;
            written += 1;
        }
        tx.commit().await.map_err(pg_error)?;
        if written > 0 {
            self.core.count_writes(written);
            self.core.committed();
            self.core.signal.notify();
        }
        Ok(written)
    }

    async fn create(
        &self,
        mut doc: NewDocument,
        ctx: &WriteContext,
    ) -> Result<Envelope, StoreError> {
        let fresh_id = doc.id.is_none();
        let id = doc.resolve_id();
        let created_at = doc.created_at;
        let payload = doc.into_payload_text(&id);
        let version = Version {
            id: &id,
            payload,
            created_at,
            deleted: false,
            tokens: ctx.create_tokens(),
            fresh_id,
            correlation_id: ctx.correlation_id.as_deref(),
        };
        let mut client = self.db.write.get().await.map_err(pool_error)?;
        let env = if fresh_id {
            // a fresh id has no other version to read, lock or clear: the INSERT alone is
            // the write, one statement in its own transaction (no BEGIN and COMMIT round trips)
            self.append(&client, version, None).await?
        } else {
            let tx = client.transaction().await.map_err(pg_error)?;
            let current = self.locked_current(&tx, &id).await?;
            let env = self.append(&tx, version, current.as_ref()).await?;
            tx.commit().await.map_err(pg_error)?;
            env
        };
        self.core.wrote(1);
        self.core.committed();
        Ok(env)
    }

    async fn create_many(
        &self,
        docs: Vec<NewDocument>,
        ctx: &WriteContext,
    ) -> Result<Vec<Envelope>, StoreError> {
        let mut client = self.db.write.get().await.map_err(pool_error)?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let given: Vec<&str> = docs.iter().filter_map(|d| d.id.as_deref()).collect();
        self.lock_all(&tx, &given).await?;
        let mut out = Vec::with_capacity(docs.len());
        for mut doc in docs {
            let fresh_id = doc.id.is_none();
            let id = doc.resolve_id();
            let created_at = doc.created_at;
            let payload = doc.into_payload_text(&id);
            let current = match fresh_id {
                true => None,
                false => self.current(&tx, &id).await?,
            };
            out.push(
                self.append(
                    &tx,
                    Version {
                        id: &id,
                        payload,
                        created_at,
                        deleted: false,
                        tokens: ctx.create_tokens(),
                        fresh_id,
                        correlation_id: ctx.correlation_id.as_deref(),
                    },
                    current.as_ref(),
                )
                .await?,
            );
        }
        tx.commit().await.map_err(pg_error)?;
        self.core.count_writes(out.len() as u64);
        self.core.committed();
        self.core.signal.notify();
        Ok(out)
    }

    async fn update(
        &self,
        id: &str,
        doc: NewDocument,
        ctx: &WriteContext,
    ) -> Result<Option<Envelope>, StoreError> {
        let created_at = doc.created_at;
        let payload = doc.into_payload_text(id);
        let mut client = self.db.write.get().await.map_err(pool_error)?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let env = match self.locked_current(&tx, id).await? {
            Some(cur) if updatable(&cur, &ctx.filter) => {
                let tokens = ctx.tokens.as_deref().unwrap_or(&cur.tokens);
                Some(
                    self.append(
                        &tx,
                        Version {
                            id,
                            payload,
                            created_at,
                            deleted: false,
                            tokens,
                            fresh_id: false,
                            correlation_id: ctx.correlation_id.as_deref(),
                        },
                        Some(&cur),
                    )
                    .await?,
                )
            }
            _ => None,
        };
        tx.commit().await.map_err(pg_error)?;
        if env.is_some() {
            self.core.wrote(1);
            self.core.committed();
        }
        Ok(env)
    }

    async fn remove(&self, id: &str, ctx: &WriteContext) -> Result<RemoveOutcome, StoreError> {
        let mut client = self.db.write.get().await.map_err(pool_error)?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let outcome = self.remove_in(&tx, id, ctx).await?;
        tx.commit().await.map_err(pg_error)?;
        if outcome == RemoveOutcome::Removed {
            self.core.wrote(1);
            self.core.committed();
        }
        Ok(outcome)
    }

    async fn remove_many(
        &self,
        ids: &[String],
        ctx: &WriteContext,
    ) -> Result<Vec<(String, RemoveOutcome)>, StoreError> {
        let mut client = self.db.write.get().await.map_err(pool_error)?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let all: Vec<&str> = ids.iter().map(String::as_str).collect();
        self.lock_all(&tx, &all).await?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            out.push((id.clone(), self.remove_in(&tx, id, ctx).await?));
        }
        tx.commit().await.map_err(pg_error)?;
        let removed = out
            .iter()
            .filter(|(_, o)| *o == RemoveOutcome::Removed)
            .count() as u64;
        self.core.wrote(removed);
        self.core.committed();
        Ok(out)
    }
}

#[async_trait]
impl ChangeFeed for PostgresStore {
    async fn changes(&self, after: Cursor, limit: usize) -> Result<Vec<StoreChange>, StoreError> {
        // read on the primary: the horizon must be the writers' own
        let client = self.db.write.get().await.map_err(pool_error)?;
        let stmt = prepared(&client, &self.sql.changes).await?;
        let tx_after = after.0.to_string();
        let row_after = i64::try_from(after.1).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        // feed reads are not counted as reads: those count what requests cost
        let rows = client
            .query(&stmt, &[&tx_after, &row_after, &limit])
            .await
            .map_err(pg_error)?;
        Ok(rows
            .iter()
            .map(|r| {
                let env = envelope(r);
                let (tx, rowid): (i64, i64) = (r.get(5), r.get(6));
                StoreChange::of_version(Cursor(tx as u64, rowid as u64), env, r.get(7), r.get(8))
            })
            .collect())
    }

    fn commit_signal(&self) -> Option<meshql_core::CommitReceiver> {
        Some(self.core.signal.subscribe())
    }
}

#[async_trait]
impl Store for PostgresStore {
    async fn prepare(&self, templates: &[QueryTemplate]) -> Result<(), StoreError> {
        self.core.remember(templates);
        let table = self.core.table();
        let mut ddl = vec![sql::create_table(table), outputs::DDL.to_owned()];
        ddl.extend(TableCore::index_ddl(&DIALECT, table, templates));
        let ddl = ddl.join(";\n");
        let mut client = self.db.write.get().await.map_err(pool_error)?;
        let tx = client.transaction().await.map_err(pg_error)?;
        // concurrent start-ups of several services must not race on CREATE
        tx.execute("SELECT pg_advisory_xact_lock(7164746865)", &[])
            .await
            .map_err(pg_error)?;
        tx.batch_execute(&ddl).await.map_err(pg_error)?;
        tx.commit().await.map_err(pg_error)?;
        // prepare every template statement now, so a bad SQL fragment fails at start-up
        for c in self.core.startup_statements(templates) {
            client
                .prepare_cached(&c.sql)
                .await
                .map_err(|e| TableCore::invalid_statement(pg_error(e), &c.sql))?;
        }
        Ok(())
    }

    async fn ready(&self) -> Result<(), StoreError> {
        self.db.ping().await
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            reads: self.core.reads.load(Ordering::Relaxed),
            commits: self.core.commits.load(Ordering::Relaxed),
            writes: self.core.writes.load(Ordering::Relaxed),
            read_connections: None,
            connections_in_use: Some(self.db.connections_in_use()),
            log: None,
        }
    }

    async fn shutdown(&self) {
        self.db.close();
    }
}
