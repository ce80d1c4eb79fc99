//! `[server.persisted_queries]`: the mode, the size of the APQ store, and for `allowlist`
//! the Apollo persisted-query manifest, read and checked here so that a server starts only
//! with a list it can serve.

use super::Resolver;
use crate::model::{PersistedQueriesConfig, PersistedQueryMode};
use serde::Deserialize;
use std::collections::HashMap;
use std::path::PathBuf;
use toml::Spanned;

/// The most queries the APQ store may be given.
const MAX_ENTRIES: u64 = 1_000_000;
/// The `format` of an Apollo persisted-query manifest.
pub const MANIFEST_FORMAT: &str = "apollo-persisted-query-manifest";

/// How the GraphQL endpoints treat persisted queries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PersistedQueriesSpec {
    /// A request must carry its query; a hash is refused (`PERSISTED_QUERY_NOT_SUPPORTED`).
    Off,
    /// Automatic Persisted Queries: up to `max_entries` queries remembered by hash.
    Apq { max_entries: u64 },
    /// Only these operations run.
    Allowlist {
        manifest: PathBuf,
        operations: Vec<PersistedOperation>,
    },
}

impl PersistedQueriesSpec {
    pub const DEFAULT_MAX_ENTRIES: u64 = 4096;
}

impl Default for PersistedQueriesSpec {
    fn default() -> Self {
        PersistedQueriesSpec::Apq {
            max_entries: Self::DEFAULT_MAX_ENTRIES,
        }
    }
}

/// One operation of a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PersistedOperation {
    /// What clients send as `extensions.persistedQuery.sha256Hash` (Apollo's tools make it
    /// the SHA-256 of `body`, in hex).
    pub id: String,
    #[serde(default)]
    pub name: Option<String>,
    /// `query`, `mutation` or `subscription`, as the manifest says.
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    /// The operation's text.
    pub body: String,
}

/// An Apollo persisted-query manifest, as written.
#[derive(Deserialize)]
struct Manifest {
    format: String,
    version: u64,
    operations: Vec<PersistedOperation>,
}

impl Resolver {
    /// `[server.persisted_queries]` (the default, APQ, when absent).
    pub(super) fn resolve_persisted_queries(
        &mut self,
        at: &Spanned<PersistedQueriesConfig>,
    ) -> PersistedQueriesSpec {
        let p = at.get_ref();
        let mode = p.mode.as_ref().map(|m| *m.get_ref()).unwrap_or_default();
        const FIELD: &str = "server.persisted_queries";
        if mode != PersistedQueryMode::Allowlist {
            if let Some(manifest) = &p.manifest {
                self.error(
                    Some(manifest),
                    format!("{FIELD}.manifest"),
                    "only with mode = \"allowlist\" (the manifest lists what may run)",
                );
            }
        }
        if mode != PersistedQueryMode::Apq {
            if let Some(n) = &p.max_entries {
                self.error(
                    Some(n),
                    format!("{FIELD}.max_entries"),
                    "only with mode = \"apq\" (the size of the store of hashed queries)",
                );
            }
        }
        match mode {
            PersistedQueryMode::Off => PersistedQueriesSpec::Off,
            PersistedQueryMode::Apq => {
                let mut max_entries = PersistedQueriesSpec::DEFAULT_MAX_ENTRIES;
                if let Some(n) = &p.max_entries {
                    let v = *n.get_ref();
                    if (1..=MAX_ENTRIES).contains(&v) {
                        max_entries = v;
                    } else {
                        self.error(
                            Some(n),
                            format!("{FIELD}.max_entries"),
                            format!("must be between 1 and {MAX_ENTRIES}"),
                        );
                    }
                }
                PersistedQueriesSpec::Apq { max_entries }
            }
            PersistedQueryMode::Allowlist => {
                let Some(manifest) = &p.manifest else {
                    self.error(
                        Some(at),
                        format!("{FIELD}.manifest"),
                        "required with mode = \"allowlist\": the Apollo persisted-query manifest (JSON) of the operations that may run",
                    );
                    return PersistedQueriesSpec::Off;
                };
                let path = self.path_of(manifest.get_ref());
                match read_manifest(&path) {
                    Ok(operations) => PersistedQueriesSpec::Allowlist {
                        manifest: path,
                        operations,
                    },
                    Err(message) => {
                        self.error(Some(manifest), format!("{FIELD}.manifest"), message);
                        PersistedQueriesSpec::Off
                    }
                }
            }
        }
    }
}

