//! The ordinary (SQL) connection to the legacy database: catalog reads, the publication and
//! the slot; and the replication connection's settings.

use super::settings::{PostgresCdcSource, Table};
use meshql_pg::tunnel::Tunnel;
use pgwire_replication::ReplicationConfig;
use std::collections::HashMap;
use std::time::Duration;

/// The replication connection's settings, from the source's URL; through `tunnel` when the
/// URL asks for TLS (see [`meshql_pg::tunnel`]).
pub(super) fn replication_config(
    source: &PostgresCdcSource,
    tunnel: Option<&Tunnel>,
) -> Result<ReplicationConfig, String> {
    let config = meshql_pg::tls::read_url(&source.url)?.config;
    let host = match config.get_hosts().first() {
        _ if tunnel.is_some() => tunnel.expect("checked").socket_dir(),
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        #[cfg(unix)]
        Some(tokio_postgres::config::Host::Unix(p)) => p.to_string_lossy().into_owned(),
        None => "127.0.0.1".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let password = config
        .get_password()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .unwrap_or_default();
    let mut c = ReplicationConfig::new(
        host,
        config.get_user().unwrap_or("postgres"),
        password,
        config.get_dbname().unwrap_or("postgres"),
        source.slot.clone(),
        source.publication.clone(),
    )
    .with_port(port)
    .with_status_interval(Duration::from_secs(1))
    .with_wakeup_interval(Duration::from_secs(1));
    c.application_name = Some(format!("meshql {}", source.slot));
    Ok(c)
}

/// A server error's message and code, or the client's error.
pub(super) fn db_error(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

/// The ordinary (SQL) connection to the legacy database.
pub(super) struct Sql {
    pub(super) client: tokio_postgres::Client,
    pub(super) task: tokio::task::JoinHandle<()>,
}

impl Drop for Sql {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Sql {
    pub(super) async fn connect(url: &str) -> Result<Sql, String> {
        let meshql_pg::tls::Connection {
            mut config,
            mode,
            tls,
            ..
        } = meshql_pg::tls::read_url(url)?;
        config
            .application_name("meshql postgres_cdc")
            .connect_timeout(Duration::from_secs(10));
        let connect = async {
            match config.connect(tls.clone()).await {
                Err(e) if mode == meshql_pg::tls::SslMode::Prefer => {
                    match meshql_pg::tls::tls_failure(&e) {
                        Some(reason) => {
                            tracing::warn!(
                                "postgres_cdc: the TLS handshake failed ({reason}); \
                                 sslmode=prefer: connecting without TLS"
                            );
                            let mut plain = config.clone();
                            plain.ssl_mode(tokio_postgres::config::SslMode::Disable);
                            plain.connect(tls).await
                        }
                        None => Err(e),
                    }
                }
                other => other,
            }
        };
        let (client, connection) = tokio::time::timeout(Duration::from_secs(15), connect)
            .await
            .map_err(|_| "connecting to the legacy database timed out".to_string())?
            .map_err(|e| {
                let reason = meshql_pg::tls::tls_failure(&e).unwrap_or_else(|| db_error(&e));
                format!("connecting to the legacy database: {reason}")
            })?;
        let task = tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Sql { client, task })
    }

    /// A table's columns and their type ids, in the table's order.
    pub(super) async fn column_types(&self, table: &Table) -> Result<Vec<(String, u32)>, String> {
        let rows = self
            .client
            .query(
                "SELECT a.attname::text, a.atttypid FROM pg_attribute a \
                 JOIN pg_class c ON c.oid = a.attrelid \
                 JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 \
                   AND NOT a.attisdropped AND a.attgenerated = '' ORDER BY a.attnum",
                &[&table.schema, &table.name],
            )
            .await
            .map_err(|e| format!("reading {}'s columns: {}", table.label(), db_error(&e)))?;
        Ok(rows
            .iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, u32>(1)))
            .collect())
    }

    pub(super) async fn check_wal_level(&self) -> Result<(), String> {
        let row = self
            .client
            .query_one("SHOW wal_level", &[])
            .await
            .map_err(|e| db_error(&e))?;
        let level: String = row.get(0);
        if level != "logical" {
            return Err(format!(
                "the legacy database's wal_level is `{level}`: logical replication needs \
                 wal_level = logical (set it and restart PostgreSQL)"
            ));
        }
        Ok(())
    }

    /// The tables a publication publishes (`None`: no such publication).
    pub(super) async fn published(&self, publication: &str) -> Result<Option<Vec<Table>>, String> {
        let exists = self
            .client
            .query_opt(
                "SELECT 1 FROM pg_publication WHERE pubname = $1",
                &[&publication],
            )
            .await
            .map_err(|e| db_error(&e))?
            .is_some();
        if !exists {
            return Ok(None);
        }
        let rows = self
            .client
            .query(
                "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1",
                &[&publication],
            )
            .await
            .map_err(|e| db_error(&e))?;
        Ok(Some(
            rows.iter()
                .map(|r| Table {
                    schema: r.get(0),
                    name: r.get(1),
                })
                .collect(),
        ))
    }

    /// Each table's primary key columns, in the key's order; a table without one is an error
    /// (its rows could not be told apart).
    pub(super) async fn primary_keys(
        &self,
        tables: &[Table],
    ) -> Result<HashMap<Table, Vec<String>>, String> {
        let mut keys = HashMap::with_capacity(tables.len());
        for table in tables {
            let rows = self
                .client
                .query(
                    "SELECT a.attname::text FROM pg_index i \
                     JOIN pg_class c ON c.oid = i.indrelid \
                     JOIN pg_namespace n ON n.oid = c.relnamespace \
                     JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true \
                     JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum \
                     WHERE i.indisprimary AND n.nspname = $1 AND c.relname = $2 \
                     ORDER BY k.ord",
                    &[&table.schema, &table.name],
                )
                .await
                .map_err(|e| db_error(&e))?;
            if rows.is_empty() {
                let exists = self
                    .client
                    .query_opt(
                        "SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                         WHERE n.nspname = $1 AND c.relname = $2",
                        &[&table.schema, &table.name],
                    )
                    .await
                    .map_err(|e| db_error(&e))?
                    .is_some();
                return Err(if exists {
                    format!(
                        "table {} has no primary key: its rows cannot be told apart",
                        table.label()
                    )
                } else {
                    format!("table {} does not exist", table.label())
                });
            }
            keys.insert(table.clone(), rows.iter().map(|r| r.get(0)).collect());
        }
        Ok(keys)
    }

    /// WAL bytes the slot keeps past what its consumer confirmed (0 when it has no such
    /// position yet).
    pub(super) async fn slot_lag(&self, slot: &str) -> Result<u64, String> {
        let row = self
            .client
            .query_opt(
                "SELECT COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint \
                 FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await
            .map_err(|e| db_error(&e))?;
        Ok(row.map_or(0, |r| r.get::<_, i64>(0).max(0) as u64))
    }

    pub(super) async fn slot_exists(&self, slot: &str) -> Result<bool, String> {
        Ok(self
            .client
            .query_opt(
                "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await
            .map_err(|e| db_error(&e))?
            .is_some())
    }

    /// Drops a slot left by a copy cut short; a slot still held by a session that died is
    /// waited for (up to 30 s).
    pub(super) async fn drop_slot(&self, slot: &str) -> Result<(), String> {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            match self
                .client
                .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
                .await
            {
                Ok(_) => return Ok(()),
                Err(e)
                    if e.code() == Some(&tokio_postgres::error::SqlState::OBJECT_IN_USE)
                        && std::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(format!("dropping slot {slot}: {}", db_error(&e))),
            }
        }
    }
}
