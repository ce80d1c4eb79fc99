//! A connection pool whose connections stay on the serving thread that uses them.
//!
//! tokio-postgres drives each connection's socket from a task of its own, spawned on the
//! runtime that opened it. With thread-per-core serving ([`meshql_core::serving`]) one shared
//! pool hands a connection opened on serving thread A to a request on thread B: every query
//! then wakes A to write the socket and wakes B again with the rows — two cross-thread
//! wake-ups per statement, each a wait for a core when the machine is busy.
//!
//! So the configured `pool_size` (still the bound on this pool's connections) is split
//! ([`Split`]): a share for each serving thread, whose connections are opened on that thread as
//! it needs them, and the rest in a shared pool for background work (the change feed, probes,
//! processors) and for code off the serving threads. A serving thread takes, without waiting,
//! from its own share, then from the shared pool, then an idle connection from another
//! thread's share; only when all are busy does it wait (`pool_wait`) for its own.
//!
//! It never opens a connection in another thread's share: that connection's socket would be
//! driven by the opener for the rest of its life, and every later query of the owner would
//! cross threads again (measured: letting a busy thread open there gave back the whole gain,
//! docs/BENCHMARKS.md). The cost: a load that falls on one thread alone has its share, the
//! shared pool and whatever the other threads have open (10 of 16 by default until they have
//! opened theirs).

use deadpool_postgres::{Manager, Object, Pool, PoolError, Status, TimeoutType};
use meshql_core::serving::Split;
use std::time::Duration;

pub(crate) struct Pools {
    split: Split,
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
        let split = Split::new(size, threads);
        Ok(Pools {
            split,
            shared: build(split.shared)?,
            local: (0..split.threads)
                .map(|_| build(split.each))
                .collect::<Result<_, E>>()?,
        })
    }

    /// A connection: on a serving thread from its own share first (see the module's doc).
    pub(crate) async fn get(&self) -> Result<Object, PoolError> {
        if self.local.is_empty() {
            return self.shared.get().await;
        }
        let mut now = self.shared.timeouts();
        now.wait = Some(Duration::ZERO);
        let mut order = self.split.order();
        let first = order.next().flatten();
        for at in std::iter::once(first).chain(order) {
            let pool = self.at(at);
            // another thread's share lends only a connection it has open (one opened here
            // would be driven by this thread for the rest of its life)
            if at.is_some() && at != first && pool.status().available == 0 {
                continue;
            }
            match pool.timeout_get(&now).await {
                Err(PoolError::Timeout(TimeoutType::Wait)) => continue,
                taken => return taken,
            }
        }
        self.at(first).get().await
    }

    fn at(&self, share: Option<usize>) -> &Pool {
        match share {
            Some(i) => &self.local[i],
            None => &self.shared,
        }
    }

    /// Every pool: the shared one first.
    pub(crate) fn all(&self) -> impl Iterator<Item = &Pool> {
        std::iter::once(&self.shared).chain(&*self.local)
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
