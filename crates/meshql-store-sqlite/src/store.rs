//! [`SqliteStore`]: one entity table in a [`SqliteDatabase`].

use crate::db::{query_error, SqliteDatabase};
use crate::dialect::DIALECT;
use crate::sql::{self, quote_ident, Compiled, Shape};
use async_trait::async_trait;
use meshql_core::memo::Memo;
use meshql_core::template::TemplateKind;
use meshql_core::{
    in_request_order, now_millis, BoundArgs, Cursor, Envelope, KeyedRows, Millis, Nested,
    NestedRow, NewDocument, Placement, QueryTemplate, Relation, RemoveOutcome, Row, Store,
    StoreChange, StoreError, StoreStats, TokenFilter, WriteContext,
};
use meshql_core::{BatchSearch, ChangeFeed, ReadContext, Search, StoreReader, StoreWriter};
use meshql_store_sql::param::{Binding, ListArg};
use meshql_store_sql::rules::{tokens_json, updatable, visible, Current, RemoveStep, Version};
use meshql_store_sql::table::{list_index, page_index, PageParam};
use meshql_store_sql::table_core::TableCore;
use rusqlite::types::Value as SqlValue;
use rusqlite::{params, Connection, OptionalExtension};
use std::sync::atomic::Ordering;
use std::sync::Arc;

#[cfg(test)]
mod golden;
mod nested;
mod outputs;
pub use outputs::LogVersion;

/// One entity's table.
pub struct SqliteStore {
    db: Arc<SqliteDatabase>,
    /// The table's compiled searches, templates and counters.
    core: TableCore,
    sql: Arc<TableSql>,
    /// Batched lookups of relationships to other tables of the file, read with this
    /// table's searches (`nested`): by template, with the table they were compiled for.
    level_compiled: Memo<(u64, Shape), (String, Compiled)>,
}

/// Statement texts that do not depend on templates.
/// Whole-table reads allowed more rows than this run on the blocking pool.
const SCAN_ROWS: usize = 1_000;

/// The table's statements: those every SQL store shares ([`meshql_store_sql::table`]), and
/// the change feed's.
struct TableSql {
    common: meshql_store_sql::table::TableSql,
    changes: String,
}

impl std::ops::Deref for TableSql {
    type Target = meshql_store_sql::table::TableSql;

    fn deref(&self) -> &Self::Target {
        &self.common
    }
}

impl TableSql {
    fn new(table: &str) -> Self {
        let t = quote_ident(table);
        Self {
            common: meshql_store_sql::table::TableSql::new(&DIALECT, table),
            // the single writer assigns row ids in commit order, and a reader's snapshot holds
            // whole transactions: the row id is the feed cursor, with no horizon to wait for.
            // No bound LIMIT: SQLite re-prepares a statement whose LIMIT value changed the plan
            // (it showed as sqlite3Reprepare in profiles); the caller stops reading instead,
            // which a scan in row-id order allows at no cost
            changes: format!(
                "SELECT t.id, t.payload, t.created_at, t.deleted, t.authorized_tokens, t._id, \
                 t.seq IS NULL, t.correlation_id FROM {t} t WHERE t._id > ?1 ORDER BY t._id"
            ),
        }
    }
}

fn envelope_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<(Envelope, String)> {
    let tokens: String = row.get(4)?;
    Ok((
        Envelope {
            id: row.get(0)?,
            payload: row.get(1)?,
            created_at: row.get(2)?,
            deleted: row.get::<_, i64>(3)? != 0,
            authorized_tokens: Vec::new(),
        },
        tokens,
    ))
}

fn query_envelopes(
    conn: &Connection,
    sql_text: &str,
    params: &[SqlValue],
) -> Result<Vec<Envelope>, StoreError> {
    let mut stmt = conn.prepare_cached(sql_text).map_err(query_error)?;
    let rows = stmt
        .query_map(rusqlite::params_from_iter(params.iter()), envelope_from_row)
        .map_err(query_error)?;
    rows.map(|r| decode_tokens(r.map_err(query_error)?))
        .collect()
}

fn decode_tokens(mut env: (Envelope, String)) -> Result<Envelope, StoreError> {
    if env.1 != "[]" {
        env.0.authorized_tokens = serde_json::from_str(&env.1)
            .map_err(|e| StoreError::Corrupt(format!("authorized_tokens: {e}")))?;
    }
    Ok(env.0)
}

/// Whether a search reads the whole table with room for many rows (GraphQL caps a vector
/// query at its object budget, 100,001 by default): such a read goes to the blocking pool,
/// bounded by the scan permits; any other runs inline.
fn is_scan(template: &QueryTemplate, limit: Option<usize>) -> bool {
    matches!(&template.kind, TemplateKind::Filter(p) if p.is_empty())
        && limit.is_none_or(|l| l > SCAN_ROWS)
}

impl SqliteStore {
    /// A store for `table` in `db`. The table is created by [`Store::prepare`].
    pub fn new(db: Arc<SqliteDatabase>, table: &str) -> Self {
        Self {
            db,
            core: TableCore::new(&DIALECT, table),
            sql: Arc::new(TableSql::new(table)),
            level_compiled: Memo::default(),
        }
    }

