//! Several statements in one round trip, run in a known order.
//!
//! tokio-postgres sends a request when its future is first polled, and PostgreSQL runs the
//! requests of one connection one after the other, in the order they arrived. So awaiting
//! the futures together sends them all before the first answer comes back (one round trip
//! instead of one each), and PostgreSQL still runs each after the one before it has
//! finished: a read sent after a lock starts, and takes its snapshot, once the lock is held.
//!
//! A combinator such as `try_join!` does not promise which future it polls first, so the
//! futures here are polled once each, in order, before they are awaited together. Each must
//! send its request on that first poll: its statement prepared beforehand (a
//! `prepare_cached` inside the future would delay the send to a later poll, in any order).

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

/// Runs `first`, then `second`, pipelined; the first error is returned (the statements after
/// a failed one fail too, in its transaction).
pub(crate) async fn pipelined<A, B, T, U, E>(first: A, second: B) -> Result<(T, U), E>
where
    A: Future<Output = Result<T, E>>,
    B: Future<Output = Result<U, E>>,
{
    let mut first = std::pin::pin!(first);
    if let Poll::Ready(r) = futures::poll!(first.as_mut()) {
        return Ok((r?, second.await?));
    }
    futures::try_join!(first, second)
}

/// Runs every future in `all`, pipelined in its order; the outputs in that order.
pub(crate) async fn pipelined_all<F, T, E>(all: impl IntoIterator<Item = F>) -> Result<Vec<T>, E>
where
    F: Future<Output = Result<T, E>>,
{
    let mut all: Vec<Pin<Box<F>>> = all.into_iter().map(Box::pin).collect();
    let mut done: Vec<Option<Result<T, E>>> = Vec::with_capacity(all.len());
    for f in &mut all {
        done.push(match futures::poll!(f.as_mut()) {
            Poll::Ready(r) => Some(r),
            Poll::Pending => None,
        });
    }
    let mut out = Vec::with_capacity(all.len());
    for (f, d) in all.into_iter().zip(done) {
        out.push(match d {
            Some(r) => r?,
            None => f.await?,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A future that records when it is first polled, then is ready on its second poll.
    async fn step(
        name: &'static str,
        log: Arc<Mutex<Vec<&'static str>>>,
        fail: bool,
    ) -> Result<&'static str, String> {
        log.lock().unwrap().push(name);
        tokio::task::yield_now().await;
        match fail {
            true => Err(format!("{name} failed")),
            false => Ok(name),
        }
    }

    #[tokio::test]
    async fn first_polls_happen_in_order_and_outputs_keep_it() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let (a, b) = pipelined(
            step("lock", log.clone(), false),
            step("read", log.clone(), false),
        )
        .await
        .unwrap();
        assert_eq!((a, b), ("lock", "read"));
        assert_eq!(*log.lock().unwrap(), ["lock", "read"]);

        let log = Arc::new(Mutex::new(Vec::new()));
        let names = ["a", "b", "c", "d"];
        let out = pipelined_all(names.map(|n| step(n, log.clone(), false)))
            .await
            .unwrap();
        assert_eq!(out, names);
        assert_eq!(*log.lock().unwrap(), names);
    }

    #[tokio::test]
    async fn an_error_is_returned_whichever_fails() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let r = pipelined(
            step("lock", log.clone(), true),
            step("read", log.clone(), false),
        )
        .await;
        assert_eq!(r.unwrap_err(), "lock failed");
        let r = pipelined(
            step("lock", log.clone(), false),
            step("read", log.clone(), true),
        )
        .await;
        assert_eq!(r.unwrap_err(), "read failed");
        let r = pipelined_all(["a", "b", "c"].map(|n| step(n, log.clone(), n == "b"))).await;
        assert_eq!(r.unwrap_err(), "b failed");
        let r: Result<Vec<&str>, String> = pipelined_all(Vec::<std::future::Ready<_>>::new()).await;
        assert_eq!(r.unwrap(), Vec::<&str>::new());
    }

    #[tokio::test]
    async fn futures_ready_on_their_first_poll_are_not_polled_again() {
        let ready = |r: Result<&'static str, String>| std::future::ready(r);
        let log = Arc::new(Mutex::new(Vec::new()));
        let both = pipelined(ready(Ok("lock")), step("read", log.clone(), false)).await;
        assert_eq!(both.unwrap(), ("lock", "read"));
        let failed = pipelined(ready(Err("lock failed".into())), step("read", log, false)).await;
        assert_eq!(failed.unwrap_err(), "lock failed");
        let all = pipelined_all([ready(Ok("a")), ready(Ok("b"))]).await;
        assert_eq!(all.unwrap(), ["a", "b"]);
        let failed = pipelined_all([ready(Ok("a")), ready(Err("b failed".into()))]).await;
        assert_eq!(failed.unwrap_err(), "b failed");
    }
}
