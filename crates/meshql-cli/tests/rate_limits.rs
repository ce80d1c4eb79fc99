//! `[server.rate_limit]` through the binary: a caller flooding the server gets 429s with a
//! sane `Retry-After` while another caller, interleaved with the flood, is served every
//! time; callers are known by their token's subject, or by their address without one;
//! writes and GraphQL (by cost) have buckets of their own; `/metrics` counts every decision
//! per class; the table of buckets stays within `max_callers`; config errors name the field.
//! With `redis = { … }` (a real Redis, started by `scripts/services/redis.sh`): two
//! processes share each caller's one limit, and a Redis stopped mid-test (or never
//! reachable) costs no request: each is decided by its process's own buckets and counted.

mod common;

use common::{bearer, check_error_line, free_port, Server, JWT_SECRET};
use serde_json::{json, Value};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SDL: &str = r#"
type Query {
  getById(id: ID, at: Float): Farm
  getAll(at: Float, limit: Int): [Farm]
}
type Farm { id: ID name: String }
"#;

/// A farm service on memory storage, verifying HS256 tokens (not required), with `extra`
/// config lines (the `[server.rate_limit]` table under test).
fn service(dir: &Path, extra: &str) -> PathBuf {
    std::fs::write(dir.join("farm.graphql"), SDL).unwrap();
    let file = dir.join("meshql.toml");
    std::fs::write(
        &file,
        format!(
            r#"{extra}

[auth]
type = "jwt"
secret = "{JWT_SECRET}"

[storage.m]
type = "memory"

[[entity]]
name = "farm"
storage = "m"
[entity.rest]
path = "/farm/api"
[entity.graphql]
path = "/farm/graph"
schema = "farm.graphql"
[[entity.graphql.singletons]]
name = "getById"
query = '{{"id": "{{{{id}}}}"}}'
[[entity.graphql.vectors]]
name = "getAll"
query = '{{}}'
"#
        ),
    )
    .unwrap();
    file
}

/// An HTTP client whose connections come from `local` (a loopback address of its own, so
/// that the server sees another client).
fn client_from(local: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(local.parse::<IpAddr>().unwrap())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// A farm nobody's token owns (every caller may read it); its id.
async fn public_farm(server: &Server) -> String {
    let r = server
        .client()
        .post_json("/farm/api", &json!({"name": "Emerdale"}))
        .await;
    r.expect_status(201);
    r.json()["id"].as_str().unwrap().to_owned()
}

/// A request's status and `Retry-After`.
async fn send(request: reqwest::RequestBuilder) -> (u16, Option<u64>, String) {
    let r = request.send().await.expect("the server answers");
    let status = r.status().as_u16();
    let retry_after = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse::<u64>().expect("whole seconds"));
    (status, retry_after, r.text().await.unwrap())
}

/// The value of a metrics sample (`0` when absent).
async fn metric(server: &Server, sample: &str) -> u64 {
    let text = server.client().get("/metrics").await.text;
    text.lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' '))
        .map_or(0, |v| v.parse().unwrap())
}

/// Status counts of a flood.
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    limited: AtomicU64,
}