    pub fn table(&self) -> &str {
        self.core.table()
    }

    /// This store's database file, as [`Relation::database`].
    fn database_id(&self) -> usize {
        Arc::as_ptr(&self.db) as usize
    }

    fn count_read(&self) {
        self.core.count_read();
    }

    /// Runs a whole-table read on the blocking pool, bounded by the database's scan
    /// permits: point lookups run inline (they take microseconds), scans must not hold up
    /// the async workers.
    async fn scan<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.core.count_read();
        self.db.scan(f).await
    }

    fn bind(
        compiled: &Compiled,
        args: &BoundArgs,
        at: Option<Millis>,
        tokens: &Option<String>,
        keys: Option<&str>,
    ) -> Vec<SqlValue> {
        let binding = Binding {
            args,
            at,
            tokens: tokens.as_deref().map(ListArg::Json),
            keys: keys.map(ListArg::Json),
            limit: None,
        };
        meshql_store_sql::param::bind(sql::BIND, compiled, &binding, sql::to_driver)
    }

    /// The newest version of `id`, a tombstone included, whoever may see it (`None` when
    /// none was ever stored): what a store that writes elsewhere (the Kafka backend) checks
    /// an update or a delete against before it writes.
    pub fn current_version(&self, id: &str) -> Result<Option<Envelope>, StoreError> {
        let current = self.db.read(|conn| Self::current(conn, &self.sql, id))?;
        Ok(current.map(|c| Envelope {
            id: id.to_owned(),
            payload: c.payload,
            created_at: c.created_at,
            deleted: c.deleted,
            authorized_tokens: c.tokens,
        }))
    }

    fn current(conn: &Connection, sql: &TableSql, id: &str) -> Result<Option<Current>, StoreError> {
        let mut stmt = conn.prepare_cached(&sql.current).map_err(query_error)?;
        let row = stmt
            .query_row(params![id], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, i64>(3)? != 0,
                    r.get::<_, String>(4)?,
                    r.get::<_, i64>(5)?,
                ))
            })
            .optional()
            .map_err(query_error)?;
        row.map(|(rowid, payload, created_at, deleted, tokens, seq)| {
            Ok(Current {
                rowid,
                seq,
                payload,
                created_at,
                deleted,
                tokens: serde_json::from_str(&tokens)
                    .map_err(|e| StoreError::Corrupt(format!("authorized_tokens: {e}")))?,
            })
        })
        .transpose()
    }

    /// Appends one version; keeps `latest` on the newest version and `(id, created_at)`
    /// unique by moving a colliding or same-millisecond "now" version 1 ms later.
    fn append(conn: &Connection, sql: &TableSql, v: Version<'_>) -> Result<Envelope, StoreError> {
        // a server-generated UUID has no history: skip the lookup
        let current = if v.fresh_id {
            None
        } else {
            Self::current(conn, sql, v.id)?
        };
        Self::append_after(conn, sql, v, current)
    }

    /// [`Self::append`] when the caller has read the document's `current` version already.
    fn append_after(
        conn: &Connection,
        sql: &TableSql,
        v: Version<'_>,
        current: Option<Current>,
    ) -> Result<Envelope, StoreError> {
        let Version {
            id,
            payload,
            created_at,
            deleted,
            tokens,
            fresh_id: _,
            correlation_id,
        } = v;
        let cur_time = current.as_ref().map(|c| c.created_at);
        let mut place = Placement::new(created_at, cur_time, now_millis());
        if place.check_collisions {
            let mut stamp = place.stamp;
            let mut exists = conn
                .prepare_cached(&sql.version_exists)
                .map_err(query_error)?;
            while exists.exists(params![id, stamp]).map_err(query_error)? {
                stamp += 1;
            }
            place = place.settle(stamp, cur_time);
        }
        let (stamp, is_latest) = (place.stamp, place.latest);
        if let (true, Some(cur)) = (is_latest, &current) {
            conn.prepare_cached(&sql.clear_latest)
                .map_err(query_error)?
                .execute(params![cur.rowid])
                .map_err(query_error)?;
        }
        meshql_core::fault::check(&payload)?;
        let tokens_text = serde_json::to_string(tokens).expect("strings serialise");
        conn.prepare_cached(&sql.insert)
            .map_err(query_error)?
            .execute(params![
                id,
                payload,
                stamp,
                deleted as i64,
                tokens_text,
                is_latest as i64,
                current.as_ref().map(|c| c.seq),
                correlation_id
            ])
            .map_err(query_error)?;
        Ok(Envelope {
            id: id.to_owned(),
            payload,
            created_at: stamp,
            deleted,
            authorized_tokens: tokens.to_vec(),
        })
    }

    fn remove_one(
        conn: &Connection,
        sql: &TableSql,
        id: &str,
        ctx: &WriteContext,
    ) -> Result<RemoveOutcome, StoreError> {
        match RemoveStep::of(Self::current(conn, sql, id)?, &ctx.filter) {
            RemoveStep::Done(outcome) => Ok(outcome),
            RemoveStep::Tombstone(cur) => {
                let correlation_id = ctx.correlation_id.as_deref();
                let tombstone = Version::tombstone(id, cur.payload, &cur.tokens, correlation_id);
                Self::append(conn, sql, tombstone)?;
                Ok(RemoveOutcome::Removed)
            }
        }
    }

    fn read_envelopes(
        &self,
        conn: &Connection,
        sql_text: &str,
        params: &[SqlValue],
    ) -> Result<Vec<Envelope>, StoreError> {
        self.count_read();
        query_envelopes(conn, sql_text, params)
    }

    fn read_one(
        &self,
        conn: &Connection,
        id: &str,
        filter: &TokenFilter,
        at: Option<Millis>,
    ) -> Result<Option<Envelope>, StoreError> {
        self.count_read();
        let row = match at {
            None => conn
                .prepare_cached(&self.sql.read_latest)
                .map_err(query_error)?
                .query_row(params![id], envelope_from_row)
                .optional(),
            Some(at) => conn
                .prepare_cached(&self.sql.read_at)
                .map_err(query_error)?
                .query_row(params![id, at], envelope_from_row)
                .optional(),
        }
        .map_err(query_error)?;
        let Some(row) = row else { return Ok(None) };
        let env = decode_tokens(row)?;
        if !visible(filter, &env) {
            return Ok(None);
        }
        Ok(Some(env))
    }
}

