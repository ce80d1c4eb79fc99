//! The JSON-lines relay passes the relay conformance suite, reading back its file.

use meshql_changes::RelayRegistry;
use meshql_relay_jsonl::JsonlBackend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jsonl_relay_passes_the_relay_suite() {
    let dir = std::env::temp_dir().join(format!("meshql-jsonl-{}", std::process::id()));
    let file = dir.join("audit/changes.jsonl");
    let registry = RelayRegistry::new().register(JsonlBackend);
    let settings = serde_json::json!({
        "path": file.display().to_string(),
        // small enough that the file rolls over once in the suite
        "max_bytes": 7000,
    });
    meshql_conformance::relay_conformance(&registry, "jsonl", "audit", settings, || {
        let file = file.clone();
        async move {
            // the rolled file first, then the current one
            let mut rolled = file.clone().into_os_string();
            rolled.push(".1");
            let mut ids = Vec::new();
            for path in [std::path::PathBuf::from(rolled), file] {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                for line in text.lines() {
                    let v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
                    ids.push(v["change_id"].as_str().expect("a change id").to_owned());
                }
            }
            ids
        }
    })
    .await;
    let mut rolled = file.clone().into_os_string();
    rolled.push(".1");
    assert!(
        std::path::Path::new(&rolled).exists(),
        "the file rolled over past max_bytes"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn settings_are_checked_and_named() {
    let registry = RelayRegistry::new().register(JsonlBackend);
    let context = meshql_changes::RelayContext {
        name: "audit",
        entities: &[],
        data_dir: std::path::Path::new("/srv/meshql"),
    };
    let e = registry
        .configure("jsonl", &serde_json::json!({"path": " "}), &context)
        .unwrap_err();
    assert_eq!(e.field.as_deref(), Some("path"));
    let e = registry
        .configure(
            "jsonl",
            &serde_json::json!({"path": "a", "max_bytes": 10}),
            &context,
        )
        .unwrap_err();
    assert_eq!(e.field.as_deref(), Some("max_bytes"));
    let e = registry
        .configure("jsonl", &serde_json::json!({}), &context)
        .unwrap_err();
    assert!(e.message.contains("missing field `path`"), "{e}");
}
