//! `read_url`: the tables on the replica are readers of their own
//! ([`meshql_core::Database::replica`], what the engine serves the API's reads from), and a
//! table's own store reads the primary only, so a write path never sees a replica's stale
//! version. The "replica" here is a second database on the test server that receives nothing:
//! a replica that has not caught up.

use meshql_core::{
    Database, NewDocument, ReadContext, Store, StoreReader, StoreWriter, WriteContext,
};
use meshql_store_mysql::{MysqlDatabase, MysqlOptions, MysqlStore};
use mysql_async::prelude::Queryable;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replica_serves_its_own_reads_and_the_primary_store_never_reads_it() {
    let url = meshql_conformance::test_server_url("mariadb", "MESHQL_TEST_MYSQL_URL");
    let (server, _) = url.rsplit_once('/').expect("a database in the URL");
    let replica_url = format!("{server}/meshql_test_lagging_replica");
    let mut admin = mysql_async::Conn::from_url(&url).await.expect("connect");
    admin
        .query_drop("CREATE DATABASE IF NOT EXISTS meshql_test_lagging_replica")
        .await
        .expect("create the lagging replica's database");
    drop(admin);
    let table = format!("replica_{}", uuid::Uuid::new_v4().simple());

    let without = MysqlDatabase::connect(&MysqlOptions::new(url.clone())).unwrap();
    assert!(
        without.clone().replica(&table).is_none(),
        "no read_url, no replica"
    );
    let db = MysqlDatabase::connect(&MysqlOptions {
        read_url: Some(replica_url.clone()),
        ..MysqlOptions::new(url.clone())
    })
    .unwrap();
    let primary = MysqlStore::new(db.clone(), &table);
    primary.prepare(&[]).await.unwrap();
    // the replica has the table (as a replica would) but not the write below
    let lagging = MysqlStore::new(
        MysqlDatabase::connect(&MysqlOptions::new(replica_url)).unwrap(),
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
    db.ping().await.expect("both pools answer");
}
