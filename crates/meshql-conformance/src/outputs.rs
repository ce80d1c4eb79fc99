//! Processor outputs (`meshql_core::output`): what a consumer of the change feed commits
//! with its position, in one transaction of its output's store. Run by every backend with
//! [`crate::output_tests!`]; a store answering [`meshql_core::OutputStore::supports_outputs`]
//! with `false` skips every case, saying so.
//!
//! The consumers' tables are shared by every entity table of a database (and by the tests
//! running at once against one server), so each case names its consumers uniquely.

use crate::feed::settled;
use crate::harness::{ALL, W};
use meshql_core::{
    ChangeOp, Cursor, DeadLetter, DynStore, Envelope, NewDocument, OutputBatch, OutputWrite,
    ReadContext, StateWrite, StoreError, WriteContext,
};
use serde_json::{json, Value};
use std::collections::HashMap;

/// Whether the store commits outputs; prints why a case is skipped when not.
fn supported(store: &DynStore, case: &str) -> bool {
    let yes = store.supports_outputs();
    if !yes {
        eprintln!(
            "outputs/{case}: skipped: this backend answers supports_outputs() == false \
             (it cannot commit a processor's outputs with its position in one transaction)"
        );
    }
    yes
}

/// A consumer name no other test (or earlier run against the same server) uses.
fn consumer(case: &str) -> String {
    let unique = NewDocument::new(Default::default()).resolve_id();
    format!("conformance-{case}-{unique}")
}

/// A change as `(id, op, name, tokens, correlation id)`.
type ChangeSummary = (String, ChangeOp, String, Vec<String>, Option<String>);

/// An id beyond latin1 and the basic multilingual plane.
const B: &str = "b-漢-😀";

fn put(id: &str, payload: Value) -> OutputWrite {
    OutputWrite::Put {
        id: id.to_owned(),
        payload: payload.to_string(),
    }
}

fn delete(id: &str) -> OutputWrite {
    OutputWrite::Delete { id: id.to_owned() }
}

fn state(key: &str, group: Option<&str>, value: Option<&str>) -> StateWrite {
    StateWrite {
        key: key.to_owned(),
        group: group.map(str::to_owned),
        value: value.map(str::to_owned),
    }
}

fn batch(consumer: &str, position: u64, writes: Vec<OutputWrite>) -> OutputBatch {
    OutputBatch {
        writes,
        ..OutputBatch::new(consumer, position)
    }
}

fn payload_of(e: &Envelope) -> Value {
    serde_json::from_str(&e.payload).expect("a stored payload is JSON")
}

