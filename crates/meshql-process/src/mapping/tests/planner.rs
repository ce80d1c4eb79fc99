//! Mappings run in the [`TransformPlanner`]: puts, tombstones and dead letters, and `lookup`s
//! that wait for their document.

use super::*;
use crate::plan::{PlanIo, Planner};
use crate::transform::TransformPlanner;
use meshql_core::{OutputWrite, StoreError};
use serde_json::json;
use std::collections::HashMap;

struct NoIo;

#[async_trait::async_trait]
impl PlanIo for NoIo {
    async fn state(&self, _: &[String]) -> Result<HashMap<String, String>, StoreError> {
        Ok(HashMap::new())
    }
    async fn group(&self, _: &str) -> Result<Vec<(String, String)>, StoreError> {
        Ok(Vec::new())
    }
    async fn lookup(&self, _: &str, _: &str) -> Result<Option<Map<String, Value>>, StoreError> {
        Ok(None)
    }
}

#[tokio::test]
async fn the_planner_writes_puts_tombstones_and_dead_letters() {
    let planner = plan("customers").planner();
    let row = |id: i64, rt: &str| {
        json!({"acct_id": id, "acct_num": "n", "cust_nm_first": "ANN", "rt_cd": rt,
               "svc_type": "E", "stat_cd": "A"})
    };
    let inputs = vec![
        input("cust_acct", ChangeOp::Create, row(1, "RES")),
        input("cust_acct", ChangeOp::Update, row(1, "BAD")),
        input("cust_acct", ChangeOp::Delete, json!({"acct_id": "2"})),
    ];
    let outcome = planner.plan(&NoIo, &inputs).await.unwrap();
    assert_eq!(outcome.dead.len(), 1);
    assert_eq!(outcome.dead[0].0, 1);
    assert!(outcome.dead[0].1.contains("\"BAD\""), "{:?}", outcome.dead);
    assert_eq!(outcome.writes.len(), 2);
    match &outcome.writes[0] {
        (OutputWrite::Put { id, payload }, from) => {
            assert_eq!((id.as_str(), from.as_slice()), (CUST_1, &[0][..]));
            let doc: Value = serde_json::from_str(payload).unwrap();
            assert_eq!(doc["first_name"], "Ann");
        }
        other => panic!("{other:?}"),
    }
    match &outcome.writes[1] {
        (OutputWrite::Delete { id }, from) => {
            assert_eq!((id.as_str(), from.as_slice()), (CUST_2, &[2][..]))
        }
        other => panic!("{other:?}"),
    }
}

/// A hen's document appears after its first lookup (another processor writes it).
struct LateHen {
    asked: std::sync::atomic::AtomicUsize,
    appears_after: usize,
}

#[async_trait::async_trait]
impl PlanIo for LateHen {
    async fn state(&self, _: &[String]) -> Result<HashMap<String, String>, StoreError> {
        Ok(HashMap::new())
    }
    async fn group(&self, _: &str) -> Result<Vec<(String, String)>, StoreError> {
        Ok(Vec::new())
    }
    async fn lookup(
        &self,
        entity: &str,
        id: &str,
    ) -> Result<Option<Map<String, Value>>, StoreError> {
        let n = self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let hen = legacy_id("zequi_hen", &[&json!("100"), &json!("H1")]).unwrap();
        Ok(
            (entity == "hen" && id == hen && n >= self.appears_after).then(|| {
                json!({"coop_id": "coop-of-h1"})
                    .as_object()
                    .unwrap()
                    .clone()
            }),
        )
    }
}

fn lay_reports(wait_ms: u64) -> TransformPlanner {
    let hen = EntityInfo {
        name: "hen".into(),
        fields: Some(vec!["coop_id".into(), "name".into()]),
        properties: None,
        required: Vec::new(),
    };
    let lay = EntityInfo {
        name: "lay_report".into(),
        fields: None,
        properties: None,
        required: Vec::new(),
    };
    let spec = compile(
        "lay_reports",
        &json!({"inputs": ["zafru_lege"], "output": "lay_report", "mapping": {
            "key": ["mandt", "aufnr"],
            "fields": {
                "hen_id": {"reference": "zequi_hen", "key": ["mandt", "equnr"]},
                "coop_id": {"lookup": "hen", "id": {"reference": "zequi_hen", "key": ["mandt", "equnr"]},
                            "field": "coop_id", "wait_ms": wait_ms},
                "source_id": {"reference": "zfarm_mstr", "key": ["mandt", {"value": "1000"}]}
            }}}),
        &[hen, lay],
        true,
    )
    .unwrap();
    TransformPlanner {
        spec,
        skip_unchanged: false,
    }
}

#[tokio::test]
async fn a_lookup_waits_for_its_document_then_dead_letters_the_row() {
    let row = |equnr: &str| {
        input(
            "zafru_lege",
            ChangeOp::Create,
            json!({"mandt": "100", "aufnr": "A1", "equnr": equnr}),
        )
    };
    // the hen appears on the third look: the row waits for it
    let io = LateHen {
        asked: Default::default(),
        appears_after: 2,
    };
    let outcome = lay_reports(5_000).plan(&io, &[row("H1")]).await.unwrap();
    assert!(outcome.dead.is_empty(), "{:?}", outcome.dead);
    let (OutputWrite::Put { payload, .. }, _) = &outcome.writes[0] else {
        panic!("{:?}", outcome.writes)
    };
    let doc: Value = serde_json::from_str(payload).unwrap();
    assert_eq!(doc["coop_id"], "coop-of-h1");
    assert_eq!(
        doc["hen_id"],
        legacy_id("zequi_hen", &[&json!("100"), &json!("H1")]).unwrap()
    );
    // a constant in a reference's key
    assert_eq!(
        doc["source_id"],
        legacy_id("zfarm_mstr", &[&json!("100"), &json!("1000")]).unwrap()
    );
    assert_eq!(io.asked.load(std::sync::atomic::Ordering::SeqCst), 3);
    // a hen that never appears: the row waits `wait_ms`, then is a dead letter naming it
    let started = std::time::Instant::now();
    let outcome = lay_reports(100)
        .plan(&NoIo, &[row("H1"), row("H2")])
        .await
        .unwrap();
    assert!(started.elapsed() >= std::time::Duration::from_millis(100));
    assert_eq!(outcome.dead.len(), 2);
    assert!(
        outcome.dead[0].1.contains("`hen`") && outcome.dead[0].1.contains("does not exist"),
        "{:?}",
        outcome.dead
    );
    // a delete reads nothing
    let outcome = lay_reports(60_000)
        .plan(
            &NoIo,
            &[input(
                "zafru_lege",
                ChangeOp::Delete,
                json!({"mandt": "100", "aufnr": "A1"}),
            )],
        )
        .await
        .unwrap();
    assert!(matches!(outcome.writes[0].0, OutputWrite::Delete { .. }));
}
