//! `examples/egg-economy-sap` (CONTRACT §14.3) through the binary, against the real
//! PostgreSQL `scripts/services/postgres.sh` starts: the example's Z-tables and seed are loaded
//! into a fresh database and the example is served as it is (only `LEGACY_URL` and
//! `LEGACY_SLOT_SUFFIX` set). Checked with values worked out by hand from the seed and §14.3's
//! rules: every actor and event arrives cleaned, relationships resolve through GraphQL, the
//! projections are computed from the cleaned events; then live changes through SQL (an
//! update is a new version of the same document, a lay report that arrives before its hen
//! waits for it, a delete takes its contribution out of the projections, an unknown code falls
//! back to its default). A second test holds the API to egg-economy's, field for field.

mod common;

use common::{gql, len, psql, until_gql as until, Server, SlotsDropped};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

fn example_dir() -> PathBuf {
    common::examples_dir().join("egg-economy-sap")
}

/// The example's legacy database, loaded from its `init.sql`; the processors' ten slots
/// (named with this run's suffix) are dropped when the test ends, whatever its outcome.
struct Sap {
    url: String,
    slots: SlotsDropped,
}

impl Sap {
    fn new() -> Sap {
        Sap {
            url: common::postgres_database_from(&example_dir().join("legacy-db/init.sql")),
            slots: SlotsDropped::new(),
        }
    }

    fn serve(&self) -> Server {
        Server::start_with_env(
            &example_dir().join("meshql.toml"),
            &self.slots.env(&self.url),
            None,
        )
    }
}

/// The clean id of a Z-row (the rule of `meshql_process::mapping::legacy_id`, worked out
/// here on its own: a UUIDv5 of `["<table>","<key>",…]` in the mappings' namespace).
fn id_of(table: &str, key: &[&str]) -> String {
    let ns = uuid::Uuid::parse_str("6fa4a995-5b3f-41d4-a4a1-13b2a525552a").unwrap();
    let mut name = vec![table.to_owned()];
    name.extend(key.iter().map(|k| (*k).to_owned()));
    uuid::Uuid::new_v5(&ns, serde_json::to_string(&name).unwrap().as_bytes()).to_string()
}

fn farm(werks: &str) -> String {
    id_of("zfarm_mstr", &["100", werks])
}
fn coop(nr: &str) -> String {
    id_of("zstall_mstr", &["100", nr])
}
fn hen(nr: &str) -> String {
    id_of("zequi_hen", &["100", nr])
}
fn container(nr: &str) -> String {
    id_of("zbehaelt_mstr", &["100", nr])
}

