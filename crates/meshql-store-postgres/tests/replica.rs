//! `read_url`: the table on the replica is a reader of its own ([`PostgresStore::replica`],
//! what the engine serves the API's reads from), and the primary store reads the primary
//! only, so a write path never sees a replica's stale version. The "replica" here is a second
//! database on the test server that receives nothing: a replica that has not caught up.

use meshql_core::{
    Database, NewDocument, ReadContext, Store, StoreReader, StoreWriter, WriteContext,
};
use meshql_store_postgres::{PostgresDatabase, PostgresOptions, PostgresStore};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replica_serves_its_own_reads_and_the_primary_store_never_reads_it() {
    let url = meshql_conformance::test_server_url("postgres", "MESHQL_TEST_POSTGRES_URL");
    let (server, _) = url.rsplit_once('/').expect("a database in the URL");
    let replica_db = "meshql_test_lagging_replica";
    let (admin, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    let exists = admin
        .query_opt(
            "SELECT 1 FROM pg_database WHERE datname = $1",
            &[&replica_db],
        )
        .await
        .unwrap()
        .is_some();
    if !exists {
        admin
            .batch_execute(&format!("CREATE DATABASE {replica_db}"))
            .await
            .expect("create the lagging replica's database");
    }
    let replica_url = format!("{server}/{replica_db}");
    let table = format!("replica_{}", uuid::Uuid::new_v4().simple());

    let without = PostgresDatabase::connect(&PostgresOptions::new(url.clone())).unwrap();
    assert!(
        without.clone().replica(&table).is_none(),
        "no read_url, no replica"
    );
    let db = PostgresDatabase::connect(&PostgresOptions {
        read_url: Some(replica_url.clone()),
        ..PostgresOptions::new(url.clone())
    })
    .unwrap();
    let primary = PostgresStore::new(db.clone(), &table);
    primary.prepare(&[]).await.unwrap();
    // the replica has the table (as a streaming replica would) but not the write below
    let lagging = PostgresStore::new(
        PostgresDatabase::connect(&PostgresOptions::new(replica_url)).unwrap(),
        &table,
    );
    lagging.prepare(&[]).await.unwrap();
    let replica = db
        .clone()
        .replica(&table)
        .expect("read_url gives a replica");

    let written = primary
        .create(
            NewDocument::new(json!({"name": "new"}).as_object().unwrap().clone()),
            &WriteContext::SYSTEM,
        )
        .await
        .unwrap();
    assert!(
        primary
            .read(&written.id, &ReadContext::LATEST)
            .await
            .unwrap()
            .is_some(),
        "the primary store reads the primary"
    );
    assert!(
        replica
            .read(&written.id, &ReadContext::LATEST)
            .await
            .unwrap()
            .is_none(),
        "the replica store reads the replica"
    );
    assert!(replica.list(&ReadContext::LATEST).await.unwrap().is_empty());
    assert_eq!(primary.list(&ReadContext::LATEST).await.unwrap().len(), 1);
}
