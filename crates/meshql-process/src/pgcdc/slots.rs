//! What `meshql cdc` and `meshql check` ask a legacy database: its replication slots, a
//! table's columns; dropping a slot.

use super::settings::Table;
use super::sql::{db_error, Sql};
use std::collections::HashMap;

/// `url` without its password (for messages).
pub fn redacted_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((user, host)) => match user.split_once(':') {
            Some((name, _)) => format!("{scheme}://{name}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// A logical replication slot of a database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotInfo {
    pub name: String,
    /// A session streams from it now.
    pub active: bool,
    /// WAL the slot keeps for its consumer (bytes from its restart position to the server's
    /// current one).
    pub retained_bytes: u64,
    /// WAL past the position its consumer confirmed (bytes).
    pub lag_bytes: u64,
}

/// The columns of each of `tables` in the database `url` names (a table that does not exist
/// is left out).
pub async fn columns(url: &str, tables: &[Table]) -> Result<HashMap<Table, Vec<String>>, String> {
    let sql = Sql::connect(url).await?;
    let mut found = HashMap::with_capacity(tables.len());
    for table in tables {
        let rows = sql
            .client
            .query(
                "SELECT a.attname::text FROM pg_attribute a \
                 JOIN pg_class c ON c.oid = a.attrelid \
                 JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped \
                 ORDER BY a.attnum",
                &[&table.schema, &table.name],
            )
            .await
            .map_err(|e| db_error(&e))?;
        if !rows.is_empty() {
            found.insert(table.clone(), rows.iter().map(|r| r.get(0)).collect());
        }
    }
    Ok(found)
}

/// The logical slots of the database `url` names.
pub async fn slots(url: &str) -> Result<Vec<SlotInfo>, String> {
    let sql = Sql::connect(url).await?;
    let rows = sql
        .client
        .query(
            "SELECT slot_name::text, active, \
               COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)::bigint, \
               COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint \
             FROM pg_replication_slots WHERE slot_type = 'logical' AND database = current_database() \
             ORDER BY slot_name",
            &[],
        )
        .await
        .map_err(|e| db_error(&e))?;
    Ok(rows
        .iter()
        .map(|r| SlotInfo {
            name: r.get(0),
            active: r.get(1),
            retained_bytes: r.get::<_, i64>(2).max(0) as u64,
            lag_bytes: r.get::<_, i64>(3).max(0) as u64,
        })
        .collect())
}

/// Drops the slot `name` of the database `url` (refused while a session streams from it).
pub async fn drop_slot(url: &str, name: &str) -> Result<(), String> {
    let sql = Sql::connect(url).await?;
    sql.client
        .execute("SELECT pg_drop_replication_slot($1)", &[&name])
        .await
        .map_err(|e| format!("dropping slot {name}: {}", db_error(&e)))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn passwords_are_kept_out_of_messages() {
        assert_eq!(
            redacted_url("postgres://u:secret@h:5/db"),
            "postgres://u:***@h:5/db"
        );
        assert_eq!(redacted_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redacted_url("postgres://h/db"), "postgres://h/db");
    }
}
