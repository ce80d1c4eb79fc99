//! How far this process has applied a topic, as the materialiser publishes it and the writer
//! and the health report read it.

use std::collections::BTreeMap;

/// What this process has applied of a topic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// Partition → the next offset to apply (every record before it is applied).
    pub next: BTreeMap<i32, i64>,
    /// Records that were not envelopes, skipped since start.
    pub skipped: u64,
    /// Why the last batch could not be applied, while it is being tried again.
    pub stalled: Option<String>,
}

impl Applied {
    /// Whether the record at `offset` of `partition` is applied.
    pub fn covers(&self, partition: i32, offset: i64) -> bool {
        self.next.get(&partition).is_some_and(|n| *n > offset)
    }

    /// Records still to apply before `ends` (partition → its end offset), summed.
    pub fn behind(&self, ends: impl IntoIterator<Item = (i32, i64)>) -> i64 {
        ends.into_iter()
            .map(|(p, end)| (end - self.next.get(&p).copied().unwrap_or(0)).max(0))
            .sum()
    }
}
