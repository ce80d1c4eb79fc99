//! The egg-economy suite (seed 001): the request mix of MeshQL's published k6 tests —
//! `rest-crud`, `graphql-queries`, `federation-depth`, `mixed-workload` — run under the
//! smoke/load/stress profiles against the 13-entity egg-economy API.
//!
//! Every scenario seeds the same farmyard through REST (3 farms in 3 zones, 3 coops per farm,
//! 5 hens per coop, a farm_output projection per farm and a hen_productivity projection per
//! hen) and its gate reads it back through the requests it is about to measure.

use super::{Ctx, Example, Scenario};
use crate::client::Session;
use crate::gate::{self, ensure, len_at, GateResult};
use crate::load::{ClosedModel, Vu, Workload};
use async_trait::async_trait;
use bytes::Bytes;
use http::Method;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;

pub const ZONES: [&str; 3] = ["north", "south", "east"];

#[derive(Clone)]
pub struct Coop {
    pub id: String,
    pub hens: Vec<String>,
}

#[derive(Clone)]
pub struct Farm {
    pub id: String,
    pub name: String,
    pub zone: &'static str,
    pub coops: Vec<Coop>,
}

/// What the seed created, ids as the server returned them.
#[derive(Clone)]
pub struct Farmyard {
    pub farms: Vec<Farm>,
}

impl Farmyard {
    pub fn hens(&self) -> impl Iterator<Item = (&Farm, &Coop, &String)> {
        self.farms.iter().flat_map(|f| {
            f.coops
                .iter()
                .flat_map(move |c| c.hens.iter().map(move |h| (f, c, h)))
        })
    }
}

/// Seeds `farms` farms (zones round-robin) × `coops` coops × `hens` hens through REST.
pub async fn seed_farmyard(
    s: &mut Session,
    farms: usize,
    coops: usize,
    hens: usize,
) -> GateResult<Farmyard> {
    let mut yard = Farmyard { farms: Vec::new() };
    for f in 0..farms {
        let zone = ZONES[f % ZONES.len()];
        let name = format!("farm-{f}");
        let id = gate::create(
            s,
            "/farm/api",
            &json!({"name": name, "farm_type": "local_farm", "zone": zone, "owner": "bench"}),
        )
        .await?;
        let mut farm = Farm {
            id,
            name,
            zone,
            coops: Vec::new(),
        };
        for c in 0..coops {
            let coop_id = gate::create(
                s,
                "/coop/api",
                &json!({"name": format!("coop-{f}-{c}"), "farm_id": farm.id, "capacity": 50, "coop_type": "barn"}),
            )
            .await?;
            let hen_docs: Vec<Value> = (0..hens)
                .map(|h| json!({"name": format!("hen-{f}-{c}-{h}"), "coop_id": coop_id, "breed": "leghorn", "status": "active"}))
                .collect();
            let hen_ids = if hen_docs.is_empty() {
                vec![]
            } else {
                gate::create_bulk(s, "/hen/api", &hen_docs).await?
            };
            farm.coops.push(Coop {
                id: coop_id,
                hens: hen_ids,
            });
        }
        yard.farms.push(farm);
    }
    Ok(yard)
}

/// How the projections the mixed workload reads came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Projections {
    /// Computed by the server from the seeded lay reports (meshql's processors).
    Live,
    /// Written through REST by the bench, for a server that computes none (MeshQL's
    /// processors run out of band).
    Seeded,
}

