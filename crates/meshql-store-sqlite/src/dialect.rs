//! SQLite's [`Dialect`]: JSON through `json_extract`, values compared typed, lists as JSON
//! arrays read with `json_each`, `$regex` through the `meshql_regexp` function this crate
//! registers on every connection (`db.rs`).

use crate::sql::{json_extract, json_type};
use meshql_core::template::CmpOp;
use meshql_core::{ArgValue, FieldPath};
use meshql_store_sql::dialect::{AtStyle, Dialect, NestedStyle, RowOrder, Unbound};
use meshql_store_sql::param::Operand;
use meshql_store_sql::param::{BindStyle, OperandKind};

pub(crate) struct SqliteDialect;

/// The dialect every statement of this crate is compiled with.
pub(crate) static DIALECT: SqliteDialect = SqliteDialect;

impl Dialect for SqliteDialect {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    fn quote_ident(&self, name: &str) -> String {
        crate::sql::quote_ident(name)
    }

    fn placeholder(&self, _n: usize) -> String {
        "?".to_owned()
    }

    fn truth(&self, value: bool) -> &'static str {
        if value {
            "1"
        } else {
            "0"
        }
    }

    fn is_not_true(&self, cond: &str) -> String {
        format!("({cond}) IS NOT 1")
    }

    fn flag(&self, column: &str, set: bool) -> String {
        format!("{column} = {}", set as u8)
    }

    fn unindexed(&self, expr: &str) -> String {
        format!("+{expr}")
    }

    fn bind_style(&self) -> BindStyle {
        crate::sql::BIND
    }

    fn unbound(&self) -> Unbound {
        Unbound::BindEmpty
    }

    fn field(&self, path: &FieldPath, alias: &str) -> String {
        json_extract(path, &format!("{alias}.payload"))
    }

    fn eq_operand(&self) -> (OperandKind, &'static str) {
        (OperandKind::Value, "")
    }

    /// The type classes compared, then the values: `json_extract` orders numbers before
    /// text, and the class test drops the other types.
    fn range(
        &self,
        ops: &mut dyn Operand,
        path: &FieldPath,
        op: CmpOp,
        value: &ArgValue,
        alias: &str,
    ) -> String {
        let lhs = self.field(path, alias);
        let class = ops.operand(value, OperandKind::Class);
        let class_of = match path {
            FieldPath::Id => "'s'".to_owned(),
            FieldPath::Payload(_) => format!(
                "(CASE {} WHEN 'integer' THEN 'n' WHEN 'real' THEN 'n' WHEN 'text' THEN 's' END)",
                json_type(path, alias)
            ),
        };
        let rhs = ops.operand(value, OperandKind::Value);
        format!("({class_of} = {class} AND {lhs} {} {rhs})", op.sql())
    }

    fn in_list(&self, field: &str, list: &str) -> String {
        format!("{field} IN (SELECT value FROM json_each({list}))")
    }

    fn list_of_key(&self, key: &str) -> String {
        format!("json_array({key})")
    }

    fn regex(
        &self,
        ops: &mut dyn Operand,
        path: &FieldPath,
        pattern: &ArgValue,
        ignore_case: bool,
        alias: &str,
    ) -> String {
        let lhs = self.field(path, alias);
        let pattern = ops.operand(pattern, OperandKind::Value);
        format!("meshql_regexp({pattern}, {lhs}, {})", ignore_case as u8)
    }

    fn exists(&self, path: &FieldPath, exists: bool, alias: &str) -> String {
        format!(
            "{} IS {}NULL",
            json_type(path, alias),
            if exists { "NOT " } else { "" }
        )
    }

    fn select_columns(&self) -> &'static str {
        "t.id, t.payload"
    }

    fn batch_keys(&self, placeholder: &str) -> String {
        format!("(SELECT DISTINCT value AS key FROM json_each({placeholder})) k")
    }

    fn key_column(&self) -> &'static str {
        "k.key"
    }

    fn tokens_visible(&self, placeholder: &str) -> String {
        format!(
            " AND (t.authorized_tokens = '[]' OR EXISTS (SELECT 1 FROM json_each(t.authorized_tokens) a \
             WHERE a.value IN (SELECT value FROM json_each({placeholder}))))"
        )
    }

    /// Chosen for SQLite's planner: see [`AtStyle::Hybrid`] (GraphQL reads every level at
    /// its request's start, a moment just past).
    fn at_style(&self) -> AtStyle {
        AtStyle::Hybrid
    }

    fn row_order(&self) -> RowOrder {
        RowOrder::InSql
    }

    /// No `LIMIT ?`: a bound LIMIT makes SQLite prepare the statement again on every run;
    /// the caller stops reading after `limit` rows instead.
    fn limit_in_sql(&self) -> bool {
        false
    }

    /// None: a search and its relationships run as the searches and batched lookups of
    /// each level, in one read transaction (`store/nested.rs`).
    fn nested(&self) -> Option<NestedStyle> {
        None
    }

    fn numbered(&self, n: usize) -> Option<String> {
        Some(format!("?{n}"))
    }

    fn rows_of_ids(&self, table_q: &str, placeholder: &str) -> String {
        format!("FROM {table_q} t WHERE t.id IN (SELECT value FROM json_each({placeholder})) AND")
    }

    /// No bound LIMIT (a LIMIT whose value changed makes SQLite prepare the statement
    /// again): the index walk is in id order, so the reader stops after the page at no cost.
    /// `(?at + 0)` and `(?after || '')`: the same values, but not bare parameters, which
    /// SQLite's STAT4 planner reads at prepare time once `PRAGMA optimize` has analysed the
    /// table — and then prepares the statement again whenever they change (every page).
    fn page_unbound_limit(&self) -> bool {
        true
    }

    fn upsert(&self, key: &[&str], update: &[&str]) -> String {
        let set: Vec<String> = update
            .iter()
            .map(|c| format!("{c} = excluded.{c}"))
            .collect();
        format!(
            "ON CONFLICT ({}) DO UPDATE SET {}",
            key.join(", "),
            set.join(", ")
        )
    }

    /// An expression index per filtered field (it serves ranges too).
    fn field_ddl(&self, table: &str, path: &FieldPath) -> Vec<String> {
        crate::sql::create_field_index(table, path)
            .into_iter()
            .collect()
    }

    fn sort_terms(&self, path: &FieldPath, dir: &str) -> String {
        match path {
            FieldPath::Id => format!("t.id{dir}, "),
            path => format!(
                "CASE {} WHEN 'integer' THEN 1 WHEN 'real' THEN 1 WHEN 'text' THEN 2 \
                 WHEN 'object' THEN 3 WHEN 'array' THEN 4 WHEN 'true' THEN 5 WHEN 'false' THEN 5 \
                 ELSE 0 END{dir}, {}{dir}, ",
                json_type(path, "t"),
                json_extract(path, "t.payload")
            ),
        }
    }
}

/// The statement of a search (or of a batched search when `shape.batch`).
pub(crate) fn search(
    table: &str,
    template: &meshql_core::QueryTemplate,
    shape: meshql_store_sql::param::Shape,
) -> meshql_store_sql::param::Compiled {
    meshql_store_sql::search::search(&DIALECT, table, template, shape)
}