fn name(payload: &str) -> String {
    let v: Value = serde_json::from_str(payload).expect("payload is JSON");
    v["name"].as_str().unwrap_or_default().to_owned()
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

async fn apply(store: &DynStore, batch: OutputBatch, ctx: &WriteContext) -> Vec<Envelope> {
    store
        .apply_output(batch, ctx)
        .await
        .expect("apply an output batch")
}

async fn position(store: &DynStore, consumer: &str) -> Option<u64> {
    store
        .output_position(consumer)
        .await
        .expect("read a position")
}

/// No position before the first batch; each batch's position after it, however empty; one
/// consumer's batches leave another's position alone; an empty batch writes no change.
pub async fn outputs_position_follows_each_batch(store: DynStore) {
    if !supported(&store, "outputs_position_follows_each_batch") {
        return;
    }
    let (c, other) = (consumer("position"), consumer("position-other"));
    assert_eq!(position(&store, &c).await, None, "never committed");
    assert!(apply(&store, OutputBatch::new(&c, 7), &W).await.is_empty());
    assert_eq!(position(&store, &c).await, Some(7));
    assert_eq!(position(&store, &other).await, None);
    apply(&store, OutputBatch::new(&c, 19), &W).await;
    assert_eq!(
        position(&store, &c).await,
        Some(19),
        "a later batch moves it"
    );
    apply(&store, OutputBatch::new(&other, 3), &W).await;
    assert_eq!(position(&store, &c).await, Some(19));
    assert_eq!(position(&store, &other).await, Some(3));
    // positions are u64 log positions: beyond 2^53 they must not pass through a float
    let big = (1u64 << 53) + 1;
    apply(&store, OutputBatch::new(&c, big), &W).await;
    assert_eq!(position(&store, &c).await, Some(big));
    assert!(
        store.changes(Cursor::START, 10).await.unwrap().is_empty(),
        "batches without document writes put nothing in the change feed"
    );
}

/// A `Put` of a new id is its first version (a create in the feed), of an id with a current
/// version the next one (an update), keeping the current tokens unless the context sets them.
/// The versions come back in the batch's order, their payloads carrying the id.
pub async fn outputs_put_creates_then_appends_versions(store: DynStore) {
    if !supported(&store, "outputs_put_creates_then_appends_versions") {
        return;
    }
    let c = consumer("put");
    let writes_before = store.stats().writes;
    let mut signal = store.commit_signal();
    if let Some(rx) = signal.as_mut() {
        rx.borrow_and_update();
    }
    let alice = W
        .with_tokens(strings(&["alice"]))
        .with_correlation_id("out-1");
    let first = apply(
        &store,
        batch(
            &c,
            1,
            vec![
                put("a", json!({"name": "a1", "id": "spoof", "n": 1})),
                put(B, json!({"name": "b1", "text": "漢字 😀"})),
            ],
        ),
        &alice,
    )
    .await;
    assert_eq!(
        first.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(),
        ["a", B],
        "the versions written, in the batch's order"
    );
    for e in &first {
        assert!(!e.deleted);
        assert_eq!(
            payload_of(e)["id"],
            e.id,
            "the payload carries the id (the output's own id wins)"
        );
        assert_eq!(e.authorized_tokens, strings(&["alice"]));
    }
    assert_eq!(payload_of(&first[0])["name"], "a1");
    assert_eq!(payload_of(&first[0])["n"], 1);
    if let Some(rx) = signal.as_mut() {
        assert!(
            rx.has_changed().unwrap(),
            "a batch that wrote versions wakes the feed's tailers"
        );
    }

    // tokens None: the current version's tokens are kept
    let kept = apply(
        &store,
        batch(&c, 2, vec![put("a", json!({"name": "a2"}))]),
        &W.with_correlation_id("out-2"),
    )
    .await;
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].id, "a");
    assert_eq!(kept[0].authorized_tokens, strings(&["alice"]));
    assert_eq!(payload_of(&kept[0])["id"], "a");
    assert!(kept[0].created_at > first[0].created_at);
    // tokens Some: they are set
    let bob = W
        .with_tokens(strings(&["bob"]))
        .with_correlation_id("out-3");
    let set = apply(
        &store,
        batch(&c, 3, vec![put("a", json!({"name": "a3"}))]),
        &bob,
    )
    .await;
    assert_eq!(set[0].authorized_tokens, strings(&["bob"]));
    assert_eq!(position(&store, &c).await, Some(3));

    let versions = store.versions("a").await.unwrap();
    assert_eq!(
        versions
            .iter()
            .map(|v| name(&v.payload))
            .collect::<Vec<_>>(),
        ["a1", "a2", "a3"]
    );
    assert_eq!(
        versions
            .iter()
            .map(|v| v.authorized_tokens.clone())
            .collect::<Vec<_>>(),
        [strings(&["alice"]), strings(&["alice"]), strings(&["bob"])]
    );
    assert_eq!(
        versions[2], set[0],
        "what apply_output returns is what is stored"
    );
    let now = store
        .read("a", &ReadContext::new(&ALL, None))
        .await
        .unwrap()
        .expect("a has a current version");
    assert_eq!(name(&now.payload), "a3");
    assert_eq!(store.versions(B).await.unwrap(), vec![first[1].clone()]);
    assert_eq!(payload_of(&first[1])["text"], "漢字 😀");

    let feed = settled(&store, Cursor::START, 4).await;
    let summary: Vec<ChangeSummary> = feed
        .iter()
        .map(|c| {
            (
                c.id.clone(),
                c.op,
                name(&c.payload),
                c.authorized_tokens.clone(),
                c.correlation_id.clone(),
            )
        })
        .collect();
    let row = |id: &str, op, n: &str, tokens: &[&str], corr: &str| {
        (
            id.to_owned(),
            op,
            n.to_owned(),
            strings(tokens),
            Some(corr.to_owned()),
        )
    };
    assert_eq!(
        summary,
        vec![
            row("a", ChangeOp::Create, "a1", &["alice"], "out-1"),
            row(B, ChangeOp::Create, "b1", &["alice"], "out-1"),
            row("a", ChangeOp::Update, "a2", &["alice"], "out-2"),
            row("a", ChangeOp::Update, "a3", &["bob"], "out-3"),
        ],
        "each output version is one change of the feed"
    );
    assert_eq!(feed[0].created_at, first[0].created_at);
    assert_eq!(feed[3].created_at, set[0].created_at);
    assert_eq!(
        store.stats().writes - writes_before,
        4,
        "each version written counts as a write"
    );
}

