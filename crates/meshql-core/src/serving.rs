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
}
