//! The open database as the server sees it: a store per table on the primary, and on the
//! replica when the block has a `read_url`, with the probe that says whether reads may go there.

use crate::db::MysqlDatabase;
use crate::replica::MysqlReplicaProbe;
use crate::store::MysqlStore;
use std::sync::Arc;

#[async_trait::async_trait]
impl meshql_core::Database for MysqlDatabase {
    fn backend(&self) -> &'static str {
        "mysql"
    }
    fn store(self: Arc<Self>, table: &str) -> meshql_core::DynStore {
        Arc::new(MysqlStore::new(self, table))
    }
    fn replica(self: Arc<Self>, table: &str) -> Option<meshql_core::DynReader> {
        let replica = self.replica.clone()?;
        Some(Arc::new(MysqlStore::new(replica, table)))
    }
    fn replica_probe(self: Arc<Self>) -> Option<Arc<dyn meshql_core::replica::ReplicaProbe>> {
        let replica = self.replica.clone()?;
        Some(Arc::new(MysqlReplicaProbe::new(
            replica,
            self.replica_settings,
        )))
    }
    async fn close(&self) {
        MysqlDatabase::close(self).await;
    }
}
