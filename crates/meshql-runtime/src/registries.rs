//! Every pluggable part a binary knows, by family: storage backends, relays, shared caches
//! and shared rate-limit stores (processor sources and types are `meshql-process`'s own). The binary registers its
//! parts — one line each — and hands them to the runtime; the runtime knows no backend.

use meshql_changes::RelayRegistry;
use meshql_core::{BackendRegistry, SharedLimitRegistry};
use meshql_engine::SharedCacheRegistry;

/// The parts a service can be built of.
#[derive(Clone, Debug, Default)]
pub struct Registries {
    pub storage: BackendRegistry,
    pub relays: RelayRegistry,
    pub caches: SharedCacheRegistry,
    /// Stores `[server.rate_limit]` may keep its buckets in (`redis = { … }`).
    pub limits: SharedLimitRegistry,
}

impl Registries {
    /// The config's JSON Schema with every registered backend's storage block and every
    /// registered relay type's `[[changes.relay]]` entry.
    pub fn config_json_schema(&self) -> serde_json::Value {
        meshql_config::config_json_schema(&self.storage.schemas(), &self.relays.schemas())
    }
}
