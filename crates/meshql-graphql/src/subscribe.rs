//! GraphQL subscriptions, fed by the change feed.
//!
//! An entity declares them in its SDL: a field of its `Subscription` type names one of its
//! bound root queries (same name, same arguments), e.g. `getByCoop(id: ID): Hen` beside the
//! query `getByCoop`. A subscription to it receives an event for every change of the entity
//! whose document matches the query's template with the subscription's arguments and that
//! the caller may read: the changed document with the subscription's selection, its
//! relationships resolved as of the change (one snapshot per event, as a query's `at`). A
//! delete answers the field with nothing (`null`, or `[]` for a list) and says so in the
//! event's `extensions.change`. Whether the caller may read, and which fields, is the engine's
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
use meshql_core::{BoundArgs, Mask, Millis, Row, Search};
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
    mask: Option<Arc<Mask>>,
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
        let mask = graphlette
            .service
            .read_grant(&ctx.access.grants)
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
            mask,
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
        if change.entity != self.entity
            || !meshql_core::is_visible(&self.ctx.access.filter, change.authorized_tokens)
        {
            return None;
        }
        let graphlette = &registry.graphlettes()[self.index];
        let template = &graphlette.queries[self.query].template;
        let payload = change.document?;
        let matches = if template.is_sql() {
            // a SQL template cannot be evaluated here: ask the store whether the query, as
            // of the change, finds the document
            let search = Search::new(template, &self.args, None);
            let at = if change.op == "delete" {
                change.created_at - 1
            } else {
                change.created_at
            };
            match graphlette
                .service
                .find(&self.ctx.access, &search, Some(at))
                .await
            {
                Ok(found) => found.rows.iter().any(|r| r.id == change.id),
                Err(e) => {
                    tracing::warn!(error = %e, "a subscription's SQL template could not be evaluated for a change");
                    false
                }
            }
        } else {
            template.matches(&self.args, change.id, payload)
        };
        if !matches {
            return None;
        }
        let node = (change.op != "delete").then(|| {
            Node::from_row(
                Row {
                    id: change.id.to_owned(),
                    payload: change.payload.to_owned(),
                },
                &self.reads,
            )
            .masked(self.mask.as_ref())
        });
        let limits = registry.limits();
        let deadline = tokio::time::Instant::now() + Duration::from_millis(limits.timeout_ms.get());
        let body = execute_event(
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
        .await;
        Some(with_change(body, change))
    }
}

/// `body` (a GraphQL response object) with `"extensions":{"change":{…}}` added.
fn with_change(mut body: Vec<u8>, change: &ChangeEvent<'_>) -> Vec<u8> {
    if body.last() != Some(&b'}') {
        return body;
    }
    body.pop();
    let extensions = serde_json::json!({
        "change": {
            "position": change.position,
            "op": change.op,
            "id": change.id,
            "created_at": change.created_at,
        }
    });
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
        };
        let body = with_change(br#"{"data":{"x":1}}"#.to_vec(), &change);
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["data"]["x"], 1);
        assert_eq!(v["extensions"]["change"]["position"], 7);
        assert_eq!(v["extensions"]["change"]["op"], "update");
    }
}
