//! The load models against a tiny local server: arrival scheduling, dropped iterations,
//! latency counted from the due time, staged users.

use axum::routing::get;
use axum::Router;
use meshql_bench::client::Target;
use meshql_bench::load::{run_closed, run_open, ClosedModel, OpenModel, Stage, Vu, Workload};
use meshql_bench::monitor::Live;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

async fn serve(delay: Duration) -> (Target, Arc<AtomicU64>) {
    let hits = Arc::new(AtomicU64::new(0));
    let counter = hits.clone();
    let app = Router::new().route(
        "/",
        get(move || {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(delay).await;
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (Target::parse(&url).unwrap(), hits)
}

struct Get;

#[async_trait::async_trait]
impl Workload for Get {
    async fn iteration(&self, vu: &mut Vu, _due: Instant) {
        vu.session.call("get", http::Method::GET, "/", None).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_model_issues_every_due_iteration() {
    let (target, hits) = serve(Duration::ZERO).await;
    let model = OpenModel {
        rate: 200.0,
        duration: Duration::from_secs(1),
        pre_allocated: 5,
        max_workers: 50,
    };
    let started = Instant::now();
    let out = run_open(&target, Arc::new(Get), &model, Arc::new(Live::default())).await;
    let took = started.elapsed();
    // every due iteration is either sent or counted as dropped (none should be on an idle
    // machine; a busy one may leave no free worker, which is what `dropped` reports)
    assert_eq!(out.iterations + out.dropped, 200);
    assert_eq!(hits.load(Ordering::Relaxed), out.iterations);
    let (kinds, overall) = out.recorder.summarise(out.elapsed);
    assert_eq!(kinds.len(), 1);
    assert_eq!(overall.count, out.iterations);
    assert_eq!(overall.http_errors, 0);
    // the schedule spreads the iterations over the second instead of bursting them
    assert!(took >= Duration::from_millis(990), "{took:?}");
    assert_eq!(out.schedule_lag.len(), out.iterations);
}

#[tokio::test(flavor = "current_thread")]
async fn open_model_at_a_high_rate_accounts_for_every_due_iteration() {
    // 20,000/s: iterations closer together than the generator's shortest wake-up gap are
    // sent in small groups; each one is still sent or counted dropped, and timed
    let (target, hits) = serve(Duration::ZERO).await;
    let model = OpenModel {
        rate: 20_000.0,
        duration: Duration::from_millis(250),
        pre_allocated: 10,
        max_workers: 200,
    };
    let out = run_open(&target, Arc::new(Get), &model, Arc::new(Live::default())).await;
    assert_eq!(out.iterations + out.dropped, 5_000);
    assert_eq!(hits.load(Ordering::Relaxed), out.iterations);
    assert_eq!(out.recorder.total_requests(), out.iterations);
    assert_eq!(out.schedule_lag.len(), out.iterations);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_model_drops_what_no_worker_can_take() {
    // a 100 ms server and at most 2 workers can serve 20/s; 100/s are offered
    let (target, hits) = serve(Duration::from_millis(100)).await;
    let model = OpenModel {
        rate: 100.0,
        duration: Duration::from_secs(1),
        pre_allocated: 1,
        max_workers: 2,
    };
    let out = run_open(&target, Arc::new(Get), &model, Arc::new(Live::default())).await;
    assert_eq!(out.iterations + out.dropped, 100);
    assert!(out.dropped >= 60, "dropped {}", out.dropped);
    assert_eq!(hits.load(Ordering::Relaxed), out.iterations);
    assert_eq!(out.peak_vus, 2);
    let (_, overall) = out.recorder.summarise(out.elapsed);
    assert!(
        overall.min_ms >= 99.0,
        "latency counts the server's 100 ms: {}",
        overall.min_ms
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_model_follows_its_stages() {
    let (target, _) = serve(Duration::from_millis(2)).await;
    let model = ClosedModel {
        name: "ramp".into(),
        start_vus: 1,
        stages: vec![
            Stage {
                duration: Duration::from_millis(300),
                target: 4,
            },
            Stage {
                duration: Duration::from_millis(300),
                target: 4,
            },
        ],
        think: Duration::from_millis(1),
    };
    let live = Arc::new(Live::default());
    let out = run_closed(&target, Arc::new(Get), &model, live.clone()).await;
    assert_eq!(out.peak_vus, 4);
    assert!(out.iterations > 20, "{}", out.iterations);
    assert_eq!(out.recorder.total_requests(), out.iterations);
    assert_eq!(live.requests.load(Ordering::Relaxed), out.iterations);
    assert_eq!(live.vus.load(Ordering::Relaxed), 0, "every user stopped");
    assert!(out.elapsed >= Duration::from_millis(600));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_is_an_http_error_not_a_hang() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let out = run_closed(
        &Target::parse(&url).unwrap(),
        Arc::new(Get),
        &ClosedModel::constant(1, Duration::from_millis(100)),
        Arc::new(Live::default()),
    )
    .await;
    let (_, overall) = out.recorder.summarise(out.elapsed);
    assert!(overall.count > 0);
    assert_eq!(overall.http_errors, overall.count);
    assert_eq!(overall.error_rate, 1.0);
}

/// Waits `late` before its request, as a worker that starts after its iteration was due.
struct LateGet {
    late: Duration,
}

#[async_trait::async_trait]
impl Workload for LateGet {
    async fn iteration(&self, vu: &mut Vu, _due: Instant) {
        tokio::time::sleep(self.late).await;
        vu.session.call("get", http::Method::GET, "/", None).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_model_latency_counts_from_when_the_request_was_due() {
    // the server answers at once; every request leaves 50 ms after it was due
    let (target, _) = serve(Duration::ZERO).await;
    let model = OpenModel {
        rate: 50.0,
        duration: Duration::from_millis(500),
        pre_allocated: 10,
        max_workers: 50,
    };
    let workload = Arc::new(LateGet {
        late: Duration::from_millis(50),
    });
    let out = run_open(&target, workload, &model, Arc::new(Live::default())).await;
    let (_, overall) = out.recorder.summarise(out.elapsed);
    assert!(overall.count > 0);
    assert!(
        overall.min_ms >= 50.0,
        "from the due time, every request waited at least 50 ms: min {} ms",
        overall.min_ms
    );

    // the closed model has no schedule: the same workload is timed from the send
    let model = ClosedModel::constant(1, Duration::from_millis(300));
    let out = run_closed(
        &target,
        Arc::new(LateGet {
            late: Duration::from_millis(50),
        }),
        &model,
        Arc::new(Live::default()),
    )
    .await;
    let (_, overall) = out.recorder.summarise(out.elapsed);
    assert!(overall.count > 0);
    assert!(overall.min_ms < 50.0, "min {} ms", overall.min_ms);
}

/// Answers at once, except that every request arriving in a 200 ms window after the 40th
/// waits until the window ends (a server that stalls).
async fn serve_stalling() -> Target {
    let hits = Arc::new(AtomicU64::new(0));
    let stall_until: Arc<std::sync::Mutex<Option<tokio::time::Instant>>> = Arc::default();
    let app = Router::new().route(
        "/",
        get(move || {
            let (hits, stall_until) = (hits.clone(), stall_until.clone());
            async move {
                let n = hits.fetch_add(1, Ordering::SeqCst);
                let until = {
                    let mut s = stall_until.lock().unwrap();
                    if n == 40 {
                        *s = Some(tokio::time::Instant::now() + Duration::from_millis(200));
                    }
                    *s
                };
                if let Some(until) = until {
                    tokio::time::sleep_until(until).await;
                }
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Target::parse(&url).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_stall_shows_in_the_percentiles() {
    let target = serve_stalling().await;
    // 100/s for 1 s: ~20 requests arrive during the 200 ms stall, each waiting up to 200 ms
    let model = OpenModel {
        rate: 100.0,
        duration: Duration::from_secs(1),
        pre_allocated: 5,
        max_workers: 100,
    };
    let out = run_open(&target, Arc::new(Get), &model, Arc::new(Live::default())).await;
    let (_, overall) = out.recorder.summarise(out.elapsed);
    assert!(
        overall.max_ms >= 150.0,
        "the stalled request shows: {overall:?}"
    );
    assert!(
        overall.p90_ms >= 50.0,
        "a tenth of the requests waited in the stall: {overall:?}"
    );
}
