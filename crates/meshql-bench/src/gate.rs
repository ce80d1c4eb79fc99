//! The validation gate: before a scenario measures anything it proves that its requests hit
//! real data — documents it created through REST are readable, ids were discovered from the
//! responses, GraphQL answers are non-empty and carry the values that were written. A failed
//! gate turns the scenario into a failure that measured nothing.

use crate::client::Session;
use bytes::Bytes;
use http::Method;
use serde_json::Value;

/// Why a scenario could not measure.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The target answered, but not with the data the scenario put there.
    #[error("{0}")]
    Gate(String),
    /// Setup could not happen (server down, seeding refused, …).
    #[error("{0}")]
    Setup(String),
    /// The scenario needs a server the bench starts itself.
    #[error("needs a local server (run without --url)")]
    NeedsLocal,
}

pub type GateResult<T> = Result<T, ScenarioError>;

/// Fails the gate with `message` unless `cond` holds.
pub fn ensure(cond: bool, message: impl FnOnce() -> String) -> GateResult<()> {
    if cond {
        Ok(())
    } else {
        Err(ScenarioError::Gate(message()))
    }
}

/// Looks up a dotted path (`getById.coops.0.name`) in a JSON value.
pub fn at<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(value, |v, seg| match v {
        Value::Array(items) => seg.parse::<usize>().ok().and_then(|i| items.get(i)),
        _ => v.get(seg),
    })
}

/// Length of the array at `path`, 0 when missing or not an array.
pub fn len_at(value: &Value, path: &str) -> usize {
    at(value, path)
        .and_then(Value::as_array)
        .map_or(0, Vec::len)
}

/// Creates a document with `POST path` and returns its id, taken from the response body's
/// `id` or, failing that, the last segment of its `Location` header.
pub async fn create(session: &mut Session, path: &str, doc: &Value) -> GateResult<String> {
    let body = Bytes::from(serde_json::to_vec(doc).expect("serialises"));
    let reply = session
        .send(Method::POST, path, Some(body))
        .await
        .map_err(|e| ScenarioError::Setup(format!("POST {path}: {e}")))?;
    if !(reply.status.is_success() || reply.status.is_redirection()) {
        return Err(ScenarioError::Gate(format!(
            "POST {path} answered {}: {}",
            reply.status,
            String::from_utf8_lossy(&reply.body)
        )));
    }
    let from_body = reply
        .json()
        .and_then(|v| v.get("id").and_then(Value::as_str).map(str::to_owned));
    let from_location = reply
        .location
        .as_deref()
        .and_then(|l| l.rsplit('/').next())
        .filter(|s| !s.is_empty())
        .map(str::to_owned);
    from_body.or(from_location).ok_or_else(|| {
        ScenarioError::Gate(format!(
            "POST {path} answered {} without an id in its body or Location header",
            reply.status
        ))
    })
}

/// Creates many documents with `POST path/bulk` and returns their ids in order.
pub async fn create_bulk(
    session: &mut Session,
    path: &str,
    docs: &[Value],
) -> GateResult<Vec<String>> {
    let body = Bytes::from(serde_json::to_vec(docs).expect("serialises"));
    let url = format!("{path}/bulk");
    let reply = session
        .send(Method::POST, &url, Some(body))
        .await
        .map_err(|e| ScenarioError::Setup(format!("POST {url}: {e}")))?;
    if !reply.status.is_success() {
        return Err(ScenarioError::Gate(format!(
            "POST {url} answered {}: {}",
            reply.status,
            String::from_utf8_lossy(&reply.body[..reply.body.len().min(300)])
        )));
    }
    let items = reply
        .json()
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default();
    let ids: Vec<String> = items
        .iter()
        .filter_map(|item| match item {
            Value::Object(_) => item.get("id").and_then(Value::as_str).map(str::to_owned),
            // servers that answer with the created documents' URLs
            Value::String(url) => url.rsplit('/').next().map(str::to_owned),
            _ => None,
        })
        .collect();
    ensure(ids.len() == docs.len(), || {
        format!(
            "POST {url} created {} documents but the response names {} ids",
            docs.len(),
            ids.len()
        )
    })?;
    Ok(ids)
}

/// `GET path` must answer 2xx with a JSON body; returns it.
pub async fn get_json(session: &mut Session, path: &str) -> GateResult<Value> {
    let reply = session
        .send(Method::GET, path, None)
        .await
        .map_err(|e| ScenarioError::Setup(format!("GET {path}: {e}")))?;
    ensure(reply.status.is_success(), || {
        format!("GET {path} answered {}", reply.status)
    })?;
    reply
        .json()
        .ok_or_else(|| ScenarioError::Gate(format!("GET {path} did not answer JSON")))
}

/// Runs a GraphQL query that must answer without errors; returns its `data`.
pub async fn query(session: &mut Session, path: &str, query: &str) -> GateResult<Value> {
    let reply = session
        .send(Method::POST, path, Some(crate::client::graphql_body(query)))
        .await
        .map_err(|e| ScenarioError::Setup(format!("POST {path}: {e}")))?;
    ensure(reply.status.is_success(), || {
        format!("POST {path} answered {} to {query}", reply.status)
    })?;
    let v = reply
        .json()
        .ok_or_else(|| ScenarioError::Gate(format!("POST {path} did not answer JSON")))?;
    if let Some(errors) = v.get("errors").and_then(Value::as_array) {
        ensure(errors.is_empty(), || {
            format!(
                "{path} answered errors to {query}: {}",
                Value::Array(errors.clone())
            )
        })?;
    }
    match v.get("data") {
        Some(d) if !d.is_null() => Ok(d.clone()),
        _ => Err(ScenarioError::Gate(format!(
            "{path} answered no data to {query}"
        ))),
    }
}

/// The value at `path` in `data` must equal `expected`.
pub fn expect_eq(data: &Value, path: &str, expected: &Value, what: &str) -> GateResult<()> {
    let got = at(data, path);
    ensure(got == Some(expected), || {
        format!(
            "{what}: expected {path} = {expected}, got {}",
            got.map_or("nothing".to_string(), Value::to_string)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn dotted_paths_walk_objects_and_arrays() {
        let v = json!({"getById": {"coops": [{"name": "a", "hens": [1, 2]}]}});
        assert_eq!(at(&v, "getById.coops.0.name"), Some(&json!("a")));
        assert_eq!(len_at(&v, "getById.coops.0.hens"), 2);
        assert_eq!(len_at(&v, "getById.coops.1.hens"), 0);
        assert!(at(&v, "getById.farm").is_none());
        assert!(expect_eq(&v, "getById.coops.0.name", &json!("a"), "x").is_ok());
        let err = expect_eq(&v, "getById.coops.0.name", &json!("b"), "coop name").unwrap_err();
        assert!(err.to_string().contains("coop name"), "{err}");
    }
}
