//! SQL text for PostgreSQL: DDL and the statements searches run. Texts depend only on the
//! table, the template and the optional clauses present, so each is prepared once per
//! connection.

use meshql_core::template::{Piece, SqlPiece, TemplateKind};
use meshql_core::{ArgValue, FieldPath, QueryTemplate};
use serde_json::Value;

pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// An index name within PostgreSQL's 63-byte limit.
fn index_name(table: &str, suffix: &str) -> String {
    let full = format!("{table}_{suffix}");
    if full.len() <= 63 {
        return quote_ident(&full);
    }
    let hash = full.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    });
    quote_ident(&format!("{}_{hash:016x}", &full[..46]))
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
         CREATE INDEX IF NOT EXISTS {current} ON {t} ((COALESCE(seq, _id))) WHERE latest AND NOT deleted;
         CREATE INDEX IF NOT EXISTS {latest} ON {t} (id) WHERE latest;",
        current = index_name(table, "current"),
        latest = index_name(table, "id_latest"),
    )
}

pub(crate) fn create_field_index(table: &str, path: &FieldPath) -> Option<String> {
    let FieldPath::Payload(segments) = path else {
        return None;
    };
    Some(format!(
        "CREATE INDEX IF NOT EXISTS {} ON {} ({})",
        index_name(table, &format!("f_{}", segments.join("_"))),
        quote_ident(table),
        json_text(path, "")
    ))
}

/// Where a statement's parameter comes from.
#[derive(Debug, Clone)]
pub(crate) enum Param {
    Arg(String),
    Literal(Value),
    Render(Vec<Piece>),
    At,
    Tokens,
    Limit,
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
    pub limit: bool,
    pub batch: bool,
}

pub(crate) const ORDER: &str = " ORDER BY COALESCE(t.seq, t._id)";

struct Builder {
    params: Vec<Param>,
}

impl Builder {
    fn push(&mut self, p: Param) -> String {
        self.params.push(p);
        format!("${}", self.params.len())
    }

    fn predicate(&mut self, template: &QueryTemplate, batch: bool) -> String {
        match &template.kind {
            TemplateKind::Filter(preds) if preds.is_empty() => "true".to_owned(),
            TemplateKind::Filter(preds) => preds
                .iter()
                .map(|(path, value)| {
                    let lhs = json_text(path, "t");
                    let rhs = match value {
                        ArgValue::Arg(name) if batch && name == "id" => "k.key".to_owned(),
                        ArgValue::Arg(name) => self.push(Param::Arg(name.clone())),
                        ArgValue::Literal(v) => self.push(Param::Literal(v.clone())),
                        ArgValue::Interpolated(pieces) => self.push(Param::Render(pieces.clone())),
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
                        SqlPiece::Param { arg, .. } if batch && arg == "id" => {
                            out.push_str("k.key")
                        }
                        SqlPiece::Param { arg, as_text } => {
                            let n = self.push(Param::Arg(arg.clone()));
                            out.push_str(&n);
                            if *as_text {
                                out.push_str("::text");
                            }
                        }
                    }
                }
                out.push(')');
                out
            }
        }
    }

    fn visibility(&mut self, table: &str, at: bool) -> String {
        if at {
            let n = self.push(Param::At);
            format!(
                "NOT t.deleted AND t.created_at = (SELECT MAX(v.created_at) FROM {} v \
                 WHERE v.id = t.id AND v.created_at <= {n})",
                quote_ident(table)
            )
        } else {
            "t.latest AND NOT t.deleted".to_owned()
        }
    }

    fn tokens(&mut self) -> String {
        let n = self.push(Param::Tokens);
        format!(" AND (cardinality(t.authorized_tokens) = 0 OR t.authorized_tokens && {n}::text[])")
    }
}

/// The statement of a search (or batched search).
pub(crate) fn search(table: &str, template: &QueryTemplate, shape: Shape) -> Compiled {
    let mut b = Builder { params: Vec::new() };
    let t = quote_ident(table);
    let mut sql = String::new();
    if shape.batch {
        let keys = b.push(Param::Keys);
        sql.push_str(&format!(
            "SELECT k.key, t.id, t.payload::text FROM (SELECT DISTINCT unnest({keys}::text[]) AS key) k \
             JOIN {t} t ON "
        ));
        sql.push_str(&b.predicate(template, true));
        sql.push_str(" WHERE ");
    } else {
        sql.push_str(&format!("SELECT t.id, t.payload::text FROM {t} t WHERE "));
        sql.push_str(&b.predicate(template, false));
        sql.push_str(" AND ");
    }
    sql.push_str(&b.visibility(table, shape.at));
    if shape.tokens {
        sql.push_str(&b.tokens());
    }
    sql.push_str(ORDER);
    if shape.limit {
        let n = b.push(Param::Limit);
        sql.push_str(&format!(" LIMIT {n}"));
    }
    Compiled {
        sql,
        params: b.params,
    }
}

/// A JSON scalar as the text `->>` yields for it (`None` for null: matches nothing).
pub(crate) fn as_text(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}
