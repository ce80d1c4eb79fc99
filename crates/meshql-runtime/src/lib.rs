//! The runtime: what a resolved config becomes before any HTTP is involved — the service
//! graph every frontend and every consumer of the change feed works on.
//!
//! ```text
//!                 ResolvedConfig + Registries (the binary's storage, relays, caches)
//!                                  │ check: every problem at once, nothing opened
//!                                  ▼
//!  Runtime::build ─▶ storage (served stores, replica probes) ─▶ engine services (+ cache)
//!                 ─▶ GraphQL registry ─▶ change log + hub ─▶ subscriptions, relays, processors
//!                                  │
//!                  meshql-server: routes over it (REST, GraphQL, /_changes, console, ops)
//!                  meshql process: ProcessorHost, the processors alone
//! ```
//!
//! The runtime knows no backend, relay or cache by name: the binary registers them
//! ([`Registries`]) and the config picks them by `type`.

mod auth;
pub mod backup;
mod caches;
mod check;
mod error;
pub mod export;
mod feed;
pub mod import;
mod metrics;
pub mod migrations;
mod processors;
mod rate_limits;
mod registries;
mod relays;
mod runtime;
mod served;
mod signal;
mod storage;
pub mod subscriptions;

pub use check::check;
pub use error::BuildError;
pub use processors::{configure as processor_plans, host as host_processors, ProcessorHost};
pub use registries::Registries;
pub use relays::{configure as relay_targets, Relays};
pub use runtime::Runtime;
pub use signal::shutdown_signal;
pub use storage::configure as storage_targets;
pub use subscriptions::Subscriptions;