/// The projections the mixed workload reads: one farm_output per farm, one
/// hen_productivity per hen, computed from one lay report of 6 eggs per hen (every hen's
/// eggs_week 6, every farm's total_hens its hens) — or, on a server that does not compute
/// them within 5 s, written through REST with those values.
pub(super) async fn seed_projections(s: &mut Session, yard: &Farmyard) -> GateResult<Projections> {
    let reports: Vec<Value> = yard
        .hens()
        .map(|(f, c, h)| json!({"hen_id": h, "coop_id": c.id, "farm_id": f.id, "eggs": 6, "quality": "grade_a", "timestamp": SEED_TIME}))
        .collect();
    for chunk in reports.chunks(500) {
        gate::create_bulk(s, "/lay_report/api", chunk).await?;
    }
    let first = &yard.farms[0];
    let probe = format!("{{ getByFarm(id: \"{}\") {{ total_hens }} }}", first.id);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let live = loop {
        let d = gate::query(s, "/farm_output/graph", &probe).await?;
        if len_at(&d, "getByFarm") > 0 {
            break true;
        }
        if std::time::Instant::now() > deadline {
            break false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    if !live {
        for f in &yard.farms {
            let hens = f.coops.iter().map(|c| c.hens.len()).sum::<usize>();
            gate::create(
                s,
                "/farm_output/api",
                &json!({"farm_id": f.id, "farm_type": "local_farm", "eggs_today": hens * 6, "eggs_week": hens * 6,
                        "eggs_month": hens * 6, "active_hens": hens, "total_hens": hens, "avg_per_hen_per_week": 6.0}),
            )
            .await?;
        }
        let docs: Vec<Value> = yard
            .hens()
            .map(|(f, _, h)| json!({"hen_id": h, "farm_id": f.id, "eggs_today": 6, "eggs_week": 6, "eggs_month": 6, "total_eggs": 6}))
            .collect();
        gate::create_bulk(s, "/hen_productivity/api", &docs).await?;
        return Ok(Projections::Seeded);
    }
    for f in &yard.farms {
        let hens = f.coops.iter().map(|c| c.hens.len()).sum::<usize>();
        let q = format!("{{ getByFarm(id: \"{}\") {{ total_hens }} }}", f.id);
        eventually(
            s,
            "/farm_output/graph",
            &q,
            "getByFarm.0.total_hens",
            &json!(hens),
            "farm_output computed from the seeded lay reports",
        )
        .await?;
    }
    Ok(Projections::Live)
}

/// When the seeded lay reports were laid.
const SEED_TIME: &str = "2026-11-22T06:00:00Z";

/// Polls `query` until the value at `path` is `want` (the processors apply writes a moment
/// after they are acknowledged), for at most 10 s.
async fn eventually(
    s: &mut Session,
    graph: &str,
    query: &str,
    path: &str,
    want: &Value,
    what: &str,
) -> GateResult<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let d = gate::query(s, graph, query).await?;
        match gate::expect_eq(&d, path, want, what) {
            Ok(()) => return Ok(()),
            Err(e) if std::time::Instant::now() > deadline => return Err(e),
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
        }
    }
}

fn depth3(farm: &str) -> String {
    format!("{{ getById(id: \"{farm}\") {{ name coops {{ name hens {{ name breed }} }} }} }}")
}

/// The gate shared by the suite: the farmyard reads back through REST and GraphQL.
pub(super) async fn gate_farmyard(s: &mut Session, yard: &Farmyard) -> GateResult<()> {
    let f = &yard.farms[0];
    let doc = gate::get_json(s, &format!("/farm/api/{}", f.id)).await?;
    gate::expect_eq(&doc, "name", &json!(f.name), "REST read of a seeded farm")?;
    let d = gate::query(s, "/farm/graph", &depth3(&f.id)).await?;
    gate::expect_eq(&d, "getById.name", &json!(f.name), "farm getById")?;
    ensure(len_at(&d, "getById.coops") == f.coops.len(), || {
        format!("depth 3: expected {} coops, got {d}", f.coops.len())
    })?;
    for i in 0..f.coops.len() {
        let want = f.coops[i].hens.len();
        ensure(
            len_at(&d, &format!("getById.coops.{i}.hens")) == want,
            || format!("depth 3: expected {want} hens in coop {i}, got {d}"),
        )?;
    }
    Ok(())
}

fn random<'a, T>(vu: &mut Vu, items: &'a [T]) -> &'a T {
    &items[vu.rng.usize(..items.len())]
}

/// Checks that the data at `path` is a non-empty list / present object.
fn present(data: &Option<Value>, path: &str) -> bool {
    data.as_ref()
        .and_then(|d| gate::at(d, path))
        .is_some_and(|v| match v {
            Value::Array(a) => !a.is_empty(),
            Value::Null => false,
            _ => true,
        })
}

// ------------------------------------------------------------------------------------------
// rest-crud
// ------------------------------------------------------------------------------------------

pub struct RestCrud;

pub(super) struct RestCrudLoad;

