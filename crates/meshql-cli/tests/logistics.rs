//! The logistics example (`examples/logistics`, CONTRACT.md §13) through the binary: the
//! config checks clean; warehouses, shipments, packages and tracking updates are created and
//! validated through REST; every root query of the four graphlettes answers through GraphQL;
//! every one of the eight relationship fields returns the related documents, nested two
//! levels and more; `at` reads the past through the relationships; deletes leave them.

mod common;

use common::{examples_dir, is_rfc4122_uuid, run_meshql, Client, Server};
use serde_json::{json, Value};
use std::time::Duration;

/// Where the example keeps its documents: as it ships (SQLite), or on Kafka topics of the
/// test's own (the same example, its storage block swapped).
#[derive(Clone, Copy)]
enum On {
    Sqlite,
    Kafka,
}

fn start(on: On) -> (Option<tempfile::TempDir>, Server) {
    match on {
        On::Sqlite => (None, Server::start(&examples_dir().join("logistics"), &[])),
        On::Kafka => {
            let brokers = meshql_conformance::test_server_url("kafka", "MESHQL_TEST_KAFKA_BROKERS");
            let run = uuid::Uuid::new_v4().simple().to_string();
            let dir = common::example_copy("logistics", |text| {
                let swapped = text.replace(
                    "type = \"sqlite\"\nfile = \"logistics.db\"",
                    &format!(
                        "type = \"kafka\"\nbrokers = \"{brokers}\"\ntopic = \"l{}-{{entity}}\"",
                        &run[..12]
                    ),
                );
                assert_ne!(swapped, text, "the example's storage block changed");
                swapped
            });
            let server = Server::start(&dir.path().join("meshql.toml"), &[]);
            (Some(dir), server)
        }
    }
}

/// Each test, on both storages.
macro_rules! on_both {
    ($($name:ident),* $(,)?) => {
        mod on_sqlite {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                super::$name(super::On::Sqlite).await
            })*
        }
        mod on_kafka {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                super::$name(super::On::Kafka).await
            })*
        }
    };
}

on_both!(
    rest_writes_and_validates_and_graphql_finds_the_ids,
    every_root_query_answers,
    every_resolver_returns_the_related_documents_nested,
    at_reads_the_past_through_the_relationships,
);

/// POST through REST, expecting 201; returns the new id (also checked against `Location`).
async fn create(c: &Client, entity: &str, body: Value) -> String {
    let path = format!("/{entity}/api");
    let r = c.post_json(&path, &body).await;
    r.expect_status(201);
    let stored = r.json();
    let id = stored["id"].as_str().expect("an id").to_owned();
    assert!(is_rfc4122_uuid(&id), "{id}");
    assert_eq!(r.header("location"), Some(format!("{path}/{id}").as_str()));
    for (k, v) in body.as_object().unwrap() {
        assert_eq!(&stored[k], v, "{k} of the stored {entity}");
    }
    id
}

/// A GraphQL query against `/<entity>/graph`, expecting data and no errors.
async fn gql(c: &Client, entity: &str, query: &str) -> Value {
    let r = c
        .post_json(&format!("/{entity}/graph"), &json!({ "query": query }))
        .await;
    r.expect_status(200);
    let body = r.json();
    assert!(body.get("errors").is_none(), "{query}\n→ {body}");
    body["data"].clone()
}

