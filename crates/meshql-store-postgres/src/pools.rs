//! A connection pool whose connections stay on the serving thread that uses them.
//!
//! tokio-postgres drives each connection's socket from a task of its own, spawned on the
//! runtime that opened it. With thread-per-core serving ([`meshql_core::serving`]) one shared
//! pool hands a connection opened on serving thread A to a request on thread B: every query
//! then wakes A to write the socket and wakes B again with the rows — two cross-thread
//! wake-ups per statement, each a wait for a core when the machine is busy.
//!
//! So the configured `pool_size` (still the bound on this pool's connections) is split:
//! a share for each serving thread, whose connections are opened on that thread as it needs
//! them, and the rest in a shared pool for background work (the change feed, probes, processors) and for code not
//! on a serving thread. A serving thread takes, without waiting, from its own share, then from
//! the shared pool, then from the other threads' shares; only when all are busy does it wait
//! (`pool_wait`) for its own. Too small a pool to give every thread one connection is not
//! split.

use deadpool_postgres::{Manager, Object, Pool, PoolError, Status, TimeoutType};
use meshql_core::serving;

pub(crate) struct Pools {
    shared: Pool,
    /// One pool per serving thread (empty: not split).
    local: Box<[Pool]>,
}

impl Pools {
    /// `size` connections at most over all, shared by `threads` serving threads and the
    /// rest of the process; `build(n)` makes a pool of at most `n` connections.
    pub(crate) fn new<E>(
        size: usize,
        threads: usize,
        build: impl Fn(usize) -> Result<Pool, E>,
    ) -> Result<Self, E> {
        let reserve = (size / 4).max(1);
        let each = match threads {
            0 => 0,
            n => size.saturating_sub(reserve) / n,
        };
        if each == 0 {
            return Ok(Pools {
                shared: build(size)?,
                local: Box::new([]),
            });
        }
        Ok(Pools {
            shared: build(size - each * threads)?,
            local: (0..threads)
                .map(|_| build(each))
                .collect::<Result<_, E>>()?,
        })
    }

    /// A connection: on a serving thread from its own share first (see the module's doc).
    pub(crate) async fn get(&self) -> Result<Object, PoolError> {
        let Some(thread) = serving::current() else {
            return self.shared.get().await;
        };
        let local = &self.local;
        let Some(own) = local.get(thread.index) else {
            return self.shared.get().await;
        };
        let mut now = own.timeouts();
        now.wait = Some(std::time::Duration::ZERO);
        let others = local
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != thread.index)
            .map(|(_, p)| p);
        for pool in [own, &self.shared].into_iter().chain(others) {
            match pool.timeout_get(&now).await {
                Err(PoolError::Timeout(TimeoutType::Wait)) => continue,
                taken => return taken,
            }
        }
        own.get().await
    }

    /// Every pool: the shared one first.
    pub(crate) fn all(&self) -> impl Iterator<Item = &Pool> {
        std::iter::once(&self.shared).chain(self.local.iter())
    }

    /// The shared pool (background work: probes, the change feed).
    pub(crate) fn shared(&self) -> &Pool {
        &self.shared
    }

    /// The managers of every pool (their statement caches).
    pub(crate) fn managers(&self) -> impl Iterator<Item = &Manager> {
        self.all().map(Pool::manager)
    }

    /// Connections lent out right now, over every pool.
    pub(crate) fn lent(&self) -> usize {
        self.all()
            .map(Pool::status)
            .map(|s: Status| s.size.saturating_sub(s.available))
            .sum()
    }

    /// Whether every connection is open and lent out: a request would have to wait.
    pub(crate) fn saturated(&self) -> bool {
        self.all()
            .map(Pool::status)
            .all(|s| s.available == 0 && s.size >= s.max_size)
    }

    pub(crate) fn close(&self) {
        self.all().for_each(Pool::close);
    }
}