/// The operations of the manifest at `path`, checked: the format and version, ids and
/// bodies present, no id given to two different bodies.
fn read_manifest(path: &std::path::Path) -> Result<Vec<PersistedOperation>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let manifest: Manifest = serde_json::from_str(&text).map_err(|e| {
        format!(
            "{}:{}:{}: not an Apollo persisted-query manifest: {e}",
            path.display(),
            e.line(),
            e.column()
        )
    })?;
    if manifest.format != MANIFEST_FORMAT {
        return Err(format!(
            "{}: `format` is `{}`, expected `{MANIFEST_FORMAT}`",
            path.display(),
            manifest.format
        ));
    }
    if manifest.version != 1 {
        return Err(format!(
            "{}: `version` {} is not supported (1 is)",
            path.display(),
            manifest.version
        ));
    }
    if manifest.operations.is_empty() {
        return Err(format!(
            "{}: lists no operations, so every query would be refused",
            path.display()
        ));
    }
    let mut seen: HashMap<&str, &str> = HashMap::new();
    for (i, op) in manifest.operations.iter().enumerate() {
        if op.id.trim().is_empty() || op.body.trim().is_empty() {
            return Err(format!(
                "{}: operations[{i}] needs a non-empty `id` and `body`",
                path.display()
            ));
        }
        if let Some(other) = seen.insert(&op.id, &op.body) {
            if other != op.body {
                return Err(format!(
                    "{}: operations[{i}]: id `{}` is given to two different bodies",
                    path.display(),
                    op.id
                ));
            }
        }
    }
    Ok(manifest.operations)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resolve::load_with_env;
    use crate::{ConfigErrors, ResolvedConfig};

    fn load(server: &str, files: &[(&str, &str)]) -> Result<ResolvedConfig, ConfigErrors> {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        let f = dir.path().join("meshql.toml");
        std::fs::write(
            &f,
            format!("port = 1\n{server}\n[[entity]]\nname = \"thing\"\n[entity.rest]\n"),
        )
        .unwrap();
        load_with_env(&f, |_| None)
    }

    const MANIFEST: &str = r#"{"format": "apollo-persisted-query-manifest", "version": 1,
 "operations": [{"id": "abc", "name": "Things", "type": "query", "body": "query Things { getAll { id } }"}]}"#;

    #[test]
    fn apq_is_the_default() {
        let c = load("", &[]).expect("valid");
        assert_eq!(
            c.server.persisted_queries,
            PersistedQueriesSpec::Apq { max_entries: 4096 }
        );
        let c = load("[server.persisted_queries]\nmax_entries = 10\n", &[]).expect("valid");
        assert_eq!(
            c.server.persisted_queries,
            PersistedQueriesSpec::Apq { max_entries: 10 }
        );
        let c = load("[server.persisted_queries]\nmode = \"off\"\n", &[]).expect("valid");
        assert_eq!(c.server.persisted_queries, PersistedQueriesSpec::Off);
    }

    #[test]
    fn an_allowlist_reads_its_manifest() {
        let c = load(
            "[server.persisted_queries]\nmode = \"allowlist\"\nmanifest = \"pq.json\"\n",
            &[("pq.json", MANIFEST)],
        )
        .expect("valid");
        let PersistedQueriesSpec::Allowlist {
            manifest,
            operations,
        } = c.server.persisted_queries
        else {
            panic!("an allowlist")
        };
        assert!(manifest.ends_with("pq.json"));
        assert_eq!(operations.len(), 1);
        assert_eq!(operations[0].id, "abc");
        assert_eq!(operations[0].name.as_deref(), Some("Things"));
        assert_eq!(operations[0].kind.as_deref(), Some("query"));
    }

    #[test]
    fn errors_name_the_line_and_field() {
        let allowlist = "mode = \"allowlist\"\nmanifest = \"pq.json\"";
        for (table, files, field, line, message) in [
            (
                "mode = \"allowlist\"",
                vec![],
                "server.persisted_queries.manifest",
                2,
                "required",
            ),
            (
                "manifest = \"pq.json\"",
                vec![("pq.json", MANIFEST)],
                "server.persisted_queries.manifest",
                3,
                "only with mode = \"allowlist\"",
            ),
            (
                "mode = \"off\"\nmax_entries = 3",
                vec![],
                "server.persisted_queries.max_entries",
                4,
                "only with mode = \"apq\"",
            ),
            (
                "max_entries = 0",
                vec![],
                "server.persisted_queries.max_entries",
                3,
                "between 1 and",
            ),
            (
                "mode = \"sometimes\"",
                vec![],
                "server.persisted_queries.mode",
                3,
                "unknown variant",
            ),
            (
                allowlist,
                vec![],
                "server.persisted_queries.manifest",
                4,
                "cannot read",
            ),
            (
                allowlist,
                vec![("pq.json", "{\"format\": \"apollo-persisted-query-manifest\",\n\"version\": 1, \"operations\": [{\"id\": 1}]}")],
                "server.persisted_queries.manifest",
                4,
                "pq.json:2:",
            ),
            (
                allowlist,
                vec![("pq.json", r#"{"format": "other", "version": 1, "operations": []}"#)],
                "server.persisted_queries.manifest",
                4,
                "expected `apollo-persisted-query-manifest`",
            ),
            (
                allowlist,
                vec![("pq.json", r#"{"format": "apollo-persisted-query-manifest", "version": 2, "operations": []}"#)],
                "server.persisted_queries.manifest",
                4,
                "`version` 2",
            ),
            (
                allowlist,
                vec![("pq.json", r#"{"format": "apollo-persisted-query-manifest", "version": 1, "operations": []}"#)],
                "server.persisted_queries.manifest",
                4,
                "no operations",
            ),
            (
                allowlist,
                vec![("pq.json", r#"{"format": "apollo-persisted-query-manifest", "version": 1, "operations": [{"id": "a", "body": "{ a }"}, {"id": "a", "body": "{ b }"}]}"#)],
                "server.persisted_queries.manifest",
                4,
                "two different bodies",
            ),
        ] {
            let errors = load(&format!("[server.persisted_queries]\n{table}\n"), &files)
                .expect_err(table)
                .0;
            assert_eq!(errors.len(), 1, "{table}: {errors:?}");
            let e = &errors[0];
            assert_eq!(e.field, field, "{table}: {e:?}");
            assert_eq!(e.line, Some(line), "{table}: {e:?}");
            assert!(e.message.contains(message), "{table}: {}", e.message);
        }
    }
}
