//! [`MysqlStore`]: one entity table.

use crate::db::{my_error, MysqlDatabase};
use crate::dialect::DIALECT;
use crate::sql::{self, quote_ident, Compiled, Shape};
use async_trait::async_trait;
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
    sort_by_template, tokens_json, updatable, visible, Current, RemoveStep, Version,
};
use meshql_store_sql::table::{list_index, page_index, PageParam, Pager};
use mysql_async::prelude::Queryable;
use mysql_async::{Params, TxOpts, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;

#[cfg(test)]
mod golden;
mod outputs;

use meshql_core::lru::Slot;
use meshql_store_sql::table_core::{NestedStatements, TableCore};

pub struct MysqlStore {
    db: Arc<MysqlDatabase>,
    /// The table's compiled searches, templates and counters.
    core: TableCore,
    sql: TableSql,
    /// Nested statements: at most [`Self::NESTED_STATEMENTS`], the least recently used
    /// evicted first.
    nested: NestedStatements,
}

/// A write transaction and the rows it inserted, which get their feed positions just before
/// it commits.
struct WriteTx<'a> {
    tx: mysql_async::Transaction<'a>,
    inserted: Vec<u64>,
}

/// A subquery that fails (error 1242, more than one row) where it is evaluated: the stamp
/// of [`TableSql::stamp_one_and_commit`] evaluates it when the clock's row was not there to
/// update, so the text stops before its `COMMIT`.
const NO_CLOCK: &str = "(SELECT 1 UNION ALL SELECT 1)";

/// MySQL's code for a subquery that returned more than one row ([`NO_CLOCK`]).
const SUBQUERY_ROWS: u16 = 1242;

/// The table's statements: those every SQL store shares ([`meshql_store_sql::table`]), and
/// MySQL's batch reads and change feed (its clock and positions).
struct TableSql {
    common: meshql_store_sql::table::TableSql,
    /// [`Self::current`] of several ids (a JSON array, sorted: the rows are locked in its
    /// order), the id first.
    current_many: String,
    tick: String,
    stamp_one: String,
    /// A text query that takes one position, stamps it on the row whose `_id` ends the text,
    /// and commits: see [`MysqlStore::stamp_positions`]. `None` for a table name that is not
    /// plain (letters, digits, `_`), which then goes the prepared way.
    stamp_one_and_commit: Option<String>,
    stamp_many: String,
    changes: String,
}

impl std::ops::Deref for TableSql {
    type Target = meshql_store_sql::table::TableSql;

    fn deref(&self) -> &Self::Target {
        &self.common
    }
}

const COLUMNS: &str = "t.id, t.payload, t.created_at, t.deleted, t.authorized_tokens";

impl TableSql {
    fn new(table: &str) -> Self {
        let t = quote_ident(table);
        Self {
            common: meshql_store_sql::table::TableSql::new(&DIALECT, table),
            // the ids drive the join (STRAIGHT_JOIN), each looked up by the same index as
            // `current`, so only their rows are locked, in the array's order; the ids' column
            // is utf8mb4 like the table's (a JSON_TABLE column otherwise takes the database's
            // default character set, latin1 on a default MariaDB)
            current_many: format!(
                "SELECT STRAIGHT_JOIN t.id, t._id, t.payload, t.created_at, t.deleted, \
                 t.authorized_tokens, COALESCE(t.seq, t._id) \
                 FROM JSON_TABLE(?, '$[*]' COLUMNS (kv VARCHAR(255) CHARACTER SET utf8mb4 \
                 COLLATE utf8mb4_bin PATH '$')) k \
                 JOIN {t} t FORCE INDEX (k_latest_id) ON t.latest = 1 AND t.id = k.kv FOR UPDATE"
            ),
            tick: "UPDATE meshql_feed_clock SET pos = LAST_INSERT_ID(pos + ?) WHERE name = ?"
                .to_owned(),
            stamp_one: format!("UPDATE {t} SET pos = ? WHERE _id = ?"),
            stamp_one_and_commit: table
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
                .then(|| {
                    format!(
                        "UPDATE meshql_feed_clock SET pos = LAST_INSERT_ID(pos + 1) \
                         WHERE name = '{table}'; UPDATE {t} SET pos = IF(ROW_COUNT() = 1, \
                         LAST_INSERT_ID(), {NO_CLOCK}) WHERE _id = "
                    )
                }),
            stamp_many: format!(
                "UPDATE {t} t JOIN JSON_TABLE(?, '$[*]' COLUMNS (rid BIGINT PATH '$[0]', \
                 p BIGINT PATH '$[1]')) k ON t._id = k.rid SET t.pos = k.p"
            ),
            changes: format!(
                "SELECT {COLUMNS}, t.pos, t.seq IS NULL, t.correlation_id FROM {t} t \
                 WHERE t.pos > ? ORDER BY t.pos LIMIT ?"
            ),
        }
    }
}

