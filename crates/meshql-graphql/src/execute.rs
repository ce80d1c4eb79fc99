//! Executing a planned operation: coerce the variables, run the root queries, then resolve
//! relationship fields **level by level** (for every resolver field, the keys of all
//! parents at that level are de-duplicated and handed to its fetcher in one batch), and
//! write the response. Builds the result tree from what the fetchers return; the plan
//! cache and the choice of fetchers belong to the registry above.

use crate::catalog::Graphlette;
use crate::fetch::{Batch, Fetched, Fetchers, RootRows};
use crate::output::{request_errors, RequestError, Writer, TOO_LARGE};
use crate::plan::{self, at_of, OperationPlan, ResolverPlan, RootKind, SelectionPlan, TargetPlan};
use crate::request::{Budget, RequestContext};
use crate::tree::{FieldError, Link, Node, RootResult};
use futures::future::{join_all, BoxFuture};
use meshql_core::graph::GraphqlLimits;
use meshql_core::{ErrorKind, KeyedRows, Mask, Millis, NestedRow};
use meshql_engine::Granted;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

struct Exec<'a> {
    graphlettes: &'a [Graphlette],
    fetchers: &'a Fetchers,
    ctx: &'a RequestContext,
    variables: Map<String, Value>,
    /// Documents fetched so far; past `max_objects` nothing more is fetched and the
    /// request answers [`TOO_LARGE`].
    fetched: AtomicUsize,
    max_objects: usize,
    /// This request's depth bounds (its service's, lowered by a caller's budget): what is
    /// left of them goes to remote graphlettes.
    max_depth: usize,
    max_relationship_depth: usize,
    /// When the request's time is up (its service's timeout, or a caller's budget).
    deadline: tokio::time::Instant,
    /// A root field's `at` that looks like seconds, not milliseconds (0: none): the
    /// response's `extensions.hints` says so.
    seconds_like_at: std::sync::atomic::AtomicI64,
}

/// Executes `plan` against graphlette `index` with the request's `variables`; returns the
/// response body (always a GraphQL response: errors are inside it).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn execute(
    graphlettes: &[Graphlette],
    fetchers: &Fetchers,
    index: usize,
    plan: &OperationPlan,
    variables: Option<&Value>,
    ctx: &RequestContext,
    limits: &GraphqlLimits,
    deadline: tokio::time::Instant,
) -> Vec<u8> {
    let graphlette = &graphlettes[index];
    let variables = match coerce_variables(graphlette, plan, variables) {
        Ok(v) => v,
        Err(message) => return request_errors(&[RequestError::new(message)]),
    };
    let exec = Exec::new(graphlettes, fetchers, ctx, variables, limits, deadline);
    let introspection = if plan.has_introspection {
        match introspect(graphlette, plan, &exec.variables) {
            Ok(data) => Some(data),
            Err(message) => return request_errors(&[RequestError::new(message)]),
        }
    } else {
        None
    };
    let results = exec.roots(index, plan).await;
    if exec.over() {
        return request_errors(&[RequestError::coded(
            format!(
                "the query matches more than {} documents (graphql.max_objects{}); select less or pass `limit`",
                exec.max_objects,
                if ctx.budget.objects.is_some() { ", or what the calling service left of it" } else { "" }
            ),
            TOO_LARGE,
        )]);
    }
    let mut writer = Writer::new(
        &exec.variables,
        exec.max_objects,
        limits.max_response_bytes.get(),
    );
    writer.write_response(plan, results, introspection.as_ref());
    let seconds_like_at = exec.seconds_like_at.load(Ordering::Relaxed);
    if seconds_like_at != 0 {
        writer.hint(meshql_core::time::seconds_hint(seconds_like_at));
    }
    writer.finish()
}

