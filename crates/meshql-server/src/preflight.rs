//! Checks that need more than the config crate knows (compiled JSON Schemas, what each
//! backend supports). `meshql check` runs them too, so it accepts exactly what `serve` does.

use axum::http::HeaderValue;
use meshql_config::ResolvedConfig;
use meshql_core::template::TemplateKind;
use meshql_engine::PayloadValidator;

/// Every problem found, as messages naming the file and the field.
pub fn preflight(config: &ResolvedConfig) -> Vec<String> {
    let mut problems = Vec::new();
    if HeaderValue::from_str(&config.cors_origin).is_err() {
        problems.push(format!(
            "{}: cors_origin: `{}` is not a valid header value",
            config.file.display(),
            config.cors_origin
        ));
    }
    let targets = match crate::backends::configure(config) {
        Ok(targets) => targets,
        Err(errors) => {
            problems.extend(errors.iter().map(|e| e.to_string()));
            Default::default()
        }
    };
    for entity in &config.entities {
        if let Some(rest) = &entity.rest {
            if let Some(schema) = &rest.schema {
                if let Err(e) = PayloadValidator::new(schema) {
                    problems.push(format!(
                        "{}: entity \"{}\" rest.schema: {e}",
                        rest.schema_file
                            .as_ref()
                            .map(|p| p.display().to_string())
                            .unwrap_or_default(),
                        entity.name
                    ));
                }
            }
        }
        let json_only = targets
            .get(&entity.storage)
            .is_some_and(|t| !t.sql_templates());
        if let (true, Some(g)) = (json_only, &entity.graph) {
            for q in &g.queries {
                if matches!(q.template.kind, TemplateKind::Sql(_)) {
                    problems.push(format!(
                        "{}: entity \"{}\" query `{}`: SQL fragments need a SQL storage; storage `{}` is {} (use a JSON `query`)",
                        config.file.display(),
                        entity.name,
                        q.name,
                        entity.storage,
                        config.storages[&entity.storage].kind,
                    ));
                }
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_json_schemas_and_sql_on_memory_are_found() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("s.json"), r#"{"type": "objekt"}"#).unwrap();
        std::fs::write(
            dir.path().join("t.graphql"),
            "type Query { all: [T] } type T { id: ID }",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("meshql.toml"),
            "cors_origin = \"a\\u0001b\"\n[storage.m]\ntype = \"memory\"\n[[entity]]\nname = \"t\"\nstorage = \"m\"\n[entity.rest]\nschema = \"s.json\"\n[entity.graphql]\nschema = \"t.graphql\"\n[[entity.graphql.vectors]]\nname = \"all\"\nsql = \"1 = 1\"\n",
        )
        .unwrap();
        let config = meshql_config::load(dir.path()).expect("the config itself is valid");
        let problems = preflight(&config);
        assert_eq!(problems.len(), 3, "{problems:#?}");
        assert!(problems[0].contains("cors_origin"));
        assert!(problems[1].contains("s.json"));
        assert!(problems[2].contains("SQL fragments need a SQL storage"));
    }

    fn config_with_storage(block: &str) -> (tempfile::TempDir, ResolvedConfig) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("meshql.toml"),
            format!("[storage.x]\n{block}\n\n[[entity]]\nname = \"t\"\nstorage = \"x\"\n[entity.rest]\n"),
        )
        .unwrap();
        let config = meshql_config::load(dir.path()).expect("the config itself is valid");
        (dir, config)
    }

    #[test]
    fn an_unknown_storage_type_is_named_with_the_known_ones() {
        let (_dir, config) = config_with_storage("type = \"cassandra\"\nfile = \"a\"");
        let problems = preflight(&config);
        assert_eq!(problems.len(), 1, "{problems:#?}");
        let p = &problems[0];
        assert!(p.contains("meshql.toml:2: storage.x.type:"), "{p}");
        assert!(p.contains("`cassandra`"), "{p}");
        assert!(p.contains("sqlite, memory, postgres, mysql, mongo"), "{p}");
    }

    #[test]
    fn each_backend_checks_its_own_fields() {
        for (block, field, words) in [
            (
                "type = \"postgres\"\nurl = \"postgres://h/db\"\npool_size = 0",
                "storage.x.pool_size",
                "at least 1",
            ),
            (
                "type = \"mysql\"\nurl = \"mysql://u:p@h/db\"\npool_size = 0",
                "storage.x.pool_size",
                "at least 1",
            ),
            (
                "type = \"mongo\"\nuri = \"mongodb://h/\"\ndb = \"d\"\npool_size = 0",
                "storage.x.pool_size",
                "at least 1",
            ),
            (
                "type = \"postgres\"\nurl = \"postgres://h/db\"\npool_size = \"many\"",
                "storage.x.pool_size",
                "invalid type",
            ),
            (
                "type = \"sqlite\"\nfile = \"a.db\"\nfsync = true",
                "storage.x.fsync",
                "unknown field `fsync`",
            ),
            ("type = \"sqlite\"", "storage.x", "missing field `file`"),
            (
                "type = \"memory\"\nfile = \"a\"",
                "storage.x.file",
                "unknown field `file`",
            ),
        ] {
            let (_dir, config) = config_with_storage(block);
            let problems = preflight(&config);
            assert_eq!(problems.len(), 1, "{block}: {problems:#?}");
            let p = &problems[0];
            // the field's own line when it names one, else the block's
            let line = block
                .lines()
                .position(|l| field.ends_with(l.split(' ').next().unwrap()))
                .map_or(1, |i| i + 2);
            assert!(
                p.contains(&format!("meshql.toml:{line}: {field}: ")),
                "{block}: {p}"
            );
            assert!(p.contains(words), "{block}: {p}");
        }
    }

    #[test]
    fn relative_sqlite_files_resolve_under_the_data_dir() {
        let (dir, mut config) = config_with_storage("type = \"sqlite\"\nfile = \"sub/a.db\"");
        config.set_data_dir(dir.path().join("elsewhere"));
        let targets = crate::backends::configure(&config).unwrap();
        let target = targets["x"].target();
        assert!(target.ends_with("elsewhere/sub/a.db"), "{target}");
    }

    #[test]
    fn sql_templates_are_refused_on_mongo_too() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("t.graphql"),
            "type Query { all: [T] } type T { id: ID }",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("meshql.toml"),
            "[storage.m]\ntype = \"mongo\"\nuri = \"mongodb://h/\"\ndb = \"d\"\n[[entity]]\nname = \"t\"\nstorage = \"m\"\n[entity.graphql]\nschema = \"t.graphql\"\n[[entity.graphql.vectors]]\nname = \"all\"\nsql = \"1 = 1\"\n",
        )
        .unwrap();
        let config = meshql_config::load(dir.path()).unwrap();
        let problems = preflight(&config);
        assert_eq!(problems.len(), 1, "{problems:#?}");
        assert!(
            problems[0].contains("storage `m` is mongo"),
            "{}",
            problems[0]
        );
    }
}
