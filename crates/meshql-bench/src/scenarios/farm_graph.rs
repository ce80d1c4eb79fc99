//! `farm-graph` (seed 000, "full graph"): every iteration creates a farm, a coop in it and a
//! hen in that coop through REST, taking each id from the previous response, then reads the
//! new data back through GraphQL: the farm alone, farm + coops, coop + farm + hens, and
//! hen + coop + farm. Runs on the farm example, whose relationships go over HTTP to the
//! server's own graph endpoints. 10 users for 60 s by default.

use super::{Ctx, Example, Scenario};
use crate::gate::ScenarioError;
use crate::gate::{self, GateResult};
use crate::load::{Vu, Workload};
use async_trait::async_trait;
use bytes::Bytes;
use http::Method;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;

pub struct FarmGraph;

struct FullGraph;

async fn create(vu: &mut Vu, kind: &'static str, path: &str, doc: Value) -> Option<String> {
    let body = Bytes::from(doc.to_string());
    let reply = vu
        .session
        .call(kind, Method::POST, path, Some(body))
        .await?;
    let id = reply
        .json()
        .and_then(|v| v.get("id").and_then(Value::as_str).map(str::to_owned));
    vu.session
        .check(kind, reply.status.is_success() && id.is_some());
    id
}

async fn read(vu: &mut Vu, kind: &'static str, path: &str, query: String, want: &[(&str, &str)]) {
    let d = vu.session.graphql(kind, path, &query).await;
    let ok = d.as_ref().is_some_and(|d| {
        want.iter()
            .all(|(p, v)| gate::at(d, p).and_then(Value::as_str) == Some(*v))
    });
    vu.session.check(kind, ok);
}

#[async_trait]
impl Workload for FullGraph {
    async fn iteration(&self, vu: &mut Vu, _due: Instant) {
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let (farm_name, coop_name, hen_name) = (
            format!("farm-{tag}"),
            format!("coop-{tag}"),
            format!("hen-{tag}"),
        );
        let Some(farm) = create(vu, "create_farm", "/farm/api", json!({"name": farm_name})).await
        else {
            return;
        };
        let Some(coop) = create(
            vu,
            "create_coop",
            "/coop/api",
            json!({"name": coop_name, "farm_id": farm}),
        )
        .await
        else {
            return;
        };
        let Some(hen) = create(
            vu,
            "create_hen",
            "/hen/api",
            json!({"name": hen_name, "coop_id": coop, "eggs": 3}),
        )
        .await
        else {
            return;
        };
        read(
            vu,
            "farm_simple",
            "/farm/graph",
            format!("{{ getById(id: \"{farm}\") {{ id name }} }}"),
            &[("getById.name", &farm_name)],
        )
        .await;
        read(
            vu,
            "farm_with_coops",
            "/farm/graph",
            format!("{{ getById(id: \"{farm}\") {{ id name coops {{ id name }} }} }}"),
            &[("getById.coops.0.name", &coop_name)],
        )
        .await;
        read(
            vu,
            "coop_farm_hens",
            "/coop/graph",
            format!(
                "{{ getById(id: \"{coop}\") {{ id name farm {{ id name }} hens {{ id name eggs }} }} }}"
            ),
            &[("getById.farm.name", &farm_name), ("getById.hens.0.name", &hen_name)],
        )
        .await;
        read(
            vu,
            "hen_coop_farm",
            "/hen/graph",
            format!(
                "{{ getById(id: \"{hen}\") {{ id name coop {{ id name farm {{ id name }} }} }} }}"
            ),
            &[
                ("getById.coop.name", &coop_name),
                ("getById.coop.farm.name", &farm_name),
            ],
        )
        .await;
    }
}

/// The gate of the full-graph workload: a farm, coop and hen written, read back through both
/// directions of the relationships.
async fn gate_full_graph(ctx: &mut Ctx) -> GateResult<()> {
    let mut s = ctx.session();
    let farm = gate::create(&mut s, "/farm/api", &json!({"name": "gate-farm"})).await?;
    let coop = gate::create(
        &mut s,
        "/coop/api",
        &json!({"name": "gate-coop", "farm_id": farm}),
    )
    .await?;
    let hen = gate::create(
        &mut s,
        "/hen/api",
        &json!({"name": "gate-hen", "coop_id": coop}),
    )
    .await?;
    let d = gate::query(
        &mut s,
        "/hen/graph",
        &format!("{{ getById(id: \"{hen}\") {{ name coop {{ name farm {{ name }} }} }} }}"),
    )
    .await?;
    gate::expect_eq(
        &d,
        "getById.coop.farm.name",
        &json!("gate-farm"),
        "hen → coop → farm",
    )?;
    let d = gate::query(
        &mut s,
        "/farm/graph",
        &format!("{{ getById(id: \"{farm}\") {{ coops {{ name hens {{ name }} }} }} }}"),
    )
    .await?;
    gate::expect_eq(
        &d,
        "getById.coops.0.hens.0.name",
        &json!("gate-hen"),
        "farm → coops → hens",
    )?;
    Ok(())
}

#[async_trait]
impl Scenario for FarmGraph {
    fn name(&self) -> &'static str {
        "farm-graph"
    }
    fn description(&self) -> &'static str {
        "farm full graph: REST create farm → coop → hen with ids from the responses, then four GraphQL reads of that data (seed 000)"
    }
    fn example(&self) -> Example {
        Example::Farm
    }
    async fn run(&self, ctx: &mut Ctx) -> GateResult<()> {
        gate_full_graph(ctx).await?;
        let model = ctx.profile(ctx.constant(60));
        let label = model.name.clone();
        ctx.closed(&label, Arc::new(FullGraph), &model).await;
        Ok(())
    }
}

/// Seed 000's two deployments of the full-graph workload on one machine: the monolith
/// (`farm-cqrs` served whole), then the same config as a write process and a read process
/// sharing its SQLite file (REST writes to the first, GraphQL reads to the second).
pub struct FarmCqrs;

#[async_trait]
impl Scenario for FarmCqrs {
    fn name(&self) -> &'static str {
        "farm-cqrs"
    }
    fn description(&self) -> &'static str {
        "farm full graph, monolith vs CQRS: the farm-graph workload on farm-cqrs served whole, then as --role write + --role read on one SQLite file (seed 000)"
    }
    fn example(&self) -> Example {
        Example::FarmCqrs
    }
    async fn run(&self, ctx: &mut Ctx) -> GateResult<()> {
        if ctx.server.is_none() {
            return Err(ScenarioError::Setup(
                "farm-cqrs starts its own processes: run it without --url".into(),
            ));
        }
        gate_full_graph(ctx).await?;
        let model = ctx.profile(ctx.constant(60));
        ctx.closed("monolith", Arc::new(FullGraph), &model).await;
        // the pair: one data directory, the read process's resolvers pointed at itself
        let pair = ctx.split_into_roles().await?;
        let gated = gate_full_graph(ctx).await;
        if gated.is_ok() {
            ctx.closed("cqrs", Arc::new(FullGraph), &model).await;
        }
        ctx.join_roles(pair);
        gated?;
        ctx.note(
            "monolith: one meshql serving farm-cqrs whole (both cores); cqrs: the same config as \
             --role write (REST) and --role read (GraphQL, relationships over HTTP to itself) on \
             one SQLite file, the two processes sharing the machine's cores (the monolith \
             stopped). The pair's resource columns are the read process's.",
        );
        Ok(())
    }
}
