//! Persisted queries on the GraphQL endpoints (`[server.persisted_queries]`).
//!
//! - `apq` (the default), Apollo's Automatic Persisted Queries: a request may carry
//!   `extensions.persistedQuery = {"version": 1, "sha256Hash": H}` instead of its query. A
//!   hash the server does not know answers `PersistedQueryNotFound` (HTTP 200, code
//!   `PERSISTED_QUERY_NOT_FOUND`); the client then sends the query with its hash, the server
//!   checks that the hash is the query's SHA-256 (400 otherwise), remembers it and runs it.
//!   The store is a bounded cache (`max_entries`, least recently used dropped first); a query
//!   longer than [`LONGEST_STORED`] runs but is not remembered.
//! - `allowlist`: only the operations of an Apollo persisted-query manifest run, sent by id
//!   (`sha256Hash`) or by their exact text; anything else is a 400
//!   `PERSISTED_QUERY_NOT_IN_LIST`.
//! - `off`: a hash alone is refused (`PERSISTED_QUERY_NOT_SUPPORTED`); a query with a hash
//!   runs as if it had none.
//!
//! A request without `extensions.persistedQuery` costs nothing more in `apq` and `off`.

use axum::http::StatusCode;
use meshql_config::resolve::PersistedQueriesSpec;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::fmt::Write;
use std::sync::Arc;
use thiserror::Error;

/// The longest query the APQ store keeps (the plan cache's bound too).
pub(crate) const LONGEST_STORED: usize = 16 * 1024;

/// Why a request's persisted query cannot run.
#[derive(Debug, Error, PartialEq, Eq)]
pub(crate) enum PersistedQueryError {
    /// A hash without a query, unknown here: the client should send the query with it.
    #[error("PersistedQueryNotFound")]
    NotFound,
    /// `mode = "off"`.
    #[error("PersistedQueryNotSupported")]
    NotSupported,
    #[error("provided sha does not match query")]
    HashMismatch,
    #[error("Unsupported persisted query version")]
    Version,
    #[error("malformed extensions.persistedQuery: {0}")]
    Malformed(String),
    /// An id the allow-list does not have.
    #[error("persisted query `{0}` is not in this service's persisted-query list")]
    NotInList(String),
    /// A query text the allow-list does not have.
    #[error("this service runs only the operations of its persisted-query list ([server.persisted_queries] mode = \"allowlist\"): send a listed operation's id as extensions.persistedQuery.sha256Hash, or its exact text")]
    QueryNotInList,
}

impl PersistedQueryError {
    /// The HTTP status: 200 for what Apollo clients recover from by themselves (sending the
    /// query, or no longer sending hashes), 400 for the rest.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Self::NotFound | Self::NotSupported => StatusCode::OK,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    /// `extensions.code`.
    pub(crate) fn code(&self) -> &'static str {
        match self {
            Self::NotFound => "PERSISTED_QUERY_NOT_FOUND",
            Self::NotSupported => "PERSISTED_QUERY_NOT_SUPPORTED",
            Self::HashMismatch | Self::Version | Self::Malformed(_) => "BAD_REQUEST",
            Self::NotInList(_) | Self::QueryNotInList => "PERSISTED_QUERY_NOT_IN_LIST",
        }
    }
}

/// `extensions.persistedQuery`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PersistedQuery {
    version: u64,
    sha256_hash: String,
}

enum Mode {
    Off,
    /// Queries by lowercase hex SHA-256.
    Apq(moka::sync::Cache<String, Arc<str>>),
    Allowlist {
        by_id: HashMap<String, Arc<str>>,
        bodies: HashSet<Arc<str>>,
    },
}

/// The persisted queries of a server's GraphQL endpoints (shared by all of them: a hash
/// names a query text, whichever endpoint runs it).
pub(crate) struct PersistedQueries {
    mode: Mode,
}

