//! Statements of an entity table that do not depend on templates: reads by id, lists,
//! pages, and the writer's.

use crate::dialect::Dialect;
use crate::search::{version_at_text, ORDER};
use meshql_core::{Envelope, Millis, TokenFilter};

/// Index into [`TableSql::page`] of a page read at a time, for some tokens, after an id.
pub fn page_index(at: bool, tokens: bool, after: bool) -> usize {
    (at as usize) << 2 | (tokens as usize) << 1 | after as usize
}

/// Index into [`TableSql::list`] of a list read at a time, for some tokens.
pub fn list_index(at: bool, tokens: bool) -> usize {
    at as usize | (tokens as usize) << 1
}

/// What a page statement binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageParam {
    /// The time of a read `at` a moment.
    At,
    /// The id the page starts after.
    After,
    /// The caller's tokens.
    Tokens,
    /// How many rows at most (unless [`Dialect::page_unbound_limit`]).
    Limit,
}

/// A page statement and the order it binds its values in.
#[derive(Debug, Clone)]
pub struct PageSql {
    pub sql: String,
    pub order: Vec<PageParam>,
}

/// Statement texts of one table that do not depend on templates.
#[derive(Debug, Clone)]
pub struct TableSql {
    /// The newest version of an id (`id`).
    pub read_latest: String,
    /// The version of an id at a time (`id`, `at`).
    pub read_at: String,
    /// The newest versions of ids (the ids as a list).
    pub read_many_latest: String,
    /// The versions of ids at a time (the ids as a list, `at`).
    pub read_many_at: String,
    /// The visible documents, by [`list_index`] (`at`, tokens: those that apply).
    pub list: [String; 4],
    /// [`meshql_core::StoreReader::list_page`], by [`page_index`].
    pub page: [PageSql; 8],
    /// The writer's read of an id's newest version (`id`): `_id`, payload, `created_at`,
    /// `deleted`, tokens, creation order.
    pub current: String,
    /// An older version's `latest` flag cleared (`_id`).
    pub clear_latest: String,
    /// A version inserted (`id`, payload, `created_at`, `deleted`, tokens, `latest`, `seq`,
    /// `correlation_id`).
    pub insert: String,
    /// Whether an id has a version at a time (`id`, `created_at`).
    pub version_exists: String,
    /// Every version of an id, oldest first (`id`).
    pub versions: String,
}

impl TableSql {
    pub fn new(d: &dyn Dialect, table: &str) -> Self {
        let t = d.quote_ident(table);
        let p = |n: usize| d.numbered(n).unwrap_or_else(|| "?".to_owned());
        let columns = format!(
            "t.id, {}, t.created_at, t.deleted, t.authorized_tokens",
            d.payload_text("t.payload")
        );
        let latest = d.flag("t.latest", true);
        let now = format!("{latest} AND {}", d.flag("t.deleted", false));
        let at = |n: usize| {
            format!(
                "{} AND {}",
                d.flag("t.deleted", false),
                version_at_text(&t, &p(n))
            )
        };
        let (hint, lock) = d.current_read();
        Self {
            read_latest: format!("SELECT {columns} FROM {t} t WHERE t.id = {} AND {latest}", p(1)),
            read_at: format!(
                "SELECT {columns} FROM {t} t WHERE t.id = {} AND t.created_at <= {} \
                 ORDER BY t.created_at DESC LIMIT 1",
                p(1),
                p(2)
            ),
            read_many_latest: format!(
                "SELECT {columns} {} {latest}",
                d.rows_of_ids(&t, &p(1))
            ),
            read_many_at: format!(
                "SELECT {columns} {} {}",
                d.rows_of_ids(&t, &p(1)),
                version_at_text(&t, &p(2))
            ),
            list: [
                format!("SELECT {columns} FROM {t} t WHERE {now}{ORDER}"),
                format!("SELECT {columns} FROM {t} t WHERE {}{ORDER}", at(1)),
                format!(
                    "SELECT {columns} FROM {t} t WHERE {now}{}{ORDER}",
                    d.tokens_visible(&p(1))
                ),
                format!(
                    "SELECT {columns} FROM {t} t WHERE {}{}{ORDER}",
                    at(1),
                    d.tokens_visible(&p(2))
                ),
            ],
            page: std::array::from_fn(|i| page_sql(d, &t, &columns, i & 4 != 0, i & 2 != 0, i & 1 != 0)),
            current: format!(
                "SELECT _id, {}, created_at, deleted, authorized_tokens, COALESCE(seq, _id) \
                 FROM {t}{hint} WHERE id = {} AND {}{lock}",
                d.payload_text("payload"),
                p(1),
                d.flag("latest", true)
            ),
            clear_latest: format!(
                "UPDATE {t} SET latest = {} WHERE _id = {}",
                d.truth(false),
                p(1)
            ),
            insert: format!(
                "INSERT INTO {t} (id, payload, created_at, deleted, authorized_tokens, latest, seq, \
                 correlation_id) VALUES ({}, {}, {}, {}, {}, {}, {}, {}){}",
                p(1),
                d.insert_payload(&p(2)),
                p(3),
                p(4),
                p(5),
                p(6),
                p(7),
                p(8),
                d.insert_returning()
            ),
            version_exists: format!(
                "SELECT 1 FROM {t} WHERE id = {} AND created_at = {}",
                p(1),
                p(2)
            ),
            versions: format!(
                "SELECT {columns} FROM {t} t WHERE t.id = {} ORDER BY t.created_at",
                p(1)
            ),
        }
    }
}

