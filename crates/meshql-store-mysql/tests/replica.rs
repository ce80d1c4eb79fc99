//! `read_url`: the tables on the replica are readers of their own
//! ([`meshql_core::Database::replica`], what the engine serves the API's reads from), and a
//! table's own store reads the primary only, so a write path never sees a replica's stale
//! version. The "replica" here is a second database on the test server that receives nothing:
//! a replica that has not caught up.
//!
//! The replica's probe ([`meshql_core::Database::replica_probe`]): such a database is no
//! replica, so it cannot tell its lag; a `read_url` where nothing listens is unavailable
//! (and leaves the primary ready); a replica pool with every connection lent out is saturated,
//! and the probe does not queue for a connection then.

use meshql_core::replica::ReplicaSettings;
use meshql_core::{
    Database, NewDocument, ReadContext, Store, StoreError, StoreReader, StoreWriter, WriteContext,
};
use meshql_store_mysql::{MysqlDatabase, MysqlOptions, MysqlStore};
use mysql_async::prelude::Queryable;
use serde_json::json;
use std::time::{Duration, Instant};

const REPLICA_DB: &str = "meshql_test_lagging_replica";

/// The test server's URL, and the URL of [`REPLICA_DB`] on it (created if missing).
async fn urls() -> (String, String) {
    let url = meshql_conformance::test_server_url("mariadb", "MESHQL_TEST_MYSQL_URL");
    let (server, _) = url.rsplit_once('/').expect("a database in the URL");
    let replica_url = format!("{server}/{REPLICA_DB}");
    let mut admin = mysql_async::Conn::from_url(&url).await.expect("connect");
    admin
        .query_drop(format!("CREATE DATABASE IF NOT EXISTS {REPLICA_DB}"))
        .await
        .expect("create the lagging replica's database");
    admin.disconnect().await.unwrap();
    (url, replica_url)
}

