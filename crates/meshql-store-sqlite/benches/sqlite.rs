//! Micro-benchmarks of the SQLite store's hot paths, on a table seeded with 10,000 farm
//! documents (~170 bytes each) in a temporary directory (WAL, `synchronous = NORMAL`, the
//! defaults a service runs with):
//!
//! * **read**: get-by-id of the latest version ([`Store::read`], REST `GET /:id` and
//!   GraphQL `getById`), and of the version at a point in time (`at`), ids picked
//!   round-robin over the whole table;
//! * **find**: a one-row search by an indexed payload field, once through a Filter template
//!   and once through the equivalent Sql template: statement lookup, argument binding
//!   (crate-private, measured here end to end) and the query;
//! * **create**: one document through the group-commit writer thread: hand-off, one
//!   transaction, commit and reply. Nothing else writes, so every create is its own group.
//!
//! Run: `cargo bench -p meshql-store-sqlite --bench sqlite`

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use meshql_core::{BoundArgs, NewDocument, QueryTemplate, Store, TokenFilter};
use meshql_core::{StoreReader as _, StoreWriter as _};
use meshql_store_sqlite::{SqliteDatabase, SqliteOptions, SqliteStore};
use serde_json::{json, Map, Value};
use std::hint::black_box;

const DOCUMENTS: usize = 10_000;

fn farm(i: usize) -> Map<String, Value> {
    let zone = ["north-east", "south-west", "east-north"][i % 3];
    json!({
        "name": format!("Emerdale Free-Range Farm {i:05}"),
        "farm_type": "local_farm",
        "zone": zone,
        "owner": "Alice & Bob Emerdale-Whitcombe"
    })
    .as_object()
    .expect("an object")
    .clone()
}

fn sqlite(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let db = SqliteDatabase::open(&dir.path().join("bench.db"), SqliteOptions::default())
        .expect("open database");
    let store = SqliteStore::new(db.clone(), "farm");
    let by_name_filter = QueryTemplate::filter(r#"{"payload.name": "{{name}}"}"#).expect("valid");
    let by_name_sql =
        QueryTemplate::sql("json_extract(payload, '$.name') = '{{name}}'").expect("valid");

    let ids: Vec<String> = rt.block_on(async {
        store
            .prepare(&[by_name_filter.clone(), by_name_sql.clone()])
            .await
            .expect("prepare");
        let mut ids = Vec::with_capacity(DOCUMENTS);
        for chunk in (0..DOCUMENTS).collect::<Vec<_>>().chunks(1_000) {
            let docs = chunk.iter().map(|&i| NewDocument::new(farm(i))).collect();
            let envs = store
                .create_many(docs, &meshql_core::WriteContext::SYSTEM)
                .await
                .expect("seed");
            ids.extend(envs.into_iter().map(|e| e.id));
        }
        ids
    });
    let payload_len = rt
        .block_on(store.read(
            &ids[0],
            &meshql_core::ReadContext::new(&TokenFilter::All, None),
        ))
        .expect("read")
        .expect("found")
        .payload
        .len();
    assert!((150..=190).contains(&payload_len), "{payload_len} bytes");
    let all = TokenFilter::All;
    // every document's only version was written before this instant
    let at = meshql_core::now_millis() + 1;

    let mut g = c.benchmark_group("read");
    let mut n = 0usize;
    g.bench_function("by_id_latest", |b| {
        b.iter(|| {
            n = (n + 7_919) % DOCUMENTS; // a prime stride visits every id
            let env = rt.block_on(store.read(
                black_box(&ids[n]),
                &meshql_core::ReadContext::new(&all, None),
            ));
            env.expect("read").expect("found")
        })
    });
    g.bench_function("by_id_at", |b| {
        b.iter(|| {
            n = (n + 7_919) % DOCUMENTS;
            let env = rt.block_on(store.read(
                black_box(&ids[n]),
                &meshql_core::ReadContext::new(&all, Some(at)),
            ));
            env.expect("read").expect("found")
        })
    });
    g.finish();

    let mut g = c.benchmark_group("find");
    let names: Vec<BoundArgs> = (0..DOCUMENTS)
        .map(|i| {
            let mut m = Map::new();
            m.insert("name".into(), farm(i)["name"].clone());
            m
        })
        .collect();
    for (label, template) in [
        ("by_name_filter", &by_name_filter),
        ("by_name_sql", &by_name_sql),
    ] {
        g.bench_function(label, |b| {
            b.iter(|| {
                n = (n + 7_919) % DOCUMENTS;
                let rows = rt.block_on(store.find(
                    &meshql_core::Search::new(template, &names[n], None),
                    &meshql_core::ReadContext::new(&all, None),
                ));
                let rows = rows.expect("find");
                assert_eq!(rows.len(), 1);
                rows
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("create");
    let doc = NewDocument::new(farm(DOCUMENTS));
    g.bench_function("single", |b| {
        b.iter_batched(
            || doc.clone(),
            |d| {
                rt.block_on(store.create(d, &meshql_core::WriteContext::SYSTEM))
                    .expect("create")
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();

    rt.block_on(db.shutdown());
}

criterion_group!(benches, sqlite);
criterion_main!(benches);
