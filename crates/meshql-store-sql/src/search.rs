//! A search's statement: the rows of a table a template matches, visible now or `at` a
//! moment, to the caller's tokens; or, batched, the rows of several keys of a relationship.

use crate::cond::Builder;
use crate::dialect::{AtStyle, Dialect, RowOrder};
use crate::param::{Compiled, Param, Shape};
use meshql_core::QueryTemplate;

/// A row's place in creation order: its first version's row id.
pub const CREATION_ORDER: &str = "COALESCE(t.seq, t._id)";

/// Creation order: documents in the order they were first created (`seq` is the row id of
/// a document's first version, NULL on that first version itself).
pub const ORDER: &str = " ORDER BY COALESCE(t.seq, t._id)";

/// The columns of the union [`current_at`] reads, where it is a subquery aliased `t`.
pub const UNION_COLUMNS: &str = "t.id, t.payload, t.seq, t._id";

/// The statement of a search (or of a batched search when `shape.batch`).
///
/// A search `at` a moment that is neither a batch nor a lookup by id (which reads the id's
/// versions alone) reads in two parts ([`current_at`]). A LIMIT is bound when
/// `shape.limit` (which a store sets only where [`Dialect::limit_in_sql`]).
pub fn search(d: &dyn Dialect, table: &str, template: &QueryTemplate, shape: Shape) -> Compiled {
    let mut b = Builder::new(d);
    let t = d.quote_ident(table);
    let columns = d.select_columns();
    let mut sql;
    if shape.batch {
        let keys = b.push(Param::Keys);
        let key = d.key_column();
        sql = format!(
            "SELECT {key}, {columns} FROM {} JOIN {t} t ON ",
            d.batch_keys(&keys)
        );
        sql.push_str(&b.predicate(template, "t", Some(key), false));
        sql.push_str(" WHERE ");
        sql.push_str(&visible(&mut b, table, shape));
    } else if shape.at && !template.selects_by_id() {
        sql = match d.row_order() {
            RowOrder::InSql => format!(
                "SELECT {columns} FROM ({}) t",
                current_at(&mut b, table, template, shape.tokens, UNION_COLUMNS)
            ),
            RowOrder::ByCaller => {
                let columns = format!("{CREATION_ORDER} AS o, t.id, t.payload");
                current_at(&mut b, table, template, shape.tokens, &columns)
            }
        };
    } else {
        sql = format!("SELECT {columns} FROM {t} t WHERE ");
        sql.push_str(&b.predicate(template, "t", None, true));
        sql.push_str(" AND ");
        sql.push_str(&visible(&mut b, table, shape));
    }
    if d.row_order() == RowOrder::InSql {
        sql.push_str(&order_by(d, template));
    }
    if shape.limit {
        let n = b.push(Param::Limit);
        sql.push_str(&format!(" LIMIT {n}"));
    }
    b.finish(sql)
}

/// `ORDER BY` of a search: the template's sort keys (type rank, then value), then creation
/// order.
fn order_by(d: &dyn Dialect, template: &QueryTemplate) -> String {
    let keys = template.sort();
    if keys.is_empty() {
        return ORDER.to_owned();
    }
    let mut out = String::from(" ORDER BY ");
    for k in keys {
        let dir = if k.descending { " DESC" } else { "" };
        out.push_str(&d.sort_terms(&k.path, dir));
    }
    out.push_str(CREATION_ORDER);
    out
}

/// The rows `t` of `table` a search of `shape` sees: visible now or `at` a moment, and
/// to the caller's tokens.
pub fn visible(b: &mut Builder<'_>, table: &str, shape: Shape) -> String {
    let mut out = visibility(b, table, shape.at);
    if shape.tokens {
        out.push_str(&tokens(b));
    }
    out
}

