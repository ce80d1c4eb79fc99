//! Projections computed live from the change feed, checked against values the test computes
//! on its own from the inputs that remain: random creates, updates (moving reports between
//! hens, changing eggs, quality and day) and deletes, through a real SQLite store, hub, log and
//! processor; then a restart of the processor that must change nothing.

use meshql_changes::{Hub, HubOptions};
use meshql_core::{Credentials, DynStore, NewDocument, ReadContext, Store, WriteContext};
use meshql_engine::EntityService;
use meshql_log::{Log, LogOptions};
use meshql_process::{configure, start, EntityInfo, ProcessorPlan, Processors, StartOptions};
use meshql_store_sqlite::{SqliteDatabase, SqliteOptions, SqliteStore};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Dates with their ISO week and month, read off a calendar (2026-11-27 is a Friday).
const DATES: [(&str, &str, &str); 8] = [
    ("2026-10-30", "W44", "10"),
    ("2026-11-01", "W44", "11"),
    ("2026-11-02", "W45", "11"),
    ("2026-11-05", "W45", "11"),
    ("2026-11-23", "W48", "11"),
    ("2026-11-27", "W48", "11"),
    ("2026-11-30", "W49", "11"),
    ("2026-12-01", "W49", "12"),
];
const QUALITIES: [Option<&str>; 5] = [
    Some("grade_a"),
    Some("grade_b"),
    Some("cracked"),
    Some("double_yolk"),
    None,
];
const HENS: [&str; 3] = ["hen-a", "hen-b", "hen-c"];
const FARMS: [&str; 2] = ["farm-1", "farm-2"];

