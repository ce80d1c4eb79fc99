//! `POST /_meshql/backup`: an online backup into the service's backup directory (what
//! `meshql backup` calls), and `GET /_meshql/backups`: the backups there, with a restore
//! command for each. A backup holds every document of every entity, so only a caller
//! allowed every action on every entity may take or list them.

use axum::http::StatusCode;
use meshql_engine::EntityService;
use meshql_runtime::backup::{BackupErrorKind, Written};
use meshql_runtime::Runtime;
use std::collections::HashMap;
use std::sync::Arc;

pub struct BackupEndpoint {
    pub runtime: Arc<Runtime>,
    pub services: HashMap<String, Arc<EntityService>>,
    /// The config file, for the restore command printed with each backup.
    pub config_file: String,
}

fn json_reply(status: StatusCode, body: serde_json::Value) -> axum::response::Response {
    use axum::response::IntoResponse;
    (status, axum::Json(body)).into_response()
}

/// Refused unless the caller may create, read, update and delete every entity.
fn admin(
    endpoint: &BackupEndpoint,
    headers: &axum::http::HeaderMap,
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
                format!("a backup needs every action on every entity: {name}: {e}"),
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
    if let Err(refused) = admin(&endpoint, &headers) {
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
    if let Err(refused) = admin(&endpoint, &headers) {
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

/// The routes of [`BackupEndpoint`].
pub fn router(endpoint: Arc<BackupEndpoint>) -> axum::Router {
    use axum::routing::{get, post};
    axum::Router::new()
        .route("/_meshql/backup", post(take))
        .route("/_meshql/backups", get(list))
        .with_state(endpoint)
}
