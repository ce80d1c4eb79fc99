//! What `meshql init` reads of a PostgreSQL schema: its ordinary tables with their columns
//! (type, nullability, length, default, identity), primary keys, foreign keys, unique
//! constraints and the CHECK constraints that list a column's values, all from `pg_catalog`.

use super::names::sql_ident;
use super::InitError;
use std::collections::BTreeMap;

/// What a column holds, as far as the generated schemas care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// `smallint`, `integer`, `bigint` (and their serials): the bits.
    Int(u8),
    /// `numeric` / `decimal`.
    Numeric,
    /// `real`, `double precision`.
    Float,
    Bool,
    /// `text`, `varchar`, `char`, `citext`, `name`.
    Text,
    Date,
    /// `timestamp` (`tz`: with time zone).
    Timestamp {
        tz: bool,
    },
    Time,
    Uuid,
    Json,
    /// An enum type, with its labels in order.
    Enum(Vec<String>),
    /// Anything else (`bytea`, `interval`, `inet`, `money`, …): its type name.
    Other(String),
}

impl Kind {
    fn of(type_name: &str, enum_labels: Option<Vec<String>>) -> Kind {
        if let Some(labels) = enum_labels {
            return Kind::Enum(labels);
        }
        match type_name {
            "int2" => Kind::Int(16),
            "int4" => Kind::Int(32),
            "int8" => Kind::Int(64),
            "numeric" => Kind::Numeric,
            "float4" | "float8" => Kind::Float,
            "bool" => Kind::Bool,
            "text" | "varchar" | "bpchar" | "char" | "name" | "citext" => Kind::Text,
            "date" => Kind::Date,
            "timestamp" => Kind::Timestamp { tz: false },
            "timestamptz" => Kind::Timestamp { tz: true },
            "time" | "timetz" => Kind::Time,
            "uuid" => Kind::Uuid,
            "json" | "jsonb" => Kind::Json,
            other => Kind::Other(other.to_owned()),
        }
    }
}

/// Values a CHECK constraint allows a column (`col IN ('A', 'B')`, `col = ANY (ARRAY[…])`,
/// `col = 'A' OR col = 'B'`): the literals' texts, and whether they are numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    pub values: Vec<String>,
    pub numeric: bool,
    /// The constraint's name.
    pub constraint: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    /// As PostgreSQL writes it: `character varying(8)`, `integer`, `numeric(10,2)`, `text[]`.
    pub sql_type: String,
    /// The value's kind (an array's: its items').
    pub kind: Kind,
    pub array: bool,
    pub not_null: bool,
    /// `varchar(n)` / `char(n)`: n.
    pub max_length: Option<u32>,
    pub default: Option<String>,
    /// `GENERATED … AS IDENTITY`.
    pub identity: bool,
    /// `GENERATED ALWAYS AS (…) STORED`.
    pub generated: bool,
    /// From a CHECK constraint.
    pub allowed: Option<Allowed>,
    /// Distinct values read from the table (`--acl`, for code and flag columns): at most
    /// [`SAMPLE_LIMIT`] of them, or why they could not be read.
    pub sample: Option<Result<Vec<String>, String>>,
}

