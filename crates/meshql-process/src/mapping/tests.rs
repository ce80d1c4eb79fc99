//! Tests of whole mappings, compiled as `configure` does and run on rows. This file holds the
//! fixtures the files under `tests/` share: CONTRACT §14.2.3's four mappings (their TOML as
//! JSON), the clean entities they write, and the ids their rows get.

use super::*;
use crate::plan::Input;
use crate::transform::Emit;
use meshql_core::ChangeOp;

mod checks;
mod config;
mod ids;
mod legacy_tables;
mod planner;
mod transformations;

/// The four §14.2.3 mappings as in the report's TOML, converted to JSON by a TOML parser
/// (Python's `tomllib`), `source` included.
const LEGACY: &str = r#"
[
{
  "name": "customers",
  "type": "mapping",
  "inputs": ["cust_acct"],
  "output": "customer",
  "source": {"type": "kafka", "brokers": "localhost:9092", "topics": ["legacy.public.cust_acct"]},
  "mapping": {
    "table": "cust_acct",
    "key": ["acct_id"],
    "fields": {
      "legacy_acct_id": {"int": "acct_id"},
      "account_number": "acct_num",
      "first_name": {"title": "cust_nm_first"},
      "last_name": {"title": "cust_nm_last"},
      "address": {"concat": [{"title": "addr_ln1"}, {"title": "addr_ln2"}], "separator": ", ", "omit_empty": true},
      "city": {"title": "addr_city", "omit_empty": true},
      "state": {"copy": "addr_st", "omit_empty": true},
      "zip": {"copy": "addr_zip", "omit_empty": true},
      "phone": {"copy": "phone_num", "omit_empty": true},
      "email": {"lower": "email_addr", "omit_empty": true},
      "rate_class": {"code": "rt_cd", "map": {"RES": "residential", "COM": "commercial", "IND": "industrial"}},
      "service_type": {"code": "svc_type", "map": {"E": "electric", "G": "gas", "B": "both"}},
      "status": {"code": "stat_cd", "map": {"A": "active", "S": "suspended", "C": "closed"}},
      "connected_date": {"date": "conn_dt", "omit_empty": true},
      "disconnected_date": {"date": "disc_dt", "omit_empty": true},
      "budget_billing": {"flag": "budget_flg"},
      "paperless": {"flag": "paperless_flg"}
    }
  }
},
{
  "name": "meter_readings",
  "type": "mapping",
  "inputs": ["mtr_rdng"],
  "output": "meter_reading",
  "source": {"type": "kafka", "brokers": "localhost:9092", "topics": ["legacy.public.mtr_rdng"]},
  "mapping": {
    "table": "mtr_rdng",
    "key": ["rdng_id"],
    "fields": {
      "customer_id": {"reference": "cust_acct", "key": ["acct_id"], "omit_empty": true},
      "meter_number": "mtr_num",
      "reading_date": {"date": "rdng_dt"},
      "reading_value": {"int": "rdng_val", "default": 0},
      "previous_value": {"int": "prev_rdng_val", "omit_empty": true},
      "kwh_used": {"subtract": ["rdng_val", "prev_rdng_val"], "omit_empty": true},
      "reading_type": {"code": "rdng_type", "map": {"A": "actual", "E": "estimated", "C": "customer"}},
      "estimated": {"flag": "est_flg"},
      "billed": {"flag": "billed_flg"}
    }
  }
},
{
  "name": "bills",
  "type": "mapping",
  "inputs": ["bill_hdr"],
  "output": "bill",
  "source": {"type": "kafka", "brokers": "localhost:9092", "topics": ["legacy.public.bill_hdr"]},
  "mapping": {
    "table": "bill_hdr",
    "key": ["bill_id"],
    "fields": {
      "customer_id": {"reference": "cust_acct", "key": ["acct_id"], "omit_empty": true},
      "legacy_bill_id": {"int": "bill_id"},
      "bill_date": {"date": "bill_dt"},
      "due_date": {"date": "due_dt"},
      "period_from": {"date": "bill_prd_from"},
      "period_to": {"date": "bill_prd_to"},
      "total_amount": {"cents": "tot_amt"},
      "kwh_used": {"int": "kwh_used"},
      "status": {"code": "stat_cd", "map": {"O": "open", "P": "paid", "D": "delinquent", "X": "cancelled"}},
      "late": {"flag": "late_flg"}
    }
  }
},
{
  "name": "payments",
  "type": "mapping",
  "inputs": ["pymt_hist"],
  "output": "payment",
  "source": {"type": "kafka", "brokers": "localhost:9092", "topics": ["legacy.public.pymt_hist"]},
  "mapping": {
    "table": "pymt_hist",
    "key": ["pymt_id"],
    "fields": {
      "customer_id": {"reference": "cust_acct", "key": ["acct_id"], "omit_empty": true},
      "legacy_bill_id": {"int": "bill_id", "omit_empty": true},
      "bill_id": {"reference": "bill_hdr", "key": ["bill_id"], "omit_empty": true},
      "payment_date": {"date": "pymt_dt"},
      "amount": {"cents": "pymt_amt"},
      "method": {"code": "pymt_mthd", "map": {"W": "web", "E": "electronic", "K": "check", "C": "cash", "P": "phone"}},
      "confirmation_number": {"copy": "conf_num", "omit_empty": true},
      "status": {"code": "stat_cd", "map": {"S": "success", "F": "failed", "R": "refunded"}, "default": "success"}
    }
  }
}
]
"#;

