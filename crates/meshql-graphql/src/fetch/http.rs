//! Federation over HTTP: all keys of one resolver field at one level become one request
//! with aliased root fields (`item_0: getByFarm(id: "F1", at: T) { ... } item_1: ...`),
//! and each alias's JSON is spliced into the response as it is.

use super::{Batch, Fetched, Fetcher};
use crate::plan::TargetPlan;
use crate::request::Budget;
use crate::tree::{FieldError, Link, Step};
use futures::future::BoxFuture;
use meshql_core::{ErrorKind, Millis};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::fmt::Write;
use std::sync::Arc;

/// The fetcher of every remote graphlette: one HTTP client, shared.
pub(crate) struct Http {
    client: reqwest::Client,
}

#[derive(Deserialize)]
struct RemoteResponse {
    #[serde(default)]
    data: Option<HashMap<String, Box<RawValue>>>,
    #[serde(default)]
    errors: Option<Vec<RemoteError>>,
}

#[derive(Deserialize)]
struct RemoteError {
    message: String,
    #[serde(default)]
    path: Option<Vec<serde_json::Value>>,
    #[serde(default)]
    extensions: Option<RemoteExtensions>,
}

#[derive(Deserialize)]
struct RemoteExtensions {
    #[serde(default)]
    code: Option<String>,
}

/// `extensions.code` for an error a remote graphlette answered: its own code when it is one
/// meshql uses (the remote is usually meshql too), else `REMOTE_ERROR`.
fn remote_code(code: Option<&str>) -> &'static str {
    const KNOWN: &[&str] = &[
        "UNAVAILABLE",
        "CONFLICT",
        "BAD_REQUEST",
        "NOT_FOUND",
        "INTERNAL_SERVER_ERROR",
        "UNAUTHENTICATED",
        "FORBIDDEN",
        crate::plan::TOO_COMPLEX,
        crate::output::TOO_LARGE,
        crate::output::TIMEOUT,
    ];
    code.and_then(|c| KNOWN.iter().find(|k| **k == c).copied())
        .unwrap_or("REMOTE_ERROR")
}

/// `extensions.code` for a remote graphlette that answered an HTTP error status.
fn status_code(status: reqwest::StatusCode) -> &'static str {
    match status.as_u16() {
        401 => ErrorKind::Unauthenticated.code(),
        403 => "FORBIDDEN",
        _ => ErrorKind::Unavailable.code(),
    }
}

/// Keys per aliased request (MeshQL batches at most 100 per request too); larger levels are
/// sent as several requests at once.
const CHUNK: usize = 100;

/// Largest remote response accepted.
const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// Builds the batched document for `keys`.
pub(crate) fn batch_query(
    query_name: &str,
    selection: &str,
    fragments: &str,
    variables: &[(String, String)],
    keys: &[String],
    at: Option<Millis>,
) -> String {
    let mut q = String::with_capacity(64 + keys.len() * (selection.len() + 64));
    q.push_str("query MeshqlBatch");
    if !variables.is_empty() {
        q.push('(');
        for (i, (name, ty)) in variables.iter().enumerate() {
            if i > 0 {
                q.push_str(", ");
            }
            let _ = write!(q, "${name}: {ty}");
        }
        q.push(')');
    }
    q.push_str(" {");
    for (i, key) in keys.iter().enumerate() {
        let key = serde_json::to_string(key).expect("strings serialise");
        let _ = write!(q, " item_{i}: {query_name}(id: {key}");
        if let Some(at) = at {
            let _ = write!(q, ", at: {at}");
        }
        let _ = write!(q, ") {selection}");
    }
    q.push_str(" }");
    q.push_str(fragments);
    q
}

impl Http {
    pub fn new(client: reqwest::Client) -> Self {
        Self { client }
    }
}