impl Column {
    /// A serial or identity column: the database numbers its rows.
    pub fn numbered(&self) -> bool {
        self.identity
            || self
                .default
                .as_deref()
                .is_some_and(|d| d.starts_with("nextval("))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignKey {
    pub name: String,
    pub columns: Vec<String>,
    pub ref_schema: String,
    pub ref_table: String,
    pub ref_columns: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub schema: String,
    pub name: String,
    pub columns: Vec<Column>,
    /// The primary key's columns, in key order (empty: none).
    pub primary_key: Vec<String>,
    pub foreign_keys: Vec<ForeignKey>,
    /// Unique constraints' columns.
    pub uniques: Vec<Vec<String>>,
}

impl Table {
    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// `name` in `public`, else `schema.name` (how `postgres_cdc` names its inputs).
    pub fn label(&self) -> String {
        if self.schema == "public" {
            self.name.clone()
        } else {
            format!("{}.{}", self.schema, self.name)
        }
    }

    /// Quoted for SQL.
    pub fn sql(&self) -> String {
        format!("{}.{}", sql_ident(&self.schema), sql_ident(&self.name))
    }
}

/// The tables of a schema, and those left out with why.
#[derive(Debug, Default)]
pub struct Catalog {
    pub tables: Vec<Table>,
    /// (table, why it is not generated).
    pub skipped: Vec<(String, String)>,
}

/// How many distinct values make a column a code column (one more is read, to tell).
pub const SAMPLE_LIMIT: usize = 20;

fn query_error(what: &str, e: tokio_postgres::Error) -> InitError {
    InitError::Query {
        what: what.to_owned(),
        reason: db_error(&e),
    }
}

/// A driver error as one line (the server's message and SQLSTATE when it sent one).
pub fn db_error(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => {
            let mut s = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(inner) = source {
                let text = inner.to_string();
                if !s.contains(&text) {
                    s = format!("{s}: {text}");
                }
                source = inner.source();
            }
            s
        }
    }
}

const TABLES: &str = "\
SELECT c.relname::text, c.relkind::text, c.relispartition
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind IN ('r', 'p')
ORDER BY c.relname";

const COLUMNS: &str = "\
SELECT c.relname::text, a.attname::text, format_type(a.atttypid, a.atttypmod),
       bt.typname::text, et.typname::text, bt.oid::text, et.oid::text,
       a.attnotnull OR t.typnotnull,
       (CASE WHEN t.typtype = 'd' THEN t.typtypmod ELSE a.atttypmod END)::int4,
       pg_get_expr(ad.adbin, ad.adrelid), a.attidentity::text, a.attgenerated::text
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_type t ON t.oid = a.atttypid
JOIN pg_type bt ON bt.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
LEFT JOIN pg_type et ON et.oid = bt.typelem AND bt.typcategory = 'A'
LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
WHERE n.nspname = $1 AND c.relkind = 'r' AND NOT c.relispartition
  AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY c.relname, a.attnum";

const ENUMS: &str = "\
SELECT e.enumtypid::text, e.enumlabel::text FROM pg_enum e ORDER BY e.enumtypid, e.enumsortorder";

const CONSTRAINTS: &str = "\
SELECT cl.relname::text, con.conname::text, con.contype::text,
       ARRAY(SELECT a.attname::text FROM unnest(con.conkey) WITH ORDINALITY k(num, ord)
             JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.num ORDER BY k.ord),
       fn.nspname::text, fcl.relname::text,
       ARRAY(SELECT a.attname::text FROM unnest(con.confkey) WITH ORDINALITY k(num, ord)
             JOIN pg_attribute a ON a.attrelid = con.confrelid AND a.attnum = k.num ORDER BY k.ord),
       pg_get_constraintdef(con.oid)
FROM pg_constraint con
JOIN pg_class cl ON cl.oid = con.conrelid
JOIN pg_namespace n ON n.oid = cl.relnamespace
LEFT JOIN pg_class fcl ON fcl.oid = con.confrelid
LEFT JOIN pg_namespace fn ON fn.oid = fcl.relnamespace
WHERE n.nspname = $1 AND con.contype IN ('p', 'u', 'f', 'c')
ORDER BY cl.relname, con.contype, con.conname";

/// Reads the ordinary tables of `schema` (partitioned tables and partitions are listed in
/// `skipped`).
pub async fn read(client: &tokio_postgres::Client, schema: &str) -> Result<Catalog, InitError> {
    let mut catalog = Catalog::default();
    let mut by_name: BTreeMap<String, Table> = BTreeMap::new();
    for row in client
        .query(TABLES, &[&schema])
        .await
        .map_err(|e| query_error("the tables", e))?
    {
        let name: String = row.get(0);
        let kind: String = row.get(1);
        let partition: bool = row.get(2);
        if partition {
            catalog.skipped.push((
                name,
                "a partition (its parent table is the one to map)".into(),
            ));
        } else if kind == "p" {
            catalog.skipped.push((
                name,
                "a partitioned table (not generated yet: map it by hand)".into(),
            ));
        } else {
            by_name.insert(
                name.clone(),
                Table {
                    schema: schema.to_owned(),
                    name,
                    columns: Vec::new(),
                    primary_key: Vec::new(),
                    foreign_keys: Vec::new(),
                    uniques: Vec::new(),
                },
            );
        }
    }
    let mut enums: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for row in client
        .query(ENUMS, &[])
        .await
        .map_err(|e| query_error("the enum types", e))?
    {
        enums.entry(row.get(0)).or_default().push(row.get(1));
    }
    for row in client
        .query(COLUMNS, &[&schema])
        .await
        .map_err(|e| query_error("the columns", e))?
    {
        let table: String = row.get(0);
        let Some(t) = by_name.get_mut(&table) else {
            continue;
        };
        let base: String = row.get(3);
        let element: Option<String> = row.get(4);
        let base_oid: String = row.get(5);
        let element_oid: Option<String> = row.get(6);
        let typmod: i32 = row.get(8);
        let array = element.is_some();
        let (type_name, oid) = match (&element, &element_oid) {
            (Some(e), Some(o)) => (e.clone(), o.clone()),
            _ => (base, base_oid),
        };
        let max_length = (matches!(type_name.as_str(), "varchar" | "bpchar") && typmod > 4)
            .then(|| (typmod - 4) as u32);
        let identity: String = row.get(10);
        let generated: String = row.get(11);
        t.columns.push(Column {
            name: row.get(1),
            sql_type: row.get(2),
            kind: Kind::of(&type_name, enums.get(&oid).cloned()),
            array,
            not_null: row.get(7),
            max_length,
            default: row.get(9),
            identity: !identity.is_empty(),
            generated: !generated.is_empty(),
            allowed: None,
            sample: None,
        });
    }
    for row in client
        .query(CONSTRAINTS, &[&schema])
        .await
        .map_err(|e| query_error("the constraints", e))?
    {
        let table: String = row.get(0);
        let Some(t) = by_name.get_mut(&table) else {
            continue;
        };
        let name: String = row.get(1);
        let kind: String = row.get(2);
        let columns: Vec<String> = row.get(3);
        match kind.as_str() {
            "p" => t.primary_key = columns,
            "u" => t.uniques.push(columns),
            "f" => {
                let ref_schema: Option<String> = row.get(4);
                let ref_table: Option<String> = row.get(5);
                if let (Some(ref_schema), Some(ref_table)) = (ref_schema, ref_table) {
                    t.foreign_keys.push(ForeignKey {
                        name,
                        columns,
                        ref_schema,
                        ref_table,
                        ref_columns: row.get(6),
                    });
                }
            }
            _ => {
                let definition: String = row.get(7);
                if let Some((column, values, numeric)) = parse_check(&definition) {
                    if let Some(c) = t
                        .columns
                        .iter_mut()
                        .find(|c| c.name == column && c.allowed.is_none())
                    {
                        c.allowed = Some(Allowed {
                            values,
                            numeric,
                            constraint: name,
                        });
                    }
                }
            }
        }
    }
    catalog.tables = by_name.into_values().collect();
    Ok(catalog)
}

/// Up to [`SAMPLE_LIMIT`] + 1 distinct non-null values of `column` (their text without
/// trailing spaces, as mappings read it), sorted.
pub async fn sample(
    client: &tokio_postgres::Client,
    table: &Table,
    column: &str,
) -> Result<Vec<String>, String> {
    let c = sql_ident(column);
    let sql = format!(
        "SELECT DISTINCT rtrim({c}::text, ' ') FROM {} WHERE {c} IS NOT NULL LIMIT {}",
        table.sql(),
        SAMPLE_LIMIT + 1
    );
    let rows = client.query(&sql, &[]).await.map_err(|e| db_error(&e))?;
    let mut values: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    values.sort();
    values.dedup();
    Ok(values)
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Word(String),
    Quoted(String),
    Literal(String),
    Number(String),
    Cast,
    Eq,
    Punct(char),
    Other,
}

fn tokens(s: &str) -> Vec<Token> {
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '\'' || c == '"' {
            let mut text = String::new();
            i += 1;
            while i < chars.len() {
                if chars[i] == c {
                    if chars.get(i + 1) == Some(&c) {
                        text.push(c);
                        i += 2;
                        continue;
                    }
                    break;
                }
                text.push(chars[i]);
                i += 1;
            }
            i += 1;
            out.push(if c == '\'' {
                Token::Literal(text)
            } else {
                Token::Quoted(text)
            });
        } else if c.is_ascii_digit()
            || (c == '-' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit()))
        {
            let start = i;
            i += 1;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            out.push(Token::Number(chars[start..i].iter().collect()));
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_alphanumeric() || chars[i] == '_' || chars[i] == '$')
            {
                i += 1;
            }
            out.push(Token::Word(chars[start..i].iter().collect()));
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push(Token::Cast);
            i += 2;
        } else if c == '=' {
            out.push(Token::Eq);
            i += 1;
        } else if "()[],".contains(c) {
            out.push(Token::Punct(c));
            i += 1;
        } else {
            out.push(Token::Other);
            i += 1;
        }
    }
    out
}

