//! The open database as the server sees it: a store per collection through the primary's
//! client, and through the `read_url`'s when there is one, with the probe that says whether
//! reads may go there.

use crate::db::MongoDatabase;
use crate::replica::MongoReplicaProbe;
use crate::store::MongoStore;
use async_trait::async_trait;
use std::sync::Arc;

#[async_trait]
impl meshql_core::Database for MongoDatabase {
    fn backend(&self) -> &'static str {
        "mongo"
    }
    fn store(self: Arc<Self>, collection: &str) -> meshql_core::DynStore {
        Arc::new(MongoStore::new(self, collection))
    }
    fn replica(self: Arc<Self>, collection: &str) -> Option<meshql_core::DynReader> {
        MongoStore::replica(self, collection).map(|s| Arc::new(s) as meshql_core::DynReader)
    }
    fn replica_probe(self: Arc<Self>) -> Option<Arc<dyn meshql_core::replica::ReplicaProbe>> {
        let replica = self.replica.clone()?;
        Some(Arc::new(MongoReplicaProbe::new(
            replica,
            self.replica_settings,
        )))
    }
    async fn close(&self) {
        MongoDatabase::close(self).await;
    }
}
