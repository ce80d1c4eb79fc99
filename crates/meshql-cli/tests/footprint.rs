//! The executable's start-up pages are released once the server listens
//! (src/startup_pages.rs): the server keeps serving every kind of request, and its resident
//! file-backed memory is below that of the same server keeping them.

mod common;

use common::{examples_dir, Server};
use serde_json::json;

/// `RssFile` of a process, in KiB.
fn rss_file_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssFile:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no RssFile in\n{status}"))
}

/// Creates a farm, reads it through REST and GraphQL, and updates it.
async fn exercise(s: &Server) {
    let c = s.client();
    let created = c
        .post_json(
            "/farm/api",
            &json!({"name": "Paged", "farm_type": "megafarm", "zone": "north"}),
        )
        .await;
    created.expect_status(201);
    let id = created.json()["id"].as_str().unwrap().to_owned();
    let read = c.get(&format!("/farm/api/{id}")).await;
    read.expect_status(200);
    assert_eq!(read.json()["name"], "Paged");
    let query = format!(r#"{{ getById(id: "{id}") {{ name coops {{ name }} }} }}"#);
    let graph = c.post_json("/farm/graph", &json!({ "query": query })).await;
    graph.expect_status(200);
    assert_eq!(graph.json()["data"]["getById"]["name"], "Paged");
    c.put_json(
        &format!("/farm/api/{id}"),
        &json!({"name": "Paged again", "farm_type": "megafarm", "zone": "north"}),
    )
    .await
    .expect_status(200);
}

#[tokio::test]
async fn startup_pages_are_released_and_serving_goes_on() {
    let config = examples_dir().join("egg-economy");
    let released = Server::start(&config, &[]);
    let kept = Server::start_with_env(
        &config,
        &[("MESHQL_KEEP_STARTUP_PAGES", "1".to_owned())],
        None,
    );
    for s in [&released, &kept] {
        exercise(s).await;
    }
    let (with_release, without) = (rss_file_kib(released.pid()), rss_file_kib(kept.pid()));
    assert!(
        with_release < without,
        "RssFile {with_release} KiB with the start-up pages released, {without} KiB without"
    );
}
