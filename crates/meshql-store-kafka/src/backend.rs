//! `type = "kafka"` registered as a storage backend: a block checked into what opens it, and
//! the opened database handing out one store per entity.

use crate::database::{last_written, KafkaDatabase};
use crate::settings::{self, KafkaStorage};
use crate::store::KafkaStore;
use async_trait::async_trait;
use meshql_core::{
    BackendContext, Component, Database, DynDatabase, DynStore, SettingError, Storage,
    StorageTarget, StoreError,
};
use meshql_store_sqlite::{SqliteDatabase, SqliteOptions};
use std::sync::Arc;

/// Registers Kafka with a backend registry.
#[derive(Debug, Default, Clone, Copy)]
pub struct KafkaBackend;

impl Component<Storage> for KafkaBackend {
    const KIND: &'static str = "kafka";
    type Settings = settings::KafkaSettings;

    fn build(
        &self,
        settings: settings::KafkaSettings,
        context: &BackendContext<'_>,
    ) -> Result<Box<dyn StorageTarget>, SettingError> {
        Ok(Box::new(KafkaTarget {
            storage: settings::checked(settings, context)?,
        }))
    }
}

#[derive(Debug)]
struct KafkaTarget {
    storage: KafkaStorage,
}

#[async_trait]
impl StorageTarget for KafkaTarget {
    fn target(&self) -> String {
        // one materialisation file is one database, whatever the topics' names
        format!("kafka:{}", self.storage.file.display())
    }

    async fn open(&self) -> Result<DynDatabase, StoreError> {
        // read before opening writes to it
        let written = last_written(&self.storage.file);
        let local = SqliteDatabase::open(&self.storage.file, SqliteOptions::default())?;
        Ok(Arc::new(KafkaDatabase::new(
            self.storage.clone(),
            local,
            written,
        )))
    }
}

#[async_trait]
impl Database for KafkaDatabase {
    fn backend(&self) -> &'static str {
        "kafka"
    }

    fn store(self: Arc<Self>, table: &str) -> DynStore {
        Arc::new(KafkaStore::new(self, table))
    }

    async fn close(&self) {
        KafkaDatabase::close(self).await;
    }
}
