//! `fan-out`: wide parents at depth 3, to expose N+1 resolution. 4 farms × 20 coops × 10
//! hens; one farm with its 20 coops and 200 hens, and every farm with all 80 coops and 800
//! hens in one query. Against meshql the run also reports storage reads per request (from
//! `/metrics`): batched resolution needs one read per level (3), one-row-at-a-time
//! resolution needs one per parent (22 and 85).

use super::egg_economy::seed_farmyard;
use super::{Ctx, Example, Scenario};
use crate::gate::{self, ensure, GateResult};
use crate::load::{Vu, Workload};
use async_trait::async_trait;
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;

pub struct FanOut;

const FARMS: usize = 4;
const COOPS: usize = 20;
const HENS: usize = 10;

fn hens_in(data: &Value) -> usize {
    match data {
        Value::Array(items) => items.iter().map(hens_in).sum(),
        Value::Object(m) => match m.get("hens") {
            Some(Value::Array(h)) => h.len(),
            _ => m.values().map(hens_in).sum(),
        },
        _ => 0,
    }
}

struct Wide {
    kind: &'static str,
    query: String,
    hens: usize,
}

#[async_trait]
impl Workload for Wide {
    async fn iteration(&self, vu: &mut Vu, _due: Instant) {
        let d = vu
            .session
            .graphql(self.kind, "/farm/graph", &self.query)
            .await;
        let n = d.as_ref().map_or(0, hens_in);
        vu.session.check(self.kind, n >= self.hens);
    }
}

#[async_trait]
impl Scenario for FanOut {
    fn name(&self) -> &'static str {
        "fan-out"
    }
    fn description(&self) -> &'static str {
        "wide parents at depth 3 (1 farm → 20 coops → 200 hens; 4 farms → 80 coops → 800 hens) to expose N+1 resolution"
    }
    fn example(&self) -> Example {
        Example::EggEconomy
    }
    async fn run(&self, ctx: &mut Ctx) -> GateResult<()> {
        let mut s = ctx.session();
        let yard = seed_farmyard(&mut s, FARMS, COOPS, HENS).await?;
        let one = format!(
            "{{ getById(id: \"{}\") {{ name coops {{ name hens {{ name breed }} }} }} }}",
            yard.farms[0].id
        );
        let all = "{ getAll { name coops { name hens { name breed } } } }".to_string();
        let d = gate::query(&mut s, "/farm/graph", &one).await?;
        ensure(hens_in(&d) == COOPS * HENS, || {
            format!(
                "one farm should reach {} hens, got {}",
                COOPS * HENS,
                hens_in(&d)
            )
        })?;
        let d = gate::query(&mut s, "/farm/graph", &all).await?;
        ensure(hens_in(&d) >= FARMS * COOPS * HENS, || {
            format!(
                "every farm should reach {} hens, got {}",
                FARMS * COOPS * HENS,
                hens_in(&d)
            )
        })?;
        let model = ctx.constant(10);
        for (kind, query, hens, n_plus_one) in [
            ("one_farm_200_hens", one, COOPS * HENS, 1 + 1 + COOPS),
            (
                "all_farms_800_hens",
                all,
                FARMS * COOPS * HENS,
                1 + FARMS + FARMS * COOPS,
            ),
        ] {
            let run = ctx
                .closed(kind, Arc::new(Wide { kind, query, hens }), &model)
                .await;
            if let Some(reads) = run.metrics.get("storage_reads_per_request") {
                ctx.note(format!(
                    "{kind}: {reads:.2} storage reads per request (batched: 3, one read per parent: {n_plus_one})"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn counts_hens_at_any_depth() {
        let d = json!({"getAll": [
            {"coops": [{"hens": [1, 2]}, {"hens": [3]}]},
            {"coops": [{"hens": []}]}
        ]});
        assert_eq!(hens_in(&d), 3);
        assert_eq!(hens_in(&json!({"getById": null})), 0);
    }
}
