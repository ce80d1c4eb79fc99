//! SQL text for PostgreSQL: DDL and the statements searches run. Texts depend only on the
//! table, the template and the optional clauses present, so each is prepared once per
//! connection.

use crate::dialect::DIALECT;
use meshql_core::nested::Level;
use meshql_core::{FieldPath, QueryTemplate};
use meshql_store_sql::cond::Builder;
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

/// `ORDER BY` of a search: the template's sort keys (type rank, then value), then creation.
fn order_by(template: &QueryTemplate) -> String {
    let keys = template.sort();
    if keys.is_empty() {
        return ORDER.to_owned();
    }
    let mut out = String::from(" ORDER BY ");
    for k in keys {
        let dir = if k.descending { " DESC" } else { "" };
        match &k.path {
            FieldPath::Id => out.push_str(&format!("t.id COLLATE \"C\"{dir}, ")),
            path => {
                let j = json_value(path, "t");
                let l = json_text(path, "t");
                out.push_str(&format!(
                    "CASE jsonb_typeof({j}) WHEN 'number' THEN 1 WHEN 'string' THEN 2 \
                     WHEN 'object' THEN 3 WHEN 'array' THEN 4 WHEN 'boolean' THEN 5 ELSE 0 END{dir}, \
                     CASE WHEN jsonb_typeof({j}) = 'number' THEN {l}::numeric END{dir}, \
                     CASE WHEN jsonb_typeof({j}) <> 'number' THEN {l} END COLLATE \"C\"{dir}, "
                ))
            }
        }
    }
    out.push_str("COALESCE(t.seq, t._id)");
    out
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
pub(crate) use meshql_store_sql::param::{Compiled, Param, Shape};

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

pub(crate) const ORDER: &str = " ORDER BY COALESCE(t.seq, t._id)";

/// The clauses of PostgreSQL's searches, on a statement being compiled.
trait Clauses {
    fn visibility(&mut self, table: &str, at: bool, alias: &str) -> String;
    fn tokens(&mut self, alias: &str) -> String;
    fn current_at(&mut self, table: &str, template: &QueryTemplate, tokens: bool) -> String;
}

impl Clauses for Builder<'_> {
    fn visibility(&mut self, table: &str, at: bool, alias: &str) -> String {
        if at {
            let n = self.push(Param::At);
            format!(
                "NOT {alias}.deleted AND {alias}.created_at = (SELECT MAX(v.created_at) FROM {} v \
                 WHERE v.id = {alias}.id AND v.created_at <= {n})",
                quote_ident(table)
            )
        } else {
            format!("{alias}.latest AND NOT {alias}.deleted")
        }
    }

    fn tokens(&mut self, alias: &str) -> String {
        let n = self.push(Param::Tokens);
        format!(
            " AND (cardinality({alias}.authorized_tokens) = 0 OR {alias}.authorized_tokens && {n}::text[])"
        )
    }

    /// The documents a search's template matches `at` a moment, as a subquery of `id,
    /// payload, seq, _id` to alias `t`. In two parts, as the SQLite store reads them (see its
    /// `sql::search`), so that the cost follows the current documents and the versions
    /// written after the moment, not every version stored: documents unchanged since, through
    /// the latest versions' indexes (`+ 0`: not through the created_at index), and documents
    /// changed since (their ids through the created_at index) at their version of the moment.
    fn current_at(&mut self, table: &str, template: &QueryTemplate, tokens: bool) -> String {
        let t = quote_ident(table);
        let mut sql = format!("(SELECT t.id, t.payload, t.seq, t._id FROM {t} t WHERE ");
        sql.push_str(&self.predicate(template, "t", None, true));
        let at = self.push(Param::At);
        sql.push_str(&format!(
            " AND t.latest AND NOT t.deleted AND t.created_at + 0 <= {at}"
        ));
        if tokens {
            sql.push_str(&self.tokens("t"));
        }
        sql.push_str(&format!(
            " UNION ALL SELECT t.id, t.payload, t.seq, t._id FROM {t} t WHERE "
        ));
        sql.push_str(&self.predicate(template, "t", None, true));
        let at = self.push(Param::At);
        sql.push_str(&format!(
            " AND t.id IN (SELECT c.id FROM {t} c WHERE c.created_at > {at}) AND "
        ));
        sql.push_str(&self.visibility(table, true, "t"));
        if tokens {
            sql.push_str(&self.tokens("t"));
        }
        sql.push(')');
        sql
    }
}

