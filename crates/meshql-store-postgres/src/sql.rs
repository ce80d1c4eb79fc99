//! SQL text for PostgreSQL: DDL and the statements searches run. Texts depend only on the
//! table, the template and the optional clauses present, so each is prepared once per
//! connection.

use meshql_core::{FieldPath, QueryTemplate};
use meshql_store_sql::names::{self, IdentLimit};

pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// PostgreSQL's identifiers: 63 bytes (longer ones are truncated, silently).
pub(crate) const IDENT_LIMIT: IdentLimit = IdentLimit::Bytes(63);

/// An index name within PostgreSQL's 63-byte limit.
pub(crate) fn index_name(table: &str, suffix: &str) -> String {
    quote_ident(&names::shorten(
        &format!("{table}_{suffix}"),
        "",
        IDENT_LIMIT,
    ))
}

/// The table a rebuild of `table` writes (`OutputStore::rebuild_store`).
pub(crate) fn rebuild_table(table: &str) -> String {
    names::rebuild_table(table, Some(IDENT_LIMIT))
}

/// The suffixes ([`index_name`]) of every index [`create_table`] and `templates`' field and
/// range indexes create, each once.
pub(crate) fn index_suffixes(templates: &[QueryTemplate]) -> Vec<String> {
    let mut out: Vec<String> = TABLE_INDEXES.iter().map(|s| s.to_string()).collect();
    for t in templates {
        for path in t.filtered_paths() {
            out.extend(field_index_suffix(&path));
        }
        for path in t.range_paths() {
            out.extend(range_index_suffixes(&path));
        }
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|s| seen.insert(s.clone()));
    out
}

/// The suffixes of [`create_table`]'s indexes: created, current, latest by id, feed.
const TABLE_INDEXES: [&str; 4] = ["created", "current", "id_latest", "feed"];

fn field_index_suffix(path: &FieldPath) -> Option<String> {
    match path {
        FieldPath::Payload(segments) => Some(format!("f_{}", segments.join("_"))),
        FieldPath::Id => None,
    }
}

/// The JSONB value's index, then the text's.
fn range_index_suffixes(path: &FieldPath) -> Vec<String> {
    match path {
        FieldPath::Payload(segments) => {
            let name = segments.join("_");
            vec![format!("j_{name}"), format!("c_{name}")]
        }
        FieldPath::Id => Vec::new(),
    }
}

/// `(col->>'a')` or `(col#>>'{a,b}')`; `id` for the envelope id. Segments are validated
/// identifiers (config), so quoting them as literals is safe.
pub(crate) fn json_text(path: &FieldPath, alias: &str) -> String {
    let col = if alias.is_empty() {
        "payload".to_owned()
    } else {
        format!("{alias}.payload")
    };
    match path {
        FieldPath::Id => {
            if alias.is_empty() {
                "id".to_owned()
            } else {
                format!("{alias}.id")
            }
        }
        FieldPath::Payload(segments) if segments.len() == 1 => {
            format!("({col}->>'{}')", segments[0].replace('\'', "''"))
        }
        FieldPath::Payload(segments) => format!(
            "({col}#>>'{{{}}}')",
            segments
                .iter()
                .map(|s| s.replace('\'', "''"))
                .collect::<Vec<_>>()
                .join(",")
        ),
    }
}

/// `(col->'a')` or `(col#>'{a,b}')`: the field as JSONB (NULL when missing).
pub(crate) fn json_value(path: &FieldPath, alias: &str) -> String {
    json_text(path, alias)
        .replacen("->>", "->", 1)
        .replacen("#>>", "#>", 1)
}

pub(crate) fn create_table(table: &str) -> String {
    let t = quote_ident(table);
    format!(
        "CREATE TABLE IF NOT EXISTS {t} (
            _id BIGSERIAL PRIMARY KEY,
            id TEXT NOT NULL,
            payload JSONB NOT NULL,
            created_at BIGINT NOT NULL,
            deleted BOOLEAN NOT NULL DEFAULT false,
            authorized_tokens TEXT[] NOT NULL DEFAULT '{{}}',
            latest BOOLEAN NOT NULL DEFAULT true,
            seq BIGINT,
            UNIQUE (id, created_at)
         );
         ALTER TABLE {t} ADD COLUMN IF NOT EXISTS tx XID8 NOT NULL DEFAULT pg_current_xact_id();
         ALTER TABLE {t} ADD COLUMN IF NOT EXISTS correlation_id TEXT;
         CREATE INDEX IF NOT EXISTS {current} ON {t} ((COALESCE(seq, _id))) WHERE latest AND NOT deleted;
         CREATE INDEX IF NOT EXISTS {latest} ON {t} (id) WHERE latest;
         CREATE INDEX IF NOT EXISTS {feed} ON {t} (tx, _id);
         CREATE INDEX IF NOT EXISTS {created} ON {t} (created_at);",
        created = index_name(table, TABLE_INDEXES[0]),
        current = index_name(table, TABLE_INDEXES[1]),
        latest = index_name(table, TABLE_INDEXES[2]),
        feed = index_name(table, TABLE_INDEXES[3]),
    )
}

pub(crate) fn create_field_index(table: &str, path: &FieldPath) -> Option<String> {
    Some(format!(
        "CREATE INDEX IF NOT EXISTS {} ON {} ({})",
        index_name(table, &field_index_suffix(path)?),
        quote_ident(table),
        json_text(path, "")
    ))
}

/// Indexes for a field a template compares with a range: its JSONB value (numbers) and its
/// text in code-point order (strings), so that either branch of the comparison can use one.
pub(crate) fn create_range_indexes(table: &str, path: &FieldPath) -> Vec<String> {
    let [value, text] = &range_index_suffixes(path)[..] else {
        return Vec::new();
    };
    vec![
        format!(
            "CREATE INDEX IF NOT EXISTS {} ON {} ({})",
            index_name(table, value),
            quote_ident(table),
            json_value(path, "")
        ),
        format!(
            "CREATE INDEX IF NOT EXISTS {} ON {} (({} COLLATE \"C\"))",
            index_name(table, text),
            quote_ident(table),
            json_text(path, "")
        ),
    ]
}

use meshql_store_sql::param::{BindStyle, Bound, Lists, Scalars};
pub(crate) use meshql_store_sql::param::{Compiled, Shape};

/// How PostgreSQL binds parameters: values as the text `->>` reads, lists as `text[]`.
pub(crate) const BIND: BindStyle = BindStyle {
    scalars: Scalars::Text,
    lists: Lists::TextArray,
};

/// A bound parameter as tokio-postgres takes it.
pub(crate) type SqlParam = Box<dyn tokio_postgres::types::ToSql + Sync + Send>;

/// A bound value as tokio-postgres's.
pub(crate) fn to_driver(v: Bound) -> SqlParam {
    match v {
        Bound::Null => Box::new(None::<String>),
        Bound::Int(i) => Box::new(i),
        Bound::UInt(u) => Box::new(i64::try_from(u).unwrap_or(i64::MAX)),
        Bound::Real(r) => Box::new(r),
        Bound::Text(s) => Box::new(s),
        Bound::TextList(items) => Box::new(items),
    }
}