impl PersistedQueries {
    pub(crate) fn new(spec: &PersistedQueriesSpec) -> PersistedQueries {
        let mode = match spec {
            PersistedQueriesSpec::Off => Mode::Off,
            PersistedQueriesSpec::Apq { max_entries } => Mode::Apq(
                moka::sync::Cache::builder()
                    .max_capacity(*max_entries)
                    .build(),
            ),
            PersistedQueriesSpec::Allowlist { operations, .. } => {
                let mut by_id = HashMap::new();
                let mut bodies = HashSet::new();
                for op in operations {
                    let body: Arc<str> = Arc::from(op.body.as_str());
                    by_id.insert(op.id.clone(), body.clone());
                    bodies.insert(body);
                }
                Mode::Allowlist { by_id, bodies }
            }
        };
        PersistedQueries { mode }
    }

    /// The query a request runs, from its `query` and its `extensions` (`Ok(None)`: it has
    /// none, which the GraphQL layer answers).
    pub(crate) fn resolve(
        &self,
        query: Option<String>,
        extensions: Option<&Value>,
    ) -> Result<Option<String>, PersistedQueryError> {
        let persisted = match extensions.and_then(|e| e.get("persistedQuery")) {
            None | Some(Value::Null) => None,
            Some(p) => Some(
                PersistedQuery::deserialize(p)
                    .map_err(|e| PersistedQueryError::Malformed(e.to_string()))?,
            ),
        };
        match &self.mode {
            Mode::Off => match (query, persisted) {
                (None, Some(_)) => Err(PersistedQueryError::NotSupported),
                (query, _) => Ok(query),
            },
            Mode::Apq(store) => {
                let Some(persisted) = persisted else {
                    return Ok(query);
                };
                if persisted.version != 1 {
                    return Err(PersistedQueryError::Version);
                }
                let hash = persisted.sha256_hash.to_ascii_lowercase();
                match query {
                    None => store
                        .get(&hash)
                        .map(|q| Some(q.to_string()))
                        .ok_or(PersistedQueryError::NotFound),
                    Some(query) => {
                        if sha256_hex(&query) != hash {
                            return Err(PersistedQueryError::HashMismatch);
                        }
                        if query.len() <= LONGEST_STORED {
                            store.insert(hash, Arc::from(query.as_str()));
                        }
                        Ok(Some(query))
                    }
                }
            }
            Mode::Allowlist { by_id, bodies } => match (persisted, query) {
                (Some(persisted), query) => {
                    if persisted.version != 1 {
                        return Err(PersistedQueryError::Version);
                    }
                    let id = persisted.sha256_hash;
                    let Some(body) = by_id.get(&id) else {
                        return Err(PersistedQueryError::NotInList(id));
                    };
                    match query {
                        Some(q) if *q != **body => Err(PersistedQueryError::HashMismatch),
                        _ => Ok(Some(body.to_string())),
                    }
                }
                (None, Some(query)) if bodies.contains(query.as_str()) => Ok(Some(query)),
                (None, Some(_)) => Err(PersistedQueryError::QueryNotInList),
                (None, None) => Ok(None),
            },
        }
    }

    /// Queries the APQ store holds now.
    #[cfg(test)]
    fn stored(&self) -> u64 {
        match &self.mode {
            Mode::Apq(store) => {
                store.run_pending_tasks();
                store.entry_count()
            }
            _ => 0,
        }
    }
}