fn envelope(row: mysql_async::Row) -> Result<Envelope, StoreError> {
    let tokens: String = row.get(4).unwrap_or_default();
    Ok(Envelope {
        id: row.get(0).unwrap_or_default(),
        payload: row.get(1).unwrap_or_default(),
        created_at: row.get(2).unwrap_or_default(),
        deleted: row.get::<i64, _>(3).unwrap_or_default() != 0,
        authorized_tokens: serde_json::from_str(&tokens)
            .map_err(|e| StoreError::Corrupt(format!("authorized_tokens: {e}")))?,
    })
}

/// The columns of [`TableSql::current`] from column `k` on.
fn current_of_row_at(r: &mysql_async::Row, k: usize) -> Result<Current, StoreError> {
    let tokens: String = r.get(k + 4).unwrap_or_default();
    Ok(Current {
        rowid: r.get(k).unwrap_or_default(),
        payload: r.get(k + 1).unwrap_or_default(),
        created_at: r.get(k + 2).unwrap_or_default(),
        deleted: r.get::<i64, _>(k + 3).unwrap_or_default() != 0,
        tokens: serde_json::from_str(&tokens)
            .map_err(|e| StoreError::Corrupt(format!("authorized_tokens: {e}")))?,
        seq: r.get(k + 5).unwrap_or_default(),
    })
}

fn text(v: Option<String>) -> Value {
    v.map(Value::from).unwrap_or(Value::NULL)
}

impl MysqlStore {
    /// How many nested statements ([`StoreReader::find_nested`]) a store keeps. There is one per
    /// selection shape (the root template; `at`, tokens and `limit`; the tree of
    /// relationships below), and clients choose their shapes. An application sends some
    /// tens of shapes per root entity (each with the one or two combinations of `at`,
    /// tokens and `limit` it uses), so 256 keeps its working set, while a client sending
    /// shape after shape costs at most 256 statement texts (a few KB each) per entity.
    /// The statements prepared on the server are bounded apart from this: mysql_async keeps
    /// at most `stmt_cache_size` ([`Self::STATEMENTS_PER_CONNECTION`]) per connection, the
    /// least recently used closed first, over all the statements of all tables.
    pub const NESTED_STATEMENTS: usize = 256;

    /// mysql_async's statement cache per connection, for tests.
    #[doc(hidden)]
    pub const STATEMENTS_PER_CONNECTION: usize = crate::db::STATEMENTS_PER_CONNECTION;

    pub fn new(db: Arc<MysqlDatabase>, table: &str) -> Self {
        Self {
            db,
            core: TableCore::new(&DIALECT, table),
            sql: TableSql::new(table),
            nested: NestedStatements::new(Self::NESTED_STATEMENTS),
        }
    }

    /// This store's database, as [`Relation::database`].
    fn database_id(&self) -> usize {
        Arc::as_ptr(&self.db) as usize
    }

