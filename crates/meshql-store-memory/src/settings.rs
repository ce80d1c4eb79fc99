//! `[storage.<name>] type = "memory"`: no fields; registration.

use crate::MemoryDatabase;
use async_trait::async_trait;
use meshql_core::{
    BackendContext, Component, DynDatabase, SettingError, Storage, StorageTarget, StoreError,
};
use schemars::JsonSchema;
use serde::Deserialize;
use std::sync::Arc;

/// In-process memory: nothing survives a restart (tests and demos). Templates must be JSON
/// filters.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemorySettings {}

/// Registers the memory backend with a backend registry.
#[derive(Debug, Default, Clone, Copy)]
pub struct MemoryBackend;

impl Component<Storage> for MemoryBackend {
    const KIND: &'static str = "memory";
    type Settings = MemorySettings;

    fn build(
        &self,
        _: MemorySettings,
        context: &BackendContext<'_>,
    ) -> Result<Box<dyn StorageTarget>, SettingError> {
        Ok(Box::new(MemoryTarget {
            block: context.block.to_owned(),
        }))
    }
}

/// Each memory block is a database of its own.
#[derive(Debug)]
struct MemoryTarget {
    block: String,
}

#[async_trait]
impl StorageTarget for MemoryTarget {
    fn target(&self) -> String {
        format!("memory:{}", self.block)
    }

    fn sql_templates(&self) -> bool {
        false
    }

    async fn open(&self) -> Result<DynDatabase, StoreError> {
        Ok(Arc::new(MemoryDatabase))
    }
}
