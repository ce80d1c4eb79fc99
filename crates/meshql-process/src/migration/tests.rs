use super::*;
use meshql_core::{DynStore, NewDocument, ReadContext, WriteContext};
use meshql_engine::PayloadValidator;
use meshql_store_memory::MemoryStore;
use serde_json::json;
use std::sync::Arc;

fn hen_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "title": { "type": "string" },
            "eggs": { "type": "integer" },
            "status": { "type": "string", "enum": ["active", "retired"] },
            "label": { "type": "string" },
            "legacy_code": { "type": "string" }
        },
        "required": ["title", "status"],
        "additionalProperties": false
    })
}

fn hen() -> EntityInfo {
    let schema = hen_schema();
    EntityInfo {
        name: "hen".into(),
        fields: EntityInfo::fields_of(Some(&schema)),
        properties: EntityInfo::properties_of(Some(&schema)),
        required: EntityInfo::required_of(Some(&schema)),
    }
}

fn compile(settings: Value) -> Result<Migration, SettingError> {
    Migration::compile("m", &settings, &hen())
}

fn refused(settings: Value) -> (String, String) {
    let e = compile(settings).expect_err("refused");
    (e.field.unwrap_or_default(), e.message)
}

fn map(v: Value) -> Map<String, Value> {
    v.as_object().expect("an object").clone()
}

#[test]
fn a_document_is_renamed_dropped_set_and_defaulted_in_that_order() {
    let m = compile(json!({
        "rename": { "name": "title" },
        "drop": ["colour"],
        "set": {
            "eggs": { "int": "eggs" },
            "label": { "concat": ["name", "colour"], "separator": " / " }
        },
        "default": { "status": "active" }
    }))
    .unwrap();
    let before = map(json!({
        "id": "h1", "name": "Henrietta", "colour": "brown", "eggs": "12", "legacy_code": "X"
    }));
    let after = m.apply(&before).unwrap();
    // `set` reads the document as it was: `name` and `colour` before the rename and the drop
    assert_eq!(
        Value::Object(after),
        json!({
            "id": "h1", "title": "Henrietta", "eggs": 12, "legacy_code": "X",
            "label": "Henrietta / brown", "status": "active"
        })
    );
}

#[test]
fn a_rename_of_an_absent_field_keeps_the_new_one_and_a_default_keeps_a_value() {
    let m = compile(json!({ "rename": { "name": "title" }, "default": { "status": "active" } }))
        .unwrap();
    let doc = map(json!({ "id": "h1", "title": "Already", "status": "retired" }));
    assert_eq!(m.apply(&doc).unwrap(), doc);
    let null_status = map(json!({ "id": "h1", "title": "A", "status": null }));
    assert_eq!(m.apply(&null_status).unwrap()["status"], json!("active"));
}

#[test]
fn omit_empty_removes_the_field_and_a_failing_transformation_names_it() {
    let m = compile(json!({ "set": { "eggs": { "int": "eggs", "omit_empty": true } } })).unwrap();
    let out = m.apply(&map(json!({ "id": "h1", "eggs": null }))).unwrap();
    assert!(!out.contains_key("eggs"));
    let e = m
        .apply(&map(json!({ "id": "h1", "eggs": "twelve" })))
        .unwrap_err();
    assert!(e.contains("eggs") && e.contains("twelve"), "{e}");
}

#[test]
fn declarations_that_cannot_be_right_are_refused_naming_their_field() {
    let cases = [
        (json!({}), "", "declares no change"),
        (json!({ "rename": { "id": "key" } }), "rename.id", "`id`"),
        (
            json!({ "rename": { "name": "nickname" } }),
            "rename.name",
            "has no field `nickname`",
        ),
        (
            json!({ "rename": { "name": "name" } }),
            "rename.name",
            "itself",
        ),
        (
            json!({ "rename": { "name": "title" }, "set": { "title": { "lower": "x" } } }),
            "set.title",
            "written by `rename.name`",
        ),
        (json!({ "drop": ["title"] }), "drop[0]", "requires `title`"),
        (
            json!({ "rename": { "name": "title" }, "drop": ["name"] }),
            "drop[0]",
            "renamed",
        ),
        (
            json!({ "set": { "eggs": { "lookup": "farm", "id": "farm_id", "field": "n" } } }),
            "set.eggs.lookup",
            "`lookup`",
        ),
        (
            json!({ "set": { "eggs": { "lower": "eggs" } } }),
            "set.eggs",
            "integer",
        ),
        (
            json!({ "default": { "status": "gone" } }),
            "default.status",
            "one of",
        ),
        (
            json!({ "default": { "eggs": null } }),
            "default.eggs",
            "other than null",
        ),
        (
            json!({ "drop": ["x"], "batch": 0 }),
            "batch",
            "between 1 and 10000",
        ),
        (
            json!({ "drop": ["x"], "colour": "red" }),
            "colour",
            "unknown field",
        ),
        (json!({ "drop": "x" }), "drop", "a list"),
    ];
    for (settings, field, message) in cases {
        let (f, m) = refused(settings.clone());
        assert_eq!(f, field, "{settings}: {m}");
        assert!(m.contains(message), "{settings}: `{m}` lacks `{message}`");
    }
}

