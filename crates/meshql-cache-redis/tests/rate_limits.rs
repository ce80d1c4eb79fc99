//! The rate limits' shared store (`[server.rate_limit] redis`) against a real Redis, started
//! by `scripts/services/redis.sh` (a test that needs the server fails when it cannot be
//! started): the burst then one token per interval, refusals that take nothing, buckets
//! shared exactly by several clients at once, keys that expire once full again, and a Redis
//! that cannot be reached failing at once.

use meshql_cache_redis::RedisBackend;
use meshql_core::registry::Part;
use meshql_core::{LimitRule, SharedLimiter, SharedLimits};
use serde_json::json;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../scripts/services/redis.sh"
);

/// The URL of the shared test server (started once per test binary; fails loudly if it
/// cannot be).
fn url() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        let port = std::env::var("MESHQL_REDIS_PORT").unwrap_or_else(|_| "16379".into());
        let out = Command::new(SCRIPT)
            .arg("start")
            .env("MESHQL_REDIS_PORT", &port)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {SCRIPT}: {e}"));
        assert!(
            out.status.success(),
            "`redis.sh start` (port {port}) failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    })
}

/// A prefix no other test (or earlier run) uses.
fn prefix(test: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("t-{test}-{}-{nanos}", std::process::id())
}

/// A store on `url` with keys under `prefix`, bounded by `timeout_ms`.
async fn store(url: &str, prefix: &str, timeout_ms: u64) -> Arc<dyn SharedLimiter> {
    let settings = json!({ "url": url, "prefix": prefix, "timeout_ms": timeout_ms });
    Part::<SharedLimits>::configure(&RedisBackend, &settings, &())
        .expect("valid settings")
        .connect()
        .await
        .expect("connect is not an error")
}

/// A plain connection, to look at the keys.
async fn inspect() -> redis::aio::MultiplexedConnection {
    redis::Client::open(url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("the test Redis answers")
}

fn rule(interval: Duration, burst: u32) -> LimitRule {
    LimitRule { interval, burst }
}

#[tokio::test]
async fn a_bucket_gives_its_burst_then_says_how_long_to_wait() {
    let prefix = prefix("burst");
    let store = store(url(), &prefix, 5_000).await;
    let ten_seconds = rule(Duration::from_secs(10), 3);
    for n in 0..3 {
        assert_eq!(
            store.take("reads:s:alice", ten_seconds, 1).await.unwrap(),
            Ok(()),
            "take {n}"
        );
    }
    // empty: one token is 10 s away (less the moments since the first take)
    let wait = store
        .take("reads:s:alice", ten_seconds, 1)
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        wait > Duration::from_secs(8) && wait <= Duration::from_secs(10),
        "{wait:?}"
    );
    // refusals took nothing: the same wait, and two tokens are one interval further
    for _ in 0..20 {
        let again = store
            .take("reads:s:alice", ten_seconds, 1)
            .await
            .unwrap()
            .unwrap_err();
        assert!(again <= wait, "{again:?} after {wait:?}");
    }
    let two = store
        .take("reads:s:alice", ten_seconds, 2)
        .await
        .unwrap()
        .unwrap_err();
    assert!(two > wait + Duration::from_secs(9), "{two:?}");
    // a cost above the burst is charged the burst: another caller's full bucket admits it
    assert_eq!(
        store.take("reads:s:bob", ten_seconds, 1_000).await.unwrap(),
        Ok(())
    );
    assert!(store
        .take("reads:s:bob", ten_seconds, 1)
        .await
        .unwrap()
        .is_err());
    // the key expires when the bucket is full again: 30 s from the first take
    let mut redis = inspect().await;
    let key = format!("{prefix}:rl:reads:s:alice");
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!((25_000..=30_000).contains(&ttl), "PTTL {key} = {ttl}");
}

#[tokio::test]
async fn a_bucket_refills_at_its_rate_and_is_forgotten_once_full() {
    let prefix = prefix("refill");
    let store = store(url(), &prefix, 5_000).await;
    // 10 per second, burst 2
    let fast = rule(Duration::from_millis(100), 2);
    assert_eq!(store.take("writes:u", fast, 2).await.unwrap(), Ok(()));
    assert!(store.take("writes:u", fast, 1).await.unwrap().is_err());
    // generous margins: 100 ms a token, waited for 3 times as long
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(store.take("writes:u", fast, 1).await.unwrap(), Ok(()));
    // full again 200 ms after the last take: the key is gone by then
    tokio::time::sleep(Duration::from_millis(600)).await;
    let mut redis = inspect().await;
    let exists: u32 = redis::cmd("EXISTS")
        .arg(format!("{prefix}:rl:writes:u"))
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(exists, 0, "a full bucket's key expired");
    // and a forgotten bucket is a full one
    assert_eq!(store.take("writes:u", fast, 2).await.unwrap(), Ok(()));
}

/// Two clients (as two processes) taking from one bucket at once, from several tasks each,
/// are handed exactly its burst between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_taking_at_once_share_exactly_the_burst() {
    let prefix = prefix("shared");
    let one_an_hour = rule(Duration::from_secs(3600), 100);
    let admitted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let store = store(url(), &prefix, 5_000).await;
        for _ in 0..4 {
            let (store, admitted) = (store.clone(), admitted.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..60 {
                    if store
                        .take("graphql:s:carol", one_an_hour, 1)
                        .await
                        .expect("Redis answers")
                        .is_ok()
                    {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(admitted.load(Ordering::Relaxed), 100);
}

/// Nothing listens on the port: every take fails, and fast (the server then decides by its
/// own buckets).
#[tokio::test]
async fn an_unreachable_redis_fails_at_once() {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let store = store(&format!("redis://127.0.0.1:{closed}"), "t", 200).await;
    for n in 0..20 {
        let started = Instant::now();
        let result = store
            .take("reads:u", rule(Duration::from_secs(1), 1), 1)
            .await;
        let took = started.elapsed();
        assert!(result.is_err(), "take {n}: {result:?}");
        assert!(took < Duration::from_secs(2), "take {n} took {took:?}");
    }
}
