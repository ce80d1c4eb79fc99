//! The OpenAPI 3 document of a restlette.

use crate::params;
use serde_json::{json, Value};

/// OpenAPI 3.0 schemas do not accept `$schema`/`$id`; everything else of draft-07 that
/// MeshQL's schemas use is valid there.
fn as_openapi_schema(schema: Option<&Value>) -> Value {
    let mut s = schema.cloned().unwrap_or_else(|| json!({"type": "object"}));
    if let Some(obj) = s.as_object_mut() {
        obj.remove("$schema");
        obj.remove("$id");
    }
    s
}

/// The document for a restlette at `path` whose bodies follow `schema`; `see_other`: creates
/// and updates answer 303 + `Location` (see the server's `write_response`).
pub fn openapi_document(
    path: &str,
    entity: &str,
    schema: Option<&Value>,
    see_other: bool,
) -> Value {
    let state = json!({"$ref": "#/components/schemas/State"});
    let error = json!({"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}});
    let one =
        json!({"description": "the document", "content": {"application/json": {"schema": state}}});
    let many = json!({"description": "documents", "content": {"application/json": {"schema": {"type": "array", "items": state}}}});
    let page = json!({"description": "documents", "content": {"application/json": {"schema": {"type": "array", "items": state}}},
        "headers": {"Link": {"description": "`<P?limit=N&after=ID>; rel=\"next\"` when another page follows a requested page", "schema": {"type": "string"}}}});
    let body = json!({"required": true, "content": {"application/json": {"schema": state}}});
    let id_param =
        json!([{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}]);
    let security = json!([{"BearerAuth": []}]);
    let at_param = json!({"name": "at", "in": "query", "required": false,
        "description": "read as of this moment: milliseconds since the Unix epoch (`1765117200000`) or an RFC 3339 date-time (`2025-12-07T14:20:00Z`); each document's latest version at or before it, as GraphQL's `at` (default: now)",
        "schema": {"type": "string"}});
    let redirect = json!({"description": "written; `Location` names the document (GET it for the stored version)",
        "headers": {"Location": {"schema": {"type": "string"}}}});
    let (created, updated) = if see_other {
        (
            json!({"303": redirect, "400": error, "413": error}),
            json!({"303": redirect, "400": error, "404": error}),
        )
    } else {
        (
            json!({"201": one, "400": error, "413": error}),
            json!({"200": one, "400": error, "404": error}),
        )
    };
    let mut paths = serde_json::Map::new();
    paths.insert(
        path.to_owned(),
        json!({
            "get": {"operationId": "list", "summary": format!("List current {entity} documents"),
                    "description": format!("Without parameters: every current document, in id order, streamed as it is read (one snapshot, as of the request). With `limit` and/or `after`: one page of them; when more follow, a `Link` header (rel=\"next\") gives the next page's URL. A page holds at most {} documents. With `at`: the documents as they were at that moment. Any other query parameter is a 400.", params::MAX_LIMIT),
                    "security": security,
                    "parameters": [
                        {"name": "limit", "in": "query", "required": false,
                         "description": format!("documents in the page (default {} when `after` is given)", params::PAGE_ROWS),
                         "schema": {"type": "integer", "minimum": 1, "maximum": params::MAX_LIMIT}},
                        {"name": "after", "in": "query", "required": false,
                         "description": "the page starts after this id (the last id of the previous page)",
                         "schema": {"type": "string", "minLength": 1, "maxLength": params::MAX_AFTER}},
                        at_param
                    ],
                    "responses": {"200": page, "400": error}},
            "post": {"operationId": "create", "summary": format!("Create a {entity} document"),
                     "security": security, "requestBody": body,
                     "responses": created}
        }),
    );
    paths.insert(
        format!("{path}/{{id}}"),
        json!({
            "parameters": id_param,
            "get": {"operationId": "read", "summary": format!("Read a {entity} document"),
                    "security": security, "parameters": [at_param],
                    "responses": {"200": one, "400": error, "404": error}},
            "put": {"operationId": "update", "summary": format!("Replace a {entity} document (a new version)"),
                    "security": security, "requestBody": body,
                    "responses": updated},
            "delete": {"operationId": "delete", "summary": format!("Delete a {entity} document"),
                       "security": security,
                       "responses": {"200": {"description": "deleted", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/OperationStatus"}}}}, "404": error}}
        }),
    );
    paths.insert(
        format!("{path}/bulk"),
        json!({
            "get": {"operationId": "bulk_read", "summary": format!("Read several {entity} documents"),
                    "security": security,
                    "parameters": [{"name": "ids", "in": "query", "required": true, "description": "comma-separated ids", "schema": {"type": "string"}}, at_param],
                    "responses": {"200": many, "400": error}},
            "post": {"operationId": "bulk_create", "summary": format!("Create several {entity} documents (all or nothing)"),
                     "security": security,
                     "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "array", "items": state}}}},
                     "responses": {"201": many, "400": error}}
        }),
    );
    json!({
        "openapi": "3.0.3",
        "info": {"title": format!("{path} API"), "version": "0.1.0", "description": format!("API for mutating {path}")},
        "servers": [{"url": "/"}], // see `for_host`
        "paths": paths,
        "components": {
            "securitySchemes": {"BearerAuth": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}},
            "schemas": {
                "State": as_openapi_schema(schema),
                "OperationStatus": {"type": "object", "properties": {"id": {"type": "string"}, "status": {"type": "string"}, "error": {"type": "string"}}},
                "Error": {"type": "object", "properties": {"error": {"type": "string"}, "details": {"type": "array", "items": {"type": "object"}}, "parameter": {"type": "string", "description": "the query parameter refused"}, "hint": {"type": "string"}}}
            }
        }
    })
}

/// The document's `servers` entry as serialised by [`openapi_document`].
const RELATIVE_SERVERS: &[u8] = br#""servers":[{"url":"/"}]"#;

/// The serialised document with an absolute server URL for the host the client asked
/// (`http(s)://<Host>`): generated clients (openapi-client-axios and the like) cannot
/// resolve the relative `/` the document is stored with. `None` for a host that is not a
/// plain `name[:port]`, which keeps the relative URL.
pub fn for_host(doc: &[u8], host: &str, https: bool) -> Option<Vec<u8>> {
    let plain = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-:[]_".contains(&b));
    if !plain {
        return None;
    }
    let at = doc
        .windows(RELATIVE_SERVERS.len())
        .position(|w| w == RELATIVE_SERVERS)?;
    let scheme = if https { "https" } else { "http" };
    let mut out = Vec::with_capacity(doc.len() + host.len() + 8);
    out.extend_from_slice(&doc[..at]);
    out.extend_from_slice(format!(r#""servers":[{{"url":"{scheme}://{host}"}}]"#).as_bytes());
    out.extend_from_slice(&doc[at + RELATIVE_SERVERS.len()..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn document_lists_every_operation_with_the_entity_path_first() {
        let doc = openapi_document(
            "/hen/api",
            "hen",
            Some(&json!({"$schema": "x", "type": "object"})),
            false,
        );
        let paths = doc["paths"].as_object().unwrap();
        assert_eq!(paths.keys().next().unwrap(), "/hen/api");
        let ops: Vec<&str> = paths
            .values()
            .flat_map(|p| p.as_object().unwrap().values())
            .filter_map(|op| op.get("operationId").and_then(Value::as_str))
            .collect();
        for op in [
            "list",
            "create",
            "read",
            "update",
            "delete",
            "bulk_read",
            "bulk_create",
        ] {
            assert!(ops.contains(&op), "{op}");
        }
        assert!(doc["components"]["schemas"]["State"]
            .get("$schema")
            .is_none());
        let list = &doc["paths"]["/hen/api"]["get"];
        let params: Vec<&str> = list["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert_eq!(params, crate::params::LIST);
        // the document names exactly the query parameters each route takes
        let query_params = |op: &Value| -> Vec<String> {
            op["parameters"]
                .as_array()
                .map(|ps| {
                    ps.iter()
                        .filter(|p| p["in"] == "query")
                        .map(|p| p["name"].as_str().unwrap().to_owned())
                        .collect()
                })
                .unwrap_or_default()
        };
        assert_eq!(
            query_params(&doc["paths"]["/hen/api/{id}"]["get"]),
            crate::params::ONE
        );
        assert_eq!(
            query_params(&doc["paths"]["/hen/api/bulk"]["get"]),
            crate::params::BULK_READ
        );
        for (path, method) in [
            ("/hen/api", "post"),
            ("/hen/api/{id}", "put"),
            ("/hen/api/{id}", "delete"),
            ("/hen/api/bulk", "post"),
        ] {
            assert!(query_params(&doc["paths"][path][method]).is_empty());
        }
        assert_eq!(list["parameters"][0]["schema"]["maximum"], 10_000);
        assert!(list["responses"]["200"]["headers"]["Link"].is_object());
        assert!(list["responses"]["400"].is_object());
    }

    #[test]
    fn see_other_mode_documents_303_with_location_for_creates_and_updates() {
        let doc = openapi_document("/farm/api", "farm", None, true);
        let create = &doc["paths"]["/farm/api"]["post"]["responses"];
        let update = &doc["paths"]["/farm/api/{id}"]["put"]["responses"];
        for responses in [create, update] {
            assert!(responses["303"]["headers"]["Location"].is_object());
            assert!(responses.get("201").is_none() && responses.get("200").is_none());
        }
        let plain = openapi_document("/farm/api", "farm", None, false);
        assert!(plain["paths"]["/farm/api"]["post"]["responses"]["201"].is_object());
        assert!(plain["paths"]["/farm/api/{id}"]["put"]["responses"]["200"].is_object());
    }

    fn doc() -> Vec<u8> {
        serde_json::to_vec(&openapi_document("/farm/api", "farm", None, false)).unwrap()
    }

    #[test]
    fn the_server_url_is_the_host_asked() {
        let out = for_host(&doc(), "farm.example:8080", true).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["servers"], json!([{"url": "https://farm.example:8080"}]));
        assert_eq!(
            v["paths"],
            serde_json::from_slice::<serde_json::Value>(&doc()).unwrap()["paths"]
        );
    }

    #[test]
    fn a_host_that_is_not_a_plain_name_keeps_the_relative_url() {
        for host in ["", "evil\"}],\"x\":[{\"url\":\"y", "a b", "a/b"] {
            assert!(for_host(&doc(), host, false).is_none(), "{host}");
        }
    }
}

/// `doc` as a read-role process serves it (`meshql serve --role read`): only the reading
/// operations, and no path left without one.
pub fn read_only(mut doc: Value) -> Value {
    if let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) {
        for item in paths.values_mut() {
            if let Some(ops) = item.as_object_mut() {
                ops.retain(|method, _| {
                    !matches!(method.as_str(), "post" | "put" | "delete" | "patch")
                });
            }
        }
        paths.retain(|_, item| {
            item.as_object()
                .is_some_and(|ops| ops.keys().any(|k| k == "get"))
        });
    }
    doc
}

#[cfg(test)]
mod read_only_tests {
    #[test]
    fn a_read_only_document_keeps_the_reads_only() {
        let doc = super::read_only(super::openapi_document("/hen/api", "hen", None, false));
        let paths = doc["paths"].as_object().unwrap();
        assert!(!paths.is_empty());
        for (path, item) in paths {
            let ops = item.as_object().unwrap();
            assert!(ops.contains_key("get"), "{path}");
            for write in ["post", "put", "delete", "patch"] {
                assert!(!ops.contains_key(write), "{path} keeps {write}");
            }
        }
        assert!(paths.contains_key("/hen/api/{id}"));
    }
}
