//! `meshql init --from-postgres URL` through the binary, against the real PostgreSQL
//! `scripts/services/postgres.sh` starts: each test loads a schema into a fresh database,
//! generates a config from it, checks the files, runs `meshql check` on them and serves them.
//!
//! - the legacy example's `init.sql`, plain: entities shaped like the tables; a document
//!   POSTed comes back as it was, and a child finds its parent through the resolvers;
//! - the same with `--acl`: the dictionary's names, the guessed transformations with their
//!   review comments, and the legacy rows served clean by change capture (REST and GraphQL);
//! - a schema of this file's own (CHECK lists, an enum type, a composite primary key, a
//!   composite foreign key, uuid/jsonb/timestamptz/numeric/array columns, a table without a
//!   primary key), plain and with `--acl`;
//! - failures: a database that cannot be reached (the password never shown), a directory
//!   that is not empty, unknown tables, a schema without tables, TLS.
//!
//! The `--acl` tests name their replication slots with a suffix of their own
//! (`LEGACY_SLOT_SUFFIX`) and drop them at the end, whatever the outcome.

mod common;

use common::{
    fresh_postgres_database, gql, len, psql, run_meshql, until_gql as until, Server, SlotsDropped,
};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(120);

/// A fresh database with the legacy example's `init.sql` loaded; its URL.
fn legacy_database() -> String {
    let url = fresh_postgres_database();
    let init = common::examples_dir().join("legacy/legacy-db/init.sql");
    let out = Command::new("psql")
        .arg(&url)
        .args(["-q", "-v", "ON_ERROR_STOP=1", "-f"])
        .arg(&init)
        .output()
        .expect("run psql");
    assert!(
        out.status.success(),
        "loading {}: {}",
        init.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    url
}

/// A small schema of this test's own, with rows.
const SHOP: &str = "
CREATE TYPE mood AS ENUM ('happy', 'sad');
CREATE TABLE warehouse (
  wh_cd   VARCHAR(4) PRIMARY KEY,
  wh_nm   VARCHAR(40) NOT NULL,
  region  CHAR(2) NOT NULL CHECK (region IN ('NE', 'SW')),
  opened  DATE
);
CREATE TABLE orders (
  id        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  ord_no    VARCHAR(10) NOT NULL UNIQUE,
  ext_ref   UUID NOT NULL DEFAULT gen_random_uuid(),
  placed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  total     NUMERIC(10,2) NOT NULL,
  attrs     JSONB,
  tags      TEXT[],
  status    TEXT NOT NULL DEFAULT 'new' CHECK (status IN ('new', 'shipped', 'cancelled')),
  priority  SMALLINT CHECK (priority = ANY (ARRAY[1, 2, 3])),
  feeling   mood,
  wh_cd     VARCHAR(4) REFERENCES warehouse (wh_cd)
);
CREATE TABLE order_line (
  order_id BIGINT NOT NULL REFERENCES orders (id),
  line_no  INT NOT NULL,
  item     VARCHAR(40) NOT NULL,
  qty      INT NOT NULL,
  PRIMARY KEY (order_id, line_no)
);
-- the composite foreign key lists its columns in another order than the parent's key
CREATE TABLE shipment_item (
  shp_id      SERIAL PRIMARY KEY,
  line_no     INT NOT NULL,
  order_id    BIGINT NOT NULL,
  shipped_qty INT NOT NULL,
  FOREIGN KEY (line_no, order_id) REFERENCES order_line (line_no, order_id)
);
CREATE TABLE audit_log (
  logged_at TIMESTAMP NOT NULL DEFAULT now(),
  msg       TEXT
);
INSERT INTO warehouse VALUES ('W1', 'NORTH DEPOT', 'NE', '2020-01-15');
INSERT INTO orders (ord_no, total, attrs, tags, status, priority, feeling, wh_cd, placed_at)
  VALUES ('A-100', 12.50, '{\"gift\": true}', '{red,blue}', 'shipped', 2, 'happy', 'W1',
          '2025-06-01 12:00:00+00');
INSERT INTO order_line VALUES (1, 1, 'WIDGET', 3), (1, 2, 'GADGET', 1);
INSERT INTO shipment_item (order_id, line_no, shipped_qty) VALUES (1, 2, 1);
INSERT INTO audit_log (msg) VALUES ('created');
";

fn shop_database() -> String {
    let url = fresh_postgres_database();
    psql(&url, SHOP);
    url
}

/// `meshql init --from-postgres URL --out DIR ARGS…`.
fn init(url: &str, dir: &Path, args: &[&str]) -> Output {
    let mut all = vec![
        "init",
        "--from-postgres",
        url,
        "--out",
        dir.to_str().unwrap(),
    ];
    all.extend_from_slice(args);
    run_meshql(&all, TIMEOUT)
}

/// Like [`init`], failing the test unless it succeeds; its stdout and stderr.
fn init_ok(url: &str, dir: &Path, args: &[&str]) -> (String, String) {
    let out = init(url, dir, args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "meshql init failed:\n{stdout}\n{stderr}"
    );
    (stdout, stderr)
}

/// `meshql check DIR` must pass.
fn check_passes(dir: &Path) {
    let out = run_meshql(&["check", dir.to_str().unwrap()], TIMEOUT);
    assert!(
        out.status.success(),
        "meshql check {}:\n{}\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn read(path: PathBuf) -> String {
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn json_file(path: PathBuf) -> Value {
    serde_json::from_str(&read(path)).expect("valid JSON")
}

fn config(dir: &Path) -> (String, toml::Table) {
    let text = read(dir.join("meshql.toml"));
    // the environment references are expanded by meshql; for parsing, their defaults
    let expanded: String = text
        .lines()
        .map(|l| match l.strip_prefix("port = ${PORT:-") {
            Some(port) => format!("port = {}\n", port.trim_end_matches('}')),
            None => format!("{l}\n"),
        })
        .collect();
    let parsed = expanded
        .parse::<toml::Table>()
        .unwrap_or_else(|e| panic!("meshql.toml is not TOML: {e}\n{text}"));
    (text, parsed)
}

/// The `[[entity]]` blocks' names.
fn entity_names(config: &toml::Table) -> Vec<String> {
    config["entity"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_owned())
        .collect()
}

/// The `[[entity]]` block of `name`, as JSON.
fn entity(config: &toml::Table, name: &str) -> Value {
    let e = config["entity"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no entity {name}"));
    serde_json::to_value(e).unwrap()
}

/// `(name, key, query, graph)` of each resolver of an entity.
fn resolvers(entity: &Value) -> Vec<(String, String, String, String)> {
    entity["graphql"]["resolvers"]
        .as_array()
        .map(|rs| {
            rs.iter()
                .map(|r| {
                    (
                        r["name"].as_str().unwrap().to_owned(),
                        r["key"].as_str().unwrap().to_owned(),
                        r["query"].as_str().unwrap().to_owned(),
                        r["graph"].as_str().unwrap().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn r(name: &str, key: &str, query: &str, graph: &str) -> (String, String, String, String) {
    (name.into(), key.into(), query.into(), graph.into())
}

/// `(name, query)` of an entity's singletons or vectors.
fn queries(entity: &Value, kind: &str) -> Vec<(String, String)> {
    entity["graphql"][kind]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| {
            (
                q["name"].as_str().unwrap().to_owned(),
                q["query"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn q(name: &str, query: &str) -> (String, String) {
    (name.into(), query.into())
}

/// The `[[processor]]` whose output is `entity`, as JSON.
fn processor(config: &toml::Table, entity: &str) -> Value {
    let p = config["processor"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["output"].as_str() == Some(entity))
        .unwrap_or_else(|| panic!("no processor writes {entity}"));
    serde_json::to_value(p).unwrap()
}

/// The line of `text` declaring `field` in a mapping, and the comment just above it (its
/// lines joined).
fn declaration(text: &str, field: &str) -> (String, String) {
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with(&format!("{field} = ")))
        .unwrap_or_else(|| panic!("no field {field} in:\n{text}"));
    let mut start = at;
    while start > 0 && lines[start - 1].starts_with('#') {
        start -= 1;
    }
    let comment: Vec<&str> = lines[start..at]
        .iter()
        .map(|l| l.trim_start_matches('#').trim())
        .collect();
    (lines[at].to_owned(), comment.join(" "))
}

fn required(schema: &Value) -> Vec<&str> {
    schema["required"]
        .as_array()
        .map(|r| r.iter().map(|v| v.as_str().unwrap()).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_init_of_the_legacy_schema_checks_and_serves() {
    let url = legacy_database();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("out");
    let (stdout, _) = init_ok(&url, &dir, &[]);
    assert!(stdout.contains("4 entities"), "{stdout}");

    for e in ["cust_acct", "mtr_rdng", "bill_hdr", "pymt_hist"] {
        assert!(dir.join(format!("schema/{e}.schema.json")).is_file(), "{e}");
        assert!(dir.join(format!("graph/{e}.graphql")).is_file(), "{e}");
    }
    let (text, cfg) = config(&dir);
    assert!(
        text.starts_with("# Generated by `meshql init --from-postgres` from"),
        "{text}"
    );
    let header: String = text
        .lines()
        .take_while(|l| l.starts_with('#'))
        .map(|l| l.trim_start_matches("# "))
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        header.contains(&format!("from {url} (schema public) at 20")),
        "{header}"
    );
    assert!(text.contains("port = ${PORT:-4000}"), "{text}");
    assert!(
        text.contains("data_dir = \"${MESHQL_DATA_DIR:-data}\""),
        "{text}"
    );
    assert_eq!(cfg["storage"]["default"]["type"].as_str(), Some("sqlite"));
    assert!(cfg.get("processor").is_none());
    assert_eq!(
        entity_names(&cfg),
        ["bill_hdr", "cust_acct", "mtr_rdng", "pymt_hist"]
    );

    // JSON Schema from the columns: types, lengths, NOT NULL without a default
    let cust = json_file(dir.join("schema/cust_acct.schema.json"));
    assert_eq!(cust["additionalProperties"], json!(false));
    assert_eq!(
        cust["properties"]["acct_num"],
        json!({"type": "string", "maxLength": 12})
    );
    assert_eq!(cust["properties"]["acct_id"]["type"], "integer");
    assert_eq!(
        required(&cust),
        [
            "acct_num",
            "cust_nm_first",
            "cust_nm_last",
            "rt_cd",
            "svc_type",
            "stat_cd",
            "conn_dt"
        ],
        "the serial key and columns with defaults are not required"
    );
    let rdng = json_file(dir.join("schema/mtr_rdng.schema.json"));
    assert_eq!(
        rdng["properties"]["acct_id"]["format"], "uuid",
        "a foreign key holds the parent document's id"
    );
    assert_eq!(
        rdng["properties"]["rdng_val"],
        json!({"type": "integer", "minimum": -2147483648i64, "maximum": 2147483647})
    );

    // queries and resolvers from the foreign keys, both ways
    let c = entity(&cfg, "cust_acct");
    assert_eq!(c["rest"]["path"], "/cust_acct/api");
    assert_eq!(c["rest"]["schema"], "schema/cust_acct.schema.json");
    assert_eq!(c["graphql"]["schema"], "graph/cust_acct.graphql");
    assert_eq!(
        queries(&c, "singletons"),
        [
            q("getById", r#"{"id": "{{id}}"}"#),
            q("getByAcctNum", r#"{"payload.acct_num": "{{acct_num}}"}"#)
        ]
    );
    assert_eq!(
        resolvers(&c),
        [
            r("billHdrs", "id", "getByCustAcct", "/bill_hdr/graph"),
            r("mtrRdngs", "id", "getByCustAcct", "/mtr_rdng/graph"),
            r("pymtHists", "id", "getByCustAcct", "/pymt_hist/graph"),
        ]
    );
    let p = entity(&cfg, "pymt_hist");
    assert_eq!(
        queries(&p, "vectors"),
        [
            q("getAll", "{}"),
            q("getByCustAcct", r#"{"payload.acct_id": "{{id}}"}"#),
            q("getByBillHdr", r#"{"payload.bill_id": "{{id}}"}"#),
        ]
    );
    assert_eq!(
        resolvers(&p),
        [
            r("custAcct", "acct_id", "getById", "/cust_acct/graph"),
            r("billHdr", "bill_id", "getById", "/bill_hdr/graph"),
        ]
    );
    let sdl = read(dir.join("graph/mtr_rdng.graphql"));
    for line in [
        "getById(id: ID, at: Float): MtrRdng",
        "getAll(at: Float, limit: Int): [MtrRdng]",
        "getByCustAcct(id: ID, at: Float, limit: Int): [MtrRdng]",
        "acct_id: ID!",
        "mtr_num: String!",
        "prev_rdng_val: Int\n",
        "custAcct: CustAcct",
        "type CustAcct {",
    ] {
        assert!(sdl.contains(line), "{line} in:\n{sdl}");
    }

    check_passes(&dir);

    // it serves: a document round-trips, and a child finds its parent and the other way
    let s = Server::start(&dir.join("meshql.toml"), &[]);
    let c = s.client();
    let customer = json!({"acct_num": "100100-00001", "cust_nm_first": "Margaret",
        "cust_nm_last": "Henderson", "rt_cd": "RES", "svc_type": "E", "stat_cd": "A",
        "conn_dt": "19980315", "budget_flg": "Y"});
    let created = c.post_json("/cust_acct/api", &customer).await;
    created.expect_status(201);
    let id = created.json()["id"].as_str().unwrap().to_owned();
    let back = c.get(&format!("/cust_acct/api/{id}")).await;
    back.expect_status(200);
    let mut expected = customer.clone();
    expected["id"] = json!(id);
    assert_eq!(back.json(), expected);
    c.post_json(
        "/cust_acct/api",
        &json!({"acct_num": "way too long a number", "cust_nm_first": "X"}),
    )
    .await
    .expect_status(400);
    c.post_json(
        "/mtr_rdng/api",
        &json!({"acct_id": id, "mtr_num": "M-10042", "rdng_dt": "20250601", "rdng_val": 45950,
                "rdng_type": "A"}),
    )
    .await
    .expect_status(201);
    let found = gql(
        &s,
        "/cust_acct/graph",
        "{ getByAcctNum(acct_num: \"100100-00001\") { cust_nm_last mtrRdngs { mtr_num rdng_val } } }",
    )
    .await;
    assert_eq!(
        found,
        json!({"getByAcctNum": {"cust_nm_last": "Henderson",
               "mtrRdngs": [{"mtr_num": "M-10042", "rdng_val": 45950}]}})
    );
    let up = gql(
        &s,
        "/mtr_rdng/graph",
        &format!("{{ getByCustAcct(id: \"{id}\") {{ custAcct {{ acct_num }} }} }}"),
    )
    .await;
    assert_eq!(
        up,
        json!({"getByCustAcct": [{"custAcct": {"acct_num": "100100-00001"}}]})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_init_of_the_legacy_schema_serves_its_rows_cleaned() {
    let url = legacy_database();
    let slots = SlotsDropped::new();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("out");
    let (stdout, _) = init_ok(&url, &dir, &["--acl", "--port", "4066"]);
    assert!(stdout.contains("guessed transformations"), "{stdout}");

    let (text, cfg) = config(&dir);
    assert!(text.contains("port = ${PORT:-4066}"), "{text}");
    assert!(text.contains("# Review before relying on it:"), "{text}");
    assert_eq!(cfg["changes"]["enabled"].as_bool(), Some(true));
    // the dictionary's names: CUST_ACCT → customer_account, MTR_RDNG → meter_reading, …
    assert_eq!(
        entity_names(&cfg),
        [
            "bill_header",
            "customer_account",
            "meter_reading",
            "payment_history"
        ]
    );
    let p = processor(&cfg, "customer_account");
    assert_eq!(p["type"], "mapping");
    assert_eq!(p["inputs"], json!(["cust_acct"]));
    let (_, db) = url.rsplit_once('/').unwrap();
    assert_eq!(
        p["source"],
        json!({"type": "postgres_cdc",
               "url": format!("${{LEGACY_URL:-postgres://postgres@127.0.0.1:55432/{db}}}"),
               "publication": "meshql_customer_account",
               "slot": "meshql_customer_account${LEGACY_SLOT_SUFFIX:-}",
               "tables": ["cust_acct"]})
    );
    assert_eq!(p["mapping"]["table"], "cust_acct");
    assert_eq!(p["mapping"]["key"], json!(["acct_id"]));
    let fields = &p["mapping"]["fields"];
    assert_eq!(fields["legacy_account_id"], json!({"int": "acct_id"}));
    assert_eq!(fields["account_number"], json!({"copy": "acct_num"}));
    assert_eq!(
        fields["customer_name_first"],
        json!({"title": "cust_nm_first"})
    );
    assert_eq!(
        fields["email"],
        json!({"lower": "email_addr", "omit_empty": true})
    );
    assert_eq!(
        fields["address_line1"],
        json!({"copy": "addr_ln1", "omit_empty": true})
    );
    assert_eq!(fields["conn_date"], json!({"date": "conn_dt"}));
    assert_eq!(
        fields["disc_date"],
        json!({"date": "disc_dt", "omit_empty": true})
    );
    assert_eq!(fields["budget"], json!({"flag": "budget_flg"}));
    assert_eq!(
        fields["rate"],
        json!({"code": "rt_cd", "map": {"COM": "com", "IND": "ind", "RES": "res"}})
    );
    assert_eq!(
        fields["status"],
        json!({"code": "stat_cd", "map": {"A": "a", "S": "s"}})
    );
    // each guess is marked for review, saying what it was guessed from
    let (line, review) = declaration(&text, "conn_date");
    assert_eq!(line, "conn_date = { date = \"conn_dt\" }");
    assert!(
        review.starts_with("review: a YYYYMMDD date guessed from conn_dt (character varying(8))"),
        "{review}"
    );
    let (_, review) = declaration(&text, "rate");
    assert!(review.contains("SELECT DISTINCT"), "{review}");
    let (_, review) = declaration(&text, "customer_name_first");
    assert!(review.contains("title case guessed"), "{review}");
    let (_, review) = declaration(&text, "total_amount");
    assert!(review.contains("cents"), "{review}");
    let (_, review) = declaration(&text, "account_number");
    assert!(review.is_empty(), "a copy is no guess: {review}");

    let reading = processor(&cfg, "meter_reading");
    assert_eq!(
        reading["mapping"]["fields"]["customer_account_id"],
        json!({"reference": "cust_acct", "key": ["acct_id"], "omit_empty": true})
    );
    let pay = processor(&cfg, "payment_history");
    assert_eq!(
        pay["mapping"]["fields"]["bill_header_id"],
        json!({"reference": "bill_hdr", "key": ["bill_id"], "omit_empty": true})
    );
    assert_eq!(
        pay["mapping"]["fields"]["payment_amount"],
        json!({"cents": "pymt_amt"})
    );
    let rdng = entity(&cfg, "meter_reading");
    assert_eq!(
        resolvers(&rdng),
        [r(
            "customerAccount",
            "customer_account_id",
            "getById",
            "/customer_account/graph"
        )]
    );
    assert_eq!(
        queries(&rdng, "vectors")[1],
        q(
            "getByCustomerAccount",
            r#"{"payload.customer_account_id": "{{id}}"}"#
        )
    );
    assert_eq!(
        resolvers(&entity(&cfg, "customer_account"))[1],
        r(
            "meterReadings",
            "id",
            "getByCustomerAccount",
            "/meter_reading/graph"
        )
    );

    // the clean JSON Schema follows the transformations
    let schema = json_file(dir.join("schema/customer_account.schema.json"));
    let props = &schema["properties"];
    assert_eq!(props["conn_date"], json!({"type": "string"}));
    assert_eq!(props["budget"], json!({"type": "boolean"}));
    assert_eq!(
        props["status"],
        json!({"type": "string", "enum": ["a", "s"]})
    );
    assert_eq!(props["legacy_account_id"], json!({"type": "integer"}));
    assert!(required(&schema).contains(&"customer_name_first"));
    assert!(!required(&schema).contains(&"email"));
    let bill = json_file(dir.join("schema/bill_header.schema.json"));
    assert_eq!(
        bill["properties"]["total_amount"],
        json!({"type": "number"})
    );
    assert_eq!(
        bill["properties"]["customer_account_id"],
        json!({"type": "string"})
    );

    check_passes(&dir);

    // it serves the legacy rows, cleaned, through REST and GraphQL
    let s = Server::start_with_env(&dir.join("meshql.toml"), &slots.env(&url), None);
    const CUSTOMER: &str = "/customer_account/graph";
    const READING: &str = "/meter_reading/graph";
    until(&s, CUSTOMER, "{ getAll { id } }", |d| {
        len(&d["getAll"]) == 4
    })
    .await;
    until(&s, READING, "{ getAll { id } }", |d| {
        len(&d["getAll"]) == 14
    })
    .await;
    let margaret = gql(
        &s,
        CUSTOMER,
        "{ getByAccountNumber(account_number: \"100100-00001\") { id customer_name_first \
         customer_name_last conn_date disc_date status rate service_type budget paperless email \
         meterReadings { reading_date } } }",
    )
    .await["getByAccountNumber"]
        .clone();
    let id = margaret["id"].as_str().unwrap().to_owned();
    assert_eq!(margaret["customer_name_first"], "Margaret");
    assert_eq!(margaret["customer_name_last"], "Henderson");
    assert_eq!(margaret["conn_date"], "1998-03-15");
    assert_eq!(margaret["disc_date"], Value::Null);
    assert_eq!(margaret["status"], "a");
    assert_eq!(margaret["rate"], "res");
    assert_eq!(margaret["budget"], json!(true));
    assert_eq!(margaret["paperless"], json!(false));
    assert_eq!(margaret["email"], "mhenderson@email.com");
    assert_eq!(len(&margaret["meterReadings"]), 4, "{margaret}");
    let rest = s.client().get(&format!("/customer_account/api/{id}")).await;
    rest.expect_status(200);
    let doc = rest.json();
    assert_eq!(doc["account_number"], "100100-00001");
    assert_eq!(doc["customer_name_first"], "Margaret");
    assert_eq!(doc["legacy_account_id"], json!(1));
    assert!(doc.get("disc_date").is_none(), "omitted when null: {doc}");
    // from a meter reading to its customer
    let readings = gql(
        &s,
        READING,
        &format!(
            "{{ getByCustomerAccount(id: \"{id}\") {{ reading_date reading_type estimated \
             customerAccount {{ id account_number customer_name_first }} }} }}"
        ),
    )
    .await["getByCustomerAccount"]
        .clone();
    assert_eq!(len(&readings), 4, "{readings}");
    assert_eq!(
        readings[0]["customerAccount"],
        json!({"id": id, "account_number": "100100-00001", "customer_name_first": "Margaret"})
    );
    assert!(readings
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["estimated"] == json!(true) && r["reading_type"] == "e"));
    // amounts in dollars; a payment's bill
    let payments = gql(
        &s,
        "/payment_history/graph",
        "{ getAll { payment_amount confirmation_number billHeader { total_amount } } }",
    )
    .await["getAll"]
        .clone();
    let check = payments
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["confirmation_number"] == "CHK-004872")
        .unwrap_or_else(|| panic!("{payments}"))
        .clone();
    assert_eq!(check["payment_amount"].as_f64(), Some(980.0));
    assert_eq!(check["billHeader"]["total_amount"].as_f64(), Some(1062.0));

    // a change of a legacy row follows
    psql(
        &url,
        "UPDATE cust_acct SET cust_nm_first = 'MAGGIE' WHERE acct_id = 1",
    );
    until(
        &s,
        CUSTOMER,
        &format!("{{ getById(id: \"{id}\") {{ customer_name_first }} }}"),
        |d| d["getById"]["customer_name_first"] == "Maggie",
    )
    .await;
    drop(s);
    drop(slots);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_init_of_constraints_types_and_composite_keys() {
    let url = shop_database();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("out");
    init_ok(&url, &dir, &[]);
    let (text, cfg) = config(&dir);
    // a table without a primary key is still an entity
    assert_eq!(
        entity_names(&cfg),
        [
            "audit_log",
            "order_line",
            "orders",
            "shipment_item",
            "warehouse"
        ]
    );
    assert!(
        text.contains("# ---- audit_log: table audit_log ----\n# (the table has no primary key)"),
        "{text}"
    );

    let orders = json_file(dir.join("schema/orders.schema.json"));
    let p = &orders["properties"];
    // the identity key `id`: a legacy field, not required
    assert_eq!(p["legacy_id"]["type"], "integer");
    assert_eq!(p["ext_ref"], json!({"type": "string", "format": "uuid"}));
    assert_eq!(
        p["placed_at"],
        json!({"type": "string", "format": "date-time"})
    );
    assert_eq!(
        p["total"],
        json!({"type": "number", "$comment": "numeric(10,2)"})
    );
    assert_eq!(p["attrs"], json!({"$comment": "jsonb"}));
    assert_eq!(
        p["tags"],
        json!({"type": "array", "items": {"type": "string"}})
    );
    assert_eq!(p["status"]["enum"], json!(["new", "shipped", "cancelled"]));
    assert_eq!(p["priority"]["enum"], json!([1, 2, 3]));
    assert_eq!(
        p["feeling"],
        json!({"type": "string", "enum": ["happy", "sad"]})
    );
    assert_eq!(p["wh_cd"]["format"], "uuid");
    assert_eq!(required(&orders), ["ord_no", "total"]);
    let warehouse = json_file(dir.join("schema/warehouse.schema.json"));
    assert_eq!(
        warehouse["properties"]["region"],
        json!({"type": "string", "maxLength": 2, "enum": ["NE", "SW"]})
    );
    assert_eq!(required(&warehouse), ["wh_cd", "wh_nm", "region"]);
    // composite primary key: its columns stay; the one that is a foreign key holds an id
    let line = json_file(dir.join("schema/order_line.schema.json"));
    assert_eq!(line["properties"]["order_id"]["format"], "uuid");
    assert_eq!(line["properties"]["line_no"]["type"], "integer");
    // composite foreign key: one field instead of its columns
    let ship = json_file(dir.join("schema/shipment_item.schema.json"));
    let names: Vec<&String> = ship["properties"].as_object().unwrap().keys().collect();
    assert_eq!(names, ["id", "shp_id", "order_line_id", "shipped_qty"]);
    assert_eq!(
        resolvers(&entity(&cfg, "shipment_item")),
        [r(
            "orderLine",
            "order_line_id",
            "getById",
            "/order_line/graph"
        )]
    );
    assert_eq!(
        resolvers(&entity(&cfg, "order_line")),
        [
            r("orders", "order_id", "getById", "/orders/graph"),
            r(
                "shipmentItems",
                "id",
                "getByOrderLine",
                "/shipment_item/graph"
            ),
        ]
    );
    assert_eq!(
        queries(&entity(&cfg, "warehouse"), "singletons")[1],
        q("getByWhCd", r#"{"payload.wh_cd": "{{wh_cd}}"}"#)
    );
    let sdl = read(dir.join("graph/orders.graphql"));
    for line in [
        "scalar JSON",
        "attrs: JSON",
        "tags: [String]",
        "total: Float!",
        "ext_ref: ID",
    ] {
        assert!(sdl.contains(line), "{line} in:\n{sdl}");
    }

    check_passes(&dir);

    let s = Server::start(&dir.join("meshql.toml"), &[]);
    let c = s.client();
    let w = c
        .post_json(
            "/warehouse/api",
            &json!({"wh_cd": "W1", "wh_nm": "North", "region": "NE", "opened": "2020-01-15"}),
        )
        .await;
    w.expect_status(201);
    let wid = w.json()["id"].as_str().unwrap().to_owned();
    let order = json!({"ord_no": "A-1", "total": 12.5, "attrs": {"gift": true},
        "tags": ["red", "blue"], "status": "shipped", "priority": 2, "feeling": "happy",
        "wh_cd": wid, "placed_at": "2025-06-01T12:00:00Z"});
    let o = c.post_json("/orders/api", &order).await;
    o.expect_status(201);
    let oid = o.json()["id"].as_str().unwrap().to_owned();
    let mut expected = order.clone();
    expected["id"] = json!(oid);
    assert_eq!(c.get(&format!("/orders/api/{oid}")).await.json(), expected);
    // the constraints hold
    let bad = c
        .post_json(
            "/orders/api",
            &json!({"ord_no": "A-2", "total": 1, "status": "lost", "priority": 7}),
        )
        .await;
    bad.expect_status(400);
    assert!(
        bad.text.contains("/status") && bad.text.contains("/priority"),
        "{}",
        bad.text
    );
    let found = gql(
        &s,
        "/warehouse/graph",
        "{ getByWhCd(wh_cd: \"W1\") { wh_nm orders { ord_no attrs tags } } }",
    )
    .await;
    assert_eq!(
        found,
        json!({"getByWhCd": {"wh_nm": "North",
               "orders": [{"ord_no": "A-1", "attrs": {"gift": true}, "tags": ["red", "blue"]}]}})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_init_of_constraints_types_and_composite_keys() {
    let url = shop_database();
    let slots = SlotsDropped::new();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("out");
    let (_, stderr) = init_ok(&url, &dir, &["--acl"]);
    // a table without a primary key cannot be captured: a warning, and a comment
    assert!(
        stderr.contains("warning: table audit_log not generated: no primary key"),
        "{stderr}"
    );
    let (text, cfg) = config(&dir);
    assert!(
        text.contains("# ---- not generated ----\n# audit_log: no primary key"),
        "{text}"
    );
    assert_eq!(
        entity_names(&cfg),
        ["order_line", "orders", "shipment_item", "warehouse"]
    );

    let orders = processor(&cfg, "orders");
    let f = &orders["mapping"]["fields"];
    assert_eq!(f["legacy_id"], json!({"int": "id"}));
    assert_eq!(f["order_number"], json!({"copy": "ord_no"}));
    assert_eq!(f["total"], json!({"number": "total"}));
    assert_eq!(
        f["status"],
        json!({"copy": "status"}),
        "lower-case CHECK values are kept"
    );
    assert_eq!(
        f["priority"],
        json!({"int": "priority", "omit_empty": true})
    );
    assert_eq!(
        f["warehouse_id"],
        json!({"reference": "warehouse", "key": ["wh_cd"], "omit_empty": true})
    );
    let (_, review) = declaration(&text, "placed_at");
    assert!(review.contains("from the snapshot"), "{review}");
    let warehouse = processor(&cfg, "warehouse");
    let f = &warehouse["mapping"]["fields"];
    assert_eq!(
        f["wh_code"],
        json!({"copy": "wh_cd"}),
        "a key is never a code"
    );
    assert_eq!(
        f["region"],
        json!({"code": "region", "map": {"NE": "ne", "SW": "sw"}})
    );
    let (_, review) = declaration(&text, "region");
    assert!(
        review.contains("from CHECK constraint warehouse_region_check"),
        "{review}"
    );
    // composite primary key: the mapping's key; composite foreign key: a computed reference
    // in the order of the parent's key
    let line = processor(&cfg, "order_line");
    assert_eq!(line["mapping"]["key"], json!(["order_id", "line_no"]));
    let ship = processor(&cfg, "shipment_item");
    assert_eq!(
        ship["mapping"]["fields"],
        json!({"legacy_shp_id": {"int": "shp_id"},
               "order_line_id": {"reference": "order_line", "key": ["order_id", "line_no"],
                                 "omit_empty": true},
               "shipped_quantity": {"int": "shipped_qty"}})
    );
    let schema = json_file(dir.join("schema/orders.schema.json"));
    assert_eq!(
        schema["properties"]["priority"],
        json!({"type": "integer", "enum": [1, 2, 3]})
    );
    assert_eq!(
        schema["properties"]["status"],
        json!({"type": "string", "enum": ["new", "shipped", "cancelled"]})
    );
    let schema = json_file(dir.join("schema/warehouse.schema.json"));
    assert_eq!(
        schema["properties"]["region"],
        json!({"type": "string", "enum": ["ne", "sw"]})
    );

    check_passes(&dir);

    let s = Server::start_with_env(&dir.join("meshql.toml"), &slots.env(&url), None);
    let all = until(
        &s,
        "/orders/graph",
        "{ getAll { legacy_id order_number total attrs tags status priority feeling \
         ext_reference warehouse { wh_code wh_name region opened } \
         orderLines { line_number item quantity } } }",
        |d| len(&d["getAll"]) == 1 && len(&d["getAll"][0]["orderLines"]) == 2,
    )
    .await;
    let order = &all["getAll"][0];
    assert_eq!(order["legacy_id"], json!(1));
    assert_eq!(order["total"].as_f64(), Some(12.5));
    assert_eq!(order["attrs"], json!({"gift": true}));
    assert_eq!(order["status"], "shipped");
    assert_eq!(order["priority"], json!(2));
    assert_eq!(order["feeling"], "happy");
    assert!(common::is_rfc4122_uuid(
        order["ext_reference"].as_str().unwrap()
    ));
    assert_eq!(
        order["warehouse"],
        json!({"wh_code": "W1", "wh_name": "North Depot", "region": "ne", "opened": "2020-01-15"})
    );
    let shipped = until(
        &s,
        "/shipment_item/graph",
        "{ getAll { shipped_quantity orderLine { item line_number } } }",
        |d| len(&d["getAll"]) == 1 && !d["getAll"][0]["orderLine"].is_null(),
    )
    .await;
    assert_eq!(
        shipped,
        json!({"getAll": [{"shipped_quantity": 1, "orderLine": {"item": "GADGET", "line_number": 2}}]})
    );
    drop(s);
    drop(slots);
}

#[test]
fn failures_are_one_clear_line() {
    let tmp = tempfile::tempdir().unwrap();

    // nothing listens on port 1: refused, and the password is not shown
    let out = init(
        "postgres://meshql:s3cret-pw@127.0.0.1:1/legacy",
        &tmp.path().join("a"),
        &[],
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        said.starts_with(
            "meshql init: cannot connect to postgres://meshql:***@127.0.0.1:1/legacy: "
        ),
        "{said}"
    );
    assert!(!said.contains("s3cret"), "{said}");
    assert_eq!(said.trim_end().lines().count(), 1, "{said}");
    assert!(!tmp.path().join("a").exists());

    let out = init("not a url at all", &tmp.path().join("a"), &[]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is not a PostgreSQL URL"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // TLS settings are read as the PostgreSQL store reads them
    let out = init(
        "postgres://u:pw@127.0.0.1:1/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
        &tmp.path().join("a"),
        &[],
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        said.contains("/nonexistent/ca.pem") && !said.contains(":pw@"),
        "{said}"
    );

    // a directory that holds something is refused, with or without a database behind it
    let full = tmp.path().join("full");
    std::fs::create_dir_all(&full).unwrap();
    std::fs::write(full.join("notes.txt"), "mine").unwrap();
    let url = shop_database();
    let out = init(&url, &full, &[]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(
        said.trim_end(),
        format!(
            "meshql init: {} is not empty: choose another --out, or give --force to write into it",
            full.display()
        )
    );
    assert_eq!(std::fs::read_dir(&full).unwrap().count(), 1);
    // --force writes into it (and TLS: the test server offers it)
    init_ok(
        &format!("{url}?sslmode=require"),
        &full,
        &["--force", "--tables", "warehouse,orders"],
    );
    assert_eq!(read(full.join("notes.txt")), "mine");
    let (_, cfg) = config(&full);
    assert_eq!(entity_names(&cfg), ["orders", "warehouse"]);
    check_passes(&full);

    // a database that does not exist: the server's word for it
    let (base, _) = url.rsplit_once('/').unwrap();
    let out = init(
        &format!("{base}/no_such_database_here"),
        &tmp.path().join("b"),
        &[],
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        said.contains("database \"no_such_database_here\" does not exist"),
        "{said}"
    );

    // tables that do not exist
    let out = init(&url, &tmp.path().join("b"), &["--tables", "orders,nosuch"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        said.contains("no table nosuch in schema public (its tables: audit_log, order_line, orders, shipment_item, warehouse)"),
        "{said}"
    );

    // a schema without tables
    let empty = fresh_postgres_database();
    let out = init(&empty, &tmp.path().join("c"), &[]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        said.contains("no tables in schema public of postgres://"),
        "{said}"
    );
    assert!(!tmp.path().join("c").exists());
}

#[test]
fn the_default_directory_is_named_after_the_database() {
    let url = shop_database();
    let (_, db) = url.rsplit_once('/').unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(common::meshql_bin())
        .args(["init", "--from-postgres", &url, "--tables", "warehouse"])
        .current_dir(tmp.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = tmp.path().join(format!("meshql-{db}"));
    assert!(dir.join("meshql.toml").is_file());
    assert!(dir.join("schema/warehouse.schema.json").is_file());
    assert!(dir.join("graph/warehouse.graphql").is_file());
}