/// `tasks` loops of `make()` requests until `stop` (at most `each` requests per loop); a
/// 429 must carry a `Retry-After` of 1 to `max_retry` seconds and the JSON error body.
fn flood(
    tasks: usize,
    each: usize,
    max_retry: u64,
    stop: Arc<AtomicBool>,
    make: impl Fn() -> reqwest::RequestBuilder + Send + Sync + 'static,
) -> (Arc<Tally>, Vec<tokio::task::JoinHandle<()>>) {
    let tally = Arc::new(Tally::default());
    let make = Arc::new(make);
    let handles = (0..tasks)
        .map(|_| {
            let (tally, stop, make) = (tally.clone(), stop.clone(), make.clone());
            tokio::spawn(async move {
                for _ in 0..each {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let (status, retry_after, body) = send(make()).await;
                    match status {
                        200 => tally.ok.fetch_add(1, Ordering::Relaxed),
                        429 => {
                            let secs = retry_after.expect("a 429 has Retry-After");
                            assert!((1..=max_retry).contains(&secs), "Retry-After {secs}");
                            let body: Value = serde_json::from_str(&body).unwrap();
                            let code = body["code"]
                                .as_str()
                                .or(body["errors"][0]["extensions"]["code"].as_str());
                            assert_eq!(code, Some("RATE_LIMITED"), "{body}");
                            tally.limited.fetch_add(1, Ordering::Relaxed)
                        }
                        other => panic!("flood: {other} {body}"),
                    };
                }
            })
        })
        .collect();
    (tally, handles)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_caller_gets_429s_while_another_is_served_throughout() {
    let dir = tempfile::tempdir().unwrap();
    let file = service(
        dir.path(),
        "[server.rate_limit]\nreads = { per_second = 5, burst = 10 }\n",
    );
    let server = Server::start(&file, &[]);
    let id = public_farm(&server).await;
    let http = reqwest::Client::new();

    // alice floods reads by id (the server's direct path) from four tasks
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    // (each task stops at 20,000 requests, far more than bob's three seconds take)
    let (alice, handles) = flood(4, 20_000, 1, stop.clone(), {
        let (http, url, token) = (
            http.clone(),
            server.url(&format!("/farm/api/{id}")),
            bearer("alice"),
        );
        move || http.get(&url).header("authorization", &token)
    });
    // meanwhile bob, from the same address, reads four times a second (under his 5 per
    // second): by id, the list (routed) and GraphQL (a read of cost 1 without a `graphql`
    // class), each while alice's flood goes on
    let bob = bearer("bob");
    let mut bob_ok = 0;
    for round in 0..12 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let request = match round % 3 {
            0 => http.get(server.url(&format!("/farm/api/{id}"))),
            1 => http.get(server.url("/farm/api")),
            _ => http
                .post(server.url("/farm/graph"))
                .json(&json!({"query": format!(r#"{{ getById(id: "{id}") {{ name }} }}"#)})),
        };
        let refused_before = alice.limited.load(Ordering::Relaxed);
        let (status, _, body) = send(request.header("authorization", &bob)).await;
        assert_eq!(
            status, 200,
            "bob's request {round} during alice's flood: {body}"
        );
        bob_ok += 1;
        // the flood goes on: alice is refused around each of bob's requests
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            alice.limited.load(Ordering::Relaxed) > refused_before,
            "alice's flood was still refused around bob's request {round}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.await.unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    // both callers have a bucket (neither is full again yet)
    let callers = metric(&server, "meshql_rate_limit_callers{class=\"reads\"}").await;
    let (ok, limited) = (
        alice.ok.load(Ordering::Relaxed),
        alice.limited.load(Ordering::Relaxed),
    );
    eprintln!("alice: {ok} served, {limited} refused in {elapsed:.1} s; bob: {bob_ok} served");
    // the burst, then 5 per second (one token of slack for the clock)
    assert!(ok >= 10, "alice had her burst: {ok}");
    assert!(
        (ok as f64) <= 10.0 + 5.0 * elapsed + 1.0,
        "alice served {ok} in {elapsed:.1} s"
    );
    assert!(limited > 0);

    // every decision counted, by class; writes were not limited
    let reads = |outcome: &str| {
        format!("meshql_rate_limit_requests_total{{class=\"reads\",outcome=\"{outcome}\"}}")
    };
    assert_eq!(metric(&server, &reads("allowed")).await, ok + bob_ok);
    assert_eq!(metric(&server, &reads("limited")).await, limited);
    assert_eq!(callers, 2);
    let text = server.client().get("/metrics").await.text;
    assert!(!text.contains("class=\"writes\""), "{text}");
    assert!(!text.contains("alice"), "no caller in a label");
    // probes are never limited
    for _ in 0..30 {
        server
            .client()
            .get("/farm/api/health")
            .await
            .expect_status(200);
    }
}

/// Without a token, a caller is its address: a client flooding from 127.0.0.2 is limited,
/// one on 127.0.0.3 is not; a forged token does not make a new caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_without_a_valid_token_are_their_address() {
    let dir = tempfile::tempdir().unwrap();
    let file = service(
        dir.path(),
        "[server.rate_limit]\nreads = { per_second = 0.5, burst = 4 }\n",
    );
    let server = Server::start(&file, &[]);
    let id = public_farm(&server).await;
    let url = server.url(&format!("/farm/api/{id}"));
    let (from_2, from_3) = (client_from("127.0.0.2"), client_from("127.0.0.3"));
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(send(from_2.get(&url)).await.0);
    }
    assert_eq!(&statuses[..4], [200; 4], "{statuses:?}");
    assert!(statuses[4..].iter().all(|s| *s == 429), "{statuses:?}");
    // a forged token from the same address is still that address
    let (status, retry_after, _) = send(
        from_2
            .get(&url)
            .header("authorization", "Bearer not.a.token"),
    )
    .await;
    assert_eq!(status, 429);
    assert!(matches!(retry_after, Some(1 | 2)), "{retry_after:?}");
    // another address is another caller
    for _ in 0..4 {
        assert_eq!(send(from_3.get(&url)).await.0, 200);
    }
    // and a valid token from the flooded address is its subject's own caller
    assert_eq!(
        send(from_2.get(&url).header("authorization", bearer("carol")))
            .await
            .0,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_have_their_own_bucket_and_retry_after_is_honest() {
    let dir = tempfile::tempdir().unwrap();
    let file = service(
        dir.path(),
        "[server.rate_limit]\nwrites = { per_second = 0.5, burst = 3 }\n",
    );
    let server = Server::start(&file, &[]);
    let client = server.client();
    let dave = bearer("dave");
    let write = |name: &str| {
        let body = json!({"name": name}).to_string().into_bytes();
        let (client, dave) = (client.clone(), dave.clone());
        async move {
            client
                .request("POST", "/farm/api", Some(body), &[("authorization", &dave)])
                .await
        }
    };
    for name in ["a", "b"] {
        write(name).await.expect_status(201);
    }
    // a bulk create of three documents is one write
    client
        .request(
            "POST",
            "/farm/api/bulk",
            Some(
                json!([{"name": "c"}, {"name": "d"}, {"name": "e"}])
                    .to_string()
                    .into_bytes(),
            ),
            &[("authorization", &dave)],
        )
        .await
        .expect_status(201);
    let refused = write("f").await;
    refused.expect_status(429);
    // one token every 2 s
    let retry_after: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert_eq!(retry_after, 2, "{:?}", refused.headers);
    let body = refused.json();
    assert_eq!(body["code"], "RATE_LIMITED");
    assert_eq!(body["retry_after"], 2);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("`writes` limit is 0.5 per second"),
        "{body}"
    );
    // reads are not limited by this config, even dave's
    for _ in 0..20 {
        client
            .request("GET", "/farm/api", None, &[("authorization", &dave)])
            .await
            .expect_status(200);
    }
    // after Retry-After, the write goes through
    tokio::time::sleep(Duration::from_secs(retry_after)).await;
    write("f").await.expect_status(201);
    assert_eq!(
        metric(
            &server,
            "meshql_rate_limit_requests_total{class=\"writes\",outcome=\"allowed\"}"
        )
        .await,
        4
    );
    assert_eq!(
        metric(
            &server,
            "meshql_rate_limit_requests_total{class=\"writes\",outcome=\"limited\"}"
        )
        .await,
        1
    );
}

/// GraphQL by cost: its root fields plus relationship fields; 429 with a GraphQL error
/// body; the rest of the cost is charged only once the query is planned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graphql_requests_are_charged_their_cost() {
    let dir = tempfile::tempdir().unwrap();
    // one token every 100 s: nothing refills during the test
    let file = service(
        dir.path(),
        "[server.rate_limit]\ngraphql = { per_second = 0.01, burst = 10 }\n",
    );
    let server = Server::start(&file, &[]);
    let id = public_farm(&server).await;
    let erin = bearer("erin");
    let http = reqwest::Client::new();
    let query = |q: String| {
        http.post(server.url("/farm/graph"))
            .header("authorization", &erin)
            .json(&json!({ "query": q }))
    };
    // four root fields: cost 4
    let four: String = (0..4)
        .map(|i| format!(r#" f{i}: getById(id: "{id}") {{ name }}"#))
        .collect();
    let four = format!("{{{four} }}");
    for _ in 0..2 {
        let (status, _, body) = send(query(four.clone())).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            serde_json::from_str::<Value>(&body).unwrap()["data"]["f3"]["name"],
            "Emerdale"
        );
    }
    // 2 tokens left: the door takes one, the other three are refused: wait for 2 more
    // tokens and the door's again (300 s)
    let (status, retry_after, body) = send(query(four.clone())).await;
    assert_eq!((status, retry_after), (429, Some(300)), "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        body["errors"][0]["extensions"]["code"], "RATE_LIMITED",
        "{body}"
    );
    assert_eq!(body["errors"][0]["extensions"]["retryAfter"], 300, "{body}");
    assert!(body.get("data").is_none(), "{body}");
    // one token left: a query of cost 1 runs
    let (status, _, body) = send(query(format!(r#"{{ getById(id: "{id}") {{ name }} }}"#))).await;
    assert_eq!(status, 200, "{body}");
    // empty: refused at the door, even a query that would not plan
    let (status, retry_after, _) = send(query("{ nonsense }".into())).await;
    assert_eq!((status, retry_after), (429, Some(100)));
    // GET is the same endpoint and the same bucket
    let (status, _, _) = send(
        http.get(server.url("/farm/graph"))
            .query(&[("query", "{ getAll { name } }")])
            .header("authorization", &erin),
    )
    .await;
    assert_eq!(status, 429);
    // another caller has a bucket of its own
    let (status, _, body) = send(
        http.post(server.url("/farm/graph"))
            .header("authorization", bearer("frank"))
            .json(&json!({ "query": four })),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let graphql = |outcome: &str| {
        format!("meshql_rate_limit_requests_total{{class=\"graphql\",outcome=\"{outcome}\"}}")
    };
    assert_eq!(metric(&server, &graphql("allowed")).await, 4);
    assert_eq!(metric(&server, &graphql("limited")).await, 3);
    // REST reads are not GraphQL's
    server
        .client()
        .request("GET", "/farm/api", None, &[("authorization", &erin)])
        .await
        .expect_status(200);
}

/// Thousands of distinct callers leave at most `max_callers` buckets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bucket_table_stays_within_max_callers() {
    let dir = tempfile::tempdir().unwrap();
    let file = service(
        dir.path(),
        "[server.rate_limit]\nreads = { per_second = 1, burst = 1 }\nmax_callers = 100\n",
    );
    let server = Server::start(&file, &[]);
    let id = public_farm(&server).await;
    let url = server.url(&format!("/farm/api/{id}"));
    let http = reqwest::Client::new();
    let tokens: Vec<String> = (0..2_000).map(|n| bearer(&format!("user-{n}"))).collect();
    let mut most = 0;
    for (n, chunk) in tokens.chunks(50).enumerate() {
        let answers = futures::future::join_all(
            chunk
                .iter()
                .map(|t| send(http.get(&url).header("authorization", t))),
        )
        .await;
        // every caller is new: each is served
        assert!(answers.iter().all(|a| a.0 == 200), "chunk {n}");
        if n % 8 == 7 {
            let held = metric(&server, "meshql_rate_limit_callers{class=\"reads\"}").await;
            assert!(held <= 100, "{held} buckets after {} callers", (n + 1) * 50);
            most = most.max(held);
        }
    }
    assert!(most > 0);
    assert_eq!(
        metric(
            &server,
            "meshql_rate_limit_requests_total{class=\"reads\",outcome=\"allowed\"}"
        )
        .await,
        2_000
    );
}

/// Without `[server.rate_limit]` nothing is limited and no series is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_table_nothing_is_limited() {
    let dir = tempfile::tempdir().unwrap();
    let file = service(dir.path(), "");
    let server = Server::start(&file, &[]);
    let id = public_farm(&server).await;
    let http = reqwest::Client::new();
    let answers = futures::future::join_all(
        (0..300).map(|_| send(http.get(server.url(&format!("/farm/api/{id}"))))),
    )
    .await;
    assert!(answers.iter().all(|a| a.0 == 200));
    let text = server.client().get("/metrics").await.text;
    assert!(!text.contains("meshql_rate_limit"), "{text}");
}

#[test]
fn config_errors_name_the_field_and_line() {
    let dir = tempfile::tempdir().unwrap();
    for (table, needle, line) in [
        (
            "[server.rate_limit]\nreads = { burst = 3 }\n",
            "server.rate_limit.reads.per_second: required",
            2,
        ),
        (
            "[server.rate_limit]\nwrites = { per_second = 0 }\n",
            "server.rate_limit.writes.per_second: must be between 0.001 and 1000000",
            2,
        ),
        (
            "[server.rate_limit]\ngraphql = { per_second = 1, burst = 0 }\n",
            "server.rate_limit.graphql.burst",
            2,
        ),
        (
            "[server.rate_limit]\nreads = { per_second = 1 }\nmax_callers = 0\n",
            "server.rate_limit.max_callers",
            3,
        ),
        (
            "[server.rate_limit]\nreads = { per_second = 1 }\nredis = { url = \"http://h:6379\" }\n",
            "server.rate_limit.redis.url: must start with `redis://`",
            3,
        ),
        (
            "[server.rate_limit]\nreads = { per_second = 1 }\n[server.rate_limit.redis]\nurl = \"redis://h\"\ntimeout_ms = 0\n",
            "server.rate_limit.redis.timeout_ms: must be between 1 and 60000",
            3,
        ),
        (
            "[server.rate_limit]\nreads = { per_second = 1 }\nredis = { prefix = \"x\" }\n",
            "server.rate_limit.redis.url: `redis` needs `url",
            3,
        ),
    ] {
        let file = service(dir.path(), table);
        let said = check_error_line(&file, needle);
        assert!(said.contains(&format!("meshql.toml:{line}:")), "{said}");
    }
}

/// Runs `scripts/services/redis.sh <action>` for the server on `port`; its output (the URL
/// for `start`). Fails loudly when the script does.
fn redis(port: u16, action: &str) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/services/redis.sh");
    let out = std::process::Command::new(&script)
        .arg(action)
        .env("MESHQL_REDIS_PORT", port.to_string())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "redis.sh {action} (port {port}) failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The test Redis most tests share (`MESHQL_REDIS_PORT`, default 16379), started if it is
/// not running; its URL.
fn shared_redis() -> String {
    let port = std::env::var("MESHQL_REDIS_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(16379);
    redis(port, "start")
}

/// A key prefix no other test or earlier run uses.
fn unique_prefix(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("rl-{test}-{}-{nanos}", std::process::id())
}

/// Two processes of one config keep their buckets in one Redis: a caller flooding both is
/// admitted about one limit in total (its burst, then its rate), not one per process, while
/// another caller is served by both throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_sharing_redis_hold_a_caller_to_one_limit() {
    let url = shared_redis();
    let prefix = unique_prefix("two");
    let dir = tempfile::tempdir().unwrap();
    // a generous timeout: on a busy machine a slow answer would be decided in process,
    // which this test counts (and expects none of)
    let file = service(
        dir.path(),
        &format!(
            "[server.rate_limit]\nreads = {{ per_second = 1, burst = 20 }}\n\
             redis = {{ url = \"{url}\", prefix = \"{prefix}\", timeout_ms = 2000 }}\n"
        ),
    );
    let servers = [Server::start(&file, &[]), Server::start(&file, &[])];
    // memory storage: each process has a farm of its own
    let mut farms = Vec::new();
    for server in &servers {
        farms.push(server.url(&format!("/farm/api/{}", public_farm(server).await)));
    }
    let http = reqwest::Client::new();

    // alice floods reads by id, two tasks on each process
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut floods = Vec::new();
    for farm in &farms {
        let (http, farm, token) = (http.clone(), farm.clone(), bearer("alice"));
        floods.push(flood(2, 20_000, 1, stop.clone(), move || {
            http.get(&farm).header("authorization", &token)
        }));
    }
    // meanwhile bob (within his own limit: 12 requests, a burst of 20) reads from each
    // process in turn: by id, the list and GraphQL
    let bob = bearer("bob");
    let mut bob_ok = 0;
    for round in 0..12 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let server = &servers[round % 2];
        let request = match round % 3 {
            0 => http.get(&farms[round % 2]),
            1 => http.get(server.url("/farm/api")),
            _ => http
                .post(server.url("/farm/graph"))
                .json(&json!({"query": "{ getAll { name } }"})),
        };
        let (status, _, body) = send(request.header("authorization", &bob)).await;
        assert_eq!(
            status, 200,
            "bob's request {round} during alice's flood: {body}"
        );
        bob_ok += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let mut alice_ok = 0;
    let mut alice_limited = 0;
    for (tally, handles) in floods {
        for h in handles {
            h.await.unwrap();
        }
        alice_ok += tally.ok.load(Ordering::Relaxed);
        alice_limited += tally.limited.load(Ordering::Relaxed);
    }
    let elapsed = started.elapsed().as_secs_f64();
    eprintln!(
        "alice: {alice_ok} served, {alice_limited} refused over two processes in {elapsed:.1} s; bob: {bob_ok} served"
    );
    let reads = |outcome: &str| {
        format!("meshql_rate_limit_requests_total{{class=\"reads\",outcome=\"{outcome}\"}}")
    };
    let mut allowed = 0;
    for (n, server) in servers.iter().enumerate() {
        assert_eq!(
            metric(
                server,
                "meshql_rate_limit_shared_fallbacks_total{class=\"reads\"}"
            )
            .await,
            0,
            "process {n} decided every request through Redis:\n{}",
            server.log()
        );
        let (ok, limited) = (
            metric(server, &reads("allowed")).await,
            metric(server, &reads("limited")).await,
        );
        // the flood reached both processes, and both refused it
        assert!(
            ok > 0 && limited > 0,
            "process {n}: {ok} allowed, {limited} limited"
        );
        allowed += ok;
    }
    assert_eq!(allowed, alice_ok + bob_ok, "every decision counted once");
    // one limit: the burst of 20, then 1 a second (two tokens of slack); a limit per process
    // would have served at least 40
    assert!(alice_ok >= 20, "alice had her burst: {alice_ok}");
    assert!(
        (alice_ok as f64) <= 20.0 + elapsed + 2.0,
        "alice served {alice_ok} in {elapsed:.1} s over two processes"
    );
}

/// The port of the Redis the fault test stops and starts (no other test uses it).
const FAULT_PORT: u16 = 16409;

/// Redis stopped mid-test: no request waits for it or fails; each is decided by the
/// process's own buckets (the same limit, per process), counted and logged once; once Redis
/// is back, requests are decided there again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_stopped_requests_fall_back_to_the_process_limit() {
    let url = redis(FAULT_PORT, "start");
    let dir = tempfile::tempdir().unwrap();
    // one token every 100 s: nothing refills during the test
    let file = service(
        dir.path(),
        &format!(
            "[server.rate_limit]\nreads = {{ per_second = 0.01, burst = 5 }}\n\
             redis = {{ url = \"{url}\", prefix = \"{}\", timeout_ms = 100 }}\n",
            unique_prefix("fault")
        ),
    );
    let server = Server::start(&file, &[]);
    let id = public_farm(&server).await;
    let http = client_from("127.0.0.1");
    let read = |who: &str| {
        http.get(server.url(&format!("/farm/api/{id}")))
            .header("authorization", bearer(who))
    };
    let fallbacks = || {
        metric(
            &server,
            "meshql_rate_limit_shared_fallbacks_total{class=\"reads\"}",
        )
    };
    // through Redis: the burst, then refused
    for n in 0..5 {
        assert_eq!(send(read("dan")).await.0, 200, "dan's read {n}");
    }
    assert_eq!(send(read("dan")).await.0, 429);
    assert_eq!(fallbacks().await, 0);

    redis(FAULT_PORT, "stop");
    // every request is answered, within a bound that only catches a hang: dan's bucket in
    // this process was never used (Redis kept it), so he has a burst here
    let mut statuses = Vec::new();
    for _ in 0..8 {
        let started = Instant::now();
        statuses.push(send(read("dan")).await.0);
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(10),
            "a read took {took:?} with Redis down"
        );
    }
    assert_eq!(&statuses[..5], [200; 5], "{statuses:?}");
    assert!(statuses[5..].iter().all(|s| *s == 429), "{statuses:?}");
    // another caller is limited on his own, in process too
    assert_eq!(send(read("eve")).await.0, 200);
    assert!(fallbacks().await >= 9, "fallbacks: {}", fallbacks().await);
    let log = server.log();
    assert_eq!(
        log.matches("shared rate limits unavailable").count(),
        1,
        "logged once:\n{log}"
    );

    // Redis back (empty: nothing persisted): dan is served again, which only Redis can do
    // (his bucket in this process is empty for 100 s), within a bound that only catches a
    // hang (Redis is tried again at most once a second while it was down)
    redis(FAULT_PORT, "start");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status = send(read("dan")).await.0;
        if status == 200 {
            break;
        }
        assert_eq!(status, 429);
        assert!(
            Instant::now() < deadline,
            "Redis not used again within 20 s of its return"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    redis(FAULT_PORT, "stop");
}

/// Redis stalls (connected, but answering nothing: the proxy holds every byte): a request
/// waits at most `timeout_ms` for it, and after one has waited, the next ones do not wait at
/// all for a second (Redis is tried again once a second); each is decided in process. When
/// it answers again, requests are decided there again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_redis_holds_no_request_longer_than_its_timeout() {
    let url = shared_redis();
    let upstream: std::net::SocketAddr = url
        .trim_start_matches("redis://")
        .parse()
        .expect("redis://host:port");
    let proxy = common::fault_proxy::FaultProxy::start(upstream).await;
    let dir = tempfile::tempdir().unwrap();
    let file = service(
        dir.path(),
        &format!(
            "[server.rate_limit]\nreads = {{ per_second = 0.01, burst = 5 }}\n\
             redis = {{ url = \"redis://{}\", prefix = \"{}\", timeout_ms = 1000 }}\n",
            proxy.addr(),
            unique_prefix("stall")
        ),
    );
    let server = Server::start(&file, &[]);
    let id = public_farm(&server).await;
    let http = reqwest::Client::new();
    let read = |who: &str| {
        http.get(server.url(&format!("/farm/api/{id}")))
            .header("authorization", bearer(who))
    };
    let fallbacks = || {
        metric(
            &server,
            "meshql_rate_limit_shared_fallbacks_total{class=\"reads\"}",
        )
    };
    for _ in 0..5 {
        assert_eq!(send(read("gil")).await.0, 200);
    }
    assert_eq!(send(read("gil")).await.0, 429);
    assert_eq!(fallbacks().await, 0);

    proxy.pause();
    // 20 reads one after another: were each to wait for Redis, they would take 20 s at
    // least; the bound leaves room for a busy machine
    let started = Instant::now();
    let mut statuses = Vec::new();
    for _ in 0..20 {
        statuses.push(send(read("gil")).await.0);
    }
    let took = started.elapsed();
    eprintln!("20 reads with Redis stalled: {took:?}");
    assert!(
        took < Duration::from_secs(12),
        "20 reads with Redis stalled took {took:?}"
    );
    // decided in process: gil's bucket here is full (Redis kept it until now)
    assert_eq!(&statuses[..5], [200; 5], "{statuses:?}");
    assert!(statuses[5..].iter().all(|s| *s == 429), "{statuses:?}");
    assert_eq!(fallbacks().await, 20);

    // answering again: a new caller's reads stop counting as fallbacks (the bound only
    // catches a hang)
    proxy.resume();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let before = fallbacks().await;
        assert_eq!(send(read("hal")).await.0, 200);
        if fallbacks().await == before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Redis not used again within 20 s of answering"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A Redis never reachable (nothing listens on its port) is no reason not to serve: the
/// process starts, and limits by its own buckets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_never_reachable_limits_in_process() {
    let closed = free_port();
    let dir = tempfile::tempdir().unwrap();
    let file = service(
        dir.path(),
        &format!(
            "[server.rate_limit]\nreads = {{ per_second = 0.01, burst = 3 }}\n\
             redis = {{ url = \"redis://127.0.0.1:{closed}\", timeout_ms = 100 }}\n"
        ),
    );
    let server = Server::start(&file, &[]);
    let id = public_farm(&server).await;
    let url = server.url(&format!("/farm/api/{id}"));
    let from_2 = client_from("127.0.0.2");
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(send(from_2.get(&url)).await.0);
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    assert_eq!(
        metric(
            &server,
            "meshql_rate_limit_shared_fallbacks_total{class=\"reads\"}"
        )
        .await,
        5
    );
}