    fn nested_compiled(
        &self,
        template: &QueryTemplate,
        shape: Shape,
        levels: &[Level<'_>],
    ) -> Arc<Slot<Compiled>> {
        self.nested.get(
            &DIALECT,
            self.core.table(),
            template,
            shape,
            levels,
            // mysql_async's statement cache closes what it evicts on its own
            |_| {},
        )
    }

    /// Nested statements cached ([`Self::NESTED_STATEMENTS`] at most), for tests.
    #[doc(hidden)]
    pub fn nested_statements_cached(&self) -> usize {
        self.nested.len()
    }

    /// Statements prepared and not closed on a connection of the pool, by the server's
    /// session counters, for tests (with a pool of one connection, on that connection).
    #[doc(hidden)]
    pub async fn statements_open_on_a_connection(&self) -> Result<u64, StoreError> {
        let mut conn = self.db.conn().await?;
        let counts: Vec<(String, u64)> = conn
            .query(
                "SHOW SESSION STATUS WHERE Variable_name IN ('Com_stmt_prepare', 'Com_stmt_close')",
            )
            .await
            .map_err(my_error)?;
        let count = |name: &str| {
            counts
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map_or(0, |(_, c)| *c)
        };
        Ok(count("Com_stmt_prepare").saturating_sub(count("Com_stmt_close")))
    }

    fn bind(
        compiled: &Compiled,
        args: &BoundArgs,
        at: Option<Millis>,
        tokens: &Option<String>,
        keys: Option<&str>,
        limit: Option<usize>,
    ) -> Params {
        let binding = Binding {
            args,
            at,
            tokens: tokens.as_deref().map(ListArg::Json),
            keys: keys.map(ListArg::Json),
            limit,
        };
        Params::Positional(meshql_store_sql::param::bind(
            sql::BIND,
            compiled,
            &binding,
            sql::to_driver,
        ))
    }

    async fn current<Q: Queryable>(
        &self,
        q: &mut Q,
        id: &str,
    ) -> Result<Option<Current>, StoreError> {
        let row: Option<mysql_async::Row> = q
            .exec_first(&self.sql.current, (id,))
            .await
            .map_err(my_error)?;
        row.map(|r| current_of_row_at(&r, 0)).transpose()
    }

    async fn append(&self, w: &mut WriteTx<'_>, v: Version<'_>) -> Result<Envelope, StoreError> {
        let current = if v.fresh_id {
            None
        } else {
            self.current(&mut w.tx, v.id).await?
        };
        self.append_after(w, v, current).await
    }

    /// Appends a version after `current`, the id's newest version read (and locked) in this
    /// transaction; `None` when it has none.
    async fn append_after(
        &self,
        w: &mut WriteTx<'_>,
        v: Version<'_>,
        current: Option<Current>,
    ) -> Result<Envelope, StoreError> {
        let q = &mut w.tx;
        let cur_time = current.as_ref().map(|c| c.created_at);
        let mut place = Placement::new(v.created_at, cur_time, now_millis());
        if place.check_collisions {
            let mut stamp = place.stamp;
            loop {
                let exists: Option<i64> = q
                    .exec_first(&self.sql.version_exists, (v.id, stamp))
                    .await
                    .map_err(my_error)?;
                if exists.is_none() {
                    break;
                }
                stamp += 1;
            }
            place = place.settle(stamp, cur_time);
        }
        let (stamp, is_latest) = (place.stamp, place.latest);
        if let (true, Some(cur)) = (is_latest, &current) {
            q.exec_drop(&self.sql.clear_latest, (cur.rowid,))
                .await
                .map_err(my_error)?;
        }
        let tokens_text = serde_json::to_string(v.tokens).expect("strings serialise");
        meshql_core::fault::check(&v.payload)?;
        q.exec_drop(
            &self.sql.insert,
            Params::Positional(vec![
                Value::from(v.id),
                Value::from(v.payload.clone()),
                Value::from(stamp),
                Value::from(v.deleted as i64),
                Value::from(tokens_text),
                Value::from(is_latest as i64),
                current
                    .as_ref()
                    .map(|c| Value::from(c.seq))
                    .unwrap_or(Value::NULL),
                text(v.correlation_id.map(str::to_owned)),
            ]),
        )
        .await
        .map_err(my_error)?;
        let rowid = q.last_insert_id().ok_or_else(|| {
            StoreError::Query("MySQL did not report the id of an inserted version".into())
        })?;
        w.inserted.push(rowid);
        Ok(Envelope {
            id: v.id.to_owned(),
            payload: v.payload,
            created_at: stamp,
            deleted: v.deleted,
            authorized_tokens: v.tokens.to_vec(),
        })
    }

    async fn remove_in(
        &self,
        w: &mut WriteTx<'_>,
        id: &str,
        ctx: &WriteContext,
    ) -> Result<RemoveOutcome, StoreError> {
        match RemoveStep::of(self.current(&mut w.tx, id).await?, &ctx.filter) {
            RemoveStep::Done(outcome) => Ok(outcome),
            RemoveStep::Tombstone(cur) => {
                self.tombstone(w, id, cur, ctx.correlation_id.as_deref())
                    .await?;
                Ok(RemoveOutcome::Removed)
            }
        }
    }

    /// Appends the tombstone of `id` after `cur`, its current (not deleted) version, read
    /// and locked in this transaction: the last payload, the same tokens.
    async fn tombstone(
        &self,
        w: &mut WriteTx<'_>,
        id: &str,
        mut cur: Current,
        correlation_id: Option<&str>,
    ) -> Result<Envelope, StoreError> {
        let payload = std::mem::take(&mut cur.payload);
        let tokens = std::mem::take(&mut cur.tokens);
        let tombstone = Version::tombstone(id, payload, &tokens, correlation_id);
        self.append_after(w, tombstone, Some(cur)).await
    }

    async fn envelopes(&self, text: &str, params: Params) -> Result<Vec<Envelope>, StoreError> {
        self.core.count_read();
        let mut conn = self.db.conn().await?;
        let rows: Vec<mysql_async::Row> = conn.exec(text, params).await.map_err(my_error)?;
        rows.into_iter().map(envelope).collect()
    }

    /// Runs `writes` in one transaction. Documents with a caller-chosen id are serialised by
    /// the row lock `current` takes (`FOR UPDATE`); the unique `(id, created_at)` key stops
    /// the one race left (two first versions of a new caller-chosen id) with an error.
    async fn write_tx<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        F: for<'c> FnOnce(
            &'c Self,
            &'c mut WriteTx<'_>,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<T, StoreError>> + Send + 'c>,
        >,
    {
        let mut conn = self.db.conn().await?;
        let tx = conn
            .start_transaction(TxOpts::default())
            .await
            .map_err(my_error)?;
        let mut w = WriteTx {
            tx,
            inserted: Vec::new(),
        };
        let result = match f(self, &mut w).await {
            Ok(v) => self.stamp_positions(&mut w).await.map(|()| v),
            Err(e) => Err(e),
        };
        match result {
            Ok(v) => {
                let wrote = !w.inserted.is_empty();
                w.tx.commit().await.map_err(my_error)?;
                self.core.committed();
                if wrote {
                    self.core.signal.notify();
                }
                Ok(v)
            }
            Err(e) => {
                let _ = w.tx.rollback().await;
                Err(e)
            }
        }
    }

    fn missing_clock(&self) -> StoreError {
        StoreError::Query(format!(
            "the feed clock of `{}` is missing (meshql_feed_clock)",
            self.core.table()
        ))
    }

    /// Gives the rows a transaction inserted their feed positions, as its last statements.
    ///
    /// The positions come from the table's row in `meshql_feed_clock`, whose lock the
    /// transaction holds from here to its commit: transactions take positions one after the
    /// other, in the order they commit, so a reader of `pos > P` can never see a position
    /// before an earlier one has committed (no gap fills in later, nothing is skipped). The
    /// clock is always the last lock a write takes, so it cannot close a deadlock cycle; what
    /// it costs is that commits of one table are serialised from this point on.
    async fn stamp_positions(&self, w: &mut WriteTx<'_>) -> Result<(), StoreError> {
        let n = w.inserted.len() as u64;
        if n == 0 {
            return Ok(());
        }
        if let ([rowid], Some(text)) = (&w.inserted[..], &self.sql.stamp_one_and_commit) {
            // one round trip while the clock is held, not three (take, stamp, commit): the
            // values in the text are integers and the table's plain name, and a missing
            // clock stops it before `COMMIT` (the caller's `commit` is then a no-op)
            return match w.tx.query_drop(format!("{text}{rowid}; COMMIT")).await {
                Err(mysql_async::Error::Server(e)) if e.code == SUBQUERY_ROWS => {
                    Err(self.missing_clock())
                }
                other => other.map_err(my_error),
            };
        }
        w.tx.exec_drop(&self.sql.tick, (n, self.core.table()))
            .await
            .map_err(my_error)?;
        let top =
            w.tx.last_insert_id()
                .filter(|_| w.tx.affected_rows() == 1)
                .ok_or_else(|| self.missing_clock())?;
        let first = top + 1 - n;
        if let [rowid] = w.inserted[..] {
            w.tx.exec_drop(&self.sql.stamp_one, (first, rowid))
                .await
                .map_err(my_error)?;
        } else {
            let pairs: Vec<[u64; 2]> = w
                .inserted
                .iter()
                .enumerate()
                .map(|(k, rowid)| [*rowid, first + k as u64])
                .collect();
            let json = serde_json::to_string(&pairs).expect("numbers serialise");
            w.tx.exec_drop(&self.sql.stamp_many, (json,))
                .await
                .map_err(my_error)?;
        }
        Ok(())
    }
}

#[async_trait]
impl StoreReader for MysqlStore {
    async fn read(&self, id: &str, ctx: &ReadContext<'_>) -> Result<Option<Envelope>, StoreError> {
        let (filter, at) = (ctx.filter, ctx.at);
        let rows = match at {
            None => {
                self.envelopes(&self.sql.read_latest, Params::Positional(vec![id.into()]))
                    .await?
            }
            Some(at) => {
                self.envelopes(
                    &self.sql.read_at,
                    Params::Positional(vec![id.into(), at.into()]),
                )
                .await?
            }
        };
        Ok(rows.into_iter().next().filter(|e| visible(filter, e)))
    }

