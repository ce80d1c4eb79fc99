//! One class's buckets by caller: a bounded table on the hot path of every limited request.
//!
//! Why not a general cache (moka, which this replaced): a request's lookup there cost about
//! 1,900 instructions — hashing with SipHash, recording the access for its eviction policy and
//! its idle timer — 7.5 % of a whole REST read by id (`scripts/instructions-per-read.sh`, with
//! and without `[server.rate_limit]`). Here a lookup is a shard's read lock, one foldhash and
//! the bucket's compare-and-swap, done under the lock (no reference count to take).
//!
//! **Bounded.** Each of the shards holds at most `max_callers / shards` (at least 1) buckets.
//! A caller that finds its shard full makes room first: buckets idle long enough to be full
//! again are dropped (forgetting them loses nothing: a new bucket starts full), and if none
//! is, the one nearest to full (the least owed). A flood of new callers therefore costs each
//! shard one scan per insert while it stays full, never memory.

use super::caller::CallerKey;
use super::gcra::{Bucket, Rule};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::time::Duration;

/// Shards of a table (a power of two).
const SHARDS: usize = 16;

type Shard = HashMap<CallerKey, Bucket, foldhash::fast::RandomState>;

pub(crate) struct Table {
    shards: Box<[RwLock<Shard>]>,
    per_shard: usize,
    hasher: foldhash::fast::RandomState,
}

impl Table {
    pub(crate) fn new(max_callers: u64) -> Table {
        let per_shard = (max_callers as usize / SHARDS).max(1);
        Table {
            shards: (0..SHARDS).map(|_| RwLock::new(Shard::default())).collect(),
            per_shard,
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    fn shard(&self, key: &CallerKey) -> &RwLock<Shard> {
        use std::hash::BuildHasher;
        &self.shards[self.hasher.hash_one(key) as usize & (SHARDS - 1)]
    }

    /// Takes `cost` tokens from `key`'s bucket (a full one when it has none) at `now`.
    pub(crate) fn take(
        &self,
        key: &CallerKey,
        rule: &Rule,
        cost: u32,
        now: u64,
    ) -> Result<(), Duration> {
        let shard = self.shard(key);
        if let Some(bucket) = shard.read().get(key) {
            return rule.take(bucket, cost, now);
        }
        let mut map = shard.write();
        if !map.contains_key(key) && map.len() >= self.per_shard {
            map.retain(|_, b| !b.is_full_at(now));
            if map.len() >= self.per_shard {
                let least_owed = map
                    .iter()
                    .min_by_key(|(_, b)| b.owed_at(now))
                    .map(|(k, _)| k.clone());
                if let Some(k) = least_owed {
                    map.remove(&k);
                }
            }
        }
        rule.take(map.entry(key.clone()).or_default(), cost, now)
    }

    /// Buckets held, after dropping those full again at `now`.
    pub(crate) fn len(&self, now: u64) -> u64 {
        self.shards
            .iter()
            .map(|s| {
                let mut map = s.write();
                map.retain(|_, b| !b.is_full_at(now));
                map.len() as u64
            })
            .sum()
    }
}
