//! Compiling a validated operation into a plan: which store query answers each root field,
//! which fields are payload values, which are relationships and where they are resolved.
//! Needs only the [`Catalog`] (schemas, queries, resolvers by path); knows nothing of
//! fetching or execution.

use crate::catalog::{Catalog, Graphlette};
use apollo_compiler::ast::{self, OperationType};
use apollo_compiler::executable::{
    DirectiveList, ExecutableDocument, Field, Operation, Selection, SelectionSet,
};
use apollo_compiler::validation::Valid;
use apollo_compiler::{Name, Node, Schema};
use meshql_core::graph::GraphqlLimits;
use meshql_core::{FieldSet, Nested};
use serde_json::Value;
use std::collections::{BTreeSet, HashSet};
use std::fmt::Write;
use std::sync::Arc;

/// `extensions.code` of a query refused for its shape (depth, fields, relationships).
pub const TOO_COMPLEX: &str = "QUERY_TOO_COMPLEX";

/// A value in the document: a constant or something that depends on variables.
#[derive(Debug, Clone)]
pub enum ArgExpr {
    Const(Value),
    /// Converted per request with the request's variables.
    Dynamic(Node<ast::Value>),
    /// Like `Dynamic`, for an `ID` argument: numbers become strings, as GraphQL coerces
    /// ID inputs.
    DynamicId(Node<ast::Value>),
}

/// `@skip(if:)` / `@include(if:)` of one occurrence; all must hold.
#[derive(Debug, Clone, Default)]
pub struct Conditions(pub Vec<(bool, ArgExpr)>);

impl Conditions {
    fn from_directives(directives: &DirectiveList) -> Option<Self> {
        let mut out = Vec::new();
        for (name, include_when) in [("skip", false), ("include", true)] {
            if let Some(d) = directives.get(name) {
                let Some(v) = d.specified_argument_by_name("if") else {
                    continue;
                };
                match v.as_ref() {
                    ast::Value::Boolean(b) => {
                        if *b != include_when {
                            return None; // statically excluded
                        }
                    }
                    _ => out.push((include_when, ArgExpr::Dynamic(v.clone()))),
                }
            }
        }
        Some(Conditions(out))
    }

    fn and(&self, other: &Conditions) -> Conditions {
        let mut v = self.0.clone();
        v.extend(other.0.iter().cloned());
        Conditions(v)
    }
}

/// How a leaf value is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeafKind {
    String,
    Id,
    Int,
    Float,
    Boolean,
    /// Enums and custom scalars (`Date`): written as stored.
    PassThrough,
}

/// Wrapping of a field's type: `T`, `T!`, `[T]`, `[T!]!`...
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub non_null: bool,
    pub list: bool,
    pub item_non_null: bool,
}

impl Shape {
    fn of(ty: &ast::Type) -> Self {
        Shape {
            non_null: ty.is_non_null(),
            list: ty.is_list(),
            item_non_null: ty.is_list() && ty.item_type().is_non_null(),
        }
    }
}

#[derive(Debug)]
pub struct FieldPlan {
    /// Response key (alias or name).
    pub key: String,
    /// Alternatives (OR) of condition sets (AND); empty = always included.
    pub include: Vec<Conditions>,
    pub type_name: String,
    pub field_name: String,
    pub shape: Shape,
    pub kind: FieldKind,
}

#[derive(Debug)]
pub enum FieldKind {
    Typename(String),
    Leaf(LeafKind),
    /// A JSON object (or list of them) stored inside the payload.
    Embedded(Arc<SelectionPlan>),
    /// A relationship: index into the selection's `resolvers`.
    Resolver(usize),
}

#[derive(Debug, Default)]
pub struct SelectionPlan {
    pub fields: Vec<FieldPlan>,
    pub resolvers: Vec<ResolverPlan>,
    /// The relationships below, for a store that can fetch them with the rows of this
    /// selection in one statement ([`meshql_core::StoreReader::find_nested`]): present when there
    /// are some and every one, at every level below, is resolved in process.
    pub nested: Option<Vec<Nested>>,
    /// The payload fields this selection reads of a document: its leaf and embedded fields
    /// and its relationships' key fields (`__typename` reads none). Documents are parsed
    /// into these alone ([`meshql_core::field_set`]).
    pub reads: FieldSet,
}

#[derive(Debug)]
pub struct ResolverPlan {
    /// Parent payload field whose value is the key.
    pub key_field: String,
    pub vector: bool,
    pub target: TargetPlan,
}