/// The clean entities' JSON Schema properties (CONTRACT §14.2.4).
fn entities() -> Vec<EntityInfo> {
    let with = |name: &str, fields: &[&str]| EntityInfo {
        name: name.into(),
        fields: Some(fields.iter().map(|f| (*f).to_owned()).collect()),
        properties: None,
        required: Vec::new(),
    };
    vec![
        with(
            "customer",
            &[
                "account_number",
                "first_name",
                "last_name",
                "rate_class",
                "service_type",
                "status",
                "address",
                "city",
                "state",
                "zip",
                "phone",
                "email",
                "connected_date",
                "disconnected_date",
                "budget_billing",
                "paperless",
                "legacy_acct_id",
            ],
        ),
        with(
            "meter_reading",
            &[
                "meter_number",
                "reading_date",
                "reading_value",
                "reading_type",
                "customer_id",
                "previous_value",
                "kwh_used",
                "estimated",
                "billed",
            ],
        ),
        with(
            "bill",
            &[
                "bill_date",
                "due_date",
                "total_amount",
                "kwh_used",
                "status",
                "customer_id",
                "legacy_bill_id",
                "period_from",
                "period_to",
                "late",
            ],
        ),
        with(
            "payment",
            &[
                "payment_date",
                "amount",
                "method",
                "status",
                "customer_id",
                "bill_id",
                "legacy_bill_id",
                "confirmation_number",
            ],
        ),
    ]
}

/// A processor of [`LEGACY`] as `configure` sees it: its name, type and other settings.
fn entry(name: &str) -> (String, Value) {
    let all: Vec<Value> = serde_json::from_str(LEGACY).unwrap();
    let mut p = all
        .into_iter()
        .find(|p| p["name"] == name)
        .unwrap()
        .as_object()
        .unwrap()
        .clone();
    p.remove("name");
    let kind = p.remove("type").unwrap().as_str().unwrap().to_owned();
    (kind, Value::Object(p))
}

fn plan(name: &str) -> crate::ProcessorPlan {
    let (kind, settings) = entry(name);
    crate::configure(
        name,
        &kind,
        &settings,
        &entities(),
        std::path::Path::new("."),
    )
    .unwrap()
}

fn spec(name: &str) -> TransformSpec {
    match plan(name) {
        crate::ProcessorPlan::Transform(t) => t,
        other => panic!("not a transform: {other:?}"),
    }
}

fn input(entity: &str, op: ChangeOp, row: Value) -> Input {
    Input {
        position: 1,
        change_id: format!("{entity}:x:1"),
        entity: entity.into(),
        id: "x".into(),
        op,
        created_at: 1,
        correlation_id: None,
        payload: row.as_object().unwrap().clone(),
        order: (0, 1),
        fresh: false,
    }
}

/// What processor `name` makes of a created `row` of `table`: (id, document).
fn clean(name: &str, table: &str, row: Value) -> Result<(String, Value), String> {
    let out = spec(name)
        .transform
        .transform(&input(table, ChangeOp::Create, row))?;
    assert_eq!(out.len(), 1);
    let Emit { id, payload } = out.into_iter().next().unwrap();
    Ok((id.unwrap(), Value::Object(payload.unwrap())))
}

// ids computed with Python's uuid.uuid5(UUID("6fa4a995-5b3f-41d4-a4a1-13b2a525552a"), text)
const CUST_1: &str = "583b05e8-a3fb-508e-99c0-260b1a0fc29a"; // ["cust_acct","1"]
const CUST_2: &str = "9974b243-b8b0-5d2b-9762-dfe1ac6fe94b"; // ["cust_acct","2"]
const BILL_1: &str = "854f3f43-f101-5648-a16e-24de00102512"; // ["bill_hdr","1"]
const BILL_10: &str = "550f9033-72ab-5171-a02a-15c45d13ea89"; // ["bill_hdr","10"]
const RDNG_2: &str = "1a6be9b8-3fd3-5013-9f7d-3fa9c9b918d2"; // ["mtr_rdng","2"]
const PYMT_1: &str = "1a6cc105-8216-5100-9e19-f043e33e50fd"; // ["pymt_hist","1"]
const PYMT_5: &str = "efbb3b98-6017-5a0a-9c06-b429dd47cae5"; // ["pymt_hist","5"]

/// `customers`' settings as the kind sees them: `source` taken out (by `configure`).
fn customers() -> Value {
    let (_, mut settings) = entry("customers");
    settings.as_object_mut().unwrap().remove("source");
    settings
}

fn customers_with(field: &str, decl: Value) -> Result<TransformSpec, SettingError> {
    let mut settings = customers();
    settings["mapping"]["fields"][field] = decl;
    compile("customers", &settings, &entities(), true)
}

fn error_of(r: Result<TransformSpec, SettingError>) -> SettingError {
    match r {
        Ok(s) => panic!("accepted: {s:?}"),
        Err(e) => e,
    }
}