impl Fetcher for Http {
    fn fetch<'a>(&'a self, batch: Batch<'a>) -> BoxFuture<'a, Fetched> {
        Box::pin(async move {
            // the requests run at once: they share what is left of the object budget
            let requests = batch.keys.len().div_ceil(CHUNK).max(1);
            let budget = Budget {
                objects: batch.budget.objects.map(|o| o / requests),
                ..batch.budget
            };
            let chunks = futures::future::join_all(batch.keys.chunks(CHUNK).map(|keys| {
                fetch_chunk(
                    &self.client,
                    Batch {
                        keys,
                        budget,
                        ..batch
                    },
                )
            }))
            .await;
            Fetched::Links(chunks.into_iter().flatten().collect())
        })
    }
}

/// One aliased request for `batch.keys` (at most [`CHUNK`] of them): a link per key.
async fn fetch_chunk(client: &reqwest::Client, batch: Batch<'_>) -> Vec<Link> {
    let Batch {
        resolver,
        keys,
        at,
        ctx,
        variables: request_variables,
        budget,
    } = batch;
    let TargetPlan::Http {
        url,
        query_name,
        selection,
        fragments,
        variables,
        ..
    } = &resolver.target
    else {
        unreachable!("the HTTP fetcher is only given HTTP targets");
    };
    let all_failed = |message: String| -> Vec<Link> {
        let error = FieldError::new(message, Some(ErrorKind::Unavailable.code()));
        keys.iter().map(|_| Link::Error(error.clone())).collect()
    };
    let query = batch_query(query_name, selection, fragments, variables, keys, at);
    let vars: serde_json::Map<String, serde_json::Value> = variables
        .iter()
        .filter_map(|(n, _)| request_variables.get(n).map(|v| (n.clone(), v.clone())))
        .collect();
    let body = serde_json::json!({ "query": query, "variables": vars });
    let mut request = client
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .header(Budget::HEADER, budget.to_header())
        .body(body.to_string());
    if let Some(auth) = &ctx.authorization {
        request = request.header("authorization", auth);
    }
    if let Some(token) = &ctx.consistency {
        request = request.header(meshql_engine::consistency::HEADER, token);
    }
    let response = match request.send().await {
        Ok(r) => r,
        Err(e) => return all_failed(format!("remote graphlette {url} is unreachable: {e}")),
    };
    let status = response.status();
    if response
        .content_length()
        .is_some_and(|n| n as usize > MAX_RESPONSE_BYTES)
    {
        return all_failed(format!(
            "remote graphlette {url} answered more than {MAX_RESPONSE_BYTES} bytes"
        ));
    }
    let bytes = match response.bytes().await {
        Ok(b) => b,
        Err(e) => return all_failed(format!("remote graphlette {url} failed: {e}")),
    };
    if !status.is_success() {
        let error = FieldError::new(
            format!("remote graphlette {url} answered HTTP {status}"),
            Some(status_code(status)),
        );
        return keys.iter().map(|_| Link::Error(error.clone())).collect();
    }
    let parsed: RemoteResponse = match serde_json::from_slice(&bytes) {
        Ok(p) => p,
        Err(e) => return all_failed(format!("remote graphlette {url} sent invalid JSON: {e}")),
    };
    // errors that name an alias belong to that key; errors without a path to every key. A key
    // with an error fails with its first one even if data came along (CONTRACT §3.5): a
    // service two hops away failing must not turn into a silent null.
    //
    // One kind of error does not fail its key: `FORBIDDEN` below the key's own field (a field
    // the caller's read mask hides on the remote side). The remote answered that field null
    // and the rest of the data stands, so it is spliced with the error moved to its path
    // here: the same answer as an in-process relationship gives.
    let errors = parsed.errors.unwrap_or_default();
    let masked_field = |e: &RemoteError| {
        e.extensions.as_ref().and_then(|x| x.code.as_deref()) == Some("FORBIDDEN")
            && e.path.as_ref().is_some_and(|p| p.len() > 1)
    };
    let error_for = |alias: &str| -> Option<FieldError> {
        errors
            .iter()
            .filter(|e| !masked_field(e))
            .find(|e| match e.path.as_deref() {
                Some([first, ..]) => first.as_str() == Some(alias),
                _ => true,
            })
            .map(|e| {
                let code = e.extensions.as_ref().and_then(|x| x.code.as_deref());
                FieldError::new(
                    format!("Remote GraphQL error: {}", e.message),
                    Some(remote_code(code)),
                )
            })
    };
    let mut data = parsed.data.unwrap_or_default();
    (0..keys.len())
        .map(|i| {
            let alias = format!("item_{i}");
            if let Some(error) = error_for(&alias) {
                return Link::Error(error);
            }
            let first_of_vector = !resolver.vector;
            let raw = match data.remove(&alias) {
                Some(raw) if raw.get() != "null" => {
                    if first_of_vector && raw.get().starts_with('[') {
                        // a singleton field fed by a vector query: the first element
                        let items: Vec<Box<RawValue>> =
                            serde_json::from_str(raw.get()).unwrap_or_default();
                        match items.into_iter().next() {
                            Some(first) => (Arc::from(first), true),
                            None => return Link::Raw(None),
                        }
                    } else {
                        (Arc::from(raw), false)
                    }
                }
                _ => return Link::Raw(None),
            };
            let (raw, unwrapped) = raw;
            let field_errors: Vec<(Vec<Step>, FieldError)> = errors
                .iter()
                .filter(|e| masked_field(e))
                .filter_map(|e| {
                    let path = e.path.as_deref()?;
                    if path[0].as_str() != Some(alias.as_str()) {
                        return None;
                    }
                    let mut rest = &path[1..];
                    if unwrapped {
                        // only the first element was kept
                        match rest.first().and_then(|s| s.as_u64()) {
                            Some(0) => rest = &rest[1..],
                            _ => return None,
                        }
                    }
                    let steps = rest
                        .iter()
                        .map(|s| match s {
                            serde_json::Value::Number(n) => {
                                Step::Index(n.as_u64().unwrap_or(0) as usize)
                            }
                            other => Step::Key(Arc::from(other.as_str().unwrap_or_default())),
                        })
                        .collect();
                    Some((
                        steps,
                        FieldError::new(
                            format!("Remote GraphQL error: {}", e.message),
                            Some("FORBIDDEN"),
                        ),
                    ))
                })
                .collect();
            if field_errors.is_empty() {
                Link::Raw(Some(raw))
            } else {
                Link::Remote(raw, field_errors.into())
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_codes_are_kept_when_meshql_knows_them() {
        assert_eq!(remote_code(Some("UNAVAILABLE")), "UNAVAILABLE");
        assert_eq!(remote_code(Some("QUERY_TOO_COMPLEX")), "QUERY_TOO_COMPLEX");
        assert_eq!(remote_code(Some("SOMETHING_ELSE")), "REMOTE_ERROR");
        assert_eq!(remote_code(None), "REMOTE_ERROR");
        assert_eq!(
            status_code(reqwest::StatusCode::UNAUTHORIZED),
            "UNAUTHENTICATED"
        );
        assert_eq!(status_code(reqwest::StatusCode::FORBIDDEN), "FORBIDDEN");
        assert_eq!(status_code(reqwest::StatusCode::BAD_GATEWAY), "UNAVAILABLE");
    }

    #[test]
    fn batch_query_aliases_every_key() {
        let q = batch_query(
            "getByFarm",
            "{ name hens { name } }",
            " fragment F on Hen { name }",
            &[("n".into(), "Int".into())],
            &["F1".into(), "F\"2".into()],
            Some(1_700_000_000_000),
        );
        assert_eq!(
            q,
            "query MeshqlBatch($n: Int) { item_0: getByFarm(id: \"F1\", at: 1700000000000) { name hens { name } } item_1: getByFarm(id: \"F\\\"2\", at: 1700000000000) { name hens { name } } } fragment F on Hen { name }"
        );
    }
}