#[derive(Debug)]
pub enum TargetPlan {
    InProcess {
        graphlette: usize,
        query: usize,
        selection: Arc<SelectionPlan>,
    },
    Http {
        url: String,
        query_name: String,
        /// `{ ... }` sub-selection text sent for every key.
        selection: String,
        /// Fragment definitions the selection uses.
        fragments: String,
        /// Variables the selection uses: (name, GraphQL type text).
        variables: Vec<(String, String)>,
        /// The field level of the resolver field here (the remote's root field stands for
        /// it), and its rank among the relationship fields of its path: what is left of the
        /// depth bounds for the remote service ([`crate::Budget`]).
        level: usize,
        relationship_level: usize,
    },
}

#[derive(Debug)]
pub enum RootKind {
    Typename,
    /// `__schema` / `__type`: answered by the introspection engine.
    Introspection,
    /// A `Query` field with no bound template: always null.
    Unbound,
    Query {
        query: usize,
        args: Vec<(String, ArgExpr)>,
        selection: Arc<SelectionPlan>,
        /// The field returns an object (not a leaf): write the selection.
        composite: bool,
    },
}

#[derive(Debug)]
pub struct RootPlan {
    pub key: String,
    pub include: Vec<Conditions>,
    pub field_name: String,
    pub shape: Shape,
    pub kind: RootKind,
}

/// A compiled operation.
#[derive(Debug)]
pub struct OperationPlan {
    pub document: Valid<ExecutableDocument>,
    pub operation_name: Option<String>,
    pub roots: Vec<RootPlan>,
    /// Root fields that differ only in their `id` argument (MeshQL's aliased batch
    /// requests: `item_0: getById(id: "a") {..} item_1: getById(id: "b") {..}`), answered
    /// with one batched storage query per group.
    pub batches: Vec<RootBatch>,
    pub has_introspection: bool,
    pub has_variables: bool,
    /// A subscription operation (its one root field names a bound root query; see
    /// [`crate::Subscription`]).
    pub subscription: bool,
    /// The deepest field level the plan reaches in this service (`{ a { b } }` is 2);
    /// sub-selections sent to remote graphlettes are theirs to count, with the budget they
    /// are sent (see [`crate::Budget`]).
    pub depth: usize,
    /// The most relationship fields along one path, in this service.
    pub relationship_depth: usize,
    /// What the operation costs a rate limit: its root fields plus its relationship fields
    /// (the fetches it may make: one per root field, one batched fetch per relationship
    /// field), at least 1.
    pub cost: usize,
}

/// Root fields answered together: `(root index, id)` pairs sharing query, `at` and selection.
#[derive(Debug)]
pub struct RootBatch {
    pub members: Vec<(usize, String)>,
    pub at: Option<i64>,
}

/// A planning error (reported as a GraphQL request error).
#[derive(Debug, Clone)]
pub struct PlanError {
    pub message: String,
    pub locations: Vec<(usize, usize)>,
    /// `extensions.code`, for errors that have one.
    pub code: Option<&'static str>,
}

impl PlanError {
    fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            locations: Vec::new(),
            code: None,
        }
    }

    fn too_complex(message: impl Into<String>) -> Vec<Self> {
        vec![Self {
            code: Some(TOO_COMPLEX),
            ..Self::new(message)
        }]
    }
}

