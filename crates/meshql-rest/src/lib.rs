//! Restlettes: the REST API of one entity (CONTRACT §2).
//!
//! | route | behaviour |
//! |---|---|
//! | `POST P` | validate, store a new document: 201, payload + `id`, `Location` |
//! | `GET P` | 200, array of the current payloads, streamed page by page; `?limit=N&after=id`: one page, `Link: rel="next"` |
//! | `GET P/{id}` | 200 payload / 404 |
//! | `PUT P/{id}` | validate, replace (new version): 200 / 404 |
//! | `DELETE P/{id}` | tombstone: 200 (idempotent) / 404 for never-seen ids |
//! | `POST P/bulk` | all-or-nothing create of an array: 201 |
//! | `GET P/bulk?ids=a,b` | 200, the visible ones |
//! | `GET P/api-docs`, `P/api-docs/swagger.json` | Swagger UI, OpenAPI 3 document |
//!
//! Errors are JSON `{"error": ...}` with a precise status; a rejected write stores nothing.

mod error;
pub mod list;
mod openapi;
mod routes;

pub use error::RestError;
pub use openapi::{openapi_document, read_only as read_only_openapi};
pub use routes::{router, Restlette, NOT_IDS};
