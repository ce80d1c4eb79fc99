//! [`NestedCache`]: a store's nested statements ([`meshql_core::StoreReader::find_nested`]), at
//! most `capacity` of them, the least recently used dropped first.
//!
//! Each selection shape a GraphQL client sends is a statement of its own, and clients choose
//! their shapes: without a bound the cache (and the statements prepared from it) would grow
//! with every new shape, for as long as the server runs.
//!
//! A hit costs what [`meshql_core::memo::Memo`]'s does (a shared read lock, a hash lookup,
//! an `Arc` clone, no allocation) and one relaxed atomic load: recency is a tick of `clock`,
//! which only misses advance, so the entries used between two misses share a tick, and a hit
//! on an entry already stamped with the current tick writes nothing. A miss, which builds
//! the SQL and then prepares it on a connection (a round trip), scans the entries for the
//! oldest tick when the cache is full.

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

/// One cached value.
pub(crate) struct Slot<V> {
    value: V,
    /// The cache's clock when it was last used.
    used: AtomicU64,
}

impl<V> Slot<V> {
    fn touch(&self, now: u64) {
        if self.used.load(Ordering::Relaxed) != now {
            self.used.store(now, Ordering::Relaxed);
        }
    }
}

impl<V> Deref for Slot<V> {
    type Target = V;

    fn deref(&self) -> &V {
        &self.value
    }
}

pub(crate) struct NestedCache<V> {
    capacity: usize,
    map: RwLock<HashMap<u64, Arc<Slot<V>>>>,
    /// Advanced by every insertion.
    clock: AtomicU64,
}

impl<V> NestedCache<V> {
    pub(crate) fn new(capacity: usize) -> Self {
        assert!(capacity > 0, "a cache holds at least one value");
        Self {
            capacity,
            map: RwLock::new(HashMap::with_capacity(capacity)),
            clock: AtomicU64::new(0),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// The value for `key`, built by `make` if it is not cached, and then returned with the
    /// value it evicted to make room, if the cache was full. Two threads missing at once may
    /// both build the value; the first stored wins.
    pub(crate) fn get_or_insert_with(
        &self,
        key: u64,
        make: impl FnOnce() -> V,
    ) -> (Arc<Slot<V>>, Option<Arc<Slot<V>>>) {
        let now = self.clock.load(Ordering::Relaxed);
        if let Some(slot) = self
            .map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
        {
            slot.touch(now);
            return (slot.clone(), None);
        }
        let value = make();
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = map.get(&key) {
            slot.touch(now);
            return (slot.clone(), None);
        }
        let now = self.clock.fetch_add(1, Ordering::Relaxed) + 1;
        let oldest = if map.len() >= self.capacity {
            let oldest = map
                .iter()
                .min_by_key(|(_, s)| s.used.load(Ordering::Relaxed))
                .map(|(k, _)| *k);
            oldest.and_then(|k| map.remove(&k))
        } else {
            None
        };
        let slot = Arc::new(Slot {
            value,
            used: AtomicU64::new(now),
        });
        map.insert(key, slot.clone());
        (slot, oldest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of `key`, and the key evicted for it.
    fn get(cache: &NestedCache<u64>, key: u64) -> (u64, Option<u64>) {
        let (v, old) = cache.get_or_insert_with(key, || key);
        (**v, old.map(|o| **o))
    }

    #[test]
    fn never_holds_more_than_its_capacity() {
        let cache = NestedCache::new(4);
        for k in 0..100 {
            let (v, old) = get(&cache, k);
            assert_eq!(v, k);
            assert_eq!(old.is_some(), k >= 4);
            assert!(cache.len() <= 4);
        }
        assert_eq!(cache.len(), 4);
    }

    #[test]
    fn drops_the_least_recently_used_and_builds_it_again_when_asked() {
        let cache = NestedCache::new(3);
        get(&cache, 1);
        get(&cache, 2);
        get(&cache, 3);
        // 1 used again: 2 is the oldest
        assert_eq!(get(&cache, 1), (1, None));
        assert_eq!(get(&cache, 4), (4, Some(2)));
        get(&cache, 1);
        assert_eq!(get(&cache, 5), (5, Some(3)));
        // a hit builds nothing; a dropped key is built again
        let built = std::cell::Cell::new(0);
        let count = |k| {
            cache
                .get_or_insert_with(k, || {
                    built.set(built.get() + 1);
                    k
                })
                .1
                .map(|o| **o)
        };
        count(1);
        count(5);
        assert_eq!(built.get(), 0);
        assert_eq!(count(2), Some(4));
        assert_eq!(built.get(), 1);
        // 1 is as old as 5, but 5 is used again
        count(5);
        assert_eq!(get(&cache, 6), (6, Some(1)));
        assert_eq!(cache.len(), 3);
    }
}
