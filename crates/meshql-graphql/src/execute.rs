//! Fetching: root queries, then relationship fields level by level, each level one
//! batched storage query (or one aliased HTTP request) per resolver field.

use crate::output::{request_errors, Writer};
use crate::plan::{self, OperationPlan, ResolverPlan, RootKind, SelectionPlan, TargetPlan};
use crate::registry::Registry;
use crate::request::{GraphqlRequest, RequestContext};
use futures::future::{join_all, BoxFuture};
use meshql_core::{Millis, NestedRow, Row};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::Arc;

/// A fetched document and its resolved relationships (one link per resolver of the
/// selection that fetched it).
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub map: Map<String, Value>,
    pub links: Vec<Link>,
}

#[derive(Debug, Clone)]
pub(crate) enum Link {
    /// In-process results (a singleton resolver has at most one).
    Nodes(Vec<Arc<Node>>),
    /// A remote graphlette's JSON for this field, spliced as it is (`None`: null).
    Raw(Option<Arc<RawValue>>),
    /// The relationship could not be resolved.
    Error(Arc<str>),
}

/// The result of one root field.
pub(crate) enum RootResult {
    Nodes(Vec<Node>),
    Error(String),
}

pub(crate) struct Exec<'a> {
    pub registry: &'a Registry,
    pub ctx: &'a RequestContext,
    pub variables: Map<String, Value>,
}

impl Node {
    /// A row of a nested search, with its relationships already fetched.
    fn from_nested(row: NestedRow) -> Node {
        let mut map = row.payload;
        if map.get("id").and_then(Value::as_str) != Some(row.id.as_str()) {
            map.insert("id".into(), Value::String(row.id));
        }
        Node {
            map,
            links: row
                .children
                .into_iter()
                .map(|rows| {
                    Link::Nodes(
                        rows.into_iter()
                            .map(|r| Arc::new(Node::from_nested(r)))
                            .collect(),
                    )
                })
                .collect(),
        }
    }

    fn from_row(row: Row) -> Node {
        let map = match serde_json::from_str::<Map<String, Value>>(&row.payload) {
            Ok(mut m) => {
                // the envelope id is authoritative
                if m.get("id").and_then(Value::as_str) != Some(row.id.as_str()) {
                    m.insert("id".into(), Value::String(row.id));
                }
                m
            }
            Err(e) => {
                tracing::error!(id = %row.id, error = %e, "stored payload is not a JSON object");
                let mut m = Map::new();
                m.insert("id".into(), Value::String(row.id));
                m
            }
        };
        Node {
            map,
            links: Vec::new(),
        }
    }
}

pub(crate) async fn execute(
    registry: &Registry,
    index: usize,
    request: &GraphqlRequest,
    ctx: &RequestContext,
) -> Vec<u8> {
    let Some(query) = request.query.as_deref().filter(|q| !q.trim().is_empty()) else {
        return request_errors(&[("Must provide query string.".to_owned(), Vec::new())]);
    };
    let plan = match registry.plan(index, query, request.operation_name.as_deref()) {
        Ok(p) => p,
        Err(errors) => {
            let list: Vec<_> = errors
                .iter()
                .map(|e| (e.message.clone(), e.locations.clone()))
                .collect();
            return request_errors(&list);
        }
    };
    let variables = match coerce_variables(registry, index, &plan, request.variables.as_ref()) {
        Ok(v) => v,
        Err(message) => return request_errors(&[(message, Vec::new())]),
    };
    let exec = Exec {
        registry,
        ctx,
        variables,
    };
    let introspection = if plan.has_introspection {
        match introspect(registry, index, &plan, &exec.variables) {
            Ok(data) => Some(data),
            Err(message) => return request_errors(&[(message, Vec::new())]),
        }
    } else {
        None
    };
    let results = exec.roots(index, &plan).await;
    let mut writer = Writer::new(&exec.variables);
    writer.write_response(&plan, results, introspection.as_ref());
    writer.finish()
}