async fn store_with(n: usize) -> DynStore {
    let store: DynStore = Arc::new(MemoryStore::new());
    for i in 0..n {
        store
            .create(
                NewDocument::with_id(
                    format!("hen-{i:05}"),
                    map(json!({ "name": format!("Hen {i}"), "eggs": format!("{}", i % 7), "colour": "brown" })),
                ),
                &WriteContext::SYSTEM,
            )
            .await
            .unwrap();
    }
    store
}

fn declared() -> Vec<Migration> {
    vec![
        Migration::compile(
            "rename-name",
            &json!({ "rename": { "name": "title" }, "drop": ["colour"], "batch": 100 }),
            &hen(),
        )
        .unwrap(),
        Migration::compile(
            "eggs-as-integers",
            &json!({ "set": { "eggs": { "int": "eggs" } }, "default": { "status": "active" } }),
            &hen(),
        )
        .unwrap(),
    ]
}

fn validator() -> PayloadValidator {
    PayloadValidator::new(&hen_schema()).unwrap()
}

#[tokio::test]
async fn a_run_writes_one_version_per_changed_document_and_records_each_migration_once() {
    let store = store_with(250).await;
    let before_run = meshql_core::now_millis();
    let migrations = declared();
    let mut calls = 0;
    let report = run("hen", &store, &migrations, Some(&validator()), &mut |_| {
        calls += 1
    })
    .await
    .unwrap();
    assert_eq!(report.applied, vec!["rename-name", "eggs-as-integers"]);
    assert_eq!((report.migrated, report.unchanged), (250, 0));
    assert_eq!(calls, 3, "a progress report per batch of 100");
    for i in [0, 137, 249] {
        let id = format!("hen-{i:05}");
        let versions = store.versions(&id).await.unwrap();
        assert_eq!(
            versions.len(),
            2,
            "{id}: the original and the migrated version"
        );
        let now = versions[1].payload_map().unwrap();
        assert_eq!(
            Value::Object(now),
            json!({ "id": id, "title": format!("Hen {i}"), "eggs": (i % 7) as i64, "status": "active" })
        );
        // the history before the migration reads as it was
        let filter = meshql_core::TokenFilter::All;
        let old = store
            .read(&id, &ReadContext::new(&filter, Some(before_run)))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            old.payload_map().unwrap()["name"],
            json!(format!("Hen {i}"))
        );
    }
    let states = status("hen", &store, &migrations).await.unwrap();
    assert!(states
        .iter()
        .all(|(_, s)| matches!(s, State::Applied(a) if a.documents == 250)));

    // a second start finds nothing to do and writes nothing
    let again = run("hen", &store, &migrations, Some(&validator()), &mut |_| {})
        .await
        .unwrap();
    assert_eq!(again, Report::default());
    assert_eq!(store.versions("hen-00000").await.unwrap().len(), 2);
}

#[tokio::test]
async fn a_run_that_would_leave_a_document_invalid_does_not_start() {
    let store = store_with(30).await;
    let only_rename = vec![Migration::compile(
        "rename-name",
        &json!({ "rename": { "name": "title" }, "batch": 10 }),
        &hen(),
    )
    .unwrap()];
    // without `status` (required) every renamed document is invalid: the run does not start
    let e = run("hen", &store, &only_rename, Some(&validator()), &mut |_| {})
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "refused", "{e}");
    let text = e.to_string();
    assert!(text.contains("30 of 30") && text.contains("status"), "{e}");
    assert_eq!(
        store.versions("hen-00000").await.unwrap().len(),
        1,
        "nothing written"
    );
    let states = status("hen", &store, &only_rename).await.unwrap();
    assert_eq!(states[0].1, State::Pending, "nothing recorded");

    // declared with what makes them valid, they run
    let report = run("hen", &store, &declared(), Some(&validator()), &mut |_| {})
        .await
        .unwrap();
    assert_eq!(report.migrated, 30);
}

