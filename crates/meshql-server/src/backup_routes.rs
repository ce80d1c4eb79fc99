//! `POST /_meshql/backup`: an online backup into the service's backup directory (what
//! `meshql backup` calls); `GET /_meshql/backups`: the backups there, with a restore command
//! for each; `GET /_meshql/export`: an export streamed as NDJSON (what `meshql export` asks a
//! running service for; [`meshql_runtime::export`]); `POST /_meshql/import`: an export's
//! lines, streamed in, written through `import_versions` ([`meshql_runtime::import`]; at most
//! one line and a page per entity held). Each reads or writes every document of the entities
//! it covers, so only a caller allowed every action on every entity may use them.

use axum::http::StatusCode;
use meshql_engine::EntityService;
use meshql_runtime::backup::{BackupErrorKind, Written};
use meshql_runtime::export::{ExportSpec, Sink};
use meshql_runtime::import::{check_header, Importer};
use meshql_runtime::Runtime;
use std::collections::HashMap;
use std::sync::Arc;

pub struct BackupEndpoint {
    pub runtime: Arc<Runtime>,
    pub services: HashMap<String, Arc<EntityService>>,
    /// The config file, for the restore command printed with each backup.
    pub config_file: String,
    /// The data directory (named in an export's `x-meshql-data-dir` header).
    pub data_dir: String,
    /// The entities' JSON Schemas, which imported versions are validated against.
    pub validators: Arc<HashMap<String, meshql_engine::PayloadValidator>>,
}

fn json_reply(status: StatusCode, body: serde_json::Value) -> axum::response::Response {
    use axum::response::IntoResponse;
    (status, axum::Json(body)).into_response()
}

/// Refused unless the caller may create, read, update and delete every entity.
fn admin(
    endpoint: &BackupEndpoint,
    headers: &axum::http::HeaderMap,
    what: &str,
) -> Result<(), Box<axum::response::Response>> {
    let authorization = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let mut names: Vec<&String> = endpoint.services.keys().collect();
    names.sort();
    for name in names {
        let service = &endpoint.services[name];
        let allowed = service.session(authorization, None).and_then(|session| {
            for action in [
                meshql_core::Action::Create,
                meshql_core::Action::Read,
                meshql_core::Action::Update,
                meshql_core::Action::Delete,
            ] {
                service.check(&session, action)?;
            }
            Ok(())
        });
        if let Err(e) = allowed {
            return Err(Box::new(crate::processors_routes::refusal_saying(
                &e,
                format!("{what} needs every action on every entity: {name}: {e}"),
            )));
        }
    }
    Ok(())
}

/// A backup as JSON: its path, moment, size, manifest and the command that restores it.
pub fn describe(w: &Written, config_file: &str) -> serde_json::Value {
    let path = w.path.display().to_string();
    serde_json::json!({
        "path": path,
        "name": w.path.file_name().map(|n| n.to_string_lossy().into_owned()),
        "taken_at": w.manifest.taken_at,
        "taken_at_ms": w.manifest.taken_at_ms,
        "bytes": w.manifest.bytes(),
        "files": w.manifest.files.len(),
        "pause_ms": w.manifest.pause_ms,
        "seconds": w.manifest.seconds,
        "log": w.manifest.log,
        "not_included": w.manifest.not_included,
        "restore": format!(
            "meshql restore {path} --config {config_file} --data-dir NEW_DATA_DIR"
        ),
    })
}

async fn take(
    axum::extract::State(endpoint): axum::extract::State<Arc<BackupEndpoint>>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    if let Err(refused) = admin(&endpoint, &headers, "a backup") {
        return *refused;
    }
    match endpoint.runtime.backups().take(None).await {
        Ok(taken) => {
            let written = &taken.written;
            tracing::info!(
                path = %written.path.display(),
                bytes = written.manifest.bytes(),
                pause_ms = written.manifest.pause_ms,
                "backup taken"
            );
            let mut body = describe(written, &endpoint.config_file);
            body["uploaded"] = serde_json::json!(taken.uploaded);
            body["upload_error"] = serde_json::json!(taken.upload_error);
            body["pruned"] = serde_json::json!(taken.pruned);
            json_reply(StatusCode::CREATED, body)
        }
        Err(e) => {
            let status = match e.kind() {
                BackupErrorKind::Busy => StatusCode::CONFLICT,
                BackupErrorKind::DiskFull => StatusCode::INSUFFICIENT_STORAGE,
                BackupErrorKind::Failed => StatusCode::INTERNAL_SERVER_ERROR,
            };
            tracing::error!(error = %e, "backup failed");
            json_reply(
                status,
                serde_json::json!({"error": format!("backup failed: {e}")}),
            )
        }
    }
}