fn coerce_variables(
    registry: &Registry,
    index: usize,
    plan: &OperationPlan,
    given: Option<&Value>,
) -> Result<Map<String, Value>, String> {
    let given = match given {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => return Err("`variables` must be a JSON object".to_owned()),
    };
    if !plan.has_variables {
        return Ok(given);
    }
    let schema = &registry.graphlettes()[index].schema;
    let operation = plan
        .document
        .operations
        .get(plan.operation_name.as_deref())
        .map_err(|e| e.message().to_string())?;
    let as_bytes: apollo_compiler::response::JsonMap =
        serde_json::from_value(Value::Object(given)).map_err(|e| e.to_string())?;
    let coerced = apollo_compiler::request::coerce_variable_values(schema, operation, &as_bytes)
        .map_err(|e| e.message().to_string())?;
    let back = serde_json::to_value(coerced.into_inner()).map_err(|e| e.to_string())?;
    Ok(back.as_object().cloned().unwrap_or_default())
}

fn introspect(
    registry: &Registry,
    index: usize,
    plan: &OperationPlan,
    variables: &Map<String, Value>,
) -> Result<Map<String, Value>, String> {
    let g = &registry.graphlettes()[index];
    let operation = plan
        .document
        .operations
        .get(plan.operation_name.as_deref())
        .map_err(|e| e.message().to_string())?;
    apollo_compiler::introspection::check_max_depth(&plan.document, operation)
        .map_err(|e| e.message().to_string())?;
    let vars: apollo_compiler::response::JsonMap =
        serde_json::from_value(Value::Object(variables.clone())).map_err(|e| e.to_string())?;
    let vars = apollo_compiler::validation::Valid::assume_valid(vars);
    let response = apollo_compiler::introspection::partial_execute(
        &g.schema,
        &g.implementers,
        &plan.document,
        operation,
        &vars,
    )
    .map_err(|e| e.message().to_string())?;
    if let Some(e) = response.errors.first() {
        return Err(e.message.clone());
    }
    let data = serde_json::to_value(response.data).map_err(|e| e.to_string())?;
    Ok(data.as_object().cloned().unwrap_or_default())
}

/// `at` as milliseconds: numbers (Int or Float) and numeric strings are accepted.
pub(crate) fn at_of(args: &Map<String, Value>) -> Option<Millis> {
    match args.get("at")? {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
        Value::String(s) => s.trim().parse::<f64>().ok().map(|f| f as i64),
        _ => None,
    }
}

/// `limit`: absent or null means no cap; anything else must be a positive integer.
fn limit_of(args: &Map<String, Value>) -> Result<Option<usize>, String> {
    match args.get("limit") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(n) if n >= 1.0 && n.fract() == 0.0 => Ok(Some(n as usize)),
            _ => Err(format!("`limit` must be a positive integer, not {v}")),
        },
    }
}

/// The key a parent sends for a resolver ([`meshql_core::nested::key_text`]).
fn key_of(value: Option<&Value>) -> Option<String> {
    value
        .and_then(meshql_core::nested::key_text)
        .map(std::borrow::Cow::into_owned)
}

impl<'a> Exec<'a> {
    /// Every root field: batched groups with one lookup each, the others one by one, all
    /// concurrently.
    async fn roots(&self, index: usize, plan: &OperationPlan) -> Vec<Option<RootResult>> {
        let mut in_batch = vec![false; plan.roots.len()];
        for b in &plan.batches {
            for (i, _) in &b.members {
                in_batch[*i] = true;
            }
        }
        let singles = join_all(
            plan.roots
                .iter()
                .enumerate()
                .filter(|(i, _)| !in_batch[*i])
                .map(|(i, root)| async move { (i, self.root(index, root).await) }),
        );
        let batches = join_all(plan.batches.iter().map(|b| self.root_batch(index, plan, b)));
        let (singles, batches) = futures::future::join(singles, batches).await;
        let mut results: Vec<Option<RootResult>> = plan.roots.iter().map(|_| None).collect();
        for (i, r) in singles.into_iter().chain(batches.into_iter().flatten()) {
            results[i] = r;
        }
        results
    }

