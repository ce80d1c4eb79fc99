//! `products` (seed 004): seed N products (default 100,000) through the bulk endpoint, warm
//! up (a third of a step at the first rate, not measured), then
//! `GET /products/api/{id}` with uniformly random ids at constant arrival rates — 300/s and
//! 900/s as in the seed, then a sweep upward (2,000/s, 5,000/s, 10,000/s, …) until p95
//! crosses `--sweep-p95-ms`, iterations are dropped, or throughput falls behind the offered
//! rate. Iterations are issued on schedule whatever the responses do; when no worker is free
//! they are dropped and counted (no coordinated omission); how late the generator started
//! iterations is reported as `schedule_lag_p99_ms`.

use super::writes::BackgroundWrites;
use super::{Ctx, Example, Scenario};
use crate::gate::{self, ensure, GateResult};
use crate::load::{OpenModel, Vu, Workload};
use async_trait::async_trait;
use http::Method;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct Products;

const CHUNK: usize = 1000;
const SWEEP: [f64; 9] = [
    2_000.0, 5_000.0, 10_000.0, 15_000.0, 20_000.0, 30_000.0, 40_000.0, 60_000.0, 80_000.0,
];
const CATEGORIES: [&str; 5] = ["tools", "garden", "kitchen", "toys", "books"];

fn product(i: usize) -> Value {
    json!({
        "name": format!("product {i}"),
        "sku": format!("SKU-{i:07}"),
        "category": CATEGORIES[i % CATEGORIES.len()],
        "price": (i % 10_000) as f64 / 100.0 + 1.0,
        "stock": (i * 7) % 500,
    })
}

struct RandomGet {
    paths: Vec<String>,
}

#[async_trait]
impl Workload for RandomGet {
    async fn iteration(&self, vu: &mut Vu, _due: Instant) {
        let path = &self.paths[vu.rng.usize(..self.paths.len())];
        let reply = vu
            .session
            .call("get_product", Method::GET, path, None)
            .await;
        vu.session
            .check("get_product", reply.is_some_and(|r| r.status.is_success()));
    }
}

fn model(rate: f64, secs: u64) -> OpenModel {
    let pre = ((rate / 10.0) as usize).clamp(10, 100);
    OpenModel {
        rate,
        duration: Duration::from_secs(secs),
        pre_allocated: pre,
        max_workers: pre * 4,
    }
}

#[async_trait]
impl Scenario for Products {
    fn name(&self) -> &'static str {
        "products"
    }
    fn description(&self) -> &'static str {
        "products GET by uniformly random id over N seeded rows at constant arrival rates, then a sweep upward (seed 004)"
    }
    fn example(&self) -> Example {
        Example::Products
    }
    async fn run(&self, ctx: &mut Ctx) -> GateResult<()> {
        let n = ctx.opts.products.max(1);
        let pair = match ctx.opts.cqrs {
            true => Some(ctx.split_into_roles().await?),
            false => None,
        };
        let mut s = ctx.session();
        let started = Instant::now();
        let mut ids = Vec::with_capacity(n);
        for chunk_start in (0..n).step_by(CHUNK) {
            let docs: Vec<Value> = (chunk_start..(chunk_start + CHUNK).min(n))
                .map(product)
                .collect();
            ids.extend(gate::create_bulk(&mut s, "/products/api", &docs).await?);
        }
        ctx.note(format!(
            "seeded {n} products through /products/api/bulk in {:.1} s",
            started.elapsed().as_secs_f64()
        ));
        if pair.is_some() {
            // the read process may read a replica: the last product seeded must be there
            let last = format!("/products/api/{}", ids[ids.len() - 1]);
            let waited = Instant::now();
            loop {
                let reply = s
                    .send(Method::GET, &last, None)
                    .await
                    .map_err(|e| gate::ScenarioError::Setup(format!("GET {last}: {e}")))?;
                if reply.status.is_success() {
                    break;
                }
                ensure(waited.elapsed() < Duration::from_secs(60), || {
                    format!("the read process does not have {last} 60 s after it was seeded")
                })?;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            ctx.note(format!(
                "served as --role write + --role read: the read process had the last product {:.0} ms after the seeding",
                waited.elapsed().as_secs_f64() * 1000.0
            ));
        }
        let mut rng = fastrand::Rng::with_seed(4);
        for _ in 0..5 {
            let i = rng.usize(..n);
            let doc = gate::get_json(&mut s, &format!("/products/api/{}", ids[i])).await?;
            gate::expect_eq(&doc, "sku", &product(i)["sku"], "random seeded product")?;
        }
        let paths: Vec<String> = ids.iter().map(|id| format!("/products/api/{id}")).collect();
        let workload: Arc<dyn Workload> = Arc::new(RandomGet { paths });
        let step = ctx.opts.step_secs.max(1);
        let mut rates = ctx.opts.rates.clone();
        let top = rates.iter().copied().fold(0.0, f64::max);
        let sweep_from = rates.len();
        rates.extend(SWEEP.iter().copied().filter(|r| *r > top));
        let bound = ctx.opts.sweep_p95_ms;
        // --writes-per-sec: new products POSTed meanwhile (seed 004: 1,000/s on the primary)
        let writes_rate = ctx.opts.writes_per_sec;
        let mut written = (0u64, 0u64, 0.0f64);
        // warm-up, not measured: the first step's load for a third of a step, so the first
        // measured step does not pay for opening pool connections, preparing statements and
        // reading the table into the database's page cache (a replica's especially)
        if let Some(&first) = ctx.opts.rates.first() {
            let secs = (step / 3).max(1);
            let warm = ctx
                .open_unlisted("warm-up", workload.clone(), &model(first, secs))
                .await;
            ctx.note(format!(
                "warm-up (not measured): {secs} s at {first:.0}/s, p95 {:.2} ms",
                warm.overall.p95_ms
            ));
        }
        for (i, rate) in rates.into_iter().enumerate() {
            let sweeping = i >= sweep_from;
            let secs = if sweeping { (step / 3).max(1) } else { step };
            let writes = (writes_rate > 0.0).then(|| {
                BackgroundWrites::start(ctx.target.clone(), writes_rate, "/products/api", |k| {
                    product(1_000_000_000 + k as usize)
                })
            });
            let run = ctx
                .open(
                    &format!("{rate:.0}/s"),
                    workload.clone(),
                    &model(rate, secs),
                )
                .await;
            if let Some(writes) = writes {
                let (sent, failed, secs) = writes.stop().await;
                written = (written.0 + sent, written.1 + failed, written.2 + secs);
            }
            if sweeping {
                let behind = run.overall.rps < rate * 0.95;
                if run.overall.p95_ms > bound || run.dropped > 0 || behind {
                    ctx.note(format!(
                        "sweep stopped at {rate:.0}/s: p95 {:.2} ms (bound {bound} ms), {} dropped, {:.0} req/s achieved",
                        run.overall.p95_ms, run.dropped, run.overall.rps
                    ));
                    break;
                }
            }
        }
        if writes_rate > 0.0 {
            let (sent, failed, secs) = written;
            ctx.note(format!(
                "{sent} products written during the reads ({writes_rate:.0}/s asked, {:.0}/s sent), {failed} failed",
                sent as f64 / secs.max(1e-9)
            ));
            ensure(failed == 0, || format!("{failed} background writes failed"))?;
        }
        if let Some(pair) = pair {
            ctx.join_roles(pair);
        }
        ensure(!ctx.runs.is_empty(), || "no rate was measured".into())
    }
}
