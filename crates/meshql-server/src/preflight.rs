//! Checks that need more than the config crate knows (compiled JSON Schemas, what each
//! backend supports). `meshql check` runs them too, so it accepts exactly what `serve` does.

use axum::http::HeaderValue;
use meshql_config::{ResolvedConfig, StorageSpec};
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
        let memory = matches!(
            config.storages.get(&entity.storage),
            Some(StorageSpec::Memory)
        );
        if let (true, Some(g)) = (memory, &entity.graph) {
            for q in &g.queries {
                if matches!(q.template.kind, TemplateKind::Sql(_)) {
                    problems.push(format!(
                        "{}: entity \"{}\" query `{}`: SQL fragments need a SQL storage; storage `{}` is memory (use a JSON `query`)",
                        config.file.display(),
                        entity.name,
                        q.name,
                        entity.storage
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
}