/// The document `id` through REST, without its `id`.
async fn rest(s: &Server, entity: &str, id: &str) -> Value {
    let r = s.client().get(&format!("/{entity}/api/{id}")).await;
    assert_eq!(r.status, 200, "{entity} {id}: {}", r.json());
    let mut doc = r.json();
    doc.as_object_mut().unwrap().remove("id");
    doc
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_z_tables_are_served_as_the_egg_economy() {
    let sap = Sap::new();
    let s = sap.serve();

    // the snapshot of every table arrives
    for (entity, n) in [
        ("farm", 3),
        ("coop", 4),
        ("hen", 7),
        ("container", 4),
        ("consumer", 3),
        ("lay_report", 8),
        ("storage_deposit", 4),
        ("storage_withdrawal", 2),
        ("container_transfer", 2),
        ("consumption_report", 3),
    ] {
        until(&s, &format!("/{entity}/graph"), "{ getAll { id } }", |d| {
            len(&d["getAll"]) == n
        })
        .await;
    }

    // actors, field for field
    assert_eq!(
        rest(&s, "farm", &farm("1000")).await,
        json!({"legacy_werks": "1000", "name": "Sonnenhof Megafarm", "farm_type": "megafarm",
               "zone": "north", "owner": "Heinrich Mueller"})
    );
    assert_eq!(
        rest(&s, "farm", &farm("3000")).await,
        json!({"legacy_werks": "3000", "name": "Berghof Homestead", "farm_type": "homestead",
               "zone": "east"})
    );
    assert_eq!(
        rest(&s, "coop", &coop("ST-0003")).await,
        json!({"legacy_stall_nr": "ST-0003", "name": "Freiland Stall", "farm_id": farm("2000"),
               "capacity": 100, "coop_type": "free_range"})
    );
    assert_eq!(
        rest(&s, "hen", &hen("HEN-000003")).await,
        json!({"legacy_equnr": "HEN-000003", "name": "Elsa", "coop_id": coop("ST-0001"),
               "breed": "leghorn", "dob": "2022-09-10", "status": "retired"})
    );
    assert_eq!(
        rest(&s, "hen", &hen("HEN-000006")).await,
        json!({"legacy_equnr": "HEN-000006", "name": "Klara", "coop_id": coop("ST-0003"),
               "breed": "rhode_island_red", "status": "active"})
    );
    assert_eq!(
        rest(&s, "container", &container("BH-0004")).await,
        json!({"legacy_behaelt_nr": "BH-0004", "name": "Kuehlschrank Ost",
               "container_type": "fridge", "capacity": 50, "zone": "east"})
    );
    assert_eq!(
        rest(&s, "consumer", &id_of("zkunde_vbr", &["100", "KD-0002"])).await,
        json!({"legacy_kunnr": "KD-0002", "name": "Gasthaus zum Adler",
               "consumer_type": "restaurant", "zone": "south", "weekly_demand": 200})
    );

    // events: computed keys, the hen's coop, timestamps (no time → midnight), codes
    assert_eq!(
        rest(
            &s,
            "lay_report",
            &id_of("zafru_lege", &["100", "LR-00000005"])
        )
        .await,
        json!({"legacy_aufnr": "LR-00000005", "hen_id": hen("HEN-000006"),
               "coop_id": coop("ST-0003"), "farm_id": farm("2000"), "eggs": 1,
               "timestamp": "2026-02-01T00:00:00Z", "quality": "cracked"})
    );
    assert_eq!(
        rest(
            &s,
            "lay_report",
            &id_of("zafru_lege", &["100", "LR-00000003"])
        )
        .await,
        json!({"legacy_aufnr": "LR-00000003", "hen_id": hen("HEN-000004"),
               "coop_id": coop("ST-0002"), "farm_id": farm("1000"), "eggs": 2,
               "timestamp": "2026-02-01T06:45:00Z", "quality": "double_yolk"})
    );
    assert_eq!(
        rest(
            &s,
            "storage_deposit",
            &id_of("zmseg_101", &["100", "4900000004", "2026"])
        )
        .await,
        json!({"legacy_mblnr": "4900000004", "container_id": container("BH-0003"),
               "source_type": "transfer", "source_id": farm("1000"), "eggs": 30,
               "timestamp": "2026-02-02T10:00:00Z"})
    );
    assert_eq!(
        rest(
            &s,
            "storage_withdrawal",
            &id_of("zmseg_201", &["100", "4910000002", "2026"])
        )
        .await,
        json!({"legacy_mblnr": "4910000002", "container_id": container("BH-0002"),
               "reason": "quality_check", "eggs": 4, "timestamp": "2026-02-02T17:00:00Z"})
    );
    assert_eq!(
        rest(
            &s,
            "container_transfer",
            &id_of("zmseg_301", &["100", "4920000002", "2026"])
        )
        .await,
        json!({"legacy_mblnr": "4920000002", "source_container_id": container("BH-0002"),
               "dest_container_id": container("BH-0004"), "eggs": 10,
               "timestamp": "2026-02-02T08:30:00Z", "transport_method": "cart"})
    );
    assert_eq!(
        rest(
            &s,
            "consumption_report",
            &id_of("zmseg_261", &["100", "4930000003", "2026"])
        )
        .await,
        json!({"legacy_mblnr": "4930000003", "consumer_id": id_of("zkunde_vbr", &["100", "KD-0003"]),
               "container_id": container("BH-0004"), "eggs": 15,
               "timestamp": "2026-02-02T12:00:00Z", "purpose": "baking"})
    );

    // the relationships of egg-economy's API, three levels deep
    let tree = gql(
        &s,
        "/farm/graph",
        &format!(
            "{{ getById(id: \"{}\") {{ name coops {{ name hens {{ name status }} }} }} }}",
            farm("1000")
        ),
    )
    .await;
    let mut hens: Vec<String> = tree["getById"]["coops"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["hens"].as_array().unwrap().clone())
        .map(|h| format!("{} {}", h["name"].as_str().unwrap(), h["status"]))
        .collect();
    hens.sort();
    assert_eq!(
        hens,
        [
            "Berta \"active\"",
            "Elsa \"retired\"",
            "Greta \"active\"",
            "Liesel \"active\""
        ],
        "{tree}"
    );
    let reports = gql(
        &s,
        "/lay_report/graph",
        &format!(
            "{{ getByHen(id: \"{}\") {{ eggs timestamp hen {{ name }} }} }}",
            hen("HEN-000005")
        ),
    )
    .await;
    assert_eq!(len(&reports["getByHen"]), 2, "{reports}");
    assert_eq!(reports["getByHen"][0]["hen"]["name"], "Frieda");

    // the projections, from the cleaned events (worked out from the seed by hand)
    let inventory = |nr: &str| {
        format!(
            "{{ getByContainer(id: \"{}\") {{ current_eggs total_deposits total_withdrawals \
             total_transfers_in total_transfers_out total_consumed utilization_pct }} }}",
            container(nr)
        )
    };
    for (nr, want) in [
        (
            "BH-0001",
            json!({"current_eggs": 84, "total_deposits": 120, "total_withdrawals": 6,
                   "total_transfers_in": 0, "total_transfers_out": 30, "total_consumed": 0,
                   "utilization_pct": 0.84}),
        ),
        (
            "BH-0003",
            json!({"current_eggs": 24, "total_deposits": 30, "total_withdrawals": 0,
                   "total_transfers_in": 30, "total_transfers_out": 0, "total_consumed": 36,
                   "utilization_pct": 12.0}),
        ),
        (
            "BH-0004",
            json!({"current_eggs": 7, "total_deposits": 12, "total_withdrawals": 0,
                   "total_transfers_in": 10, "total_transfers_out": 0, "total_consumed": 15,
                   "utilization_pct": 14.0}),
        ),
    ] {
        until(&s, "/container_inventory/graph", &inventory(nr), |d| {
            d["getByContainer"]
                .get(0)
                .is_some_and(|p| without_nulls(p) == without_nulls(&want))
        })
        .await;
    }
    let greta = format!(
        "{{ getByHen(id: \"{}\") {{ total_eggs quality_rate }} }}",
        hen("HEN-000001")
    );
    until(&s, "/hen_productivity/graph", &greta, |d| {
        d["getByHen"]
            .get(0)
            .is_some_and(|p| p["total_eggs"] == 2 && p["quality_rate"].as_f64() == Some(1.0))
    })
    .await;
    let frieda = format!(
        "{{ getByHen(id: \"{}\") {{ total_eggs quality_rate }} }}",
        hen("HEN-000005")
    );
    until(&s, "/hen_productivity/graph", &frieda, |d| {
        d["getByHen"]
            .get(0)
            .is_some_and(|p| p["total_eggs"] == 2 && p["quality_rate"].as_f64() == Some(0.5))
    })
    .await;
    // farm 1000: Greta 1 + 1, Liesel 1, Berta 2 eggs; three hens reported
    let sonnenhof = format!(
        "{{ getByFarm(id: \"{}\") {{ farm_type total_hens eggs_month }} }}",
        farm("1000")
    );
    until(&s, "/farm_output/graph", &sonnenhof, |d| {
        d["getByFarm"].get(0).is_some_and(|p| {
            *p == json!({"farm_type": "megafarm", "total_hens": 3, "eggs_month": 5})
        })
    })
    .await;

    // live: an update of a Z-row is a new version of the same document (the old one stays
    // readable at the moment before)
    let before = now_ms();
    tokio::time::sleep(Duration::from_millis(20)).await;
    psql(
        &sap.url,
        "UPDATE zequi_hen SET henne_nm = 'Greta Zwei', stat_cd = 'R' WHERE equnr = 'HEN-000001'",
    );
    let q = |at: Option<u64>| {
        format!(
            "{{ getById(id: \"{}\"{}) {{ name status }} }}",
            hen("HEN-000001"),
            at.map(|t| format!(", at: {t}")).unwrap_or_default()
        )
    };
    until(&s, "/hen/graph", &q(None), |d| {
        d["getById"] == json!({"name": "Greta Zwei", "status": "retired"})
    })
    .await;
    assert_eq!(
        gql(&s, "/hen/graph", &q(Some(before))).await["getById"],
        json!({"name": "Greta", "status": "active"})
    );
    until(&s, "/hen/graph", "{ getAll { id } }", |d| {
        len(&d["getAll"]) == 7
    })
    .await;

    // a lay report of a hen that does not exist yet waits for it, and takes its coop
    psql(
        &sap.url,
        "INSERT INTO zafru_lege (aufnr, equnr, werks, ei_menge, erfas_dt, erfas_zt, qual_cd) \
         VALUES ('LR-00000009', 'HEN-000008', '3000', 3, '20260203', '070000', 'X')",
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    psql(
        &sap.url,
        "INSERT INTO zequi_hen (equnr, stall_nr, henne_nm, rasse_cd) \
         VALUES ('HEN-000008', 'ST-0004', 'Hanna', 'XYZ')",
    );
    let late = format!(
        "{{ getById(id: \"{}\") {{ coop_id quality hen {{ name breed }} }} }}",
        id_of("zafru_lege", &["100", "LR-00000009"])
    );
    let got = until(&s, "/lay_report/graph", &late, |d| !d["getById"].is_null()).await;
    // unknown codes fall back to §14.3's defaults
    assert_eq!(
        got["getById"],
        json!({"coop_id": coop("ST-0004"), "quality": "grade_a",
               "hen": {"name": "Hanna", "breed": "leghorn"}})
    );

    // a delete tombstones the event and takes it out of the container's inventory
    psql(&sap.url, "DELETE FROM zmseg_201 WHERE mblnr = '4910000001'");
    until(
        &s,
        "/container_inventory/graph",
        &inventory("BH-0001"),
        |d| {
            d["getByContainer"][0]["current_eggs"] == 90
                && d["getByContainer"][0]["total_withdrawals"] == 0
        },
    )
    .await;
    let r = s
        .client()
        .get(&format!(
            "/storage_withdrawal/api/{}",
            id_of("zmseg_201", &["100", "4910000001", "2026"])
        ))
        .await;
    assert_eq!(r.status, 404);

    // nothing became a dead letter
    let metrics = s.client().get("/metrics").await.text;
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("meshql_processor_dead_letters"))
    {
        assert!(line.ends_with(" 0"), "{line}");
    }
}

/// An object without its null fields, every number as a float (`12` and `12.0` are one).
fn without_nulls(v: &Value) -> Value {
    let mut m = v.as_object().unwrap().clone();
    m.retain(|_, x| !x.is_null());
    for x in m.values_mut() {
        if let Some(f) = x.as_f64() {
            *x = json!(f);
        }
    }
    Value::Object(m)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The SAP variant's API is egg-economy's: the same entities, paths, root queries and
/// resolvers (the config's `[[entity]]` blocks are the same text), the same JSON Schemas and
/// SDL, apart from one optional `legacy_*` string per actor and event.
#[test]
fn the_api_is_egg_economys_plus_the_legacy_keys() {
    let eggs = common::examples_dir().join("egg-economy");
    let sap = example_dir();
    let entities = |dir: &PathBuf| {
        let text = std::fs::read_to_string(dir.join("meshql.toml")).unwrap();
        let start = text.find("\n[[entity]]").unwrap();
        let end = text[start..]
            .find("[[processor]]")
            .map_or(text.len(), |e| start + e);
        // the block of each entity, comments aside
        text[start..end]
            .lines()
            .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(entities(&eggs), entities(&sap));
    let legacy = [
        ("farm", "legacy_werks"),
        ("coop", "legacy_stall_nr"),
        ("hen", "legacy_equnr"),
        ("container", "legacy_behaelt_nr"),
        ("consumer", "legacy_kunnr"),
        ("lay_report", "legacy_aufnr"),
        ("storage_deposit", "legacy_mblnr"),
        ("storage_withdrawal", "legacy_mblnr"),
        ("container_transfer", "legacy_mblnr"),
        ("consumption_report", "legacy_mblnr"),
    ];
    let mut seen = 0;
    for file in std::fs::read_dir(eggs.join("schema")).unwrap() {
        let name = file.unwrap().file_name().into_string().unwrap();
        let entity = name.split('.').next().unwrap().to_owned();
        let read = |dir: &PathBuf| -> Value {
            serde_json::from_str(&std::fs::read_to_string(dir.join("schema").join(&name)).unwrap())
                .unwrap()
        };
        let mut theirs = read(&sap);
        let added = legacy.iter().find(|(e, _)| *e == entity).map(|(_, f)| *f);
        if let Some(field) = added {
            let p = theirs["properties"].as_object_mut().unwrap();
            assert_eq!(p.remove(field).unwrap()["type"], "string", "{name}");
            assert!(!theirs["required"]
                .as_array()
                .unwrap()
                .contains(&json!(field)));
        }
        assert_eq!(read(&eggs), theirs, "{name}");
        let sdl = |dir: &PathBuf| {
            std::fs::read_to_string(dir.join("graph").join(format!("{entity}.graphql"))).unwrap()
        };
        let theirs = sdl(&sap);
        let theirs = match added {
            Some(field) => {
                let line = format!("  {field}: String\n");
                assert_eq!(theirs.matches(&line).count(), 1, "{entity}.graphql");
                theirs.replacen(&line, "", 1)
            }
            None => theirs,
        };
        assert_eq!(sdl(&eggs), theirs, "{entity}.graphql");
        seen += 1;
    }
    assert_eq!(seen, 13);
}

/// A `reference` whose key does not have as many values as the referred table's mapping
/// derives its ids from would never match a parent: `meshql check` names it, with its line.
#[test]
fn check_refuses_a_reference_that_could_never_match_its_parent() {
    let declared = "farm_id = { reference = \"zfarm_mstr\", key = [\"mandt\", \"werks\"] }";
    let dir = common::example_copy("egg-economy-sap", |t| {
        assert!(t.contains(declared));
        t.replacen(
            declared,
            "farm_id = { reference = \"zfarm_mstr\", key = [\"werks\"] }",
            1,
        )
    });
    let config = dir.path().join("meshql.toml");
    let line = std::fs::read_to_string(&config)
        .unwrap()
        .lines()
        .position(|l| l.starts_with("farm_id = { reference = \"zfarm_mstr\", key = [\"werks\"]"))
        .unwrap()
        + 1;
    let out = common::run_meshql(
        &["check", config.to_str().unwrap()],
        Duration::from_secs(60),
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains(&format!(
            ":{line}: processor[4] \"coops\".mapping.fields.farm_id.key: 1 key value(s), but the \
             mapping of `zfarm_mstr` derives its ids from 2 (mandt, werks)"
        )),
        "{said}"
    );
}
