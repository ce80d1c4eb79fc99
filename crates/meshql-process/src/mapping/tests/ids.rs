//! Ids: stable whichever way a key arrives, a reference equal to its parent's id, and a
//! delete's tombstone.

use super::*;
use serde_json::json;

#[test]
fn ids_are_stable_and_a_reference_is_its_parents_id() {
    let one = json!(1);
    assert_eq!(legacy_id("cust_acct", &[&one]).unwrap(), CUST_1);
    // int, text, a float without a fraction, CHAR padding, the table's case: one id
    for v in [json!("1"), json!(1.0), json!("1   "), json!(1u64)] {
        assert_eq!(legacy_id("cust_acct", &[&v]).unwrap(), CUST_1, "{v}");
    }
    assert_eq!(legacy_id("CUST_ACCT", &[&one]).unwrap(), CUST_1);
    // text is not read as a number; tables and keys make different ids
    assert_ne!(
        legacy_id("cust_acct", &[&json!("007")]),
        legacy_id("cust_acct", &[&json!("7")])
    );
    assert_ne!(legacy_id("bill_hdr", &[&one]).unwrap(), CUST_1);
    assert_eq!(
        legacy_id("cust_acct", &[&json!("ABC")]).unwrap(),
        "968bcfc4-543a-5576-abfc-d57c20f5e157"
    );
    // a composite key (SAP: MANDT, MBLNR, MJAHR)
    assert_eq!(
        legacy_id(
            "zmseg_101",
            &[&json!("100"), &json!("4900000001"), &json!(2026)]
        )
        .unwrap(),
        "03d2ccaa-eced-5752-8031-7f441116748f"
    );
    assert_eq!(legacy_id("cust_acct", &[&Value::Null]), None);
    assert_eq!(legacy_id("cust_acct", &[&json!({"a": 1})]), None);
    assert_eq!(key_text(&json!(2.5)).as_deref(), Some("2.5"));
    assert_eq!(key_text(&json!(true)).as_deref(), Some("true"));
    // the child's FK is the parent's id whichever way each delivers the key
    let (parent, _) = clean(
        "customers",
        "cust_acct",
        json!({"acct_id": "1", "acct_num": "n", "rt_cd": "RES", "svc_type": "E", "stat_cd": "A"}),
    )
    .unwrap();
    for acct in [json!(1), json!("1")] {
        let (_, child) = clean(
            "bills",
            "bill_hdr",
            json!({"bill_id": 1, "acct_id": acct, "tot_amt": 1, "kwh_used": 1, "stat_cd": "P"}),
        )
        .unwrap();
        assert_eq!(child["customer_id"], parent.as_str());
    }
    // and the same row twice makes the same id and document
    let row = json!({"bill_id": 1, "acct_id": 1, "tot_amt": 1, "kwh_used": 1, "stat_cd": "P"});
    assert_eq!(
        clean("bills", "bill_hdr", row.clone()),
        clean("bills", "bill_hdr", row)
    );
}

#[test]
fn a_delete_tombstones_the_rows_document() {
    let t = spec("customers").transform;
    // a delete carries the key columns (replica identity DEFAULT) or the whole row
    for row in [
        json!({"acct_id": 2}),
        json!({"acct_id": "2", "acct_num": "200200-00002", "rt_cd": "???"}),
    ] {
        let out = t
            .transform(&input("cust_acct", ChangeOp::Delete, row))
            .unwrap();
        assert_eq!(
            out,
            vec![Emit {
                id: Some(CUST_2.into()),
                payload: None
            }]
        );
    }
    let e = t
        .transform(&input(
            "cust_acct",
            ChangeOp::Delete,
            json!({"acct_num": "x"}),
        ))
        .unwrap_err();
    assert!(e.contains("`acct_id`") && e.contains("cust_acct"), "{e}");
    // a create without its key is a dead letter too
    let e = t
        .transform(&input(
            "cust_acct",
            ChangeOp::Create,
            json!({"acct_id": null}),
        ))
        .unwrap_err();
    assert!(e.contains("`acct_id`"), "{e}");
    // another table's rows lead to nothing; the table's case does not matter
    assert!(t
        .transform(&input("bill_hdr", ChangeOp::Create, json!({"acct_id": 1})))
        .unwrap()
        .is_empty());
    let out = t
        .transform(&input(
            "CUST_ACCT",
            ChangeOp::Update,
            json!({"ACCT_ID": 2, "RT_CD": "COM", "SVC_TYPE": "E", "STAT_CD": "A"}),
        ))
        .unwrap();
    assert_eq!(out[0].id.as_deref(), Some(CUST_2));
    assert_eq!(out[0].payload.as_ref().unwrap()["rate_class"], "commercial");
}
