//! Writes at a fixed rate beside a measured read load (`--writes-per-sec`): reads with writes
//! flowing, as seed 004 measured its variants (1,000 POST/s on the primary).

use crate::client::{Session, Target};
use bytes::Bytes;
use http::Method;
use serde_json::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// POSTs on a connection of their own, at `rate` per second, until stopped. Each is sent when
/// due; one that answers late delays the next (a single connection: what matters is that writes
/// keep flowing, not their own latency). The writer has a thread and runtime of its own, so the
/// generator thread measuring the reads does not also serve the writes' socket.
pub struct BackgroundWrites {
    stop: Arc<AtomicBool>,
    done: tokio::sync::oneshot::Receiver<(u64, u64, f64)>,
}

impl BackgroundWrites {
    /// Starts POSTing `body(n)` (n = 0, 1, …) to `path` of `target`.
    pub fn start(
        target: Target,
        rate: f64,
        path: &'static str,
        body: impl Fn(u64) -> Value + Send + 'static,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let (tx, done) = tokio::sync::oneshot::channel();
        let writes = async move {
            let mut session = Session::new(target);
            let every = Duration::from_secs_f64(1.0 / rate.max(0.001));
            let started = Instant::now();
            let (mut sent, mut failed) = (0u64, 0u64);
            let mut next = tokio::time::Instant::now();
            while !flag.load(Ordering::Relaxed) {
                let doc = Bytes::from(body(sent).to_string());
                let ok = session
                    .send(Method::POST, path, Some(doc))
                    .await
                    .is_ok_and(|r| r.status.is_success());
                sent += 1;
                failed += u64::from(!ok);
                next += every;
                tokio::time::sleep_until(next).await;
            }
            (sent, failed, started.elapsed().as_secs_f64())
        };
        let spawned = std::thread::Builder::new()
            .name("bench-writes".into())
            .spawn(move || {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => {
                        let _ = tx.send(rt.block_on(writes));
                    }
                    Err(e) => eprintln!("meshql bench: the writer's runtime: {e}"),
                }
            });
        if let Err(e) = spawned {
            eprintln!("meshql bench: the writer's thread: {e}");
        }
        BackgroundWrites { stop, done }
    }

    /// Stops the writes: (sent, failed, seconds they ran).
    pub async fn stop(self) -> (u64, u64, f64) {
        self.stop.store(true, Ordering::Relaxed);
        self.done.await.unwrap_or((0, 0, 0.0))
    }
}
