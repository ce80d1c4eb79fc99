//! The background thread behind [`FsyncPolicy::Interval`](crate::FsyncPolicy::Interval).

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// Calls `tick` every `interval` on its own thread until dropped; dropping wakes the thread
/// and waits for it to finish.
pub(crate) struct Flusher {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Flusher {
    pub fn start(
        interval: Duration,
        mut tick: impl FnMut() + Send + 'static,
    ) -> std::io::Result<Flusher> {
        let interval = interval.max(Duration::from_millis(1));
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("meshql-log-fsync".into())
            .spawn(move || {
                let (lock, wake) = &*flag;
                let mut stopped = lock.lock();
                while !*stopped {
                    if wake.wait_for(&mut stopped, interval).timed_out() && !*stopped {
                        parking_lot::MutexGuard::unlocked(&mut stopped, &mut tick);
                    }
                }
            })?;
        Ok(Flusher {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn ticks_and_stops_on_drop() {
        let n = Arc::new(AtomicUsize::new(0));
        let seen = n.clone();
        let f = Flusher::start(Duration::from_millis(1), move || {
            seen.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        while n.load(Ordering::SeqCst) < 3 {
            std::thread::yield_now();
        }
        drop(f); // joins: no tick after this
        let after = n.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(n.load(Ordering::SeqCst), after);
    }
}
