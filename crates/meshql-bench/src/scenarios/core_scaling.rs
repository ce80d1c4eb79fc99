//! `core-scaling` (seed 002): the same read/write mix against the server on one worker thread
//! and on one per core, on the same data. Needs a server the bench starts (it restarts it with
//! `--workers`).

use super::egg_economy::seed_farmyard;
use super::{Ctx, Example, Scenario};
use crate::gate::{self, GateResult, ScenarioError};
use crate::load::{Vu, Workload};
use async_trait::async_trait;
use bytes::Bytes;
use http::Method;
use serde_json::json;
use std::sync::Arc;
use std::time::Instant;

pub struct CoreScaling;

struct Mix {
    farms: Vec<String>,
}

#[async_trait]
impl Workload for Mix {
    async fn iteration(&self, vu: &mut Vu, _due: Instant) {
        let farm = &self.farms[vu.rng.usize(..self.farms.len())];
        let r = vu
            .session
            .call("rest_get", Method::GET, &format!("/farm/api/{farm}"), None)
            .await;
        vu.session
            .check("rest_get", r.is_some_and(|r| r.status.is_success()));
        let q = format!("{{ getById(id: \"{farm}\") {{ id name zone }} }}");
        let d = vu
            .session
            .graphql("graphql_get_by_id", "/farm/graph", &q)
            .await;
        vu.session.check("graphql_get_by_id", d.is_some());
        let q =
            format!("{{ getById(id: \"{farm}\") {{ name coops {{ name hens {{ name }} }} }} }}");
        let d = vu
            .session
            .graphql("graphql_depth3", "/farm/graph", &q)
            .await;
        vu.session.check("graphql_depth3", d.is_some());
        let body = Bytes::from(
            json!({"name": "scaling", "farm_type": "homestead", "zone": "west"}).to_string(),
        );
        let r = vu
            .session
            .call("rest_post", Method::POST, "/farm/api", Some(body))
            .await;
        vu.session
            .check("rest_post", r.is_some_and(|r| r.status.is_success()));
    }
}

#[async_trait]
impl Scenario for CoreScaling {
    fn name(&self) -> &'static str {
        "core-scaling"
    }
    fn description(&self) -> &'static str {
        "one read/write mix with the server on 1 worker thread, then on one per core (seed 002)"
    }
    fn example(&self) -> Example {
        Example::EggEconomy
    }
    async fn run(&self, ctx: &mut Ctx) -> GateResult<()> {
        if ctx.server.is_none() {
            return Err(ScenarioError::NeedsLocal);
        }
        let mut s = ctx.session();
        let yard = seed_farmyard(&mut s, 3, 3, 5).await?;
        let f = &yard.farms[0];
        let doc = gate::get_json(&mut s, &format!("/farm/api/{}", f.id)).await?;
        gate::expect_eq(&doc, "name", &json!(f.name), "REST read of a seeded farm")?;
        let workload: Arc<dyn Workload> = Arc::new(Mix {
            farms: yard.farms.iter().map(|f| f.id.clone()).collect(),
        });
        let model = ctx.constant(10);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut rps = Vec::new();
        for workers in [1, cores] {
            if let Some(server) = ctx.server.as_mut() {
                server
                    .restart(Some(workers))
                    .await
                    .map_err(|e| ScenarioError::Setup(e.to_string()))?;
            }
            let run = ctx
                .closed(&format!("{workers} worker(s)"), workload.clone(), &model)
                .await;
            rps.push(run.overall.rps);
        }
        if rps[0] > 0.0 {
            ctx.note(format!(
                "{cores} workers vs 1: {:.2}x the throughput ({:.0} vs {:.0} req/s); the load generator shares the same {cores} cores",
                rps[1] / rps[0],
                rps[1],
                rps[0]
            ));
        }
        Ok(())
    }
}
