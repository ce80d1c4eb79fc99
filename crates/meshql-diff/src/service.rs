//! A whole service: its entities matched by name, each one's JSON Schema and SDL compared.

use crate::change::{Change, Level};
use crate::error::DiffError;
use crate::json_schema::diff_json_schema;
use crate::report::{EntityReport, Report, Source};
use crate::sdl::diff_sdl;
use serde_json::Value;

/// The schemas of one entity of a config, already loaded (`meshql diff` reads the config
/// files). `json_schema` is `None` for an entity without REST writes, `sdl` for one
/// without GraphQL.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EntitySchemas {
    pub name: String,
    pub json_schema: Option<Value>,
    pub sdl: Option<String>,
}

/// Compares two versions of a service, entity by entity (matched by name).
///
/// Fails only when an SDL does not parse; the error names the entity and the side.
pub fn diff_service(old: &[EntitySchemas], new: &[EntitySchemas]) -> Result<Report, DiffError> {
    let mut report = Report::default();
    for before in old {
        let mut entity = EntityReport::new(&before.name);
        match new.iter().find(|e| e.name == before.name) {
            None => entity.push(
                Source::Entity,
                [Change::breaking(
                    &before.name,
                    format!(
                        "entity `{}` removed: its REST and GraphQL endpoints are gone",
                        before.name
                    ),
                )],
            ),
            Some(after) => {
                compare(before, after, &mut entity).map_err(|source| DiffError::Entity {
                    entity: before.name.clone(),
                    source: Box::new(source),
                })?
            }
        }
        report.entities.push(entity);
    }
    for after in new.iter().filter(|n| !old.iter().any(|o| o.name == n.name)) {
        let mut entity = EntityReport::new(&after.name);
        entity.push(
            Source::Entity,
            [Change::safe(
                &after.name,
                format!("entity `{}` added", after.name),
            )],
        );
        report.entities.push(entity);
    }
    Ok(report)
}

fn compare(
    before: &EntitySchemas,
    after: &EntitySchemas,
    entity: &mut EntityReport,
) -> Result<(), DiffError> {
    match (&before.json_schema, &after.json_schema) {
        (Some(a), Some(b)) => entity.push(Source::JsonSchema, diff_json_schema(a, b)),
        (Some(_), None) => entity.push(
            Source::Entity,
            [Change::breaking(
                "json_schema",
                "JSON Schema removed: the entity no longer takes writes over REST",
            )],
        ),
        (None, Some(_)) => entity.push(
            Source::Entity,
            [Change::new(
                Level::Safe,
                "json_schema",
                "JSON Schema added: the entity now takes writes over REST",
            )],
        ),
        (None, None) => {}
    }
    match (&before.sdl, &after.sdl) {
        (Some(a), Some(b)) => entity.push(Source::Sdl, diff_sdl(a, b)?),
        (Some(_), None) => entity.push(
            Source::Entity,
            [Change::breaking(
                "sdl",
                "GraphQL SDL removed: the entity no longer answers GraphQL queries",
            )],
        ),
        (None, Some(_)) => entity.push(
            Source::Entity,
            [Change::safe(
                "sdl",
                "GraphQL SDL added: the entity now answers GraphQL queries",
            )],
        ),
        (None, None) => {}
    }
    Ok(())
}