#[async_trait]
impl StoreReader for SqliteStore {
    async fn read(&self, id: &str, ctx: &ReadContext<'_>) -> Result<Option<Envelope>, StoreError> {
        let (filter, at) = (ctx.filter, ctx.at);
        self.db.read(|conn| self.read_one(conn, id, filter, at))
    }

    async fn read_many(
        &self,
        ids: &[String],
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Envelope>, StoreError> {
        let (filter, at) = (ctx.filter, ctx.at);
        let keys = SqlValue::Text(
            serde_json::to_string(ids).map_err(|e| StoreError::Invalid(e.to_string()))?,
        );
        let found = self.db.read(|conn| match at {
            None => self.read_envelopes(conn, &self.sql.read_many_latest, &[keys]),
            Some(at) => {
                self.read_envelopes(conn, &self.sql.read_many_at, &[keys, SqlValue::Integer(at)])
            }
        })?;
        Ok(in_request_order(ids, found, filter))
    }

    async fn list(&self, ctx: &ReadContext<'_>) -> Result<Vec<Envelope>, StoreError> {
        let (filter, at) = (ctx.filter, ctx.at);
        let tokens = tokens_json(filter);
        let text = self.sql.list[list_index(at.is_some(), tokens.is_some())].clone();
        let mut params = Vec::with_capacity(2);
        params.extend(at.map(SqlValue::Integer));
        params.extend(tokens.map(SqlValue::Text));
        self.scan(move |conn| query_envelopes(conn, &text, &params))
            .await
    }

    async fn list_page(
        &self,
        after: Option<&str>,
        limit: usize,
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Envelope>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let tokens = tokens_json(ctx.filter);
        let page = &self.sql.page[page_index(ctx.at.is_some(), tokens.is_some(), after.is_some())];
        let text = page.sql.clone();
        let mut tokens = tokens;
        let params: Vec<SqlValue> = page
            .order
            .iter()
            .filter_map(|p| match p {
                PageParam::At => ctx.at.map(SqlValue::Integer),
                PageParam::After => after.map(|a| SqlValue::Text(a.to_owned())),
                PageParam::Tokens => tokens.take().map(SqlValue::Text),
                PageParam::Limit => None,
            })
            .collect();
        let (at, filter, sql) = (ctx.at, ctx.filter.clone(), self.sql.clone());
        let run = move |conn: &Connection| -> Result<Vec<Envelope>, StoreError> {
            let mut stmt = conn.prepare_cached(&text).map_err(query_error)?;
            let mut rows = stmt
                .query(rusqlite::params_from_iter(params.iter()))
                .map_err(query_error)?;
            let mut out = Vec::with_capacity(limit.min(SCAN_ROWS));
            let mut before = None;
            while out.len() < limit {
                let Some(row) = rows.next().map_err(query_error)? else {
                    break;
                };
                let env = decode_tokens(envelope_from_row(row).map_err(query_error)?)?;
                match at {
                    // written after the time asked: the version before, if it was visible
                    Some(at) if env.created_at > at => {
                        let read_at = match &mut before {
                            Some(s) => s,
                            None => before
                                .insert(conn.prepare_cached(&sql.read_at).map_err(query_error)?),
                        };
                        let older = read_at
                            .query_row(params![env.id, at], envelope_from_row)
                            .optional()
                            .map_err(query_error)?;
                        if let Some(older) = older {
                            let older = decode_tokens(older)?;
                            if visible(&filter, &older) {
                                out.push(older);
                            }
                        }
                    }
                    _ => out.push(env),
                }
            }
            Ok(out)
        };
        // a page no larger than a point lookup's worth of rows runs inline, as `find` does
        if limit <= SCAN_ROWS {
            self.db.read(|conn| {
                self.count_read();
                run(conn)
            })
        } else {
            self.scan(run).await
        }
    }

    async fn versions(&self, id: &str) -> Result<Vec<Envelope>, StoreError> {
        self.db.read(|conn| {
            self.read_envelopes(conn, &self.sql.versions, &[SqlValue::Text(id.to_owned())])
        })
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
        let (filter, at) = (ctx.filter, ctx.at);
        let tokens = tokens_json(filter);
        let compiled = self.core.search_statement(search, at, tokens.is_some())?;
        let params = Self::bind(&compiled, args, at, &tokens, None);
        let run = move |conn: &Connection| -> Result<Vec<Row>, StoreError> {
            let mut stmt = conn.prepare_cached(&compiled.sql).map_err(query_error)?;
            let rows = stmt
                .query_map(rusqlite::params_from_iter(params.iter()), |r| {
                    Ok(Row {
                        id: r.get(0)?,
                        payload: r.get(1)?,
                    })
                })
                .map_err(query_error)?;
            rows.take(limit.unwrap_or(usize::MAX))
                .map(|r| r.map_err(query_error))
                .collect()
        };
        if is_scan(template, limit) {
            self.scan(run).await
        } else {
            self.db.read(|conn| {
                self.count_read();
                run(conn)
            })
        }
    }

    async fn find_batch(
        &self,
        batch: &BatchSearch<'_>,
        ctx: &ReadContext<'_>,
    ) -> Result<KeyedRows, StoreError> {
        let (keys, at) = (batch.keys, ctx.at);
        let tokens = tokens_json(ctx.filter);
        let Some(compiled) = self.core.batch_statement(batch, at, tokens.is_some())? else {
            return Ok(Vec::new());
        };
        let keys_json = serde_json::to_string(keys).expect("strings serialise");
        let params = Self::bind(&compiled, &BoundArgs::new(), at, &tokens, Some(&keys_json));
        self.db.read(|conn| {
            self.count_read();
            let mut stmt = conn.prepare_cached(&compiled.sql).map_err(query_error)?;
            let rows = stmt
                .query_map(rusqlite::params_from_iter(params.iter()), |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        Row {
                            id: r.get(1)?,
                            payload: r.get(2)?,
                        },
                    ))
                })
                .map_err(query_error)?;
            rows.map(|r| r.map_err(query_error)).collect()
        })
    }

    async fn find_nested(
        &self,
        search: &Search<'_>,
        nested: &[Nested],
        ctx: &ReadContext<'_>,
    ) -> Result<Option<Vec<NestedRow>>, StoreError> {
        self.find_nested_in_one_transaction(search, nested, ctx)
            .await
    }

    fn relation(&self) -> Option<Relation> {
        self.core
            .relation(self.db.nested_reads(), self.database_id())
    }
}