/// Parses, validates and plans `query` against graphlette `index` of the catalog (usually
/// the service's registry).
pub fn plan(
    catalog: &dyn Catalog,
    index: usize,
    query: &str,
    operation_name: Option<&str>,
    limits: &GraphqlLimits,
) -> Result<OperationPlan, Vec<PlanError>> {
    let graphlette = &catalog.graphlettes()[index];
    let schema = graphlette.schema.as_ref();
    let to_plan_errors = |diagnostics: &apollo_compiler::validation::DiagnosticList| {
        let undefined_field = diagnostics
            .iter()
            .any(|d| d.error.unstable_error_name() == Some("UndefinedField"));
        let errors: Vec<PlanError> = diagnostics
            .iter()
            // a selection whose only field is undefined is left empty, which validation
            // reports as a missing subselection too: the undefined field is the error
            .filter(|d| {
                !(undefined_field && d.error.unstable_error_name() == Some("MissingSubselection"))
            })
            .map(|d| {
                let json = d.to_json();
                let message = match d.error.unstable_error_name() {
                    Some("UndefinedField") => undefined_field_help(schema, &json.message),
                    _ => json.message.clone(),
                };
                PlanError {
                    message,
                    locations: json.locations.iter().map(|l| (l.line, l.column)).collect(),
                    code: None,
                }
            })
            .collect();
        // the parser goes on after a syntax error and reports what follows from it (an
        // unclosed `(` is also an unexpected end): like graphql-js, answer the first one
        match errors
            .iter()
            .position(|e| e.message.starts_with("syntax error"))
        {
            Some(first) => vec![errors[first].clone()],
            None => errors,
        }
    };
    let mut ast =
        ast::Document::parse(query, "query.graphql").map_err(|e| to_plan_errors(&e.errors))?;
    widen_at_variables(&mut ast, schema);
    let document = ast
        .to_executable_validate(schema)
        .map_err(|e| to_plan_errors(&e.errors))?;
    let operation = document.operations.get(operation_name).map_err(|_| {
        vec![PlanError::new(match operation_name {
            Some(n) => format!("Unknown operation named \"{n}\"."),
            None => "Must provide operation name if query contains multiple operations.".to_owned(),
        })]
    })?;
    if operation.operation_type == OperationType::Mutation {
        return Err(vec![PlanError::new(format!(
            "{} operations are not supported: meshql graphlettes are read-only (write through REST)",
            operation.operation_type
        ))]);
    }
    let subscription = operation.operation_type == OperationType::Subscription;
    let planner = Planner {
        catalog,
        schema,
        document: &document,
        limits,
        planned: std::cell::Cell::new(0),
        relationships: std::cell::Cell::new(0),
        deepest: std::cell::Cell::new(1),
        deepest_relationship: std::cell::Cell::new(0),
    };
    let roots = planner.plan_roots(index, operation)?;
    let batches = batches(&roots, graphlette, operation, &document);
    let has_introspection = roots
        .iter()
        .any(|r| matches!(r.kind, RootKind::Introspection));
    let has_variables = !operation.variables.is_empty();
    let operation_name = operation.name.as_ref().map(|n| n.to_string());
    let (depth, relationship_depth) = (planner.deepest.get(), planner.deepest_relationship.get());
    let cost = (roots.len() + planner.relationships.get()).max(1);
    Ok(OperationPlan {
        document,
        operation_name,
        roots,
        batches,
        has_introspection,
        has_variables,
        subscription,
        depth,
        relationship_depth,
        cost,
    })
}

/// apollo-compiler's "type `T` does not have a field `f`", with the field `f` was probably
/// meant to be and the fields `T` has.
fn undefined_field_help(schema: &Schema, message: &str) -> String {
    let names = message
        .strip_prefix("type `")
        .and_then(|rest| rest.split_once("` does not have a field `"))
        .and_then(|(ty, rest)| Some((ty, rest.strip_suffix('`')?)));
    let Some((type_name, field_name)) = names else {
        return message.to_owned();
    };
    let Some(ty) = schema.types.get(type_name) else {
        return message.to_owned();
    };
    let fields: Vec<&str> = match ty {
        apollo_compiler::schema::ExtendedType::Object(o) => {
            o.fields.keys().map(|k| k.as_str()).collect()
        }
        apollo_compiler::schema::ExtendedType::Interface(i) => {
            i.fields.keys().map(|k| k.as_str()).collect()
        }
        _ => return message.to_owned(),
    };
    let suggestion = meshql_core::suggest::closest(field_name, fields.iter().copied())
        .map_or(String::new(), |f| format!("; did you mean `{f}`?"));
    format!(
        "{message}{suggestion} (fields of `{type_name}`: {})",
        fields.join(", ")
    )
}

/// Groups root fields that can share one batched lookup: same bound query, a template that
/// only uses `id`, constant `id` (and `at`), no `limit`, no conditions, same selection.
fn batches(
    roots: &[RootPlan],
    graphlette: &Graphlette,
    operation: &Operation,
    document: &ExecutableDocument,
) -> Vec<RootBatch> {
    let mut groups: Vec<(String, RootBatch)> = Vec::new();
    for (i, root) in roots.iter().enumerate() {
        let RootKind::Query { query, args, .. } = &root.kind else {
            continue;
        };
        if !root.include.is_empty() {
            continue;
        }
        let template = &graphlette.queries[*query].template;
        if template.placeholders().iter().any(|p| p != "id") {
            continue;
        }
        let mut id = None;
        let mut at = None;
        let mut batchable = true;
        for (name, expr) in args {
            match (name.as_str(), expr) {
                ("id", ArgExpr::Const(Value::String(s))) => id = Some(s.clone()),
                ("id", ArgExpr::Const(Value::Number(n))) => id = Some(n.to_string()),
                ("at", ArgExpr::Const(v)) => {
                    at = at_of(&serde_json::Map::from_iter([("at".to_owned(), v.clone())]))
                }
                _ => batchable = false,
            }
        }
        let Some(id) = id.filter(|_| batchable) else {
            continue;
        };
        // the selection, as written, must be the same for every member
        let selection: String = operation
            .root_fields(document)
            .filter(|f| f.response_key() == root.key.as_str())
            .map(|f| f.selection_set.serialize().no_indent().to_string())
            .collect();
        let key = format!("{query}|{at:?}|{selection}");
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, batch)) => batch.members.push((i, id)),
            None => groups.push((
                key,
                RootBatch {
                    members: vec![(i, id)],
                    at,
                },
            )),
        }
    }
    groups
        .into_iter()
        .map(|(_, b)| b)
        .filter(|b| b.members.len() > 1)
        .collect()
}

