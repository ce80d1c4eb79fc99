//! Checks made with the config: the documented config compiles, errors name their field, and
//! `lookup`s are checked against the service's entities.

use super::*;
use serde_json::json;

#[test]
fn the_documented_config_compiles() {
    for (name, table, key) in [
        ("customers", "cust_acct", "acct_id"),
        ("meter_readings", "mtr_rdng", "rdng_id"),
        ("bills", "bill_hdr", "bill_id"),
        ("payments", "pymt_hist", "pymt_id"),
    ] {
        let s = spec(name);
        assert_eq!(s.kind, "mapping");
        assert_eq!(s.inputs, vec![table.to_owned()]);
        // the lanes follow the legacy key
        assert_eq!(s.key.as_deref(), Some(key));
        assert_eq!(s.source.as_ref().map(|s| s.kind()), Some("kafka"));
        assert_eq!(plan(name).kind(), "mapping");
    }
    assert!(crate::kinds().contains(&"mapping"));
}

#[test]
fn config_errors_name_their_field() {
    let known = TRANSFORMATIONS.join(", ");
    for (field, decl, at, says) in [
        (
            "rate_class",
            json!({"decode": "rt_cd"}),
            "mapping.fields.rate_class.decode",
            "unknown transformation `decode`",
        ),
        (
            "rate_class",
            json!({"code": "rt_cd"}),
            "mapping.fields.rate_class.map",
            "needs its `map`",
        ),
        (
            "rate_class",
            json!({"code": "rt_cd", "map": {}}),
            "mapping.fields.rate_class.map",
            "at least one",
        ),
        (
            "rate_class",
            json!({"code": "rt_cd", "map": {"A": "a"}, "unknown": "skip"}),
            "mapping.fields.rate_class.unknown",
            "dead_letter",
        ),
        (
            "first_name",
            json!({"title": "a", "separator": ", "}),
            "mapping.fields.first_name.separator",
            "not an option of `title`",
        ),
        (
            "first_name",
            json!({"title": "a", "lower": "b"}),
            "mapping.fields.first_name",
            "one transformation",
        ),
        (
            "first_name",
            json!({"omit_empty": true}),
            "mapping.fields.first_name",
            "name a transformation",
        ),
        (
            "first_name",
            json!(3),
            "mapping.fields.first_name",
            "a column name",
        ),
        (
            "account_number",
            json!(" "),
            "mapping.fields.account_number",
            "a column name",
        ),
        (
            "connected_date",
            json!({"date": "conn_dt", "format": "YYYYMM"}),
            "mapping.fields.connected_date.format",
            "YYYY, MM and DD",
        ),
        (
            "connected_date",
            json!({"date": "conn_dt", "format": "YYYYMMDDHH"}),
            "mapping.fields.connected_date.format",
            "separators",
        ),
        (
            "connected_date",
            json!({"date": "conn_dt", "format": "YYYYMMDDDD"}),
            "mapping.fields.connected_date.format",
            "twice",
        ),
        (
            "address",
            json!({"concat": [{"title": "a", "omit_empty": true}]}),
            "mapping.fields.address.concat[0].omit_empty",
            "null and empty parts",
        ),
        (
            "address",
            json!({"concat": [{"titel": "a"}]}),
            "mapping.fields.address.concat[0].titel",
            "unknown transformation",
        ),
        (
            "address",
            json!({"concat": []}),
            "mapping.fields.address.concat",
            "at least one",
        ),
        (
            "legacy_acct_id",
            json!({"subtract": ["a"]}),
            "mapping.fields.legacy_acct_id.subtract",
            "at least 2",
        ),
        (
            "legacy_acct_id",
            json!({"reference": "cust_acct", "key": []}),
            "mapping.fields.legacy_acct_id.key",
            "at least 1",
        ),
        (
            "legacy_acct_id",
            json!({"reference": "cust_acct"}),
            "mapping.fields.legacy_acct_id.key",
            "the columns",
        ),
        (
            "legacy_acct_id",
            json!({"reference": ""}),
            "mapping.fields.legacy_acct_id.reference",
            "the table",
        ),
        (
            "budget_billing",
            json!({"flag": "b", "omit_empty": "yes"}),
            "mapping.fields.budget_billing.omit_empty",
            "true or false",
        ),
        (
            "nickname",
            json!("cust_nm_first"),
            "mapping.fields.nickname",
            "has no field `nickname`",
        ),
        ("id", json!("acct_id"), "mapping.fields.id", "derived"),
    ] {
        let e = error_of(customers_with(field, decl.clone()));
        assert_eq!(e.field.as_deref(), Some(at), "{decl}: {e:?}");
        assert!(e.message.contains(says), "{decl}: {e:?}");
    }
    let e = error_of(customers_with("rate_class", json!({"decode": "rt_cd"})));
    assert!(e.message.contains(&known), "{e:?}");

    let ok = customers();
    let with = |path: &[&str], v: Value| {
        let mut s = ok.clone();
        let mut at = &mut s;
        for p in &path[..path.len() - 1] {
            at = &mut at[*p];
        }
        at[path[path.len() - 1]] = v;
        compile("customers", &s, &entities(), true)
    };
    for (path, v, at, says) in [
        (
            &["mapping", "table"][..],
            json!("bill_hdr"),
            "mapping.table",
            "not one of the inputs",
        ),
        (
            &["mapping", "key"][..],
            json!([]),
            "mapping.key",
            "primary key",
        ),
        (
            &["mapping", "key"][..],
            json!(["acct_id", "acct_id"]),
            "mapping.key[1]",
            "twice",
        ),
        (
            &["mapping", "fields"][..],
            json!({}),
            "mapping.fields",
            "at least one",
        ),
        (
            &["output"][..],
            json!("client"),
            "output",
            "unknown entity `client`",
        ),
        (&["inputs"][..], json!([]), "inputs", "table"),
        (&["parallel"][..], json!(0), "parallel", "between"),
        (&["batch"][..], json!(0), "batch", "between"),
        (&["key"][..], json!(" "), "key", "orders"),
    ] {
        let e = error_of(with(path, v.clone()));
        assert_eq!(e.field.as_deref(), Some(at), "{path:?} = {v}: {e:?}");
        assert!(e.message.contains(says), "{path:?} = {v}: {e:?}");
    }
    // `table` may be left out with one input, not with two
    let mut s = ok.clone();
    s["mapping"].as_object_mut().unwrap().remove("table");
    assert!(compile("customers", &s, &entities(), true).is_ok());
    s["inputs"] = json!(["cust_acct", "bill_hdr"]);
    let e = error_of(compile("customers", &s, &entities(), true));
    assert_eq!(e.field.as_deref(), Some("mapping.table"));
    // an unknown setting of the block, and no block
    let e = error_of(with(&["mapping", "tables"], json!("x")));
    assert!(
        e.field.as_deref().unwrap_or("").starts_with("mapping"),
        "{e:?}"
    );
    let mut s = ok.clone();
    s.as_object_mut().unwrap().remove("mapping");
    assert!(error_of(compile("customers", &s, &entities(), true))
        .message
        .contains("mapping"));
    // without a source the inputs are the service's entities
    let e = crate::configure(
        "customers",
        "mapping",
        &ok,
        &entities(),
        std::path::Path::new("."),
    )
    .unwrap_err();
    assert_eq!(e.field.as_deref(), Some("inputs[0]"));
    assert!(e.message.contains("`source`"), "{e:?}");
}