    async fn root_batch(
        &self,
        index: usize,
        plan: &OperationPlan,
        batch: &plan::RootBatch,
    ) -> Vec<(usize, Option<RootResult>)> {
        let (first, _) = batch.members[0];
        let RootKind::Query {
            query, selection, ..
        } = &plan.roots[first].kind
        else {
            unreachable!("batches hold query roots only");
        };
        let g = &self.registry.graphlettes()[index];
        let q = &g.queries[*query];
        let mut keys: Vec<String> = Vec::new();
        let mut key_index: HashMap<String, usize> = HashMap::new();
        for (_, id) in &batch.members {
            if !key_index.contains_key(id) {
                key_index.insert(id.clone(), keys.len());
                keys.push(id.clone());
            }
        }
        let rows = match g
            .store
            .find_batch(
                &meshql_core::BatchSearch::new(&q.template, "id", &keys),
                &meshql_core::ReadContext::new(&self.ctx.filter, batch.at),
            )
            .await
        {
            Ok(rows) => rows,
            Err(e) => {
                return batch
                    .members
                    .iter()
                    .map(|(i, _)| (*i, Some(RootResult::Error(e.to_string()))))
                    .collect()
            }
        };
        let mut owners = Vec::with_capacity(rows.len());
        let mut nodes = Vec::with_capacity(rows.len());
        for (key, row) in rows {
            if let Some(&k) = key_index.get(&key) {
                owners.push(k);
                nodes.push(Node::from_row(row));
            }
        }
        self.resolve_links(selection, &mut nodes, batch.at).await;
        let mut per_key: Vec<Vec<Node>> = vec![Vec::new(); keys.len()];
        for (node, k) in nodes.into_iter().zip(owners) {
            if q.vector || per_key[k].is_empty() {
                per_key[k].push(node);
            }
        }
        let mut remaining = vec![0usize; keys.len()];
        for (_, id) in &batch.members {
            remaining[key_index[id]] += 1;
        }
        batch
            .members
            .iter()
            .map(|(i, id)| {
                let k = key_index[id];
                remaining[k] -= 1;
                let nodes = if remaining[k] > 0 {
                    per_key[k].clone()
                } else {
                    std::mem::take(&mut per_key[k])
                };
                (*i, Some(RootResult::Nodes(nodes)))
            })
            .collect()
    }

    async fn root(&self, index: usize, root: &plan::RootPlan) -> Option<RootResult> {
        if !plan::included(&root.include, &self.variables) {
            return None;
        }
        let RootKind::Query {
            query,
            args,
            selection,
            ..
        } = &root.kind
        else {
            return Some(RootResult::Nodes(Vec::new()));
        };
        let g = &self.registry.graphlettes()[index];
        let q = &g.queries[*query];
        let args: Map<String, Value> = args
            .iter()
            .map(|(k, v)| (k.clone(), v.eval(&self.variables)))
            .collect();
        let at = at_of(&args);
        let limit = if q.vector {
            match limit_of(&args) {
                Ok(l) => l,
                Err(message) => return Some(RootResult::Error(message)),
            }
        } else {
            Some(1)
        };
        if let Some(nested) = &selection.nested {
            match g
                .store
                .find_nested(
                    &meshql_core::Search::new(&q.template, &args, limit),
                    nested,
                    &meshql_core::ReadContext::new(&self.ctx.filter, at),
                )
                .await
            {
                Ok(Some(rows)) => {
                    return Some(RootResult::Nodes(
                        rows.into_iter().map(Node::from_nested).collect(),
                    ))
                }
                Ok(None) => {} // level by level
                Err(e) => return Some(RootResult::Error(e.to_string())),
            }
        }
        let rows = match g
            .store
            .find(
                &meshql_core::Search::new(&q.template, &args, limit),
                &meshql_core::ReadContext::new(&self.ctx.filter, at),
            )
            .await
        {
            Ok(rows) => rows,
            Err(e) => return Some(RootResult::Error(e.to_string())),
        };
        let mut nodes: Vec<Node> = rows.into_iter().map(Node::from_row).collect();
        self.resolve_links(selection, &mut nodes, at).await;
        Some(RootResult::Nodes(nodes))
    }

