//! SQL text for MySQL / MariaDB.

use meshql_core::FieldPath;
use meshql_store_sql::names::{self, IdentLimit};

pub(crate) fn quote_ident(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

/// MySQL's names: 64 characters (a longer one is an error there).
pub(crate) const IDENT_LIMIT: IdentLimit = IdentLimit::Chars(64);

/// The table a rebuild of `table` writes (`OutputStore::rebuild_store`), always the same.
pub(crate) fn rebuild_table(table: &str) -> String {
    names::rebuild_table(table, Some(IDENT_LIMIT))
}

/// The name the live table has for a moment during a swap, until it is dropped.
pub(crate) fn swapped_out_table(table: &str) -> String {
    names::shorten(table, "__old", IDENT_LIMIT)
}

/// The generated column holding a payload field's text.
pub(crate) fn field_column(path: &FieldPath) -> Option<String> {
    match path {
        FieldPath::Id => None,
        FieldPath::Payload(segments) => Some(format!("f_{}", segments.join("__"))),
    }
}

pub(crate) fn json_path(segments: &[String]) -> String {
    let mut p = String::from("$");
    for s in segments {
        p.push('.');
        p.push_str(s);
    }
    p
}

pub(crate) fn create_table(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (
            _id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
            id VARCHAR(255) NOT NULL,
            payload JSON NOT NULL,
            created_at BIGINT NOT NULL,
            deleted TINYINT(1) NOT NULL DEFAULT 0,
            authorized_tokens JSON NOT NULL,
            latest TINYINT(1) NOT NULL DEFAULT 1,
            seq BIGINT NULL,
            pos BIGINT NULL,
            correlation_id VARCHAR(255) NULL,
            UNIQUE KEY uq_id_created (id, created_at),
            UNIQUE KEY uq_pos (pos),
            KEY k_latest_id (latest, id),
            KEY k_current (latest, deleted, seq, _id),
            KEY k_created (created_at)
         ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
        quote_ident(table)
    )
}

/// The feed's clock: per table, the last position handed out (see `MysqlStore::changes`).
pub(crate) const CREATE_CLOCK: &str = "CREATE TABLE IF NOT EXISTS meshql_feed_clock (
    name VARCHAR(255) NOT NULL PRIMARY KEY,
    pos BIGINT NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin";

/// Brings a table created before the change feed up to date: the columns, and positions for
/// the versions it already holds (in row order), then the table's clock.
pub(crate) fn upgrade_for_feed(table: &str) -> Vec<String> {
    let t = quote_ident(table);
    vec![
        format!("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS pos BIGINT NULL"),
        format!("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS correlation_id VARCHAR(255) NULL"),
        format!("ALTER TABLE {t} ADD UNIQUE INDEX IF NOT EXISTS uq_pos (pos)"),
        // for reads `at` a moment (see `search`); tables created before it get it here
        format!("ALTER TABLE {t} ADD INDEX IF NOT EXISTS k_created (created_at)"),
        format!(
            "UPDATE {t} SET pos = _id + (SELECT COALESCE(MAX(p.pos), 0) FROM (SELECT pos FROM {t}) p) \
             WHERE pos IS NULL ORDER BY _id"
        ),
        format!(
            "INSERT IGNORE INTO meshql_feed_clock (name, pos) VALUES ({}, 0)",
            sql_string(table)
        ),
        format!(
            "UPDATE meshql_feed_clock SET pos = GREATEST(pos, \
             (SELECT COALESCE(MAX(pos), 0) FROM {t})) WHERE name = {}",
            sql_string(table)
        ),
    ]
}

/// A single-quoted SQL string literal (for names from validated config).
fn sql_string(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "''"))
}

/// The generated column and index for a filtered payload field.
pub(crate) fn field_column_ddl(table: &str, path: &FieldPath) -> Vec<String> {
    let (Some(col), FieldPath::Payload(segments)) = (field_column(path), path) else {
        return Vec::new();
    };
    let t = quote_ident(table);
    vec![
        format!(
            "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS {c} VARCHAR(700) \
             AS (JSON_UNQUOTE(JSON_EXTRACT(payload, '{p}'))) VIRTUAL",
            c = quote_ident(&col),
            p = json_path(segments)
        ),
        format!(
            "CREATE INDEX IF NOT EXISTS {i} ON {t} ({c})",
            i = quote_ident(&format!("idx_{col}")),
            c = quote_ident(&col)
        ),
    ]
}

/// The generated column holding a payload field's value when it is a number (NULL
/// otherwise), for ranges.
pub(crate) fn number_column(segments: &[String]) -> String {
    format!("n_{}", segments.join("__"))
}

/// The numeric generated column and its index for a field a template compares with a range
/// (the text column of [`field_column_ddl`] serves strings).
pub(crate) fn range_column_ddl(table: &str, path: &FieldPath) -> Vec<String> {
    let FieldPath::Payload(segments) = path else {
        return Vec::new();
    };
    let t = quote_ident(table);
    let col = number_column(segments);
    let p = json_path(segments);
    vec![
        format!(
            "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS {c} DOUBLE \
             AS (CASE WHEN JSON_TYPE(JSON_EXTRACT(payload, '{p}')) IN \
             ('INTEGER', 'UNSIGNED INTEGER', 'DOUBLE', 'DECIMAL') \
             THEN CAST(JSON_UNQUOTE(JSON_EXTRACT(payload, '{p}')) AS DOUBLE) END) VIRTUAL",
            c = quote_ident(&col),
        ),
        format!(
            "CREATE INDEX IF NOT EXISTS {i} ON {t} ({c})",
            i = quote_ident(&format!("idx_{col}")),
            c = quote_ident(&col)
        ),
    ]
}

use meshql_store_sql::param::{BindStyle, Bound, Lists, Scalars};
pub(crate) use meshql_store_sql::param::{Compiled, Shape};

/// How MySQL binds parameters: values as the text `JSON_UNQUOTE` reads, lists as JSON.
pub(crate) const BIND: BindStyle = BindStyle {
    scalars: Scalars::Text,
    lists: Lists::JsonText,
};

/// A bound value as mysql_async's.
pub(crate) fn to_driver(v: Bound) -> mysql_async::Value {
    match v {
        Bound::Null => mysql_async::Value::NULL,
        Bound::Int(i) => i.into(),
        Bound::UInt(u) => u.into(),
        Bound::Real(r) => r.into(),
        Bound::Text(s) => s.into(),
        Bound::TextList(items) => serde_json::to_string(&items)
            .expect("strings serialise")
            .into(),
    }
}

/// The text of a field: its generated column (created by `prepare` for every field a
/// template uses), or `t.id`.
pub(crate) fn field_text(path: &FieldPath) -> String {
    match field_column(path) {
        Some(c) => format!("t.{}", quote_ident(&c)),
        None => "t.id".to_owned(),
    }
}

/// `JSON_TYPE(JSON_EXTRACT(t.payload, '$.a'))`.
pub(crate) fn field_type(segments: &[String]) -> String {
    format!(
        "JSON_TYPE(JSON_EXTRACT(t.payload, '{}'))",
        json_path(segments)
    )
}
