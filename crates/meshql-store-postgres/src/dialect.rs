//! PostgreSQL's [`Dialect`]: JSONB read as text (`->>`, `#>>`) and compared with text
//! parameters, numbers through `jsonb` (exact), strings in code-point order (`COLLATE "C"`),
//! lists as `text[]`, `$regex` with `~` in the PCRE-like `(?p)` mode.

use crate::sql::{json_text, json_value};
use meshql_core::template::CmpOp;
use meshql_core::{ArgValue, FieldPath};
use meshql_store_sql::dialect::{AtStyle, Dialect, NestedStyle, RowOrder, Unbound};
use meshql_store_sql::param::Operand;
use meshql_store_sql::param::{BindStyle, OperandKind};

pub(crate) struct PostgresDialect;

/// The dialect every statement of this crate is compiled with.
pub(crate) static DIALECT: PostgresDialect = PostgresDialect;

impl Dialect for PostgresDialect {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    fn quote_ident(&self, name: &str) -> String {
        crate::sql::quote_ident(name)
    }

    fn placeholder(&self, n: usize) -> String {
        format!("${n}")
    }

    fn truth(&self, value: bool) -> &'static str {
        if value {
            "true"
        } else {
            "false"
        }
    }

    fn is_not_true(&self, cond: &str) -> String {
        format!("({cond}) IS NOT TRUE")
    }

    fn flag(&self, column: &str, set: bool) -> String {
        if set {
            column.to_owned()
        } else {
            format!("NOT {column}")
        }
    }

    fn unindexed(&self, expr: &str) -> String {
        format!("{expr} + 0")
    }

    fn bind_style(&self) -> BindStyle {
        crate::sql::BIND
    }

    fn unbound(&self) -> Unbound {
        Unbound::NullParam
    }

    fn field(&self, path: &FieldPath, alias: &str) -> String {
        json_text(path, alias)
    }

    fn fragment_param(&self, placeholder: String, as_text: bool) -> String {
        if as_text {
            placeholder + "::text"
        } else {
            placeholder
        }
    }

    fn eq_operand(&self) -> (OperandKind, &'static str) {
        (OperandKind::Pattern, "::text")
    }

    fn range(
        &self,
        ops: &mut dyn Operand,
        path: &FieldPath,
        op: CmpOp,
        value: &ArgValue,
        alias: &str,
    ) -> String {
        let lhs = json_text(path, alias);
        let o = op.sql();
        let s = ops.operand(value, OperandKind::Str);
        match path {
            FieldPath::Id => format!("({lhs} COLLATE \"C\" {o} {s}::text)"),
            FieldPath::Payload(_) => {
                let n = ops.operand(value, OperandKind::Num);
                let j = json_value(path, alias);
                // each branch can use an index of `prepare` (see `create_range_indexes`):
                // JSONB orders numbers numerically, and the type test drops the other types
                // it orders around them
                format!(
                    "((jsonb_typeof({j}) = 'number' AND {j} {o} to_jsonb({n}::text::numeric)) \
                     OR (jsonb_typeof({j}) = 'string' AND {lhs} COLLATE \"C\" {o} {s}::text))"
                )
            }
        }
    }

    fn in_list(&self, field: &str, list: &str) -> String {
        format!("{field} = ANY({list}::text[])")
    }

    fn list_of_key(&self, key: &str) -> String {
        format!("ARRAY[{key}]")
    }

    fn regex(
        &self,
        ops: &mut dyn Operand,
        path: &FieldPath,
        pattern: &ArgValue,
        ignore_case: bool,
        alias: &str,
    ) -> String {
        let lhs = json_text(path, alias);
        let p = ops.operand(pattern, OperandKind::Pattern);
        let op = if ignore_case { "~*" } else { "~" };
        // `(?p)`: `.` does not match a newline, as in Rust and PCRE
        let guard = match path {
            FieldPath::Id => String::new(),
            FieldPath::Payload(_) => {
                format!("jsonb_typeof({}) = 'string' AND ", json_value(path, alias))
            }
        };
        format!("({guard}{lhs} {op} ('(?p)' || {p}::text))")
    }

    fn exists(&self, path: &FieldPath, exists: bool, alias: &str) -> String {
        format!(
            "{} IS {}NULL",
            json_value(path, alias),
            if exists { "NOT " } else { "" }
        )
    }

    fn select_columns(&self) -> &'static str {
        "t.id, t.payload::text"
    }

    fn batch_keys(&self, placeholder: &str) -> String {
        format!("(SELECT DISTINCT unnest({placeholder}::text[]) AS key) k")
    }

    fn key_column(&self) -> &'static str {
        "k.key"
    }

    fn tokens_visible(&self, placeholder: &str) -> String {
        format!(
            " AND (cardinality(t.authorized_tokens) = 0 OR t.authorized_tokens && {placeholder}::text[])"
        )
    }

    fn at_style(&self) -> AtStyle {
        AtStyle::Correlated
    }

    fn row_order(&self) -> RowOrder {
        RowOrder::InSql
    }

    fn limit_in_sql(&self) -> bool {
        true
    }

    fn nested(&self) -> Option<NestedStyle> {
        Some(NestedStyle::PayloadInCtes)
    }

    /// Strings as they are, numbers and booleans as text, anything else no key.
    fn nested_keys(&self, parent: usize, _parent_table: &str, key_field: &str) -> String {
        let key = if key_field == "id" {
            "p.id".to_owned()
        } else {
            let f = key_field.replace('\'', "''");
            format!(
                "CASE WHEN jsonb_typeof(p.payload->'{f}') IN ('string', 'number', 'boolean') \
                 THEN p.payload->>'{f}' END"
            )
        };
        format!("(SELECT DISTINCT {key} AS key FROM r{parent} p)")
    }

    fn null_key(&self) -> &'static str {
        "NULL::text"
    }

    fn numbered(&self, n: usize) -> Option<String> {
        Some(format!("${n}"))
    }

    fn payload_text(&self, column: &str) -> String {
        format!("{column}::text")
    }

    fn rows_of_ids(&self, table_q: &str, placeholder: &str) -> String {
        format!("FROM {table_q} t WHERE t.id = ANY({placeholder}::text[]) AND")
    }

    fn insert_payload(&self, placeholder: &str) -> String {
        format!("{placeholder}::text::jsonb")
    }

    /// The payload as PostgreSQL stores it (jsonb normalises the text, R12).
    fn insert_returning(&self) -> &'static str {
        " RETURNING payload::text"
    }

    fn upsert(&self, key: &[&str], update: &[&str]) -> String {
        let set: Vec<String> = update
            .iter()
            .map(|c| format!("{c} = EXCLUDED.{c}"))
            .collect();
        format!(
            "ON CONFLICT ({}) DO UPDATE SET {}",
            key.join(", "),
            set.join(", ")
        )
    }

    fn field_ddl(&self, table: &str, path: &FieldPath) -> Vec<String> {
        crate::sql::create_field_index(table, path)
            .into_iter()
            .collect()
    }

    fn range_ddl(&self, table: &str, path: &FieldPath) -> Vec<String> {
        crate::sql::create_range_indexes(table, path)
    }

    /// The JSON type's rank, then numbers as `numeric`, then other values' text in
    /// code-point order.
    fn sort_terms(&self, path: &FieldPath, dir: &str) -> String {
        match path {
            FieldPath::Id => format!("t.id COLLATE \"C\"{dir}, "),
            path => {
                let j = json_value(path, "t");
                let l = json_text(path, "t");
                format!(
                    "CASE jsonb_typeof({j}) WHEN 'number' THEN 1 WHEN 'string' THEN 2 \
                     WHEN 'object' THEN 3 WHEN 'array' THEN 4 WHEN 'boolean' THEN 5 ELSE 0 END{dir}, \
                     CASE WHEN jsonb_typeof({j}) = 'number' THEN {l}::numeric END{dir}, \
                     CASE WHEN jsonb_typeof({j}) <> 'number' THEN {l} END COLLATE \"C\"{dir}, "
                )
            }
        }
    }
}