#[async_trait]
impl Workload for RestCrudLoad {
    async fn iteration(&self, vu: &mut Vu, _due: Instant) {
        let s = &mut vu.session;
        let name = format!("crud-{}", uuid::Uuid::new_v4());
        let body = Bytes::from(
            json!({"name": name, "farm_type": "homestead", "zone": "west"}).to_string(),
        );
        let Some(created) = s
            .call("rest_create", Method::POST, "/farm/api", Some(body))
            .await
        else {
            return;
        };
        let id = created
            .json()
            .and_then(|v| v.get("id").and_then(Value::as_str).map(str::to_owned));
        if !s.check("rest_create", created.status.is_success() && id.is_some()) {
            return;
        }
        let path = format!("/farm/api/{}", id.expect("checked"));
        let read = s.call("rest_read", Method::GET, &path, None).await;
        let ok = read
            .and_then(|r| r.json())
            .is_some_and(|v| v.get("name") == Some(&json!(name)));
        s.check("rest_read", ok);
        let body = Bytes::from(
            json!({"name": format!("{name}-v2"), "farm_type": "homestead", "zone": "west"})
                .to_string(),
        );
        let updated = s.call("rest_update", Method::PUT, &path, Some(body)).await;
        s.check(
            "rest_update",
            updated.is_some_and(|r| r.status.is_success()),
        );
        let deleted = s.call("rest_delete", Method::DELETE, &path, None).await;
        s.check(
            "rest_delete",
            deleted.is_some_and(|r| r.status.is_success()),
        );
    }
}

/// The rest-crud gate: a farm created through REST reads back.
pub(super) async fn gate_rest_crud(s: &mut Session) -> GateResult<()> {
    let id = gate::create(
        s,
        "/farm/api",
        &json!({"name": "gate", "farm_type": "homestead", "zone": "west"}),
    )
    .await?;
    let doc = gate::get_json(s, &format!("/farm/api/{id}")).await?;
    gate::expect_eq(&doc, "name", &json!("gate"), "REST read after create")
}

#[async_trait]
impl Scenario for RestCrud {
    fn name(&self) -> &'static str {
        "rest-crud"
    }
    fn description(&self) -> &'static str {
        "egg-economy REST CRUD: create a farm, read it, replace it, delete it (seed 001)"
    }
    fn example(&self) -> Example {
        Example::EggEconomy
    }
    async fn run(&self, ctx: &mut Ctx) -> GateResult<()> {
        let mut s = ctx.session();
        gate_rest_crud(&mut s).await?;
        let model = ctx.profile(ClosedModel::smoke());
        let label = model.name.clone();
        ctx.closed(&label, Arc::new(RestCrudLoad), &model).await;
        Ok(())
    }
}

// ------------------------------------------------------------------------------------------
// graphql-queries
// ------------------------------------------------------------------------------------------

pub struct GraphqlQueries;

pub(super) struct QueriesLoad {
    pub(super) yard: Farmyard,
}

#[async_trait]
impl Workload for QueriesLoad {
    async fn iteration(&self, vu: &mut Vu, _due: Instant) {
        let farm = random(vu, &self.yard.farms);
        let q = format!(
            "{{ getById(id: \"{}\") {{ id name farm_type zone }} }}",
            farm.id
        );
        let d = vu
            .session
            .graphql("graphql_get_by_id", "/farm/graph", &q)
            .await;
        vu.session
            .check("graphql_get_by_id", present(&d, "getById.name"));
        let d = vu
            .session
            .graphql(
                "graphql_get_all",
                "/farm/graph",
                "{ getAll { id name zone } }",
            )
            .await;
        vu.session.check("graphql_get_all", present(&d, "getAll"));
        let zone = ZONES[vu.rng.usize(..ZONES.len())];
        let q = format!("{{ getByZone(zone: \"{zone}\") {{ id name }} }}");
        let d = vu
            .session
            .graphql("graphql_filtered", "/farm/graph", &q)
            .await;
        vu.session
            .check("graphql_filtered", present(&d, "getByZone"));
    }
}

/// The graphql-queries gate (after [`gate_farmyard`]): getAll lists the seeded farms and
/// getByZone finds one of them.
pub(super) async fn gate_queries(s: &mut Session, yard: &Farmyard) -> GateResult<()> {
    let d = gate::query(s, "/farm/graph", "{ getAll { id } }").await?;
    ensure(len_at(&d, "getAll") >= yard.farms.len(), || {
        format!("getAll returned {d}")
    })?;
    let f = &yard.farms[0];
    let q = format!("{{ getByZone(zone: \"{}\") {{ id }} }}", f.zone);
    let d = gate::query(s, "/farm/graph", &q).await?;
    let found = gate::at(&d, "getByZone")
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|x| x.get("id") == Some(&json!(f.id))));
    ensure(found, || {
        format!("getByZone({}) should include {}: {d}", f.zone, f.id)
    })
}

