//! Property tests for JSON bodies (issue 11, item 10): arbitrary JSON values (deep nesting,
//! big and small numbers, integers past 64 bits written as text, floats, unicode keys)
//! validated and created through an [`EntityService`] on a memory store answer `Ok` or an
//! error with a kind, never a panic; and what is accepted reads back equal, the envelope id
//! set under `"id"` (CONTRACT §4.2, `NewDocument::into_payload_text`).

use meshql_core::{ErrorKind, NoAuth};
use meshql_engine::{EngineError, EntityService, PayloadValidator, Session};
use meshql_store_memory::MemoryStore;
use proptest::prelude::*;
use serde_json::{json, Map, Value};
use std::sync::Arc;

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("name".to_owned()),
        Just("count".to_owned()),
        Just("tags".to_owned()),
        Just("nested".to_owned()),
        Just("id".to_owned()),
        Just(String::new()),
        Just("ключ 🔑".to_owned()),
        Just("a/b~c".to_owned()),
        "\\PC{0,6}",
    ]
}

fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)), // NaN and infinities become null
        Just(json!(f64::MIN_POSITIVE)),
        Just(json!(f64::MAX)),
        Just(json!(-0.0)),
        // integers past 64 bits, as a client would write them: parsed as floats
        any::<i128>().prop_map(|n| serde_json::from_str(&n.to_string()).unwrap()),
        Just(serde_json::from_str("18446744073709551616").unwrap()),
        Just(serde_json::from_str("1e308").unwrap()),
        Just(serde_json::from_str("1e-320").unwrap()),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number(),
        "\\PC{0,12}".prop_map(Value::String),
        Just(Value::String("\u{0}\"\\'{{x}}\u{feff}".to_owned())),
    ];
    leaf.prop_recursive(6, 48, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..5)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// A body: mostly objects (what a create takes), sometimes anything.
fn body() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => prop::collection::vec((key(), value()), 0..6)
            .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        1 => value(),
    ]
}

/// A JSON value nested `depth` levels deep (arrays and objects alternating).
fn deep(depth: usize) -> Value {
    let mut v = json!(1);
    for i in 0..depth {
        v = if i % 2 == 0 {
            json!([v])
        } else {
            json!({ "nested": v })
        };
    }
    json!({ "nested": v })
}

fn services() -> Vec<EntityService> {
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "count": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "integer"}},
            "nested": {
                "type": ["object", "array", "integer"],
                "properties": {"count": {"type": "integer"}},
                "items": {"type": ["integer", "object", "array"]}
            },
            "id": {"type": "string"}
        }
    });
    let strict = json!({
        "type": "object",
        "required": ["name"],
        "properties": {"name": {"type": "string"}, "id": {"type": "string", "format": "uuid"}},
        "additionalProperties": false
    });
    let make = |v: Option<PayloadValidator>| {
        EntityService::new(
            "thing",
            Arc::new(MemoryStore::new()),
            v,
            vec![],
            Arc::new(NoAuth),
        )
    };
    vec![
        make(None),
        make(Some(PayloadValidator::new(&schema).unwrap())),
        make(Some(PayloadValidator::new(&strict).unwrap())),
    ]
}

/// Creates `body` on each service: an error has a kind (a 4xx for the client's body), an
/// accepted body reads back as it was sent with the id added.
async fn create_and_read_back(body: &Value) -> Result<(), TestCaseError> {
    for s in services() {
        let session = s.session(None, None).expect("no auth");
        let created = s.create(&session, body.clone()).await;
        check(&s, &session, body, created).await?;
    }
    Ok(())
}

async fn check(
    s: &EntityService,
    session: &Session,
    body: &Value,
    created: Result<meshql_core::Envelope, EngineError>,
) -> Result<(), TestCaseError> {
    match created {
        Ok(env) => {
            let Value::Object(sent) = body else {
                return Err(TestCaseError::fail(format!(
                    "a non-object was accepted: {body}"
                )));
            };
            let mut expected = sent.clone();
            expected.insert("id".into(), Value::String(env.id.clone()));
            let stored = env
                .payload_map()
                .map_err(|e| TestCaseError::fail(format!("stored payload is not JSON: {e}")))?;
            prop_assert_eq!(&stored, &expected);
            let read = s
                .read(session, &env.id, None)
                .await
                .map_err(|e| TestCaseError::fail(e.to_string()))?
                .ok_or_else(|| TestCaseError::fail("created but not found"))?;
            prop_assert_eq!(read.payload_map().unwrap(), expected.clone());
            // an update with the same body stores the same again
            let updated = s
                .update(session, &env.id, body.clone())
                .await
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(updated.payload_map().unwrap(), expected);
        }
        Err(e) => {
            let kind = e.kind();
            prop_assert_eq!(kind, ErrorKind::Invalid, "{}", e);
            prop_assert!(!e.to_string().is_empty());
            if let EngineError::Invalid(violations) = &e {
                prop_assert!(!violations.is_empty() && violations.len() <= 20);
                for v in violations {
                    prop_assert!(v["path"].is_string() && v["message"].is_string(), "{v}");
                }
            }
        }
    }
    Ok(())
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

#[test]
fn deep_nesting_is_answered() {
    block_on(async {
        for depth in [10, 100, 120] {
            create_and_read_back(&deep(depth)).await.unwrap();
        }
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// Arbitrary values: Ok and read back equal, or an Invalid error.
    #[test]
    fn arbitrary_bodies_are_stored_as_sent_or_refused(body in body()) {
        block_on(create_and_read_back(&body))?;
    }

    /// Arbitrary body text as a frontend parses it: what parses is created or refused.
    #[test]
    fn arbitrary_body_text_never_panics(text in prop_oneof![
        "\\PC{0,80}",
        "[\\[\\]{}\":,0-9eE.+-]{0,60}",
        body().prop_map(|v| v.to_string()),
    ]) {
        if let Ok(body) = serde_json::from_str::<Value>(&text) {
            block_on(create_and_read_back(&body))?;
        }
    }

    /// A batch of arbitrary values: all created, or refused with each problem's index.
    #[test]
    fn arbitrary_batches_are_all_or_nothing(bodies in prop::collection::vec(body(), 0..6)) {
        block_on(async {
            for s in services() {
                let session = s.session(None, None).unwrap();
                match s.create_many(&session, bodies.clone()).await {
                    Ok(envs) => {
                        prop_assert_eq!(envs.len(), bodies.len());
                        for (env, body) in envs.iter().zip(&bodies) {
                            let mut expected = body.as_object().unwrap().clone();
                            expected.insert("id".into(), Value::String(env.id.clone()));
                            prop_assert_eq!(env.payload_map().unwrap(), expected);
                        }
                    }
                    Err(EngineError::InvalidBatch(problems)) => {
                        prop_assert!(!problems.is_empty());
                        for p in &problems {
                            let i = p["index"].as_u64().unwrap() as usize;
                            prop_assert!(i < bodies.len());
                        }
                        let all = s.list(&session, None).await.unwrap();
                        prop_assert!(all.is_empty(), "a refused batch wrote {} documents", all.len());
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("unexpected error {e:?}"))),
                }
            }
            Ok(())
        })?;
    }
}