/// A `Delete` appends a tombstone (a delete in the feed, keeping the last payload and the
/// tokens); of an unknown or already deleted id it writes nothing. A `Put` after a tombstone
/// is a new version with the context's tokens only.
pub async fn outputs_delete_writes_a_tombstone(store: DynStore) {
    if !supported(&store, "outputs_delete_writes_a_tombstone") {
        return;
    }
    let c = consumer("delete");
    let alice = W.with_tokens(strings(&["alice"]));
    apply(
        &store,
        batch(&c, 1, vec![put("x", json!({"name": "x1"}))]),
        &alice,
    )
    .await;
    let gone = apply(&store, batch(&c, 2, vec![delete("x"), delete("ghost")]), &W).await;
    assert_eq!(gone.len(), 1, "the unknown id wrote nothing: {gone:?}");
    assert_eq!(gone[0].id, "x");
    assert!(gone[0].deleted);
    assert_eq!(
        name(&gone[0].payload),
        "x1",
        "a tombstone keeps the last payload"
    );
    assert_eq!(gone[0].authorized_tokens, strings(&["alice"]));
    assert_eq!(position(&store, &c).await, Some(2));
    let versions = store.versions("x").await.unwrap();
    assert_eq!(versions.len(), 2);
    assert!(versions[1].deleted);
    assert_eq!(versions[1].created_at, gone[0].created_at);
    assert!(store
        .read("x", &ReadContext::new(&ALL, None))
        .await
        .unwrap()
        .is_none());
    assert!(store.versions("ghost").await.unwrap().is_empty());
    // deleting again writes nothing, but the position still moves
    assert!(apply(&store, batch(&c, 3, vec![delete("x")]), &W)
        .await
        .is_empty());
    assert_eq!(store.versions("x").await.unwrap().len(), 2);
    assert_eq!(position(&store, &c).await, Some(3));

    let again = apply(
        &store,
        batch(&c, 4, vec![put("x", json!({"name": "x2"}))]),
        &W,
    )
    .await;
    assert_eq!(again.len(), 1);
    assert!(
        again[0].authorized_tokens.is_empty(),
        "a tombstone's tokens are not carried over"
    );
    assert_eq!(
        name(
            &store
                .read("x", &ReadContext::new(&ALL, None))
                .await
                .unwrap()
                .expect("x is back")
                .payload
        ),
        "x2"
    );
    let feed = settled(&store, Cursor::START, 3).await;
    assert_eq!(
        feed.iter()
            .map(|c| (c.id.as_str(), c.op, name(&c.payload)))
            .collect::<Vec<_>>(),
        [
            ("x", ChangeOp::Create, "x1".to_owned()),
            ("x", ChangeOp::Delete, "x1".to_owned()),
            ("x", ChangeOp::Update, "x2".to_owned()),
        ]
    );
    assert_eq!(feed[1].authorized_tokens, strings(&["alice"]));
}

