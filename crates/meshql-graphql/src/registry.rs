//! The top of the crate: the graphlettes of one service, addressable by path, each with its
//! plan cache, and the fetchers built for them (one per graphlette's store, one HTTP client
//! shared by remote resolvers). [`Registry::execute`] plans (or finds the cached plan) and
//! hands it to execution.

use crate::catalog::{Catalog, Graphlette};
use crate::execute;
use crate::fetch::{Fetchers, Http, InProcess};
use crate::output::{request_errors, RequestError, TIMEOUT};
use crate::plan::TOO_COMPLEX;
use crate::plan::{self, OperationPlan, PlanError};
use crate::request::{GraphqlRequest, RequestContext};
use meshql_core::graph::GraphqlLimits;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use tracing::Instrument;

/// Plans kept per graphlette before the cache is emptied (bounds memory under adversarial
/// traffic of distinct query texts).
const PLAN_CACHE_CAPACITY: usize = 2048;

/// Query texts longer than this are planned every time rather than cached.
const PLAN_CACHE_MAX_QUERY: usize = 16 * 1024;

#[derive(Debug, Error)]
pub enum RegistryError {
    #[error("two graphlettes at path {0}")]
    DuplicatePath(String),
    #[error("cannot build the HTTP client for resolvers: {0}")]
    HttpClient(String),
}

type CachedPlan = Result<Arc<OperationPlan>, Arc<Vec<PlanError>>>;

/// Plans by `(query text, operation name)`.
type PlanCache = RwLock<HashMap<(String, Option<String>), CachedPlan>>;

/// All graphlettes of a service, their plan caches, and the fetchers their resolvers use.
pub struct Registry {
    graphlettes: Vec<Graphlette>,
    by_path: HashMap<String, usize>,
    /// One per graphlette, same index.
    plans: Vec<PlanCache>,
    fetchers: Fetchers,
    limits: GraphqlLimits,
}

impl Registry {
    pub fn new(
        graphlettes: Vec<Graphlette>,
        connect_timeout: Duration,
        request_timeout: Duration,
    ) -> Result<Self, RegistryError> {
        let mut by_path = HashMap::new();
        for (i, g) in graphlettes.iter().enumerate() {
            if by_path.insert(g.path.clone(), i).is_some() {
                return Err(RegistryError::DuplicatePath(g.path.clone()));
            }
        }
        let http = reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .timeout(request_timeout)
            .pool_max_idle_per_host(64)
            // below the 60 s after which a meshql server closes an idle connection, so that a
            // pooled connection is not reused just as the other side closes it
            .pool_idle_timeout(Duration::from_secs(50))
            .tcp_nodelay(true)
            .build()
            .map_err(|e| RegistryError::HttpClient(e.to_string()))?;
        let local = graphlettes
            .iter()
            .map(|g| InProcess::new(g.service.clone(), g.templates()))
            .collect();
        let fetchers = Fetchers::new(local, Http::new(http));
        let plans = graphlettes.iter().map(|_| RwLock::default()).collect();
        Ok(Self {
            graphlettes,
            by_path,
            plans,
            fetchers,
            limits: GraphqlLimits::default(),
        })
    }

    /// What one request may cost (the defaults of [`GraphqlLimits`] otherwise).
    pub fn with_limits(mut self, limits: GraphqlLimits) -> Self {
        self.limits = limits;
        self
    }

    pub fn limits(&self) -> &GraphqlLimits {
        &self.limits
    }

    pub fn graphlettes(&self) -> &[Graphlette] {
        &self.graphlettes
    }

    pub fn by_path(&self, path: &str) -> Option<(usize, &Graphlette)> {
        self.by_path.get(path).map(|&i| (i, &self.graphlettes[i]))
    }

    /// The cached plan of a query, planning it on first sight.
    fn plan(&self, index: usize, query: &str, operation: Option<&str>) -> CachedPlan {
        let cache = &self.plans[index];
        let key = (query.to_owned(), operation.map(str::to_owned));
        if let Some(p) = cache.read().get(&key) {
            return p.clone();
        }
        let planned = plan::plan(self, index, query, operation, &self.limits)
            .map(Arc::new)
            .map_err(Arc::new);
        if planned.is_err() || query.len() > PLAN_CACHE_MAX_QUERY {
            return planned;
        }
        let mut plans = cache.write();
        if plans.len() >= PLAN_CACHE_CAPACITY {
            plans.clear();
        }
        plans.insert(key, planned.clone());
        planned
    }