#[test]
fn lookups_are_checked_with_the_config() {
    let hen = EntityInfo {
        name: "hen".into(),
        fields: Some(vec!["coop_id".into()]),
        properties: None,
        required: Vec::new(),
    };
    let out = EntityInfo {
        name: "lay_report".into(),
        fields: None,
        properties: None,
        required: Vec::new(),
    };
    let with = |decl: Value| {
        compile(
            "l",
            &json!({"inputs": ["t"], "output": "lay_report",
                    "mapping": {"key": ["k"], "fields": {"coop_id": decl}}}),
            &[hen.clone(), out.clone()],
            true,
        )
    };
    for (decl, at, says) in [
        (
            json!({"lookup": "hens", "id": "h", "field": "coop_id"}),
            "mapping.fields.coop_id.lookup",
            "unknown entity `hens`",
        ),
        (
            json!({"lookup": "hen", "id": "h", "field": "coops"}),
            "mapping.fields.coop_id.field",
            "no field `coops`",
        ),
        (
            json!({"lookup": "hen", "field": "coop_id"}),
            "mapping.fields.coop_id.id",
            "the document's id",
        ),
        (
            json!({"lookup": "hen", "id": "h"}),
            "mapping.fields.coop_id.field",
            "the field",
        ),
        (
            json!({"lookup": "hen", "id": "h", "field": "coop_id", "wait_ms": -1}),
            "mapping.fields.coop_id.wait_ms",
            "milliseconds",
        ),
        (
            json!({"concat": [{"lookup": "hen", "id": "h", "field": "coop_id"}]}),
            "mapping.fields.coop_id.concat[0].lookup",
            "a field of its own",
        ),
        (
            json!({"reference": "t", "key": [{"value": ""}]}),
            "mapping.fields.coop_id.key[0]",
            "constant",
        ),
        (
            json!({"reference": "t", "key": [{"values": "x"}]}),
            "mapping.fields.coop_id.key[0]",
            "column name",
        ),
    ] {
        let e = error_of(with(decl.clone()));
        assert_eq!(e.field.as_deref(), Some(at), "{decl}: {e:?}");
        assert!(e.message.contains(says), "{decl}: {e:?}");
    }
    assert!(with(json!({"lookup": "hen", "id": "h", "field": "id", "wait_ms": 0})).is_ok());
}
