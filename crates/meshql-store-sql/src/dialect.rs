//! What differs between the SQL databases in meshql's statements: the [`Dialect`] each store
//! crate implements. Text only: no I/O, no driver types.
//!
//! The statements are compiled once per template and shape and then cached by the stores,
//! so the dialect is used as a trait object (`&dyn Dialect`): dynamic dispatch happens at
//! compile time, never per request.

use crate::param::BindStyle;
use crate::param::Operand;
use meshql_core::template::CmpOp;
use meshql_core::{ArgValue, FieldPath};

/// How a relationship's template compiles an operand other than its key (in a batched
/// lookup or a level of a nested statement its arguments are unbound).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unbound {
    /// A parameter bound from no arguments: an argument binds NULL, an interpolation its
    /// text without the arguments, a list of items its rendered items (SQLite).
    BindEmpty,
    /// A NULL parameter; a list keeps its literal items only (PostgreSQL).
    NullParam,
    /// The text `NULL`; a list argument is an empty list, a list of items keeps its literal
    /// items (MySQL).
    NullLiteral,
}

/// How a read `at` a moment finds each document's version then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtStyle {
    /// Each row's version by a correlated `MAX(created_at)` (PostgreSQL, MySQL).
    Correlated,
    /// A latest version written by the moment is the one visible then, found without a
    /// lookup; only the documents changed since are looked up (SQLite, for its planner;
    /// needs numeric flags).
    Hybrid,
}

/// Who puts a search's rows in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowOrder {
    /// The statement's `ORDER BY` (SQLite, PostgreSQL).
    InSql,
    /// The caller: the statement returns each row's creation order first (its first
    /// column, `o` in a union) and no `ORDER BY`; the rows are sorted with
    /// [`crate::rules::sort_by_template`] (MySQL: sorting in MariaDB drags every payload
    /// through a filesort).
    ByCaller,
}

/// How a search and its relationships are one statement ([`crate::nested`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NestedStyle {
    /// The CTEs carry the payloads; the rows come out in order (PostgreSQL).
    PayloadInCtes,
    /// The CTEs carry row ids and keys only; payloads are joined in by primary key at the
    /// end, unordered (MySQL: MariaDB puts a materialised CTE holding payloads on disk).
    PayloadJoinedLast,
}

