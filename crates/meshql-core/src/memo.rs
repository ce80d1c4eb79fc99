//! [`Memo`]: values built once per key and shared, for what a store compiles per template
//! and query shape (SQL text, parameter lists). Read-mostly: after warm-up every lookup is a
//! shared read lock.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, PoisonError, RwLock};

pub struct Memo<K, V> {
    map: RwLock<HashMap<K, Arc<V>>>,
}

impl<K, V> Default for Memo<K, V> {
    fn default() -> Self {
        Self {
            map: RwLock::new(HashMap::new()),
        }
    }
}

impl<K: Hash + Eq, V> Memo<K, V> {
    /// The value for `key`, built by `make` the first time it is asked for. Two threads
    /// asking at once may both build it; the first stored wins.
    pub fn get_or_insert_with(&self, key: K, make: impl FnOnce() -> V) -> Arc<V> {
        if let Some(v) = self
            .map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
        {
            return v.clone();
        }
        let v = Arc::new(make());
        self.map
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key)
            .or_insert(v)
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_once_per_key() {
        let memo: Memo<u32, String> = Memo::default();
        let mut built = 0;
        for _ in 0..3 {
            memo.get_or_insert_with(1, || {
                built += 1;
                "one".to_owned()
            });
        }
        assert_eq!(built, 1);
        assert_eq!(*memo.get_or_insert_with(2, || "two".to_owned()), "two");
        assert_eq!(*memo.get_or_insert_with(1, || unreachable!()), "one");
    }
}
