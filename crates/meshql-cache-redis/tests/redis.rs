//! The Redis shared cache against a real Redis, started by `scripts/services/redis.sh`
//! (a test that needs the server fails when it cannot be started).

use meshql_cache_redis::RedisBackend;
use meshql_core::registry::Part;
use meshql_engine::cache::TagState;
use meshql_engine::{SharedCache, SharedCacheError, SharedCaches};
use serde_json::{json, Value};
use std::future::Future;
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../scripts/services/redis.sh"
);

/// The port of the server the down test stops and starts (no other test uses it).
const DOWN_PORT: u16 = 16389;

/// Runs `redis.sh <command>` for the server on `port` (speaking TLS when `tls`); its output,
/// trimmed.
fn run_script(port: u16, command: &str, tls: bool) -> String {
    let mut script = Command::new(SCRIPT);
    script
        .arg(command)
        .env("MESHQL_REDIS_PORT", port.to_string());
    if tls {
        script.env("MESHQL_REDIS_TLS", "1");
    }
    let out = script
        .output()
        .unwrap_or_else(|e| panic!("cannot run {SCRIPT}: {e}"));
    assert!(
        out.status.success(),
        "`redis.sh {command}` (port {port}, tls {tls}) failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("UTF-8")
        .trim()
        .to_owned()
}

/// Runs `redis.sh <command>` for the server on `port`; its output, trimmed.
fn service(port: u16, command: &str) -> String {
    run_script(port, command, false)
}

/// The port of the TLS server (`MESHQL_REDIS_TLS=1`; no other test uses it).
const TLS_PORT: u16 = 16419;

/// Runs `redis.sh <command>` for the TLS server; its output, trimmed.
fn tls_service(command: &str) -> String {
    run_script(TLS_PORT, command, true)
}

/// The URL of the server most tests share, started once per test binary.
fn shared_url() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        let port = std::env::var("MESHQL_REDIS_PORT")
            .ok()
            .and_then(|p| p.parse().ok())
            .unwrap_or(16379);
        service(port, "start")
    })
}

/// A prefix no other test (or earlier run) uses: tag generations outlive a run.
fn prefix(test: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos();
    format!("t-{test}-{}-{nanos}", std::process::id())
}

/// A client of `url` with keys under `prefix` and the settings in `extra`.
async fn connect(url: &str, prefix: &str, extra: Value) -> Arc<dyn SharedCache> {
    let mut settings = json!({ "url": url, "prefix": prefix });
    if let (Some(s), Value::Object(extra)) = (settings.as_object_mut(), extra) {
        s.extend(extra);
    }
    let target =
        Part::<SharedCaches>::configure(&RedisBackend, &settings, &()).expect("valid settings");
    target.connect().await.expect("connect is not an error")
}

/// A client of the shared server, with a generous timeout (the test machine may be busy).
async fn client(prefix: &str) -> Arc<dyn SharedCache> {
    connect(shared_url(), prefix, json!({ "timeout_ms": 5000 })).await
}