/// Words that continue a type name after a cast (`character varying`, `double precision`,
/// `timestamp without time zone`).
const TYPE_WORDS: &[&str] = &["varying", "precision", "with", "without", "time", "zone"];

/// The tokens without casts (`::character varying(8)[]`) and parentheses.
fn without_casts(tokens: Vec<Token>) -> Vec<Token> {
    let mut out = Vec::new();
    let mut it = tokens.into_iter().peekable();
    while let Some(t) = it.next() {
        if t != Token::Cast {
            if !matches!(t, Token::Punct('(') | Token::Punct(')')) {
                out.push(t);
            }
            continue;
        }
        if matches!(it.peek(), Some(Token::Word(_)) | Some(Token::Quoted(_))) {
            it.next();
        }
        while matches!(it.peek(), Some(Token::Word(w)) if TYPE_WORDS.contains(&w.to_ascii_lowercase().as_str()))
        {
            it.next();
        }
        // a type modifier: `(8)`, `(10,2)`
        if it.peek() == Some(&Token::Punct('(')) {
            let mut probe = it.clone();
            probe.next();
            let mut ok = false;
            for p in probe.by_ref() {
                match p {
                    Token::Number(_) | Token::Punct(',') => continue,
                    Token::Punct(')') => {
                        ok = true;
                        break;
                    }
                    _ => break,
                }
            }
            if ok {
                it = probe;
            }
        }
        while it.peek() == Some(&Token::Punct('[')) {
            let mut probe = it.clone();
            probe.next();
            if probe.next() == Some(Token::Punct(']')) {
                it = probe;
            } else {
                break;
            }
        }
    }
    out
}

