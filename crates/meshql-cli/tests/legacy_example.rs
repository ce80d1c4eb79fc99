//! `examples/legacy` (Springfield Electric, CONTRACT §14.2) through the binary, against the
//! real PostgreSQL `scripts/services/postgres.sh` starts (`wal_level = logical`): the example's
//! `init.sql` is loaded into a fresh database, the example is served as it is (only
//! `LEGACY_URL` and `LEGACY_SLOT_SUFFIX` set), and the clean entities are checked against the
//! feature's 14 scenarios (§14.2.6) with values worked out by hand from the seed and §14.2.3.
//! Then live changes through SQL: an update is a new version of the same document, a child
//! that arrives before its parent resolves once the parent does, a delete tombstones, and an
//! unknown code is a dead letter. The four replication slots are dropped at the end.

mod common;

use common::{gql, len, psql, until_gql as until, Server, SlotsDropped};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

fn example_dir() -> PathBuf {
    common::examples_dir().join("legacy")
}

/// The example's legacy database, loaded from its `init.sql`; the processors' slots (named
/// with this run's suffix) are dropped when the test ends, whatever its outcome.
struct Legacy {
    url: String,
    slots: SlotsDropped,
}

impl Legacy {
    fn new() -> Legacy {
        Legacy {
            url: common::postgres_database_from(&example_dir().join("legacy-db/init.sql")),
            slots: SlotsDropped::new(),
        }
    }
}

fn strings<'a>(list: &'a Value, field: &str) -> Vec<&'a str> {
    list.as_array()
        .unwrap()
        .iter()
        .filter_map(|x| x[field].as_str())
        .collect()
}

fn floats(list: &Value, field: &str) -> Vec<f64> {
    list.as_array()
        .unwrap()
        .iter()
        .filter_map(|x| x[field].as_f64())
        .collect()
}

