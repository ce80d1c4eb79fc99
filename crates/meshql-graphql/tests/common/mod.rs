//! The farm → coop → hen schemas the GraphQL tests share (each test file brings its own
//! config: SQLite templates in execute.rs, memory-store ones in props.rs).

pub const FARM_SDL: &str = r#"
scalar Date
type Query {
  getById(id: ID, at: Float): Farm
  getAll(at: Float, limit: Int): [Farm]
  getByZone(zone: String, at: Float): [Farm]
}
type Farm { id: ID name: String! zone: String coops: [Coop] details: Details }
type Details { acres: Int tags: [String] }
type Coop { id: ID name: String! hens: [Hen!] }
type Hen { id: ID name: String! eggs: Int coop: Coop }
"#;

pub const COOP_SDL: &str = r#"
type Query {
  getById(id: ID, at: Int): Coop
  getByFarm(id: ID, at: Int): [Coop]
}
type Coop { id: ID name: String! farm_id: ID farm: Farm hens: [Hen!] }
type Farm { id: ID name: String! }
type Hen { id: ID name: String! eggs: Int coop: Coop }
"#;

pub const HEN_SDL: &str = r#"
type Query {
  getById(id: ID, at: Float): Hen
  getByCoop(id: ID, at: Float): [Hen]
  getAll(at: Float): [Hen]
}
type Hen { id: ID name: String! eggs: Int coop_id: ID coop: Coop }
type Coop { id: ID name: String! farm: Farm hens: [Hen!] }
type Farm { id: ID name: String! }
"#;

/// The entity service a graphlette reads through: `store` for writes, `reader` for reads,
/// every caller allowed.
#[allow(dead_code)]
pub fn service(
    entity: &str,
    store: meshql_core::DynStore,
    reader: meshql_core::DynReader,
) -> std::sync::Arc<meshql_engine::EntityService> {
    std::sync::Arc::new(
        meshql_engine::EntityService::new(
            entity,
            store,
            None,
            vec![],
            std::sync::Arc::new(meshql_core::NoAuth),
        )
        .with_reader(reader),
    )
}

/// A graphlette's declaration as the config loader resolved it.
pub fn spec(g: &meshql_config::ResolvedGraph) -> meshql_graphql::GraphletteSpec {
    meshql_graphql::GraphletteSpec {
        path: g.path.clone(),
        schema: g.schema.clone(),
        entity_type: g.entity_type.clone(),
        queries: g.queries.clone(),
        resolvers: g.resolvers.clone(),
    }
}