/// The values of `field` in a list of objects, sorted.
fn sorted(list: &Value, field: &str) -> Vec<String> {
    let mut out: Vec<String> = list
        .as_array()
        .unwrap_or_else(|| panic!("expected a list, got {list}"))
        .iter()
        .map(|o| match &o[field] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect();
    out.sort();
    out
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Ids of the seeded documents.
struct Seed {
    denver: String,
    boulder: String,
    austin: String,
    /// Denver → Seattle, UPS, in transit (packages laptop and books).
    seattle: String,
    /// Denver → Portland, FedEx, preparing (package headphones).
    portland: String,
    /// Austin → Miami, UPS, delivered (package boots).
    miami: String,
    laptop: String,
    books: String,
    headphones: String,
    boots: String,
    /// The laptop's three updates, in time order.
    laptop_updates: [String; 3],
    boots_delivered: String,
}

/// Three warehouses, three shipments, four packages and four tracking updates, all through
/// REST.
async fn seed(c: &Client) -> Seed {
    let warehouse = |name: &str, city: &str, state: &str, zip: &str| json!({"name": name, "address": format!("1 {name} Way"), "city": city, "state": state, "zip": zip});
    let mut w = warehouse("Denver Central", "Denver", "CO", "80202");
    w["capacity"] = json!(50000);
    let denver = create(c, "warehouse", w).await;
    let boulder = create(
        c,
        "warehouse",
        warehouse("Boulder North", "Boulder", "CO", "80301"),
    )
    .await;
    let austin = create(
        c,
        "warehouse",
        warehouse("Austin South", "Austin", "TX", "78701"),
    )
    .await;

    let seattle = create(c, "shipment", json!({"destination": "Seattle, WA", "carrier": "UPS", "status": "in_transit", "estimated_delivery": "2026-12-01", "warehouse_id": denver})).await;
    let portland = create(c, "shipment", json!({"destination": "Portland, OR", "carrier": "FedEx", "status": "preparing", "warehouse_id": denver})).await;
    let miami = create(c, "shipment", json!({"destination": "Miami, FL", "carrier": "UPS", "status": "delivered", "estimated_delivery": "2026-11-22", "warehouse_id": austin})).await;

    let package = |tn: &str, what: &str, weight: f64, to: &str, w: &str, s: &str| {
        json!({"tracking_number": tn, "description": what, "weight": weight, "recipient": to,
               "recipient_address": format!("{to}'s door"), "warehouse_id": w, "shipment_id": s})
    };
    let laptop = create(
        c,
        "package",
        package("1Z-0001", "Laptop", 2.4, "Jane Smith", &denver, &seattle),
    )
    .await;
    let books = create(
        c,
        "package",
        package("1Z-0002", "Books", 5.5, "John Smithson", &denver, &seattle),
    )
    .await;
    let headphones = create(
        c,
        "package",
        package(
            "FX-0003",
            "Headphones",
            0.8,
            "Alice Jones",
            &denver,
            &portland,
        ),
    )
    .await;
    let boots = create(
        c,
        "package",
        package("1Z-0004", "Boots", 3.1, "Bob Brown", &austin, &miami),
    )
    .await;

    let update = |status: &str, location: &str, ts: &str, package: &str| json!({"status": status, "location": location, "timestamp": ts, "package_id": package});
    let u1 = create(
        c,
        "tracking_update",
        update(
            "label_created",
            "Denver, CO",
            "2026-11-20T08:00:00Z",
            &laptop,
        ),
    )
    .await;
    let mut picked = update("picked_up", "Denver, CO", "2026-11-20T12:30:00Z", &laptop);
    picked["notes"] = json!("driver 7");
    let u2 = create(c, "tracking_update", picked).await;
    let u3 = create(
        c,
        "tracking_update",
        update(
            "in_transit",
            "Salt Lake City, UT",
            "2026-11-21T09:15:00Z",
            &laptop,
        ),
    )
    .await;
    let mut delivered = update("delivered", "Miami, FL", "2026-11-22T16:00:00Z", &boots);
    delivered["notes"] = json!("left at the front door");
    let boots_delivered = create(c, "tracking_update", delivered).await;

    Seed {
        denver,
        boulder,
        austin,
        seattle,
        portland,
        miami,
        laptop,
        books,
        headphones,
        boots,
        laptop_updates: [u1, u2, u3],
        boots_delivered,
    }
}

#[test]
fn the_logistics_example_checks_clean() {
    let dir = examples_dir().join("logistics");
    let out = run_meshql(
        &["check", dir.to_str().expect("UTF-8 path")],
        Duration::from_secs(30),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stderr: {stderr}");
    assert!(
        stdout.contains("4 entities, 8 resolvers, port 3044"),
        "{stdout}"
    );
    assert!(stderr.trim().is_empty(), "warnings: {stderr}");
}

/// The reference's suite polls `/ready`, creates through REST and finds ids through GraphQL
/// (MeshQL's Java POST answers the payload without an id); that flow works unchanged, and
/// REST reads, updates and validation answer as the contract says.
async fn rest_writes_and_validates_and_graphql_finds_the_ids(on: On) {
    let (_dir, server) = start(on);
    let c = server.client();
    c.get("/ready").await.expect_status(200);
    let s = seed(&c).await;

    // ids discovered through GraphQL, as the reference's scenarios do
    let found = gql(
        &c,
        "warehouse",
        r#"{ getByCity(city: "Denver") { id name } }"#,
    )
    .await;
    assert_eq!(
        found["getByCity"],
        json!([{"id": s.denver, "name": "Denver Central"}])
    );
    let found = gql(
        &c,
        "package",
        r#"{ getByTrackingNumber(tracking_number: "FX-0003") { id } }"#,
    )
    .await;
    assert_eq!(found["getByTrackingNumber"]["id"], json!(s.headphones));

    // REST reads
    let w = c.get(&format!("/warehouse/api/{}", s.denver)).await;
    w.expect_status(200);
    assert_eq!(
        w.json(),
        json!({"name": "Denver Central", "address": "1 Denver Central Way", "city": "Denver",
               "state": "CO", "zip": "80202", "capacity": 50000, "id": s.denver})
    );
    assert_eq!(
        sorted(
            &Value::Array(c.list("/package/api").await),
            "tracking_number"
        ),
        ["1Z-0001", "1Z-0002", "1Z-0004", "FX-0003"]
    );
    assert_eq!(c.list("/tracking_update/api").await.len(), 4);
    let p = c.get(&format!("/package/api/{}", s.boots)).await.json();
    assert_eq!(p["weight"], json!(3.1));
    assert_eq!(p["shipment_id"], json!(s.miami));

    // a full-replacement update
    let r = c
        .put_json(
            &format!("/shipment/api/{}", s.portland),
            &json!({"destination": "Portland, OR", "carrier": "FedEx", "status": "delayed",
                    "estimated_delivery": "2026-12-03", "warehouse_id": s.denver}),
        )
        .await;
    r.expect_status(200);
    assert_eq!(r.json()["status"], "delayed");
    let got = c.get(&format!("/shipment/api/{}", s.portland)).await.json();
    assert_eq!(got["estimated_delivery"], "2026-12-03");

    // the schemas: enums, formats, types, required fields, no unknown fields
    let bad = [
        (
            "shipment",
            json!({"destination": "x", "carrier": "Pigeon", "status": "preparing", "warehouse_id": s.denver}),
            "carrier",
        ),
        (
            "shipment",
            json!({"destination": "x", "carrier": "DHL", "status": "lost", "warehouse_id": s.denver}),
            "status",
        ),
        (
            "shipment",
            json!({"destination": "x", "carrier": "DHL", "status": "preparing", "estimated_delivery": "next week", "warehouse_id": s.denver}),
            "estimated_delivery",
        ),
        (
            "shipment",
            json!({"destination": "x", "carrier": "DHL", "status": "preparing", "warehouse_id": "not-a-uuid"}),
            "warehouse_id",
        ),
        (
            "warehouse",
            json!({"name": "x", "address": "y", "city": "z", "state": "CO"}),
            "zip",
        ),
        (
            "warehouse",
            json!({"name": "x", "address": "y", "city": "z", "state": "CO", "zip": "1", "capacity": 1.5}),
            "capacity",
        ),
        (
            "package",
            json!({"tracking_number": "t", "description": "d", "weight": "heavy", "recipient": "r", "recipient_address": "a", "warehouse_id": s.denver, "shipment_id": s.seattle}),
            "weight",
        ),
        (
            "package",
            json!({"tracking_number": "t", "description": "d", "weight": 1, "recipient": "r", "recipient_address": "a", "warehouse_id": s.denver}),
            "shipment_id",
        ),
        (
            "tracking_update",
            json!({"status": "teleported", "location": "l", "timestamp": "2026-11-20T08:00:00Z", "package_id": s.laptop}),
            "status",
        ),
        (
            "tracking_update",
            json!({"status": "picked_up", "location": "l", "timestamp": "yesterday", "package_id": s.laptop}),
            "timestamp",
        ),
        (
            "tracking_update",
            json!({"status": "picked_up", "location": "l", "timestamp": "2026-11-20T08:00:00Z", "package_id": s.laptop, "signed_by": "me"}),
            "signed_by",
        ),
    ];
    for (entity, body, field) in bad {
        let r = c.post_json(&format!("/{entity}/api"), &body).await;
        r.expect_status(400);
        assert_eq!(r.json()["error"], "Invalid payload", "{entity} {body}");
        assert!(
            r.text.contains(field),
            "{entity}: {field} not named in {}",
            r.text
        );
    }
    // nothing invalid was stored
    assert_eq!(c.list("/shipment/api").await.len(), 3);
    assert_eq!(c.list("/warehouse/api").await.len(), 3);
}

/// Every root query of §13, with its arguments, through GraphQL.
async fn every_root_query_answers(on: On) {
    let (_dir, server) = start(on);
    let c = server.client();
    let s = seed(&c).await;

    // warehouse: getById, getAll, getByCity, getByState
    let d = gql(
        &c,
        "warehouse",
        &format!(
            r#"{{ getById(id: "{}") {{ id name address city state zip capacity }} }}"#,
            s.denver
        ),
    )
    .await;
    assert_eq!(
        d["getById"],
        json!({"id": s.denver, "name": "Denver Central", "address": "1 Denver Central Way",
               "city": "Denver", "state": "CO", "zip": "80202", "capacity": 50000})
    );
    let d = gql(
        &c,
        "warehouse",
        r#"{ all: getAll { name capacity } co: getByState(state: "CO") { id } tx: getByState(state: "TX") { name }
             boulder: getByCity(city: "Boulder") { id city } none: getByCity(city: "Nowhere") { id } }"#,
    )
    .await;
    assert_eq!(
        sorted(&d["all"], "name"),
        ["Austin South", "Boulder North", "Denver Central"]
    );
    let mut co = vec![s.denver.clone(), s.boulder.clone()];
    co.sort();
    assert_eq!(sorted(&d["co"], "id"), co);
    assert_eq!(d["tx"], json!([{"name": "Austin South"}]));
    assert_eq!(d["boulder"], json!([{"id": s.boulder, "city": "Boulder"}]));
    assert_eq!(d["none"], json!([]));

    // shipment: getById, getAll, getByWarehouse, getByStatus, getByCarrier
    let d = gql(
        &c,
        "shipment",
        &format!(
            r#"{{ one: getById(id: "{seattle}") {{ destination carrier status estimated_delivery warehouse_id }}
                 all: getAll {{ destination }}
                 denver: getByWarehouse(id: "{denver}") {{ destination }}
                 boulder: getByWarehouse(id: "{boulder}") {{ destination }}
                 delivered: getByStatus(status: "delivered") {{ id destination }}
                 ups: getByCarrier(carrier: "UPS") {{ destination }}
                 dhl: getByCarrier(carrier: "DHL") {{ destination }} }}"#,
            seattle = s.seattle,
            denver = s.denver,
            boulder = s.boulder
        ),
    )
    .await;
    assert_eq!(
        d["one"],
        json!({"destination": "Seattle, WA", "carrier": "UPS", "status": "in_transit",
               "estimated_delivery": "2026-12-01", "warehouse_id": s.denver})
    );
    assert_eq!(
        sorted(&d["all"], "destination"),
        ["Miami, FL", "Portland, OR", "Seattle, WA"]
    );
    assert_eq!(
        sorted(&d["denver"], "destination"),
        ["Portland, OR", "Seattle, WA"]
    );
    assert_eq!(d["boulder"], json!([]));
    assert_eq!(
        d["delivered"],
        json!([{"id": s.miami, "destination": "Miami, FL"}])
    );
    assert_eq!(
        sorted(&d["ups"], "destination"),
        ["Miami, FL", "Seattle, WA"]
    );
    assert_eq!(d["dhl"], json!([]));

    // package: getById, getByTrackingNumber, getAll, getByWarehouse, getByShipment,
    // getByRecipient (MeshQL's `$regex` with `$options: "i"`)
    let d = gql(
        &c,
        "package",
        &format!(
            r#"{{ one: getById(id: "{books}") {{ tracking_number description weight recipient recipient_address warehouse_id shipment_id }}
                 byNumber: getByTrackingNumber(tracking_number: "1Z-0004") {{ id description }}
                 noNumber: getByTrackingNumber(tracking_number: "1Z-9999") {{ id }}
                 all: getAll {{ tracking_number }}
                 denver: getByWarehouse(id: "{denver}") {{ tracking_number }}
                 seattle: getByShipment(id: "{seattle}") {{ tracking_number }}
                 smith: getByRecipient(recipient: "smith") {{ recipient }}
                 jones: getByRecipient(recipient: "JONES") {{ id }}
                 middle: getByRecipient(recipient: "n smi") {{ recipient }}
                 nobody: getByRecipient(recipient: "zed") {{ id }}
                 anchored: getByRecipient(recipient: "^jane") {{ recipient }}
                 either: getByRecipient(recipient: "smith$|JONES") {{ recipient }}
                 dotted: getByRecipient(recipient: "sm.th") {{ recipient }} }}"#,
            books = s.books,
            denver = s.denver,
            seattle = s.seattle
        ),
    )
    .await;
    assert_eq!(
        d["one"],
        json!({"tracking_number": "1Z-0002", "description": "Books", "weight": 5.5,
               "recipient": "John Smithson", "recipient_address": "John Smithson's door",
               "warehouse_id": s.denver, "shipment_id": s.seattle})
    );
    assert_eq!(
        d["byNumber"],
        json!({"id": s.boots, "description": "Boots"})
    );
    assert_eq!(d["noNumber"], Value::Null);
    assert_eq!(
        sorted(&d["all"], "tracking_number"),
        ["1Z-0001", "1Z-0002", "1Z-0004", "FX-0003"]
    );
    assert_eq!(
        sorted(&d["denver"], "tracking_number"),
        ["1Z-0001", "1Z-0002", "FX-0003"]
    );
    assert_eq!(
        sorted(&d["seattle"], "tracking_number"),
        ["1Z-0001", "1Z-0002"]
    );
    assert_eq!(
        sorted(&d["smith"], "recipient"),
        ["Jane Smith", "John Smithson"]
    );
    assert_eq!(d["jones"], json!([{"id": s.headphones}]));
    assert_eq!(d["middle"], json!([{"recipient": "John Smithson"}]));
    assert_eq!(d["nobody"], json!([]));
    assert_eq!(d["anchored"], json!([{"recipient": "Jane Smith"}]));
    assert_eq!(
        sorted(&d["either"], "recipient"),
        ["Alice Jones", "Jane Smith"]
    );
    assert_eq!(
        sorted(&d["dotted"], "recipient"),
        ["Jane Smith", "John Smithson"]
    );
    // a pattern outside the portable subset is refused, not run
    let r = c
        .post_json(
            "/package/graph",
            &json!({"query": r#"{ getByRecipient(recipient: "(?i)smith") { id } }"#}),
        )
        .await;
    let body = r.json();
    assert!(
        body["errors"][0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("not portable")),
        "{body}"
    );

    // tracking_update: getById, getAll, getByPackage
    let d = gql(
        &c,
        "tracking_update",
        &format!(
            r#"{{ one: getById(id: "{picked}") {{ id status location timestamp notes package_id }}
                 all: getAll {{ status }}
                 laptop: getByPackage(id: "{laptop}") {{ status timestamp }}
                 books: getByPackage(id: "{books}") {{ id }} }}"#,
            picked = s.laptop_updates[1],
            laptop = s.laptop,
            books = s.books
        ),
    )
    .await;
    assert_eq!(
        d["one"],
        json!({"id": s.laptop_updates[1], "status": "picked_up", "location": "Denver, CO",
               "timestamp": "2026-11-20T12:30:00Z", "notes": "driver 7", "package_id": s.laptop})
    );
    assert_eq!(
        sorted(&d["all"], "status"),
        ["delivered", "in_transit", "label_created", "picked_up"]
    );
    assert_eq!(
        sorted(&d["laptop"], "timestamp"),
        [
            "2026-11-20T08:00:00Z",
            "2026-11-20T12:30:00Z",
            "2026-11-21T09:15:00Z"
        ]
    );
    assert_eq!(d["books"], json!([]));

    // `limit` caps a vector
    let d = gql(&c, "package", "{ getAll(limit: 2) { id } }").await;
    assert_eq!(d["getAll"].as_array().unwrap().len(), 2);
}