fn near(xs: &[f64], want: f64) -> bool {
    xs.iter().any(|x| (x - want).abs() < 0.01)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

const CUSTOMER: &str = "/customer/graph";
const READING: &str = "/meter_reading/graph";
const BILL: &str = "/bill/graph";
const PAYMENT: &str = "/payment/graph";

const CUSTOMER_FIELDS: &str = "id legacy_acct_id account_number first_name last_name address \
     city state zip phone email rate_class service_type status connected_date \
     disconnected_date budget_billing paperless";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn springfield_electric_is_served_clean_from_the_legacy_database() {
    let legacy = Legacy::new();
    let s = Server::start_with_env(
        &example_dir().join("meshql.toml"),
        &legacy.slots.env(&legacy.url),
        None,
    );

    // Background: the snapshot of every table arrives
    until(&s, CUSTOMER, "{ getAll { id } }", |d| {
        len(&d["getAll"]) == 4
    })
    .await;
    until(&s, READING, "{ getAll { id } }", |d| {
        len(&d["getAll"]) == 14
    })
    .await;
    until(&s, BILL, "{ getAll { id } }", |d| len(&d["getAll"]) == 10).await;
    until(&s, PAYMENT, "{ getAll { id } }", |d| len(&d["getAll"]) == 5).await;

    // every customer, exactly (absent optional fields read as null)
    let all = gql(
        &s,
        CUSTOMER,
        &format!("{{ getAll {{ {CUSTOMER_FIELDS} }} }}"),
    )
    .await;
    let customers = all["getAll"].as_array().unwrap();
    let by_num = |num: &str| {
        let mut c = customers
            .iter()
            .find(|c| c["account_number"] == num)
            .unwrap_or_else(|| panic!("no customer {num}: {all}"))
            .clone();
        assert!(c["id"].as_str().is_some_and(|id| !id.is_empty()), "{c}");
        c.as_object_mut().unwrap().remove("id");
        c
    };
    assert_eq!(
        by_num("100100-00001"),
        json!({"legacy_acct_id": 1, "account_number": "100100-00001", "first_name": "Margaret",
               "last_name": "Henderson", "address": "742 Evergreen Terrace", "city": "Springfield",
               "state": "IL", "zip": "62704", "phone": "217-555-0142",
               "email": "mhenderson@email.com", "rate_class": "residential",
               "service_type": "electric", "status": "active", "connected_date": "1998-03-15",
               "disconnected_date": null, "budget_billing": true, "paperless": false})
    );
    assert_eq!(
        by_num("200200-00002"),
        json!({"legacy_acct_id": 2, "account_number": "200200-00002", "first_name": "Kenji",
               "last_name": "Nakamura", "address": "1200 Industrial Pkwy, Suite 300",
               "city": "Springfield", "state": "IL", "zip": "62707", "phone": "217-555-0190",
               "email": "knakamura@nakamura-mfg.com", "rate_class": "commercial",
               "service_type": "both", "status": "active", "connected_date": "2005-06-01",
               "disconnected_date": null, "budget_billing": false, "paperless": true})
    );
    assert_eq!(
        by_num("100100-00003"),
        json!({"legacy_acct_id": 3, "account_number": "100100-00003", "first_name": "Siobhan",
               "last_name": "Oconnell", "address": "88 Oak Street", "city": "Springfield",
               "state": "IL", "zip": "62702", "phone": "217-555-0163", "email": null,
               "rate_class": "residential", "service_type": "electric", "status": "suspended",
               "connected_date": "2012-09-10", "disconnected_date": null,
               "budget_billing": false, "paperless": false})
    );
    assert_eq!(
        by_num("300300-00004"),
        json!({"legacy_acct_id": 4, "account_number": "300300-00004", "first_name": "James",
               "last_name": "Whitfield", "address": "5000 River Road", "city": "Springfield",
               "state": "IL", "zip": "62711", "phone": "217-555-0177",
               "email": "jwhitfield@whitfield-steel.com", "rate_class": "industrial",
               "service_type": "electric", "status": "active", "connected_date": "2001-02-20",
               "disconnected_date": null, "budget_billing": false, "paperless": true})
    );

    // 1. customer names are properly cased
    let names = gql(&s, CUSTOMER, "{ getAll { first_name last_name } }").await;
    assert!(strings(&names["getAll"], "first_name").contains(&"Margaret"));
    assert!(strings(&names["getAll"], "last_name").contains(&"Henderson"));
    assert!(!strings(&names["getAll"], "first_name").contains(&"MARGARET"));

    // 2.–5. dates, status codes, rate codes, addresses, by account number
    let one = |num: &str| {
        format!(
            "{{ getByAccountNumber(account_number: \"{num}\") {{ id connected_date status rate_class address service_type }} }}"
        )
    };
    let margaret = gql(&s, CUSTOMER, &one("100100-00001")).await["getByAccountNumber"].clone();
    assert_eq!(margaret["connected_date"], "1998-03-15");
    assert_eq!(margaret["status"], "active");
    assert_eq!(margaret["rate_class"], "residential");
    assert_eq!(margaret["address"], "742 Evergreen Terrace");
    let siobhan = gql(&s, CUSTOMER, &one("100100-00003")).await["getByAccountNumber"].clone();
    assert_eq!(siobhan["status"], "suspended");
    let kenji = gql(&s, CUSTOMER, &one("200200-00002")).await["getByAccountNumber"].clone();
    assert_eq!(kenji["rate_class"], "commercial");
    assert_eq!(kenji["service_type"], "both");
    assert_eq!(kenji["address"], "1200 Industrial Pkwy, Suite 300");
    let james = gql(&s, CUSTOMER, &one("300300-00004")).await["getByAccountNumber"].clone();
    assert_eq!(james["rate_class"], "industrial");
    let margaret_id = margaret["id"].as_str().unwrap().to_owned();
    let james_id = james["id"].as_str().unwrap().to_owned();

    // the other root queries
    let active = gql(
        &s,
        CUSTOMER,
        "{ getByStatus(status: \"active\") { account_number } }",
    )
    .await;
    let mut active = strings(&active["getByStatus"], "account_number");
    active.sort_unstable();
    assert_eq!(active, ["100100-00001", "200200-00002", "300300-00004"]);
    let residential = gql(
        &s,
        CUSTOMER,
        "{ getByRateClass(rate_class: \"residential\") { account_number } }",
    )
    .await;
    let mut residential = strings(&residential["getByRateClass"], "account_number");
    residential.sort_unstable();
    assert_eq!(residential, ["100100-00001", "100100-00003"]);
    let by_id = gql(
        &s,
        CUSTOMER,
        &format!("{{ getById(id: \"{margaret_id}\") {{ first_name }} }}"),
    )
    .await;
    assert_eq!(by_id["getById"]["first_name"], "Margaret");

    // 6. reading types expanded, estimated a boolean
    let readings = gql(
        &s,
        READING,
        "{ getAll { meter_number reading_date reading_value previous_value kwh_used reading_type estimated billed } }",
    )
    .await["getAll"]
        .clone();
    let types = strings(&readings, "reading_type");
    assert!(
        types.contains(&"actual") && types.contains(&"estimated"),
        "{readings}"
    );
    assert!(
        readings
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["estimated"] == json!(true)),
        "{readings}"
    );
    let mut henderson: Vec<_> = readings
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["meter_number"] == "M-10042")
        .map(|r| {
            (
                r["reading_date"].as_str().unwrap().to_owned(),
                r["kwh_used"].as_i64().unwrap(),
                r["reading_type"].as_str().unwrap().to_owned(),
                r["estimated"].as_bool().unwrap(),
                r["billed"].as_bool().unwrap(),
            )
        })
        .collect();
    henderson.sort();
    let row = |d: &str, k: i64, t: &str, e: bool, b: bool| (d.to_owned(), k, t.to_owned(), e, b);
    assert_eq!(
        henderson,
        [
            row("2025-06-01", 950, "actual", false, true),
            row("2025-07-01", 1130, "actual", false, true),
            row("2025-08-01", 1950, "estimated", true, true),
            row("2025-09-01", 870, "actual", false, false),
        ]
    );
    let first = readings
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["meter_number"] == "M-30015" && r["reading_date"] == "2025-06-01")
        .unwrap();
    assert_eq!(first["reading_value"], json!(514000));
    assert_eq!(first["previous_value"], json!(500000));
    assert_eq!(first["kwh_used"], json!(14000));

    // 7. bill amounts in dollars
    let bills = gql(
        &s,
        BILL,
        "{ getAll { legacy_bill_id bill_date due_date period_from period_to total_amount kwh_used status late } }",
    )
    .await["getAll"]
        .clone();
    let amounts = floats(&bills, "total_amount");
    assert!(near(&amounts, 98.40), "{bills}");
    assert!(!near(&amounts, 9840.0), "{bills}");
    let bill = |n: i64| {
        bills
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["legacy_bill_id"] == json!(n))
            .unwrap_or_else(|| panic!("no bill {n}: {bills}"))
            .clone()
    };
    assert_eq!(
        bill(1),
        json!({"legacy_bill_id": 1, "bill_date": "2025-06-15", "due_date": "2025-07-15",
               "period_from": "2025-06-01", "period_to": "2025-06-30", "total_amount": 98.4,
               "kwh_used": 950, "status": "paid", "late": false})
    );
    assert_eq!(bill(3)["status"], "open");
    assert_eq!(bill(3)["total_amount"].as_f64(), Some(202.2));
    assert_eq!(bill(4)["total_amount"].as_f64(), Some(420.0));
    assert_eq!(bill(7)["status"], "delinquent");
    assert_eq!(bill(7)["late"], json!(true));
    assert_eq!(bill(8)["total_amount"].as_f64(), Some(72.5));
    assert_eq!(bill(10)["total_amount"].as_f64(), Some(1062.0));
    assert_eq!(bill(10)["bill_date"], "2025-08-15");

    // 8.–9. payment methods expanded, amounts in dollars
    let payments = gql(
        &s,
        PAYMENT,
        "{ getAll { id payment_date amount method confirmation_number status bill { kwh_used total_amount } } }",
    )
    .await["getAll"]
        .clone();
    let methods = strings(&payments, "method");
    for m in ["web", "electronic", "check"] {
        assert!(methods.contains(&m), "{m}: {payments}");
    }
    let amounts = floats(&payments, "amount");
    assert!(near(&amounts, 98.40), "{payments}");
    assert!(!near(&amounts, 9840.0), "{payments}");
    assert!(strings(&payments, "status").iter().all(|s| *s == "success"));
    let check = payments
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["confirmation_number"] == "CHK-004872")
        .unwrap_or_else(|| panic!("no check payment: {payments}"))
        .clone();
    // the seed's quirk: bill 9's amount and date, for bill 10
    assert_eq!(check["payment_date"], "2025-06-30");
    assert_eq!(check["amount"].as_f64(), Some(980.0));
    assert_eq!(check["method"], "check");
    assert_eq!(check["bill"]["kwh_used"], json!(15300));
    assert_eq!(check["bill"]["total_amount"].as_f64(), Some(1062.0));
    let check_id = check["id"].as_str().unwrap().to_owned();

    // 10.–12. and 14.: a customer with its readings, bills and payments
    let full = gql(
        &s,
        CUSTOMER,
        "{ getByAccountNumber(account_number: \"100100-00001\") { id account_number first_name last_name \
         address connected_date status rate_class \
         meterReadings { id reading_date reading_value previous_value kwh_used reading_type estimated } \
         bills { id bill_date due_date total_amount kwh_used status late } \
         payments { id payment_date amount method confirmation_number status } } }",
    )
    .await["getByAccountNumber"]
        .clone();
    assert_eq!(full["first_name"], "Margaret");
    assert_eq!(full["last_name"], "Henderson");
    assert_eq!(full["address"], "742 Evergreen Terrace");
    assert_eq!(full["connected_date"], "1998-03-15");
    assert_eq!(full["status"], "active");
    assert_eq!(full["rate_class"], "residential");
    assert_eq!(len(&full["meterReadings"]), 4, "{full}");
    let mut kwh: Vec<_> = full["meterReadings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["kwh_used"].as_i64().unwrap())
        .collect();
    kwh.sort_unstable();
    assert_eq!(kwh, [870, 950, 1130, 1950]);
    assert_eq!(len(&full["bills"]), 3, "{full}");
    let bill_status = strings(&full["bills"], "status");
    assert_eq!(
        bill_status.iter().filter(|s| **s == "paid").count(),
        2,
        "{full}"
    );
    assert!(bill_status.contains(&"open"), "{full}");
    let mut totals = floats(&full["bills"], "total_amount");
    totals.sort_by(f64::total_cmp);
    assert_eq!(totals, [98.4, 117.2, 202.2]);
    assert_eq!(len(&full["payments"]), 2, "{full}");
    assert_eq!(strings(&full["payments"], "method"), ["web", "web"]);
    let mut confirmations = strings(&full["payments"], "confirmation_number");
    confirmations.sort_unstable();
    assert_eq!(confirmations, ["WEB-20250702-001", "WEB-20250810-002"]);

    // the other way round: a reading's customer; O'Connell has no payments
    let by_customer = gql(
        &s,
        READING,
        &format!("{{ getByCustomer(id: \"{margaret_id}\") {{ customer {{ id first_name last_name account_number }} }} }}"),
    )
    .await;
    assert_eq!(len(&by_customer["getByCustomer"]), 4);
    assert_eq!(
        by_customer["getByCustomer"][0]["customer"],
        json!({"id": margaret_id, "first_name": "Margaret", "last_name": "Henderson",
               "account_number": "100100-00001"})
    );
    let oconnell = gql(
        &s,
        CUSTOMER,
        "{ getByAccountNumber(account_number: \"100100-00003\") { payments { id } bills { status late } } }",
    )
    .await;
    assert_eq!(oconnell["getByAccountNumber"]["payments"], json!([]));
    assert_eq!(
        oconnell["getByAccountNumber"]["bills"],
        json!([{"status": "delinquent", "late": true}, {"status": "delinquent", "late": true}])
    );

    // 13. a bill with its customer and payments; the first paid bill is Margaret's
    let paid = gql(
        &s,
        BILL,
        "{ getByStatus(status: \"paid\") { id total_amount customer { first_name last_name account_number } \
         payments { id amount method } } }",
    )
    .await["getByStatus"]
        .clone();
    assert_eq!(len(&paid), 5, "{paid}");
    assert_eq!(
        paid[0]["customer"],
        json!({"first_name": "Margaret", "last_name": "Henderson", "account_number": "100100-00001"})
    );
    assert_eq!(paid[0]["total_amount"].as_f64(), Some(98.4));
    assert_eq!(paid[0]["payments"].as_array().unwrap().len(), 1, "{paid}");
    assert_eq!(paid[0]["payments"][0]["method"], "web");
    assert_eq!(paid[0]["payments"][0]["amount"].as_f64(), Some(98.4));

    // live: an update of a legacy row is a new version of the same document
    let before = now_ms();
    tokio::time::sleep(Duration::from_millis(20)).await;
    psql(
        &legacy.url,
        "UPDATE cust_acct SET stat_cd = 'C' WHERE acct_id = 4",
    );
    let q4 = "{ getByAccountNumber(account_number: \"300300-00004\") { id status } }";
    let closed = until(&s, CUSTOMER, q4, |d| {
        d["getByAccountNumber"]["status"] == "closed"
    })
    .await;
    assert_eq!(closed["getByAccountNumber"]["id"], json!(james_id));
    let all = gql(&s, CUSTOMER, "{ getAll { id } }").await;
    assert_eq!(len(&all["getAll"]), 4, "no second document: {all}");
    let then = gql(
        &s,
        CUSTOMER,
        &format!("{{ getById(id: \"{james_id}\", at: {before}) {{ status }} }}"),
    )
    .await;
    assert_eq!(then["getById"]["status"], "active", "{then}");

    // live: a delete tombstones the document
    let rest = format!("/payment/api/{check_id}");
    assert_eq!(s.client().get(&rest).await.status, 200);
    psql(
        &legacy.url,
        "DELETE FROM pymt_hist WHERE conf_num = 'CHK-004872'",
    );
    let left = until(&s, PAYMENT, "{ getAll { id } }", |d| len(&d["getAll"]) == 4).await;
    assert!(
        !left.to_string().contains(&check_id),
        "the deleted payment is still listed: {left}"
    );
    assert_eq!(s.client().get(&rest).await.status, 404);

    // live: a reading whose customer does not exist yet (the legacy FK is not checked for
    // this session), then the customer: the reading's customer resolves once it arrives
    psql(
        &legacy.url,
        "SET session_replication_role = replica; \
         INSERT INTO mtr_rdng (acct_id, mtr_num, rdng_dt, rdng_val, prev_rdng_val, rdng_type) \
         VALUES (5, 'M-50001', '20250901', 1200, 1000, 'C')",
    );
    let orphan_q = "{ getAll { meter_number kwh_used reading_type customer_id customer { first_name account_number } } }";
    let orphan = until(&s, READING, orphan_q, |d| {
        strings(&d["getAll"], "meter_number").contains(&"M-50001")
    })
    .await;
    let reading = |d: &Value| {
        d["getAll"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["meter_number"] == "M-50001")
            .unwrap()
            .clone()
    };
    let early = reading(&orphan);
    assert_eq!(early["kwh_used"], json!(200));
    assert_eq!(early["reading_type"], "customer");
    assert!(
        early["customer_id"].as_str().is_some_and(|c| !c.is_empty()),
        "{early}"
    );
    assert!(early["customer"].is_null(), "{early}");
    psql(
        &legacy.url,
        "INSERT INTO cust_acct (acct_id, acct_num, cust_nm_first, cust_nm_last, addr_ln1, rt_cd, \
         svc_type, stat_cd, conn_dt) VALUES (5, '400400-00005', 'MARY-JO', 'O''NEIL-SMITH', \
         '12 1ST AVE', 'RES', 'G', 'A', '20250815')",
    );
    let resolved = until(&s, READING, orphan_q, |d| !reading(d)["customer"].is_null()).await;
    assert_eq!(
        reading(&resolved)["customer"],
        json!({"first_name": "Mary-Jo", "account_number": "400400-00005"})
    );
    let mary = gql(
        &s,
        CUSTOMER,
        "{ getByAccountNumber(account_number: \"400400-00005\") { id last_name address service_type \
         connected_date budget_billing meterReadings { kwh_used } } }",
    )
    .await["getByAccountNumber"]
        .clone();
    assert_eq!(mary["id"], early["customer_id"]);
    assert_eq!(mary["last_name"], "O'Neil-Smith");
    assert_eq!(mary["address"], "12 1st Ave");
    assert_eq!(mary["service_type"], "gas");
    assert_eq!(mary["connected_date"], "2025-08-15");
    assert_eq!(mary["budget_billing"], json!(false));
    assert_eq!(mary["meterReadings"], json!([{"kwh_used": 200}]));

    // live: an unknown code is a dead letter, and the rows after it still arrive
    psql(
        &legacy.url,
        "INSERT INTO cust_acct (acct_id, acct_num, cust_nm_first, cust_nm_last, rt_cd, svc_type, \
         stat_cd, conn_dt) VALUES (6, '900900-00006', 'BAD', 'CODE', 'XXX', 'E', 'A', '20250901'); \
         INSERT INTO cust_acct (acct_id, acct_num, cust_nm_first, cust_nm_last, rt_cd, svc_type, \
         stat_cd, conn_dt) VALUES (7, '700700-00007', 'NED', 'FLANDERS', 'RES', 'E', 'A', '20250902')",
    );
    let all = until(&s, CUSTOMER, "{ getAll { account_number } }", |d| {
        strings(&d["getAll"], "account_number").contains(&"700700-00007")
    })
    .await;
    assert_eq!(len(&all["getAll"]), 6, "{all}");
    assert!(
        !strings(&all["getAll"], "account_number").contains(&"900900-00006"),
        "{all}"
    );
    let metrics = s.client().get("/metrics").await.text;
    assert!(
        metrics.contains(
            "meshql_processor_dead_letters{processor=\"customers\",type=\"mapping\",output=\"customer\"} 1"
        ),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("dead_letters"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    // the legacy rows were never written by meshql
    assert_eq!(
        psql(
            &legacy.url,
            "SELECT stat_cd FROM cust_acct WHERE acct_id = 4"
        ),
        "C"
    );
    assert_eq!(psql(&legacy.url, "SELECT count(*) FROM cust_acct"), "7");
    drop(s);
}

/// `meshql check` asks the legacy database for the columns the mappings name: a misspelt
/// column (in a field, in a part of `concat`, in a reference's key) is an error naming the
/// file, its line, the field and what the table has; the example as shipped passes.
#[test]
fn check_names_a_mapped_column_the_legacy_table_does_not_have() {
    let legacy = Legacy::new();
    let default_url = "postgres://postgres@127.0.0.1:55432/springfield_electric";
    let dir = common::example_copy("legacy", |t| {
        assert!(t.contains(default_url));
        t.replace(default_url, &legacy.url)
    });
    let check = |dir: &std::path::Path| {
        let out = common::run_meshql(&["check", dir.to_str().unwrap()], Duration::from_secs(60));
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, err) = check(dir.path());
    assert!(ok, "{err}");

    let config = dir.path().join("meshql.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    let line_of = |needle: &str| {
        text.lines()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("{needle}"))
            + 1
    };
    let (reading, address, payment_ref) = (
        line_of("reading_date = { date = \"rdng_dt\" }"),
        line_of("address = { concat"),
        line_of("bill_id = { reference = \"bill_hdr\""),
    );
    let text = text
        .replace("{ date = \"rdng_dt\" }", "{ date = \"rdng_dte\" }")
        .replace("{ title = \"addr_ln2\" }", "{ title = \"addr_ln3\" }")
        .replace(
            "bill_id = { reference = \"bill_hdr\", key = [\"bill_id\"]",
            "bill_id = { reference = \"bill_hdr\", key = [\"bil_id\"]",
        );
    std::fs::write(&config, text).unwrap();
    let (ok, err) = check(dir.path());
    assert!(!ok, "{err}");
    for (line, field, column) in [
        (
            reading,
            "processor[1] \"meter_readings\".mapping.fields.reading_date",
            "rdng_dte",
        ),
        (
            address,
            "processor[0] \"customers\".mapping.fields.address.concat[1]",
            "addr_ln3",
        ),
        (
            payment_ref,
            "processor[3] \"payments\".mapping.fields.bill_id",
            "bil_id",
        ),
    ] {
        let want = format!(":{line}: {field}: table `");
        let hit = err
            .lines()
            .find(|l| l.contains(&want) && l.contains(&format!("has no column `{column}`")))
            .unwrap_or_else(|| panic!("no error {want}…{column} in:\n{err}"));
        assert!(hit.contains("(it has: "), "{hit}");
    }
    assert!(err.contains("3 error(s)"), "{err}");
}
