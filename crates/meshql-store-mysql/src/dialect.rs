//! MySQL / MariaDB's [`Dialect`]: fields read from the generated columns `prepare` adds
//! (`f_<field>`: `JSON_UNQUOTE` text; `n_<field>`: the number, for ranges), compared with
//! text parameters; lists as JSON arrays read with `JSON_TABLE`; `$regex` with `REGEXP`.

use crate::sql::{field_text, field_type, json_path, number_column, quote_ident};
use meshql_core::template::CmpOp;
use meshql_core::{ArgValue, FieldPath};
use meshql_store_sql::dialect::{AtStyle, Dialect, NestedStyle, RowOrder, Unbound};
use meshql_store_sql::param::Operand;
use meshql_store_sql::param::{BindStyle, OperandKind};

pub(crate) struct MysqlDialect;

/// The dialect every statement of this crate is compiled with.
pub(crate) static DIALECT: MysqlDialect = MysqlDialect;

impl Dialect for MysqlDialect {
    fn backend(&self) -> &'static str {
        "mysql"
    }

    fn quote_ident(&self, name: &str) -> String {
        quote_ident(name)
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
        format!("({cond}) IS NOT TRUE")
    }

    fn flag(&self, column: &str, set: bool) -> String {
        format!("{column} = {}", set as u8)
    }

    fn unindexed(&self, expr: &str) -> String {
        format!("{expr} + 0")
    }

    fn bind_style(&self) -> BindStyle {
        crate::sql::BIND
    }

    fn unbound(&self) -> Unbound {
        Unbound::NullLiteral
    }

    /// The field's generated text column (created by `prepare` for every field a template
    /// uses), or `t.id`.
    fn field(&self, path: &FieldPath, _alias: &str) -> String {
        field_text(path)
    }

    fn eq_operand(&self) -> (OperandKind, &'static str) {
        (OperandKind::Text, "")
    }

    fn range(
        &self,
        ops: &mut dyn Operand,
        path: &FieldPath,
        op: CmpOp,
        value: &ArgValue,
        _alias: &str,
    ) -> String {
        let lhs = field_text(path);
        let o = op.sql();
        match path {
            FieldPath::Id => format!("({lhs} {o} {})", ops.operand(value, OperandKind::Str)),
            FieldPath::Payload(segments) => {
                // numbers: the numeric generated column (`range_column_ddl`); strings: the
                // text column (binary collation: code points)
                let ty = field_type(segments);
                let num = format!("t.{}", quote_ident(&number_column(segments)));
                let n = ops.operand(value, OperandKind::Num);
                let s = ops.operand(value, OperandKind::Str);
                format!(
                    "({num} {o} CAST({n} AS DOUBLE) \
                     OR ({ty} = 'STRING' AND {lhs} {o} {s}))"
                )
            }
        }
    }

    fn in_list(&self, field: &str, list: &str) -> String {
        format!(
            "{field} IN (SELECT j.v FROM JSON_TABLE({list}, '$[*]' COLUMNS (v VARCHAR(700) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) j)"
        )
    }

    fn list_of_key(&self, key: &str) -> String {
        format!("JSON_ARRAY({key})")
    }

    fn regex(
        &self,
        ops: &mut dyn Operand,
        path: &FieldPath,
        pattern: &ArgValue,
        ignore_case: bool,
        _alias: &str,
    ) -> String {
        let lhs = field_text(path);
        let p = ops.operand(pattern, OperandKind::Str);
        // the table's collation is binary: case-sensitive unless `(?i)`
        let p = if ignore_case {
            format!("CONCAT('(?i)', {p})")
        } else {
            p
        };
        match path {
            FieldPath::Id => format!("({lhs} REGEXP {p})"),
            FieldPath::Payload(segments) => {
                format!("({} = 'STRING' AND {lhs} REGEXP {p})", field_type(segments))
            }
        }
    }

    fn exists(&self, path: &FieldPath, exists: bool, _alias: &str) -> String {
        let FieldPath::Payload(segments) = path else {
            return self.truth(exists).to_owned();
        };
        format!(
            "{}JSON_CONTAINS_PATH(t.payload, 'one', '{}')",
            if exists { "" } else { "NOT " },
            json_path(segments)
        )
    }

    /// Creation order first (the rows are sorted by the caller).
    fn select_columns(&self) -> &'static str {
        "COALESCE(t.seq, t._id), t.id, t.payload"
    }

    /// The keys as one JSON array through `JSON_TABLE`, utf8mb4 and bytewise like the
    /// tables (a JSON_TABLE column otherwise takes the database's default character set,
    /// latin1 on a default MariaDB, and keys outside it never match); de-duplicated by the
    /// caller.
    fn batch_keys(&self, placeholder: &str) -> String {
        format!(
            "JSON_TABLE({placeholder}, '$[*]' COLUMNS (kv VARCHAR(700) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) k"
        )
    }

    fn key_column(&self) -> &'static str {
        "k.kv"
    }

    fn tokens_visible(&self, placeholder: &str) -> String {
        format!(
            " AND (JSON_LENGTH(t.authorized_tokens) = 0 OR JSON_OVERLAPS(t.authorized_tokens, {placeholder}))"
        )
    }

    fn at_style(&self) -> AtStyle {
        AtStyle::Correlated
    }

    /// Sorting in MariaDB drags every selected `payload` (a LONGTEXT) through a filesort,
    /// and in a JSON_TABLE join through an on-disk temporary table: the batched lookups of a
    /// depth-3 query ran ~2.3x slower that way.
    fn row_order(&self) -> RowOrder {
        RowOrder::ByCaller
    }

    fn limit_in_sql(&self) -> bool {
        false
    }

    /// The CTEs carry row numbers, ids and keys only; payloads are joined in by primary key
    /// at the end. MariaDB materialises a CTE read twice (by the relationship below it and
    /// by the result) and puts a temporary table holding a `payload` (LONGTEXT) on disk:
    /// three on-disk temporary tables per depth-3 query that way, 1.2 ms instead of 0.75 ms.
    fn nested(&self) -> Option<NestedStyle> {
        Some(NestedStyle::PayloadJoinedLast)
    }

    /// Strings as they are, numbers and booleans as text, anything else no key (as
    /// `meshql_core::nested::key_text`), read from the parent's payload joined by row id.
    fn nested_keys(&self, parent: usize, parent_table: &str, key_field: &str) -> String {
        if key_field == "id" {
            return format!("(SELECT DISTINCT p.id AS kv FROM r{parent} p)");
        }
        let path = format!("'$.\"{}\"'", key_field.replace(['\'', '"', '\\'], ""));
        format!(
            "(SELECT DISTINCT CAST(CASE WHEN JSON_TYPE(JSON_EXTRACT(pt.payload, {path})) IN \
             ('STRING', 'INTEGER', 'DOUBLE', 'BOOLEAN') \
             THEN JSON_UNQUOTE(JSON_EXTRACT(pt.payload, {path})) END AS CHAR(700)) AS kv \
             FROM r{parent} p JOIN {} pt ON pt._id = p.rid)",
            quote_ident(parent_table)
        )
    }

    fn null_key(&self) -> &'static str {
        "CAST(NULL AS CHAR(700))"
    }

    fn numbered(&self, _n: usize) -> Option<String> {
        None
    }

    /// The ids as one JSON array through `JSON_TABLE` (see [`Self::batch_keys`]), joined
    /// to the table.
    fn rows_of_ids(&self, table_q: &str, placeholder: &str) -> String {
        format!(
            "FROM {} JOIN {table_q} t ON t.id = k.kv WHERE",
            self.batch_keys(placeholder)
        )
    }

    /// By the `(latest, id)` index: the optimiser may take `(latest, deleted, seq, _id)`,
    /// which locks every latest row it passes, in an order that deadlocks writers.
    fn current_read(&self) -> (&'static str, &'static str) {
        (" FORCE INDEX (k_latest_id)", " FOR UPDATE")
    }

    /// `key`, `value`, `position` and `at` are reserved words.
    fn column(&self, name: &str) -> String {
        match name {
            "key" | "value" | "position" | "at" => format!("`{name}`"),
            _ => name.to_owned(),
        }
    }

    fn upsert(&self, _key: &[&str], update: &[&str]) -> String {
        let set: Vec<String> = update
            .iter()
            .map(|c| {
                let c = self.column(c);
                format!("{c} = VALUES({c})")
            })
            .collect();
        format!("ON DUPLICATE KEY UPDATE {}", set.join(", "))
    }

    fn group_hint(&self) -> &'static str {
        " FORCE INDEX (k_grp)"
    }

    /// A generated column of the field's text (`f_<field>`, `JSON_UNQUOTE`) and its index:
    /// MariaDB cannot index JSON expressions.
    fn field_ddl(&self, table: &str, path: &FieldPath) -> Vec<String> {
        crate::sql::field_column_ddl(table, path)
    }

    /// A generated column of the field's number (`n_<field>`, a DOUBLE) and its index.
    fn range_ddl(&self, table: &str, path: &FieldPath) -> Vec<String> {
        crate::sql::range_column_ddl(table, path)
    }

    fn sort_terms(&self, _path: &FieldPath, _dir: &str) -> String {
        unreachable!("MySQL's rows are sorted by the caller (RowOrder::ByCaller)")
    }
}