pub(crate) fn coerce_variables(
    graphlette: &Graphlette,
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
    let schema = &graphlette.schema;
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
    g: &Graphlette,
    plan: &OperationPlan,
    variables: &Map<String, Value>,
) -> Result<Map<String, Value>, String> {
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

/// The objects in a remote graphlette's answer (its `{`s; one inside a string counts too,
/// which only errs on the safe side).
fn remote_objects(link: &Link) -> usize {
    let raw = match link {
        Link::Raw(Some(raw)) | Link::Remote(raw, _) => raw.get(),
        _ => return 0,
    };
    raw.bytes().filter(|b| *b == b'{').count()
}

/// Documents in nested rows, their children included.
fn nested_count(rows: &[NestedRow]) -> usize {
    rows.iter()
        .map(|r| 1 + r.children.iter().map(|c| nested_count(c)).sum::<usize>())
        .sum()
}

/// A subscription's event: the plan's root query field answered with `node` (the changed
/// document, or `None`: nothing, as for a delete), its relationships resolved as of `at`;
/// other root fields (`__typename`) as for a query. The response body.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn execute_event(
    graphlettes: &[Graphlette],
    fetchers: &Fetchers,
    plan: &OperationPlan,
    variables: &Map<String, Value>,
    ctx: &RequestContext,
    limits: &GraphqlLimits,
    deadline: tokio::time::Instant,
    node: Option<Node>,
    at: Millis,
) -> Vec<u8> {
    let exec = Exec::new(
        graphlettes,
        fetchers,
        ctx,
        variables.clone(),
        limits,
        deadline,
    );
    let mut results: Vec<Option<RootResult>> = plan
        .roots
        .iter()
        .map(|r| plan::included(&r.include, &exec.variables).then(|| RootResult::Nodes(Vec::new())))
        .collect();
    if let Some((i, selection)) = plan
        .roots
        .iter()
        .enumerate()
        .find_map(|(i, r)| match &r.kind {
            RootKind::Query { selection, .. } => Some((i, selection)),
            _ => None,
        })
    {
        let mut nodes: Vec<Node> = node.into_iter().collect();
        exec.admit(nodes.len());
        exec.resolve_links(selection, &mut nodes, Some(at)).await;
        if results[i].is_some() {
            results[i] = Some(RootResult::Nodes(nodes));
        }
    }
    if exec.over() {
        return request_errors(&[RequestError::coded(
            format!(
                "the event matches more than {} documents (graphql.max_objects); select less",
                exec.max_objects
            ),
            TOO_LARGE,
        )]);
    }
    let mut writer = Writer::new(
        &exec.variables,
        exec.max_objects,
        limits.max_response_bytes.get(),
    );
    writer.write_response(plan, results, None);
    writer.finish()
}

impl<'a> Exec<'a> {
    fn new(
        graphlettes: &'a [Graphlette],
        fetchers: &'a Fetchers,
        ctx: &'a RequestContext,
        variables: Map<String, Value>,
        limits: &GraphqlLimits,
        deadline: tokio::time::Instant,
    ) -> Self {
        Exec {
            graphlettes,
            fetchers,
            ctx,
            variables,
            fetched: AtomicUsize::new(0),
            max_objects: Budget::lower(limits.max_objects.get(), ctx.budget.objects),
            max_depth: Budget::lower(limits.max_depth.get(), ctx.budget.depth),
            max_relationship_depth: Budget::lower(
                limits.max_relationship_depth.get(),
                ctx.budget.relationships,
            ),
            deadline,
            seconds_like_at: std::sync::atomic::AtomicI64::new(0),
        }
    }

    /// What a root field reads as of: its `at`, or the request's snapshot — and with it
    /// every level below (and remote services, which receive it as `at`), as MeshQL, whose
    /// resolvers pass the root's time on.
    fn at(&self, given: Option<Millis>) -> Option<Millis> {
        if let Some(t) = given.filter(|t| meshql_core::time::looks_like_seconds(*t)) {
            self.seconds_like_at.store(t, Ordering::Relaxed);
        }
        Some(given.unwrap_or(self.ctx.snapshot))
    }

    /// What is left of this request's bounds for a remote graphlette answering a resolver
    /// field at field level `level` that is relationship number `relationship_level` on its
    /// path (the remote's root field stands for it; see [`Budget`]).
    fn remote_budget(&self, level: usize, relationship_level: usize) -> Budget {
        let left = self
            .deadline
            .saturating_duration_since(tokio::time::Instant::now());
        Budget {
            depth: Some((self.max_depth + 1).saturating_sub(level)),
            relationships: Some(
                self.max_relationship_depth
                    .saturating_sub(relationship_level),
            ),
            objects: Some(
                self.max_objects
                    .saturating_sub(self.fetched.load(Ordering::Relaxed)),
            ),
            ms: Some(left.as_millis() as u64),
        }
    }

    /// Counts `n` more fetched documents; false once past the budget.
    fn admit(&self, n: usize) -> bool {
        self.fetched.fetch_add(n, Ordering::Relaxed) + n <= self.max_objects
    }

