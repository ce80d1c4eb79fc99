//! GraphQL subscriptions, fed by the change feed.
//!
//! An entity declares them in its SDL: a field of its `Subscription` type names one of its
//! bound root queries (same name, same arguments), e.g. `getByCoop(id: ID): Hen` beside the
//! query `getByCoop`. A subscription to it receives an event for every change of the entity
//! whose document matches the query's template with the subscription's arguments and that
//! the caller may read: the changed document with the subscription's selection, its
//! relationships resolved as of the change (one snapshot per event, as a query's `at`). A
//! delete answers the field with nothing (`null`, or `[]` for a list) and says so in the
//! event's `extensions.change`. So does an update that takes a document *out* of the match
//! (its version before the change matched and was visible to the caller, the new one does not
//! or is not): `extensions.change.departed` is `true`, so a client keeping the query's result
//! removes it. Whether the caller may read, and which fields, is the engine's
//! decision, as for every other read ([`meshql_engine::EntityService::read_grant`]).
//!
//! Subscriptions with the same query, variables and caller are one *cohort*
//! ([`Subscription::cohort`]): their events are identical, so a transport computes each
//! change's event once per cohort and sends the bytes to every member.

use crate::execute::{coerce_variables, execute_event};
use crate::output::{request_errors, RequestError};
use crate::plan::{OperationPlan, RootKind};
use crate::registry::Registry;
use crate::request::{GraphqlRequest, RequestContext};
use crate::tree::Node;
use meshql_core::{BoundArgs, Millis, Row, Search, Visibility};
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::Duration;

/// A change, as subscriptions see it (the change feed's published fields).
#[derive(Debug, Clone, Copy)]
pub struct ChangeEvent<'a> {
    /// Its position in the change log: what a subscriber resumes after.
    pub position: u64,
    pub entity: &'a str,
    pub id: &'a str,
    /// `create`, `update` or `delete`.
    pub op: &'a str,
    pub created_at: Millis,
    pub authorized_tokens: &'a [String],
    /// The document's JSON (for a delete, its last version).
    pub payload: &'a str,
    /// The same, parsed once for every subscription that looks at the change (`None`: not
    /// a JSON object, which no subscription matches).
    pub document: Option<&'a Map<String, Value>>,
    /// For an update: the version before it (read once for every subscription:
    /// [`version_before`]), to tell a document that leaves a query's match.
    pub before: Option<&'a Before>,
}

/// A document's version before a change: seen only through a subscription's
/// [`meshql_core::Visibility`].
pub type Before = meshql_engine::Prior;

/// The version of `change`'s document before it, for an update of an entity served here
/// (`None` otherwise, or when it cannot be read: then no departure is told).
pub async fn version_before(registry: &Registry, change: &ChangeEvent<'_>) -> Option<Before> {
    if change.op != "update" {
        return None;
    }
    let graphlette = registry
        .graphlettes()
        .iter()
        .find(|g| g.entity == change.entity)?;
    match graphlette
        .service
        .prior_version(change.id, change.created_at)
        .await
    {
        Ok(prior) => prior,
        Err(e) => {
            tracing::warn!(error = %e, "subscriptions: the version before an update could not be read; no departure is told");
            None
        }
    }
}

/// A planned subscription: what a transport keeps per subscriber.
pub struct Subscription {
    index: usize,
    entity: String,
    plan: Arc<OperationPlan>,
    variables: Map<String, Value>,
    /// The root query field's index in the graphlette and its arguments.
    query: usize,
    args: BoundArgs,
    reads: Arc<[String]>,
    ctx: RequestContext,
    /// What the subscriber may see of the changes: documents by tokens, fields by mask.
    visibility: Visibility,
    cohort: String,
}

/// What a subscribe request is.
pub enum Subscribed {
    /// A subscription: events until the subscriber leaves.
    Live(Box<Subscription>),
    /// A query sent over a subscription transport: answered once (the body), then complete.
    Once(Vec<u8>),
}