/// State rows are upserted (group and value replaced), deleted, read back by key (only the
/// keys present) and by group (exactly its rows, in key order: byte order, so `B` before
/// `a`), each consumer its own.
pub async fn outputs_state_rows_upsert_move_and_delete(store: DynStore) {
    if !supported(&store, "outputs_state_rows_upsert_move_and_delete") {
        return;
    }
    let (c, other) = (consumer("state"), consumer("state-other"));
    let keys = |ks: &[&str]| strings(ks);
    let rows = |items: &[(&str, &str)]| -> Vec<(String, String)> {
        items
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let map = |items: &[(&str, &str)]| -> HashMap<String, String> {
        items
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let mut first = OutputBatch::new(&c, 1);
    first.state = vec![
        state("a", Some("g1"), Some(r#"{"n":1}"#)),
        state("B", Some("g1"), Some(r#"{"n":2}"#)),
        state(
            "c/ü/漢😀",
            Some("g2-漢😀"),
            Some(r#"{"n":3,"text":"ünï \"q\" 漢😀"}"#),
        ),
        state("plain", None, Some("[]")),
    ];
    assert!(apply(&store, first, &W).await.is_empty());
    let mut theirs = OutputBatch::new(&other, 1);
    theirs.state = vec![
        state("a", Some("g1"), Some("theirs")),
        state("z", Some("g1"), Some("theirs too")),
    ];
    apply(&store, theirs, &W).await;

    let all = keys(&["a", "B", "c/ü/漢😀", "plain", "tmp", "missing"]);
    assert_eq!(
        store.output_state(&c, &all).await.unwrap(),
        map(&[
            ("a", r#"{"n":1}"#),
            ("B", r#"{"n":2}"#),
            ("c/ü/漢😀", r#"{"n":3,"text":"ünï \"q\" 漢😀"}"#),
            ("plain", "[]"),
        ]),
        "present keys only, values as written"
    );
    assert!(store.output_state(&c, &[]).await.unwrap().is_empty());
    assert_eq!(
        store.output_group(&c, "g1").await.unwrap(),
        rows(&[("B", r#"{"n":2}"#), ("a", r#"{"n":1}"#)]),
        "exactly the group's rows, in key (byte) order"
    );
    assert_eq!(
        store.output_group(&c, "g2-漢😀").await.unwrap(),
        rows(&[("c/ü/漢😀", r#"{"n":3,"text":"ünï \"q\" 漢😀"}"#)])
    );
    assert!(store.output_group(&c, "none").await.unwrap().is_empty());

    // overwrite (moved to another group), delete, delete of a key never written; a key
    // written twice in one batch ends as its last write says
    let mut second = OutputBatch::new(&c, 2);
    second.state = vec![
        state("plain", None, Some("[0]")),
        state("tmp", Some("g1"), Some("x")),
        state("B", Some("g2-漢😀"), Some(r#"{"n":20}"#)),
        state("a", None, None),
        state("never", Some("g1"), None),
        state("plain", None, Some("[1]")),
        state("tmp", Some("g1"), None),
    ];
    apply(&store, second, &W).await;
    assert_eq!(
        store.output_state(&c, &all).await.unwrap(),
        map(&[
            ("B", r#"{"n":20}"#),
            ("c/ü/漢😀", r#"{"n":3,"text":"ünï \"q\" 漢😀"}"#),
            ("plain", "[1]"),
        ])
    );
    assert!(store.output_group(&c, "g1").await.unwrap().is_empty());
    assert_eq!(
        store.output_group(&c, "g2-漢😀").await.unwrap(),
        rows(&[
            ("B", r#"{"n":20}"#),
            ("c/ü/漢😀", r#"{"n":3,"text":"ünï \"q\" 漢😀"}"#)
        ])
    );
    assert_eq!(position(&store, &c).await, Some(2));
    // the other consumer's rows, under the same keys and group, are untouched
    assert_eq!(
        store.output_group(&other, "g1").await.unwrap(),
        rows(&[("a", "theirs"), ("z", "theirs too")])
    );
    assert_eq!(
        store
            .output_state(&other, &keys(&["a", "B"]))
            .await
            .unwrap(),
        map(&[("a", "theirs")])
    );
}

fn letter(position: u64, n: u32) -> DeadLetter {
    DeadLetter {
        position,
        change_id: format!("lay_report:r{n}:1732380000{n:03}"),
        entity: "lay_report".into(),
        reason: format!("field `eggs` is not a number (\"many\", ünïcödé 漢😀) #{n}"),
        input: json!({"id": format!("r{n}"), "payload": {"eggs": "many 漢😀\n"}, "n": n})
            .to_string(),
        at: 1_732_380_000_000 + n as i64,
    }
}

/// Dead letters are kept with every field, read back newest first (per consumer or for
/// all), counted; `reset_output` forgets one consumer's position, state and dead letters,
/// and nothing of another's.
pub async fn outputs_dead_letters_and_reset(store: DynStore) {
    if !supported(&store, "outputs_dead_letters_and_reset") {
        return;
    }
    let (c, other) = (consumer("letters"), consumer("letters-other"));
    let big = (1u64 << 53) + 1;
    let (l1, l2, l3, m1) = (letter(3, 1), letter(big, 2), letter(11, 3), letter(4, 4));
    let mut b = OutputBatch::new(&c, 10);
    b.dead_letters = vec![l1.clone(), l2.clone()];
    b.state = vec![state("k", Some("g"), Some("v"))];
    apply(&store, b, &W).await;
    let mut b = OutputBatch::new(&other, 4);
    b.dead_letters = vec![m1.clone()];
    b.state = vec![state("k", Some("g"), Some("theirs"))];
    apply(&store, b, &W).await;
    let mut b = OutputBatch::new(&c, 12);
    b.dead_letters = vec![l3.clone()];
    apply(&store, b, &W).await;

    let mine = |ls: &[&DeadLetter]| -> Vec<(String, DeadLetter)> {
        ls.iter().map(|l| (c.clone(), (*l).clone())).collect()
    };
    assert_eq!(
        store.dead_letters(Some(&c), 10).await.unwrap(),
        mine(&[&l3, &l2, &l1]),
        "every field, newest first, this consumer's only"
    );
    assert_eq!(
        store.dead_letters(Some(&c), 2).await.unwrap(),
        mine(&[&l3, &l2]),
        "at most `limit`"
    );
    assert_eq!(store.dead_letter_count(&c).await.unwrap(), 3);
    assert_eq!(store.dead_letter_count(&other).await.unwrap(), 1);
    assert_eq!(
        store
            .dead_letter_count(&consumer("letters-nobody"))
            .await
            .unwrap(),
        0
    );
    // every consumer's, newest first (other tests' consumers may share the tables)
    let everyone: Vec<(String, DeadLetter)> = store
        .dead_letters(None, 10_000)
        .await
        .unwrap()
        .into_iter()
        .filter(|(who, _)| *who == c || *who == other)
        .collect();
    assert_eq!(
        everyone,
        vec![
            (c.clone(), l3.clone()),
            (other.clone(), m1.clone()),
            (c.clone(), l2.clone()),
            (c.clone(), l1.clone()),
        ]
    );

    store.reset_output(&c).await.unwrap();
    assert_eq!(position(&store, &c).await, None);
    assert!(store
        .output_state(&c, &strings(&["k"]))
        .await
        .unwrap()
        .is_empty());
    assert!(store.output_group(&c, "g").await.unwrap().is_empty());
    assert!(store.dead_letters(Some(&c), 10).await.unwrap().is_empty());
    assert_eq!(store.dead_letter_count(&c).await.unwrap(), 0);
    // the other consumer keeps everything
    assert_eq!(position(&store, &other).await, Some(4));
    assert_eq!(
        store.output_group(&other, "g").await.unwrap(),
        vec![("k".to_owned(), "theirs".to_owned())]
    );
    assert_eq!(
        store.dead_letters(Some(&other), 10).await.unwrap(),
        vec![(other.clone(), m1)]
    );
    // a reset consumer starts over
    apply(&store, OutputBatch::new(&c, 1), &W).await;
    assert_eq!(position(&store, &c).await, Some(1));
}

/// A batch whose last write cannot be stored commits nothing: no version (of the writes
/// before it either), no change, no state row, no dead letter, and the position stays. Two
/// ways to fail: a payload that is not a JSON object, and one the store refuses while
/// writing (the fault injected by `meshql_core::fault`, after the versions before it were
/// written in the same transaction).
pub async fn outputs_batch_failing_part_way_commits_nothing(store: DynStore) {
    if !supported(&store, "outputs_batch_failing_part_way_commits_nothing") {
        return;
    }
    let c = consumer("atomic");
    let mut good = batch(&c, 1, vec![put("keep", json!({"name": "k1"}))]);
    good.state = vec![state("s1", Some("g"), Some("v1"))];
    good.dead_letters = vec![letter(1, 1)];
    apply(&store, good, &W).await;
    let writes_before = store.stats().writes;

    let poison = json!({"name": "poison", "note": meshql_core::fault::POISON});
    for last in [
        OutputWrite::Put {
            id: "bad".into(),
            payload: "[1, 2, 3]".into(),
        },
        OutputWrite::Put {
            id: "bad".into(),
            payload: "not json at all".into(),
        },
        put("bad", poison),
    ] {
        let mut doomed = batch(
            &c,
            2,
            vec![
                put("keep", json!({"name": "k2"})),
                put("fresh", json!({"name": "f1"})),
                delete("gone-too"),
                last.clone(),
            ],
        );
        doomed.state = vec![
            state("s1", Some("g"), Some("v2")),
            state("s2", Some("g"), Some("new")),
        ];
        doomed.dead_letters = vec![letter(2, 2)];
        let err = store
            .apply_output(doomed, &W.with_correlation_id("doomed"))
            .await
            .expect_err("a batch with a write that cannot be stored fails");
        assert!(
            matches!(err, StoreError::Invalid(_) | StoreError::Query(_)),
            "the failure of {last:?} is the write's: {err:?}"
        );

        assert_eq!(
            store
                .versions("keep")
                .await
                .unwrap()
                .iter()
                .map(|v| name(&v.payload))
                .collect::<Vec<_>>(),
            ["k1"],
            "no version of the failed batch ({last:?})"
        );
        assert!(store.versions("fresh").await.unwrap().is_empty());
        assert!(store.versions("bad").await.unwrap().is_empty());
        assert_eq!(position(&store, &c).await, Some(1), "the position stays");
        assert_eq!(
            store
                .output_state(&c, &strings(&["s1", "s2"]))
                .await
                .unwrap(),
            HashMap::from([("s1".to_owned(), "v1".to_owned())]),
            "no state row of the failed batch"
        );
        assert_eq!(
            store.output_group(&c, "g").await.unwrap(),
            vec![("s1".to_owned(), "v1".to_owned())]
        );
        assert_eq!(
            store.dead_letters(Some(&c), 10).await.unwrap(),
            vec![(c.clone(), letter(1, 1))],
            "no dead letter of the failed batch"
        );
        assert_eq!(store.dead_letter_count(&c).await.unwrap(), 1);
    }
    assert_eq!(store.stats().writes, writes_before, "nothing counted");

    // the store goes on, and the feed holds nothing of the failed batches
    let next = apply(
        &store,
        batch(&c, 3, vec![put("keep", json!({"name": "k3"}))]),
        &W,
    )
    .await;
    assert_eq!(next.len(), 1);
    assert_eq!(position(&store, &c).await, Some(3));
    let feed = settled(&store, Cursor::START, 2).await;
    assert_eq!(
        feed.iter()
            .map(|c| (c.id.as_str(), c.op, name(&c.payload)))
            .collect::<Vec<_>>(),
        [
            ("keep", ChangeOp::Create, "k1".to_owned()),
            ("keep", ChangeOp::Update, "k3".to_owned()),
        ]
    );
    assert!(feed
        .iter()
        .all(|c| c.correlation_id.as_deref() != Some("doomed")));
}

/// A processor's batches and REST writers updating the same ids at once (the processor is
/// the only writer of its consumer's rows, not of the entity's table): every write lands as
/// its own version, exactly one version of each id is the latest (the newest), and the feed
/// holds every version once, in order per document.
pub async fn outputs_race_other_writers_of_the_same_ids(store: DynStore) {
    if !supported(&store, "outputs_race_other_writers_of_the_same_ids") {
        return;
    }
    const IDS: usize = 5;
    const WRITERS: usize = 4;
    const ROUNDS: usize = 5;
    const BATCHES: u64 = 10;
    let c = consumer("race");
    let ids: Vec<String> = (0..IDS).map(|i| format!("k{i}")).collect();
    let first = ids
        .iter()
        .map(|id| put(id, json!({"name": "v0"})))
        .collect();
    apply(&store, batch(&c, 0, first), &W).await;
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let (store, ids) = (store.clone(), ids.clone());
        tasks.push(tokio::spawn(async move {
            for r in 0..ROUNDS {
                for k in 0..IDS {
                    // each writer walks the ids in its own order
                    let id = &ids[(k + w) % IDS];
                    store
                        .update(
                            id,
                            NewDocument::new(
                                json!({"name": format!("rest-{w}-{r}")})
                                    .as_object()
                                    .unwrap()
                                    .clone(),
                            ),
                            &W,
                        )
                        .await
                        .expect("no update may fail under concurrency")
                        .expect("the id has a current version");
                }
            }
        }));
    }
    let processor = {
        let (store, ids, c) = (store.clone(), ids.clone(), c.clone());
        tokio::spawn(async move {
            for b in 1..=BATCHES {
                // the batch's writes in an order of their own, not the ids' order
                let writes = ids
                    .iter()
                    .rev()
                    .map(|id| put(id, json!({"name": format!("out-{b}")})))
                    .collect();
                let written = store
                    .apply_output(batch(&c, b, writes), &W)
                    .await
                    .expect("no batch may fail under concurrency");
                assert_eq!(written.len(), IDS);
            }
        })
    };
    for t in tasks {
        t.await.unwrap();
    }
    processor.await.unwrap();
    assert_eq!(position(&store, &c).await, Some(BATCHES));

    let ctx = ReadContext::new(&ALL, None);
    let listed = store.list(&ctx).await.unwrap();
    assert_eq!(listed.len(), IDS, "one latest version per id: {listed:?}");
    let per_id = 1 + WRITERS * ROUNDS + BATCHES as usize;
    for id in &ids {
        let versions = store.versions(id).await.unwrap();
        assert_eq!(versions.len(), per_id, "every write of `{id}` is a version");
        let newest = versions.iter().max_by_key(|v| v.created_at).unwrap();
        let read = store.read(id, &ctx).await.unwrap().unwrap();
        assert_eq!(
            read.payload, newest.payload,
            "the latest of `{id}` is the newest"
        );
        let names: std::collections::BTreeSet<String> =
            versions.iter().map(|v| name(&v.payload)).collect();
        assert!((1..=BATCHES).all(|b| names.contains(&format!("out-{b}"))));
    }
    let feed = settled(&store, Cursor::START, IDS * per_id).await;
    assert_eq!(feed.len(), IDS * per_id, "every version once in the feed");
    for id in &ids {
        let of_id: Vec<_> = feed.iter().filter(|c| &c.id == id).collect();
        assert_eq!(of_id.len(), per_id);
        assert_eq!(of_id[0].op, ChangeOp::Create);
        assert!(of_id[1..].iter().all(|c| c.op == ChangeOp::Update));
        assert!(
            of_id.windows(2).all(|p| p[0].created_at < p[1].created_at),
            "the feed keeps each document's versions in order"
        );
    }
}

/// The names of the documents a list reads now.
async fn listed_names(store: &DynStore) -> Vec<String> {
    let ctx = ReadContext::new(&ALL, None);
    let mut names: Vec<String> = store
        .list(&ctx)
        .await
        .expect("list")
        .iter()
        .map(|e| name(&e.payload))
        .collect();
    names.sort();
    names
}

/// The names of the documents a template search for `name` finds.
async fn found(store: &DynStore, wanted: &str) -> Vec<String> {
    let template = meshql_core::QueryTemplate::filter(r#"{"payload.name": "{{name}}"}"#).unwrap();
    let args = json!({ "name": wanted }).as_object().unwrap().clone();
    store
        .find(
            &meshql_core::Search::new(&template, &args, None),
            &ReadContext::new(&ALL, None),
        )
        .await
        .expect("find")
        .iter()
        .map(|r| name(&r.payload))
        .collect()
}

/// A projection rebuild (`rebuild_store`, then `swap_rebuilt`): the rebuild writes a table
/// of its own while reads, searches and the consumer's rows stay the live table's; the swap
/// puts the rebuilt table and the rebuild consumer's position, state rows and dead letters
/// in place of the live ones (the old rows, REST's versions included, are gone), without
/// replaying the rebuilt versions into the feed; writes after it are in the feed as usual.
/// A second rebuild of the same table works the same way, and so does preparing the table
/// again afterwards (a restart).
pub async fn outputs_rebuild_swaps_in_a_new_table(store: DynStore) {
    if !supported(&store, "outputs_rebuild_swaps_in_a_new_table") {
        return;
    }
    let c = consumer("rebuild");
    let from = format!("{c}#rebuild");
    let mut b = batch(
        &c,
        5,
        vec![
            put("a", json!({"name": "old-a"})),
            put("b", json!({"name": "old-b"})),
            put("d", json!({"name": "old-d"})),
        ],
    );
    b.state = vec![
        state("k", Some("g"), Some("old")),
        state("gone", None, Some("x")),
    ];
    b.dead_letters = vec![letter(2, 1)];
    apply(&store, b, &W).await;
    store
        .create(
            NewDocument::new(json!({"name": "rest"}).as_object().unwrap().clone()),
            &W,
        )
        .await
        .unwrap();
    let before = settled(&store, Cursor::START, 4).await;
    assert_eq!(before.len(), 4);
    let cursor = before.last().unwrap().cursor;

    let shadow = store.rebuild_store().await.expect("a rebuild table");
    let mut b = batch(
        &from,
        9,
        vec![
            put("a", json!({"name": "new-a"})),
            put("b", json!({"name": "new-b"})),
        ],
    );
    b.state = vec![state("k", Some("g"), Some("new"))];
    b.dead_letters = vec![letter(7, 2)];
    apply(&shadow, b, &W).await;
    // reads still see the live table, searches too
    assert_eq!(
        listed_names(&store).await,
        strings(&["old-a", "old-b", "old-d", "rest"])
    );
    assert_eq!(found(&store, "old-a").await, strings(&["old-a"]));
    assert!(found(&store, "new-a").await.is_empty());
    assert_eq!(listed_names(&shadow).await, strings(&["new-a", "new-b"]));
    assert_eq!(position(&store, &c).await, Some(5));

    store.swap_rebuilt(&from, &c).await.expect("swap");
    assert_eq!(listed_names(&store).await, strings(&["new-a", "new-b"]));
    assert_eq!(found(&store, "new-b").await, strings(&["new-b"]));
    assert!(found(&store, "old-a").await.is_empty());
    let ctx = ReadContext::new(&ALL, None);
    assert!(store.read("d", &ctx).await.unwrap().is_none());
    assert_eq!(position(&store, &c).await, Some(9));
    assert_eq!(position(&store, &from).await, None);
    assert_eq!(
        store.output_group(&c, "g").await.unwrap(),
        vec![("k".to_owned(), "new".to_owned())]
    );
    assert!(store
        .output_state(&c, &strings(&["gone"]))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        store.dead_letters(Some(&c), 10).await.unwrap(),
        vec![(c.clone(), letter(7, 2))]
    );
    assert_eq!(store.dead_letter_count(&from).await.unwrap(), 0);
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(
        store.changes(cursor, 100).await.unwrap().is_empty(),
        "the rebuilt versions are not replayed into the feed"
    );

    // the processor goes on in the new table: its next versions follow the rebuilt ones and
    // are in the feed after the cursor
    apply(
        &store,
        batch(&c, 10, vec![put("a", json!({"name": "after"}))]),
        &W,
    )
    .await;
    let after = settled(&store, cursor, 1).await;
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!((after[0].id.as_str(), after[0].op), ("a", ChangeOp::Update));
    assert_eq!(store.versions("a").await.unwrap().len(), 2);
    let cursor = after[0].cursor;

    // again, on the table the first rebuild left
    let shadow = store.rebuild_store().await.expect("a second rebuild table");
    assert!(listed_names(&shadow).await.is_empty(), "a fresh table");
    apply(
        &shadow,
        batch(&from, 12, vec![put("e", json!({"name": "third-e"}))]),
        &W,
    )
    .await;
    store.swap_rebuilt(&from, &c).await.expect("second swap");
    assert_eq!(listed_names(&store).await, strings(&["third-e"]));
    assert_eq!(found(&store, "third-e").await, strings(&["third-e"]));
    assert_eq!(position(&store, &c).await, Some(12));
    assert!(store.dead_letters(Some(&c), 10).await.unwrap().is_empty());
    // a restart prepares the table again
    store
        .prepare(&crate::harness::templates())
        .await
        .expect("prepare after a swap");
    assert_eq!(found(&store, "third-e").await, strings(&["third-e"]));
    apply(
        &store,
        batch(&c, 13, vec![put("e", json!({"name": "fourth-e"}))]),
        &W,
    )
    .await;
    let after = settled(&store, cursor, 1).await;
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!(after[0].id, "e");
    assert_eq!(listed_names(&store).await, strings(&["fourth-e"]));
}

/// Readers during a rebuild and its swap: every list reads the whole old table or the whole
/// new one, never an empty, partial or mixed one, and a read by id the old version or the
/// new; the readers run from before the rebuild starts until after the swap.
pub async fn outputs_rebuild_readers_never_see_a_partial_table(store: DynStore) {
    if !supported(&store, "outputs_rebuild_readers_never_see_a_partial_table") {
        return;
    }
    const OLD: usize = 20;
    const NEW: usize = 30;
    const READERS: usize = 4;
    let c = consumer("rebuild-readers");
    let from = format!("{c}#rebuild");
    let writes = (0..OLD)
        .map(|i| put(&format!("k{i:02}"), json!({"name": "old"})))
        .collect();
    apply(&store, batch(&c, 1, writes), &W).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut readers = Vec::new();
    for r in 0..READERS {
        let (store, stop) = (store.clone(), stop.clone());
        readers.push(tokio::spawn(async move {
            let ctx = ReadContext::new(&ALL, None);
            let (mut old, mut new) = (0usize, 0usize);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let names = listed_names(&store).await;
                let whole_old = names.len() == OLD && names.iter().all(|n| n == "old");
                let whole_new = names.len() == NEW && names.iter().all(|n| n == "new");
                assert!(
                    whole_old || whole_new,
                    "reader {r} listed a partial table: {} documents {:?}",
                    names.len(),
                    names.iter().collect::<std::collections::BTreeSet<_>>()
                );
                if whole_old {
                    old += 1;
                } else {
                    new += 1;
                }
                let one = store
                    .read(&format!("k{:02}", r), &ctx)
                    .await
                    .expect("read")
                    .expect("the id is in both tables");
                assert!(["old", "new"].contains(&name(&one.payload).as_str()));
                tokio::task::yield_now().await;
            }
            (old, new)
        }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    let shadow = store.rebuild_store().await.expect("a rebuild table");
    // the rebuild in several batches, so that its table is partial for a while
    for (n, chunk) in (0..NEW).collect::<Vec<_>>().chunks(7).enumerate() {
        let writes = chunk
            .iter()
            .map(|i| put(&format!("k{i:02}"), json!({"name": "new"})))
            .collect();
        apply(&shadow, batch(&from, 2 + n as u64, writes), &W).await;
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    store.swap_rebuilt(&from, &c).await.expect("swap");
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut old, mut new) = (0, 0);
    for r in readers {
        let (o, n) = r.await.expect("a reader saw only whole tables");
        old += o;
        new += n;
    }
    assert!(old > 0 && new > 0, "reads before ({old}) and after ({new})");
    let names = listed_names(&store).await;
    assert_eq!(names.len(), NEW);
    assert_eq!(position(&store, &c).await, Some(6));
}

/// Generates one `#[tokio::test]` per output case (see [`crate::conformance_tests`]). Every
/// backend runs them; those without outputs skip each case with a message.
#[macro_export]
macro_rules! output_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@cases $make;
            outputs_position_follows_each_batch,
            outputs_put_creates_then_appends_versions,
            outputs_delete_writes_a_tombstone,
            outputs_state_rows_upsert_move_and_delete,
            outputs_dead_letters_and_reset,
            outputs_batch_failing_part_way_commits_nothing,
            outputs_race_other_writers_of_the_same_ids,
            outputs_rebuild_swaps_in_a_new_table,
            outputs_rebuild_readers_never_see_a_partial_table
        );
    };
}