struct Planner<'a> {
    catalog: &'a dyn Catalog,
    /// The schema the document was validated against.
    schema: &'a Valid<Schema>,
    document: &'a Valid<ExecutableDocument>,
    limits: &'a GraphqlLimits,
    /// Field occurrences collected so far (see [`GraphqlLimits::max_fields`]).
    planned: std::cell::Cell<usize>,
    /// Relationship fields planned so far (see [`GraphqlLimits::max_relationships`]).
    relationships: std::cell::Cell<usize>,
    /// The deepest field level planned so far ([`OperationPlan::depth`]).
    deepest: std::cell::Cell<usize>,
    /// The most relationship fields along one path so far.
    deepest_relationship: std::cell::Cell<usize>,
}

/// Fields of a selection set grouped by response key (CollectFields), in order.
type Collected<'d> = Vec<(String, Vec<(&'d Node<Field>, Conditions)>)>;

impl<'a> Planner<'a> {
    fn collect<'d>(
        &self,
        set: &'d SelectionSet,
        type_name: &str,
        conds: &Conditions,
        out: &mut Collected<'d>,
        visited: &mut HashSet<(Name, String)>,
    ) where
        'a: 'd,
    {
        for selection in &set.selections {
            if self.planned.get() > self.limits.max_fields.get() {
                return;
            }
            match selection {
                Selection::Field(field) => {
                    let Some(c) = Conditions::from_directives(&field.directives) else {
                        continue;
                    };
                    self.planned.set(self.planned.get() + 1);
                    let key = field.response_key().to_string();
                    let entry = (field, conds.and(&c));
                    match out.iter_mut().find(|(k, _)| *k == key) {
                        Some((_, list)) => list.push(entry),
                        None => out.push((key, vec![entry])),
                    }
                }
                Selection::FragmentSpread(spread) => {
                    let Some(c) = Conditions::from_directives(&spread.directives) else {
                        continue;
                    };
                    let conds = conds.and(&c);
                    // a fragment is expanded once per selection set (and condition set), as
                    // the spec's CollectFields does: repeated spreads add nothing
                    if !visited.insert((spread.fragment_name.clone(), format!("{:?}", conds.0))) {
                        continue;
                    }
                    if let Some(fragment) = self.document.fragments.get(&spread.fragment_name) {
                        if self.applies(fragment.type_condition(), type_name) {
                            self.collect(&fragment.selection_set, type_name, &conds, out, visited);
                        }
                    }
                }
                Selection::InlineFragment(inline) => {
                    let Some(c) = Conditions::from_directives(&inline.directives) else {
                        continue;
                    };
                    let applies = inline
                        .type_condition
                        .as_ref()
                        .is_none_or(|t| self.applies(t, type_name));
                    if applies {
                        let conds = conds.and(&c);
                        self.collect(&inline.selection_set, type_name, &conds, out, visited);
                    }
                }
            }
        }
    }

    fn applies(&self, condition: &Name, type_name: &str) -> bool {
        condition == type_name || self.schema.is_subtype(condition, type_name)
    }

    fn plan_roots(
        &self,
        index: usize,
        operation: &Operation,
    ) -> Result<Vec<RootPlan>, Vec<PlanError>> {
        let graphlette = &self.catalog.graphlettes()[index];
        let query_type = operation.selection_set.ty.to_string();
        let mut collected = Vec::new();
        self.collect(
            &operation.selection_set,
            &query_type,
            &Conditions::default(),
            &mut collected,
            &mut HashSet::new(),
        );
        self.check_fields()?;
        if collected.len() > self.limits.max_root_fields.get() {
            return Err(PlanError::too_complex(format!(
                "the query has {} root fields; at most {} are allowed",
                collected.len(),
                self.limits.max_root_fields
            )));
        }
        let mut roots = Vec::with_capacity(collected.len());
        for (key, occurrences) in collected {
            let (field, _) = occurrences[0];
            let include = includes(&occurrences);
            let shape = Shape::of(&field.definition.ty);
            let name = field.name.as_str();
            let kind = match name {
                "__typename" => RootKind::Typename,
                "__schema" | "__type" => RootKind::Introspection,
                _ => match graphlette.query_index(name) {
                    None => RootKind::Unbound,
                    Some(query) => {
                        let args = field
                            .arguments
                            .iter()
                            .map(|a| {
                                let is_id = field
                                    .definition
                                    .argument_by_name(&a.name)
                                    .is_some_and(|d| d.ty.inner_named_type() == "ID");
                                (a.name.to_string(), arg_expr(&a.value, is_id))
                            })
                            .collect();
                        let ty = field.definition.ty.inner_named_type();
                        let composite = self.is_composite(ty);
                        let selection = if composite {
                            let ty = self.concrete_type(ty, Some(index))?;
                            self.plan_selection(&occurrences, &ty, Some(index), 1, 0)?
                        } else {
                            Arc::new(SelectionPlan::default())
                        };
                        RootKind::Query {
                            query,
                            args,
                            selection,
                            composite,
                        }
                    }
                },
            };
            roots.push(RootPlan {
                key,
                include,
                field_name: name.to_owned(),
                shape,
                kind,
            });
        }
        Ok(roots)
    }

    fn check_fields(&self) -> Result<(), Vec<PlanError>> {
        if self.planned.get() > self.limits.max_fields.get() {
            return Err(PlanError::too_complex(format!(
                "the query selects more than {} fields once fragments are expanded",
                self.limits.max_fields
            )));
        }
        Ok(())
    }

    /// The type a composite field's selection is planned for, so that `__typename` and
    /// fragments on object types answer for what the documents are: the field's type when it
    /// is an object type; for an interface or a union, the entity type of graphlette
    /// `rows_from` (whose rows fill the field) when it is one of its types, else its only
    /// object type. An embedded payload object (`rows_from` `None`) of an interface or union
    /// with several object types keeps the abstract type (documents carry no type name).
    fn concrete_type(&self, ty: &Name, rows_from: Option<usize>) -> Result<String, Vec<PlanError>> {
        let abstract_type = self
            .schema
            .types
            .get(ty)
            .is_some_and(|t| t.is_interface() || t.is_union());
        if !abstract_type {
            return Ok(ty.to_string());
        }
        if let Some(g) = rows_from {
            let entity_type = self.catalog.graphlettes()[g].entity_type.as_str();
            if self.schema.get_object(entity_type).is_some()
                && self.schema.is_subtype(ty, entity_type)
            {
                return Ok(entity_type.to_owned());
            }
        }
        let objects: Vec<&Name> = self
            .schema
            .types
            .iter()
            .filter(|(n, t)| t.is_object() && self.schema.is_subtype(ty, n))
            .map(|(n, _)| n)
            .collect();
        match (objects.as_slice(), rows_from) {
            ([one], _) => Ok(one.to_string()),
            (_, None) => Ok(ty.to_string()),
            (_, Some(g)) => Err(vec![PlanError::new(format!(
                "`{ty}` does not include `{}`, the type of the documents of \"{}\" that answer this field",
                self.catalog.graphlettes()[g].entity_type,
                self.catalog.graphlettes()[g].entity
            ))]),
        }
    }

    fn is_composite(&self, ty: &Name) -> bool {
        self.schema
            .types
            .get(ty)
            .is_some_and(|t| t.is_object() || t.is_interface() || t.is_union())
    }

    /// Plans the merged sub-selection of `occurrences` (fields with one response key).
    /// `exec` is the graphlette whose rows fill this selection (`None` inside an embedded
    /// payload object, where no resolver applies). `depth` counts fields above it,
    /// `relationship_depth` the relationship fields among them.
    fn plan_selection(
        &self,
        occurrences: &[(&Node<Field>, Conditions)],
        type_name: &str,
        exec: Option<usize>,
        depth: usize,
        relationship_depth: usize,
    ) -> Result<Arc<SelectionPlan>, Vec<PlanError>> {
        if depth >= self.limits.max_depth.get() {
            return Err(PlanError::too_complex(format!(
                "the query is nested deeper than {} levels",
                self.limits.max_depth
            )));
        }
        self.deepest.set(self.deepest.get().max(depth + 1));
        let mut collected = Vec::new();
        for (field, conds) in occurrences {
            self.collect(
                &field.selection_set,
                type_name,
                conds,
                &mut collected,
                &mut HashSet::new(),
            );
        }
        self.check_fields()?;
        let exec_graphlette = exec.map(|i| &self.catalog.graphlettes()[i]);
        let mut fields = Vec::with_capacity(collected.len());
        let mut resolvers = Vec::new();
        for (key, occ) in collected {
            let (field, _) = occ[0];
            let include = includes(&occ);
            let shape = Shape::of(&field.definition.ty);
            let name = field.name.to_string();
            let inner = field.definition.ty.inner_named_type();
            // rows fetched from a graphlette carry its resolvers, whatever the caller's SDL
            // names the projection type
            let resolver =
                exec_graphlette.and_then(|g| g.resolvers.iter().find(|r| r.field == name));
            let kind = if name == "__typename" {
                FieldKind::Typename(type_name.to_owned())
            } else if let Some(r) = resolver {
                self.relationships.set(self.relationships.get() + 1);
                if self.relationships.get() > self.limits.max_relationships.get() {
                    return Err(PlanError::too_complex(format!(
                        "the query selects more than {} relationship fields",
                        self.limits.max_relationships
                    )));
                }
                if relationship_depth >= self.limits.max_relationship_depth.get() {
                    return Err(PlanError::too_complex(format!(
                        "the query nests relationships deeper than {} levels ({type_name}.{name})",
                        self.limits.max_relationship_depth
                    )));
                }
                self.deepest_relationship
                    .set(self.deepest_relationship.get().max(relationship_depth + 1));
                let target = match &r.target {
                    meshql_core::graph::ResolverTarget::InProcess { graph_path } => {
                        let (t_index, target) = self
                            .catalog
                            .by_path(graph_path)
                            .expect("resolver targets are checked at start-up");
                        let query = target
                            .query_index(&r.query)
                            .expect("resolver queries are checked at start-up");
                        let selection = if self.is_composite(inner) {
                            self.plan_selection(
                                &occ,
                                &self.concrete_type(inner, Some(t_index))?,
                                Some(t_index),
                                depth + 1,
                                relationship_depth + 1,
                            )?
                        } else {
                            Arc::new(SelectionPlan::default())
                        };
                        TargetPlan::InProcess {
                            graphlette: t_index,
                            query,
                            selection,
                        }
                    }
                    meshql_core::graph::ResolverTarget::Http { url } => {
                        self.http_target(url, &r.query, &occ, depth + 1, relationship_depth + 1)
                    }
                };
                resolvers.push(ResolverPlan {
                    key_field: r.key.clone(),
                    vector: r.vector,
                    target,
                });
                FieldKind::Resolver(resolvers.len() - 1)
            } else if self.is_composite(inner) {
                FieldKind::Embedded(self.plan_selection(
                    &occ,
                    &self.concrete_type(inner, None)?,
                    None,
                    depth + 1,
                    relationship_depth,
                )?)
            } else {
                FieldKind::Leaf(leaf_kind(inner.as_str()))
            };
            fields.push(FieldPlan {
                key,
                include,
                type_name: type_name.to_owned(),
                field_name: name,
                shape,
                kind,
            });
        }
        let nested = self.nested(&resolvers);
        let reads = payload_reads(&fields, &resolvers);
        Ok(Arc::new(SelectionPlan {
            fields,
            resolvers,
            nested,
            reads,
        }))
    }

    /// The relationships of a selection as [`Nested`] (see [`SelectionPlan::nested`]), each
    /// level reading the fields of its selection.
    fn nested(&self, resolvers: &[ResolverPlan]) -> Option<Vec<Nested>> {
        if resolvers.is_empty() {
            return None;
        }
        resolvers
            .iter()
            .map(|r| match &r.target {
                TargetPlan::InProcess {
                    graphlette,
                    query,
                    selection,
                } => {
                    let children = if selection.resolvers.is_empty() {
                        Vec::new()
                    } else {
                        selection.nested.clone()?
                    };
                    let g = &self.catalog.graphlettes()[*graphlette];
                    Some(Nested {
                        key_field: r.key_field.clone(),
                        vector: r.vector,
                        store: g.service.reader().clone(),
                        template: g.queries[*query].template.clone(),
                        fields: Some(selection.reads.clone()),
                        children,
                    })
                }
                TargetPlan::Http { .. } => None,
            })
            .collect()
    }

    /// The text sent to a remote graphlette for this field's sub-selection: the merged
    /// selections, the fragment definitions they use, and the variables they reference.
    fn http_target(
        &self,
        url: &str,
        query_name: &str,
        occurrences: &[(&Node<Field>, Conditions)],
        level: usize,
        relationship_level: usize,
    ) -> TargetPlan {
        let mut selection = String::from("{");
        let mut fragment_names = BTreeSet::new();
        let mut variable_names = BTreeSet::new();
        for (field, _) in occurrences {
            for s in &field.selection_set.selections {
                let _ = write!(selection, " {}", s.serialize().no_indent());
                walk_selection(s, self.document, &mut fragment_names, &mut variable_names);
            }
        }
        selection.push_str(" }");
        let mut fragments = String::new();
        for name in &fragment_names {
            if let Some(f) = self.document.fragments.get(name.as_str()) {
                let _ = write!(fragments, " {}", f.serialize().no_indent());
            }
        }
        let variables = variable_names
            .into_iter()
            .filter_map(|v| {
                self.document
                    .operations
                    .iter()
                    .flat_map(|op| op.variables.iter())
                    .find(|d| d.name == v.as_str())
                    .map(|d| (v.clone(), d.ty.to_string()))
            })
            .collect();
        TargetPlan::Http {
            url: url.to_owned(),
            query_name: query_name.to_owned(),
            selection,
            fragments,
            variables,
            level,
            relationship_level,
        }
    }
}