    pub(crate) fn fetchers(&self) -> &Fetchers {
        &self.fetchers
    }

    /// The plan of `query`, or the body of its errors.
    pub(crate) fn planned(
        &self,
        index: usize,
        query: &str,
        operation: Option<&str>,
    ) -> Result<Arc<OperationPlan>, Vec<u8>> {
        let planned =
            tracing::debug_span!("graphql_plan").in_scope(|| self.plan(index, query, operation));
        planned.map_err(|errors| {
            let list: Vec<_> = errors
                .iter()
                .map(|e| RequestError {
                    message: e.message.clone(),
                    locations: e.locations.clone(),
                    code: e.code,
                })
                .collect();
            request_errors(&list)
        })
    }

    /// Executes a request against the graphlette at `index`; returns the response body
    /// (always a GraphQL response: errors are inside it).
    pub async fn execute(
        &self,
        index: usize,
        request: &GraphqlRequest,
        ctx: &RequestContext,
    ) -> Vec<u8> {
        match self.prepare(index, request) {
            Ok(plan) => self.execute_plan(index, &plan, request, ctx).await,
            Err(body) => body,
        }
    }

    /// The plan of a request to the graphlette at `index` (cached), ready for
    /// [`Registry::execute_plan`]: its cost is known before it runs. `Err`: the body of the
    /// request's errors (no query, a query that does not validate, a subscription).
    pub fn prepare(
        &self,
        index: usize,
        request: &GraphqlRequest,
    ) -> Result<Arc<OperationPlan>, Vec<u8>> {
        let Some(query) = request.query.as_deref().filter(|q| !q.trim().is_empty()) else {
            return Err(request_errors(&[RequestError::new(
                "Must provide query string.",
            )]));
        };
        let plan = self.planned(index, query, request.operation_name.as_deref())?;
        if plan.subscription {
            return Err(request_errors(&[RequestError::new(
                "a subscription needs a subscription transport: a WebSocket (graphql-transport-ws) or an event stream (POST with `Accept: text/event-stream`, graphql-sse)",
            )]));
        }
        Ok(plan)
    }

    /// Runs a plan [`Registry::prepare`] made of `request`; returns the response body.
    pub async fn execute_plan(
        &self,
        index: usize,
        plan: &OperationPlan,
        request: &GraphqlRequest,
        ctx: &RequestContext,
    ) -> Vec<u8> {
        // a federated hop: what the calling service left of its depth bounds
        let budget = ctx.budget;
        if let Some(depth) = budget.depth.filter(|d| plan.depth > *d) {
            return request_errors(&[RequestError::coded(
                format!("the query is nested deeper than the {depth} levels the calling service left of its depth bound"),
                TOO_COMPLEX,
            )]);
        }
        if let Some(left) = budget
            .relationships
            .filter(|r| plan.relationship_depth > *r)
        {
            return request_errors(&[RequestError::coded(
                format!("the query nests relationships deeper than the {left} levels the calling service left of its bound"),
                TOO_COMPLEX,
            )]);
        }
        let timeout_ms = budget.ms.map_or(self.limits.timeout_ms.get(), |ms| {
            ms.min(self.limits.timeout_ms.get())
        });
        let timeout = Duration::from_millis(timeout_ms);
        let deadline = tokio::time::Instant::now() + timeout;
        let run = execute::execute(
            &self.graphlettes,
            &self.fetchers,
            index,
            plan,
            request.variables.as_ref(),
            ctx,
            &self.limits,
            deadline,
        );
        let run = run.instrument(tracing::debug_span!("graphql_execute"));
        match tokio::time::timeout(timeout, run).await {
            Ok(body) => body,
            Err(_) => request_errors(&[RequestError::coded(
                format!("the query did not finish within {timeout_ms} ms"),
                TIMEOUT,
            )]),
        }
    }
}

impl Catalog for Registry {
    fn graphlettes(&self) -> &[Graphlette] {
        Registry::graphlettes(self)
    }

    fn by_path(&self, path: &str) -> Option<(usize, &Graphlette)> {
        Registry::by_path(self, path)
    }
}
