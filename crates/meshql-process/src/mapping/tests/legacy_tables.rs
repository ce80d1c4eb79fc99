//! The §14.2.3 tables cleaned: customers, meter readings, bills and payments, with their rows
//! typed (Debezium) and as text.

use super::*;
use serde_json::json;

#[test]
fn seed_customers_are_cleaned() {
    // Debezium-style: integers as JSON numbers
    let (id, doc) = clean(
        "customers",
        "cust_acct",
        json!({"acct_id": 1, "acct_num": "100100-00001", "cust_nm_first": "MARGARET",
               "cust_nm_last": "HENDERSON", "addr_ln1": "742 EVERGREEN TERRACE", "addr_ln2": null,
               "addr_city": "SPRINGFIELD", "addr_st": "IL", "addr_zip": "62704",
               "phone_num": "217-555-0101", "email_addr": "MHenderson@Email.com", "rt_cd": "RES",
               "svc_type": "E", "stat_cd": "A", "conn_dt": "19980315", "disc_dt": null,
               "budget_flg": "Y", "paperless_flg": "N"}),
    )
    .unwrap();
    assert_eq!(id, CUST_1);
    assert_eq!(
        doc,
        json!({"legacy_acct_id": 1, "account_number": "100100-00001", "first_name": "Margaret",
               "last_name": "Henderson", "address": "742 Evergreen Terrace", "city": "Springfield",
               "state": "IL", "zip": "62704", "phone": "217-555-0101",
               "email": "mhenderson@email.com", "rate_class": "residential",
               "service_type": "electric", "status": "active", "connected_date": "1998-03-15",
               "budget_billing": true, "paperless": false})
    );
    // every value as text (a VARCHAR-typed feed), CHAR padding, empty strings, no phone
    let (id, doc) = clean(
        "customers",
        "cust_acct",
        json!({"acct_id": "2", "acct_num": "200200-00002", "cust_nm_first": "KENJI   ",
               "cust_nm_last": "NAKAMURA", "addr_ln1": "1200 INDUSTRIAL PKWY", "addr_ln2": "SUITE 300",
               "addr_city": "SPRINGFIELD", "addr_st": "IL", "addr_zip": "62707",
               "phone_num": null, "email_addr": "", "rt_cd": "COM", "svc_type": "B",
               "stat_cd": "A", "conn_dt": "20050601", "disc_dt": "", "budget_flg": "N",
               "paperless_flg": "Y"}),
    )
    .unwrap();
    assert_eq!(id, CUST_2);
    assert_eq!(
        doc,
        json!({"legacy_acct_id": 2, "account_number": "200200-00002", "first_name": "Kenji",
               "last_name": "Nakamura", "address": "1200 Industrial Pkwy, Suite 300",
               "city": "Springfield", "state": "IL", "zip": "62707", "rate_class": "commercial",
               "service_type": "both", "status": "active", "connected_date": "2005-06-01",
               "budget_billing": false, "paperless": true})
    );
    // no email, an empty LN2, flags absent from the row
    let (_, doc) = clean(
        "customers",
        "cust_acct",
        json!({"acct_id": 3, "acct_num": "100100-00003", "cust_nm_first": "SIOBHAN",
               "cust_nm_last": "OCONNELL", "addr_ln1": "88 OAK STREET", "addr_ln2": "",
               "addr_city": "SPRINGFIELD", "addr_st": "IL", "addr_zip": "62702",
               "rt_cd": "RES", "svc_type": "E", "stat_cd": "S", "conn_dt": "20120910"}),
    )
    .unwrap();
    assert_eq!(
        doc,
        json!({"legacy_acct_id": 3, "account_number": "100100-00003", "first_name": "Siobhan",
               "last_name": "Oconnell", "address": "88 Oak Street", "city": "Springfield",
               "state": "IL", "zip": "62702", "rate_class": "residential",
               "service_type": "electric", "status": "suspended", "connected_date": "2012-09-10",
               "budget_billing": false, "paperless": false})
    );
    // a closed account with a disconnection date; LN1 null with LN2 set is LN2 alone
    // (not §14.2.3's "null, …" quirk); a name with an apostrophe and a hyphen
    let (_, doc) = clean(
        "customers",
        "cust_acct",
        json!({"acct_id": 4, "acct_num": "300300-00004", "cust_nm_first": "JAMES",
               "cust_nm_last": "O'NEIL-SMITH", "addr_ln1": null, "addr_ln2": "5000 RIVER ROAD",
               "addr_city": null, "addr_st": "IL", "addr_zip": "62711", "rt_cd": "IND",
               "svc_type": "G", "stat_cd": "C", "conn_dt": "20010220", "disc_dt": "20240131",
               "budget_flg": "N", "paperless_flg": "Y"}),
    )
    .unwrap();
    assert_eq!(
        doc,
        json!({"legacy_acct_id": 4, "account_number": "300300-00004", "first_name": "James",
               "last_name": "O'Neil-Smith", "address": "5000 River Road", "state": "IL",
               "zip": "62711", "rate_class": "industrial", "service_type": "gas",
               "status": "closed", "connected_date": "2001-02-20",
               "disconnected_date": "2024-01-31", "budget_billing": false, "paperless": true})
    );
}