/// The SHA-256 of `text`, in lowercase hex.
pub(crate) fn sha256_hex(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    let mut hex = String::with_capacity(64);
    for byte in digest {
        let _ = write!(hex, "{byte:02x}");
    }
    hex
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshql_config::resolve::PersistedOperation;
    use serde_json::json;

    const QUERY: &str = "{ getAll { id } }";

    fn ext(hash: &str) -> Value {
        json!({"persistedQuery": {"version": 1, "sha256Hash": hash}})
    }

    #[test]
    fn the_hash_is_lowercase_hex_sha256() {
        // sha256("abc"), from FIPS 180-2
        assert_eq!(
            sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn apq_not_found_then_registered_then_found() {
        let pq = PersistedQueries::new(&PersistedQueriesSpec::Apq { max_entries: 10 });
        let hash = sha256_hex(QUERY);
        assert_eq!(
            pq.resolve(None, Some(&ext(&hash))),
            Err(PersistedQueryError::NotFound)
        );
        assert_eq!(
            pq.resolve(Some(QUERY.into()), Some(&ext(&hash))),
            Ok(Some(QUERY.into()))
        );
        // by hash alone now, in either case
        assert_eq!(pq.resolve(None, Some(&ext(&hash))), Ok(Some(QUERY.into())));
        let upper = hash.to_ascii_uppercase();
        assert_eq!(pq.resolve(None, Some(&ext(&upper))), Ok(Some(QUERY.into())));
        // a query with another's hash
        assert_eq!(
            pq.resolve(Some("{ other }".into()), Some(&ext(&hash))),
            Err(PersistedQueryError::HashMismatch)
        );
        // plain requests are untouched; other extensions are ignored
        assert_eq!(pq.resolve(Some(QUERY.into()), None), Ok(Some(QUERY.into())));
        assert_eq!(
            pq.resolve(Some(QUERY.into()), Some(&json!({"since": 3}))),
            Ok(Some(QUERY.into()))
        );
        assert_eq!(pq.resolve(None, None), Ok(None));
        // bad extensions
        let v2 = json!({"persistedQuery": {"version": 2, "sha256Hash": hash}});
        assert_eq!(
            pq.resolve(None, Some(&v2)),
            Err(PersistedQueryError::Version)
        );
        let bad = json!({"persistedQuery": {"version": 1}});
        assert!(matches!(
            pq.resolve(None, Some(&bad)),
            Err(PersistedQueryError::Malformed(_))
        ));
    }

    #[test]
    fn the_apq_store_is_bounded() {
        let pq = PersistedQueries::new(&PersistedQueriesSpec::Apq { max_entries: 50 });
        for n in 0..2_000 {
            let q = format!("{{ getById(id: \"{n}\") {{ id }} }}");
            pq.resolve(Some(q.clone()), Some(&ext(&sha256_hex(&q))))
                .unwrap();
        }
        let stored = pq.stored();
        assert!(stored <= 50 && stored > 0, "{stored}");
        // a query too long to keep still runs
        let long = format!("{{ getAll {{ id }} }}{}", " ".repeat(LONGEST_STORED));
        let hash = sha256_hex(&long);
        assert_eq!(
            pq.resolve(Some(long.clone()), Some(&ext(&hash))),
            Ok(Some(long))
        );
        assert_eq!(
            pq.resolve(None, Some(&ext(&hash))),
            Err(PersistedQueryError::NotFound)
        );
    }

    #[test]
    fn off_refuses_hashes_alone() {
        let pq = PersistedQueries::new(&PersistedQueriesSpec::Off);
        let hash = sha256_hex(QUERY);
        assert_eq!(
            pq.resolve(None, Some(&ext(&hash))),
            Err(PersistedQueryError::NotSupported)
        );
        assert_eq!(
            pq.resolve(Some(QUERY.into()), Some(&ext("whatever"))),
            Ok(Some(QUERY.into()))
        );
    }

    #[test]
    fn an_allowlist_runs_its_operations_only() {
        let pq = PersistedQueries::new(&PersistedQueriesSpec::Allowlist {
            manifest: "pq.json".into(),
            operations: vec![PersistedOperation {
                id: "op-1".into(),
                name: Some("All".into()),
                kind: Some("query".into()),
                body: QUERY.into(),
            }],
        });
        assert_eq!(pq.resolve(None, Some(&ext("op-1"))), Ok(Some(QUERY.into())));
        assert_eq!(pq.resolve(Some(QUERY.into()), None), Ok(Some(QUERY.into())));
        assert_eq!(
            pq.resolve(Some(QUERY.into()), Some(&ext("op-1"))),
            Ok(Some(QUERY.into()))
        );
        assert_eq!(
            pq.resolve(None, Some(&ext("op-2"))),
            Err(PersistedQueryError::NotInList("op-2".into()))
        );
        assert_eq!(
            pq.resolve(Some("{ getAll { id name } }".into()), None),
            Err(PersistedQueryError::QueryNotInList)
        );
        assert_eq!(
            pq.resolve(Some("{ other }".into()), Some(&ext("op-1"))),
            Err(PersistedQueryError::HashMismatch)
        );
        // a registration attempt is no way in
        let q = "{ getAll { name } }";
        assert_eq!(
            pq.resolve(Some(q.into()), Some(&ext(&sha256_hex(q)))),
            Err(PersistedQueryError::NotInList(sha256_hex(q)))
        );
    }
}