fn walk_selection(
    s: &Selection,
    doc: &ExecutableDocument,
    fragments: &mut BTreeSet<String>,
    variables: &mut BTreeSet<String>,
) {
    let mut directives = |list: &DirectiveList| {
        for d in list.iter() {
            for a in &d.arguments {
                collect_vars(&a.value, variables);
            }
        }
    };
    match s {
        Selection::Field(f) => {
            directives(&f.directives);
            for a in &f.arguments {
                collect_vars(&a.value, variables);
            }
            for c in &f.selection_set.selections {
                walk_selection(c, doc, fragments, variables);
            }
        }
        Selection::InlineFragment(i) => {
            directives(&i.directives);
            for c in &i.selection_set.selections {
                walk_selection(c, doc, fragments, variables);
            }
        }
        Selection::FragmentSpread(spread) => {
            directives(&spread.directives);
            if fragments.insert(spread.fragment_name.to_string()) {
                if let Some(f) = doc.fragments.get(&spread.fragment_name) {
                    for c in &f.selection_set.selections {
                        walk_selection(c, doc, fragments, variables);
                    }
                }
            }
        }
    }
}

fn collect_vars(v: &ast::Value, out: &mut BTreeSet<String>) {
    match v {
        ast::Value::Variable(n) => {
            out.insert(n.to_string());
        }
        ast::Value::List(items) => items.iter().for_each(|i| collect_vars(i, out)),
        ast::Value::Object(fields) => fields.iter().for_each(|(_, i)| collect_vars(i, out)),
        _ => {}
    }
}

