//! `/_meshql/processors`: each processor's state, and `POST /_meshql/processors/{name}/rebuild`
//! (what `meshql projections rebuild` calls).

use meshql_engine::EntityService;
use meshql_process::{ProcessorStats, Processors};
use std::collections::HashMap;
use std::sync::Arc;

/// `/_meshql/processors`: each processor's state, and `POST
/// /_meshql/processors/{name}/rebuild` (what `meshql projections rebuild` calls).
pub struct ProcessorsEndpoint {
    pub processors: Arc<Processors>,
    pub services: HashMap<String, Arc<EntityService>>,
}

fn state_json(state: &meshql_process::RebuildState) -> serde_json::Value {
    use meshql_process::RebuildState as S;
    match state {
        S::Idle => serde_json::json!({"state": "idle"}),
        S::Running { position, lag } => {
            serde_json::json!({"state": "running", "position": position, "lag": lag})
        }
        S::Done { position, seconds } => {
            serde_json::json!({"state": "done", "position": position, "seconds": seconds})
        }
        S::Failed { reason } => serde_json::json!({"state": "failed", "reason": reason}),
    }
}

fn describe(endpoint: &ProcessorsEndpoint, s: &ProcessorStats) -> serde_json::Value {
    serde_json::json!({
        "name": s.name, "type": s.kind, "output": s.output, "inputs": s.inputs,
        "position": s.position, "lag": s.lag, "lag_seconds": s.lag_seconds,
        "processed": s.processed, "outputs": s.written, "batches": s.batches,
        "dead_letters": s.dead_letters, "errors": s.errors,
        "rebuild": endpoint.processors.rebuild_state(&s.name).map(|r| state_json(&r)),
    })
}

fn json_reply(status: axum::http::StatusCode, body: serde_json::Value) -> axum::response::Response {
    use axum::response::IntoResponse;
    (status, axum::Json(body)).into_response()
}

/// The engine's refusal as an answer: its status, `{error, code}` and, for refused
/// credentials, `WWW-Authenticate` (the backup routes answer the same way).
pub(crate) fn refusal(e: &meshql_engine::EngineError) -> axum::response::Response {
    refusal_saying(e, e.to_string())
}

/// [`refusal`] with its own `error` text.
pub(crate) fn refusal_saying(
    e: &meshql_engine::EngineError,
    error: String,
) -> axum::response::Response {
    let kind = e.kind();
    let mut r = json_reply(
        meshql_rest::edge::status(kind),
        serde_json::json!({"error": error, "code": kind.code()}),
    );
    if let meshql_engine::EngineError::Auth(refused) = e {
        if let Some(challenge) = meshql_rest::edge::www_authenticate(refused)
            .and_then(|c| axum::http::HeaderValue::from_str(&c).ok())
        {
            r.headers_mut()
                .insert(axum::http::header::WWW_AUTHENTICATE, challenge);
        }
    }
    r
}

/// Whether the caller of `headers` may read `s`'s output entity (what its state describes).
fn may_see(
    endpoint: &ProcessorsEndpoint,
    headers: &axum::http::HeaderMap,
    s: &ProcessorStats,
) -> Result<(), meshql_engine::EngineError> {
    let Some(service) = endpoint.services.get(&s.output) else {
        return Ok(());
    };
    let authorization = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let session = service.session(authorization, None)?;
    service.may_read(&session.grants)
}

/// The processors whose output the caller may read.
async fn list_processors(
    axum::extract::State(endpoint): axum::extract::State<Arc<ProcessorsEndpoint>>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    let mut all = Vec::new();
    for s in endpoint.processors.stats() {
        match may_see(&endpoint, &headers, &s) {
            Ok(()) => all.push(describe(&endpoint, &s)),
            // refused credentials are refused, whichever processor
            Err(e @ meshql_engine::EngineError::Auth(_)) => return refusal(&e),
            Err(_) => {}
        }
    }
    json_reply(
        axum::http::StatusCode::OK,
        serde_json::json!({ "processors": all }),
    )
}

/// One processor's state, when the caller may read its output.
async fn one_processor(
    axum::extract::State(endpoint): axum::extract::State<Arc<ProcessorsEndpoint>>,
    axum::extract::Path(name): axum::extract::Path<String>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    match endpoint.processors.stats().iter().find(|s| s.name == name) {
        Some(s) => match may_see(&endpoint, &headers, s) {
            Ok(()) => json_reply(axum::http::StatusCode::OK, describe(&endpoint, s)),
            Err(e) => refusal(&e),
        },
        None => json_reply(
            axum::http::StatusCode::NOT_FOUND,
            serde_json::json!({"error": format!("no processor named \"{name}\" runs here")}),
        ),
    }
}

/// Starts a rebuild; the caller must be allowed to create, update and delete the
/// processor's output entity (what a rebuild does to it).
async fn start_rebuild(
    axum::extract::State(endpoint): axum::extract::State<Arc<ProcessorsEndpoint>>,
    axum::extract::Path(name): axum::extract::Path<String>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    use axum::http::StatusCode;
    let Some(stats) = endpoint
        .processors
        .stats()
        .into_iter()
        .find(|s| s.name == name)
    else {
        return json_reply(
            StatusCode::NOT_FOUND,
            serde_json::json!({"error": format!("no processor named \"{name}\" runs here")}),
        );
    };
    let service = &endpoint.services[&stats.output];
    let authorization = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let allowed = service.session(authorization, None).and_then(|session| {
        for action in [
            meshql_core::Action::Create,
            meshql_core::Action::Update,
            meshql_core::Action::Delete,
        ] {
            service.check(&session, action)?;
        }
        Ok(())
    });
    if let Err(e) = allowed {
        return refusal(&e);
    }
    if matches!(
        endpoint.processors.rebuild_state(&name),
        Some(meshql_process::RebuildState::Running { .. })
    ) {
        return json_reply(
            StatusCode::CONFLICT,
            serde_json::json!({"error": format!("processor \"{name}\" is being rebuilt already")}),
        );
    }
    let processors = endpoint.processors.clone();
    let task_name = name.clone();
    tokio::spawn(async move {
        if let Err(e) = processors.rebuild(&task_name).await {
            tracing::error!(processor = %task_name, error = %e, "rebuild failed");
        }
    });
    json_reply(
        StatusCode::ACCEPTED,
        serde_json::json!({"rebuild": "started", "status": format!("/_meshql/processors/{name}")}),
    )
}

/// The routes of [`ProcessorsEndpoint`].
pub fn router(endpoint: Arc<ProcessorsEndpoint>) -> axum::Router {
    use axum::routing::{get, post};
    axum::Router::new()
        .route("/_meshql/processors", get(list_processors))
        .route("/_meshql/processors/{name}", get(one_processor))
        .route("/_meshql/processors/{name}/rebuild", post(start_rebuild))
        .with_state(endpoint)
}