/// A port on which nothing listens.
fn dead_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replica_serves_its_own_reads_and_the_primary_store_never_reads_it() {
    let (url, replica_url) = urls().await;
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
    db.ping().await.expect("the primary answers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_not_a_replica_cannot_tell_its_lag() {
    let (url, replica_url) = urls().await;
    let without = MysqlDatabase::connect(&MysqlOptions::new(url.clone())).unwrap();
    assert!(!without.has_replica());
    assert!(without.replica_probe().is_none(), "no read_url, no probe");

    let settings = ReplicaSettings {
        max_lag: Duration::from_millis(1500),
        probe_every: Duration::from_millis(20),
    };
    let db = MysqlDatabase::connect(&MysqlOptions {
        read_url: Some(replica_url),
        replica: settings,
        ..MysqlOptions::new(url)
    })
    .unwrap();
    assert!(db.has_replica());
    let probe = db.clone().replica_probe().expect("read_url gives a probe");
    assert_eq!(probe.settings(), settings);
    assert!(!probe.saturated(), "idle");
    for _ in 0..3 {
        assert_eq!(
            probe.lag().await.expect("the replica answers"),
            None,
            "no replication status: no lag to tell"
        );
    }
    assert!(!probe.saturated(), "the probe gave its connection back");
    db.close().await;
}

/// A user who may not see replication status (MariaDB's `SLAVE MONITOR`) has a replica whose
/// lag cannot be told: not one that is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_the_privilege_to_see_replication_cannot_tell_the_lag() {
    let (url, _) = urls().await;
    let (server, _) = url.rsplit_once('/').unwrap();
    let (_, host) = server.rsplit_once('@').expect("credentials in the URL");
    let mut admin = mysql_async::Conn::from_url(&url).await.unwrap();
    admin
        .query_drop(
            "CREATE USER IF NOT EXISTS 'meshql_probe_unprivileged'@'%' IDENTIFIED BY 'probe'",
        )
        .await
        .expect("create an unprivileged user");
    let plain_url = format!("mysql://meshql_probe_unprivileged:probe@{host}");
    let mut plain = mysql_async::Conn::from_url(&plain_url).await.unwrap();
    let refused = plain.query_drop("SHOW REPLICA STATUS").await.unwrap_err();
    assert!(
        matches!(&refused, mysql_async::Error::Server(e) if e.code == 1227),
        "{refused:?}"
    );
    plain.disconnect().await.unwrap();

    let db = MysqlDatabase::connect(&MysqlOptions {
        read_url: Some(plain_url),
        ..MysqlOptions::new(url)
    })
    .unwrap();
    let probe = db.clone().replica_probe().unwrap();
    assert_eq!(
        probe.lag().await.expect("reachable, only not allowed"),
        None
    );
    db.close().await;
    admin
        .query_drop("DROP USER IF EXISTS 'meshql_probe_unprivileged'@'%'")
        .await
        .unwrap();
    admin.disconnect().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_where_nothing_listens_is_unavailable_and_the_primary_stays_ready() {
    let (url, replica_url) = urls().await;
    let (server, _) = replica_url.rsplit_once('/').unwrap();
    let (credentials, _) = server.rsplit_once('@').unwrap();
    let dead = format!("{credentials}@127.0.0.1:{}/{REPLICA_DB}", dead_port());
    let db = MysqlDatabase::connect(&MysqlOptions {
        read_url: Some(dead),
        pool_wait: Duration::from_secs(2),
        ..MysqlOptions::new(url)
    })
    .unwrap();
    let probe = db.clone().replica_probe().unwrap();
    let started = Instant::now();
    let lag = tokio::time::timeout(Duration::from_secs(10), probe.lag())
        .await
        .expect("the probe ends");
    assert!(matches!(lag, Err(StoreError::Unavailable(_))), "{lag:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(!probe.saturated(), "no connection lent to a dead replica");
    db.ping()
        .await
        .expect("a dead replica does not make the database unready");
    db.close().await;
}

/// `pool_size = 1`: a read on the replica that waits for a table lock holds its only
/// connection; meanwhile the replica is saturated and the probe answers at once with its last
/// measurement instead of queueing behind the read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_with_every_connection_lent_is_saturated_and_the_probe_does_not_queue() {
    let (url, replica_url) = urls().await;
    let table = format!("saturated_{}", uuid::Uuid::new_v4().simple());
    let db = MysqlDatabase::connect(&MysqlOptions {
        read_url: Some(replica_url.clone()),
        pool_size: 1,
        pool_wait: Duration::from_secs(30),
        ..MysqlOptions::new(url)
    })
    .unwrap();
    MysqlStore::new(
        MysqlDatabase::connect(&MysqlOptions::new(replica_url.clone())).unwrap(),
        &table,
    )
    .prepare(&[])
    .await
    .unwrap();
    let probe = db.clone().replica_probe().unwrap();
    assert_eq!(probe.lag().await.unwrap(), None, "measured once");
    assert!(!probe.saturated(), "idle");

    let mut locker = mysql_async::Conn::from_url(&replica_url).await.unwrap();
    locker
        .query_drop(format!("LOCK TABLES `{table}` WRITE"))
        .await
        .unwrap();
    let replica = db.clone().replica(&table).unwrap();
    let read = tokio::spawn(async move { replica.list(&ReadContext::LATEST).await });
    let deadline = Instant::now() + Duration::from_secs(10);
    while !probe.saturated() {
        assert!(
            Instant::now() < deadline,
            "the read never took the connection"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!read.is_finished(), "the read waits for the lock");
    let lag = tokio::time::timeout(Duration::from_millis(500), probe.lag())
        .await
        .expect("the probe does not queue for the connection");
    assert_eq!(lag.unwrap(), None, "the last measurement");
    assert!(probe.saturated());

    locker.query_drop("UNLOCK TABLES").await.unwrap();
    locker.disconnect().await.unwrap();
    assert!(read.await.unwrap().unwrap().is_empty());
    assert!(!probe.saturated(), "the connection went back");
    assert_eq!(probe.lag().await.unwrap(), None);
    db.close().await;
}
