//! SQL text for an entity table: DDL, and the statements that reads and searches run.
//!
//! Statement texts depend only on the table, the template and which optional clauses are
//! present (time, tokens, limit, batch), never on argument values, so every one of them is
//! prepared once per connection and cached.

use meshql_core::FieldPath;
use rusqlite::types::Value as SqlValue;

/// A double-quoted SQL identifier.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `json_extract(payload, '$.a.b')` with segments quoted when they need it. Paths come from
/// validated config (identifier characters only).
pub(crate) fn json_extract(path: &FieldPath, column: &str) -> String {
    match path {
        FieldPath::Id => column.replace("payload", "id"),
        FieldPath::Payload(segments) => {
            let mut p = String::from("$");
            for s in segments {
                if s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    p.push('.');
                    p.push_str(s);
                } else {
                    p.push_str(&format!(".\"{s}\""));
                }
            }
            format!("json_extract({column}, '{p}')")
        }
    }
}

pub(crate) fn create_table(table: &str) -> String {
    let t = quote_ident(table);
    let current = quote_ident(&format!("{table}_current"));
    let latest = quote_ident(&format!("{table}_id_latest"));
    let created = quote_ident(&format!("{table}_created"));
    format!(
        "CREATE TABLE IF NOT EXISTS {t} (
            _id INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL,
            payload TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            deleted INTEGER NOT NULL DEFAULT 0,
            authorized_tokens TEXT NOT NULL DEFAULT '[]',
            latest INTEGER NOT NULL DEFAULT 1,
            seq INTEGER,
            correlation_id TEXT,
            UNIQUE(id, created_at)
         );
         CREATE INDEX IF NOT EXISTS {current} ON {t}(COALESCE(seq, _id)) WHERE latest = 1 AND deleted = 0;
         CREATE INDEX IF NOT EXISTS {latest} ON {t}(id) WHERE latest = 1;
         CREATE INDEX IF NOT EXISTS {created} ON {t}(created_at);"
    )
}

/// Columns added after a table's first release, as `(name, definition)`: tables created
/// earlier get them at start-up.
pub(crate) const ADDED_COLUMNS: &[(&str, &str)] = &[("correlation_id", "TEXT")];

/// An expression index for a payload field that templates filter on.
pub(crate) fn create_field_index(table: &str, path: &FieldPath) -> Option<String> {
    let FieldPath::Payload(segments) = path else {
        return None;
    };
    let name = quote_ident(&format!("idx_{table}_{}", segments.join("_")));
    Some(format!(
        "CREATE INDEX IF NOT EXISTS {name} ON {}({})",
        quote_ident(table),
        json_extract(path, "payload")
    ))
}

use meshql_store_sql::param::{BindStyle, Bound, Lists, Scalars};
pub(crate) use meshql_store_sql::param::{Compiled, Shape};

/// How SQLite binds parameters: values typed as `json_extract` returns them, lists as JSON.
pub(crate) const BIND: BindStyle = BindStyle {
    scalars: Scalars::Typed,
    lists: Lists::JsonText,
};

/// `json_type(t.payload, '$.a')`: NULL when the field is missing, `'null'` for JSON null.
pub(crate) fn json_type(path: &FieldPath, alias: &str) -> String {
    json_extract(path, &format!("{alias}.payload")).replacen("json_extract(", "json_type(", 1)
}

/// A bound value as rusqlite's.
pub(crate) fn to_driver(v: Bound) -> SqlValue {
    match v {
        Bound::Null => SqlValue::Null,
        Bound::Int(i) => SqlValue::Integer(i),
        Bound::UInt(u) => SqlValue::Integer(i64::try_from(u).unwrap_or(i64::MAX)),
        Bound::Real(r) => SqlValue::Real(r),
        Bound::Text(s) => SqlValue::Text(s),
        Bound::TextList(items) => {
            SqlValue::Text(serde_json::to_string(&items).expect("strings serialise"))
        }
    }
}
