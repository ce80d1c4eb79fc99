//! A search and every relationship below it as one statement
//! ([`meshql_core::StoreReader::find_nested`]): a CTE per relationship joining the distinct
//! keys of its parent's rows (what a batched lookup per level does, without the round trip
//! per level), then every row as `(relationship, key, id, payload, order)`, relationship 0
//! being the search itself and the others numbered depth first
//! ([`meshql_core::nested::relationship_parents`]); the store puts them back into a tree
//! with [`meshql_core::nested::assemble_text`]. Building JSON in the database instead
//! (`json_agg` in correlated subqueries) measured slower on wide trees.

use crate::cond::Builder;
use crate::dialect::{Dialect, NestedStyle};
use crate::param::{Compiled, Param, Shape};
use crate::search::{self, CREATION_ORDER, UNION_COLUMNS};
use meshql_core::nested::{join_levels, sorted, Level};
use meshql_core::{Millis, Nested, QueryTemplate, Search};

/// The relationships of a search as levels of one statement: when the store reads nested
/// statements (`enabled`), the search has relationships, the tree is not sorted (one
/// statement returns creation order: sorted trees go level by level) and every
/// relationship is a table of this database (`database`, [`meshql_core::Relation`]).
pub fn nested_levels<'a>(
    d: &dyn Dialect,
    enabled: bool,
    template: &QueryTemplate,
    nested: &'a [Nested],
    database: usize,
) -> Option<Vec<Level<'a>>> {
    if !enabled || d.nested().is_none() || nested.is_empty() || sorted(template, nested) {
        return None;
    }
    join_levels(nested, d.backend(), database)
}

/// A search and its relationships read as one statement: the relationships as levels,
/// and the statement's shape.
pub struct NestedPlan<'a> {
    pub levels: Vec<Level<'a>>,
    pub shape: Shape,
}

/// The plan of a nested read ([`nested_levels`]), `None` when it is read level by level:
/// the search's limit is kept in SQL (the search's CTE keeps its first rows), `at` and
/// `tokens` as the search's.
pub fn nested_plan<'a>(
    d: &dyn Dialect,
    enabled: bool,
    search: &Search<'_>,
    nested: &'a [Nested],
    database: usize,
    at: Option<Millis>,
    tokens: bool,
) -> Option<NestedPlan<'a>> {
    let levels = nested_levels(d, enabled, search.template, nested, database)?;
    let shape = Shape {
        at: at.is_some(),
        tokens,
        limit: search.limit.is_some(),
        batch: false,
    };
    Some(NestedPlan { levels, shape })
}

/// The nested statement of a search of `table` and its relationships `levels`. With
/// `shape.limit`, the search's CTE keeps its first rows in creation order, so relationships
/// are looked up for those alone.
pub fn nested_search(
    d: &dyn Dialect,
    table: &str,
    template: &QueryTemplate,
    shape: Shape,
    levels: &[Level<'_>],
) -> Compiled {
    let style = d
        .nested()
        .expect("a dialect without nested statements never compiles one");
    let mut b = Builder::new(d);
    let mut root = match (style, shape.at && !template.selects_by_id()) {
        (NestedStyle::PayloadInCtes, true) => format!(
            "r0 AS (SELECT t.id, t.payload, {CREATION_ORDER} AS o FROM ({}) t",
            search::current_at(&mut b, table, template, shape.tokens, UNION_COLUMNS)
        ),
        (NestedStyle::PayloadJoinedLast, true) => format!(
            "r0 AS (SELECT u.t_id AS rid, u.id, u.o FROM ({}) u",
            search::current_at(
                &mut b,
                table,
                template,
                shape.tokens,
                &format!("{CREATION_ORDER} AS o, t.id, t._id AS t_id")
            )
        ),
        (style, false) => {
            let columns = match style {
                NestedStyle::PayloadInCtes => "t.id, t.payload",
                NestedStyle::PayloadJoinedLast => "t._id AS rid, t.id",
            };
            let mut root = format!(
                "r0 AS (SELECT {columns}, {CREATION_ORDER} AS o FROM {} t WHERE ",
                d.quote_ident(table)
            );
            root.push_str(&b.predicate(template, "t", None, true));
            root.push_str(" AND ");
            root.push_str(&search::visible(&mut b, table, shape));
            root
        }
    };
    if shape.limit {
        let n = b.push(Param::Limit);
        root.push_str(&format!(" ORDER BY o LIMIT {n}"));
    }
    root.push(')');
    let mut w = Walk {
        b,
        ctes: vec![root],
        tables: vec![table.to_owned()],
        style,
        shape,
    };
    w.walk(levels, 0);
    let Walk {
        b, ctes, tables, ..
    } = w;
    let rows: Vec<String> = tables
        .iter()
        .enumerate()
        .map(|(i, table)| {
            let key = match (i, style) {
                (0, _) => d.null_key(),
                (_, NestedStyle::PayloadInCtes) => "key",
                (_, NestedStyle::PayloadJoinedLast) => "x.kv",
            };
            match style {
                NestedStyle::PayloadInCtes => {
                    format!("SELECT {i} AS r, {key} AS key, id, payload::text, o FROM r{i}")
                }
                NestedStyle::PayloadJoinedLast => format!(
                    "SELECT {i} AS r, {key} AS kv, x.id, t.payload, x.o FROM r{i} x \
                     JOIN {} t ON t._id = x.rid",
                    d.quote_ident(table)
                ),
            }
        })
        .collect();
    let order = match style {
        NestedStyle::PayloadInCtes => " ORDER BY r, o",
        NestedStyle::PayloadJoinedLast => "",
    };
    b.finish(format!(
        "WITH {} {}{order}",
        ctes.join(", "),
        rows.join(" UNION ALL ")
    ))
}

/// The CTEs of a nested statement, as its relationships are walked depth first.
struct Walk<'d> {
    b: Builder<'d>,
    ctes: Vec<String>,
    /// The table of each CTE.
    tables: Vec<String>,
    style: NestedStyle,
    shape: Shape,
}

impl Walk<'_> {
    fn walk(&mut self, levels: &[Level<'_>], parent: usize) {
        let d = self.b.dialect();
        for level in levels {
            let me = self.ctes.len();
            let key = d.key_column();
            let columns = match self.style {
                NestedStyle::PayloadInCtes => "t.id, t.payload",
                NestedStyle::PayloadJoinedLast => "t._id AS rid, t.id",
            };
            let mut cte = format!(
                "r{me} AS (SELECT {key}, {columns}, {CREATION_ORDER} AS o FROM {} k JOIN {} t ON ",
                d.nested_keys(parent, &self.tables[parent], level.key_field),
                d.quote_ident(&level.table)
            );
            cte.push_str(&self.b.predicate(level.template, "t", Some(key), false));
            cte.push_str(" WHERE ");
            cte.push_str(&search::visible(&mut self.b, &level.table, self.shape));
            cte.push(')');
            self.ctes.push(cte);
            self.tables.push(level.table.clone());
            self.walk(&level.children, me);
        }
    }
}
