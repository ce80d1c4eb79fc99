//! Which serving thread runs the current code. With thread-per-core serving each connection
//! lives, start to end, on one of `of` threads with a single-threaded runtime of its own; the
//! listener marks each such thread with [`enter`]. A backend can then keep state per serving
//! thread — a PostgreSQL pool whose connections' I/O tasks live on the thread that uses them,
//! so a query does not wake another thread to reach its socket. Code on any other thread (the
//! process's runtime: change feed, relays, probes) sees `None`. How many serving threads the
//! process will run is declared with [`plan`] before its storage is opened, so a backend can
//! size its per-thread state when it is built.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

static PLANNED: AtomicUsize = AtomicUsize::new(0);

/// Declares that this process serves connections on `threads` serving threads (0: on its
/// multi-threaded runtime, no serving threads).
pub fn plan(threads: usize) {
    PLANNED.store(threads, Ordering::Relaxed);
}

/// The serving threads declared with [`plan`] (0 when none were).
pub fn planned() -> usize {
    PLANNED.load(Ordering::Relaxed)
}

/// The serving thread running the caller: its index among `of`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServingThread {
    pub index: usize,
    pub of: usize,
}

thread_local! {
    static CURRENT: Cell<Option<ServingThread>> = const { Cell::new(None) };
}

/// Marks the calling thread as serving thread `index` of `of` (for the rest of its life).
pub fn enter(index: usize, of: usize) {
    debug_assert!(index < of);
    CURRENT.with(|c| c.set(Some(ServingThread { index, of })));
}

/// The serving thread running the caller, if it is one.
pub fn current() -> Option<ServingThread> {
    CURRENT.with(Cell::get)
}

/// A bounded set of connections split between the serving threads and the rest of the
/// process, for clients whose connections are driven by the runtime that opened them: a
/// share per serving thread (opened and used there), and the rest shared (background work,
/// callers off the serving threads, and a serving thread whose own share is busy). The
/// shares never add up to more than the configured size; too small a size to give every
/// thread one connection is not split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    /// Connections of the shared part.
    pub shared: usize,
    /// Connections of each serving thread's share (0: not split).
    pub each: usize,
    /// Serving threads with a share.
    pub threads: usize,
}

impl Split {
    /// `size` connections (at least 1) for `threads` serving threads: a quarter (at least
    /// one) stays shared, the rest is divided evenly, the remainder shared too.
    pub fn new(size: usize, threads: usize) -> Split {
        let size = size.max(1);
        let reserve = (size / 4).max(1);
        let each = match threads {
            0 => 0,
            n => size.saturating_sub(reserve) / n,
        };
        match each {
            0 => Split {
                shared: size,
                each: 0,
                threads: 0,
            },
            each => Split {
                shared: size - each * threads,
                each,
                threads,
            },
        }
    }

    /// Where the caller should look for a free connection, in order: its own share (on a
    /// serving thread), the shared part, the other threads' shares. `None` is the shared
    /// part, `Some(i)` thread i's share.
    pub fn order(&self) -> impl Iterator<Item = Option<usize>> {
        let own = current().map(|t| t.index).filter(|&i| i < self.threads);
        let others = (0..self.threads).filter(move |&i| Some(i) != own);
        own.map(Some)
            .into_iter()
            .chain(std::iter::once(None))
            .chain(others.map(Some))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_marked_thread_is_a_serving_thread() {
        assert_eq!(current(), None);
        std::thread::spawn(|| {
            enter(1, 2);
            assert_eq!(current(), Some(ServingThread { index: 1, of: 2 }));
        })
        .join()
        .unwrap();
        assert_eq!(current(), None, "the mark stays on its thread");
    }

    #[test]
    fn a_split_never_exceeds_its_size() {
        for size in 1..40 {
            for threads in 0..9 {
                let s = Split::new(size, threads);
                assert!(s.shared >= 1);
                assert_eq!(
                    s.shared + s.each * s.threads,
                    size.max(1),
                    "{size} {threads}"
                );
                assert!(s.each == 0 || s.threads == threads);
            }
        }
        assert_eq!(
            Split::new(16, 2),
            Split {
                shared: 4,
                each: 6,
                threads: 2
            }
        );
        assert_eq!(Split::new(2, 2).each, 0, "too small to split");
    }

    #[test]
    fn a_serving_thread_looks_at_its_own_share_first() {
        let split = Split::new(16, 3);
        assert_eq!(
            split.order().collect::<Vec<_>>(),
            vec![None, Some(0), Some(1), Some(2)],
            "off the serving threads: the shared part first"
        );
        let seen = std::thread::spawn(move || {
            enter(1, 3);
            split.order().collect::<Vec<_>>()
        })
        .join()
        .unwrap();
        assert_eq!(seen, vec![Some(1), None, Some(0), Some(2)]);
    }
}
