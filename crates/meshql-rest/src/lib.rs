//! Restlettes: the REST API of one entity (CONTRACT §2).
//!
//! | route | behaviour |
//! |---|---|
//! | `POST P` | validate, store a new document: 201, payload + `id`, `Location` |
//! | `GET P` | 200, array of the current payloads, streamed page by page; `?limit=N&after=id`: one page, `Link: rel="next"`; `?at=T`: as of `T` |
//! | `GET P/{id}` | 200 payload / 404; `?at=T`: the version current at `T` |
//! | `PUT P/{id}` | validate, replace (new version): 200 / 404 |
//! | `DELETE P/{id}` | tombstone: 200 (idempotent) / 404 for never-seen ids |
//! | `POST P/bulk` | all-or-nothing create of an array: 201 |
//! | `GET P/bulk?ids=a,b` | 200, the visible ones; `&at=T`: as of `T` |
//! | `GET P/api-docs`, `P/api-docs/swagger.json` | Swagger UI, OpenAPI 3 document |
//!
//! `T` is milliseconds since the Unix epoch or an RFC 3339 date-time, read as GraphQL's `at`
//! is. A query parameter a route does not take is a 400 naming the ones it takes
//! ([`params`]).
//!
//! Errors are JSON `{"error": ...}` with a precise status; a rejected write stores nothing.

pub mod edge;
mod error;
pub mod list;
mod openapi;
pub mod params;
mod response;
mod routes;

pub use error::RestError;
pub use openapi::{openapi_document, read_only as read_only_openapi};
pub use routes::{router, Restlette, NOT_IDS};
