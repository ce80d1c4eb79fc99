//! Whole services: the real example schemas of the repository, entity-level rules and the
//! two renderings of a report.

use meshql_diff::{diff_json_schema, diff_sdl, diff_service, EntitySchemas, Level, Source};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// The entities of an example directory: `schema/NAME.schema.json` and `graph/NAME.graphql`.
fn load(example: &str) -> Vec<EntitySchemas> {
    let dir = examples().join(example);
    let mut entities: Vec<EntitySchemas> = Vec::new();
    let mut files: Vec<PathBuf> = ["schema", "graph"]
        .iter()
        .flat_map(|sub| std::fs::read_dir(dir.join(sub)).expect("example directory"))
        .map(|entry| entry.expect("directory entry").path())
        .collect();
    files.sort();
    for path in files {
        let file = path.file_name().unwrap().to_str().unwrap().to_owned();
        let text = std::fs::read_to_string(&path).unwrap();
        let (name, json) = if let Some(name) = file.strip_suffix(".schema.json") {
            (name.to_owned(), true)
        } else if let Some(name) = file.strip_suffix(".graphql") {
            (name.to_owned(), false)
        } else {
            continue;
        };
        let at = match entities.iter().position(|e| e.name == name) {
            Some(at) => at,
            None => {
                entities.push(EntitySchemas {
                    name,
                    ..Default::default()
                });
                entities.len() - 1
            }
        };
        if json {
            entities[at].json_schema = Some(serde_json::from_str(&text).unwrap());
        } else {
            entities[at].sdl = Some(text);
        }
    }
    entities
}

const EXAMPLES: [&str; 8] = [
    "egg-economy",
    "egg-economy-sap",
    "events",
    "farm",
    "farm-cqrs",
    "legacy",
    "logistics",
    "products",
];

#[test]
fn every_example_compared_with_itself_has_no_change() {
    for example in EXAMPLES {
        let entities = load(example);
        assert!(!entities.is_empty(), "{example}");
        for entity in &entities {
            if let Some(schema) = &entity.json_schema {
                assert_eq!(
                    diff_json_schema(schema, schema),
                    vec![],
                    "{example}/{}",
                    entity.name
                );
            }
            if let Some(sdl) = &entity.sdl {
                assert_eq!(
                    diff_sdl(sdl, sdl).unwrap(),
                    vec![],
                    "{example}/{}",
                    entity.name
                );
            }
        }
        let report = diff_service(&entities, &entities).unwrap();
        assert!(report.is_empty(), "{example}: {report}");
        assert_eq!(report.worst(), None);
        assert_eq!(
            report.to_text(),
            format!("no changes in {} entities\n", entities.len())
        );
    }
}

#[test]
fn farm_to_farm_cqrs_removes_a_root_query_and_the_lay_reports() {
    let report = diff_service(&load("farm"), &load("farm-cqrs")).unwrap();
    assert!(report.has_breaking());
    let hen: Vec<(Level, &str)> = report
        .changes()
        .filter(|(entity, c)| *entity == "hen" && c.source == Source::Sdl)
        .map(|(_, c)| (c.change.level, c.change.path.as_str()))
        .collect();
    assert_eq!(
        hen,
        vec![
            (Level::Breaking, "Query.getByName"),
            (Level::Breaking, "Hen.layReports"),
            (Level::Breaking, "LayReport"),
        ],
        "{report}"
    );
    // farm-cqrs has no lay_report entity
    let removed: Vec<&str> = report
        .changes()
        .filter(|(_, c)| c.source == Source::Entity)
        .map(|(entity, _)| entity)
        .collect();
    assert_eq!(removed, vec!["lay_report"], "{report}");
    // the JSON Schemas are the same
    assert!(
        report
            .changes()
            .all(|(_, c)| c.source != Source::JsonSchema),
        "{report}"
    );
}

#[test]
fn egg_economy_to_sap_only_adds() {
    let report = diff_service(&load("egg-economy"), &load("egg-economy-sap")).unwrap();
    assert!(!report.is_empty());
    assert_eq!(report.worst(), Some(Level::Safe), "{report}");
    let hen: Vec<(Source, &str)> = report
        .changes()
        .filter(|(entity, _)| *entity == "hen")
        .map(|(_, c)| (c.source, c.change.path.as_str()))
        .collect();
    assert_eq!(
        hen,
        vec![
            (Source::JsonSchema, "/properties/legacy_equnr"),
            (Source::Sdl, "Hen.legacy_equnr"),
        ],
        "{report}"
    );
}