fn keyword(t: Option<&Token>, word: &str) -> bool {
    matches!(t, Some(Token::Word(w)) if w.eq_ignore_ascii_case(word))
}

fn column_name(t: Option<&Token>) -> Option<String> {
    match t {
        Some(Token::Word(w))
            if !["any", "array", "or", "check"].contains(&w.to_ascii_lowercase().as_str()) =>
        {
            Some(w.to_ascii_lowercase())
        }
        Some(Token::Quoted(q)) => Some(q.clone()),
        _ => None,
    }
}

fn literal(t: Option<&Token>) -> Option<(String, bool)> {
    match t {
        Some(Token::Literal(s)) => Some((s.clone(), false)),
        Some(Token::Number(n)) => Some((n.clone(), true)),
        _ => None,
    }
}

/// The column and values of a CHECK constraint (as `pg_get_constraintdef` writes it) that
/// only lists a column's values: `CHECK (((stat_cd)::text = ANY ((ARRAY['A'::character
/// varying, 'S'::character varying])::text[])))`, `CHECK ((kind = 'x'::text) OR (kind =
/// 'y'::text))`, `CHECK (prio = ANY (ARRAY[1, 2, 3]))`. `None` for any other constraint.
pub fn parse_check(definition: &str) -> Option<(String, Vec<String>, bool)> {
    let definition = definition.trim();
    let definition = definition
        .strip_suffix("NOT VALID")
        .unwrap_or(definition)
        .trim();
    let t = without_casts(tokens(definition));
    if !keyword(t.first(), "check") {
        return None;
    }
    let t = &t[1..];
    let column = column_name(t.first())?;
    let mut values = Vec::new();
    let mut numeric = None;
    let mut push = |(v, n): (String, bool)| -> Option<()> {
        if *numeric.get_or_insert(n) != n {
            return None;
        }
        if !values.contains(&v) {
            values.push(v);
        }
        Some(())
    };
    if t.get(1) == Some(&Token::Eq) && keyword(t.get(2), "any") {
        // col = ANY ARRAY [ lit , lit ]
        if !keyword(t.get(3), "array") || t.get(4) != Some(&Token::Punct('[')) {
            return None;
        }
        let mut i = 5;
        loop {
            push(literal(t.get(i))?)?;
            match t.get(i + 1) {
                Some(Token::Punct(',')) => i += 2,
                Some(Token::Punct(']')) if i + 2 == t.len() => break,
                _ => return None,
            }
        }
    } else {
        // col = lit [OR col = lit]…
        let mut i = 0;
        loop {
            if column_name(t.get(i)).as_deref() != Some(column.as_str())
                || t.get(i + 1) != Some(&Token::Eq)
            {
                return None;
            }
            push(literal(t.get(i + 2))?)?;
            if i + 3 == t.len() {
                break;
            }
            if !keyword(t.get(i + 3), "or") {
                return None;
            }
            i += 4;
        }
    }
    let numeric = numeric?;
    Some((column, values, numeric))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn check_constraints_listing_values() {
        assert_eq!(
            parse_check(
                "CHECK (((stat_cd)::text = ANY ((ARRAY['A'::character varying, 'S'::character varying, 'C'::character varying])::text[])))"
            ),
            Some(("stat_cd".into(), strings(&["A", "S", "C"]), false))
        );
        assert_eq!(
            parse_check("CHECK ((status = ANY (ARRAY['new'::text, 'it''s'::text])))"),
            Some(("status".into(), strings(&["new", "it's"]), false))
        );
        assert_eq!(
            parse_check("CHECK ((kind = 'x'::text) OR (kind = 'y'::text))"),
            Some(("kind".into(), strings(&["x", "y"]), false))
        );
        assert_eq!(
            parse_check("CHECK ((kind = 'x'::text))"),
            Some(("kind".into(), strings(&["x"]), false))
        );
        assert_eq!(
            parse_check("CHECK ((prio = ANY (ARRAY[1, 2, 3])))"),
            Some(("prio".into(), strings(&["1", "2", "3"]), true))
        );
        assert_eq!(
            parse_check(
                "CHECK (((\"Grade\")::bpchar = ANY (ARRAY['A'::bpchar, 'B'::bpchar]))) NOT VALID"
            ),
            Some(("Grade".into(), strings(&["A", "B"]), false))
        );
    }

    #[test]
    fn other_check_constraints_are_not_enums() {
        for def in [
            "CHECK ((qty > 0))",
            "CHECK ((a = b))",
            "CHECK ((kind = 'x'::text) OR (other = 'y'::text))",
            "CHECK ((kind = 'x'::text) AND (kind = 'y'::text))",
            "CHECK ((length((code)::text) = 3))",
            "CHECK ((prio = ANY (ARRAY[1, 'a'::text])))",
            "CHECK ((x = ANY (ARRAY['a'::text])) OR (y IS NULL))",
            "CHECK ((NOT (kind = 'x'::text)))",
        ] {
            assert_eq!(parse_check(def), None, "{def}");
        }
    }

    #[test]
    fn kinds_of_types() {
        assert_eq!(Kind::of("int8", None), Kind::Int(64));
        assert_eq!(Kind::of("bpchar", None), Kind::Text);
        assert_eq!(Kind::of("timestamptz", None), Kind::Timestamp { tz: true });
        assert_eq!(
            Kind::of("mood", Some(strings(&["ok"]))),
            Kind::Enum(strings(&["ok"]))
        );
        assert_eq!(Kind::of("inet", None), Kind::Other("inet".into()));
    }
}
