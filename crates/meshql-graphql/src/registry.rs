//! The graphlettes of one service, addressable by path, each with its plan cache.

use crate::plan::{self, OperationPlan, PlanError};
use crate::request::{GraphqlRequest, RequestContext};
use apollo_compiler::collections::HashMap as ApolloHashMap;
use apollo_compiler::schema::Implementers;
use apollo_compiler::validation::Valid;
use apollo_compiler::{Name, Schema};
use meshql_config::{ResolvedGraph, ResolvedResolver};
use meshql_core::{DynReader, QueryTemplate};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

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

/// A root query bound to a template.
#[derive(Debug)]
pub struct GraphletteQuery {
    pub name: String,
    pub vector: bool,
    pub template: QueryTemplate,
}

type CachedPlan = Result<Arc<OperationPlan>, Arc<Vec<PlanError>>>;

/// One GraphQL endpoint.
pub struct Graphlette {
    pub path: String,
    pub entity: String,
    pub schema: Arc<Valid<Schema>>,
    pub(crate) implementers: ApolloHashMap<Name, Implementers>,
    pub entity_type: String,
    pub queries: Vec<GraphletteQuery>,
    pub resolvers: Vec<ResolvedResolver>,
    pub store: DynReader,
    plans: RwLock<HashMap<(String, Option<String>), CachedPlan>>,
}

impl std::fmt::Debug for Graphlette {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graphlette")
            .field("path", &self.path)
            .finish()
    }
}

impl Graphlette {
    pub fn new(entity: &str, graph: &ResolvedGraph, store: DynReader) -> Self {
        Self {
            path: graph.path.clone(),
            entity: entity.to_owned(),
            implementers: graph.schema.implementers_map(),
            schema: graph.schema.clone(),
            entity_type: graph.entity_type.clone(),
            queries: graph
                .queries
                .iter()
                .map(|q| GraphletteQuery {
                    name: q.name.clone(),
                    vector: q.vector,
                    template: q.template.clone(),
                })
                .collect(),
            resolvers: graph.resolvers.clone(),
            store,
            plans: RwLock::new(HashMap::new()),
        }
    }

    pub fn query_index(&self, name: &str) -> Option<usize> {
        self.queries.iter().position(|q| q.name == name)
    }

    /// The templates this graphlette's store must be prepared for.
    pub fn templates(&self) -> Vec<QueryTemplate> {
        self.queries.iter().map(|q| q.template.clone()).collect()
    }
}

/// All graphlettes of a service, and the HTTP client their remote resolvers share.
pub struct Registry {
    graphlettes: Vec<Graphlette>,
    by_path: HashMap<String, usize>,
    pub(crate) http: reqwest::Client,
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
            .tcp_nodelay(true)
            .build()
            .map_err(|e| RegistryError::HttpClient(e.to_string()))?;
        Ok(Self {
            graphlettes,
            by_path,
            http,
        })
    }

    pub fn graphlettes(&self) -> &[Graphlette] {
        &self.graphlettes
    }

    pub fn by_path(&self, path: &str) -> Option<(usize, &Graphlette)> {
        self.by_path.get(path).map(|&i| (i, &self.graphlettes[i]))
    }

    /// The cached plan of a query, planning it on first sight.
    pub(crate) fn plan(&self, index: usize, query: &str, operation: Option<&str>) -> CachedPlan {
        let g = &self.graphlettes[index];
        let key = (query.to_owned(), operation.map(str::to_owned));
        if let Some(p) = g.plans.read().get(&key) {
            return p.clone();
        }
        let planned = plan::plan(self, index, query, operation)
            .map(Arc::new)
            .map_err(Arc::new);
        if planned.is_err() || query.len() > PLAN_CACHE_MAX_QUERY {
            return planned;
        }
        let mut plans = g.plans.write();
        if plans.len() >= PLAN_CACHE_CAPACITY {
            plans.clear();
        }
        plans.insert(key, planned.clone());
        planned
    }

    /// Executes a request against the graphlette at `index`; returns the response body
    /// (always a GraphQL response: errors are inside it).
    pub async fn execute(
        &self,
        index: usize,
        request: &GraphqlRequest,
        ctx: &RequestContext,
    ) -> Vec<u8> {
        crate::execute::execute(self, index, request, ctx).await
    }
}
