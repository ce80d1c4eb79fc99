//! The `postgres_cdc` block: its fields, their checks, and the source they make.

use crate::source::contract::{self, SourceType};
use meshql_core::SettingError;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    url: String,
    publication: String,
    #[serde(default)]
    slot: Option<String>,
    tables: Vec<String>,
    #[serde(default = "yes")]
    create: bool,
    #[serde(default = "yes")]
    snapshot: bool,
    #[serde(default)]
    entities: BTreeMap<String, String>,
}

/// A table of the legacy database.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Table {
    pub schema: String,
    pub name: String,
}

impl Table {
    /// `name` or `schema.name` (as configured: unquoted identifiers, folded to lower case).
    fn parse(text: &str) -> Option<Table> {
        let (schema, name) = match text.split_once('.') {
            Some((s, n)) => (s, n),
            None => ("public", text),
        };
        (ident_ok(schema) && ident_ok(name)).then(|| Table {
            schema: schema.to_ascii_lowercase(),
            name: name.to_ascii_lowercase(),
        })
    }

    /// How inputs name it: `name` in `public`, else `schema.name`.
    pub fn label(&self) -> String {
        if self.schema == "public" {
            self.name.clone()
        } else {
            format!("{}.{}", self.schema, self.name)
        }
    }

    /// Quoted for SQL.
    pub(super) fn sql(&self) -> String {
        format!("\"{}\".\"{}\"", self.schema, self.name)
    }
}

/// An unquoted SQL identifier.
fn ident_ok(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
        && s.len() <= 63
}

/// A publication or slot name meshql can write into a command unquoted.
fn name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// A checked `postgres_cdc` source.
#[derive(Debug, Clone, PartialEq)]
pub struct PostgresCdcSource {
    pub url: String,
    pub publication: String,
    pub slot: String,
    pub tables: Vec<Table>,
    pub create: bool,
    pub snapshot: bool,
    /// Table label → entity.
    pub entities: BTreeMap<String, String>,
}

impl PostgresCdcSource {
    /// The entity a table's changes are inputs of.
    pub fn entity_of(&self, table: &Table) -> String {
        let label = table.label();
        self.entities.get(&label).cloned().unwrap_or(label)
    }
}

/// Checks a processor's `source = { type = "postgres_cdc", … }` block.
pub fn compile(settings: &Value) -> Result<PostgresCdcSource, SettingError> {
    contract::compile(settings)
}

pub(super) fn checked(s: Settings) -> Result<PostgresCdcSource, SettingError> {
    let config = meshql_pg::read_url(s.url.trim())
        .map_err(|e| {
            SettingError::new(
                "source.url",
                format!(
                    "not a usable PostgreSQL URL: {e}; e.g. postgres://user@host:5432/database"
                ),
            )
        })?
        .config;
    if config.get_hosts().is_empty() || config.get_dbname().is_none() {
        return Err(SettingError::new(
            "source.url",
            "name the host and the database, e.g. postgres://user@host:5432/database",
        ));
    }
    if !name_ok(&s.publication) {
        return Err(SettingError::new(
            "source.publication",
            format!(
                "`{}` is not a publication name meshql uses (lower-case letters, digits and `_`, \
                 at most 63)",
                s.publication
            ),
        ));
    }
    let slot = s
        .slot
        .unwrap_or_else(|| format!("meshql_{}", s.publication));
    if !name_ok(&slot) {
        return Err(SettingError::new(
            "source.slot",
            format!(
                "`{slot}` is not a replication slot name (lower-case letters, digits and `_`, at \
                 most 63)"
            ),
        ));
    }
    if s.tables.is_empty() {
        return Err(SettingError::new(
            "source.tables",
            "name the tables to capture, e.g. [\"cust_acct\", \"billing.bill_hdr\"]",
        ));
    }
    let mut tables = Vec::with_capacity(s.tables.len());
    for (i, t) in s.tables.iter().enumerate() {
        let table = Table::parse(t).ok_or_else(|| {
            SettingError::new(
                format!("source.tables[{i}]"),
                format!("`{t}` is not a table name (`name` or `schema.name`, unquoted)"),
            )
        })?;
        if tables.contains(&table) {
            return Err(SettingError::new(
                format!("source.tables[{i}]"),
                format!("`{t}` is named twice"),
            ));
        }
        tables.push(table);
    }
    for key in s.entities.keys() {
        if !tables.iter().any(|t| t.label() == *key) {
            return Err(SettingError::new(
                format!("source.entities.{key}"),
                format!("`{key}` is not one of the source's tables"),
            ));
        }
    }
    Ok(PostgresCdcSource {
        url: s.url.trim().to_owned(),
        publication: s.publication,
        slot,
        tables,
        create: s.create,
        snapshot: s.snapshot,
        entities: s.entities,
    })
}

/// Registers the PostgreSQL capture source (`type = "postgres_cdc"`).
pub type PostgresCdcSourceType = SourceType<PostgresCdcSource>;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    fn ok(v: Value) -> PostgresCdcSource {
        compile(&v).unwrap()
    }

    fn err(v: Value) -> SettingError {
        compile(&v).unwrap_err()
    }

    #[test]
    fn settings_are_checked_field_by_field() {
        let s = ok(
            json!({"type": "postgres_cdc", "url": "postgres://u@h:5433/legacy",
            "publication": "legacy_pub", "tables": ["cust_acct", "Billing.BILL_HDR"]}),
        );
        assert_eq!(s.slot, "meshql_legacy_pub");
        assert_eq!(s.tables[0].label(), "cust_acct");
        assert_eq!(s.tables[1].label(), "billing.bill_hdr");
        assert!(s.create && s.snapshot);
        let base = json!({"type": "postgres_cdc", "url": "postgres://u@h/db", "publication": "p", "tables": ["t"]});
        let with = |k: &str, v: Value| {
            let mut b = base.clone();
            b[k] = v;
            b
        };
        assert_eq!(
            err(with("url", json!("mysql://x"))).field.as_deref(),
            Some("source.url")
        );
        // TLS settings are read as the PostgreSQL store reads them
        let bad = err(with("url", json!("postgres://u@h/db?sslmode=sometimes")));
        assert_eq!(bad.field.as_deref(), Some("source.url"));
        assert!(bad.message.contains("sslmode"), "{bad:?}");
        let bad = err(with(
            "url",
            json!("postgres://u@h/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem"),
        ));
        assert!(bad.message.contains("/nonexistent/ca.pem"), "{bad:?}");
        assert!(compile(&with("url", json!("postgres://u@h/db?sslmode=require"))).is_ok());
        assert_eq!(
            err(with("publication", json!("Legacy Pub")))
                .field
                .as_deref(),
            Some("source.publication")
        );
        assert_eq!(
            err(with("slot", json!("bad-slot"))).field.as_deref(),
            Some("source.slot")
        );
        assert_eq!(
            err(with("tables", json!([]))).field.as_deref(),
            Some("source.tables")
        );
        assert_eq!(
            err(with("tables", json!(["a b"]))).field.as_deref(),
            Some("source.tables[0]")
        );
        assert_eq!(
            err(with("tables", json!(["t", "T"]))).field.as_deref(),
            Some("source.tables[1]")
        );
        assert_eq!(
            err(with("entities", json!({"other": "e"})))
                .field
                .as_deref(),
            Some("source.entities.other")
        );
        assert!(err(with("nope", json!(1)))
            .field
            .unwrap()
            .starts_with("source"));
    }
}