impl Registry {
    /// Plans `request` on graphlette `index` for a subscription transport: a subscription
    /// operation becomes a [`Subscription`]; a query is answered at once. `Err` is the body of
    /// the request's errors (unknown operation, invalid document or variables, a root field
    /// that names no bound query, a caller who may not read the entity).
    pub async fn subscribe(
        &self,
        index: usize,
        request: &GraphqlRequest,
        ctx: RequestContext,
    ) -> Result<Subscribed, Vec<u8>> {
        let Some(text) = request.query.as_deref().filter(|q| !q.trim().is_empty()) else {
            return Err(request_errors(&[RequestError::new(
                "Must provide query string.",
            )]));
        };
        let plan = self.planned(index, text, request.operation_name.as_deref())?;
        if !plan.subscription {
            return Ok(Subscribed::Once(self.execute(index, request, &ctx).await));
        }
        let graphlette = &self.graphlettes()[index];
        let variables = coerce_variables(graphlette, &plan, request.variables.as_ref())
            .map_err(|m| request_errors(&[RequestError::new(m)]))?;
        let Some((query, args, selection)) = plan.roots.iter().find_map(|r| match &r.kind {
            RootKind::Query {
                query,
                args,
                selection,
                ..
            } => Some((*query, args, selection)),
            _ => None,
        }) else {
            return Err(request_errors(&[RequestError::new(format!(
                "the subscription's field names no bound root query of {} (a `Subscription` field subscribes to the root query of the same name)",
                graphlette.path
            ))]));
        };
        let args: BoundArgs = args
            .iter()
            .map(|(k, v)| (k.clone(), v.eval(&variables)))
            .collect();
        let visibility = graphlette
            .service
            .visibility(&ctx.access)
            .map_err(|e| request_errors(&[RequestError::coded(e.to_string(), e.kind().code())]))?;
        let reads = selection.reads.clone();
        let cohort = format!(
            "{index}\u{1f}{text}\u{1f}{:?}\u{1f}{}\u{1f}{:?}\u{1f}{:?}",
            request.operation_name,
            Value::Object(variables.clone()),
            ctx.access.credentials,
            ctx.access.grants,
        );
        Ok(Subscribed::Live(Box::new(Subscription {
            index,
            entity: graphlette.entity.clone(),
            plan,
            variables,
            query,
            args,
            reads,
            ctx,
            visibility,
            cohort,
        })))
    }
}

impl Subscription {
    /// The entity whose changes it follows.
    pub fn entity(&self) -> &str {
        &self.entity
    }

    /// Subscriptions with equal cohorts receive identical events.
    pub fn cohort(&self) -> &str {
        &self.cohort
    }

    /// The event `change` makes for this subscription (a GraphQL response body with
    /// `extensions.change`), or `None` when the subscriber should not hear of it: another
    /// entity, a document the caller may not see, one the arguments do not match.
    pub async fn event(&self, registry: &Registry, change: &ChangeEvent<'_>) -> Option<Vec<u8>> {
        if change.entity != self.entity {
            return None;
        }
        let now = self
            .visibility
            .admits(change.entity, change.authorized_tokens)
            && self.matches(registry, change).await;
        // an update that takes the document out of the match: a departure, if the caller saw
        // the version before it
        let departed = !now
            && match change.before.and_then(|b| b.seen_by(&self.visibility)) {
                Some(before) => self.matched_before(registry, change, before).await,
                None => false,
            };
        if !now && !departed {
            return None;
        }
        let body = self
            .execute(registry, change, change.op != "delete" && !departed)
            .await;
        Some(with_change(body, change, departed))
    }