#[async_trait]
impl StoreWriter for SqliteStore {
    async fn import_versions(&self, versions: &[Envelope]) -> Result<u64, StoreError> {
        let sql = self.sql.clone();
        let versions = versions.to_vec();
        let written = self
            .db
            .write(move |conn| {
                let mut exists = conn
                    .prepare_cached(&sql.version_exists)
                    .map_err(query_error)?;
                let mut written = 0u64;
                for v in versions {
                    if exists
                        .exists(params![v.id, v.created_at])
                        .map_err(query_error)?
                    {
                        continue;
                    }
                    let payload = meshql_store_sql::outputs::with_id(&v.id, &v.payload)?;
                    let current = Self::current(conn, &sql, &v.id)?;
                    Self::append_after(
                        conn,
                        &sql,
                        Version {
                            id: &v.id,
                            payload,
                            created_at: Some(v.created_at),
                            deleted: v.deleted,
                            tokens: &v.authorized_tokens,
                            fresh_id: false,
                            correlation_id: None,
                        },
                        current,
                    )?;
                    written += 1;
                }
                Ok(written)
            })
            .await?;
        if written > 0 {
            self.core.wrote(written);
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
        let sql = self.sql.clone();
        let job = move |conn: &Connection| {
            Self::append(
                conn,
                &sql,
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
        };
        // a server-generated id has no earlier version to un-flag: the append is one INSERT
        let env = if fresh_id {
            self.db.write_single_statement(job).await?
        } else {
            self.db.write(job).await?
        };
        self.core.wrote(1);
        Ok(env)
    }

    async fn create_many(
        &self,
        docs: Vec<NewDocument>,
        ctx: &WriteContext,
    ) -> Result<Vec<Envelope>, StoreError> {
        let prepared: Vec<(String, String, Option<Millis>, bool)> = docs
            .into_iter()
            .map(|mut d| {
                let fresh_id = d.id.is_none();
                let id = d.resolve_id();
                let at = d.created_at;
                let payload = d.into_payload_text(&id);
                (id, payload, at, fresh_id)
            })
            .collect();
        let n = prepared.len() as u64;
        let tokens = ctx.create_tokens().to_vec();
        let correlation_id = ctx.correlation_id.clone();
        let sql = self.sql.clone();
        let envs = self
            .db
            .write(move |conn| {
                prepared
                    .into_iter()
                    .map(|(id, payload, at, fresh_id)| {
                        Self::append(
                            conn,
                            &sql,
                            Version {
                                id: &id,
                                payload,
                                created_at: at,
                                deleted: false,
                                tokens: &tokens,
                                fresh_id,
                                correlation_id: correlation_id.as_deref(),
                            },
                        )
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .await?;
        self.core.count_writes(n);
        self.core.signal.notify();
        Ok(envs)
    }

    async fn update(
        &self,
        id: &str,
        doc: NewDocument,
        ctx: &WriteContext,
    ) -> Result<Option<Envelope>, StoreError> {
        let id = id.to_owned();
        let created_at = doc.created_at;
        let payload = doc.into_payload_text(&id);
        let ctx = ctx.clone();
        let sql = self.sql.clone();
        let env = self
            .db
            .write(move |conn| match Self::current(conn, &sql, &id)? {
                Some(cur) if updatable(&cur, &ctx.filter) => {
                    let tokens = ctx.tokens.unwrap_or(cur.tokens);
                    Self::append(
                        conn,
                        &sql,
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
                    .map(Some)
                }
                _ => Ok(None),
            })
            .await?;
        if env.is_some() {
            self.core.wrote(1);
        }
        Ok(env)
    }

    async fn remove(&self, id: &str, ctx: &WriteContext) -> Result<RemoveOutcome, StoreError> {
        let id = id.to_owned();
        let ctx = ctx.clone();
        let sql = self.sql.clone();
        let outcome = self
            .db
            .write(move |conn| Self::remove_one(conn, &sql, &id, &ctx))
            .await?;
        if outcome == RemoveOutcome::Removed {
            self.core.wrote(1);
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
        let sql = self.sql.clone();
        let outcomes = self
            .db
            .write(move |conn| {
                ids.into_iter()
                    .map(|id| {
                        let o = Self::remove_one(conn, &sql, &id, &ctx)?;
                        Ok((id, o))
                    })
                    .collect::<Result<Vec<_>, StoreError>>()
            })
            .await?;
        let removed = outcomes
            .iter()
            .filter(|(_, o)| *o == RemoveOutcome::Removed)
            .count();
        self.core.wrote(removed as u64);
        Ok(outcomes)
    }
}

#[async_trait]
impl ChangeFeed for SqliteStore {
    async fn changes(&self, after: Cursor, limit: usize) -> Result<Vec<StoreChange>, StoreError> {
        let text = &self.sql.changes;
        let after = i64::try_from(after.1).unwrap_or(i64::MAX);
        // inline, like point reads: a page of the newest rows by primary key takes
        // microseconds, less than a hand-off to the blocking pool; and not counted as a read
        // (reads count what requests cost)
        self.db.read(|conn| {
            let mut stmt = conn.prepare_cached(text).map_err(query_error)?;
            let rows = stmt
                .query_map(params![after], |r| {
                    Ok((
                        envelope_from_row(r)?,
                        r.get::<_, i64>(5)?,
                        r.get::<_, bool>(6)?,
                        r.get::<_, Option<String>>(7)?,
                    ))
                })
                .map_err(query_error)?;
            rows.take(limit)
                .map(|row| {
                    let (env, rowid, first, correlation_id) = row.map_err(query_error)?;
                    let env = decode_tokens(env)?;
                    Ok(StoreChange::of_version(
                        Cursor::seq(rowid as u64),
                        env,
                        first,
                        correlation_id,
                    ))
                })
                .collect()
        })
    }

    fn commit_signal(&self) -> Option<meshql_core::CommitReceiver> {
        Some(self.core.signal.subscribe())
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn prepare(&self, templates: &[QueryTemplate]) -> Result<(), StoreError> {
        self.core.remember(templates);
        let table = self.core.table().to_owned();
        let mut ddl = vec![sql::create_table(&table), outputs::DDL.to_owned()];
        ddl.extend(TableCore::index_ddl(&DIALECT, &table, templates));
        let ddl = ddl.join(";\n");
        self.db
            .write(move |conn| {
                conn.execute_batch(&ddl).map_err(query_error)?;
                for (column, definition) in sql::ADDED_COLUMNS {
                    let present: bool = conn
                        .query_row(
                            "SELECT COUNT(*) > 0 FROM pragma_table_info(?1) WHERE name = ?2",
                            params![table, column],
                            |r| r.get(0),
                        )
                        .map_err(query_error)?;
                    if !present {
                        conn.execute_batch(&format!(
                            "ALTER TABLE {} ADD COLUMN {column} {definition}",
                            quote_ident(&table)
                        ))
                        .map_err(query_error)?;
                    }
                }
                Ok(())
            })
            .await?;
        // compile every statement now so that a bad SQL fragment fails at start-up
        let compiled = self.core.startup_statements(templates);
        self.db.read(|conn| {
            for c in &compiled {
                conn.prepare(&c.sql)
                    .map_err(|e| TableCore::invalid_statement(e, &c.sql))?;
            }
            Ok(())
        })
    }

    async fn ready(&self) -> Result<(), StoreError> {
        self.db.ping()
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            reads: self.core.reads.load(Ordering::Relaxed),
            commits: self.db.commits(),
            writes: self.core.writes.load(Ordering::Relaxed),
            read_connections: Some(self.db.open_readers() as u64),
            connections_in_use: None,
            log: None,
        }
    }

    async fn shutdown(&self) {
        self.db.shutdown().await;
    }
}

#[cfg(test)]
mod feed_statement_tests {
    use super::*;
    use crate::SqliteOptions;
    use meshql_core::{NewDocument, StoreWriter, WriteContext};

    /// The feed's statement is prepared once per connection: reading it after other cursors
    /// and with other page sizes must not make SQLite prepare it again (a bound LIMIT did,
    /// on every read).
    #[tokio::test]
    async fn reading_the_feed_never_reprepares_its_statement() {
        let dir = tempfile::tempdir().unwrap();
        let db = SqliteDatabase::open(&dir.path().join("t.db"), SqliteOptions::default()).unwrap();
        let store = SqliteStore::new(db.clone(), "hen");
        store.prepare(&[]).await.unwrap();
        for i in 0..30 {
            let mut payload = serde_json::Map::new();
            payload.insert("n".into(), i.into());
            store
                .create(NewDocument::new(payload), &WriteContext::SYSTEM)
                .await
                .unwrap();
        }
        let text = store.sql.changes.clone();
        let reprepared = db
            .read(move |conn| {
                for (after, limit) in [(0, 5), (3, 512), (10, 1), (20, 100), (0, 30)] {
                    let mut stmt = conn.prepare_cached(&text).map_err(query_error)?;
                    let n = stmt
                        .query_map(params![after], |r| r.get::<_, i64>(5))
                        .map_err(query_error)?
                        .take(limit)
                        .count();
                    assert!(n > 0);
                }
                let stmt = conn.prepare_cached(&text).map_err(query_error)?;
                Ok(stmt.get_status(rusqlite::StatementStatus::RePrepare))
            })
            .unwrap();
        assert_eq!(reprepared, 0);
        // and the store's own reads honour the limit
        let page = store.changes(Cursor::seq(0), 7).await.unwrap();
        assert_eq!(page.len(), 7);
    }
}

/// The steps of `EXPLAIN QUERY PLAN` for `text`, every parameter bound to NULL.
#[cfg(test)]
fn query_plan(db: &SqliteDatabase, text: &str) -> Vec<String> {
    db.read(|conn| {
        let mut stmt = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {text}"))
            .map_err(query_error)?;
        let nulls = (0..text.matches('?').count()).map(|_| SqlValue::Null);
        let rows = stmt
            .query_map(rusqlite::params_from_iter(nulls), |r| r.get::<_, String>(3))
            .map_err(query_error)?;
        rows.map(|r| r.map_err(query_error)).collect()
    })
    .unwrap()
}

#[cfg(test)]
mod page_statement_tests {
    use super::*;
    use crate::SqliteOptions;
    use meshql_core::{StoreReader, StoreWriter};

    /// Every variant of the page statement walks an index in id order (no sort of the whole
    /// table before the first row), and paging with other times, ids and page sizes — also
    /// after `ANALYZE` has gathered statistics the planner could bind values against — never
    /// makes SQLite prepare it again.
    #[tokio::test]
    async fn pages_walk_an_index_and_never_reprepare() {
        let dir = tempfile::tempdir().unwrap();
        let db = SqliteDatabase::open(&dir.path().join("t.db"), SqliteOptions::default()).unwrap();
        let store = SqliteStore::new(db.clone(), "hen");
        store.prepare(&[]).await.unwrap();
        let docs = (0..300)
            .map(|i| {
                let mut payload = serde_json::Map::new();
                payload.insert("n".into(), i.into());
                NewDocument::new(payload)
            })
            .collect();
        store
            .create_many(docs, &WriteContext::SYSTEM)
            .await
            .unwrap();
        Connection::open(dir.path().join("t.db"))
            .unwrap()
            .execute_batch("ANALYZE")
            .unwrap();
        // the pooled reader loaded the schema before that: it reloads it now, once, rather
        // than inside the statements counted below
        db.read(|c| {
            c.query_row("SELECT count(*) FROM sqlite_stat1", [], |r| {
                r.get::<_, i64>(0)
            })
            .map_err(query_error)
        })
        .unwrap();
        for (i, page) in store.sql.page.iter().enumerate() {
            let plan = query_plan(&db, &page.sql);
            assert!(
                plan.iter().all(|step| !step.contains("TEMP B-TREE")),
                "variant {i} sorts: {plan:?}"
            );
            assert!(plan[0].contains("USING INDEX"), "variant {i}: {plan:?}");
            if i & 1 != 0 {
                assert!(plan[0].contains("(id>?)"), "variant {i} seeks: {plan:?}");
            }
        }
        let alice = TokenFilter::AnyOf(vec!["alice".into()]);
        let mut after: Option<String> = None;
        for (n, limit) in [(0, 7), (1, 100), (2, 3), (3, 50), (4, 1), (5, 200)] {
            for filter in [&TokenFilter::All, &alice] {
                for at in [None, Some(now_millis() + n)] {
                    let page = store
                        .list_page(after.as_deref(), limit, &ReadContext::new(filter, at))
                        .await
                        .unwrap();
                    assert!(page.len() <= limit);
                    if let (TokenFilter::All, None) = (filter, at) {
                        after = page.last().map(|e| e.id.clone()).or(after);
                    }
                }
            }
        }
        let texts: Vec<String> = store.sql.page.iter().map(|p| p.sql.clone()).collect();
        let reprepared: Vec<i32> = db
            .read(move |conn| {
                texts
                    .iter()
                    .map(|t| {
                        let stmt = conn.prepare_cached(t).map_err(query_error)?;
                        Ok(stmt.get_status(rusqlite::StatementStatus::RePrepare))
                    })
                    .collect()
            })
            .unwrap();
        assert_eq!(reprepared, vec![0; 8]);
    }
}

#[cfg(test)]
mod operator_statement_tests {
    use super::*;
    use crate::SqliteOptions;

    /// Equality templates keep the statement they always had; operator templates get an
    /// expression index for every field they compare or sort on, and a range uses it.
    #[tokio::test]
    async fn operator_fields_are_indexed_and_equalities_unchanged() {
        let eq = QueryTemplate::filter(r#"{"payload.name": "{{name}}"}"#).unwrap();
        let compiled = crate::dialect::search(
            "hen",
            &eq,
            Shape {
                at: false,
                tokens: false,
                limit: false,
                batch: false,
            },
        );
        assert_eq!(
            compiled.sql,
            "SELECT t.id, t.payload FROM \"hen\" t WHERE json_extract(t.payload, '$.name') = ? \
             AND t.latest = 1 AND t.deleted = 0 ORDER BY COALESCE(t.seq, t._id)"
        );
        let dir = tempfile::tempdir().unwrap();
        let db = SqliteDatabase::open(&dir.path().join("t.db"), SqliteOptions::default()).unwrap();
        let store = SqliteStore::new(db.clone(), "hen");
        // two-sided: without statistics SQLite deems a one-sided range too wide to beat
        // walking the creation-order index (with ANALYZE data it judges by the data)
        let range =
            QueryTemplate::filter(r#"{"payload.eggs": {"$gte": "{{min}}", "$lt": 7}}"#).unwrap();
        let sorted = QueryTemplate::filter("{}")
            .unwrap()
            .with_sort(r#"{"payload.dob": -1}"#)
            .unwrap();
        store.prepare(&[eq, range.clone(), sorted]).await.unwrap();
        let indexes: Vec<String> = db
            .read(|conn| {
                let mut stmt = conn
                    .prepare(
                        "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'hen'",
                    )
                    .map_err(query_error)?;
                let rows = stmt.query_map([], |r| r.get(0)).map_err(query_error)?;
                rows.map(|r| r.map_err(query_error)).collect()
            })
            .unwrap();
        for name in ["idx_hen_name", "idx_hen_eggs", "idx_hen_dob"] {
            assert!(indexes.iter().any(|i| i == name), "{name} in {indexes:?}");
        }
        let text = crate::dialect::search(
            "hen",
            &range,
            Shape {
                at: false,
                tokens: false,
                limit: false,
                batch: false,
            },
        )
        .sql;
        assert!(!text.contains('7'), "values are never spliced: {text}");
        let plan: Vec<String> = db
            .read(|conn| {
                let mut stmt = conn
                    .prepare(&format!("EXPLAIN QUERY PLAN {text}"))
                    .map_err(query_error)?;
                let rows = stmt
                    .query_map(rusqlite::params!["n", 3, "n", 7], |r| r.get::<_, String>(3))
                    .map_err(query_error)?;
                rows.map(|r| r.map_err(query_error)).collect()
            })
            .unwrap();
        assert!(
            plan.iter().any(|s| s.contains("idx_hen_eggs")),
            "the range uses the field's index: {plan:?}"
        );
    }
}

#[cfg(test)]
mod at_statement_tests {
    use super::*;
    use crate::SqliteOptions;
    use meshql_core::{BoundArgs, Search};

    fn shape(at: bool) -> Shape {
        Shape {
            at,
            tokens: false,
            limit: false,
            batch: false,
        }
    }

    /// What a read as of `at` must return, by definition: each document's latest version no
    /// later than `at`, unless that is a tombstone; in creation order.
    fn by_definition(conn: &Connection, at: i64, colour: Option<&str>) -> Vec<(String, String)> {
        let mut stmt = conn
            .prepare(
                "SELECT t.id, t.payload FROM hen t WHERE t.deleted = 0 AND t.created_at = \
                 (SELECT MAX(v.created_at) FROM hen v WHERE v.id = t.id AND v.created_at <= ?1) \
                 AND (?2 IS NULL OR json_extract(t.payload, '$.colour') = ?2) \
                 ORDER BY COALESCE(t.seq, t._id)",
            )
            .unwrap();
        stmt.query_map(rusqlite::params![at, colour], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect()
    }

    /// A search `at` a moment (and a batched lookup, and a lookup by id) returns what the
    /// definition says at every moment of a history of creates, replaces and deletes, and its
    /// plan reads the current documents and the
    /// versions after the moment through indexes, never every version stored.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_at_search_matches_the_definition_and_skips_history() {
        let dir = tempfile::tempdir().unwrap();
        let db = SqliteDatabase::open(&dir.path().join("t.db"), SqliteOptions::default()).unwrap();
        let store = SqliteStore::new(db.clone(), "hen");
        let all = QueryTemplate::filter("{}").unwrap();
        let by_colour = QueryTemplate::filter(r#"{"payload.colour": "{{colour}}"}"#).unwrap();
        store
            .prepare(&[all.clone(), by_colour.clone()])
            .await
            .unwrap();
        let doc = |n: i64, colour: &str| {
            let mut p = serde_json::Map::new();
            p.insert("n".into(), n.into());
            p.insert("colour".into(), colour.into());
            NewDocument::new(p)
        };
        let ctx = WriteContext::SYSTEM;
        let mut moments = Vec::new();
        let mut ids = Vec::new();
        for n in 0..30 {
            let colour = if n % 2 == 0 { "red" } else { "brown" };
            ids.push(store.create(doc(n, colour), &ctx).await.unwrap().id);
        }
        moments.push(meshql_core::time::now_millis());
        for round in 0..4i64 {
            tokio::time::sleep(std::time::Duration::from_millis(3)).await;
            for (n, id) in ids.iter().enumerate() {
                if (n as i64 + round) % 3 == 0 {
                    // a replace that changes the colour: in one filter's answer, then the other's
                    let colour = if (n as i64 + round) % 2 == 0 {
                        "red"
                    } else {
                        "brown"
                    };
                    store
                        .update(id, doc(100 * round + n as i64, colour), &ctx)
                        .await
                        .unwrap();
                }
            }
            if round == 2 {
                for id in ids.iter().step_by(7) {
                    store.remove(id, &ctx).await.unwrap();
                }
            }
            moments.push(meshql_core::time::now_millis());
            tokio::time::sleep(std::time::Duration::from_millis(3)).await;
            moments.push(meshql_core::time::now_millis());
        }
        let mut checked = 0;
        for &at in &moments {
            for (template, colour) in [
                (&all, None),
                (&by_colour, Some("red")),
                (&by_colour, Some("brown")),
            ] {
                let mut args = BoundArgs::new();
                if let Some(c) = colour {
                    args.insert("colour".into(), c.into());
                }
                let found = store
                    .find(
                        &Search::new(template, &args, None),
                        &ReadContext::new(&meshql_core::TokenFilter::All, Some(at)),
                    )
                    .await
                    .unwrap();
                let found: Vec<(String, String)> =
                    found.into_iter().map(|r| (r.id, r.payload)).collect();
                let expected = db.read(|c| Ok(by_definition(c, at, colour))).unwrap();
                assert_eq!(found, expected, "at {at}, colour {colour:?}");
                checked += expected.len();
            }
        }
        assert!(checked > 100, "the moments saw documents: {checked}");

        // batched lookups (by colour: old versions of other colours among the candidates)
        // and lookups by id answer the same at every moment
        let by_colour_key = QueryTemplate::filter(r#"{"payload.colour": "{{id}}"}"#).unwrap();
        let by_id = QueryTemplate::filter(r#"{"id": "{{id}}"}"#).unwrap();
        let colours = ["red".to_owned(), "brown".to_owned()];
        for &at in &moments {
            let ctx = ReadContext::new(&meshql_core::TokenFilter::All, Some(at));
            let batch = store
                .find_batch(
                    &meshql_core::BatchSearch::new(&by_colour_key, "id", &colours),
                    &ctx,
                )
                .await
                .unwrap();
            for colour in &colours {
                let found: Vec<(String, String)> = batch
                    .iter()
                    .filter(|(k, _)| k == colour)
                    .map(|(_, r)| (r.id.clone(), r.payload.clone()))
                    .collect();
                let expected = db.read(|c| Ok(by_definition(c, at, Some(colour)))).unwrap();
                assert_eq!(found, expected, "batch at {at}, colour {colour}");
            }
            let everything = db.read(|c| Ok(by_definition(c, at, None))).unwrap();
            for id in &ids {
                let mut args = BoundArgs::new();
                args.insert("id".into(), id.as_str().into());
                let found: Vec<(String, String)> = store
                    .find(&Search::new(&by_id, &args, None), &ctx)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|r| (r.id, r.payload))
                    .collect();
                let expected: Vec<(String, String)> = everything
                    .iter()
                    .filter(|(i, _)| i == id)
                    .cloned()
                    .collect();
                assert_eq!(found, expected, "by id at {at}");
            }
        }

        let text = crate::dialect::search("hen", &all, shape(true)).sql;
        let plan = query_plan(&db, &text);
        // the one plain scan is of the union's result (the co-routine), not of the table
        let scans: Vec<usize> = (0..plan.len())
            .filter(|&i| plan[i] == "SCAN t" || plan[i] == "SCAN c")
            .collect();
        assert!(
            scans.len() == 1
                && plan[scans[0] + 1..]
                    .iter()
                    .all(|s| !s.starts_with("SEARCH")),
            "no step reads every version: {plan:?}"
        );
        assert!(
            plan.iter().any(|s| s.contains("hen_current")),
            "documents unchanged since the moment come from the current index: {plan:?}"
        );
        assert!(
            plan.iter().any(|s| s.contains("hen_created")),
            "the versions after the moment come from the created_at index: {plan:?}"
        );
    }
}
