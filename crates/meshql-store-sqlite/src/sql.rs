//! SQL text for an entity table: DDL, and the statements that reads and searches run.
//!
//! Statement texts depend only on the table, the template and which optional clauses are
//! present (time, tokens, limit, batch), never on argument values, so every one of them is
//! prepared once per connection and cached.

use crate::dialect::DIALECT;
use meshql_core::{FieldPath, QueryTemplate};
use meshql_store_sql::cond::Builder;
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
pub(crate) use meshql_store_sql::param::{Compiled, Param, Shape};

/// How SQLite binds parameters: values typed as `json_extract` returns them, lists as JSON.
pub(crate) const BIND: BindStyle = BindStyle {
    scalars: Scalars::Typed,
    lists: Lists::JsonText,
};

const COLUMNS: &str = "t.id, t.payload";

/// Documents are listed in the order they were first created (`seq` is the row id of a
/// document's first version; NULL on that first version itself).
pub(crate) const ORDER: &str = " ORDER BY COALESCE(t.seq, t._id)";

/// `t` is the visible version of its id: the latest (at `?at`) and not a tombstone.
///
/// At a moment, a latest version written at or before it is the one visible then, found
/// without a lookup; only the versions of documents changed since the moment (the ids of
/// the versions after it, one range of the `created_at` index per statement, usually empty
/// for a moment just past) are checked against the newest version at the moment, a lookup
/// per candidate row. GraphQL reads every level at its request's start, so this is the
/// common case.
fn visibility(table: &str, at: bool, b: &mut Builder<'_>) -> String {
    if at {
        b.push(Param::At);
        b.push(Param::At);
        format!(
            "t.deleted = 0 AND ((+t.latest = 1 AND +t.created_at <= ?) OR \
             (t.id IN (SELECT c.id FROM {} c WHERE c.created_at > ?) AND {}))",
            quote_ident(table),
            version_at(table, b)
        )
    } else {
        "t.latest = 1 AND t.deleted = 0".to_owned()
    }
}

/// `t` is the newest version of its id at `?at` (tombstone or not).
fn version_at(table: &str, b: &mut Builder<'_>) -> String {
    b.push(Param::At);
    format!(
        "t.created_at = (SELECT MAX(v.created_at) FROM {} v WHERE v.id = t.id AND v.created_at <= ?)",
        quote_ident(table)
    )
}

fn token_clause(b: &mut Builder<'_>) -> &'static str {
    b.push(Param::Tokens);
    " AND (t.authorized_tokens = '[]' OR EXISTS (SELECT 1 FROM json_each(t.authorized_tokens) a \
     WHERE a.value IN (SELECT value FROM json_each(?))))"
}

/// `json_type(t.payload, '$.a')`: NULL when the field is missing, `'null'` for JSON null.
pub(crate) fn json_type(path: &FieldPath, alias: &str) -> String {
    json_extract(path, &format!("{alias}.payload")).replacen("json_extract(", "json_type(", 1)
}

/// `ORDER BY` for a template: its sort keys (type rank, then value), then creation order.
fn order_by(template: &QueryTemplate) -> String {
    let keys = template.sort();
    if keys.is_empty() {
        return ORDER.to_owned();
    }
    let mut out = String::from(" ORDER BY ");
    for k in keys {
        let dir = if k.descending { " DESC" } else { "" };
        match &k.path {
            FieldPath::Id => out.push_str(&format!("t.id{dir}, ")),
            path => out.push_str(&format!(
                "CASE {} WHEN 'integer' THEN 1 WHEN 'real' THEN 1 WHEN 'text' THEN 2 \
                 WHEN 'object' THEN 3 WHEN 'array' THEN 4 WHEN 'true' THEN 5 WHEN 'false' THEN 5 \
                 ELSE 0 END{dir}, {}{dir}, ",
                json_type(path, "t"),
                json_extract(path, "t.payload")
            )),
        }
    }
    out.push_str("COALESCE(t.seq, t._id)");
    out
}

/// The statement of a search (or of a batched search when `shape.batch`).
///
/// A search `at` a moment that is neither a batch nor a lookup by id (which reads the id's
/// versions alone) reads in two parts, so that its cost follows
/// the current documents and the versions written after the moment, not every version ever
/// stored (an `at` close to now is what every GraphQL request reads with):
/// - documents unchanged since the moment: their latest version, through the same indexes as
///   a read of the latest (`latest = 1 AND created_at <= ?`);
/// - documents changed since (the ids of the versions after the moment, through the
///   `created_at` index): the version each had at the moment, if any.
///
/// The two cannot overlap (a document changed since has a latest version after the moment),
/// and together they are exactly the documents visible at the moment.
pub(crate) fn search(table: &str, template: &QueryTemplate, shape: Shape) -> Compiled {
    let mut b = Builder::new(&DIALECT);
    let t = quote_ident(table);
    let mut sql = String::new();
    if shape.batch {
        b.push(Param::Keys);
        sql.push_str(&format!(
            "SELECT k.key, {COLUMNS} FROM (SELECT DISTINCT value AS key FROM json_each(?)) k \
             JOIN {t} t ON "
        ));
        sql.push_str(&b.predicate(template, "t", Some("k.key"), false));
        sql.push_str(" WHERE ");
        sql.push_str(&visibility(table, shape.at, &mut b));
        if shape.tokens {
            sql.push_str(token_clause(&mut b));
        }
    } else if shape.at && !template.selects_by_id() {
        sql.push_str(&format!(
            "SELECT {COLUMNS} FROM (SELECT t.id, t.payload, t.seq, t._id FROM {t} t WHERE "
        ));
        sql.push_str(&b.predicate(template, "t", None, true));
        b.push(Param::At);
        // `+`: not through the created_at index, which would visit every version up to
        // the moment; the latest versions have indexes of their own
        sql.push_str(" AND t.latest = 1 AND t.deleted = 0 AND +t.created_at <= ?");
        if shape.tokens {
            sql.push_str(token_clause(&mut b));
        }
        sql.push_str(&format!(
            " UNION ALL SELECT t.id, t.payload, t.seq, t._id FROM {t} t WHERE "
        ));
        sql.push_str(&b.predicate(template, "t", None, true));
        b.push(Param::At);
        sql.push_str(&format!(
            " AND t.id IN (SELECT c.id FROM {t} c WHERE c.created_at > ?) AND t.deleted = 0 AND "
        ));
        sql.push_str(&version_at(table, &mut b));
        if shape.tokens {
            sql.push_str(token_clause(&mut b));
        }
        sql.push_str(") t");
    } else {
        sql.push_str(&format!("SELECT {COLUMNS} FROM {t} t WHERE "));
        sql.push_str(&b.predicate(template, "t", None, true));
        sql.push_str(" AND ");
        sql.push_str(&visibility(table, shape.at, &mut b));
        if shape.tokens {
            sql.push_str(token_clause(&mut b));
        }
    }
    sql.push_str(&order_by(template));
    // No `LIMIT ?`: a bound LIMIT makes SQLite re-prepare the statement on every run; the
    // caller stops reading after `limit` rows instead.
    b.finish(sql)
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
