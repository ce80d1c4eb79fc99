//! A GraphQL endpoint of one entity: what its routes, its subscriptions and the direct path
//! share — the registry entry, the caller's context, running a request, and the JSON
//! answers (refused credentials included).

use axum::body::Bytes;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use meshql_core::AuthError;
use meshql_engine::EntityService;
use meshql_graphql::{Budget, GraphqlRequest, Registry, RequestContext};
use meshql_runtime::Subscriptions;
use std::net::IpAddr;
use std::sync::Arc;

use crate::persisted_queries::{PersistedQueries, PersistedQueryError};
use crate::rate_limit::{graphql_refusal, GraphqlGate, RateLimiter, Refusal};

pub struct GraphEndpoint {
    pub registry: Arc<Registry>,
    pub index: usize,
    /// The entity's service: who may read is decided there, as for REST.
    pub service: Arc<EntityService>,
    pub page: Bytes,
    pub body_limit: usize,
    /// The server's subscriptions (set once the change log is open; absent when the change
    /// feed is disabled).
    pub subscriptions: Arc<std::sync::OnceLock<Arc<Subscriptions>>>,
    /// Read-your-writes: a request carrying a consistency token reads the primary until the
    /// replica has the token's version.
    pub read_after: Option<Arc<meshql_engine::ReadAfter>>,
    /// `[server.rate_limit]` (`None`: no limit, and no step of it taken).
    pub(crate) limiter: Option<Arc<RateLimiter>>,
    /// `[server.persisted_queries]`, shared by every endpoint.
    pub(crate) persisted: Arc<PersistedQueries>,
}

/// A 200 JSON response with `body`.
pub(crate) fn json_ok(body: Vec<u8>) -> Response {
    json(StatusCode::OK, body)
}

pub(crate) fn json(status: StatusCode, body: impl Into<axum::body::Body>) -> Response {
    let mut r = Response::new(body.into());
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

pub(crate) fn request_error(status: StatusCode, message: String) -> Response {
    json(
        status,
        serde_json::json!({"errors": [{"message": message}]}).to_string(),
    )
}

/// A persisted query that cannot run, as a GraphQL error with its code (Apollo's shape).
pub(crate) fn persisted_query_error(e: &PersistedQueryError) -> Response {
    json(
        e.status(),
        serde_json::json!({"errors": [{
            "message": e.to_string(),
            "extensions": {"code": e.code()},
        }]})
        .to_string(),
    )
}

/// The answer to refused credentials: 401 (503 while signing keys are unavailable) with the
/// `WWW-Authenticate` challenge and `body` as JSON. Shared by GraphQL and `/_changes`.
pub(crate) fn refused(e: &AuthError, body: String) -> Response {
    let status = meshql_rest::edge::status(e.kind());
    let mut r = json(status, body);
    if let Some(challenge) =
        meshql_rest::edge::www_authenticate(e).and_then(|c| HeaderValue::from_str(&c).ok())
    {
        r.headers_mut().insert(header::WWW_AUTHENTICATE, challenge);
    }
    r
}

/// Refused credentials as a GraphQL error body.
pub(crate) fn refused_request(e: &AuthError) -> Response {
    let body = serde_json::json!({"errors": [{
        "message": e.to_string(),
        "extensions": {"code": e.kind().code()},
    }]});
    refused(e, body.to_string())
}

impl GraphEndpoint {
    pub(crate) fn context(&self, headers: &HeaderMap) -> Result<RequestContext, AuthError> {
        let authorization = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        self.context_for(authorization)
    }

    /// The context of a caller presenting `authorization`.
    pub(crate) fn context_for(
        &self,
        authorization: Option<String>,
    ) -> Result<RequestContext, AuthError> {
        let access = self.service.access(authorization.as_deref())?;
        Ok(RequestContext::new(
            access,
            authorization,
            self.service.read_snapshot(),
        ))
    }

    /// The request's context within the budget a calling meshql sent (a federated hop), or
    /// the response refusing it.
    pub(crate) async fn context_within(
        &self,
        headers: &HeaderMap,
    ) -> Result<RequestContext, Box<Response>> {
        let mut context = self
            .context(headers)
            .map_err(|e| Box::new(refused_request(&e)))?;
        if let Some(token) = headers
            .get(meshql_engine::consistency::HEADER)
            .and_then(|v| v.to_str().ok())
        {
            if let Some(read_after) = &self.read_after {
                context.access.from_primary = read_after
                    .needs_primary(token)
                    .await
                    .map_err(|e| Box::new(request_error(StatusCode::BAD_REQUEST, e.to_string())))?;
            }
            // relationships resolved over HTTP wait for the same version
            context.consistency = Some(token.to_owned());
        }
        let Some(value) = headers.get(Budget::HEADER) else {
            return Ok(context);
        };
        let budget = value
            .to_str()
            .map_err(|_| "not text".to_owned())
            .and_then(Budget::parse)
            .map_err(|e| {
                Box::new(request_error(
                    StatusCode::BAD_REQUEST,
                    format!("malformed {} header: {e}", Budget::HEADER),
                ))
            })?;
        Ok(context.within(budget))
    }

    /// Takes a GraphQL request's first token from its caller's bucket: `Ok(None)` when
    /// GraphQL is not limited, the refusal when the bucket is empty (answered with
    /// [`graphql_refusal`]).
    pub(crate) async fn gate(
        &self,
        headers: &HeaderMap,
        client: Option<IpAddr>,
    ) -> Result<Option<GraphqlGate>, Refusal> {
        let Some(limiter) = &self.limiter else {
            return Ok(None);
        };
        let authorization = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        GraphqlGate::enter(limiter, authorization, client).await
    }

    /// Runs a request (charged its cost when GraphQL is limited by cost).
    pub(crate) async fn run(
        &self,
        request: GraphqlRequest,
        context: &RequestContext,
        gate: Option<GraphqlGate>,
    ) -> Response {
        let Some(mut gate) = gate.filter(GraphqlGate::by_cost) else {
            let body = self.registry.execute(self.index, &request, context).await;
            return json(StatusCode::OK, body);
        };
        let plan = match self.registry.prepare(self.index, &request) {
            Ok(plan) => plan,
            Err(body) => return json(StatusCode::OK, body),
        };
        if let Err(refusal) = gate.charge(plan.cost).await {
            return graphql_refusal(&refusal);
        }
        let body = self
            .registry
            .execute_plan(self.index, &plan, &request, context)
            .await;
        json(StatusCode::OK, body)
    }
}
