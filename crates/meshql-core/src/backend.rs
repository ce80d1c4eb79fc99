//! An open database of some backend: a SQLite file, a PostgreSQL or MariaDB pool, a MongoDB
//! client. The server opens one per distinct storage target (see `meshql-server`'s backend
//! registry) and asks it for one store per entity table; at shutdown it closes each once.

use crate::DynStore;
use async_trait::async_trait;
use std::sync::Arc;

#[async_trait]
pub trait Database: Send + Sync + 'static {
    /// The backend's name, as storage blocks spell it (`sqlite`, `postgres`…).
    fn backend(&self) -> &'static str;

    /// A store for one entity's table in this database.
    fn store(self: Arc<Self>, table: &str) -> DynStore;

    /// Flushes pending writes and releases connections, files and threads.
    async fn close(&self);
}

/// A shared, dynamically dispatched database.
pub type DynDatabase = Arc<dyn Database>;