fn includes(occurrences: &[(&Node<Field>, Conditions)]) -> Vec<Conditions> {
    if occurrences.iter().any(|(_, c)| c.0.is_empty()) {
        Vec::new()
    } else {
        occurrences.iter().map(|(_, c)| c.clone()).collect()
    }
}

fn leaf_kind(name: &str) -> LeafKind {
    match name {
        "String" => LeafKind::String,
        "ID" => LeafKind::Id,
        "Int" => LeafKind::Int,
        "Float" => LeafKind::Float,
        "Boolean" => LeafKind::Boolean,
        _ => LeafKind::PassThrough,
    }
}

fn has_variables(v: &ast::Value) -> bool {
    match v {
        ast::Value::Variable(_) => true,
        ast::Value::List(items) => items.iter().any(|i| has_variables(i)),
        ast::Value::Object(fields) => fields.iter().any(|(_, i)| has_variables(i)),
        _ => false,
    }
}

fn arg_expr(v: &Node<ast::Value>, is_id: bool) -> ArgExpr {
    match (has_variables(v), is_id) {
        (true, false) => ArgExpr::Dynamic(v.clone()),
        (true, true) => ArgExpr::DynamicId(v.clone()),
        (false, false) => ArgExpr::Const(to_json(v, &serde_json::Map::new())),
        (false, true) => ArgExpr::Const(id_string(to_json(v, &serde_json::Map::new()))),
    }
}

