//! The change feed of a meshql service.
//!
//! Every store keeps its own feed (`meshql_core::Store::changes`, transactional, with
//! per-store cursors). A [`Hub`] copies every store's feed into one embedded log
//! ([`meshql_log::Log`]), exactly once, so that the service has a single, dense sequence of
//! positions across all its entities and backends. Consumers — `/_changes` over HTTP and
//! SSE, `meshql changes` in another process, relays to Kafka and NATS, processors — read the
//! log through [`feed`], at their own pace: a slow consumer holds no buffer anywhere, it just
//! reads older positions.
//!
//! ```text
//!  REST/GraphQL writes ──▶ store (version row + feed cursor, one transaction)
//!                              │ commit signal / poll
//!                              ▼
//!                        Hub tailer per entity ──append──▶ log (dir/changes, segments)
//!                                                            │ subscribe / read(after)
//!                                            /_changes, SSE, CLI, relays, processors
//! ```

pub mod feed;
pub mod hub;
pub mod record;
pub mod registry;
pub mod relay;

pub use feed::{FeedFilter, FeedSource, Page};
pub use hub::{EntityFeedStats, Hub, HubError, HubOptions};
pub use record::{change_id, encode};
pub use registry::{RelayBackend, RelayContext, RelayEntity, RelayRegistry, RelayTarget};
pub use relay::{
    confirmed, relay_group, Confirmation, Relay, RelayChange, RelayError, RelayOptions, RelayStats,
    Sink, SinkError,
};
