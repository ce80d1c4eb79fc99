//! The change feed of a meshql service.
//!
//! Every store keeps its own feed (`meshql_core::Store::changes`, transactional, with
//! per-store cursors). A [`Hub`] copies every store's feed into one embedded log
//! ([`meshql_log::Log`]), exactly once, so that the service has a single, dense sequence of
//! positions across all its entities and backends. Readers — `/_changes` over HTTP and SSE,
//! `meshql changes` in another process — read the log through [`feed`], at their own pace:
//! a slow reader holds no buffer anywhere, it just reads older positions.
//!
//! Relays (to Kafka, NATS JetStream) and processors are [`Consumer`]s: one loop
//! ([`consumer`]) per consumer group of the log (`relay-<name>`, `processor-<name>`) that
//! hands batches of changes, optionally of some entities only, to its [`Handler`], keeps
//! several in flight, and commits the group's position once they are confirmed, so that it
//! resumes there after a restart (at-least-once delivery). A [`Relay`] is the consumer whose
//! handler is a broker's client ([`Sink`]).
//!
//! ```text
//!  REST/GraphQL writes ──▶ store (version row + feed cursor, one transaction)
//!                              │ commit signal / poll
//!                              ▼
//!                        Hub tailer per entity ──append──▶ log (dir/changes, segments)
//!                                                            │
//!                         ┌──────────────────────────────────┴───┐
//!                         │ read(after)                          │ its consumer group
//!                         ▼                                      ▼
//!                 /_changes, SSE, CLI                        Consumer: Handler, confirm, commit
//!                                                            ├─ relay-<name>: Sink ─▶ Kafka, NATS
//!                                                            └─ processor-<name>: a processor
//! ```

pub mod consumer;
pub mod feed;
pub mod hub;
mod metrics;
pub mod record;
pub mod registry;
pub mod relay;

pub use consumer::{
    confirmed, Change, Confirmation, Consumer, ConsumerError, ConsumerLog, ConsumerOptions,
    ConsumerStats, Handler, HandlerError, TailedReader,
};
pub use feed::{FeedFilter, FeedSource, Page};
pub use hub::{CopyListener, EntityFeedStats, Hub, HubError, HubOptions, Listeners};
pub use record::{change_id, encode};
pub use registry::{RelayContext, RelayEntity, RelayRegistry, RelayTarget, Relays};
pub use relay::{
    relay_group, Relay, RelayChange, RelayError, RelayOptions, RelayStats, Sink, SinkError,
};