/// GraphQL's ID input coercion: integers are accepted and become strings.
fn id_string(v: Value) -> Value {
    match v {
        Value::Number(n) => Value::String(n.to_string()),
        other => other,
    }
}

/// Converts a document value to JSON, substituting variables.
pub fn to_json(v: &ast::Value, variables: &serde_json::Map<String, Value>) -> Value {
    match v {
        ast::Value::Null => Value::Null,
        ast::Value::Enum(n) => Value::String(n.to_string()),
        ast::Value::Variable(n) => variables.get(n.as_str()).cloned().unwrap_or(Value::Null),
        ast::Value::String(s) => Value::String(s.clone()),
        ast::Value::Float(f) => f
            .try_to_f64()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map(Value::Number)
            .unwrap_or(Value::Null),
        ast::Value::Int(i) => match i.as_str().parse::<i64>() {
            Ok(n) => Value::Number(n.into()),
            Err(_) => i
                .try_to_f64()
                .ok()
                .and_then(serde_json::Number::from_f64)
                .map(Value::Number)
                .unwrap_or(Value::Null),
        },
        ast::Value::Boolean(b) => Value::Bool(*b),
        ast::Value::List(items) => {
            Value::Array(items.iter().map(|i| to_json(i, variables)).collect())
        }
        ast::Value::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(k, v)| (k.to_string(), to_json(v, variables)))
                .collect(),
        ),
    }
}

