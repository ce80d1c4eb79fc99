//! SQL text for MySQL / MariaDB.

use meshql_core::template::{Piece, SqlPiece, TemplateKind};
use meshql_core::{ArgValue, FieldPath, QueryTemplate};
use serde_json::Value;

pub(crate) fn quote_ident(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

/// The generated column holding a payload field's text.
pub(crate) fn field_column(path: &FieldPath) -> Option<String> {
    match path {
        FieldPath::Id => None,
        FieldPath::Payload(segments) => Some(format!("f_{}", segments.join("__"))),
    }
}

fn json_path(segments: &[String]) -> String {
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
            UNIQUE KEY uq_id_created (id, created_at),
            KEY k_latest_id (latest, id),
            KEY k_current (latest, deleted, seq, _id)
         ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
        quote_ident(table)
    )
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

#[derive(Debug, Clone)]
pub(crate) enum Param {
    Arg(String),
    Literal(Value),
    Render(Vec<Piece>),
    At,
    Tokens,
    Keys,
}

#[derive(Debug, Clone)]
pub(crate) struct Compiled {
    pub sql: String,
    pub params: Vec<Param>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Shape {
    pub at: bool,
    pub tokens: bool,
    pub batch: bool,
}

pub(crate) const ORDER: &str = " ORDER BY COALESCE(t.seq, t._id)";
/// A row's place in creation order (its first version's row number).
const ORD: &str = "COALESCE(t.seq, t._id)";

pub(crate) fn visibility(table: &str, at: bool) -> &'static str {
    let _ = table;
    if at {
        "t.deleted = 0 AND t.created_at = (SELECT MAX(v.created_at) FROM {T} v \
         WHERE v.id = t.id AND v.created_at <= ?)"
    } else {
        "t.latest = 1 AND t.deleted = 0"
    }
}

pub(crate) const TOKENS: &str =
    " AND (JSON_LENGTH(t.authorized_tokens) = 0 OR JSON_OVERLAPS(t.authorized_tokens, ?))";

fn predicate(template: &QueryTemplate, batch: bool, params: &mut Vec<Param>) -> String {
    match &template.kind {
        TemplateKind::Filter(preds) if preds.is_empty() => "1".to_owned(),
        TemplateKind::Filter(preds) => preds
            .iter()
            .map(|(path, value)| {
                let lhs = match field_column(path) {
                    Some(c) => format!("t.{}", quote_ident(&c)),
                    None => "t.id".to_owned(),
                };
                let rhs = match value {
                    ArgValue::Arg(name) if batch && name == "id" => "k.kv".to_owned(),
                    ArgValue::Arg(name) => {
                        params.push(Param::Arg(name.clone()));
                        "?".to_owned()
                    }
                    ArgValue::Literal(v) => {
                        params.push(Param::Literal(v.clone()));
                        "?".to_owned()
                    }
                    ArgValue::Interpolated(p) => {
                        params.push(Param::Render(p.clone()));
                        "?".to_owned()
                    }
                };
                format!("{lhs} = {rhs}")
            })
            .collect::<Vec<_>>()
            .join(" AND "),
        TemplateKind::Sql(pieces) => {
            let mut out = String::from("(");
            for p in pieces {
                match p {
                    SqlPiece::Text(t) => out.push_str(t),
                    SqlPiece::Param { arg, .. } if batch && arg == "id" => out.push_str("k.kv"),
                    SqlPiece::Param { arg, .. } => {
                        params.push(Param::Arg(arg.clone()));
                        out.push('?');
                    }
                }
            }
            out.push(')');
            out
        }
    }
}

pub(crate) fn search(table: &str, template: &QueryTemplate, shape: Shape) -> Compiled {
    let mut params = Vec::new();
    let t = quote_ident(table);
    let mut sql = String::new();
    if shape.batch {
        params.push(Param::Keys);
        sql.push_str(&format!(
            "SELECT k.kv, {ORD}, t.id, t.payload FROM JSON_TABLE(?, '$[*]' COLUMNS (kv VARCHAR(700) PATH '$')) k \
             JOIN {t} t ON "
        ));
        sql.push_str(&predicate(template, true, &mut params));
        sql.push_str(" WHERE ");
    } else {
        sql.push_str(&format!("SELECT {ORD}, t.id, t.payload FROM {t} t WHERE "));
        sql.push_str(&predicate(template, false, &mut params));
        sql.push_str(" AND ");
    }
    if shape.at {
        params.push(Param::At);
    }
    sql.push_str(&visibility(table, shape.at).replace("{T}", &t));
    if shape.tokens {
        params.push(Param::Tokens);
        sql.push_str(TOKENS);
    }
    // no ORDER BY: rows come back with their creation order (`ORD`) and are sorted by the
    // caller. Sorting in MariaDB drags every selected `payload` (a LONGTEXT) through a
    // filesort, and in a JSON_TABLE join through an on-disk temporary table: the batched
    // lookups of a depth-3 query ran ~2.3× slower that way.
    Compiled { sql, params }
}

pub(crate) fn as_text(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}
