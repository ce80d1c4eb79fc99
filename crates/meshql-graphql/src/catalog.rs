//! What is served, without how it is run: each graphlette's schema, root queries,
//! resolvers and entity service ([`Graphlette`]), and the [`Catalog`] view that looks graphlettes
//! up by index and by path. Planning needs only this; the registry at the top of the crate
//! (plan caches, fetchers, execution) implements it.

use apollo_compiler::collections::HashMap as ApolloHashMap;
use apollo_compiler::schema::Implementers;
use apollo_compiler::validation::Valid;
use apollo_compiler::{Name, Schema};
use meshql_core::graph::{GraphQuery, Resolver};
use meshql_core::QueryTemplate;
use meshql_engine::EntityService;
use std::sync::Arc;

/// A root query bound to a template.
pub type GraphletteQuery = GraphQuery;

/// What a graphlette is declared as: its path, its schema, the type its root queries return,
/// the queries and the relationship fields.
#[derive(Debug, Clone)]
pub struct GraphletteSpec {
    pub path: String,
    pub schema: Arc<Valid<Schema>>,
    /// The object type the root queries return (where resolver fields live).
    pub entity_type: String,
    pub queries: Vec<GraphQuery>,
    pub resolvers: Vec<Resolver>,
}

/// One GraphQL endpoint.
pub struct Graphlette {
    pub path: String,
    pub entity: String,
    pub schema: Arc<Valid<Schema>>,
    pub(crate) implementers: ApolloHashMap<Name, Implementers>,
    pub entity_type: String,
    pub queries: Vec<GraphletteQuery>,
    pub resolvers: Vec<Resolver>,
    /// Every read of the entity goes through its service: permissions, masks and the
    /// reader (primary, replica, cache) are the engine's business.
    pub service: Arc<EntityService>,
}

impl std::fmt::Debug for Graphlette {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graphlette")
            .field("path", &self.path)
            .finish()
    }
}

impl Graphlette {
    pub fn new(entity: &str, spec: GraphletteSpec, service: Arc<EntityService>) -> Self {
        Self {
            path: spec.path,
            entity: entity.to_owned(),
            implementers: spec.schema.implementers_map(),
            schema: spec.schema,
            entity_type: spec.entity_type,
            queries: spec.queries,
            resolvers: spec.resolvers,
            service,
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

/// The graphlettes of a service as planning sees them: by index (what plans refer to) and
/// by path (what resolvers name).
pub trait Catalog {
    fn graphlettes(&self) -> &[Graphlette];

    fn by_path(&self, path: &str) -> Option<(usize, &Graphlette)>;
}