/// Each of the eight resolvers returns the related documents, and chains go deeper: warehouse
/// → shipments → packages → trackingUpdates → package, warehouse → packages → shipment →
/// warehouse, tracking_update → package → warehouse/shipment → ..., shipment → warehouse →
/// shipments.
async fn every_resolver_returns_the_related_documents_nested(on: On) {
    let (_dir, server) = start(on);
    let c = server.client();
    let s = seed(&c).await;

    // warehouse.shipments → shipment.packages → package.trackingUpdates → tracking_update.package
    let d = gql(
        &c,
        "warehouse",
        &format!(
            r#"{{ getById(id: "{}") {{ name shipments {{ destination packages {{ tracking_number
                 trackingUpdates {{ id status package {{ description }} }} }} }} }} }}"#,
            s.denver
        ),
    )
    .await;
    let w = &d["getById"];
    assert_eq!(w["name"], "Denver Central");
    assert_eq!(
        sorted(&w["shipments"], "destination"),
        ["Portland, OR", "Seattle, WA"]
    );
    for shipment in w["shipments"].as_array().unwrap() {
        match shipment["destination"].as_str().unwrap() {
            "Seattle, WA" => {
                assert_eq!(
                    sorted(&shipment["packages"], "tracking_number"),
                    ["1Z-0001", "1Z-0002"]
                );
                for p in shipment["packages"].as_array().unwrap() {
                    let updates = &p["trackingUpdates"];
                    if p["tracking_number"] == "1Z-0001" {
                        assert_eq!(
                            sorted(updates, "status"),
                            ["in_transit", "label_created", "picked_up"]
                        );
                        let mut ids = s.laptop_updates.to_vec();
                        ids.sort();
                        assert_eq!(sorted(updates, "id"), ids);
                        for u in updates.as_array().unwrap() {
                            assert_eq!(u["package"], json!({"description": "Laptop"}));
                        }
                    } else {
                        assert_eq!(updates, &json!([]), "books have no updates");
                    }
                }
            }
            _ => assert_eq!(
                shipment["packages"],
                json!([{"tracking_number": "FX-0003", "trackingUpdates": []}])
            ),
        }
    }

    // warehouse.packages → package.shipment → shipment.warehouse; an empty warehouse
    let d = gql(
        &c,
        "warehouse",
        &format!(
            r#"{{ austin: getById(id: "{}") {{ packages {{ description shipment {{ destination warehouse {{ city }} }} }} }}
                 boulder: getById(id: "{}") {{ name shipments {{ id }} packages {{ id }} }} }}"#,
            s.austin, s.boulder
        ),
    )
    .await;
    assert_eq!(
        d["austin"]["packages"],
        json!([{"description": "Boots", "shipment": {"destination": "Miami, FL", "warehouse": {"city": "Austin"}}}])
    );
    assert_eq!(
        d["boulder"],
        json!({"name": "Boulder North", "shipments": [], "packages": []})
    );

    // shipment.warehouse → warehouse.shipments; shipment.packages → package.warehouse
    let d = gql(
        &c,
        "shipment",
        &format!(
            r#"{{ getById(id: "{}") {{ destination warehouse {{ name shipments {{ destination }} }}
                 packages {{ recipient warehouse {{ state }} }} }} }}"#,
            s.portland
        ),
    )
    .await;
    let sh = &d["getById"];
    assert_eq!(sh["warehouse"]["name"], "Denver Central");
    assert_eq!(
        sorted(&sh["warehouse"]["shipments"], "destination"),
        ["Portland, OR", "Seattle, WA"]
    );
    assert_eq!(
        sh["packages"],
        json!([{"recipient": "Alice Jones", "warehouse": {"state": "CO"}}])
    );

    // a vector root query with resolvers: every shipment by carrier, each with its warehouse
    let d = gql(
        &c,
        "shipment",
        r#"{ getByCarrier(carrier: "UPS") { destination warehouse { name } packages { description } } }"#,
    )
    .await;
    let mut ups: Vec<Value> = d["getByCarrier"].as_array().unwrap().clone();
    ups.sort_by_key(|v| v["destination"].as_str().unwrap().to_owned());
    assert_eq!(ups[0]["warehouse"], json!({"name": "Austin South"}));
    assert_eq!(ups[0]["packages"], json!([{"description": "Boots"}]));
    assert_eq!(ups[1]["warehouse"], json!({"name": "Denver Central"}));
    assert_eq!(
        sorted(&ups[1]["packages"], "description"),
        ["Books", "Laptop"]
    );

    // package.warehouse, package.shipment, package.trackingUpdates, each two levels deep
    let d = gql(
        &c,
        "package",
        r#"{ getByTrackingNumber(tracking_number: "1Z-0004") { description
             warehouse { name packages { tracking_number } }
             shipment { status packages { recipient } warehouse { zip } }
             trackingUpdates { id status notes package { shipment { carrier } } } } }"#,
    )
    .await;
    assert_eq!(
        d["getByTrackingNumber"],
        json!({
            "description": "Boots",
            "warehouse": {"name": "Austin South", "packages": [{"tracking_number": "1Z-0004"}]},
            "shipment": {"status": "delivered", "packages": [{"recipient": "Bob Brown"}], "warehouse": {"zip": "78701"}},
            "trackingUpdates": [{"id": s.boots_delivered, "status": "delivered", "notes": "left at the front door",
                                 "package": {"shipment": {"carrier": "UPS"}}}]
        })
    );

    // tracking_update.package → package.shipment → shipment.warehouse → warehouse.packages
    let d = gql(
        &c,
        "tracking_update",
        &format!(
            r#"{{ getById(id: "{}") {{ location package {{ recipient shipment {{ destination
                 warehouse {{ name packages {{ tracking_number }} }} }} warehouse {{ city }} }} }} }}"#,
            s.laptop_updates[2]
        ),
    )
    .await;
    let u = &d["getById"];
    assert_eq!(u["location"], "Salt Lake City, UT");
    assert_eq!(u["package"]["recipient"], "Jane Smith");
    assert_eq!(u["package"]["warehouse"], json!({"city": "Denver"}));
    let shipment = &u["package"]["shipment"];
    assert_eq!(shipment["destination"], "Seattle, WA");
    assert_eq!(shipment["warehouse"]["name"], "Denver Central");
    assert_eq!(
        sorted(&shipment["warehouse"]["packages"], "tracking_number"),
        ["1Z-0001", "1Z-0002", "FX-0003"]
    );

    // every update of every package of a warehouse, from the update side: one batched
    // resolution over a list parent
    let d = gql(
        &c,
        "tracking_update",
        "{ getAll { status package { tracking_number warehouse { name } } } }",
    )
    .await;
    let mut pairs: Vec<(String, String, String)> = d["getAll"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| {
            (
                u["status"].as_str().unwrap().to_owned(),
                u["package"]["tracking_number"].as_str().unwrap().to_owned(),
                u["package"]["warehouse"]["name"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            )
        })
        .collect();
    pairs.sort();
    let expect = |a: &str, b: &str, c: &str| (a.to_owned(), b.to_owned(), c.to_owned());
    assert_eq!(
        pairs,
        [
            expect("delivered", "1Z-0004", "Austin South"),
            expect("in_transit", "1Z-0001", "Denver Central"),
            expect("label_created", "1Z-0001", "Denver Central"),
            expect("picked_up", "1Z-0001", "Denver Central"),
        ]
    );
}

