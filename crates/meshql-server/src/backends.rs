//! The backend registry: the one place that turns a storage block into an open database
//! ([`meshql_core::Database`]). Everything else in the server — one database per storage
//! target, one store per entity, readiness, shutdown — works on databases without knowing
//! their backend. A new backend is its crate (a `Database` and its stores, proven by the
//! conformance suite), its config block, and one arm in each function below.

use meshql_config::StorageSpec;
use meshql_core::{DynDatabase, StoreError};
use meshql_store_memory::MemoryDatabase;
use meshql_store_mongo::{MongoDatabase, MongoOptions};
use meshql_store_mysql::{MysqlDatabase, MysqlOptions};
use meshql_store_postgres::{PostgresDatabase, PostgresOptions};
use meshql_store_sqlite::{SqliteDatabase, SqliteOptions};
use std::sync::Arc;
use std::time::Duration;

/// What a storage block points at. Blocks with one target share one database (one SQLite
/// writer, one connection pool) and, at start-up, one reachability check. Memory blocks
/// each get their own.
pub fn target(name: &str, spec: &StorageSpec) -> String {
    match spec {
        StorageSpec::Sqlite { path, .. } => format!("sqlite:{}", path.display()),
        StorageSpec::Memory => format!("memory:{name}"),
        StorageSpec::Postgres { url, read_url, .. } => {
            format!("postgres:{url} {}", read_url.as_deref().unwrap_or(""))
        }
        StorageSpec::Mysql { url, .. } => format!("mysql:{url}"),
        StorageSpec::Mongo { uri, db, .. } => format!("mongo:{uri} {db}"),
    }
}

/// Opens the database a storage block describes (connection pools connect lazily).
pub async fn open(spec: &StorageSpec) -> Result<DynDatabase, StoreError> {
    Ok(match spec {
        StorageSpec::Sqlite {
            path,
            synchronous_full,
        } => {
            let options = SqliteOptions {
                synchronous_full: *synchronous_full,
                ..SqliteOptions::default()
            };
            SqliteDatabase::open(path, options)?
        }
        StorageSpec::Memory => Arc::new(MemoryDatabase),
        StorageSpec::Postgres {
            url,
            read_url,
            pool_size,
            pool_wait_ms,
            statement_timeout_ms,
            nested_sql,
        } => {
            let mut options = PostgresOptions::new(url.clone());
            options.read_url = read_url.clone();
            options.pool_size = *pool_size;
            options.pool_wait = Duration::from_millis(*pool_wait_ms);
            options.statement_timeout = Duration::from_millis(*statement_timeout_ms);
            options.nested_sql = *nested_sql;
            PostgresDatabase::connect(&options)?
        }
        StorageSpec::Mysql {
            url,
            pool_size,
            pool_wait_ms,
            nested_sql,
        } => {
            let mut options = MysqlOptions::new(url.clone());
            options.pool_size = *pool_size;
            options.pool_wait = Duration::from_millis(*pool_wait_ms);
            options.nested_sql = *nested_sql;
            MysqlDatabase::connect(&options)?
        }
        StorageSpec::Mongo {
            uri,
            db,
            pool_size,
            pool_wait_ms,
        } => {
            let mut options = MongoOptions::new(uri.clone(), db.clone());
            options.pool_size = *pool_size;
            options.pool_wait = Duration::from_millis(*pool_wait_ms);
            MongoDatabase::connect(&options).await?
        }
    })
}