async fn list(
    axum::extract::State(endpoint): axum::extract::State<Arc<BackupEndpoint>>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    if let Err(refused) = admin(&endpoint, &headers, "a backup") {
        return *refused;
    }
    let dir = endpoint.runtime.backups().spec().dir.clone();
    let found = tokio::task::spawn_blocking(move || meshql_runtime::backup::list(&dir))
        .await
        .unwrap_or_default();
    let all: Vec<_> = found
        .iter()
        .map(|w| describe(w, &endpoint.config_file))
        .collect();
    json_reply(
        StatusCode::OK,
        serde_json::json!({
            "dir": endpoint.runtime.backups().spec().dir.display().to_string(),
            "s3": endpoint.runtime.backups().spec().s3.as_ref().map(|s| s.url.clone()),
            "schedule": endpoint.runtime.backups().spec().schedule,
            "keep": endpoint.runtime.backups().spec().keep,
            "backups": all,
        }),
    )
}

/// The export's parameters, every one checked: an unknown one is refused, not ignored.
fn export_spec(query: &[(String, String)]) -> Result<ExportSpec, String> {
    let mut spec = ExportSpec::default();
    for (key, value) in query {
        match key.as_str() {
            "history" => {
                spec.history = match value.as_str() {
                    "true" | "1" | "" => true,
                    "false" | "0" => false,
                    v => return Err(format!("`history` is true or false, not `{v}`")),
                }
            }
            "at" => spec.at = Some(meshql_runtime::backup::parse_moment(value)?),
            "entity" => spec.entities.extend(
                value
                    .split(',')
                    .filter(|e| !e.is_empty())
                    .map(str::to_owned),
            ),
            other => {
                return Err(format!(
                    "unknown query parameter `{other}` (an export takes: history, at, entity)"
                ))
            }
        }
    }
    Ok(spec)
}

/// Pages of an export into the response body, at most a few ahead of the client.
struct BodySink(tokio::sync::mpsc::Sender<Result<bytes::Bytes, std::io::Error>>);

#[async_trait::async_trait]
impl Sink for BodySink {
    async fn page(&mut self, _entity: &str, lines: &[u8], _exported: u64) -> Result<(), String> {
        self.0
            .send(Ok(bytes::Bytes::copy_from_slice(lines)))
            .await
            .map_err(|_| "the client went away".to_owned())
    }
}

