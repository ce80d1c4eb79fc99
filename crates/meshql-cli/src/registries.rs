//! The parts this binary is built with — every storage backend, relay, shared cache and
//! shared rate-limit store, each registered with one line. The runtime and the server know none of them by name; a
//! config picks them by `type`.

use meshql_runtime::Registries;
use std::sync::OnceLock;

/// The storage backends, relays, shared caches and rate-limit stores of this build, in the order error messages
/// and `meshql config-schema` list them.
pub fn registries() -> &'static Registries {
    static REGISTRIES: OnceLock<Registries> = OnceLock::new();
    REGISTRIES.get_or_init(|| Registries {
        storage: meshql_core::BackendRegistry::new()
            .register(meshql_store_sqlite::SqliteBackend)
            .register(meshql_store_memory::MemoryBackend)
            .register(meshql_store_postgres::PostgresBackend)
            .register(meshql_store_mysql::MysqlBackend)
            .register(meshql_store_mongo::MongoBackend)
            .register(meshql_store_kafka::KafkaBackend),
        relays: meshql_changes::RelayRegistry::new()
            .register(meshql_relay_kafka::KafkaBackend)
            .register(meshql_relay_nats::NatsBackend)
            .register(meshql_relay_jsonl::JsonlBackend),
        caches: meshql_engine::SharedCacheRegistry::new()
            .register(meshql_cache_redis::RedisBackend),
        limits: meshql_core::SharedLimitRegistry::new().register(meshql_cache_redis::RedisBackend),
    })
}

#[cfg(test)]
mod tests;
