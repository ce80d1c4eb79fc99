//! The storage conformance suite (CONTRACT §4), written once and run unchanged against every
//! backend. A backend's test file calls [`conformance_tests!`] with an async expression that
//! yields a fresh, prepared, empty [`DynStore`]:
//!
//! ```text
//! meshql_conformance::conformance_tests!(async { my_backend::fresh_store().await });
//! ```
//!
//! Each case is a plain async function taking the store, so a failure names its case.
//! [`operator_tests!`] and [`output_tests!`] (processor outputs, `meshql_core::output`) are
//! run the same way.
//!
//! [`DynStore`]: meshql_core::DynStore

mod faults;
mod feed;
mod harness;
mod nested;
pub mod operators;
pub mod outputs;
mod pages;
mod reads;
mod relays;
mod versions;
mod writes;

pub use faults::*;
pub use feed::*;
pub use harness::{templates, test_server_url};
pub use nested::*;
pub use operators::*;
pub use outputs::*;
pub use pages::*;
pub use reads::*;
pub use relays::{relay_conformance, RELAY_ENTITIES};
pub use versions::*;
pub use writes::*;