/// `at` reads the past, and reaches through the relationships: a shipment's status and a
/// package's updates as they were before later writes, a deleted package as it was before
/// the delete.
async fn at_reads_the_past_through_the_relationships(on: On) {
    let (_dir, server) = start(on);
    let c = server.client();
    let s = seed(&c).await;

    std::thread::sleep(Duration::from_millis(20));
    let before = now_ms();
    std::thread::sleep(Duration::from_millis(20));

    // after `before`: the Seattle shipment goes out for delivery, the laptop gets a new
    // update, the books are taken off the shipment (deleted)
    c.put_json(
        &format!("/shipment/api/{}", s.seattle),
        &json!({"destination": "Seattle, WA", "carrier": "UPS", "status": "out_for_delivery",
                "estimated_delivery": "2026-12-01", "warehouse_id": s.denver}),
    )
    .await
    .expect_status(200);
    create(
        &c,
        "tracking_update",
        json!({"status": "out_for_delivery", "location": "Seattle, WA",
               "timestamp": "2026-11-23T07:00:00Z", "package_id": s.laptop}),
    )
    .await;
    c.delete(&format!("/package/api/{}", s.books))
        .await
        .expect_status(200);

    let query = |at: Option<u64>| {
        let at = at.map(|t| format!(", at: {t}")).unwrap_or_default();
        format!(
            r#"{{ getByTrackingNumber(tracking_number: "1Z-0001"{at}) {{ trackingUpdates {{ status }}
                 shipment {{ status packages {{ tracking_number }} warehouse {{ name }} }} }} }}"#
        )
    };

    let now = gql(&c, "package", &query(None)).await;
    let p = &now["getByTrackingNumber"];
    assert_eq!(p["shipment"]["status"], "out_for_delivery");
    assert_eq!(
        p["shipment"]["packages"],
        json!([{"tracking_number": "1Z-0001"}])
    );
    assert_eq!(
        sorted(&p["trackingUpdates"], "status"),
        [
            "in_transit",
            "label_created",
            "out_for_delivery",
            "picked_up"
        ]
    );

    let then = gql(&c, "package", &query(Some(before))).await;
    let p = &then["getByTrackingNumber"];
    assert_eq!(p["shipment"]["status"], "in_transit");
    assert_eq!(
        sorted(&p["shipment"]["packages"], "tracking_number"),
        ["1Z-0001", "1Z-0002"]
    );
    assert_eq!(
        p["shipment"]["warehouse"],
        json!({"name": "Denver Central"})
    );
    assert_eq!(
        sorted(&p["trackingUpdates"], "status"),
        ["in_transit", "label_created", "picked_up"]
    );

    // the deleted package: gone now, there before; REST agrees
    let q = |at: String| {
        format!(
            r#"{{ getById(id: "{}"{at}) {{ description shipment {{ status }} }} }}"#,
            s.books
        )
    };
    assert_eq!(
        gql(&c, "package", &q(String::new())).await["getById"],
        Value::Null
    );
    assert_eq!(
        gql(&c, "package", &q(format!(", at: {before}"))).await["getById"],
        json!({"description": "Books", "shipment": {"status": "in_transit"}})
    );
    c.get(&format!("/package/api/{}", s.books))
        .await
        .expect_status(404);

    // before anything existed: nothing
    let d = gql(
        &c,
        "warehouse",
        &format!(r#"{{ getAll(at: {}) {{ id }} }}"#, before - 3_600_000),
    )
    .await;
    assert_eq!(d["getAll"], json!([]));
}