impl ArgExpr {
    pub fn eval(&self, variables: &serde_json::Map<String, Value>) -> Value {
        match self {
            ArgExpr::Const(v) => v.clone(),
            ArgExpr::Dynamic(v) => to_json(v, variables),
            ArgExpr::DynamicId(v) => id_string(to_json(v, variables)),
        }
    }
}

/// `at` as milliseconds: numbers (Int or Float) and numeric strings are accepted.
pub(crate) fn at_of(args: &serde_json::Map<String, Value>) -> Option<meshql_core::Millis> {
    match args.get("at")? {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
        Value::String(s) => s.trim().parse::<f64>().ok().map(|f| f as i64),
        _ => None,
    }
}

/// Whether a field is included given the request's variables.
pub fn included(include: &[Conditions], variables: &serde_json::Map<String, Value>) -> bool {
    include.is_empty()
        || include.iter().any(|conds| {
            conds
                .0
                .iter()
                .all(|(want, expr)| expr.eval(variables).as_bool() == Some(*want))
        })
}

/// MeshQL schemas declare `at: Int` (epoch milliseconds), which the config loader widens to
/// `Float` because such values do not fit GraphQL's 32-bit `Int`; a query written for MeshQL
/// then declares its variable `$at: Int`, which GraphQL's validation refuses for a `Float`
/// argument. A variable declared `Int` (or `Int!`) and used as a root field's `at` where the
/// schema has `Float` is read as `Float` (every `Int` value is a valid `Float`).
fn widen_at_variables(document: &mut ast::Document, schema: &Schema) {
    let Some(query_type) = schema.root_operation(OperationType::Query) else {
        return;
    };
    let Some(root) = schema.get_object(query_type.as_str()) else {
        return;
    };
    let float = Name::new_unchecked("Float");
    let int = Name::new_unchecked("Int");
    for definition in &mut document.definitions {
        let ast::Definition::OperationDefinition(operation) = definition else {
            continue;
        };
        if operation.operation_type != OperationType::Query {
            continue;
        }
        let mut widened: Vec<Name> = Vec::new();
        let mut stack: Vec<&ast::Selection> = operation.selection_set.iter().collect();
        while let Some(selection) = stack.pop() {
            match selection {
                ast::Selection::Field(field) => {
                    let Some(definition) = root.fields.get(&field.name) else {
                        continue;
                    };
                    let at_is_float = definition
                        .arguments
                        .iter()
                        .any(|a| a.name == "at" && *a.ty.inner_named_type() == float);
                    for argument in &field.arguments {
                        if let (true, true, ast::Value::Variable(variable)) =
                            (at_is_float, argument.name == "at", argument.value.as_ref())
                        {
                            widened.push(variable.clone());
                        }
                    }
                }
                ast::Selection::InlineFragment(fragment) => {
                    stack.extend(fragment.selection_set.iter());
                }
                ast::Selection::FragmentSpread(_) => {}
            }
        }
        if widened.is_empty() {
            continue;
        }
        let operation = operation.make_mut();
        for variable in &mut operation.variables {
            let is_int = !variable.ty.is_list() && *variable.ty.inner_named_type() == int;
            if is_int && widened.contains(&variable.name) {
                let variable = variable.make_mut();
                let non_null = variable.ty.is_non_null();
                let ty = ast::Type::Named(float.clone());
                variable.ty = Node::new(if non_null { ty.non_null() } else { ty });
            }
        }
    }
}

/// The payload fields read by a selection of `fields` with `resolvers` (see
/// [`SelectionPlan::reads`]), each once, in the order first read.
fn payload_reads(fields: &[FieldPlan], resolvers: &[ResolverPlan]) -> FieldSet {
    let mut reads: Vec<String> = Vec::new();
    let named = fields.iter().filter_map(|f| match f.kind {
        FieldKind::Leaf(_) | FieldKind::Embedded(_) => Some(&f.field_name),
        FieldKind::Typename(_) | FieldKind::Resolver(_) => None,
    });
    for name in named.chain(resolvers.iter().map(|r| &r.key_field)) {
        if !reads.contains(name) {
            reads.push(name.clone());
        }
    }
    reads.into()
}