    /// Whether the query, with this subscription's arguments, finds the changed document.
    async fn matches(&self, registry: &Registry, change: &ChangeEvent<'_>) -> bool {
        let graphlette = &registry.graphlettes()[self.index];
        let template = &graphlette.queries[self.query].template;
        let Some(payload) = change.document else {
            return false;
        };
        if template.is_sql() {
            let at = if change.op == "delete" {
                change.created_at - 1
            } else {
                change.created_at
            };
            self.found_by_sql(registry, change.id, at).await
        } else {
            template.matches(&self.args, change.id, payload)
        }
    }

    /// Whether the query found the document's version before the change.
    async fn matched_before(
        &self,
        registry: &Registry,
        change: &ChangeEvent<'_>,
        before: &Map<String, Value>,
    ) -> bool {
        let template = &registry.graphlettes()[self.index].queries[self.query].template;
        if template.is_sql() {
            self.found_by_sql(registry, change.id, change.created_at - 1)
                .await
        } else {
            template.matches(&self.args, change.id, before)
        }
    }

    /// A SQL template cannot be evaluated here: ask the store whether the query, as of `at`,
    /// finds document `id`.
    async fn found_by_sql(&self, registry: &Registry, id: &str, at: Millis) -> bool {
        let graphlette = &registry.graphlettes()[self.index];
        let template = &graphlette.queries[self.query].template;
        let search = Search::new(template, &self.args, None);
        match graphlette
            .service
            .find(&self.ctx.access, &search, Some(at))
            .await
        {
            Ok(found) => found.rows.iter().any(|r| r.id == id),
            Err(e) => {
                tracing::warn!(error = %e, "a subscription's SQL template could not be evaluated for a change");
                false
            }
        }
    }

    /// The response for `change`: the document with the subscription's selection
    /// (`with_document`), or the field answered with nothing.
    async fn execute(
        &self,
        registry: &Registry,
        change: &ChangeEvent<'_>,
        with_document: bool,
    ) -> Vec<u8> {
        let node = with_document.then(|| {
            Node::from_row(
                Row {
                    id: change.id.to_owned(),
                    payload: change.payload.to_owned(),
                },
                &self.reads,
            )
            .masked(self.visibility.mask(&self.entity))
        });
        let limits = registry.limits();
        let deadline = tokio::time::Instant::now() + Duration::from_millis(limits.timeout_ms.get());
        execute_event(
            registry.graphlettes(),
            registry.fetchers(),
            &self.plan,
            &self.variables,
            &self.ctx,
            limits,
            deadline,
            node,
            change.created_at,
        )
        .await
    }
}

/// `body` (a GraphQL response object) with `"extensions":{"change":{…}}` added.
fn with_change(mut body: Vec<u8>, change: &ChangeEvent<'_>, departed: bool) -> Vec<u8> {
    if body.last() != Some(&b'}') {
        return body;
    }
    body.pop();
    let mut about = serde_json::json!({
        "position": change.position,
        "op": change.op,
        "id": change.id,
        "created_at": change.created_at,
    });
    if departed {
        about["departed"] = Value::Bool(true);
    }
    let extensions = serde_json::json!({ "change": about });
    body.extend_from_slice(b",\"extensions\":");
    body.extend_from_slice(extensions.to_string().as_bytes());
    body.push(b'}');
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_change_is_added_to_the_response() {
        let change = ChangeEvent {
            position: 7,
            entity: "hen",
            id: "h1",
            op: "update",
            created_at: 1000,
            authorized_tokens: &[],
            payload: "{}",
            document: None,
            before: None,
        };
        let body = with_change(br#"{"data":{"x":1}}"#.to_vec(), &change, false);
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["data"]["x"], 1);
        assert_eq!(v["extensions"]["change"]["position"], 7);
        assert_eq!(v["extensions"]["change"]["op"], "update");
        assert!(v["extensions"]["change"].get("departed").is_none());
        let body = with_change(br#"{"data":{"x":null}}"#.to_vec(), &change, true);
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["extensions"]["change"]["departed"], true);
    }
}