/// `t` is the visible version of its id: the latest (or the newest at `at`), not a
/// tombstone.
///
/// [`AtStyle::Hybrid`]: at a moment, a latest version written at or before it is the one
/// visible then, found without a lookup; only the versions of documents changed since the
/// moment (the ids of the versions after it, one range of the `created_at` index per
/// statement, usually empty for a moment just past) are checked against the newest version
/// at the moment, a lookup per candidate row.
pub fn visibility(b: &mut Builder<'_>, table: &str, at: bool) -> String {
    let d = b.dialect();
    if !at {
        return format!(
            "{} AND {}",
            d.flag("t.latest", true),
            d.flag("t.deleted", false)
        );
    }
    match d.at_style() {
        AtStyle::Correlated => correlated(b, table),
        AtStyle::Hybrid => {
            let (before, after) = (b.push(Param::At), b.push(Param::At));
            format!(
                "{} AND (({} AND {} <= {before}) OR \
                 (t.id IN (SELECT c.id FROM {} c WHERE c.created_at > {after}) AND {}))",
                d.flag("t.deleted", false),
                d.flag(&d.unindexed("t.latest"), true),
                d.unindexed("t.created_at"),
                d.quote_ident(table),
                version_at(b, table)
            )
        }
    }
}

/// `t` is the newest version of its id at `at`, not a tombstone.
fn correlated(b: &mut Builder<'_>, table: &str) -> String {
    let not_deleted = b.dialect().flag("t.deleted", false);
    format!("{not_deleted} AND {}", version_at(b, table))
}

/// `t` is the newest version of its id at `at` (tombstone or not).
fn version_at(b: &mut Builder<'_>, table: &str) -> String {
    let at = b.push(Param::At);
    version_at_text(&b.dialect().quote_ident(table), &at)
}

/// `t` is the newest version of its id at the time in parameter `at` (tombstone or not),
/// in the quoted table `table_q`.
pub(crate) fn version_at_text(table_q: &str, at: &str) -> String {
    format!(
        "t.created_at = (SELECT MAX(v.created_at) FROM {table_q} v WHERE v.id = t.id AND v.created_at <= {at})"
    )
}

/// ` AND` the row `t` may be read with the caller's tokens.
pub fn tokens(b: &mut Builder<'_>) -> String {
    let p = b.push(Param::Tokens);
    b.dialect().tokens_visible(&p)
}

/// The documents a search's template matches `at` a moment, as `SELECT {columns} ... UNION
/// ALL SELECT {columns} ...` over rows aliased `t`: in two parts, so that the cost follows
/// the current documents and the versions written after the moment, not every version ever
/// stored (an `at` close to now is what every GraphQL request reads with):
/// - documents unchanged since the moment: their latest version, through the same indexes as
///   a read of the latest ([`Dialect::unindexed`]: not through the `created_at` index, which
///   would visit every version up to the moment);
/// - documents changed since (the ids of the versions after the moment, through the
///   `created_at` index): the version each had at the moment, if any.
///
/// The two cannot overlap (a document changed since has a latest version after the moment),
/// and together they are exactly the documents visible at the moment.
pub fn current_at(
    b: &mut Builder<'_>,
    table: &str,
    template: &QueryTemplate,
    with_tokens: bool,
    columns: &str,
) -> String {
    let d = b.dialect();
    let t = d.quote_ident(table);
    let mut sql = format!("SELECT {columns} FROM {t} t WHERE ");
    sql.push_str(&b.predicate(template, "t", None, true));
    let at = b.push(Param::At);
    sql.push_str(&format!(
        " AND {} AND {} AND {} <= {at}",
        d.flag("t.latest", true),
        d.flag("t.deleted", false),
        d.unindexed("t.created_at")
    ));
    if with_tokens {
        sql.push_str(&tokens(b));
    }
    sql.push_str(&format!(" UNION ALL SELECT {columns} FROM {t} t WHERE "));
    sql.push_str(&b.predicate(template, "t", None, true));
    let at = b.push(Param::At);
    sql.push_str(&format!(
        " AND t.id IN (SELECT c.id FROM {t} c WHERE c.created_at > {at}) AND "
    ));
    sql.push_str(&correlated(b, table));
    if with_tokens {
        sql.push_str(&tokens(b));
    }
    sql
}
