//! The transformations on rows: unknown codes, SAP rows (timestamps, defaults, composite
//! references), numbers, dates, `concat` and defaults.

use super::*;
use crate::transform::Transform;
use serde_json::json;

#[test]
fn an_unknown_code_is_a_dead_letter_or_the_default() {
    let row =
        json!({"acct_id": 1, "acct_num": "n", "rt_cd": "XYZ", "svc_type": "E", "stat_cd": "A"});
    let e = clean("customers", "cust_acct", row.clone()).unwrap_err();
    assert!(
        e.contains("`rate_class`")
            && e.contains("`rt_cd`")
            && e.contains("\"XYZ\"")
            && e.contains("COM, IND, RES"),
        "{e}"
    );
    for unknown in [json!("dead_letter"), json!({"default": "residential"})] {
        let t = customers_with(
            "rate_class",
            json!({"code": "rt_cd", "map": {"RES": "residential", "COM": "commercial"}, "unknown": unknown.clone()}),
        )
        .unwrap()
        .transform;
        let out = t.transform(&input("cust_acct", ChangeOp::Create, row.clone()));
        match unknown {
            Value::String(_) => assert!(out.unwrap_err().contains("\"XYZ\"")),
            _ => assert_eq!(
                out.unwrap()[0].payload.as_ref().unwrap()["rate_class"],
                "residential"
            ),
        }
    }
    // a null code is null, not unknown
    let (_, doc) = clean(
        "customers",
        "cust_acct",
        json!({"acct_id": 1, "acct_num": "n", "rt_cd": null, "svc_type": "E", "stat_cd": "A"}),
    )
    .unwrap();
    assert_eq!(doc["rate_class"], Value::Null);
    // an integer column's codes are its digits
    let t = customers_with(
        "status",
        json!({"code": "stat_cd", "map": {"1": "active", "2": "closed"}}),
    )
    .unwrap()
    .transform;
    let out = t
        .transform(&input(
            "cust_acct",
            ChangeOp::Create,
            json!({"acct_id": 1, "rt_cd": "RES", "stat_cd": 2}),
        ))
        .unwrap();
    assert_eq!(out[0].payload.as_ref().unwrap()["status"], "closed");
}

/// A mapping without a schema to check against, from a `[processor.mapping]` block.
fn free(block: Value) -> Mapping {
    Mapping::new(
        &block,
        &EntityInfo {
            name: "out".into(),
            fields: None,
            properties: None,
            required: Vec::new(),
        },
        &[],
    )
    .unwrap()
}

#[test]
fn sap_rows_timestamps_defaults_and_composite_references() {
    let farm = free(
        json!({"table": "zfarm_mstr", "key": ["mandt", "werks"], "fields": {
            "legacy_werks": "werks",
            "name": "farm_nm",
            "farm_type": {"code": "farm_typ_cd", "map": {"M": "megafarm", "L": "local_farm", "H": "homestead"},
                          "unknown": {"default": "local_farm"}},
            "owner": {"copy": "eigr", "omit_empty": true}
        }}),
    );
    let row = json!({"mandt": "100", "werks": "1000", "bukrs": "1000", "farm_nm": "Sonnenhof Megafarm",
                     "farm_typ_cd": "M", "zone_cd": "north", "eigr": "Heinrich Mueller"});
    let out = farm
        .transform(&input("zfarm_mstr", ChangeOp::Create, row))
        .unwrap();
    assert_eq!(
        out[0].id.as_deref(),
        Some("551c08e4-b9d1-5e8e-ae6a-6c2ce4b35566")
    );
    assert_eq!(
        Value::Object(out[0].payload.clone().unwrap()),
        json!({"legacy_werks": "1000", "name": "Sonnenhof Megafarm", "farm_type": "megafarm",
               "owner": "Heinrich Mueller"})
    );
    let doc = farm
        .document(json!({"mandt": "100", "werks": "2000", "farm_nm": "Gruener Hof", "farm_typ_cd": "Q", "eigr": null})
            .as_object()
            .unwrap())
        .unwrap();
    assert_eq!(
        Value::Object(doc),
        json!({"legacy_werks": "2000", "name": "Gruener Hof", "farm_type": "local_farm"})
    );
    let lay = free(
        json!({"table": "zafru_lege", "key": ["mandt", "aufnr"], "fields": {
            "farm_id": {"reference": "zfarm_mstr", "key": ["mandt", "werks"]},
            "eggs": {"int": "ei_menge"},
            "timestamp": {"datetime": ["erfas_dt", "erfas_zt"]}
        }}),
    );
    for (dt, zt, ts) in [
        (
            json!("20260201"),
            json!("063015"),
            json!("2026-02-01T06:30:15Z"),
        ),
        (
            json!("20260201"),
            Value::Null,
            json!("2026-02-01T00:00:00Z"),
        ),
        (
            json!("20260201"),
            json!("0630"),
            json!("2026-02-01T00:00:00Z"),
        ),
        (json!("2026021"), json!("063015"), Value::Null),
        (Value::Null, json!("063015"), Value::Null),
    ] {
        let doc = lay
            .document(
                json!({"mandt": "100", "aufnr": "1", "werks": "1000", "ei_menge": 12,
                             "erfas_dt": dt, "erfas_zt": zt})
                .as_object()
                .unwrap(),
            )
            .unwrap();
        assert_eq!(doc["timestamp"], ts);
        assert_eq!(doc["farm_id"], "551c08e4-b9d1-5e8e-ae6a-6c2ce4b35566");
        assert_eq!(doc["eggs"], 12);
    }
    // a reference with a null or blank key column is null
    for werks in [Value::Null, json!("   ")] {
        let doc = lay
            .document(
                json!({"mandt": "100", "aufnr": "1", "werks": werks})
                    .as_object()
                    .unwrap(),
            )
            .unwrap();
        assert_eq!(doc["farm_id"], Value::Null);
    }
}

