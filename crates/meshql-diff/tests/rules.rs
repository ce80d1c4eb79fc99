//! The breaking-change table: one row per rule, an old and a new fragment, the one change
//! expected (level and path). docs/SCHEMA-EVOLUTION.md lists the same rules for people.

use meshql_diff::{diff_json_schema, diff_sdl, Change, Level};
use serde_json::{json, Value};

struct JsonRow {
    rule: &'static str,
    old: Value,
    new: Value,
    level: Level,
    path: &'static str,
}

fn json_row(
    rule: &'static str,
    old: Value,
    new: Value,
    level: Level,
    path: &'static str,
) -> JsonRow {
    JsonRow {
        rule,
        old,
        new,
        level,
        path,
    }
}

fn json_rows() -> Vec<JsonRow> {
    use Level::{Breaking, Dangerous, Safe};
    let string = json!({"type": "string"});
    vec![
        // ---- breaking
        json_row(
            "property made required",
            json!({"properties": {"name": string}}),
            json!({"properties": {"name": string}, "required": ["name"]}),
            Breaking,
            "/properties/name",
        ),
        json_row(
            "new required property",
            json!({"properties": {"name": string}}),
            json!({"properties": {"name": string, "age": {"type": "integer"}}, "required": ["age"]}),
            Breaking,
            "/properties/age",
        ),
        json_row(
            "type narrowed: null no longer accepted",
            json!({"type": ["string", "null"]}),
            json!({"type": "string"}),
            Breaking,
            "/type",
        ),
        json_row(
            "type narrowed: number to integer",
            json!({"type": "number"}),
            json!({"type": "integer"}),
            Breaking,
            "/type",
        ),
        json_row(
            "type narrowed: any to string",
            json!({}),
            json!({"type": "string"}),
            Breaking,
            "/type",
        ),
        json_row(
            "type changed: string to integer",
            json!({"type": "string"}),
            json!({"type": "integer"}),
            Breaking,
            "/type",
        ),
        json_row(
            "enum value removed",
            json!({"enum": ["a", "b"]}),
            json!({"enum": ["a"]}),
            Breaking,
            "/enum",
        ),
        json_row(
            "enum added where any value was accepted",
            json!({"type": "string"}),
            json!({"type": "string", "enum": ["a"]}),
            Breaking,
            "/enum",
        ),
        json_row(
            "additionalProperties turned false (was absent)",
            json!({"properties": {"name": string}}),
            json!({"properties": {"name": string}, "additionalProperties": false}),
            Breaking,
            "/additionalProperties",
        ),
        json_row(
            "additionalProperties turned false (was true)",
            json!({"additionalProperties": true}),
            json!({"additionalProperties": false}),
            Breaking,
            "/additionalProperties",
        ),
        json_row(
            "additionalProperties constrained (was absent)",
            json!({}),
            json!({"additionalProperties": {"type": "string"}}),
            Breaking,
            "/additionalProperties/type",
        ),
        json_row(
            "minimum raised",
            json!({"properties": {"eggs": {"type": "integer", "minimum": 0}}}),
            json!({"properties": {"eggs": {"type": "integer", "minimum": 1}}}),
            Breaking,
            "/properties/eggs/minimum",
        ),
        json_row(
            "minimum added",
            json!({"type": "integer"}),
            json!({"type": "integer", "minimum": 0}),
            Breaking,
            "/minimum",
        ),
        json_row(
            "maximum lowered",
            json!({"maximum": 10}),
            json!({"maximum": 9}),
            Breaking,
            "/maximum",
        ),
        json_row(
            "maxLength lowered",
            json!({"type": "string", "maxLength": 10}),
            json!({"type": "string", "maxLength": 2}),
            Breaking,
            "/maxLength",
        ),
        json_row(
            "minItems raised",
            json!({"type": "array", "minItems": 0}),
            json!({"type": "array", "minItems": 1}),
            Breaking,
            "/minItems",
        ),
        json_row(
            "pattern added",
            json!({"type": "string"}),
            json!({"type": "string", "pattern": "^[0-9]{5}$"}),
            Breaking,
            "/pattern",
        ),
        json_row(
            "pattern changed (not proven wider)",
            json!({"type": "string", "pattern": "^[0-9]+$"}),
            json!({"type": "string", "pattern": "^[0-9]{5}$"}),
            Breaking,
            "/pattern",
        ),
        json_row(
            "format added",
            json!({"type": "string"}),
            json!({"type": "string", "format": "uuid"}),
            Breaking,
            "/format",
        ),
        json_row(
            "format changed",
            json!({"type": "string", "format": "date-time"}),
            json!({"type": "string", "format": "date"}),
            Breaking,
            "/format",
        ),
        json_row(
            "multipleOf changed to a non-divisor",
            json!({"multipleOf": 2}),
            json!({"multipleOf": 3}),
            Breaking,
            "/multipleOf",
        ),
        json_row(
            "uniqueItems turned true",
            json!({"type": "array"}),
            json!({"type": "array", "uniqueItems": true}),
            Breaking,
            "/uniqueItems",
        ),
        json_row(
            "property removed while additionalProperties is false",
            json!({"properties": {"name": string, "nick": string}, "additionalProperties": false}),
            json!({"properties": {"name": string}, "additionalProperties": false}),
            Breaking,
            "/properties/nick",
        ),
        json_row(
            "const added",
            json!({"type": "string"}),
            json!({"type": "string", "const": "v1"}),
            Breaking,
            "/const",
        ),
        json_row(
            "const changed",
            json!({"const": "v1"}),
            json!({"const": "v2"}),
            Breaking,
            "/const",
        ),
        json_row(
            "schema turned false",
            json!({"properties": {"legacy": {}}}),
            json!({"properties": {"legacy": false}}),
            Breaking,
            "/properties/legacy",
        ),
        json_row(
            "nested object: a type narrowed",
            json!({"properties": {"address": {"type": "object", "properties": {"zip": {"type": ["string", "integer"]}}}}}),
            json!({"properties": {"address": {"type": "object", "properties": {"zip": {"type": "string"}}}}}),
            Breaking,
            "/properties/address/properties/zip/type",
        ),
        json_row(
            "array items: a bound tightened",
            json!({"properties": {"tags": {"type": "array", "items": {"type": "string"}}}}),
            json!({"properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 8}}}}),
            Breaking,
            "/properties/tags/items/maxLength",
        ),
        json_row(
            "$ref: a required property added inside a $defs definition",
            json!({"properties": {"home": {"$ref": "#/$defs/address"}},
                   "$defs": {"address": {"properties": {"zip": string}}}}),
            json!({"properties": {"home": {"$ref": "#/$defs/address"}},
                   "$defs": {"address": {"properties": {"zip": string}, "required": ["zip"]}}}),
            Breaking,
            "/properties/home/properties/zip",
        ),
        json_row(
            "recursive $ref: a type narrowed, and the comparison ends",
            json!({"$defs": {"node": {"properties": {"label": {"type": ["string", "null"]},
                                                    "children": {"items": {"$ref": "#/$defs/node"}}}}},
                   "$ref": "#/$defs/node"}),
            json!({"$defs": {"node": {"properties": {"label": {"type": "string"},
                                                    "children": {"items": {"$ref": "#/$defs/node"}}}}},
                   "$ref": "#/$defs/node"}),
            Breaking,
            "/properties/label/type",
        ),
        json_row(
            "tuple position narrowed (draft-07 items list)",
            json!({"items": [{"type": "number"}, string]}),
            json!({"items": [{"type": "integer"}, string]}),
            Breaking,
            "/items/0/type",
        ),
        json_row(
            "allOf member added",
            json!({"allOf": [{"required": ["a"]}]}),
            json!({"allOf": [{"required": ["a"]}, {"required": ["b"]}]}),
            Breaking,
            "/allOf/1",
        ),
        json_row(
            "anyOf added",
            json!({}),
            json!({"anyOf": [string, {"type": "null"}]}),
            Breaking,
            "/anyOf",
        ),
        // ---- dangerous
        json_row(
            "enum value added",
            json!({"enum": ["a"]}),
            json!({"enum": ["a", "b"]}),
            Dangerous,
            "/enum",
        ),
        json_row(
            "enum removed (any value accepted)",
            json!({"type": "string", "enum": ["a"]}),
            json!({"type": "string"}),
            Dangerous,
            "/enum",
        ),
        json_row(
            "property removed (additional properties allowed)",
            json!({"properties": {"name": string, "nick": string}}),
            json!({"properties": {"name": string}}),
            Dangerous,
            "/properties/nick",
        ),
        json_row(
            "default changed",
            json!({"properties": {"eggs": {"type": "integer", "default": 0}}}),
            json!({"properties": {"eggs": {"type": "integer", "default": 1}}}),
            Dangerous,
            "/properties/eggs/default",
        ),
        json_row(
            "default added",
            json!({"type": "integer"}),
            json!({"type": "integer", "default": 0}),
            Dangerous,
            "/default",
        ),
        json_row(
            "anyOf alternative narrowed (another may still accept)",
            json!({"anyOf": [{"type": "number"}, {"type": "null"}]}),
            json!({"anyOf": [{"type": "integer"}, {"type": "null"}]}),
            Dangerous,
            "/anyOf/0/type",
        ),
        json_row(
            "anyOf alternatives replaced",
            json!({"anyOf": [{"type": "number"}, {"type": "null"}]}),
            json!({"anyOf": [string]}),
            Dangerous,
            "/anyOf",
        ),
        json_row(
            "oneOf alternative added",
            json!({"oneOf": [string]}),
            json!({"oneOf": [string, {"type": "integer"}]}),
            Dangerous,
            "/oneOf/1",
        ),
        json_row(
            "not changed",
            json!({"not": {"type": "null"}}),
            json!({"not": {"type": ["null", "string"]}}),
            Dangerous,
            "/not",
        ),
        json_row(
            "external $ref changed (cannot follow)",
            json!({"$ref": "https://example.com/a.json"}),
            json!({"$ref": "https://example.com/b.json"}),
            Dangerous,
            "/$ref",
        ),
        json_row(
            "unknown keyword changed",
            json!({"nullable": false}),
            json!({"nullable": true}),
            Dangerous,
            "/nullable",
        ),
        json_row(
            "$schema changed",
            json!({"$schema": "http://json-schema.org/draft-07/schema#"}),
            json!({"$schema": "https://json-schema.org/draft/2020-12/schema"}),
            Dangerous,
            "/$schema",
        ),
        // ---- safe
        json_row(
            "optional property added",
            json!({"properties": {"name": string}, "additionalProperties": false}),
            json!({"properties": {"name": string, "nick": string}, "additionalProperties": false}),
            Safe,
            "/properties/nick",
        ),
        json_row(
            "requirement dropped",
            json!({"properties": {"name": string}, "required": ["name"]}),
            json!({"properties": {"name": string}}),
            Safe,
            "/properties/name",
        ),
        json_row(
            "type widened: integer to number",
            json!({"type": "integer"}),
            json!({"type": "number"}),
            Safe,
            "/type",
        ),
        json_row(
            "type widened: null accepted",
            json!({"type": "string"}),
            json!({"type": ["string", "null"]}),
            Safe,
            "/type",
        ),
        json_row(
            "type widened: to any",
            json!({"type": "string"}),
            json!({}),
            Safe,
            "/type",
        ),
        json_row(
            "maxLength raised",
            json!({"maxLength": 2}),
            json!({"maxLength": 10}),
            Safe,
            "/maxLength",
        ),
        json_row(
            "minimum removed",
            json!({"minimum": 0}),
            json!({}),
            Safe,
            "/minimum",
        ),
        json_row(
            "pattern removed",
            json!({"pattern": "^a"}),
            json!({}),
            Safe,
            "/pattern",
        ),
        json_row(
            "multipleOf changed to a divisor",
            json!({"multipleOf": 4}),
            json!({"multipleOf": 2}),
            Safe,
            "/multipleOf",
        ),
        json_row(
            "additionalProperties no longer false",
            json!({"additionalProperties": false}),
            json!({}),
            Safe,
            "/additionalProperties",
        ),
        json_row(
            "enum value added to nothing: anyOf alternative added",
            json!({"anyOf": [string]}),
            json!({"anyOf": [string, {"type": "null"}]}),
            Safe,
            "/anyOf/1",
        ),
        json_row(
            "description changed",
            json!({"properties": {"name": {"type": "string", "description": "a"}}}),
            json!({"properties": {"name": {"type": "string", "description": "b"}}}),
            Safe,
            "/properties/name/description",
        ),
        json_row(
            "title added",
            json!({}),
            json!({"title": "Hen"}),
            Safe,
            "/title",
        ),
    ]
}

fn show(changes: &[Change]) -> String {
    changes
        .iter()
        .map(|c| format!("\n    {c}"))
        .collect::<String>()
}

#[test]
fn json_schema_rules() {
    let mut failures = Vec::new();
    for row in json_rows() {
        let changes = diff_json_schema(&row.old, &row.new);
        let ok = changes.len() == 1 && changes[0].level == row.level && changes[0].path == row.path;
        if !ok {
            failures.push(format!(
                "{}: expected one {} change at {}, got{}",
                row.rule,
                row.level,
                row.path,
                show(&changes)
            ));
        }
        // a schema compared with itself has no change
        assert!(
            diff_json_schema(&row.old, &row.old).is_empty(),
            "{}",
            row.rule
        );
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn json_schema_refactors_that_change_nothing() {
    let inline = json!({"properties": {"home": {"properties": {"zip": {"type": "string"}}}}});
    let by_ref = json!({"properties": {"home": {"$ref": "#/$defs/address"}},
                        "$defs": {"address": {"properties": {"zip": {"type": "string"}}}}});
    let by_definitions = json!({"properties": {"home": {"$ref": "#/definitions/a"}},
                                "definitions": {"a": {"properties": {"zip": {"type": "string"}}}}});
    assert_eq!(diff_json_schema(&inline, &by_ref), vec![]);
    assert_eq!(diff_json_schema(&by_ref, &by_definitions), vec![]);
    // the same set of types, written differently
    assert_eq!(
        diff_json_schema(
            &json!({"type": "number"}),
            &json!({"type": ["integer", "number"]})
        ),
        vec![]
    );
    // keyword order and equal bounds
    assert_eq!(
        diff_json_schema(
            &json!({"minimum": 1, "type": "integer"}),
            &json!({"type": "integer", "minimum": 1.0})
        ),
        vec![]
    );
}

#[test]
fn json_schema_recursion_ends() {
    // a definition renamed, recursive on both sides
    let old = json!({"$ref": "#/$defs/node",
                     "$defs": {"node": {"properties": {"children": {"items": {"$ref": "#/$defs/node"}}}}}});
    let new = json!({"$ref": "#/$defs/tree",
                     "$defs": {"tree": {"properties": {"children": {"items": {"$ref": "#/$defs/tree"}}}}}});
    assert_eq!(diff_json_schema(&old, &new), vec![]);
    // the whole document referring to itself
    let old = json!({"properties": {"next": {"$ref": "#"}, "n": {"type": "number"}}});
    let new = json!({"properties": {"next": {"$ref": "#"}, "n": {"type": "integer"}}});
    let paths: Vec<String> = diff_json_schema(&old, &new)
        .into_iter()
        .map(|c| c.path)
        .collect();
    assert_eq!(
        paths,
        vec!["/properties/next/properties/n/type", "/properties/n/type"]
    );
    // a reference to itself, with no content: not followed forever
    let looping = json!({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}});
    assert_eq!(diff_json_schema(&looping, &looping), vec![]);
}

#[test]
fn json_schema_path_tokens_are_escaped() {
    let changes = diff_json_schema(
        &json!({"properties": {"a/b~c": {"type": "number"}}}),
        &json!({"properties": {"a/b~c": {"type": "integer"}}}),
    );
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].path, "/properties/a~1b~0c/type");
}

struct SdlRow {
    rule: &'static str,
    old: &'static str,
    new: &'static str,
    level: Level,
    path: &'static str,
}

fn sdl_row(
    rule: &'static str,
    old: &'static str,
    new: &'static str,
    level: Level,
    path: &'static str,
) -> SdlRow {
    SdlRow {
        rule,
        old,
        new,
        level,
        path,
    }
}

const BASE: &str = "type Query { getById(id: ID, at: Float): Hen }\n\
                    type Hen { id: ID name: String! eggs: Int }";

fn sdl_rows() -> Vec<SdlRow> {
    use Level::{Breaking, Dangerous, Safe};
    vec![
        // ---- breaking
        sdl_row(
            "type removed",
            "type Query { getById(id: ID): Hen } type Hen { id: ID } type Coop { id: ID }",
            "type Query { getById(id: ID): Hen } type Hen { id: ID }",
            Breaking,
            "Coop",
        ),
        sdl_row(
            "type kind changed",
            "type Query { a: Node } type Node { id: ID }",
            "type Query { a: Node } interface Node { id: ID }",
            Breaking,
            "Node",
        ),
        sdl_row(
            "field removed",
            BASE,
            "type Query { getById(id: ID, at: Float): Hen }\ntype Hen { id: ID name: String! }",
            Breaking,
            "Hen.eggs",
        ),
        sdl_row(
            "root query field removed",
            "type Query { getById(id: ID): Hen getAll: [Hen] } type Hen { id: ID }",
            "type Query { getById(id: ID): Hen } type Hen { id: ID }",
            Breaking,
            "Query.getAll",
        ),
        sdl_row(
            "output field: non-null to nullable",
            BASE,
            "type Query { getById(id: ID, at: Float): Hen }\ntype Hen { id: ID name: String eggs: Int }",
            Breaking,
            "Hen.name",
        ),
        sdl_row(
            "output field: type changed",
            BASE,
            "type Query { getById(id: ID, at: Float): Hen }\ntype Hen { id: ID name: String! eggs: Float }",
            Breaking,
            "Hen.eggs",
        ),
        sdl_row(
            "output field: list to single",
            "type Query { all: [Hen] } type Hen { id: ID }",
            "type Query { all: Hen } type Hen { id: ID }",
            Breaking,
            "Query.all",
        ),
        sdl_row(
            "argument removed",
            BASE,
            "type Query { getById(id: ID): Hen }\ntype Hen { id: ID name: String! eggs: Int }",
            Breaking,
            "Query.getById.at",
        ),
        sdl_row(
            "required argument added",
            BASE,
            "type Query { getById(id: ID, at: Float, tenant: String!): Hen }\n\
             type Hen { id: ID name: String! eggs: Int }",
            Breaking,
            "Query.getById.tenant",
        ),
        sdl_row(
            "argument: nullable to non-null",
            BASE,
            "type Query { getById(id: ID!, at: Float): Hen }\ntype Hen { id: ID name: String! eggs: Int }",
            Breaking,
            "Query.getById.id",
        ),
        sdl_row(
            "argument: type changed",
            BASE,
            "type Query { getById(id: String, at: Float): Hen }\ntype Hen { id: ID name: String! eggs: Int }",
            Breaking,
            "Query.getById.id",
        ),
        sdl_row(
            "argument default removed from a non-null argument",
            "type Query { all(limit: Int! = 10): [ID] }",
            "type Query { all(limit: Int!): [ID] }",
            Breaking,
            "Query.all.limit",
        ),
        sdl_row(
            "enum value removed",
            "type Query { s: Status } enum Status { OPEN CLOSED }",
            "type Query { s: Status } enum Status { OPEN }",
            Breaking,
            "Status.CLOSED",
        ),
        sdl_row(
            "union member removed",
            "type Query { a: Animal } union Animal = Hen | Cow type Hen { id: ID } type Cow { id: ID }",
            "type Query { a: Animal } union Animal = Hen type Hen { id: ID } type Cow { id: ID }",
            Breaking,
            "Animal",
        ),
        sdl_row(
            "interface removed from a type",
            "type Query { h: Hen } interface Node { id: ID } type Hen implements Node { id: ID }",
            "type Query { h: Hen } interface Node { id: ID } type Hen { id: ID }",
            Breaking,
            "Hen",
        ),
        sdl_row(
            "input field removed",
            "type Query { f(w: Where): ID } input Where { a: ID b: ID }",
            "type Query { f(w: Where): ID } input Where { a: ID }",
            Breaking,
            "Where.b",
        ),
        sdl_row(
            "required input field added",
            "type Query { f(w: Where): ID } input Where { a: ID }",
            "type Query { f(w: Where): ID } input Where { a: ID b: ID! }",
            Breaking,
            "Where.b",
        ),
        sdl_row(
            "query root removed",
            "schema { query: Q } type Q { a: ID } type Other { a: ID }",
            "schema { query: Other } type Q { a: ID } type Other { a: ID }",
            Breaking,
            "schema",
        ),
        // ---- dangerous
        sdl_row(
            "enum value added",
            "type Query { s: Status } enum Status { OPEN }",
            "type Query { s: Status } enum Status { OPEN CLOSED }",
            Dangerous,
            "Status.CLOSED",
        ),
        sdl_row(
            "optional argument added",
            BASE,
            "type Query { getById(id: ID, at: Float, limit: Int): Hen }\n\
             type Hen { id: ID name: String! eggs: Int }",
            Dangerous,
            "Query.getById.limit",
        ),
        sdl_row(
            "argument default changed",
            "type Query { all(limit: Int = 10): [ID] }",
            "type Query { all(limit: Int = 20): [ID] }",
            Dangerous,
            "Query.all.limit",
        ),
        sdl_row(
            "input field default changed",
            "type Query { f(w: Where): ID } input Where { a: Int = 1 }",
            "type Query { f(w: Where): ID } input Where { a: Int = 2 }",
            Dangerous,
            "Where.a",
        ),
        sdl_row(
            "union member added",
            "type Query { a: Animal } union Animal = Hen type Hen { id: ID } type Cow { id: ID }",
            "type Query { a: Animal } union Animal = Hen | Cow type Hen { id: ID } type Cow { id: ID }",
            Dangerous,
            "Animal",
        ),
        sdl_row(
            "interface added to a type",
            "type Query { h: Hen } interface Node { id: ID } type Hen { id: ID }",
            "type Query { h: Hen } interface Node { id: ID } type Hen implements Node { id: ID }",
            Dangerous,
            "Hen",
        ),
        sdl_row(
            "deprecation removed",
            "type Query { a: ID @deprecated(reason: \"use b\") }",
            "type Query { a: ID }",
            Dangerous,
            "Query.a",
        ),
        // ---- safe
        sdl_row(
            "type added",
            BASE,
            "type Query { getById(id: ID, at: Float): Hen }\n\
             type Hen { id: ID name: String! eggs: Int } type Coop { id: ID }",
            Safe,
            "Coop",
        ),
        sdl_row(
            "field added",
            BASE,
            "type Query { getById(id: ID, at: Float): Hen }\n\
             type Hen { id: ID name: String! eggs: Int dob: String }",
            Safe,
            "Hen.dob",
        ),
        sdl_row(
            "root query field added",
            BASE,
            "type Query { getById(id: ID, at: Float): Hen getAll: [Hen] }\n\
             type Hen { id: ID name: String! eggs: Int }",
            Safe,
            "Query.getAll",
        ),
        sdl_row(
            "output field: nullable to non-null",
            BASE,
            "type Query { getById(id: ID, at: Float): Hen }\ntype Hen { id: ID name: String! eggs: Int! }",
            Safe,
            "Hen.eggs",
        ),
        sdl_row(
            "argument: non-null to nullable",
            "type Query { h(id: ID!): ID }",
            "type Query { h(id: ID): ID }",
            Safe,
            "Query.h.id",
        ),
        sdl_row(
            "optional input field added",
            "type Query { f(w: Where): ID } input Where { a: ID }",
            "type Query { f(w: Where): ID } input Where { a: ID b: ID }",
            Safe,
            "Where.b",
        ),
        sdl_row(
            "description changed",
            "type Query { \"the hen\" h: ID }",
            "type Query { \"one hen\" h: ID }",
            Safe,
            "Query.h",
        ),
        sdl_row(
            "deprecation added",
            "type Query { a: ID b: ID }",
            "type Query { a: ID @deprecated(reason: \"use b\") b: ID }",
            Safe,
            "Query.a",
        ),
        sdl_row(
            "enum value deprecated",
            "type Query { s: Status } enum Status { OPEN OLD }",
            "type Query { s: Status } enum Status { OPEN OLD @deprecated }",
            Safe,
            "Status.OLD",
        ),
    ]
}

#[test]
fn sdl_rules() {
    let mut failures = Vec::new();
    for row in sdl_rows() {
        let changes = diff_sdl(row.old, row.new).unwrap_or_else(|e| panic!("{}: {e}", row.rule));
        let ok = changes.len() == 1 && changes[0].level == row.level && changes[0].path == row.path;
        if !ok {
            failures.push(format!(
                "{}: expected one {} change at {}, got{}",
                row.rule,
                row.level,
                row.path,
                show(&changes)
            ));
        }
        assert!(
            diff_sdl(row.old, row.old).unwrap().is_empty(),
            "{}",
            row.rule
        );
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn sdl_root_field_removal_says_so() {
    let changes = diff_sdl(
        "type Query { getById(id: ID): ID getAll: [ID] }",
        "type Query { getById(id: ID): ID }",
    )
    .unwrap();
    assert!(
        changes[0].message.contains("root query field `getAll`"),
        "{changes:?}"
    );
}

#[test]
fn sdl_that_does_not_parse_is_an_error() {
    let err = diff_sdl("type Query { a: ID }", "type Query { a: }").unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("the new GraphQL SDL does not parse"),
        "{text}"
    );
}
