//! Reading the change log for consumers: pages of published changes after a position,
//! filtered by entity and by the reader's authorized tokens (exactly as reads are filtered).

use crate::record::{publish, Head};
use meshql_core::{Mask, Visibility};
use meshql_log::{Log, LogError, LogReader, Record};

/// A log to read: the writer's own handle in the serving process, or a [`LogReader`] in
/// another process.
pub trait FeedSource: Send + Sync {
    fn read_records(
        &self,
        after: u64,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<Record>, LogError>;
    fn last_position(&self) -> Result<u64, LogError>;
}

impl FeedSource for Log {
    fn read_records(
        &self,
        after: u64,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<Record>, LogError> {
        self.read(after, max, max_bytes)
    }
    fn last_position(&self) -> Result<u64, LogError> {
        Ok(self.last_offset())
    }
}

impl FeedSource for LogReader {
    fn read_records(
        &self,
        after: u64,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<Record>, LogError> {
        self.read(after, max, max_bytes)
    }
    fn last_position(&self) -> Result<u64, LogError> {
        self.last_offset()
    }
}

/// Which changes a consumer receives, and which fields of them: what its caller may see of
/// documents that come without a store read ([`Visibility`], decided by the engine; the
/// service's own consumers see everything, narrowed to their entities).
pub type FeedFilter = Visibility;

/// A published change (`{"position":…,"payload":{…},…}`) without the fields `mask` hides.
fn masked(change: Vec<u8>, mask: &Mask) -> Vec<u8> {
    let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(&change) else {
        return change;
    };
    if let Some(serde_json::Value::Object(payload)) = value.get_mut("payload") {
        mask.apply(payload);
    }
    serde_json::to_vec(&value).unwrap_or(change)
}

/// One page of the feed.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Page {
    /// Published changes (`{"position":N,…}` JSON objects), in order.
    pub changes: Vec<(u64, Vec<u8>)>,
    /// The position to resume after: the last change examined, delivered or filtered out
    /// (`since` when there was nothing after it).
    pub last: u64,
}

impl Page {
    /// `{"changes":[…],"last":N}`.
    pub fn to_json(&self) -> Vec<u8> {
        let len: usize = self.changes.iter().map(|(_, c)| c.len() + 1).sum();
        let mut out = Vec::with_capacity(len + 40);
        out.extend_from_slice(b"{\"changes\":[");
        for (i, (_, c)) in self.changes.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(c);
        }
        out.extend_from_slice(b"],\"last\":");
        out.extend_from_slice(self.last.to_string().as_bytes());
        out.push(b'}');
        out
    }
}

/// Records examined per page at most, whatever the filter admits (bounds the work of a
/// request whose filter matches little).
const SCAN_LIMIT: usize = 20_000;
/// Record bytes read per round.
const ROUND_BYTES: usize = 4 << 20;

/// Up to `limit` changes after `since` that `filter` admits.
pub fn read_page(
    source: &dyn FeedSource,
    since: u64,
    limit: usize,
    filter: &FeedFilter,
) -> Result<Page, LogError> {
    let mut changes = Vec::new();
    let last = scan(source, since, limit, filter, |record, change| {
        changes.push((record.offset, change))
    })?;
    Ok(Page { changes, last })
}

/// What [`read_page`] does, handing each admitted change to `admit` (its log record, whose
/// data is the stored form, and its published form) instead of collecting them. Returns the
/// position to resume after: the last change examined (`since` when there was nothing after
/// it).
pub(crate) fn scan(
    source: &dyn FeedSource,
    since: u64,
    limit: usize,
    filter: &FeedFilter,
    mut admit: impl FnMut(&Record, Vec<u8>),
) -> Result<u64, LogError> {
    let mut last = since;
    let mut admitted = 0;
    let mut examined = 0;
    while admitted < limit && examined < SCAN_LIMIT {
        let want = (limit - admitted).clamp(16, 1024);
        let records = source.read_records(last, want, ROUND_BYTES)?;
        if records.is_empty() {
            break;
        }
        for r in records {
            examined += 1;
            last = r.offset;
            match Head::parse(&r.data) {
                Ok(head) if filter.admits(&head.entity, &head.authorized_tokens) => {
                    let mut out = Vec::with_capacity(r.data.len() + 24);
                    publish(r.offset, &r.data, &mut out);
                    if let Some(mask) = filter.mask(&head.entity).filter(|m| !m.is_all()) {
                        out = masked(out, mask);
                    }
                    admit(&r, out);
                    admitted += 1;
                    if admitted == limit {
                        break;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(position = r.offset, error = %e, "unreadable change record skipped")
                }
            }
        }
    }
    Ok(last)
}