async fn export(
    axum::extract::State(endpoint): axum::extract::State<Arc<BackupEndpoint>>,
    headers: axum::http::HeaderMap,
    query: Result<
        axum::extract::Query<Vec<(String, String)>>,
        axum::extract::rejection::QueryRejection,
    >,
) -> axum::response::Response {
    if let Err(refused) = admin(&endpoint, &headers, "an export") {
        return *refused;
    }
    let query = match query {
        Ok(axum::extract::Query(q)) => q,
        Err(e) => {
            return json_reply(
                StatusCode::BAD_REQUEST,
                serde_json::json!({"error": e.body_text()}),
            )
        }
    };
    let spec = match export_spec(&query) {
        Ok(spec) => spec,
        Err(e) => return json_reply(StatusCode::BAD_REQUEST, serde_json::json!({"error": e})),
    };
    let stores: Vec<(String, meshql_core::DynStore)> = endpoint.runtime.stores().to_vec();
    let header = match meshql_runtime::export::chosen(&stores, &spec) {
        Ok(chosen) => meshql_runtime::export::header(&spec, &chosen),
        Err(e) => return json_reply(StatusCode::NOT_FOUND, serde_json::json!({"error": e})),
    };
    // a bounded channel: the export reads a page only when the client took the one before
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        if tx.send(Ok(bytes::Bytes::from(header))).await.is_err() {
            return;
        }
        let chosen = meshql_runtime::export::chosen(&stores, &spec).expect("checked above");
        let mut sink = BodySink(tx.clone());
        match meshql_runtime::export::export(&chosen, &spec, &mut sink).await {
            Ok(counts) => {
                let total: u64 = counts.iter().map(|(_, n)| n).sum();
                tracing::info!(versions = total, history = spec.history, "export served");
            }
            Err(e) => {
                tracing::error!(error = %e, "export failed: the response is cut short");
                // an error in the body's stream ends the response without its last chunk:
                // the client sees a broken transfer, never a silently short export
                let _ = tx.send(Err(std::io::Error::other(e))).await;
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let body = axum::body::Body::from_stream(stream);
    axum::response::Response::builder()
        .status(StatusCode::OK)
        .header(axum::http::header::CONTENT_TYPE, "application/x-ndjson")
        .header("x-meshql-data-dir", &endpoint.data_dir)
        .body(body)
        .expect("a valid response")
}

/// The longest line an import takes: a version bigger than this is refused (413).
const MAX_LINE: usize = 16 << 20;

async fn import(
    axum::extract::State(endpoint): axum::extract::State<Arc<BackupEndpoint>>,
    headers: axum::http::HeaderMap,
    body: axum::body::Body,
) -> axum::response::Response {
    use futures::StreamExt;
    if let Err(refused) = admin(&endpoint, &headers, "an import") {
        return *refused;
    }
    let stores: Vec<(String, meshql_core::DynStore)> = endpoint.runtime.stores().to_vec();
    let mut importer = Importer::new(&stores, endpoint.validators.clone());
    let mut stream = body.into_data_stream();
    let mut buffer: Vec<u8> = Vec::new();
    let mut line_no = 0u64;
    let bad = |status: StatusCode, e: String| json_reply(status, serde_json::json!({"error": e}));
    loop {
        let chunk = match stream.next().await {
            Some(Ok(chunk)) => Some(chunk),
            Some(Err(e)) => {
                return bad(
                    StatusCode::BAD_REQUEST,
                    format!("the import's body broke off after line {line_no}: {e}"),
                )
            }
            None => None,
        };
        let done = chunk.is_none();
        if let Some(chunk) = chunk {
            buffer.extend_from_slice(&chunk);
        }
        // every whole line in the buffer (the last one too once the body has ended)
        let mut start = 0;
        while let Some(end) = buffer[start..]
            .iter()
            .position(|b| *b == b'\n')
            .map(|i| start + i)
            .or((done && start < buffer.len()).then_some(buffer.len()))
        {
            line_no += 1;
            let Ok(line) = std::str::from_utf8(&buffer[start..end]) else {
                return bad(
                    StatusCode::BAD_REQUEST,
                    format!("line {line_no} is not UTF-8"),
                );
            };
            let result = if line_no == 1 {
                check_header(line).map_err(|e| (StatusCode::BAD_REQUEST, e))
            } else {
                importer
                    .line(line_no, line)
                    .await
                    .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e))
            };
            if let Err((status, e)) = result {
                return bad(status, format!("import stopped at line {line_no}: {e}"));
            }
            start = (end + 1).min(buffer.len());
            if end == buffer.len() {
                break;
            }
        }
        buffer.drain(..start);
        if buffer.len() > MAX_LINE {
            return bad(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "line {} is longer than {MAX_LINE} bytes: not a version of an export",
                    line_no + 1
                ),
            );
        }
        if done {
            break;
        }
    }
    if line_no == 0 {
        return bad(StatusCode::BAD_REQUEST, "an empty import".into());
    }
    match importer.finish().await {
        Ok(report) => {
            tracing::info!(
                versions = report.versions,
                written = report.written(),
                refused = report.refused(),
                "import served"
            );
            json_reply(
                StatusCode::OK,
                serde_json::to_value(&report).expect("a report serialises"),
            )
        }
        Err(e) => bad(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("import stopped at its end: {e}"),
        ),
    }
}

/// The routes of [`BackupEndpoint`].
pub fn router(endpoint: Arc<BackupEndpoint>) -> axum::Router {
    use axum::routing::{get, post};
    axum::Router::new()
        .route("/_meshql/backup", post(take))
        .route("/_meshql/backups", get(list))
        .route("/_meshql/export", get(export))
        .route("/_meshql/import", post(import))
        .with_state(endpoint)
}
