//! The engine: one [`EntityService`] per entity, between the frontends (REST, GraphQL, and
//! later processors, subscriptions, the console) and storage.
//!
//! Everything a write means lives here once: the JSON Schema validation of payloads, who the
//! caller is ([`Session`], from the `Authorization` header through the service's
//! [`meshql_core::Authorizer`]), what they may do to each entity and which fields they may
//! read ([`meshql_core::Grants`] from the service's [`meshql_core::Policy`], 403 `FORBIDDEN`
//! otherwise), which documents they may read and change, the tokens stamped
//! on what they write, and the correlation id their changes carry into the change feed.
//! Frontends translate their protocol into calls on a service and its errors back into their
//! protocol ([`EngineError::kind`]); they never reach a store directly.
//!
//! Reads and writes go through separate handles ([`EntityService::reader`],
//! [`EntityService::writer`]), so a deployment can serve reads from a replica or a cache while
//! writes go to the primary; what a write depends on (the current version a masked update
//! keeps fields of) is always read from the primary. Read permissions are decided in one
//! place, [`EntityService::read_grant`], for REST (documents lose hidden fields), GraphQL
//! (`reads`: rows come with their mask) and the change feed. The stamps of acknowledged writes
//! are shared by the services of a process ([`meshql_core::time::Acknowledged`]) and give
//! every read snapshot ([`EntityService::read_snapshot`]) explicitly.

pub mod cache;
pub mod consistency;
mod error;
pub mod metrics;
mod reads;
pub mod replica;
mod service;
mod validate;

pub use cache::{
    Cache, CacheCounts, CacheSettings, CachedReader, SharedCache, SharedCacheError,
    SharedCacheRegistry, SharedCacheTarget, SharedCaches,
};
pub use consistency::{ReadAfter, Token};
pub use error::EngineError;
pub use reads::Granted;
pub use replica::{Detour, FallbackReader, ReplicaHealth, ReplicaState, ReplicaStats};
pub use service::{visibility, Access, EntityService, Prior, Session};
pub use validate::{PayloadValidator, ValidatorError};
