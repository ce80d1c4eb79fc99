//! What every case shares, and what the backends call: the templates stores are prepared
//! with, the small helpers the cases write and read with, the [`crate::conformance_tests!`]
//! macro and [`test_server_url`].

use meshql_core::{
    BoundArgs, DynStore, Millis, NewDocument, QueryTemplate, TokenFilter, WriteContext,
};
use serde_json::{Map, Value};
use std::collections::BTreeSet;

/// Templates every case may use; stores are prepared with them.
pub fn templates() -> Vec<QueryTemplate> {
    vec![by_id(), by_name(), by_name_and_type(), by_parent(), all()]
}

pub(crate) fn by_id() -> QueryTemplate {
    QueryTemplate::filter(r#"{"id": "{{id}}"}"#).unwrap()
}
pub(crate) fn by_name() -> QueryTemplate {
    QueryTemplate::filter(r#"{"payload.name": "{{name}}"}"#).unwrap()
}
pub(crate) fn by_name_and_type() -> QueryTemplate {
    QueryTemplate::filter(r#"{"payload.name": "{{name}}", "payload.type": "{{type}}"}"#).unwrap()
}
pub(crate) fn by_parent() -> QueryTemplate {
    QueryTemplate::filter(r#"{"payload.parent": "{{id}}"}"#).unwrap()
}
pub(crate) fn all() -> QueryTemplate {
    QueryTemplate::filter("{}").unwrap()
}

pub(crate) fn payload(v: Value) -> Map<String, Value> {
    v.as_object().expect("object").clone()
}

pub(crate) fn args(v: Value) -> BoundArgs {
    payload(v)
}

pub(crate) fn name_of(payload_text: &str) -> String {
    let v: Value = serde_json::from_str(payload_text).expect("payload is JSON");
    v["name"].as_str().unwrap_or_default().to_owned()
}

pub(crate) fn names<T: AsRef<str>>(payloads: impl IntoIterator<Item = T>) -> BTreeSet<String> {
    payloads.into_iter().map(|p| name_of(p.as_ref())).collect()
}

pub(crate) fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

pub(crate) const ALL: TokenFilter = TokenFilter::All;
/// A writer that sees everything and stamps no tokens.
pub(crate) const W: WriteContext = WriteContext::SYSTEM;

/// A writer holding `tokens` (they filter what it may change).
pub(crate) fn writer(tokens: &[&str]) -> WriteContext {
    WriteContext::SYSTEM.with_filter(TokenFilter::AnyOf(
        tokens.iter().map(|t| t.to_string()).collect(),
    ))
}

pub(crate) async fn create(store: &DynStore, v: Value) -> String {
    store
        .create(NewDocument::new(payload(v)), &W)
        .await
        .expect("create")
        .id
}

pub(crate) async fn create_at(store: &DynStore, id: &str, v: Value, at: Millis) {
    store
        .create(NewDocument::with_id(id, payload(v)).at(at), &W)
        .await
        .expect("create at");
}

pub(crate) fn now_ms() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as Millis
}

/// Generates one `#[tokio::test]` per conformance case. `$make` is an async expression
/// evaluating to a fresh, prepared (with [`templates`]), empty `DynStore`.
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@cases $make;
            create_assigns_uuid_and_embeds_id,
            create_honours_given_id_and_created_at,
            read_missing_is_none,
            update_appends_a_version,
            update_of_missing_or_deleted_writes_nothing,
            versions_over_time,
            list_returns_latest_only,
            lists_keep_creation_order,
            list_pages_cover_the_list_once_in_id_order,
            list_pages_at_a_fixed_time_are_one_snapshot,
            list_pages_honour_the_token_filter,
            back_dated_collisions_keep_latest_exact,
            remove_is_a_tombstone,
            tombstone_is_applied_before_filtering,
            latest_then_filter,
            read_many_and_remove_many,
            read_many_at_a_time,
            nested_search_matches_level_by_level,
            create_many_is_one_write,
            find_by_id_field_and_two_fields,
            find_with_empty_or_missing_parameters,
            find_honours_limit,
            find_at_a_time,
            find_at_moments_across_history,
            find_batch_groups_rows_by_key,
            ids_and_values_outside_latin1_are_found,
            token_filtering,
            update_keeps_the_owner_unless_told_otherwise,
            concurrent_writes_all_land,
            concurrent_writes_of_one_id_keep_one_latest,
            same_millisecond_updates_keep_every_version,
            feed_records_every_write_once,
            feed_resumes_after_any_cursor,
            failed_writes_leave_no_trace,
            feed_tail_under_concurrent_writers_is_exact,
            import_keeps_versions_and_is_idempotent
        );
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let store: ::meshql_core::DynStore = $make.await;
                $crate::$case(store.clone()).await;
                store.shutdown().await;
            }
        )*
    };
}

/// The URL of a real server for tests: the environment variable `env_var` when set (CI sets
/// it once for the whole run), or else the URL printed by `scripts/services/<service>.sh
/// start`, which installs and starts the server when needed. Panics — so the test fails
/// loudly — when no server can be had. Cached per process.
pub fn test_server_url(service: &str, env_var: &str) -> String {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static URLS: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();
    let mut urls = URLS.get_or_init(Default::default).lock().unwrap();
    if let Some(url) = urls.get(service) {
        return url.clone();
    }
    let url = match std::env::var(env_var) {
        Ok(url) => url,
        Err(_) => {
            let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../scripts/services")
                .join(format!("{service}.sh"));
            let out = std::process::Command::new("bash")
                .arg(&script)
                .arg("start")
                .stdin(std::process::Stdio::null())
                .output()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
            assert!(
                out.status.success(),
                "{service} could not be started for the tests:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).unwrap().trim().to_owned()
        }
    };
    urls.insert(service.to_owned(), url.clone());
    url
}