/// What differs between SQL databases in meshql's statements.
pub trait Dialect: Send + Sync + 'static {
    /// `Relation::backend` of this dialect's tables: relationships into tables of the same
    /// backend and database can be read with the search that leads to them.
    fn backend(&self) -> &'static str;

    // ---- lexical ----

    /// A quoted identifier.
    fn quote_ident(&self, name: &str) -> String;
    /// The placeholder of a search's parameter `n` (1-based: its index in
    /// `Compiled::params`): `?` or `$n`.
    fn placeholder(&self, n: usize) -> String;
    /// A constant condition: `1`/`0` or `true`/`false`.
    fn truth(&self, value: bool) -> &'static str;
    /// `cond` is not true (false or NULL): `$ne`, `$nin`.
    fn is_not_true(&self, cond: &str) -> String;
    /// A test of a boolean column (`set`: true): `t.latest = 1` or `t.latest`, `t.deleted =
    /// 0` or `NOT t.deleted`.
    fn flag(&self, column: &str, set: bool) -> String;
    /// `expr` as the planner does not match it to an index: `+expr` or `expr + 0`.
    fn unindexed(&self, expr: &str) -> String;

    // ---- binding ----

    /// How parameters are bound.
    fn bind_style(&self) -> BindStyle;
    /// How a relationship's unbound operands compile.
    fn unbound(&self) -> Unbound;

    // ---- predicates: the leaves (the recursion, the key and the unbound rules are
    // shared, in `cond`) ----

    /// The value of a field of the row aliased `alias`, as equalities and `$in` compare it.
    fn field(&self, path: &FieldPath, alias: &str) -> String;
    /// A SQL fragment's parameter (`as_text`: it stood in quotes in the fragment).
    fn fragment_param(&self, placeholder: String, as_text: bool) -> String {
        let _ = as_text;
        placeholder
    }
    /// `$eq`: `field = value` (its negation is `$ne`), the value an operand of the kind
    /// this gives, compared after the cast text this gives.
    fn eq_operand(&self) -> (crate::param::OperandKind, &'static str);
    /// `$gt`, `$gte`, `$lt`, `$lte`: only values of the same JSON type compare.
    fn range(
        &self,
        ops: &mut dyn Operand,
        path: &FieldPath,
        op: CmpOp,
        value: &ArgValue,
        alias: &str,
    ) -> String;
    /// `field IN list` over the list expression `list` (a parameter, or a key's list).
    fn in_list(&self, field: &str, list: &str) -> String;
    /// The list of one key: a relationship's key where its template has `{"$in": "{{id}}"}`.
    fn list_of_key(&self, key: &str) -> String;
    /// `$regex`.
    fn regex(
        &self,
        ops: &mut dyn Operand,
        path: &FieldPath,
        pattern: &ArgValue,
        ignore_case: bool,
        alias: &str,
    ) -> String;
    /// `$exists` of a payload field (present, JSON null included, or absent).
    fn exists(&self, path: &FieldPath, exists: bool, alias: &str) -> String;

    // ---- searches ----

    /// The columns a search selects of its rows `t` (after the key, in a batch).
    fn select_columns(&self) -> &'static str;
    /// The distinct keys of a batch, from the list parameter `placeholder`, as a row source
    /// aliased `k`.
    fn batch_keys(&self, placeholder: &str) -> String;
    /// The key's column in [`Self::batch_keys`]: `k.key` or `k.kv`.
    fn key_column(&self) -> &'static str;
    /// ` AND` the row `t` may be read with the tokens in parameter `placeholder` (none:
    /// anyone; else one of them).
    fn tokens_visible(&self, placeholder: &str) -> String;
    /// How a read `at` a moment finds each document's version then.
    fn at_style(&self) -> AtStyle;
    /// Who puts a search's rows in order.
    fn row_order(&self) -> RowOrder;
    /// Whether a search with a limit binds it in SQL (`LIMIT`); else the caller stops
    /// reading after the limit (a bound LIMIT makes SQLite prepare the statement again).
    fn limit_in_sql(&self) -> bool;
    /// The `ORDER BY` terms of one sort key (`dir`: `""` or `" DESC"`), each followed by
    /// `", "`: the JSON type's rank, then the value. Only with [`RowOrder::InSql`].
    fn sort_terms(&self, path: &FieldPath, dir: &str) -> String;

    // ---- nested statements ----

    /// How a search and its relationships are one statement; `None`: they are not (the
    /// store reads them level by level).
    fn nested(&self) -> Option<NestedStyle>;
    /// The distinct keys a level of a nested statement looks up, from the rows of CTE
    /// `r{parent}` (of table `parent_table`) through their `key_field` (`id`: the envelope
    /// id): a parenthesised subquery of one column, named as [`Self::key_column`] names it
    /// (`key` or `kv`).
    fn nested_keys(&self, parent: usize, parent_table: &str, key_field: &str) -> String {
        let _ = (parent, parent_table, key_field);
        unreachable!("a dialect with nested statements gives their keys")
    }
    /// A NULL of the keys' type (the search's own rows have no key).
    fn null_key(&self) -> &'static str {
        "NULL"
    }

    // ---- the table's own statements ([`crate::table::TableSql`]) ----

    /// Parameter `n` (1-based) of a table statement, where the dialect numbers placeholders
    /// (`?n`, `$n`); `None` where they are positional (`?`), bound in order of appearance.
    fn numbered(&self, n: usize) -> Option<String>;
    /// A column of JSON payload as text in a select list: `column` or `column::text`.
    fn payload_text(&self, column: &str) -> String {
        column.to_owned()
    }
    /// The rows `t` of the quoted table `table_q` whose ids are in the list parameter
    /// `placeholder`: `FROM ... WHERE ... AND` or `FROM ... JOIN ... WHERE`, followed by a
    /// condition.
    fn rows_of_ids(&self, table_q: &str, placeholder: &str) -> String;
    /// The index hint and the lock of the writer's read of an id's newest version.
    fn current_read(&self) -> (&'static str, &'static str) {
        ("", "")
    }
    /// The payload's value in an INSERT, from parameter `placeholder`.
    fn insert_payload(&self, placeholder: &str) -> String {
        placeholder.to_owned()
    }
    /// What an INSERT of a version returns (`""`: nothing).
    fn insert_returning(&self) -> &'static str {
        ""
    }
    /// Whether pages bind no LIMIT (the reader stops after the page) and write their values
    /// as expressions (`(p + 0)`, `(p || '')`) rather than bare parameters: a bound LIMIT,
    /// and bare values a planner reads at prepare time, make SQLite prepare the statement
    /// again whenever they change.
    fn page_unbound_limit(&self) -> bool {
        false
    }

    // ---- processor outputs ([`crate::outputs::OutputSql`]) ----

    /// A column of the outputs' tables, quoted where the dialect reserves its name.
    fn column(&self, name: &str) -> String {
        name.to_owned()
    }
    /// The tail of an INSERT that updates `update` instead where a row with the same
    /// `key` exists.
    fn upsert(&self, key: &[&str], update: &[&str]) -> String;
    /// The index hint of a read of a consumer's state rows by group.
    fn group_hint(&self) -> &'static str {
        ""
    }

    // ---- the table's schema ----

    /// The index (and, where needed, the generated column) that serves a template's
    /// filter on `path` (none for the envelope id).
    fn field_ddl(&self, table: &str, path: &FieldPath) -> Vec<String>;
    /// The indexes (or columns) that serve a template's range on `path`, beyond
    /// [`Self::field_ddl`]'s.
    fn range_ddl(&self, table: &str, path: &FieldPath) -> Vec<String> {
        let _ = (table, path);
        Vec::new()
    }
}