#[test]
fn meter_readings_subtract_and_refer_to_their_customer() {
    let typed = json!({"rdng_id": 2, "acct_id": 1, "mtr_num": "M-10042", "rdng_dt": "20250801",
                       "rdng_val": 13580, "prev_rdng_val": 12450, "rdng_type": "A",
                       "est_flg": "N", "billed_flg": "Y"});
    let text = json!({"rdng_id": "2", "acct_id": "1", "mtr_num": "M-10042", "rdng_dt": "20250801",
                      "rdng_val": "13580", "prev_rdng_val": "12450", "rdng_type": "A",
                      "est_flg": "N", "billed_flg": "Y"});
    let expected = json!({"customer_id": CUST_1, "meter_number": "M-10042",
                          "reading_date": "2025-08-01", "reading_value": 13580,
                          "previous_value": 12450, "kwh_used": 1130, "reading_type": "actual",
                          "estimated": false, "billed": true});
    for row in [typed, text] {
        let (id, doc) = clean("meter_readings", "mtr_rdng", row).unwrap();
        assert_eq!(id, RDNG_2);
        assert_eq!(doc, expected);
    }
    // an estimate; no previous reading: neither previous_value nor kwh_used
    let (_, doc) = clean(
        "meter_readings",
        "mtr_rdng",
        json!({"rdng_id": 9, "acct_id": 3, "mtr_num": "M-10098", "rdng_dt": "20250901",
               "rdng_val": 5400, "prev_rdng_val": null, "rdng_type": "E", "est_flg": "Y",
               "billed_flg": "N"}),
    )
    .unwrap();
    assert_eq!(doc["reading_type"], "estimated");
    assert_eq!(doc["estimated"], true);
    assert_eq!(doc["reading_value"], 5400);
    assert!(doc.get("previous_value").is_none() && doc.get("kwh_used").is_none());
    // RDNG_VAL missing: 0 (§14.2.3), and kwh_used left out
    let (_, doc) = clean(
        "meter_readings",
        "mtr_rdng",
        json!({"rdng_id": 10, "acct_id": 3, "mtr_num": "M-10098", "rdng_dt": "20250901",
               "prev_rdng_val": 100, "rdng_type": "C"}),
    )
    .unwrap();
    assert_eq!(doc["reading_value"], 0);
    assert_eq!(doc["previous_value"], 100);
    assert_eq!(doc["reading_type"], "customer");
    assert!(doc.get("kwh_used").is_none());
    // a non-numeric reading is a dead letter naming the field, column and value
    let e = clean(
        "meter_readings",
        "mtr_rdng",
        json!({"rdng_id": 11, "acct_id": 3, "mtr_num": "M-1", "rdng_dt": "20250901",
               "rdng_val": "12x", "prev_rdng_val": 1, "rdng_type": "A"}),
    )
    .unwrap_err();
    assert!(
        e.contains("`reading_value`") && e.contains("`rdng_val`") && e.contains("\"12x\""),
        "{e}"
    );
}

