//! Micro-benchmarks of meshql-core's per-request work:
//!
//! * **envelope**: turning a written document into stored payload text
//!   ([`NewDocument::into_payload_text`], every create and update) and parsing stored text
//!   back into a map ([`Envelope::payload_map`], reads that need the fields), on a
//!   ~170-byte egg-economy farm document;
//! * **template**: binding a query's arguments to a Filter template (what every backend
//!   does per search), rendering an interpolated value, and evaluating a template against
//!   one document ([`QueryTemplate::matches`], the in-memory store's inner loop). Parsing
//!   of Filter and Sql templates is measured too, as a reference: it happens once at
//!   start-up. SQL templates are bound inside the SQL backends (private code); their
//!   binding is measured end to end by `meshql-store-sqlite`'s `find` benches.
//!
//! Run: `cargo bench -p meshql-core --bench core`

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use meshql_core::template::TemplateKind;
use meshql_core::{ArgValue, BoundArgs, Envelope, NewDocument, QueryTemplate};
use serde_json::{json, Map, Value};
use std::hint::black_box;

const FARM_ID: &str = "3f1c6a52-8e0b-4d6f-9a51-2b7c0e9d4a18";

/// A farm as REST receives it (no id); 169 bytes once stored with its id.
fn farm_payload() -> Map<String, Value> {
    json!({
        "name": "Emerdale Free-Range Egg Farm",
        "farm_type": "local_farm",
        "zone": "north-east",
        "owner": "Alice & Bob Emerdale-Whitcombe"
    })
    .as_object()
    .expect("an object")
    .clone()
}

fn args(v: Value) -> BoundArgs {
    v.as_object().expect("an object").clone()
}

fn envelope(c: &mut Criterion) {
    let doc = NewDocument::new(farm_payload());
    let stored = doc.clone().into_payload_text(FARM_ID);
    assert!(
        (150..=190).contains(&stored.len()),
        "farm document is {} bytes",
        stored.len()
    );
    let env = Envelope {
        id: FARM_ID.to_owned(),
        payload: stored.clone(),
        created_at: 1_700_000_000_000,
        deleted: false,
        authorized_tokens: Vec::new(),
    };

    let mut g = c.benchmark_group("envelope");
    g.bench_function("serialise/into_payload_text", |b| {
        b.iter_batched(
            || doc.clone(),
            |d| d.into_payload_text(black_box(FARM_ID)),
            BatchSize::SmallInput,
        )
    });
    g.bench_function("deserialise/payload_map", |b| {
        b.iter(|| black_box(&env).payload_map().expect("valid JSON"))
    });
    // what REST does with a request body before `NewDocument::new`
    let body = serde_json::to_vec(&Value::Object(farm_payload())).expect("serialises");
    g.bench_function("deserialise/new_document_from_body", |b| {
        b.iter(|| {
            let map: Map<String, Value> =
                serde_json::from_slice(black_box(&body)).expect("valid JSON");
            NewDocument::new(map)
        })
    });
    g.finish();
}

fn template(c: &mut Criterion) {
    const BY_ID: &str = r#"{"id": "{{id}}"}"#;
    const BY_FARM: &str = r#"{"payload.farm_id": "{{id}}"}"#;
    const INTERPOLATED: &str = r#"{"payload.zone": "{{region}}-{{side}}"}"#;
    const SQL: &str = "json_extract(payload, '$.zone') = '{{zone}}' AND json_extract(payload, '$.name') LIKE '%{{name}}%'";

    let mut g = c.benchmark_group("template");
    g.bench_function("parse/filter", |b| {
        b.iter(|| QueryTemplate::filter(black_box(BY_FARM)).expect("valid"))
    });
    g.bench_function("parse/sql", |b| {
        b.iter(|| QueryTemplate::sql(black_box(SQL)).expect("valid"))
    });

    let by_id = QueryTemplate::filter(BY_ID).expect("valid");
    let interpolated = QueryTemplate::filter(INTERPOLATED).expect("valid");
    let id_args = args(json!({ "id": FARM_ID }));
    let zone_args = args(json!({ "region": "north", "side": "east" }));
    let predicates = |t: &QueryTemplate| -> Vec<ArgValue> {
        match &t.kind {
            TemplateKind::Filter(preds) => preds.iter().map(|(_, v)| v.clone()).collect(),
            TemplateKind::Sql(_) | TemplateKind::Query(_) => unreachable!("a filter template"),
        }
    };
    let by_id_values = predicates(&by_id);
    let interpolated_values = predicates(&interpolated);
    g.bench_function("bind/filter_arg", |b| {
        b.iter(|| {
            for v in &by_id_values {
                black_box(v.bind(black_box(&id_args)));
            }
        })
    });
    g.bench_function("bind/filter_interpolated", |b| {
        b.iter(|| {
            for v in &interpolated_values {
                black_box(v.bind(black_box(&zone_args)));
            }
        })
    });

    let mut payload = farm_payload();
    payload.insert("id".into(), Value::String(FARM_ID.into()));
    g.bench_function("matches/filter_by_id", |b| {
        b.iter(|| by_id.matches(black_box(&id_args), FARM_ID, black_box(&payload)))
    });
    g.bench_function("matches/filter_interpolated", |b| {
        b.iter(|| interpolated.matches(black_box(&zone_args), FARM_ID, black_box(&payload)))
    });
    g.finish();
}

criterion_group!(benches, envelope, template);
criterion_main!(benches);