/// The statement of a search (or batched search).
pub(crate) fn search(table: &str, template: &QueryTemplate, shape: Shape) -> Compiled {
    let mut b = Builder::new(&DIALECT);
    let t = quote_ident(table);
    let mut sql = String::new();
    if shape.batch {
        let keys = b.push(Param::Keys);
        sql.push_str(&format!(
            "SELECT k.key, t.id, t.payload::text FROM (SELECT DISTINCT unnest({keys}::text[]) AS key) k \
             JOIN {t} t ON "
        ));
        sql.push_str(&b.predicate(template, "t", Some("k.key"), false));
        sql.push_str(" WHERE ");
        sql.push_str(&b.visibility(table, shape.at, "t"));
        if shape.tokens {
            sql.push_str(&b.tokens("t"));
        }
    } else if shape.at && !template.selects_by_id() {
        let current = b.current_at(table, template, shape.tokens);
        sql.push_str(&format!("SELECT t.id, t.payload::text FROM {current} t"));
    } else {
        sql.push_str(&format!("SELECT t.id, t.payload::text FROM {t} t WHERE "));
        sql.push_str(&b.predicate(template, "t", None, true));
        sql.push_str(" AND ");
        sql.push_str(&b.visibility(table, shape.at, "t"));
        if shape.tokens {
            sql.push_str(&b.tokens("t"));
        }
    }
    sql.push_str(&order_by(template));
    if shape.limit {
        let n = b.push(Param::Limit);
        sql.push_str(&format!(" LIMIT {n}"));
    }
    b.finish(sql)
}

/// One statement for a search and every relationship below it: a CTE per relationship
/// joining the distinct keys of its parent's rows (what a batched lookup per level does,
/// without the round trip per level), then every row as `(relationship, key, id, payload)`,
/// relationship 0 being the search itself and the others numbered depth first (see
/// [`meshql_core::nested::relationship_parents`]), in creation order. Building JSON in the
/// database instead (`json_agg` in correlated subqueries) measured slower on wide trees.
pub(crate) fn nested_search(
    table: &str,
    template: &QueryTemplate,
    shape: Shape,
    levels: &[Level<'_>],
) -> Compiled {
    let mut b = Builder::new(&DIALECT);
    let source = if shape.at && !template.selects_by_id() {
        format!("{} t", b.current_at(table, template, shape.tokens))
    } else {
        format!(
            "{} t WHERE {} AND {}{}",
            quote_ident(table),
            b.predicate(template, "t", None, true),
            b.visibility(table, shape.at, "t"),
            if shape.tokens {
                b.tokens("t")
            } else {
                String::new()
            },
        )
    };
    let limit = if shape.limit {
        format!(" ORDER BY o LIMIT {}", b.push(Param::Limit))
    } else {
        String::new()
    };
    let mut ctes = vec![format!(
        "r0 AS (SELECT t.id, t.payload, COALESCE(t.seq, t._id) AS o FROM {source}{limit})"
    )];
    fn walk(
        b: &mut Builder<'_>,
        ctes: &mut Vec<String>,
        levels: &[Level<'_>],
        parent: usize,
        shape: Shape,
    ) {
        for level in levels {
            let me = ctes.len();
            let key = if level.key_field == "id" {
                "p.id".to_owned()
            } else {
                // strings as they are, numbers and booleans as text, anything else no key
                let f = level.key_field.replace('\'', "''");
                format!(
                    "CASE WHEN jsonb_typeof(p.payload->'{f}') IN ('string', 'number', 'boolean') \
                     THEN p.payload->>'{f}' END"
                )
            };
            ctes.push(format!(
                "r{me} AS (SELECT k.key, t.id, t.payload, COALESCE(t.seq, t._id) AS o \
                 FROM (SELECT DISTINCT {key} AS key FROM r{parent} p) k JOIN {} t ON {} WHERE {}{})",
                quote_ident(&level.table),
                b.predicate(level.template, "t", Some("k.key"), false),
                b.visibility(&level.table, shape.at, "t"),
                if shape.tokens { b.tokens("t") } else { String::new() },
            ));
            walk(b, ctes, &level.children, me, shape);
        }
    }
    walk(&mut b, &mut ctes, levels, 0, shape);
    let rows: Vec<String> = (0..ctes.len())
        .map(|i| {
            let key = if i == 0 { "NULL::text" } else { "key" };
            format!("SELECT {i} AS r, {key} AS key, id, payload::text, o FROM r{i}")
        })
        .collect();
    b.finish(format!(
        "WITH {} {} ORDER BY r, o",
        ctes.join(", "),
        rows.join(" UNION ALL ")
    ))
}
