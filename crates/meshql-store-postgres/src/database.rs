//! The open database as the server sees it: a store per table on the primary, and on the
//! replica when the block has a `read_url`, with the probe that says whether reads may go there.

use crate::db::PostgresDatabase;
use crate::replica::PostgresReplicaProbe;
use crate::store::PostgresStore;
use std::sync::Arc;

#[async_trait::async_trait]
impl meshql_core::Database for PostgresDatabase {
    fn backend(&self) -> &'static str {
        "postgres"
    }
    fn store(self: Arc<Self>, table: &str) -> meshql_core::DynStore {
        Arc::new(PostgresStore::new(self, table))
    }
    fn replica(self: Arc<Self>, table: &str) -> Option<meshql_core::DynReader> {
        PostgresStore::replica(self, table).map(|s| Arc::new(s) as meshql_core::DynReader)
    }
    fn replica_probe(self: Arc<Self>) -> Option<Arc<dyn meshql_core::replica::ReplicaProbe>> {
        let settings = self.replica;
        self.has_replica().then(|| {
            Arc::new(PostgresReplicaProbe::new(self, settings))
                as Arc<dyn meshql_core::replica::ReplicaProbe>
        })
    }
    async fn close(&self) {
        PostgresDatabase::close(self);
    }
}
