//! The writer's striped locks: writes of one id are serialised inside the process.

use super::writer::Writer;
use tokio::sync::OwnedMutexGuard;

impl Writer {
    fn stripe(&self, id: &str) -> usize {
        let h = id.bytes().fold(0xcbf29ce484222325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100000001b3)
        });
        (h % self.locks.len() as u64) as usize
    }

    pub(super) async fn lock(&self, id: &str) -> OwnedMutexGuard<()> {
        self.locks[self.stripe(id)].clone().lock_owned().await
    }

    /// The locks of several ids, taken in one order (so that two batches cannot deadlock),
    /// each once (two ids may share a stripe).
    pub(super) async fn lock_all<'a>(
        &self,
        ids: impl Iterator<Item = &'a str>,
    ) -> Vec<OwnedMutexGuard<()>> {
        let mut stripes: Vec<usize> = ids.map(|id| self.stripe(id)).collect();
        stripes.sort_unstable();
        stripes.dedup();
        let mut guards = Vec::with_capacity(stripes.len());
        for s in stripes {
            guards.push(self.locks[s].clone().lock_owned().await);
        }
        guards
    }
}