#[test]
fn numbers_dates_concat_and_defaults() {
    let m = free(json!({"table": "t", "key": ["k"], "fields": {
        "n": {"number": "n"},
        "i": {"int": "i"},
        "sum": {"add": ["a", "b"]},
        "diff": {"subtract": ["a", "b", "c"]},
        "d": {"date": "d", "format": "DD.MM.YYYY"},
        "us": {"date": "us", "format": "MM/DD/YYYY"},
        "label": {"concat": ["x", {"lower": "y"}, {"int": "i"}], "separator": " / "},
        "none": {"concat": ["missing", "blank"], "omit_empty": false},
        "fallback": {"copy": "missing", "default": "n/a"},
        "yes": {"flag": "f", "true_value": "X"},
        "raw": "raw"
    }}));
    let doc = |row: Value| Value::Object(m.document(row.as_object().unwrap()).unwrap());
    assert_eq!(
        doc(
            json!({"k": 1, "n": "12.5", "i": "7", "a": "1.5", "b": 2, "c": 1, "d": "15.03.1998",
                   "us": "03/15/1998", "x": "A  ", "y": "B", "blank": "  ", "f": "X",
                   "raw": {"nested": [1]}})
        ),
        json!({"n": 12.5, "i": 7, "sum": 3.5, "diff": -1.5, "d": "1998-03-15", "us": "1998-03-15",
               "label": "A / b / 7", "none": null, "fallback": "n/a", "yes": true,
               "raw": {"nested": [1]}})
    );
    // integers stay integers; a wrong separator or length is null; blank numbers are null
    assert_eq!(
        doc(
            json!({"k": 1, "n": 7, "i": 12.0, "a": 10, "b": "3", "c": "2", "d": "15/03/1998",
                   "us": "3/15/1998", "y": "B", "f": "Y"})
        ),
        json!({"n": 7, "i": 12, "sum": 13, "diff": 5, "d": null, "us": null, "label": "b / 12",
               "none": null, "fallback": "n/a", "yes": false, "raw": null})
    );
    let blank = doc(json!({"k": 1, "n": " ", "i": "", "a": "", "b": 1}));
    assert_eq!(
        (&blank["n"], &blank["i"], &blank["sum"]),
        (&Value::Null, &Value::Null, &Value::Null)
    );
    // the default format and §14.2.3's missing digit check
    let m = free(json!({"table": "t", "key": ["k"], "fields": {"d": {"date": "d"}}}));
    for (legacy, clean) in [
        (json!("19980315"), json!("1998-03-15")),
        (json!(19980315), json!("1998-03-15")),
        (json!("1998031"), Value::Null),
        (json!("ABCDEFGH"), json!("ABCD-EF-GH")),
    ] {
        let doc = m
            .document(json!({"d": legacy}).as_object().unwrap())
            .unwrap();
        assert_eq!(doc["d"], clean);
    }
    // overflow and objects are dead letters
    let m = free(json!({"table": "t", "key": ["k"], "fields": {
        "s": {"subtract": ["a", "b"]}, "t": {"title": "o"}
    }}));
    let e = m
        .document(json!({"a": i64::MIN, "b": 1}).as_object().unwrap())
        .unwrap_err();
    assert!(e.contains("`s`") && e.contains("overflows"), "{e}");
    let e = m
        .document(json!({"o": {"x": 1}}).as_object().unwrap())
        .unwrap_err();
    assert!(
        e.contains("`t`") && e.contains("`o`") && e.contains("not text"),
        "{e}"
    );
}