fn tags(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

fn state(generation: u64, changed_at: i64) -> TagState {
    TagState {
        generation,
        changed_at,
        advanced_at: 0,
    }
}

/// `cache.get(key, tags)`, each state's `advanced_at` checked (0 for a tag never advanced,
/// else within the last minute: when the advance ran) and then set to 0 for comparisons.
async fn got(
    cache: &Arc<dyn SharedCache>,
    key: &str,
    tags: &[String],
) -> (Vec<TagState>, Option<Vec<u8>>) {
    let (mut states, entry) = cache.get(key, tags).await.unwrap();
    let now = meshql_core::time::now_millis();
    for s in &mut states {
        assert!(
            (s.generation == 0 && s.advanced_at == 0)
                || (now - 60_000..=now).contains(&s.advanced_at),
            "{s:?}"
        );
        s.advanced_at = 0;
    }
    (states, entry)
}

/// Polls `f` until it succeeds; panics with the last error after `within`.
async fn eventually<F, Fut, T>(what: &str, within: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, SharedCacheError>>,
{
    let start = Instant::now();
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) if start.elapsed() > within => {
                panic!("{what}: still failing after {within:?}: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Asserts that `call` fails, and within a second.
async fn fails_quickly<T: std::fmt::Debug>(
    what: &str,
    call: impl Future<Output = Result<T, SharedCacheError>>,
) -> SharedCacheError {
    let start = Instant::now();
    let result = call.await;
    let took = start.elapsed();
    assert!(took < Duration::from_secs(1), "{what} took {took:?}");
    result.expect_err(what)
}

#[test]
fn settings_errors_name_the_field() {
    for (settings, field, words) in [
        (json!({}), "url", "needs `url = \"redis://host:port\"`"),
        (json!({ "url": "" }), "url", "name the server"),
        (
            json!({ "url": "http://127.0.0.1:6379" }),
            "url",
            "must start with `redis://`",
        ),
        (
            json!({ "url": "127.0.0.1:6379" }),
            "url",
            "must start with `redis://`",
        ),
        (
            json!({ "url": "redis://h:port" }),
            "url",
            "not a usable Redis URL",
        ),
        (
            json!({ "url": "redis://h:6380", "ca_file": "ca.crt" }),
            "ca_file",
            "must start with `rediss://`",
        ),
        (
            json!({ "url": "rediss://h:6380", "ca_file": "/nonexistent/ca.crt" }),
            "ca_file",
            "cannot read /nonexistent/ca.crt",
        ),
        (
            json!({ "url": "rediss://h:6380", "ca_file": SCRIPT }),
            "ca_file",
            "holds no PEM certificate",
        ),
        (json!({ "url": 6379 }), "url", "expected a string"),
        (
            json!({ "url": "redis://h", "prefix": "" }),
            "prefix",
            "must not be empty",
        ),
        (
            json!({ "url": "redis://h", "prefix": "a b" }),
            "prefix",
            "`a b` is not a key prefix",
        ),
        (
            json!({ "url": "redis://h", "prefix": "app:" }),
            "prefix",
            "not a key prefix",
        ),
        (
            json!({ "url": "redis://h", "prefix": "x".repeat(129) }),
            "prefix",
            "at most 128",
        ),
        (
            json!({ "url": "redis://h", "timeout_ms": 0 }),
            "timeout_ms",
            "between 1 and 60000",
        ),
        (
            json!({ "url": "redis://h", "timeout_ms": 60001 }),
            "timeout_ms",
            "not 60001",
        ),
        (
            json!({ "url": "redis://h", "timeout_ms": "fast" }),
            "timeout_ms",
            "invalid type",
        ),
        (
            json!({ "url": "redis://h", "connect_timeout_ms": 0 }),
            "connect_timeout_ms",
            "between 1 and 60000",
        ),
        (
            json!({ "url": "redis://h", "db": 1 }),
            "db",
            "unknown field `db`",
        ),
    ] {
        let e =
            Part::<SharedCaches>::configure(&RedisBackend, &settings, &()).expect_err("rejected");
        assert_eq!(e.field.as_deref(), Some(field), "{settings}: {e}");
        assert!(e.message.contains(words), "{settings}: {e}");
    }
    // A password is never repeated in a message.
    let e = Part::<SharedCaches>::configure(
        &RedisBackend,
        &json!({ "url": "redis://:hunter2@h:port" }),
        &(),
    )
    .expect_err("rejected");
    assert!(!e.to_string().contains("hunter2"), "{e}");

    let fine = json!({ "url": "redis://127.0.0.1:1", "prefix": "a.b:c-d_e", "timeout_ms": 60000 });
    Part::<SharedCaches>::configure(&RedisBackend, &fine, &()).expect("accepted");
    // TLS: with the system's roots, or an authority's file
    Part::<SharedCaches>::configure(
        &RedisBackend,
        &json!({ "url": "rediss://127.0.0.1:1" }),
        &(),
    )
    .expect("accepted");
}

#[tokio::test]
async fn get_of_nothing_is_zeros_and_none() {
    let cache = client(&prefix("nothing")).await;
    assert_eq!(cache.kind(), "redis");
    let (states, entry) = got(&cache, "k", &tags(&["e:egg", "epoch"])).await;
    assert_eq!(states, vec![TagState::default(); 2]);
    assert_eq!(entry, None);
    let (states, entry) = got(&cache, "k", &[]).await;
    assert!(states.is_empty());
    assert_eq!(entry, None);
}

#[tokio::test]
async fn put_then_get_returns_the_bytes() {
    let cache = client(&prefix("put")).await;
    let ttl = Duration::from_secs(60);
    // Keys are any text (the engine joins its parts with the unit separator); values any bytes.
    let key = "egg\u{1f}byId\u{1f}é 1\u{1f}";
    let bytes: Vec<u8> = (0..=255u8)
        .chain(b"{\"json\":true}".iter().copied())
        .collect();
    cache.put(key, bytes.clone(), ttl).await.unwrap();
    let t = tags(&["d:egg:\u{1f}7", "e:egg"]);
    let (states, entry) = got(&cache, key, &t).await;
    assert_eq!(entry.as_deref(), Some(&bytes[..]));
    assert_eq!(states, vec![TagState::default(); 2]);

    // Another key is another entry; a put replaces.
    assert_eq!(got(&cache, "egg\u{1f}byId", &t).await.1, None);
    cache.put(key, b"second".to_vec(), ttl).await.unwrap();
    assert_eq!(
        got(&cache, key, &[]).await.1.as_deref(),
        Some(&b"second"[..])
    );
    cache.put(key, Vec::new(), ttl).await.unwrap();
    assert_eq!(got(&cache, key, &[]).await.1, Some(Vec::new()));
}

#[tokio::test]
async fn advance_raises_generations_by_one_and_stamps_only_upwards() {
    let cache = client(&prefix("advance")).await;
    let (a, b, c) = ("e:egg", "d:egg:3", "epoch");
    let all = tags(&[a, b, c]);

    cache
        .advance(&tags(&[a, b]), 1_700_000_000_100)
        .await
        .unwrap();
    let (states, _) = got(&cache, "k", &all).await;
    assert_eq!(
        states,
        vec![
            state(1, 1_700_000_000_100),
            state(1, 1_700_000_000_100),
            state(0, 0)
        ]
    );

    // An older stamp advances the generation and keeps the newer stamp.
    cache.advance(&tags(&[a]), 1_700_000_000_050).await.unwrap();
    let (states, _) = got(&cache, "k", &all).await;
    assert_eq!(states[0], state(2, 1_700_000_000_100));

    // A newer one raises it.
    cache
        .advance(&tags(&[a, c]), 1_700_000_000_200)
        .await
        .unwrap();
    let (states, _) = got(&cache, "k", &all).await;
    assert_eq!(
        states,
        vec![
            state(3, 1_700_000_000_200),
            state(1, 1_700_000_000_100),
            state(1, 1_700_000_000_200)
        ]
    );

    // Nothing to advance is nothing to do.
    cache.advance(&[], 1).await.unwrap();
    assert_eq!(got(&cache, "k", &all).await.0, states);
}

#[tokio::test]
async fn two_clients_see_each_others_advances_and_values() {
    let prefix = prefix("two");
    let (one, two) = (client(&prefix).await, client(&prefix).await);
    let t = tags(&["e:egg", "d:egg:1"]);

    one.advance(&t, 1_000).await.unwrap();
    two.advance(&t[..1], 2_000).await.unwrap();
    two.put("answer", b"from two".to_vec(), Duration::from_secs(60))
        .await
        .unwrap();
    for cache in [&one, &two] {
        let (states, entry) = got(cache, "answer", &t).await;
        assert_eq!(states, vec![state(2, 2_000), state(1, 1_000)]);
        assert_eq!(entry.as_deref(), Some(&b"from two"[..]));
    }

    // Another prefix is another cache on the same server.
    let other = client(&format!("{prefix}-other")).await;
    let (states, entry) = got(&other, "answer", &t).await;
    assert_eq!(states, vec![TagState::default(); 2]);
    assert_eq!(entry, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_advances_are_all_counted() {
    let prefix = prefix("concurrent");
    let (one, two) = (client(&prefix).await, client(&prefix).await);
    let t = tags(&["e:egg", "epoch"]);
    let mut tasks = Vec::new();
    for i in 0..50i64 {
        for cache in [&one, &two] {
            let (cache, t) = (cache.clone(), t.clone());
            tasks.push(tokio::spawn(
                async move { cache.advance(&t, 10_000 + i).await },
            ));
        }
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    let (states, _) = got(&one, "k", &t).await;
    assert_eq!(states, vec![state(100, 10_049); 2]);
}

#[tokio::test]
async fn the_ttl_expires_a_value() {
    let cache = client(&prefix("ttl")).await;
    cache
        .put("short", b"soon gone".to_vec(), Duration::from_millis(300))
        .await
        .unwrap();
    cache
        .put("long", b"stays".to_vec(), Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        got(&cache, "short", &[]).await.1.as_deref(),
        Some(&b"soon gone"[..])
    );
    tokio::time::sleep(Duration::from_millis(350)).await;
    eventually("the value expires", Duration::from_secs(5), || async {
        match cache.get("short", &[]).await?.1 {
            None => Ok(()),
            Some(_) => Err(SharedCacheError("still there".into())),
        }
    })
    .await;
    assert_eq!(
        got(&cache, "long", &[]).await.1.as_deref(),
        Some(&b"stays"[..])
    );

    // A zero time to live stores nothing.
    cache
        .put("zero", b"x".to_vec(), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(got(&cache, "zero", &[]).await.1, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_is_down_fails_calls_quickly_until_it_is_back() {
    let prefix = prefix("down");
    let t = tags(&["e:egg"]);
    let ttl = Duration::from_secs(60);
    // The test's own server, so stopping it disturbs no other test.
    service(DOWN_PORT, "stop");
    let url = service(DOWN_PORT, "url");
    let settings = json!({ "timeout_ms": 500, "connect_timeout_ms": 500 });

    // Made while Redis is down: not an error; its calls fail, quickly.
    let early = connect(&url, &prefix, settings.clone()).await;
    for _ in 0..5 {
        let e = fails_quickly("get while down", early.get("k", &t)).await;
        assert!(e.0.contains("redis"), "{e}");
        fails_quickly("put while down", early.put("k", b"v".to_vec(), ttl)).await;
        fails_quickly("advance while down", early.advance(&t, 1)).await;
    }

    // Once Redis is up it is used, without a new client.
    assert_eq!(service(DOWN_PORT, "start"), url);
    eventually(
        "the early client once Redis started",
        Duration::from_secs(10),
        || early.put("k", b"early".to_vec(), ttl),
    )
    .await;
    let late = connect(&url, &prefix, settings).await;
    late.advance(&t, 5).await.unwrap();
    let (states, entry) = got(&early, "k", &t).await;
    assert_eq!(states, vec![state(1, 5)]);
    assert_eq!(entry.as_deref(), Some(&b"early"[..]));

    // Redis goes away: every call of either client fails within a second.
    service(DOWN_PORT, "stop");
    for round in 0..5 {
        for (name, cache) in [("early", &early), ("late", &late)] {
            let what = format!("{name} client, round {round}, Redis stopped");
            fails_quickly(&format!("get: {what}"), cache.get("k", &t)).await;
            fails_quickly(&format!("put: {what}"), cache.put("k", b"v".to_vec(), ttl)).await;
            fails_quickly(&format!("advance: {what}"), cache.advance(&t, 6)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // Back again (empty: nothing is persisted): both clients reconnect by themselves.
    service(DOWN_PORT, "start");
    for cache in [&early, &late] {
        eventually(
            "a client once Redis restarted",
            Duration::from_secs(10),
            || cache.advance(&t, 7),
        )
        .await;
    }
    let (states, _) = got(&late, "k", &t).await;
    assert_eq!(states, vec![state(2, 7)]);
    early.put("k", b"again".to_vec(), ttl).await.unwrap();
    assert_eq!(got(&late, "k", &[]).await.1.as_deref(), Some(&b"again"[..]));

    service(DOWN_PORT, "destroy");
}

/// `rediss://`: a server whose certificate the client's `ca_file` vouches for is used like any
/// other; one signed by an authority the client does not trust is never talked to (every call
/// fails quickly, so reads go to storage), nor is a plain-text client answered by it.
#[tokio::test]
async fn rediss_verifies_the_server_against_ca_file() {
    let url = tls_service("start");
    assert!(url.starts_with("rediss://127.0.0.1:"), "{url}");
    let ca = tls_service("ca");
    let ttl = Duration::from_secs(60);

    let trusted = connect(
        &url,
        &prefix("tls"),
        json!({ "ca_file": ca, "timeout_ms": 5000 }),
    )
    .await;
    eventually("a put over TLS", Duration::from_secs(10), || {
        trusted.put("k", b"over tls".to_vec(), ttl)
    })
    .await;
    let (_, entry) = got(&trusted, "k", &tags(&["e:egg"])).await;
    assert_eq!(entry.as_deref(), Some(&b"over tls"[..]));
    trusted.advance(&tags(&["e:egg"]), 7).await.unwrap();
    let (states, _) = got(&trusted, "k", &tags(&["e:egg"])).await;
    assert_eq!(states, vec![state(1, 7)]);

    // an unrelated authority: the handshake fails, and so does every call, quickly
    let other = std::path::Path::new(&ca).with_file_name("other-ca.crt");
    let untrusted = connect(
        &url,
        &prefix("tls-untrusted"),
        json!({ "ca_file": other, "timeout_ms": 500, "connect_timeout_ms": 500 }),
    )
    .await;
    for _ in 0..3 {
        let started = Instant::now();
        untrusted
            .get("k", &[])
            .await
            .expect_err("an untrusted server");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }
    // plain text to a TLS port is no answer either
    let plain = connect(
        &url.replacen("rediss://", "redis://", 1),
        &prefix("tls-plain"),
        json!({ "timeout_ms": 500, "connect_timeout_ms": 500 }),
    )
    .await;
    plain
        .get("k", &[])
        .await
        .expect_err("plain text to a TLS port");
    tls_service("stop");
}