/// A small deterministic generator (the test must not depend on a seed crate's stream).
struct Rng(u64);
impl Rng {
    fn next(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

#[derive(Debug, Clone)]
struct Report {
    hen: &'static str,
    farm: &'static str,
    eggs: i64,
    date: usize,
    quality: Option<&'static str>,
    /// When it was last written (for `last`).
    written: u64,
}

fn payload(r: &Report) -> Map<String, Value> {
    let mut m = json!({
        "hen_id": r.hen, "coop_id": "coop", "farm_id": r.farm, "eggs": r.eggs,
        "timestamp": format!("{}T10:00:00Z", DATES[r.date].0),
    })
    .as_object()
    .unwrap()
    .clone();
    if let Some(q) = r.quality {
        m.insert("quality".into(), json!(q));
    }
    m
}

/// What hen_productivity must say for one hen, computed from the reports alone.
fn expected_hen(reports: &[&Report]) -> Value {
    let total: i64 = reports.iter().map(|r| r.eggs).sum();
    let newest = reports.iter().map(|r| r.date).max().unwrap();
    let sum_where = |f: &dyn Fn(&Report) -> bool| -> i64 {
        reports.iter().filter(|r| f(r)).map(|r| r.eggs).sum()
    };
    let today = sum_where(&|r| DATES[r.date].0 == DATES[newest].0);
    let week = sum_where(&|r| DATES[r.date].1 == DATES[newest].1);
    let month = sum_where(&|r| DATES[r.date].2 == DATES[newest].2);
    let good = sum_where(&|r| matches!(r.quality, None | Some("grade_a") | Some("double_yolk")));
    let weeks: BTreeSet<&str> = reports.iter().map(|r| DATES[r.date].1).collect();
    let last = reports.iter().max_by_key(|r| r.written).unwrap();
    let mut v = json!({
        "hen_id": reports[0].hen,
        "farm_id": last.farm,
        "total_eggs": total,
        "eggs_today": today,
        "eggs_week": week,
        "eggs_month": month,
        "avg_per_week": ((total as f64 / weeks.len() as f64) * 100.0).round() / 100.0,
    });
    if total > 0 {
        v["quality_rate"] = json!(good as f64 / total as f64);
    }
    v
}

fn expected_farm(reports: &[&Report]) -> Value {
    let newest = reports.iter().map(|r| r.date).max().unwrap();
    let in_week: Vec<&&Report> = reports
        .iter()
        .filter(|r| DATES[r.date].1 == DATES[newest].1)
        .collect();
    let sum = |f: &dyn Fn(&Report) -> bool| -> i64 {
        reports.iter().filter(|r| f(r)).map(|r| r.eggs).sum()
    };
    let week: i64 = in_week.iter().map(|r| r.eggs).sum();
    let active: BTreeSet<&str> = in_week.iter().map(|r| r.hen).collect();
    let all: BTreeSet<&str> = reports.iter().map(|r| r.hen).collect();
    json!({
        "farm_id": reports[0].farm,
        "eggs_today": sum(&|r| DATES[r.date].0 == DATES[newest].0),
        "eggs_week": week,
        "eggs_month": sum(&|r| DATES[r.date].2 == DATES[newest].2),
        "total_hens": all.len(),
        "active_hens": active.len(),
        "avg_per_hen_per_week": ((week as f64 / active.len() as f64) * 100.0).round() / 100.0,
        "farm_type": if reports[0].farm == "farm-1" { "homestead" } else { "megafarm" },
    })
}

fn schema(props: &[&str]) -> Option<Vec<String>> {
    Some(props.iter().map(|p| p.to_string()).collect())
}

fn plans() -> Vec<ProcessorPlan> {
    let entities = vec![
        EntityInfo {
            name: "lay_report".into(),
            fields: schema(&[
                "hen_id",
                "coop_id",
                "farm_id",
                "eggs",
                "timestamp",
                "quality",
            ]),
            properties: None,
            required: Vec::new(),
        },
        EntityInfo {
            name: "farm".into(),
            fields: schema(&["name", "farm_type"]),
            properties: None,
            required: Vec::new(),
        },
        EntityInfo {
            name: "hen_productivity".into(),
            fields: schema(&[
                "hen_id",
                "farm_id",
                "eggs_today",
                "eggs_week",
                "eggs_month",
                "total_eggs",
                "avg_per_week",
                "quality_rate",
            ]),
            properties: None,
            required: Vec::new(),
        },
        EntityInfo {
            name: "farm_output".into(),
            fields: schema(&[
                "farm_id",
                "farm_type",
                "eggs_today",
                "eggs_week",
                "eggs_month",
                "active_hens",
                "total_hens",
                "avg_per_hen_per_week",
            ]),
            properties: None,
            required: Vec::new(),
        },
    ];
    let window = |w: &str| json!({ "sum": "eggs", "window": w, "time": "timestamp" });
    let hen = json!({
        "output": "hen_productivity", "key": "hen_id", "batch": 7,
        "from": [{
            "entity": "lay_report", "key": "hen_id", "defaults": { "quality": "grade_a" },
            "fields": {
                "farm_id": { "last": "farm_id" },
                "total_eggs": { "sum": "eggs" },
                "eggs_today": window("day"), "eggs_week": window("week"), "eggs_month": window("month"),
                "quality_rate": { "ratio": "eggs", "where": { "quality": ["grade_a", "double_yolk"] } },
                "_weeks": { "count_distinct": "timestamp", "bucket": "week" },
            }
        }],
        "derive": { "avg_per_week": "round(total_eggs / _weeks, 2)" }
    });
    let farm = json!({
        "output": "farm_output", "key": "farm_id", "batch": 5,
        "from": [{
            "entity": "lay_report", "key": "farm_id",
            "fields": {
                "eggs_today": window("day"), "eggs_week": window("week"), "eggs_month": window("month"),
                "total_hens": { "count_distinct": "hen_id" },
                "active_hens": { "count_distinct": "hen_id", "window": "week", "time": "timestamp" },
            }
        }],
        "lookup": { "farm": { "entity": "farm", "id": "farm_id" } },
        "derive": {
            "farm_type": "farm.farm_type",
            "avg_per_hen_per_week": "round(eggs_week / active_hens, 2)"
        }
    });
    vec![
        configure(
            "hen_productivity",
            "projection",
            &hen,
            &entities,
            std::path::Path::new("."),
        )
        .unwrap(),
        configure(
            "farm_output",
            "projection",
            &farm,
            &entities,
            std::path::Path::new("."),
        )
        .unwrap(),
    ]
}

struct World {
    stores: Vec<(String, DynStore)>,
    services: HashMap<String, Arc<EntityService>>,
    hub: Hub,
}

async fn world(dir: &std::path::Path) -> World {
    let db = SqliteDatabase::open(&dir.join("data.db"), SqliteOptions::default()).unwrap();
    let mut stores = Vec::new();
    let mut services = HashMap::new();
    for name in ["lay_report", "farm", "hen_productivity", "farm_output"] {
        let store = SqliteStore::new(db.clone(), name);
        store.prepare(&[]).await.unwrap();
        let store: DynStore = Arc::new(store);
        services.insert(
            name.to_owned(),
            Arc::new(EntityService::new(
                name,
                store.clone(),
                None,
                vec![],
                Arc::new(meshql_core::NoAuth),
            )),
        );
        stores.push((name.to_owned(), store));
    }
    let log = Log::open(&dir.join("changes"), LogOptions::default()).unwrap();
    let hub = Hub::start(
        log,
        stores.clone(),
        HubOptions {
            poll: Duration::from_millis(20),
            ..HubOptions::default()
        },
    )
    .unwrap();
    World {
        stores,
        services,
        hub,
    }
}

impl World {
    fn store(&self, name: &str) -> &DynStore {
        &self.stores.iter().find(|(n, _)| n == name).unwrap().1
    }

    async fn processors(&self) -> Processors {
        start(
            &plans(),
            &self.services,
            Arc::new(self.hub.log().clone()),
            StartOptions::default(),
        )
        .await
        .unwrap()
    }

    /// Waits until every processor has read past the log's end and the log holds every
    /// input written.
    async fn settle(&self, processors: &Processors, inputs: u64) {
        let started = Instant::now();
        loop {
            let copied: u64 = self
                .hub
                .stats()
                .iter()
                .filter(|s| s.entity == "lay_report")
                .map(|s| s.copied)
                .sum();
            let caught_up = processors.stats().iter().all(|s| s.lag == 0);
            if copied >= inputs && caught_up {
                // a batch's lag reaches 0 once committed; one more round for the hub
                tokio::time::sleep(Duration::from_millis(50)).await;
                if processors.stats().iter().all(|s| s.lag == 0) {
                    return;
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "processors did not catch up: {:?}",
                processors.stats()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn documents(&self, entity: &str, key: &str) -> BTreeMap<String, Value> {
        self.store(entity)
            .list(&ReadContext::LATEST)
            .await
            .unwrap()
            .into_iter()
            .map(|e| {
                let mut v: Value = serde_json::from_str(&e.payload).unwrap();
                v.as_object_mut().unwrap().remove("id");
                (v[key].as_str().unwrap().to_owned(), v)
            })
            .collect()
    }
}

fn close(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            (x.as_f64().unwrap() - y.as_f64().unwrap()).abs() < 1e-9
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| close(v, w)))
        }
        _ => a == b,
    }
}

fn check(
    got: &BTreeMap<String, Value>,
    reports: &HashMap<String, Report>,
    key: fn(&Report) -> &'static str,
    expected: fn(&[&Report]) -> Value,
) {
    let mut by_key: BTreeMap<&str, Vec<&Report>> = BTreeMap::new();
    for r in reports.values() {
        by_key.entry(key(r)).or_default().push(r);
    }
    assert_eq!(
        got.keys().map(String::as_str).collect::<Vec<_>>(),
        by_key.keys().copied().collect::<Vec<_>>(),
        "one document per key that has reports, none for the others"
    );
    for (k, rs) in by_key {
        let want = expected(&rs);
        assert!(
            close(&got[k], &want),
            "{k}:\n got  {}\n want {want}",
            got[k]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn projections_equal_a_recomputation_through_updates_deletes_and_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let w = world(dir.path()).await;
    let farm = w.store("farm");
    for (id, t) in [("farm-1", "homestead"), ("farm-2", "megafarm")] {
        farm.create(
            NewDocument::with_id(
                id,
                json!({"name": id, "farm_type": t})
                    .as_object()
                    .unwrap()
                    .clone(),
            ),
            &WriteContext::SYSTEM,
        )
        .await
        .unwrap();
    }
    let processors = w.processors().await;
    let lay = w.store("lay_report").clone();
    let mut rng = Rng(0x5eed_1234_abcd);
    let mut reports: HashMap<String, Report> = HashMap::new();
    let mut writes = 0u64;
    for round in 0..4 {
        for _ in 0..60 {
            writes += 1;
            let ids: Vec<String> = reports.keys().cloned().collect();
            let pick = rng.next(10);
            if ids.is_empty() || pick < 5 {
                let r = Report {
                    hen: HENS[rng.next(3)],
                    farm: FARMS[rng.next(2)],
                    eggs: rng.next(12) as i64,
                    date: rng.next(DATES.len()),
                    quality: QUALITIES[rng.next(QUALITIES.len())],
                    written: writes,
                };
                let env = lay
                    .create(NewDocument::new(payload(&r)), &WriteContext::SYSTEM)
                    .await
                    .unwrap();
                reports.insert(env.id, r);
            } else if pick < 8 {
                // a correction: any field may change, the hen and the farm too
                let id = &ids[rng.next(ids.len())];
                let mut r = reports[id].clone();
                match rng.next(4) {
                    0 => r.eggs = rng.next(12) as i64,
                    1 => r.hen = HENS[rng.next(3)],
                    2 => r.date = rng.next(DATES.len()),
                    _ => {
                        r.quality = QUALITIES[rng.next(QUALITIES.len())];
                        r.farm = FARMS[rng.next(2)];
                    }
                }
                r.written = writes;
                lay.update(id, NewDocument::new(payload(&r)), &WriteContext::SYSTEM)
                    .await
                    .unwrap()
                    .unwrap();
                reports.insert(id.clone(), r);
            } else {
                let id = ids[rng.next(ids.len())].clone();
                lay.remove(&id, &WriteContext::SYSTEM).await.unwrap();
                reports.remove(&id);
            }
        }
        w.settle(&processors, writes).await;
        let hens = w.documents("hen_productivity", "hen_id").await;
        check(&hens, &reports, |r| r.hen, expected_hen);
        let farms = w.documents("farm_output", "farm_id").await;
        check(&farms, &reports, |r| r.farm, expected_farm);
        assert!(
            processors.stats().iter().all(|s| s.dead_letters == 0),
            "round {round}: {:?}",
            processors.stats()
        );
    }

    // a restart reads its position from the output store and changes nothing
    processors.stop().await;
    let before = w.store("hen_productivity").stats().writes;
    let hen_out = w.store("hen_productivity");
    let position = hen_out.output_position("hen_productivity").await.unwrap();
    assert!(position.unwrap() > 0);
    // the consumer group forgets how far it got: every change is delivered again
    let log = w.hub.log();
    log.commit("processor-hen_productivity", 0).unwrap();
    let again = w.processors().await;
    w.settle(&again, writes).await;
    assert_eq!(
        w.store("hen_productivity").stats().writes,
        before,
        "a replay writes nothing"
    );
    check(
        &w.documents("hen_productivity", "hen_id").await,
        &reports,
        |r| r.hen,
        expected_hen,
    );
    again.stop().await;
    w.hub.stop().await;
}

#[tokio::test]
async fn an_unreadable_input_is_a_dead_letter_and_the_rest_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let w = world(dir.path()).await;
    let processors = w.processors().await;
    let lay = w.store("lay_report").clone();
    let good = Report {
        hen: "hen-a",
        farm: "farm-1",
        eggs: 4,
        date: 5,
        quality: None,
        written: 1,
    };
    lay.create(NewDocument::new(payload(&good)), &WriteContext::SYSTEM)
        .await
        .unwrap();
    let mut bad = payload(&good);
    bad.insert("eggs".into(), json!("four"));
    let poison = lay
        .create(NewDocument::new(bad), &WriteContext::SYSTEM)
        .await
        .unwrap();
    let mut late = payload(&good);
    late.insert("timestamp".into(), json!("last tuesday"));
    lay.create(NewDocument::new(late), &WriteContext::SYSTEM)
        .await
        .unwrap();
    lay.create(NewDocument::new(payload(&good)), &WriteContext::SYSTEM)
        .await
        .unwrap();
    w.settle(&processors, 4).await;
    let hens = w.documents("hen_productivity", "hen_id").await;
    assert_eq!(hens["hen-a"]["total_eggs"], 8, "{hens:?}");
    let out = w.store("hen_productivity");
    let letters = out
        .dead_letters(Some("hen_productivity"), 10)
        .await
        .unwrap();
    assert_eq!(letters.len(), 2, "{letters:?}");
    let reasons: Vec<&str> = letters.iter().map(|(_, l)| l.reason.as_str()).collect();
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("`eggs` is \"four\", not a number")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.contains("not a time")),
        "{reasons:?}"
    );
    let first = letters
        .iter()
        .find(|(_, l)| l.input.contains(&poison.id))
        .unwrap();
    assert_eq!(first.1.entity, "lay_report");
    assert!(first.1.change_id.starts_with("lay_report:"));
    let stats = processors.stats();
    let hp = stats.iter().find(|s| s.name == "hen_productivity").unwrap();
    assert_eq!((hp.dead_letters, hp.processed), (2, 2));
    processors.stop().await;
    w.hub.stop().await;
    let _ = Credentials::Unrestricted;
}

/// Polls `farm_output` until `ok` holds of its documents (30 s at most).
async fn farms_until(
    w: &World,
    what: &str,
    ok: impl Fn(&BTreeMap<String, Value>) -> bool,
) -> BTreeMap<String, Value> {
    let started = Instant::now();
    loop {
        let farms = w.documents("farm_output", "farm_id").await;
        if ok(&farms) {
            return farms;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{what}: {farms:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_related_document_that_arrives_late_or_changes_reaches_the_groups_that_read_it() {
    let dir = tempfile::tempdir().unwrap();
    let w = world(dir.path()).await;
    let processors = w.processors().await;
    let lay = w.store("lay_report").clone();
    let farm = w.store("farm").clone();
    let mut reports = Vec::new();
    for (i, f) in ["farm-1", "farm-2", "farm-1"].into_iter().enumerate() {
        let r = Report {
            hen: HENS[i],
            farm: f,
            eggs: 3,
            date: 5,
            quality: None,
            written: i as u64,
        };
        let env = lay
            .create(NewDocument::new(payload(&r)), &WriteContext::SYSTEM)
            .await
            .unwrap();
        reports.push(env.id);
    }
    w.settle(&processors, 3).await;
    let farms = w.documents("farm_output", "farm_id").await;
    assert_eq!(farms.len(), 2, "{farms:?}");
    assert!(
        farms.values().all(|f| f.get("farm_type").is_none()),
        "no farm yet: {farms:?}"
    );
    let farm_type = |t: &str| {
        json!({"name": "F", "farm_type": t})
            .as_object()
            .unwrap()
            .clone()
    };

    // the farm arrives after its reports: its group is written again
    farm.create(
        NewDocument::with_id("farm-1", farm_type("homestead")),
        &WriteContext::SYSTEM,
    )
    .await
    .unwrap();
    let farms = farms_until(&w, "a late farm", |f| {
        f["farm-1"].get("farm_type") == Some(&json!("homestead"))
    })
    .await;
    assert!(farms["farm-2"].get("farm_type").is_none(), "{farms:?}");
    assert_eq!(farms["farm-1"]["eggs_today"], 6, "aggregates unchanged");

    // an update of the farm, then its delete
    farm.update(
        "farm-1",
        NewDocument::new(farm_type("megafarm")),
        &WriteContext::SYSTEM,
    )
    .await
    .unwrap()
    .unwrap();
    farms_until(&w, "an updated farm", |f| {
        f["farm-1"].get("farm_type") == Some(&json!("megafarm"))
    })
    .await;
    farm.remove("farm-1", &WriteContext::SYSTEM).await.unwrap();
    farms_until(&w, "a deleted farm", |f| {
        f["farm-1"].get("farm_type").is_none()
    })
    .await;

    // a group that no longer exists is not brought back by its farm
    lay.remove(&reports[1], &WriteContext::SYSTEM)
        .await
        .unwrap();
    farms_until(&w, "farm-2's last report deleted", |f| {
        !f.contains_key("farm-2")
    })
    .await;
    let written = w.store("farm_output").stats().writes;
    farm.create(
        NewDocument::with_id("farm-2", farm_type("homestead")),
        &WriteContext::SYSTEM,
    )
    .await
    .unwrap();
    // and a report of farm-2 written after its farm reads it at once
    let r = Report {
        hen: "hen-a",
        farm: "farm-2",
        eggs: 1,
        date: 5,
        quality: None,
        written: 9,
    };
    lay.create(NewDocument::new(payload(&r)), &WriteContext::SYSTEM)
        .await
        .unwrap();
    let farms = farms_until(&w, "farm-2 again", |f| f.contains_key("farm-2")).await;
    assert_eq!(farms["farm-2"]["farm_type"], "homestead", "{farms:?}");
    assert_eq!(
        w.store("farm_output").stats().writes,
        written + 1,
        "the farm alone wrote no document of a deleted group"
    );
    processors.stop().await;
    w.hub.stop().await;
}