#[tokio::test]
async fn a_transformation_that_fails_names_the_document_and_nothing_is_written() {
    let store = store_with(30).await;
    store
        .update(
            "hen-00017",
            NewDocument::with_id(
                "hen-00017",
                map(json!({ "name": "Odd", "eggs": "1.5", "colour": "white" })),
            ),
            &WriteContext::SYSTEM,
        )
        .await
        .unwrap();
    let e = run("hen", &store, &declared(), Some(&validator()), &mut |_| {})
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "refused", "{e}");
    assert!(e.to_string().contains("hen-00017"), "{e}");
    assert_eq!(store.versions("hen-00003").await.unwrap().len(), 1);
    let dry = dry_run("hen", &store, &declared(), Some(&validator()), 2)
        .await
        .unwrap();
    assert_eq!((dry.read, dry.changed, dry.failing), (30, 29, 1));
    assert_eq!(dry.failing_examples[0].0, "hen-00017");
    assert_eq!(dry.sample.len(), 2);
}

#[tokio::test]
async fn an_interrupted_run_resumes_after_the_last_committed_batch() {
    let store = store_with(40).await;
    let migrations = declared();
    // a run that committed its first batch, then died: recorded as a crash leaves it
    let started_at = meshql_core::now_millis();
    let consumer = super::run::consumer("hen");
    let mut batch = meshql_core::OutputBatch::new(&consumer, 7);
    for i in 0..10 {
        let id = format!("hen-{i:05}");
        batch.writes.push(meshql_core::OutputWrite::Put {
            id: id.clone(),
            payload: json!({ "title": format!("Hen {i}"), "eggs": i % 7, "status": "active" })
                .to_string(),
        });
    }
    batch.state.push(meshql_core::StateWrite {
        key: "run".into(),
        group: None,
        value: Some(
            json!({
                "names": ["rename-name", "eggs-as-integers"],
                "started_at": started_at,
                "after": "hen-00009",
                "migrated": 10,
                "unchanged": 0
            })
            .to_string(),
        ),
    });
    store
        .apply_output(batch, &WriteContext::SYSTEM)
        .await
        .unwrap();
    let states = status("hen", &store, &migrations).await.unwrap();
    assert!(matches!(states[0].1, State::Running { migrated: 10, .. }));

    let report = run("hen", &store, &migrations, Some(&validator()), &mut |_| {})
        .await
        .unwrap();
    assert!(report.resumed);
    assert_eq!(report.migrated, 40, "10 before the crash, 30 after");
    for i in 0..40 {
        let id = format!("hen-{i:05}");
        assert_eq!(
            store.versions(&id).await.unwrap().len(),
            2,
            "{id} written once"
        );
    }
}

#[tokio::test]
async fn a_migration_declared_before_one_that_ran_is_refused() {
    let store = store_with(3).await;
    let first = declared();
    run("hen", &store, &first[..1], Some(&validator()), &mut |_| {})
        .await
        .unwrap_err(); // `status` is required: the first alone leaves documents invalid
    let store = store_with(3).await;
    run("hen", &store, &first, None, &mut |_| {}).await.unwrap();
    let mut later = vec![Migration::compile(
        "inserted-before",
        &json!({ "default": { "label": "x" } }),
        &hen(),
    )
    .unwrap()];
    later.extend(first);
    let e = run("hen", &store, &later, None, &mut |_| {})
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "out_of_order", "{e}");
    assert!(e.to_string().contains("`inserted-before`"), "{e}");
}

#[tokio::test]
async fn a_rewind_makes_later_runs_pending_and_one_going_on_at_the_moment_interrupted() {
    let store = store_with(20).await;
    let migrations = declared();
    run("hen", &store, &migrations, Some(&validator()), &mut |_| {})
        .await
        .unwrap();
    let states = status("hen", &store, &migrations).await.unwrap();
    let State::Applied(a) = &states[0].1 else {
        panic!("{states:?}")
    };
    let (started, finished) = (a.started_at, a.finished_at);

    // a moment after the run: nothing changes
    assert!(rewind("hen", &store, finished).await.unwrap().is_empty());
    // a moment while it ran: one interrupted run of both, in their order
    let said = rewind("hen", &store, started).await.unwrap();
    assert_eq!(
        said,
        ["hen: `rename-name`, `eggs-as-integers` was running at the moment: it resumes when served"]
    );
    let states = status("hen", &store, &migrations).await.unwrap();
    assert!(
        states
            .iter()
            .all(|(_, s)| matches!(s, State::Running { started_at, .. } if *started_at == started)),
        "{states:?}"
    );
    // resumed, it writes nothing: every document was written after the run began
    let report = run("hen", &store, &migrations, Some(&validator()), &mut |_| {})
        .await
        .unwrap();
    assert!(report.resumed);
    assert_eq!((report.migrated, report.newer), (0, 20));
    // a moment before it began: pending again
    let said = rewind("hen", &store, started - 1).await.unwrap();
    assert_eq!(said.len(), 2, "{said:?}");
    let states = status("hen", &store, &migrations).await.unwrap();
    assert!(
        states.iter().all(|(_, s)| *s == State::Pending),
        "{states:?}"
    );
}