    fn over(&self) -> bool {
        self.fetched.load(Ordering::Relaxed) > self.max_objects
    }

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
        let vector = self.graphlettes[index].queries[*query].vector;
        let at = self.at(batch.at);
        let mut keys: Vec<String> = Vec::new();
        let mut key_index: HashMap<String, usize> = HashMap::new();
        for (_, id) in &batch.members {
            if !key_index.contains_key(id) {
                key_index.insert(id.clone(), keys.len());
                keys.push(id.clone());
            }
        }
        let Granted { rows, mask } = match self
            .fetchers
            .local(index)
            .find_batch(&self.ctx.access, *query, &keys, at)
            .await
        {
            Ok(granted) => granted,
            Err(e) => {
                let e = FieldError::engine(&e);
                return batch
                    .members
                    .iter()
                    .map(|(i, _)| (*i, Some(RootResult::Error(e.clone()))))
                    .collect();
            }
        };
        if !self.admit(rows.len()) {
            return Vec::new();
        }
        let mut owners = Vec::with_capacity(rows.len());
        let mut nodes = Vec::with_capacity(rows.len());
        for (key, row) in rows {
            if let Some(&k) = key_index.get(&key) {
                owners.push(k);
                nodes.push(Node::from_row(row, &selection.reads).masked(mask.as_ref()));
            }
        }
        self.resolve_links(selection, &mut nodes, at).await;
        let mut per_key: Vec<Vec<Node>> = vec![Vec::new(); keys.len()];
        for (node, k) in nodes.into_iter().zip(owners) {
            if vector || per_key[k].is_empty() {
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
        let vector = self.graphlettes[index].queries[*query].vector;
        let args: Map<String, Value> = args
            .iter()
            .map(|(k, v)| (k.clone(), v.eval(&self.variables)))
            .collect();
        let at = self.at(at_of(&args));
        let limit = if vector {
            match limit_of(&args) {
                Ok(l) => l,
                Err(message) => {
                    return Some(RootResult::Error(FieldError::new(
                        message,
                        Some(ErrorKind::Invalid.code()),
                    )))
                }
            }
        } else {
            Some(1)
        };
        // one more than the budget allows: enough to know the query matches too many
        let budget = self.max_objects.saturating_add(1);
        let limit = Some(limit.map_or(budget, |l| l.min(budget)));
        let rows = match self
            .fetchers
            .local(index)
            .query(
                &self.ctx.access,
                *query,
                &args,
                limit,
                selection.nested.as_deref(),
                &selection.reads,
                at,
            )
            .await
        {
            Ok(RootRows::Nested(rows)) => {
                if !self.admit(nested_count(&rows)) {
                    return None;
                }
                return Some(RootResult::Nodes(
                    rows.into_iter().map(Node::from_nested).collect(),
                ));
            }
            Ok(RootRows::Flat(granted)) => granted,
            Err(e) => return Some(RootResult::Error(FieldError::engine(&e))),
        };
        if !self.admit(rows.rows.len()) {
            return None;
        }
        let Granted { rows, mask } = rows;
        let mut nodes: Vec<Node> = rows
            .into_iter()
            .map(|r| Node::from_row(r, &selection.reads).masked(mask.as_ref()))
            .collect();
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
            if selection.resolvers.is_empty() || nodes.is_empty() || self.over() {
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
        // whether the caller may read the target: its service decides (in-process), or the
        // remote service from the forwarded credentials
        let per_key: Vec<Link> = if keys.is_empty() {
            Vec::new()
        } else {
            let budget = match &resolver.target {
                TargetPlan::Http {
                    level,
                    relationship_level,
                    ..
                } => self.remote_budget(*level, *relationship_level),
                TargetPlan::InProcess { .. } => Budget::default(),
            };
            let batch = Batch {
                resolver,
                keys: &keys,
                at,
                ctx: self.ctx,
                variables: &self.variables,
                budget,
            };
            match self
                .fetchers
                .for_target(&resolver.target)
                .fetch(batch)
                .await
            {
                Fetched::Links(links) => {
                    // a remote answer's objects count against this request's budget too: a
                    // cycle through services cannot multiply past it hop by hop
                    self.admit(links.iter().map(remote_objects).sum());
                    links
                }
                Fetched::Rows(Granted { rows, mask }) => {
                    let TargetPlan::InProcess { selection, .. } = &resolver.target else {
                        unreachable!("rows come from in-process targets only");
                    };
                    self.children(
                        rows,
                        selection,
                        resolver.vector,
                        &keys,
                        &key_index,
                        at,
                        mask,
                    )
                    .await
                }
                Fetched::Failed(message) => {
                    keys.iter().map(|_| Link::Error(message.clone())).collect()
                }
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

    /// The links of one in-process level: the fetched rows as nodes per key (a singleton
    /// keeps its first row, `mask` the fields the caller may read), with the level below
    /// them resolved.
    #[allow(clippy::too_many_arguments)]
    async fn children(
        &self,
        rows: KeyedRows,
        selection: &SelectionPlan,
        vector: bool,
        keys: &[String],
        key_index: &HashMap<String, usize>,
        at: Option<Millis>,
        mask: Option<Arc<Mask>>,
    ) -> Vec<Link> {
        if !self.admit(rows.len()) {
            return keys.iter().map(|_| Link::Nodes(Vec::new())).collect();
        }
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
            children.push(Node::from_row(row, &selection.reads).masked(mask.as_ref()));
        }
        self.resolve_links(selection, &mut children, at).await;
        let mut per_key: Vec<Vec<Arc<Node>>> = vec![Vec::new(); keys.len()];
        for (child, k) in children.into_iter().zip(owners) {
            per_key[k].push(Arc::new(child));
        }
        per_key.into_iter().map(Link::Nodes).collect()
    }
}