/// A keyset page in id order, walking the latest versions' index on `id`.
///
/// With a time (`at`), a document's visible version is its newest at or before it. Rather
/// than finding that per row (a correlated `MAX(created_at)` per version made planners scan
/// and sort the whole table for every page), the statement returns each latest version that
/// is visible — older than `at`, not deleted, allowed by the tokens — and every latest
/// version written *after* `at`, which the reader replaces by the version before
/// ([`Pager`]): what was written since the time asked, usually nothing.
///
/// Numbered placeholders are numbered `at`, `after`, tokens, limit (those that apply);
/// positional ones are bound in order of appearance ([`PageSql::order`]). No limit with
/// [`Dialect::page_unbound_limit`].
fn page_sql(
    d: &dyn Dialect,
    t: &str,
    columns: &str,
    at: bool,
    tokens: bool,
    after: bool,
) -> PageSql {
    let exprs = d.page_unbound_limit();
    let limit = !exprs;
    let numbered = d.numbered(1).is_some();
    let mut order: Vec<PageParam> = Vec::with_capacity(4);
    let mut add = |cond: bool, p: PageParam| {
        if cond {
            order.push(p)
        }
    };
    if numbered {
        add(at, PageParam::At);
        add(after, PageParam::After);
    } else {
        add(after, PageParam::After);
        add(at, PageParam::At);
    }
    add(tokens, PageParam::Tokens);
    add(limit, PageParam::Limit);
    let ph = |p: PageParam| {
        let n = order.iter().position(|q| *q == p).map_or(0, |i| i + 1);
        d.numbered(n).unwrap_or_else(|| "?".to_owned())
    };
    let mut sql = format!(
        "SELECT {columns} FROM {t} t WHERE {}",
        d.flag("t.latest", true)
    );
    if after {
        let p = ph(PageParam::After);
        match exprs {
            true => sql.push_str(&format!(" AND t.id > ({p} || '')")),
            false => sql.push_str(&format!(" AND t.id > {p}")),
        }
    }
    let mut visible = d.flag("t.deleted", false);
    if tokens {
        visible.push_str(&d.tokens_visible(&ph(PageParam::Tokens)));
    }
    if at {
        let p = ph(PageParam::At);
        let p = match exprs {
            true => format!("({p} + 0)"),
            false => p,
        };
        sql.push_str(&format!(" AND (t.created_at > {p} OR ({visible}))"));
    } else {
        sql.push_str(&format!(" AND {visible}"));
    }
    sql.push_str(" ORDER BY t.id");
    if limit {
        sql.push_str(&format!(" LIMIT {}", ph(PageParam::Limit)));
    }
    PageSql { sql, order }
}

/// The pages of [`meshql_core::StoreReader::list_page`] a store reads (from its
/// [`TableSql::page`] statements) to answer one call: each page's latest versions, and the
/// versions written after `at` replaced by their version at `at` (read with
/// [`TableSql::read_many_at`]), until `limit` documents or the end of the table. More than
/// one page only when documents written since `at` turned out hidden then.
pub struct Pager<'a> {
    after: Option<String>,
    limit: usize,
    at: Option<Millis>,
    filter: &'a TokenFilter,
    out: Vec<Envelope>,
    done: bool,
}

impl<'a> Pager<'a> {
    pub fn new(
        after: Option<&str>,
        limit: usize,
        at: Option<Millis>,
        filter: &'a TokenFilter,
    ) -> Self {
        Self {
            after: after.map(str::to_owned),
            limit,
            at,
            filter,
            out: Vec::new(),
            done: limit == 0,
        }
    }

    /// The next page to read: the id it starts after, and how many rows at most; `None`
    /// when the answer is complete.
    pub fn next_page(&self) -> Option<(Option<&str>, usize)> {
        (!self.done && self.out.len() < self.limit)
            .then(|| (self.after.as_deref(), self.limit - self.out.len()))
    }

    /// The ids of a page's rows written after `at`, whose versions at `at` are to be read.
    pub fn written_since<'r>(&self, rows: &'r [Envelope]) -> Vec<&'r str> {
        match self.at {
            None => Vec::new(),
            Some(at) => rows
                .iter()
                .filter(|e| e.created_at > at)
                .map(|e| e.id.as_str())
                .collect(),
        }
    }

    /// A page read for [`Self::next_page`] (`want` rows at most), with the versions at `at`
    /// of its rows [`Self::written_since`].
    pub fn add(&mut self, want: usize, rows: Vec<Envelope>, older: Vec<Envelope>) {
        let full = rows.len() == want;
        let last = rows.last().map(|e| e.id.clone());
        match self.at {
            None => self.out.extend(rows),
            Some(at) => self
                .out
                .extend(meshql_core::page_as_of(rows, at, older, self.filter)),
        }
        match full {
            true => self.after = last,
            false => self.done = true,
        }
    }

    pub fn finish(self) -> Vec<Envelope> {
        self.out
    }
}
