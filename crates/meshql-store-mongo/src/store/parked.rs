//! [`Parked`]: the cursor of a page read at a fixed time, kept for the page after it (the
//! reader parks and takes them back, `read.rs`).

use meshql_core::{Millis, TokenFilter};
use mongodb::bson::Document;
use std::time::Duration;

/// The cursor of a [`StoreReader::list_page`](meshql_core::StoreReader::list_page) read at a fixed time, parked after a full
/// page so that the page after it (`after` = the page's last id, same time and tokens)
/// continues it instead of querying again. The continuation is what a new query would
/// return — versions at or before a past time do not change — so this only saves work; but
/// that work is large where the server cannot seek by id: FerretDB v1 pushes neither `$gt` on
/// strings nor sorts down to PostgreSQL, so there each new page query reads and sorts the
/// whole collection, and a streamed list of N documents would cost N² / page.
pub(super) struct Parked {
    pub(super) filter: TokenFilter,
    pub(super) at: Millis,
    /// The last id returned: the `after` of the page that may continue this cursor.
    pub(super) after: String,
    pub(super) cursor: mongodb::Cursor<Document>,
    pub(super) since: std::time::Instant,
}

/// Parked cursors kept at most (the oldest is dropped), and for at most how long.
pub(super) const PARKED_MAX: usize = 32;
pub(super) const PARKED_FOR: Duration = Duration::from_secs(30);