    async fn read_many(
        &self,
        ids: &[String],
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Envelope>, StoreError> {
        let (filter, at) = (ctx.filter, ctx.at);
        let keys = Value::from(
            serde_json::to_string(ids).map_err(|e| StoreError::Invalid(e.to_string()))?,
        );
        let found = match at {
            None => {
                self.envelopes(&self.sql.read_many_latest, Params::Positional(vec![keys]))
                    .await?
            }
            Some(at) => {
                self.envelopes(
                    &self.sql.read_many_at,
                    Params::Positional(vec![keys, at.into()]),
                )
                .await?
            }
        };
        Ok(in_request_order(ids, found, filter))
    }

    async fn list(&self, ctx: &ReadContext<'_>) -> Result<Vec<Envelope>, StoreError> {
        let (filter, at) = (ctx.filter, ctx.at);
        let tokens = tokens_json(filter);
        let i = list_index(at.is_some(), tokens.is_some());
        let mut params: Vec<Value> = Vec::with_capacity(2);
        params.extend(at.map(Value::from));
        params.extend(tokens.map(Value::from));
        let params = if params.is_empty() {
            Params::Empty
        } else {
            Params::Positional(params)
        };
        self.envelopes(&self.sql.list[i], params).await
    }

    async fn list_page(
        &self,
        after: Option<&str>,
        limit: usize,
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Envelope>, StoreError> {
        let tokens = tokens_json(ctx.filter);
        let mut pager = Pager::new(after, limit, ctx.at, ctx.filter);
        while let Some((after, want)) = pager.next_page() {
            let page =
                &self.sql.page[page_index(ctx.at.is_some(), tokens.is_some(), after.is_some())];
            let params: Vec<Value> = page
                .order
                .iter()
                .filter_map(|p| match p {
                    PageParam::At => ctx.at.map(Value::from),
                    PageParam::After => after.map(Value::from),
                    PageParam::Tokens => tokens.clone().map(Value::from),
                    PageParam::Limit => Some(Value::from(u64::try_from(want).unwrap_or(u64::MAX))),
                })
                .collect();
            let rows = self
                .envelopes(&page.sql, Params::Positional(params))
                .await?;
            let since = pager.written_since(&rows);
            let older = match (since.is_empty(), ctx.at) {
                (false, Some(at)) => {
                    let keys = serde_json::to_string(&since)
                        .map_err(|e| StoreError::Invalid(e.to_string()))?;
                    self.envelopes(
                        &self.sql.read_many_at,
                        Params::Positional(vec![keys.into(), at.into()]),
                    )
                    .await?
                }
                _ => Vec::new(),
            };
            pager.add(want, rows, older);
        }
        Ok(pager.finish())
    }

    async fn versions(&self, id: &str) -> Result<Vec<Envelope>, StoreError> {
        self.envelopes(&self.sql.versions, Params::Positional(vec![id.into()]))
            .await
    }

    async fn find(
        &self,
        search: &Search<'_>,
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Row>, StoreError> {
        let Search {
            template,
            args,
            limit,
            ..
        } = *search;
        let at = ctx.at;
        let tokens = tokens_json(ctx.filter);
        let compiled = self.core.search_statement(search, at, tokens.is_some())?;
        let params = Self::bind(&compiled, args, at, &tokens, None, None);
        self.core.count_read();
        let mut conn = self.db.conn().await?;
        let mut rows: Vec<(i64, String, String)> =
            conn.exec(&compiled.sql, params).await.map_err(my_error)?;
        rows.sort_by_key(|r| r.0);
        sort_by_template(template, &mut rows, |r| (&r.1, &r.2));
        Ok(rows
            .into_iter()
            .take(limit.unwrap_or(usize::MAX))
            .map(|(_, id, payload)| Row { id, payload })
            .collect())
    }

    async fn find_batch(
        &self,
        batch: &BatchSearch<'_>,
        ctx: &ReadContext<'_>,
    ) -> Result<KeyedRows, StoreError> {
        let (template, keys, at) = (batch.template, batch.keys, ctx.at);
        let tokens = tokens_json(ctx.filter);
        let Some(compiled) = self.core.batch_statement(batch, at, tokens.is_some())? else {
            return Ok(Vec::new());
        };
        let mut unique: Vec<&String> = Vec::with_capacity(keys.len());
        let mut seen = std::collections::HashSet::new();
        for k in keys {
            if seen.insert(k) {
                unique.push(k);
            }
        }
        let keys_json = serde_json::to_string(&unique).expect("strings serialise");
        let params = Self::bind(
            &compiled,
            &BoundArgs::new(),
            at,
            &tokens,
            Some(&keys_json),
            None,
        );
        self.core.count_read();
        let mut conn = self.db.conn().await?;
        let mut rows: Vec<(String, i64, String, String)> =
            conn.exec(&compiled.sql, params).await.map_err(my_error)?;
        rows.sort_by_key(|r| r.1);
        sort_by_template(template, &mut rows, |r| (&r.2, &r.3));
        Ok(rows
            .into_iter()
            .map(|(k, _, id, payload)| (k, Row { id, payload }))
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
        let tokens = tokens_json(ctx.filter);
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
        let params = Self::bind(&compiled, args, at, &tokens, None, limit);
        self.core.count_read();
        let mut conn = self.db.conn().await?;
        let rows: Vec<(i64, Option<String>, String, String, i64)> =
            conn.exec(&compiled.sql, params).await.map_err(my_error)?;
        let rows = rows
            .into_iter()
            .map(|(r, key, id, payload, order)| (r as usize, key, id, payload, order));
        meshql_core::nested::assemble_text(nested, fields, rows).map(Some)
    }

    fn relation(&self) -> Option<Relation> {
        self.core.relation(self.db.nested_sql, self.database_id())
    }
}

#[async_trait]
impl StoreWriter for MysqlStore {
    async fn import_versions(&self, versions: &[Envelope]) -> Result<u64, StoreError> {
        let versions = versions.to_vec();
        let written = self
            .write_tx(move |s, tx| {
                Box::pin(async move {
                    let mut written = 0u64;
                    for v in versions {
                        let exists: Option<i64> = tx
                            .tx
                            .exec_first(&s.sql.version_exists, (v.id.as_str(), v.created_at))
                            .await
                            .map_err(my_error)?;
                        if exists.is_some() {
                            continue;
                        }
                        let payload = meshql_store_sql::outputs::with_id(&v.id, &v.payload)?;
                        s.append(
                            tx,
                            Version {
                                id: &v.id,
                                payload,
                                created_at: Some(v.created_at),
                                deleted: v.deleted,
                                tokens: &v.authorized_tokens,
                                fresh_id: false,
                                correlation_id: None,
                            },
                        )
                        .await?;
                        written += 1;
                    }
                    Ok(written)
                })
            })
            .await?;
        if written > 0 {
            self.core.count_writes(written);
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
        let tokens = ctx.create_tokens().to_vec();
        let correlation_id = ctx.correlation_id.clone();
        let env = self
            .write_tx(move |s, tx| {
                Box::pin(async move {
                    s.append(
                        tx,
                        Version {
                            id: &id,
                            payload,
                            created_at,
                            deleted: false,
                            tokens: &tokens,
                            fresh_id,
                            correlation_id: correlation_id.as_deref(),
                        },
                    )
                    .await
                })
            })
            .await?;
        self.core.count_writes(1);
        Ok(env)
    }

    async fn create_many(
        &self,
        docs: Vec<NewDocument>,
        ctx: &WriteContext,
    ) -> Result<Vec<Envelope>, StoreError> {
        let tokens = ctx.create_tokens().to_vec();
        let correlation_id = ctx.correlation_id.clone();
        let envs = self
            .write_tx(move |s, tx| {
                Box::pin(async move {
                    let mut out = Vec::with_capacity(docs.len());
                    for mut doc in docs {
                        let fresh_id = doc.id.is_none();
                        let id = doc.resolve_id();
                        let created_at = doc.created_at;
                        let payload = doc.into_payload_text(&id);
                        out.push(
                            s.append(
                                tx,
                                Version {
                                    id: &id,
                                    payload,
                                    created_at,
                                    deleted: false,
                                    tokens: &tokens,
                                    fresh_id,
                                    correlation_id: correlation_id.as_deref(),
                                },
                            )
                            .await?,
                        );
                    }
                    Ok(out)
                })
            })
            .await?;
        self.core.count_writes(envs.len() as u64);
        Ok(envs)
    }

    async fn update(
        &self,
        id: &str,
        doc: NewDocument,
        ctx: &WriteContext,
    ) -> Result<Option<Envelope>, StoreError> {
        let created_at = doc.created_at;
        let payload = doc.into_payload_text(id);
        let id = id.to_owned();
        let ctx = ctx.clone();
        let env = self
            .write_tx(move |s, tx| {
                Box::pin(async move {
                    match s.current(&mut tx.tx, &id).await? {
                        Some(cur) if updatable(&cur, &ctx.filter) => {
                            let tokens = ctx.tokens.unwrap_or(cur.tokens);
                            s.append(
                                tx,
                                Version {
                                    id: &id,
                                    payload,
                                    created_at,
                                    deleted: false,
                                    tokens: &tokens,
                                    fresh_id: false,
                                    correlation_id: ctx.correlation_id.as_deref(),
                                },
                            )
                            .await
                            .map(Some)
                        }
                        _ => Ok(None),
                    }
                })
            })
            .await?;
        if env.is_some() {
            self.core.count_writes(1);
        }
        Ok(env)
    }

    async fn remove(&self, id: &str, ctx: &WriteContext) -> Result<RemoveOutcome, StoreError> {
        let id = id.to_owned();
        let ctx = ctx.clone();
        let outcome = self
            .write_tx(move |s, tx| Box::pin(async move { s.remove_in(tx, &id, &ctx).await }))
            .await?;
        if outcome == RemoveOutcome::Removed {
            self.core.count_writes(1);
        }
        Ok(outcome)
    }

    async fn remove_many(
        &self,
        ids: &[String],
        ctx: &WriteContext,
    ) -> Result<Vec<(String, RemoveOutcome)>, StoreError> {
        let ids = ids.to_vec();
        let ctx = ctx.clone();
        let out = self
            .write_tx(move |s, tx| {
                Box::pin(async move {
                    let mut out = Vec::with_capacity(ids.len());
                    for id in ids {
                        let o = s.remove_in(tx, &id, &ctx).await?;
                        out.push((id, o));
                    }
                    Ok(out)
                })
            })
            .await?;
        let removed = out
            .iter()
            .filter(|(_, o)| *o == RemoveOutcome::Removed)
            .count() as u64;
        self.core.count_writes(removed);
        Ok(out)
    }
}

#[async_trait]
impl ChangeFeed for MysqlStore {
    async fn changes(&self, after: Cursor, limit: usize) -> Result<Vec<StoreChange>, StoreError> {
        // feed reads are not counted as reads: those count what requests cost
        let mut conn = self.db.conn().await?;
        let rows: Vec<mysql_async::Row> = conn
            .exec(&self.sql.changes, (after.1, limit as u64))
            .await
            .map_err(my_error)?;
        rows.into_iter()
            .map(|r| {
                let pos: u64 = r.get(5).unwrap_or_default();
                let first = r.get::<i64, _>(6).unwrap_or_default() != 0;
                let correlation_id: Option<String> = r.get(7).unwrap_or_default();
                let env = envelope(r)?;
                Ok(StoreChange::of_version(
                    Cursor::seq(pos),
                    env,
                    first,
                    correlation_id,
                ))
            })
            .collect()
    }

    fn commit_signal(&self) -> Option<meshql_core::CommitReceiver> {
        Some(self.core.signal.subscribe())
    }
}

#[async_trait]
impl Store for MysqlStore {
    async fn prepare(&self, templates: &[QueryTemplate]) -> Result<(), StoreError> {
        self.core.remember(templates);
        let table = self.core.table();
        let mut conn = self.db.conn().await?;
        // serialise schema changes between services starting at once
        let locked: Option<Option<i64>> = conn
            .exec_first(outputs::DDL_LOCK, ())
            .await
            .map_err(my_error)?;
        let mut ddl = vec![sql::create_table(table), sql::CREATE_CLOCK.to_owned()];
        ddl.extend(outputs::DDL.iter().map(|s| s.to_string()));
        ddl.extend(sql::upgrade_for_feed(table));
        ddl.extend(TableCore::index_ddl(&DIALECT, table, templates));
        let mut result = Ok(());
        for stmt in ddl {
            if let Err(e) = conn.query_drop(&stmt).await {
                result = Err(my_error(e));
                break;
            }
        }
        // a rebuild's swap a crash interrupted, finished or abandoned: only under the lock,
        // which a swap holds from its first step to its last
        if result.is_ok() && locked == Some(Some(1)) {
            result = self.finish_swap(&mut conn).await;
        }
        let _ = conn.query_drop(outputs::DDL_UNLOCK).await;
        result?;
        for c in self.core.startup_statements(templates) {
            conn.prep(&c.sql)
                .await
                .map_err(|e| TableCore::invalid_statement(my_error(e), &c.sql))?;
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
        self.db.close().await;
    }
}