#[async_trait]
impl Scenario for GraphqlQueries {
    fn name(&self) -> &'static str {
        "graphql-queries"
    }
    fn description(&self) -> &'static str {
        "egg-economy GraphQL root queries: getById, getAll, filtered by zone (seed 001)"
    }
    fn example(&self) -> Example {
        Example::EggEconomy
    }
    async fn run(&self, ctx: &mut Ctx) -> GateResult<()> {
        let mut s = ctx.session();
        let yard = seed_farmyard(&mut s, 3, 3, 5).await?;
        gate_farmyard(&mut s, &yard).await?;
        gate_queries(&mut s, &yard).await?;
        let model = ctx.profile(ClosedModel::smoke());
        let label = model.name.clone();
        ctx.closed(&label, Arc::new(QueriesLoad { yard }), &model)
            .await;
        Ok(())
    }
}

// ------------------------------------------------------------------------------------------
// federation-depth
// ------------------------------------------------------------------------------------------

pub struct FederationDepth;

pub(super) struct DepthLoad {
    pub(super) yard: Farmyard,
}

#[async_trait]
impl Workload for DepthLoad {
    async fn iteration(&self, vu: &mut Vu, _due: Instant) {
        let farm = random(vu, &self.yard.farms);
        let q = format!(
            "{{ getById(id: \"{}\") {{ name coops {{ name capacity }} }} }}",
            farm.id
        );
        let d = vu.session.graphql("depth_2", "/farm/graph", &q).await;
        vu.session.check("depth_2", present(&d, "getById.coops"));
        let d = vu
            .session
            .graphql("depth_3", "/farm/graph", &depth3(&farm.id))
            .await;
        vu.session
            .check("depth_3", present(&d, "getById.coops.0.hens"));
        let q = format!(
            "{{ getById(id: \"{}\") {{ name coops {{ name hens {{ name breed }} }} farmOutput {{ eggs_week total_hens }} }} }}",
            farm.id
        );
        let d = vu
            .session
            .graphql("depth_3_parallel", "/farm/graph", &q)
            .await;
        vu.session.check(
            "depth_3_parallel",
            present(&d, "getById.coops.0.hens") && present(&d, "getById.farmOutput"),
        );
        let coop = random(vu, &farm.coops);
        let q = format!(
            "{{ getById(id: \"{}\") {{ name farm {{ name zone }} hens {{ name status }} }} }}",
            coop.id
        );
        let d = vu.session.graphql("cross_entity", "/coop/graph", &q).await;
        vu.session.check(
            "cross_entity",
            present(&d, "getById.farm.name") && present(&d, "getById.hens"),
        );
    }
}

/// The federation-depth gate (after [`seed_projections`] and [`gate_farmyard`]): a farm's
/// farmOutput and a coop's farm and hens resolve. Expects the 3 × 3 × 5 farmyard.
pub(super) async fn gate_depth(s: &mut Session, yard: &Farmyard) -> GateResult<()> {
    let f = &yard.farms[0];
    let q = format!(
        "{{ getById(id: \"{}\") {{ farmOutput {{ total_hens }} }} }}",
        f.id
    );
    let d = gate::query(s, "/farm/graph", &q).await?;
    gate::expect_eq(
        &d,
        "getById.farmOutput.0.total_hens",
        &json!(15),
        "farmOutput of a seeded farm",
    )?;
    let q = format!(
        "{{ getById(id: \"{}\") {{ farm {{ name }} hens {{ name }} }} }}",
        f.coops[0].id
    );
    let d = gate::query(s, "/coop/graph", &q).await?;
    gate::expect_eq(&d, "getById.farm.name", &json!(f.name), "coop → farm")?;
    ensure(len_at(&d, "getById.hens") == 5, || {
        format!("coop → hens returned {d}")
    })
}

#[async_trait]
impl Scenario for FederationDepth {
    fn name(&self) -> &'static str {
        "federation-depth"
    }
    fn description(&self) -> &'static str {
        "egg-economy relationship depth: farm+coops, +hens, +hens and farmOutput, coop→farm+hens (seed 001)"
    }
    fn example(&self) -> Example {
        Example::EggEconomy
    }
    async fn run(&self, ctx: &mut Ctx) -> GateResult<()> {
        let mut s = ctx.session();
        let yard = seed_farmyard(&mut s, 3, 3, 5).await?;
        seed_projections(&mut s, &yard).await?;
        gate_farmyard(&mut s, &yard).await?;
        gate_depth(&mut s, &yard).await?;
        let model = ctx.profile(ClosedModel::smoke());
        let label = model.name.clone();
        ctx.closed(&label, Arc::new(DepthLoad { yard }), &model)
            .await;
        Ok(())
    }
}

// ------------------------------------------------------------------------------------------
// mixed-workload
// ------------------------------------------------------------------------------------------