fn entity(name: &str, schema: Option<Value>, sdl: Option<&str>) -> EntitySchemas {
    EntitySchemas {
        name: name.to_owned(),
        json_schema: schema,
        sdl: sdl.map(str::to_owned),
    }
}

#[test]
fn entity_rules() {
    let schema = json!({"type": "object", "properties": {"name": {"type": "string"}}});
    let sdl = "type Query { getById(id: ID): Hen } type Hen { id: ID name: String }";
    let old = vec![
        entity("hen", Some(schema.clone()), Some(sdl)),
        entity("coop", Some(schema.clone()), Some(sdl)),
        entity("farm", Some(schema.clone()), None),
    ];
    let new = vec![
        entity("hen", None, Some(sdl)),
        entity("farm", Some(schema.clone()), Some(sdl)),
        entity("barn", Some(schema), None),
    ];
    let report = diff_service(&old, &new).unwrap();
    let found: Vec<(&str, Level, &str)> = report
        .changes()
        .map(|(e, c)| (e, c.change.level, c.change.path.as_str()))
        .collect();
    assert_eq!(
        found,
        vec![
            ("hen", Level::Breaking, "json_schema"),
            ("coop", Level::Breaking, "coop"),
            ("farm", Level::Safe, "sdl"),
            ("barn", Level::Safe, "barn"),
        ]
    );
    assert_eq!(report.entities.len(), 4);
}

#[test]
fn the_text_report_puts_breaking_first_and_counts() {
    let old = vec![
        entity(
            "hen",
            Some(json!({"properties": {"name": {"type": "string"}, "status": {"enum": ["a"]}}})),
            Some("type Query { getById(id: ID): ID getAll: [ID] }"),
        ),
        entity("coop", None, None),
    ];
    let new = vec![entity(
        "hen",
        Some(
            json!({"properties": {"name": {"type": "string"}, "status": {"enum": ["a", "b"]},
                                   "nick": {"type": "string"}}, "required": ["name"]}),
        ),
        Some("type Query { getById(id: ID): ID }"),
    )];
    let report = diff_service(&old, &new).unwrap();
    let text = report.to_text();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        vec![
            "BREAKING  hen JSON Schema /properties/name: property `name` is now required: \
             documents without it are rejected",
            "BREAKING  hen SDL Query.getAll: root query field `getAll` removed: clients calling \
             it fail",
            "BREAKING  coop: entity `coop` removed: its REST and GraphQL endpoints are gone",
            "DANGEROUS hen JSON Schema /properties/status/enum: enum value \"b\" added: readers \
             that switch over the values may not know it",
            "SAFE      hen JSON Schema /properties/nick: optional property `nick` added",
            "3 breaking, 1 dangerous, 1 safe changes in 2 of 2 entities",
        ],
        "{text}"
    );
    assert_eq!(format!("{report}"), text);
}

#[test]
fn the_json_report_is_for_ci() {
    let old = vec![entity("hen", Some(json!({"type": "number"})), None)];
    let new = vec![entity("hen", Some(json!({"type": "integer"})), None)];
    let report = diff_service(&old, &new).unwrap();
    assert_eq!(
        report.to_json(),
        json!({
            "breaking": 1,
            "dangerous": 0,
            "safe": 0,
            "entities": [{
                "entity": "hen",
                "changes": [{
                    "source": "json_schema",
                    "level": "breaking",
                    "path": "/type",
                    "message": "type narrowed from number to integer: numbers with a fraction \
                                no longer accepted",
                }],
            }],
        })
    );
}

#[test]
fn an_sdl_that_does_not_parse_names_its_entity() {
    let old = vec![entity("hen", None, Some("type Query { a: ID }"))];
    let new = vec![entity("hen", None, Some("type Query { a: ID"))];
    let err = diff_service(&old, &new).unwrap_err().to_string();
    assert!(
        err.starts_with("entity `hen`: the new GraphQL SDL does not parse: line 1"),
        "{err}"
    );
}