    /// Fills `links` of every node: one batched fetch per resolver field, all resolver
    /// fields of the level concurrently, then the next level below each.
    fn resolve_links<'b>(
        &'b self,
        selection: &'b SelectionPlan,
        nodes: &'b mut [Node],
        at: Option<Millis>,
    ) -> BoxFuture<'b, ()> {
        Box::pin(async move {
            if selection.resolvers.is_empty() || nodes.is_empty() {
                return;
            }
            let per_resolver = {
                let parents: &[Node] = nodes;
                join_all(
                    selection
                        .resolvers
                        .iter()
                        .map(|r| self.resolve_field(r, parents, at)),
                )
                .await
            };
            for node in nodes.iter_mut() {
                node.links = Vec::with_capacity(per_resolver.len());
            }
            for links in per_resolver {
                for (node, link) in nodes.iter_mut().zip(links) {
                    node.links.push(link);
                }
            }
        })
    }

    async fn resolve_field(
        &self,
        resolver: &ResolverPlan,
        parents: &[Node],
        at: Option<Millis>,
    ) -> Vec<Link> {
        // de-duplicate the keys of all parents
        let mut keys: Vec<String> = Vec::new();
        let mut key_index: HashMap<String, usize> = HashMap::new();
        let parent_keys: Vec<Option<usize>> = parents
            .iter()
            .map(|p| {
                key_of(p.map.get(&resolver.key_field)).map(|k| {
                    let next = keys.len();
                    *key_index.entry(k.clone()).or_insert_with(|| {
                        keys.push(k);
                        next
                    })
                })
            })
            .collect();
        let per_key: Vec<Link> = if keys.is_empty() {
            Vec::new()
        } else {
            match &resolver.target {
                TargetPlan::InProcess {
                    graphlette,
                    query,
                    selection,
                } => {
                    self.fetch_in_process(
                        *graphlette,
                        *query,
                        selection,
                        resolver.vector,
                        &keys,
                        &key_index,
                        at,
                    )
                    .await
                }
                TargetPlan::Http { .. } => crate::http::fetch(self, resolver, &keys, at).await,
            }
        };
        parent_keys
            .into_iter()
            .map(|k| match k {
                Some(i) => per_key[i].clone(),
                None if resolver.vector => Link::Nodes(Vec::new()),
                None => Link::Nodes(Vec::new()),
            })
            .collect()
    }

    #[allow(clippy::too_many_arguments)]
    async fn fetch_in_process(
        &self,
        graphlette: usize,
        query: usize,
        selection: &SelectionPlan,
        vector: bool,
        keys: &[String],
        key_index: &HashMap<String, usize>,
        at: Option<Millis>,
    ) -> Vec<Link> {
        let g = &self.registry.graphlettes()[graphlette];
        let q = &g.queries[query];
        let rows = match g
            .store
            .find_batch(
                &meshql_core::BatchSearch::new(&q.template, "id", keys),
                &meshql_core::ReadContext::new(&self.ctx.filter, at),
            )
            .await
        {
            Ok(rows) => rows,
            Err(e) => {
                let msg: Arc<str> = Arc::from(e.to_string());
                return keys.iter().map(|_| Link::Error(msg.clone())).collect();
            }
        };
        let mut owners = Vec::with_capacity(rows.len());
        let mut children = Vec::with_capacity(rows.len());
        let mut taken = vec![false; keys.len()];
        for (key, row) in rows {
            let Some(&k) = key_index.get(&key) else {
                continue;
            };
            if !vector {
                if taken[k] {
                    continue;
                }
                taken[k] = true;
            }
            owners.push(k);
            children.push(Node::from_row(row));
        }
        self.resolve_links(selection, &mut children, at).await;
        let mut per_key: Vec<Vec<Arc<Node>>> = vec![Vec::new(); keys.len()];
        for (child, k) in children.into_iter().zip(owners) {
            per_key[k].push(Arc::new(child));
        }
        per_key.into_iter().map(Link::Nodes).collect()
    }
}
