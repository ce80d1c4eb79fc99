//! REST errors, converted to an HTTP status and a JSON body in one place.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use meshql_engine::EngineError;
use serde_json::json;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum RestError {
    #[error("Malformed JSON: {0}")]
    MalformedJson(String),
    #[error("Missing ids parameter")]
    MissingIds,
    /// A query parameter with a value it cannot take: its name, and why.
    #[error("invalid `{0}` parameter: {1}")]
    BadParameter(&'static str, String),
    /// A query parameter the route does not take: its name, and the ones it takes.
    #[error("{}", meshql_core::suggest::unknown_parameter(name, known))]
    UnknownParameter {
        name: String,
        known: &'static [&'static str],
    },
    /// No document at the `at` of the read, which looks like seconds, not milliseconds.
    #[error("Resource not found")]
    NotFoundAt(meshql_core::Millis),
    #[error("Resource not found or could not be deleted")]
    NotDeleted,
    #[error("request body is larger than {0} bytes")]
    TooLarge(usize),
    #[error("cannot read the request body: {0}")]
    Body(String),
    #[error("method {0} is not allowed here")]
    MethodNotAllowed(String, &'static str),
    /// A write sent to a process serving the read role (`meshql serve --role read`).
    #[error("method {0} is not allowed here: this process serves the read role; send writes to the write role")]
    ReadRole(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// What a read-role process allows on every REST route.
pub(crate) const READ_ROLE_ALLOW: &str = "GET, OPTIONS";

impl RestError {
    pub const NOT_FOUND: RestError = RestError::Engine(EngineError::NotFound);
}

impl RestError {
    pub fn status(&self) -> StatusCode {
        match self {
            RestError::MalformedJson(_)
            | RestError::MissingIds
            | RestError::Body(_)
            | RestError::BadParameter(..) => StatusCode::BAD_REQUEST,
            RestError::UnknownParameter { .. } => StatusCode::BAD_REQUEST,
            RestError::NotDeleted | RestError::NotFoundAt(_) => StatusCode::NOT_FOUND,
            RestError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            RestError::MethodNotAllowed(..) | RestError::ReadRole(_) => {
                StatusCode::METHOD_NOT_ALLOWED
            }
            RestError::Engine(e) => crate::edge::status(e.kind()),
        }
    }
}

impl IntoResponse for RestError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::error!(error = %self, "REST request failed");
        }
        let body = match &self {
            RestError::Engine(EngineError::Invalid(details))
            | RestError::Engine(EngineError::InvalidBatch(details)) => {
                json!({ "error": self.to_string(), "details": details })
            }
            // a refused caller: the kind's code too, as GraphQL's extensions.code
            RestError::Engine(EngineError::Auth(e)) => {
                json!({ "error": self.to_string(), "code": e.kind().code() })
            }
            // a caller its permissions refuse: 403 with the code, as GraphQL's FORBIDDEN
            RestError::Engine(EngineError::Forbidden(e)) => {
                json!({ "error": self.to_string(), "code": e.kind().code() })
            }
            RestError::BadParameter(name, _) => {
                json!({ "error": self.to_string(), "parameter": name })
            }
            RestError::UnknownParameter { name, known } => {
                json!({ "error": self.to_string(), "parameter": name, "known": known })
            }
            RestError::NotFoundAt(at) => json!({
                "error": self.to_string(),
                "hint": meshql_core::time::seconds_hint(*at),
            }),
            _ => json!({ "error": self.to_string() }),
        };
        let mut response = (status, axum::Json(body)).into_response();
        if let RestError::Engine(EngineError::Auth(e)) = &self {
            if let Some(challenge) =
                crate::edge::www_authenticate(e).and_then(|c| HeaderValue::from_str(&c).ok())
            {
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, challenge);
            }
        }
        if let RestError::ReadRole(_) = &self {
            response
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(READ_ROLE_ALLOW));
        }
        if let RestError::MethodNotAllowed(_, allow) = self {
            response
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(allow));
        }
        response
    }
}
