//! [`Lru`]: at most `capacity` values by a 64-bit key, the least recently used dropped first.
//! The SQL stores keep their nested statements in one ([`crate::StoreReader::find_nested`]):
//! each selection shape a GraphQL client sends is a statement of its own, and clients choose
//! their shapes, so without a bound the cache (and the statements prepared from it) would grow
//! with every new shape, for as long as the server runs.
//!
//! A hit costs what [`crate::memo::Memo`]'s does (a shared read lock, a hash lookup,
//! an `Arc` clone, no allocation) and one relaxed atomic load: recency is a tick of `clock`,
//! which only misses advance, so the entries used between two misses share a tick, and a hit
//! on an entry already stamped with the current tick writes nothing. A miss, which builds
//! the SQL and then prepares it on a connection (a round trip), scans the entries for the
//! oldest tick when the cache is full.

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

/// One cached value.
pub struct Slot<V> {
    value: V,
    /// The cache's clock when it was last used.
    used: AtomicU64,
    evicted: AtomicBool,
}

impl<V> Slot<V> {
    /// Whether the cache has dropped this value (a request may still hold it).
    pub fn evicted(&self) -> bool {
        self.evicted.load(Ordering::SeqCst)
    }

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

pub struct Lru<V> {
    capacity: usize,
    map: RwLock<HashMap<u64, Arc<Slot<V>>>>,
    /// Advanced by every insertion.
    clock: AtomicU64,
}

impl<V> Lru<V> {
    pub fn new(capacity: usize) -> Self {
        assert!(capacity > 0, "a cache holds at least one value");
        Self {
            capacity,
            map: RwLock::new(HashMap::with_capacity(capacity)),
            clock: AtomicU64::new(0),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn len(&self) -> usize {
        self.map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// The value for `key`, built by `make` if it is not cached. When the cache is full, the
    /// least recently used value makes room, and `evicted` is called with it (outside the
    /// cache's lock) after it is marked [`Slot::evicted`]. Two threads missing at once may
    /// both build the value; the first stored wins.
    pub fn get_or_insert_with(
        &self,
        key: u64,
        make: impl FnOnce() -> V,
        evicted: impl FnOnce(&V),
    ) -> Arc<Slot<V>> {
        let now = self.clock.load(Ordering::Relaxed);
        if let Some(slot) = self
            .map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
        {
            slot.touch(now);
            return slot.clone();
        }
        let value = make();
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = map.get(&key) {
            slot.touch(now);
            return slot.clone();
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
            evicted: AtomicBool::new(false),
        });
        map.insert(key, slot.clone());
        drop(map);
        if let Some(old) = oldest {
            old.evicted.store(true, Ordering::SeqCst);
            evicted(&old.value);
        }
        slot
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(cache: &Lru<String>, key: u64, out: &mut Vec<String>) -> Arc<Slot<String>> {
        cache.get_or_insert_with(key, || format!("v{key}"), |v| out.push(v.clone()))
    }

    #[test]
    fn never_holds_more_than_its_capacity() {
        let cache = Lru::new(4);
        let mut evicted = Vec::new();
        for k in 0..100 {
            assert_eq!(get(&cache, k, &mut evicted).value, format!("v{k}"));
            assert!(cache.len() <= 4);
        }
        assert_eq!(cache.len(), 4);
        assert_eq!(evicted.len(), 96);
    }

    #[test]
    fn drops_the_least_recently_used_and_builds_it_again_when_asked() {
        let cache = Lru::new(3);
        let mut evicted = Vec::new();
        let first = get(&cache, 1, &mut evicted);
        get(&cache, 2, &mut evicted);
        get(&cache, 3, &mut evicted);
        // 1 used again: 2 is the oldest
        get(&cache, 1, &mut evicted);
        get(&cache, 4, &mut evicted);
        assert_eq!(evicted, ["v2"]);
        get(&cache, 1, &mut evicted);
        get(&cache, 5, &mut evicted);
        assert_eq!(evicted, ["v2", "v3"]);
        assert!(!first.evicted());
        // a hit builds nothing; a dropped key is built again
        let built = std::cell::Cell::new(0);
        let count = |k| {
            cache.get_or_insert_with(
                k,
                || {
                    built.set(built.get() + 1);
                    format!("v{k}")
                },
                |_| {},
            )
        };
        count(1);
        count(5);
        assert_eq!(built.get(), 0);
        assert_eq!(count(2).value, "v2");
        assert_eq!(built.get(), 1);
        // 4 made room for 2; then 1 (as old as 5, but 5 is used again) for 6
        count(5);
        get(&cache, 6, &mut evicted);
        assert_eq!(evicted, ["v2", "v3", "v1"]);
        assert!(first.evicted());
        assert_eq!(cache.len(), 3);
    }
}