pub struct MixedWorkload;

pub(super) struct MixedLoad {
    /// (farm id, coop id, hen id)
    hens: Vec<(String, String, String)>,
}

impl MixedLoad {
    pub(super) fn new(yard: &Farmyard) -> Self {
        Self {
            hens: yard
                .hens()
                .map(|(f, c, h)| (f.id.clone(), c.id.clone(), h.clone()))
                .collect(),
        }
    }
}

#[async_trait]
impl Workload for MixedLoad {
    async fn iteration(&self, vu: &mut Vu, _due: Instant) {
        let (farm, coop, hen) = random(vu, &self.hens).clone();
        let body = Bytes::from(
            json!({"hen_id": hen, "coop_id": coop, "farm_id": farm, "eggs": vu.rng.u32(0..4),
                   "timestamp": "2026-11-22T06:00:00Z", "quality": "grade_a"})
            .to_string(),
        );
        let r = vu
            .session
            .call("event_write", Method::POST, "/lay_report/api", Some(body))
            .await;
        vu.session
            .check("event_write", r.is_some_and(|r| r.status.is_success()));
        let q = format!("{{ getByFarm(id: \"{farm}\") {{ eggs_week total_hens }} }}");
        let d = vu
            .session
            .graphql("farm_output_read", "/farm_output/graph", &q)
            .await;
        vu.session
            .check("farm_output_read", present(&d, "getByFarm"));
        let q = format!("{{ getByHen(id: \"{hen}\") {{ eggs_week total_eggs }} }}");
        let d = vu
            .session
            .graphql("hen_productivity_read", "/hen_productivity/graph", &q)
            .await;
        vu.session
            .check("hen_productivity_read", present(&d, "getByHen"));
        let q = format!("{{ getById(id: \"{hen}\") {{ name productivity {{ eggs_week }} }} }}");
        let d = vu
            .session
            .graphql("hen_with_productivity", "/hen/graph", &q)
            .await;
        vu.session
            .check("hen_with_productivity", present(&d, "getById.productivity"));
    }
}

/// The mixed-workload gate (after [`seed_projections`] and [`gate_farmyard`]): a lay report
/// is accepted and the live projections take it in, read back through their GraphQL queries.
pub(super) async fn gate_mixed(
    s: &mut Session,
    yard: &Farmyard,
    projections: Projections,
) -> GateResult<()> {
    // written through REST, they stay as seeded; computed, they take the report in
    let more = match projections {
        Projections::Live => 1,
        Projections::Seeded => 0,
    };
    let (f, c, h) = yard.hens().next().expect("seeded hens");
    gate::create(
        s,
        "/lay_report/api",
        &json!({"hen_id": h, "coop_id": c.id, "farm_id": f.id, "eggs": 1, "timestamp": SEED_TIME}),
    )
    .await?;
    // the live projections take the new report in: 6 + 1 for the hen, 15 × 6 + 1 for the farm
    eventually(
        s,
        "/hen_productivity/graph",
        &format!("{{ getByHen(id: \"{h}\") {{ eggs_week }} }}"),
        "getByHen.0.eggs_week",
        &json!(6 + more),
        "hen_productivity of a seeded hen after one more report",
    )
    .await?;
    let hens: usize = f.coops.iter().map(|c| c.hens.len()).sum();
    eventually(
        s,
        "/farm_output/graph",
        &format!("{{ getByFarm(id: \"{}\") {{ eggs_week }} }}", f.id),
        "getByFarm.0.eggs_week",
        &json!(hens * 6 + more),
        "farm_output of a seeded farm after one more report",
    )
    .await
}

#[async_trait]
impl Scenario for MixedWorkload {
    fn name(&self) -> &'static str {
        "mixed-workload"
    }
    fn description(&self) -> &'static str {
        "egg-economy mixed: lay-report event writes with projection reads (seed 001)"
    }
    fn example(&self) -> Example {
        Example::EggEconomy
    }
    async fn run(&self, ctx: &mut Ctx) -> GateResult<()> {
        let mut s = ctx.session();
        let yard = seed_farmyard(&mut s, 3, 3, 5).await?;
        let projections = seed_projections(&mut s, &yard).await?;
        gate_farmyard(&mut s, &yard).await?;
        gate_mixed(&mut s, &yard, projections).await?;
        let model = ctx.profile(ClosedModel::smoke());
        let label = model.name.clone();
        ctx.closed(&label, Arc::new(MixedLoad::new(&yard)), &model)
            .await;
        Ok(())
    }
}