#[test]
fn bills_are_in_dollars() {
    let (id, doc) = clean(
        "bills",
        "bill_hdr",
        json!({"bill_id": 1, "acct_id": 1, "bill_dt": "20250615", "due_dt": "20250715",
               "bill_prd_from": "20250601", "bill_prd_to": "20250630", "tot_amt": 9840,
               "kwh_used": 950, "stat_cd": "P", "late_flg": "N"}),
    )
    .unwrap();
    assert_eq!(id, BILL_1);
    assert_eq!(
        doc,
        json!({"customer_id": CUST_1, "legacy_bill_id": 1, "bill_date": "2025-06-15",
               "due_date": "2025-07-15", "period_from": "2025-06-01", "period_to": "2025-06-30",
               "total_amount": 98.4, "kwh_used": 950, "status": "paid", "late": false})
    );
    assert_eq!(serde_json::to_string(&doc["total_amount"]).unwrap(), "98.4");
    // text-typed numbers; 420.00 is a JSON float
    let (_, doc) = clean(
        "bills",
        "bill_hdr",
        json!({"bill_id": "4", "acct_id": "2", "bill_dt": "20250615", "due_dt": "20250715",
               "bill_prd_from": "20250601", "bill_prd_to": "20250630", "tot_amt": "42000",
               "kwh_used": "4200", "stat_cd": "P", "late_flg": "N"}),
    )
    .unwrap();
    assert_eq!(doc["customer_id"], CUST_2);
    assert_eq!(doc["legacy_bill_id"], 4);
    assert_eq!(doc["kwh_used"], 4200);
    assert_eq!(
        serde_json::to_string(&doc["total_amount"]).unwrap(),
        "420.0"
    );
    for (cents, dollars, code, status, late, flag) in [
        ("8300", "83.0", "D", "delinquent", true, "Y"),
        ("7250", "72.5", "D", "delinquent", true, "Y"),
        ("106200", "1062.0", "O", "open", false, "N"),
        ("20220", "202.2", "X", "cancelled", false, "N"),
    ] {
        let (_, doc) = clean(
            "bills",
            "bill_hdr",
            json!({"bill_id": 7, "acct_id": 3, "bill_dt": "20250615", "due_dt": "20250715",
                   "bill_prd_from": "20250601", "bill_prd_to": "20250630", "tot_amt": cents,
                   "kwh_used": 800, "stat_cd": code, "late_flg": flag}),
        )
        .unwrap();
        assert_eq!(
            serde_json::to_string(&doc["total_amount"]).unwrap(),
            dollars
        );
        assert_eq!(doc["status"], status);
        assert_eq!(doc["late"], late);
    }
    // cents that are not a number, or not whole
    for (bad, says) in [("98,40", "not a number"), ("98.5", "not a whole number")] {
        let e = clean(
            "bills",
            "bill_hdr",
            json!({"bill_id": 1, "acct_id": 1, "tot_amt": bad, "kwh_used": 1, "stat_cd": "P"}),
        )
        .unwrap_err();
        assert!(
            e.contains("`total_amount`")
                && e.contains("`tot_amt`")
                && e.contains(bad)
                && e.contains(says),
            "{e}"
        );
    }
}

#[test]
fn payments_refer_to_their_bill_when_they_have_one() {
    let (id, doc) = clean(
        "payments",
        "pymt_hist",
        json!({"pymt_id": 1, "acct_id": 1, "bill_id": 1, "pymt_dt": "20250702",
               "pymt_amt": 9840, "pymt_mthd": "W", "conf_num": "WEB-20250702-001",
               "stat_cd": "S"}),
    )
    .unwrap();
    assert_eq!(id, PYMT_1);
    assert_eq!(
        doc,
        json!({"customer_id": CUST_1, "legacy_bill_id": 1, "bill_id": BILL_1,
               "payment_date": "2025-07-02", "amount": 98.4, "method": "web",
               "confirmation_number": "WEB-20250702-001", "status": "success"})
    );
    // the seed's payment 5: bill 10, 980.00 by check
    let (id, doc) = clean(
        "payments",
        "pymt_hist",
        json!({"pymt_id": "5", "acct_id": "4", "bill_id": "10", "pymt_dt": "20250630",
               "pymt_amt": "98000", "pymt_mthd": "K", "conf_num": "CHK-004872",
               "stat_cd": "S"}),
    )
    .unwrap();
    assert_eq!(id, PYMT_5);
    assert_eq!(doc["bill_id"], BILL_10);
    assert_eq!(doc["legacy_bill_id"], 10);
    assert_eq!(serde_json::to_string(&doc["amount"]).unwrap(), "980.0");
    assert_eq!(doc["method"], "check");
    // no bill, no confirmation, a null status (the column's default 'S' stands in)
    let (_, doc) = clean(
        "payments",
        "pymt_hist",
        json!({"pymt_id": 6, "acct_id": 2, "bill_id": null, "pymt_dt": "20250725",
               "pymt_amt": 47000, "pymt_mthd": "E", "conf_num": null, "stat_cd": null}),
    )
    .unwrap();
    assert_eq!(
        doc,
        json!({"customer_id": CUST_2, "payment_date": "2025-07-25", "amount": 470.0,
               "method": "electronic", "status": "success"})
    );
    for (code, method) in [("C", "cash"), ("P", "phone")] {
        let (_, doc) = clean(
            "payments",
            "pymt_hist",
            json!({"pymt_id": 7, "acct_id": 2, "pymt_dt": "20250725", "pymt_amt": 1,
                   "pymt_mthd": code, "stat_cd": "R"}),
        )
        .unwrap();
        assert_eq!(
            (doc["method"].as_str(), doc["status"].as_str()),
            (Some(method), Some("refunded"))
        );
        assert_eq!(serde_json::to_string(&doc["amount"]).unwrap(), "0.01");
    }
}
