//! Query operators and sorting (issue 12 §1): the same five documents, the same templates
//! and the same answers on every backend. Each case prepares the store with
//! [`operator_templates`] itself (so that backends create their indexes and generated
//! columns for the fields these templates use) before writing.

use meshql_core::{BatchSearch, BoundArgs, DynStore, NewDocument, QueryTemplate, ReadContext};
use meshql_core::{Search, TokenFilter, WriteContext};
use serde_json::{json, Map, Value};

const ALL: TokenFilter = TokenFilter::All;
const W: WriteContext = WriteContext::SYSTEM;

fn q(source: &str) -> QueryTemplate {
    QueryTemplate::filter(source).expect("a valid operator template")
}

fn sorted(source: &str, sort: &str) -> QueryTemplate {
    q(source).with_sort(sort).expect("a valid sort")
}

/// Every template the operator cases use, one per name (parsed once per call: ids differ
/// between calls, which is fine for preparing).
pub fn operator_templates() -> Vec<QueryTemplate> {
    TEMPLATES
        .iter()
        .map(|(_, source, sort)| match sort {
            Some(s) => sorted(source, s),
            None => q(source),
        })
        .collect()
}

const TEMPLATES: &[(&str, &str, Option<&str>)] = &[
    (
        "range",
        r#"{"payload.price": {"$gte": "{{min}}", "$lt": "{{max}}"}}"#,
        None,
    ),
    ("gt", r#"{"payload.price": {"$gt": "{{x}}"}}"#, None),
    ("lte_literal", r#"{"payload.price": {"$lte": 3}}"#, None),
    ("ne", r#"{"payload.color": {"$ne": "{{c}}"}}"#, None),
    ("in_arg", r#"{"payload.name": {"$in": "{{names}}"}}"#, None),
    (
        "in_items",
        r#"{"payload.tag": {"$in": ["veg", "{{t}}"]}}"#,
        None,
    ),
    (
        "nin",
        r#"{"payload.color": {"$nin": ["red", "purple"]}}"#,
        None,
    ),
    (
        "regex_i",
        r#"{"payload.tag": {"$regex": "{{p}}", "$options": "i"}}"#,
        None,
    ),
    ("regex", r#"{"payload.tag": {"$regex": "{{p}}"}}"#, None),
    (
        "regex_price",
        r#"{"payload.price": {"$regex": "{{p}}"}}"#,
        None,
    ),
    ("exists", r#"{"payload.color": {"$exists": true}}"#, None),
    ("missing", r#"{"payload.color": {"$exists": false}}"#, None),
    (
        "or",
        r#"{"$or": [{"payload.price": {"$lt": 3}}, {"payload.tag": "veg"}]}"#,
        None,
    ),
    (
        "and_or",
        r#"{"$and": [{"payload.price": {"$gte": 3}}, {"$or": [{"payload.color": "red"}, {"payload.color": {"$exists": false}}]}]}"#,
        None,
    ),
    (
        "eq_and_ne",
        r#"{"payload.kind": "{{kind}}", "payload.name": {"$ne": "apple"}}"#,
        None,
    ),
    ("id_in", r#"{"id": {"$in": "{{ids}}"}}"#, None),
    ("id_gt", r#"{"id": {"$gt": "{{id}}"}}"#, None),
    ("by_price_desc", "{}", Some(r#"{"payload.price": -1}"#)),
    ("by_price", "{}", Some(r#"{"payload.price": 1}"#)),
    (
        "by_color_name",
        "{}",
        Some(r#"{"payload.color": 1, "payload.name": -1}"#),
    ),
    (
        "min_by_price_desc",
        r#"{"payload.price": {"$gte": "{{min}}"}}"#,
        Some(r#"{"payload.price": -1}"#),
    ),
    (
        "in_numbers",
        r#"{"payload.price": {"$in": [5, 2.5, 99]}}"#,
        None,
    ),
    ("ne_number", r#"{"payload.price": {"$ne": 5}}"#, None),
    ("nested_gte", r#"{"payload.dims.w": {"$gte": 2}}"#, None),
    (
        "nested_exists",
        r#"{"payload.dims.w": {"$exists": true}}"#,
        None,
    ),
    ("by_width", "{}", Some(r#"{"payload.dims.w": 1}"#)),
    (
        "code",
        r#"{"payload.code": {"$regex": "^[A-C]-[0-9]+\\.[0-9]$"}}"#,
        None,
    ),
    (
        "parent_tagged",
        r#"{"payload.parent": "{{id}}", "payload.price": {"$gt": 2}, "payload.tag": {"$regex": "R", "$options": "i"}, "payload.name": {"$nin": ["{{other}}", "zzz"]}}"#,
        None,
    ),
    (
        "parent_pricey",
        r#"{"payload.parent": "{{id}}", "payload.price": {"$gt": 2}}"#,
        Some(r#"{"payload.price": -1}"#),
    ),
];

fn template(name: &str) -> QueryTemplate {
    let (_, source, sort) = TEMPLATES
        .iter()
        .find(|(n, _, _)| *n == name)
        .unwrap_or_else(|| panic!("no template {name}"));
    match sort {
        Some(s) => sorted(source, s),
        None => q(source),
    }
}

fn map(v: Value) -> Map<String, Value> {
    v.as_object().expect("object").clone()
}

/// Five things: numbers (integer and float) and one price that is a string, a null color
/// and missing ones, tags in several cases.
async fn seed(store: &DynStore) {
    store
        .prepare(&operator_templates())
        .await
        .expect("prepare the operator templates");
    let docs = [
        (
            "id-a",
            json!({"name": "apple", "price": 5, "tag": "Fruit", "color": "red", "kind": "f", "parent": "p1", "dims": {"w": 3}, "code": "A-1.5"}),
        ),
        (
            "id-b",
            json!({"name": "banana", "price": 2.5, "tag": "fruit", "color": null, "kind": "f", "parent": "p1", "code": "B-22"}),
        ),
        (
            "id-c",
            json!({"name": "cherry", "price": 12, "tag": "FRUIT-red", "kind": "f", "parent": "p2", "dims": {"w": 1}, "code": "C-3x5"}),
        ),
        (
            "id-d",
            json!({"name": "date", "price": "7", "tag": "dried", "kind": "f", "parent": "p1"}),
        ),
        (
            "id-e",
            json!({"name": "eggplant", "price": 3, "tag": "veg", "color": "purple", "kind": "v", "parent": "p1"}),
        ),
    ];
    for (id, payload) in docs {
        store
            .create(NewDocument::with_id(id, map(payload)), &W)
            .await
            .expect("create");
    }
}

/// The names a search answers, in order.
async fn find(store: &DynStore, name: &str, args: Value, limit: Option<usize>) -> Vec<String> {
    find_with(store, &template(name), args, limit, None).await
}

async fn find_with(
    store: &DynStore,
    t: &QueryTemplate,
    args: Value,
    limit: Option<usize>,
    at: Option<meshql_core::Millis>,
) -> Vec<String> {
    let args: BoundArgs = map(args);
    let rows = store
        .find(&Search::new(t, &args, limit), &ReadContext::new(&ALL, at))
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", t.source));
    rows.iter().map(|r| name_of(&r.payload)).collect()
}

fn name_of(payload: &str) -> String {
    let v: Value = serde_json::from_str(payload).expect("JSON payload");
    v["name"].as_str().unwrap_or_default().to_owned()
}

/// Unordered answers, sorted for comparison.
fn set(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

fn names(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

pub async fn comparisons_compare_numbers_with_numbers_and_strings_with_strings(store: DynStore) {
    seed(&store).await;
    assert_eq!(
        set(find(&store, "range", json!({"min": 3, "max": 12}), None).await),
        names(&["apple", "eggplant"]),
        "$gte/$lt: 12 is excluded, the string \"7\" is not a number"
    );
    assert_eq!(
        set(find(&store, "range", json!({"min": 2.5, "max": 5}), None).await),
        names(&["banana", "eggplant"]),
        "a float bound compares numerically with integers and floats"
    );
    assert_eq!(
        set(find(&store, "range", json!({"min": "1", "max": "9"}), None).await),
        names(&["date"]),
        "a string bound compares with strings only"
    );
    assert_eq!(
        find(&store, "gt", json!({"x": 5}), None).await,
        names(&["cherry"])
    );
    assert!(
        find(&store, "gt", json!({}), None).await.is_empty(),
        "a missing bound matches nothing"
    );
    assert!(
        find(&store, "gt", json!({"x": true}), None)
            .await
            .is_empty(),
        "a boolean bound matches nothing"
    );
    assert_eq!(
        set(find(&store, "lte_literal", json!({}), None).await),
        names(&["banana", "eggplant"])
    );
}

pub async fn ne_and_nin_match_documents_without_the_field(store: DynStore) {
    seed(&store).await;
    assert_eq!(
        set(find(&store, "ne", json!({"c": "red"}), None).await),
        names(&["banana", "cherry", "date", "eggplant"])
    );
    assert_eq!(
        set(find(&store, "nin", json!({}), None).await),
        names(&["banana", "cherry", "date"])
    );
    assert_eq!(
        set(find(&store, "eq_and_ne", json!({"kind": "f"}), None).await),
        names(&["banana", "cherry", "date"]),
        "an equality and an operator in one template"
    );
}

pub async fn in_binds_a_list_argument_or_template_items(store: DynStore) {
    seed(&store).await;
    assert_eq!(
        set(find(
            &store,
            "in_arg",
            json!({"names": ["apple", "cherry", "zzz"]}),
            None
        )
        .await),
        names(&["apple", "cherry"])
    );
    assert_eq!(
        find(&store, "in_arg", json!({"names": "date"}), None).await,
        names(&["date"]),
        "a single value is a list of one"
    );
    assert!(find(&store, "in_arg", json!({"names": []}), None)
        .await
        .is_empty());
    assert!(find(&store, "in_arg", json!({}), None).await.is_empty());
    assert_eq!(
        set(find(&store, "in_items", json!({"t": "dried"}), None).await),
        names(&["date", "eggplant"])
    );
    assert_eq!(
        set(find(&store, "id_in", json!({"ids": ["id-b", "id-e"]}), None).await),
        names(&["banana", "eggplant"])
    );
    assert_eq!(
        set(find(&store, "id_gt", json!({"id": "id-c"}), None).await),
        names(&["date", "eggplant"])
    );
}

pub async fn regex_matches_strings_with_and_without_case(store: DynStore) {
    seed(&store).await;
    assert_eq!(
        set(find(&store, "regex_i", json!({"p": "fruit"}), None).await),
        names(&["apple", "banana", "cherry"]),
        "$options i"
    );
    assert_eq!(
        find(&store, "regex", json!({"p": "^f"}), None).await,
        names(&["banana"]),
        "case-sensitive, anchored"
    );
    assert_eq!(
        set(find(&store, "regex", json!({"p": "d$"}), None).await),
        names(&["cherry", "date"])
    );
    assert_eq!(
        set(find(&store, "regex_i", json!({"p": "^(veg|dr[a-z]+)$"}), None).await),
        names(&["date", "eggplant"])
    );
    assert_eq!(
        find(&store, "regex_i", json!({"p": "t-R"}), None).await,
        names(&["cherry"]),
        "a substring anywhere"
    );
    assert_eq!(
        find(&store, "regex_price", json!({"p": "7"}), None).await,
        names(&["date"]),
        "numbers never match a pattern"
    );
    assert!(find(&store, "regex", json!({}), None).await.is_empty());
    // a pattern outside the portable subset is refused, not run
    let err = store
        .find(
            &Search::new(&template("regex"), &map(json!({"p": "(?i)x"})), None),
            &ReadContext::new(&ALL, None),
        )
        .await;
    assert!(err.is_err(), "a non-portable pattern is an error");
}

pub async fn exists_tells_present_from_missing(store: DynStore) {
    seed(&store).await;
    assert_eq!(
        set(find(&store, "exists", json!({}), None).await),
        names(&["apple", "banana", "eggplant"]),
        "a null value is present"
    );
    assert_eq!(
        set(find(&store, "missing", json!({}), None).await),
        names(&["cherry", "date"])
    );
}

pub async fn and_or_combine(store: DynStore) {
    seed(&store).await;
    assert_eq!(
        set(find(&store, "or", json!({}), None).await),
        names(&["banana", "eggplant"])
    );
    assert_eq!(
        set(find(&store, "and_or", json!({}), None).await),
        names(&["apple", "cherry"])
    );
}

pub async fn sorting_orders_by_type_then_value(store: DynStore) {
    seed(&store).await;
    assert_eq!(
        find(&store, "by_price", json!({}), None).await,
        names(&["banana", "eggplant", "apple", "cherry", "date"]),
        "numbers before strings"
    );
    assert_eq!(
        find(&store, "by_price_desc", json!({}), None).await,
        names(&["date", "cherry", "apple", "eggplant", "banana"])
    );
    assert_eq!(
        find(&store, "by_price", json!({}), Some(2)).await,
        names(&["banana", "eggplant"]),
        "limit applies after sorting"
    );
    assert_eq!(
        find(&store, "by_color_name", json!({}), None).await,
        names(&["date", "cherry", "banana", "eggplant", "apple"]),
        "missing and null first, equal; then the second key"
    );
    assert_eq!(
        find(&store, "min_by_price_desc", json!({"min": 3}), Some(2)).await,
        names(&["cherry", "apple"]),
        "filter, sort, limit"
    );
}

pub async fn operators_apply_to_the_visible_version(store: DynStore) {
    seed(&store).await;
    let t = template("range");
    let before = meshql_core::time::now_millis();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    store
        .update(
            "id-a",
            NewDocument::new(map(json!({"name": "apple", "price": 20, "tag": "Fruit", "color": "red", "kind": "f", "parent": "p1"}))),
            &W,
        )
        .await
        .expect("update")
        .expect("apple exists");
    store.remove("id-e", &W).await.expect("remove");
    let range = json!({"min": 3, "max": 12});
    assert!(
        find_with(&store, &t, range.clone(), None, None)
            .await
            .is_empty(),
        "latest, then filter: apple's old price does not match, eggplant is deleted"
    );
    assert_eq!(
        set(find_with(&store, &t, range, None, Some(before)).await),
        names(&["apple", "eggplant"]),
        "as of before the changes"
    );
    assert_eq!(
        find_with(
            &store,
            &template("by_price_desc"),
            json!({}),
            Some(2),
            Some(before)
        )
        .await,
        names(&["date", "cherry"]),
        "sorted as of a time"
    );
}

pub async fn batches_filter_and_sort_per_key(store: DynStore) {
    seed(&store).await;
    let t = template("parent_pricey");
    let rows = store
        .find_batch(
            &BatchSearch::new(&t, "id", &["p1".into(), "p2".into(), "p3".into()]),
            &ReadContext::new(&ALL, None),
        )
        .await
        .expect("batch");
    let of = |key: &str| -> Vec<String> {
        rows.iter()
            .filter(|(k, _)| k == key)
            .map(|(_, r)| name_of(&r.payload))
            .collect()
    };
    assert_eq!(of("p1"), names(&["apple", "eggplant", "banana"]));
    assert_eq!(of("p2"), names(&["cherry"]));
    assert!(of("p3").is_empty());
}

pub async fn numbers_nested_fields_and_escapes_agree(store: DynStore) {
    seed(&store).await;
    assert_eq!(
        set(find(&store, "in_numbers", json!({}), None).await),
        names(&["apple", "banana"]),
        "$in with integer and float literals"
    );
    assert_eq!(
        set(find(&store, "ne_number", json!({}), None).await),
        names(&["banana", "cherry", "date", "eggplant"])
    );
    assert_eq!(
        find(&store, "nested_gte", json!({}), None).await,
        names(&["apple"])
    );
    assert_eq!(
        set(find(&store, "nested_exists", json!({}), None).await),
        names(&["apple", "cherry"])
    );
    assert_eq!(
        find(&store, "by_width", json!({}), None).await,
        names(&["banana", "date", "eggplant", "cherry", "apple"]),
        "a nested sort key; documents without it first, in creation order"
    );
    assert_eq!(
        find(&store, "code", json!({}), None).await,
        names(&["apple"]),
        "a class, a quantifier and an escaped dot"
    );
}

/// A search and its relationships with operator templates answer in one nested statement
/// (where the backend has one) exactly what they answer level by level.
pub async fn nested_operators_match_level_by_level(store: DynStore) {
    seed(&store).await;
    for (id, name) in [("p1", "P1"), ("p2", "P2")] {
        store
            .create(
                NewDocument::with_id(id, map(json!({"name": name, "price": 1, "tag": "parent"}))),
                &W,
            )
            .await
            .expect("create a parent");
    }
    let tree = vec![meshql_core::Nested {
        key_field: "id".to_owned(),
        vector: true,
        store: store.clone(),
        template: template("parent_tagged"),
        fields: None,
        children: Vec::new(),
    }];
    let root = template("in_arg");
    let args = map(json!({"names": ["P1", "P2"]}));
    let expected =
        crate::nested::level_by_level(&store, &root, &args, &tree, &ALL, None, None).await;
    let kids = |i: usize| -> Vec<String> {
        expected[i].children[0]
            .iter()
            .map(|r| r.payload["name"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    assert_eq!(expected.len(), 2);
    // p1: apple (Fruit, 5), banana (fruit, 2.5); not date (a string price), not eggplant
    // (veg: no "r")
    assert_eq!(kids(0), names(&["apple", "banana"]));
    // p2: cherry (FRUIT-red, 12)
    assert_eq!(kids(1), names(&["cherry"]));
    let got = store
        .find_nested(
            &Search::new(&root, &args, None),
            &tree,
            &ReadContext::new(&ALL, None),
        )
        .await
        .expect("nested search");
    match got {
        Some(got) => assert_eq!(got, expected),
        None => assert!(
            store.relation().is_none(),
            "a joinable store answered level by level"
        ),
    }
}

/// Generates one `#[tokio::test]` per operator case (see [`crate::conformance_tests`]).
#[macro_export]
macro_rules! operator_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@cases $make;
            comparisons_compare_numbers_with_numbers_and_strings_with_strings,
            ne_and_nin_match_documents_without_the_field,
            in_binds_a_list_argument_or_template_items,
            regex_matches_strings_with_and_without_case,
            exists_tells_present_from_missing,
            and_or_combine,
            sorting_orders_by_type_then_value,
            operators_apply_to_the_visible_version,
            batches_filter_and_sort_per_key,
            numbers_nested_fields_and_escapes_agree,
            nested_operators_match_level_by_level
        );
    };
}
