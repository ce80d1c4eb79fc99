use super::*;
use std::fs;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

fn no_env(_: &str) -> Option<String> {
    None
}

#[test]
fn egg_economy_example_loads() {
    let c = load_with_env(&examples().join("egg-economy"), no_env).expect("valid example");
    assert_eq!(c.port, 5088);
    assert_eq!(c.entities.len(), 13);
    let resolvers: usize = c
        .entities
        .iter()
        .filter_map(|e| e.graph.as_ref())
        .map(|g| g.resolvers.len())
        .sum();
    assert_eq!(resolvers, 19);
    let farm = c.entities.iter().find(|e| e.name == "farm").unwrap();
    let g = farm.graph.as_ref().unwrap();
    assert_eq!(g.entity_type, "Farm");
    let coops = g.resolvers.iter().find(|r| r.field == "coops").unwrap();
    assert!(coops.vector);
    assert_eq!(
        coops.target,
        ResolverTarget::InProcess {
            graph_path: "/coop/graph".into()
        }
    );
    assert_eq!(c.storages.len(), 3);
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
}

/// examples/farm reaches its graphlettes over HTTP at `PLATFORM_URL`, by default this service:
/// served on another port (`meshql serve --port`, or `PORT`), those URLs follow it, and
/// only those.
#[test]
fn farm_example_relationships_follow_the_port_it_is_served_on() {
    let urls = |c: &ResolvedConfig| -> Vec<String> {
        c.entities
            .iter()
            .filter_map(|e| e.graph.as_ref())
            .flat_map(|g| &g.resolvers)
            .map(|r| match &r.target {
                ResolverTarget::Http { url } => url.clone(),
                other => panic!("{other:?}"),
            })
            .collect()
    };
    let mut c = load_with_env(&examples().join("farm"), no_env).expect("valid example");
    let count = urls(&c).len();
    assert!(count >= 6);
    assert!(urls(&c)
        .iter()
        .all(|u| u.starts_with("http://localhost:3033/")));
    let moved = c.serve_on(6102);
    assert_eq!(moved.len(), count, "{moved:?}");
    assert!(
        urls(&c)
            .iter()
            .all(|u| u.starts_with("http://localhost:6102/")),
        "{:?}",
        urls(&c)
    );
    assert!(moved.iter().any(|m| m.relationship == "farm.coops"
        && m.from == "http://localhost:3033/coop/graph"
        && m.to == "http://localhost:6102/coop/graph"));
    assert_eq!(c.port, 6102);
    assert!(c.serve_on(6102).is_empty(), "already there");
    // PORT moves the config's port and its default URLs together
    let c = load_with_env(&examples().join("farm"), |k| {
        (k == "PORT").then(|| "7000".to_owned())
    })
    .unwrap();
    assert_eq!(c.port, 7000);
    assert!(urls(&c)
        .iter()
        .all(|u| u.starts_with("http://localhost:7000/")));
    // an explicit PLATFORM_URL elsewhere stays where it points
    let mut c = load_with_env(&examples().join("farm"), |k| {
        (k == "PLATFORM_URL").then(|| "http://hens.internal:9000".to_owned())
    })
    .unwrap();
    assert!(c.serve_on(6102).is_empty());
    assert!(urls(&c)
        .iter()
        .all(|u| u.starts_with("http://hens.internal:9000/")));
}

#[test]
fn farm_example_loads_with_env() {
    let c = load_with_env(&examples().join("farm"), |k| {
        (k == "PLATFORM_URL").then(|| "http://example:9".to_owned())
    })
    .expect("valid example");
    assert_eq!(c.port, 3033);
    let hen = c.entities.iter().find(|e| e.name == "hen").unwrap();
    let coop = hen
        .graph
        .as_ref()
        .unwrap()
        .resolvers
        .iter()
        .find(|r| r.field == "coop")
        .unwrap();
    assert_eq!(
        coop.target,
        ResolverTarget::Http {
            url: "http://example:9/coop/graph".into()
        }
    );
}

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join("thing.graphql"),
            "scalar Date\ntype Query {\n  getById(id: ID, at: Int): Thing\n  getAll(at: Float): [Thing]\n}\ntype Thing { id: ID name: String other: Thing others: [Thing] }\n",
        )
        .unwrap();
        fs::write(
            dir.path().join("thing.schema.json"),
            r#"{"type":"object","properties":{"name":{"type":"string"}}}"#,
        )
        .unwrap();
        Fixture { dir }
    }

    fn load(&self, toml: &str) -> Result<ResolvedConfig, ConfigErrors> {
        let f = self.dir.path().join("meshql.toml");
        fs::write(&f, toml).unwrap();
        load_with_env(&f, no_env)
    }
}

const GOOD: &str = r#"
[[entity]]
name = "thing"
[entity.rest]
schema = "thing.schema.json"
[entity.graphql]
schema = "thing.graphql"
[[entity.graphql.singletons]]
name = "getById"
query = '{"id": "{{id}}"}'
[[entity.graphql.vectors]]
name = "getAll"
query = '{}'
[[entity.graphql.resolvers]]
name = "others"
key = "id"
query = "getById"
graph = "/thing/graph"
"#;

fn one_error(r: Result<ResolvedConfig, ConfigErrors>) -> ConfigError {
    let errs = r.expect_err("config must be rejected").0;
    assert_eq!(errs.len(), 1, "{errs:?}");
    errs.into_iter().next().unwrap()
}

#[test]
fn defaults_apply() {
    let f = Fixture::new();
    let c = f.load(GOOD).unwrap();
    let e = &c.entities[0];
    assert_eq!(e.rest.as_ref().unwrap().path, "/thing/api");
    assert_eq!(e.graph.as_ref().unwrap().path, "/thing/graph");
    assert_eq!(e.storage, "default");
    assert_eq!(c.storages["default"], StorageSpec::default_sqlite());
    assert!(c.data_dir.ends_with("data"), "{:?}", c.data_dir);
}

#[test]
fn int_at_arguments_are_widened() {
    let f = Fixture::new();
    let c = f.load(GOOD).unwrap();
    let schema = &c.entities[0].graph.as_ref().unwrap().schema;
    let def = root_field(schema, "getById").unwrap();
    let at = def.arguments.iter().find(|a| a.name == "at").unwrap();
    assert_eq!(at.ty.to_string(), "Float");
}

#[test]
fn unknown_fields_are_rejected_with_line() {
    let f = Fixture::new();
    let e = one_error(f.load(&GOOD.replace("key = \"id\"", "key = \"id\"\ncolour = \"red\"")));
    assert!(e.message.contains("colour"), "{e}");
    assert_eq!(e.line, Some(17));
    assert!(e.to_string().contains("meshql.toml:17"), "{e}");
}

#[test]
fn storage_blocks_are_kept_for_their_backend() {
    // the backend registry (meshql-server) checks a block's fields; here it is kept as written
    let f = Fixture::new();
    let c = f
        .load(&format!(
            "[storage.default]\ntype = \"cassandra\"\nhosts = [\"a\", \"b\"]\npool_size = 0\n{GOOD}"
        ))
        .unwrap();
    let spec = &c.storages["default"];
    assert_eq!(spec.kind, "cassandra");
    assert_eq!(
        spec.settings,
        serde_json::json!({"hosts": ["a", "b"], "pool_size": 0})
    );
    assert!(matches!(spec.line, Some(1..=2)), "{spec:?}");
    assert_eq!(spec.line_of(Some("type")), Some(2));
    assert_eq!(spec.line_of(Some("pool_size")), Some(4));
    assert_eq!(spec.line_of(Some("hosts[1]")), Some(3));
    assert_eq!(spec.line_of(Some("nope")), spec.line);
}

#[test]
fn a_storage_block_needs_a_type() {
    let f = Fixture::new();
    let e = one_error(f.load(&format!("[storage.x]\nfile = \"a\"\n{GOOD}")));
    assert!(e.message.contains("type"), "{e}");
    assert!(matches!(e.line, Some(1..=2)), "{e}");
    let e = one_error(f.load(&format!("[storage.x]\ntype = 3\n{GOOD}")));
    assert!(e.message.contains("must be a string"), "{e}");
}

#[test]
fn missing_files_are_named() {
    let f = Fixture::new();
    let e = one_error(f.load(&GOOD.replace("thing.schema.json", "nope.json")));
    assert_eq!(e.line, Some(5));
    assert!(e.field.contains("rest.schema"), "{e}");
    assert!(e.message.contains("nope.json"), "{e}");
    let e =
        one_error(f.load(&GOOD.replace("schema = \"thing.graphql\"", "schema = \"nope.graphql\"")));
    assert_eq!(e.line, Some(7));
    assert!(e.message.contains("nope.graphql"));
}

#[test]
fn broken_sdl_points_into_the_sdl_file() {
    let f = Fixture::new();
    fs::write(
        f.dir.path().join("thing.graphql"),
        "type Query {\n  getById(id: ID): Thingy\n}\n",
    )
    .unwrap();
    let errs = f.load(GOOD).unwrap_err().0;
    assert!(errs[0].file.ends_with("thing.graphql"), "{errs:?}");
    assert_eq!(errs[0].line, Some(2));
}

#[test]
fn resolver_targets_are_checked() {
    let f = Fixture::new();
    let e = one_error(f.load(&GOOD.replace("graph = \"/thing/graph\"", "graph = \"/nope/graph\"")));
    assert!(e.message.contains("no graphlette at `/nope/graph`"), "{e}");
    assert_eq!(e.line, Some(18));
    let e = one_error(f.load(&GOOD.replace("query = \"getById\"", "query = \"getNothing\"")));
    assert!(e.message.contains("getNothing"), "{e}");
    let e = one_error(f.load(&GOOD.replace("name = \"others\"", "name = \"cousins\"")));
    assert!(e.message.contains("cousins"), "{e}");
}

/// A `url` resolver that points at this same service (a loopback or its host, on its port)
/// is checked like an in-process one: a missing graphlette or root query would fail every
/// request at run time (issue 22). One that points elsewhere is the other service's business.
#[test]
fn url_resolvers_to_this_service_are_checked_like_in_process_ones() {
    let f = Fixture::new();
    // the service's port first (top-level keys come before the tables)
    let to_self = |url: &str, query: &str| {
        let body = GOOD
            .replace("graph = \"/thing/graph\"", &format!("url = \"{url}\""))
            .replace(
                "query = \"getById\"\nurl",
                &format!("query = \"{query}\"\nurl"),
            );
        format!("port = 4100{body}")
    };
    let ok = f.load(&(to_self("http://localhost:4100/thing/graph", "getById")));
    assert!(ok.is_ok(), "{ok:?}");
    let e = one_error(f.load(&(to_self("http://127.0.0.1:4100/thing/graph", "getNothing"))));
    assert!(
        e.message.contains("`getNothing` is not a bound query"),
        "{e}"
    );
    assert!(e.message.contains("is this service"), "{e}");
    assert!(e.field.ends_with(".query"), "{e}");
    assert_eq!(e.line, Some(17), "{e}");
    let e = one_error(f.load(&(to_self("http://0.0.0.0:4100/nope/graph", "getById"))));
    assert!(e.message.contains("no graphlette at `/nope/graph`"), "{e}");
    assert!(e.field.ends_with(".url"), "{e}");
    assert_eq!(e.line, Some(18), "{e}");
    // another port, another host: not this service, not checked here
    for elsewhere in [
        "http://localhost:4101/nope/graph",
        "http://other:4100/nope/graph",
    ] {
        let r = f.load(&(to_self(elsewhere, "getNothing")));
        assert!(r.is_ok(), "{elsewhere}: {r:?}");
    }
}

#[test]
fn resolver_target_query_needs_an_id_argument() {
    let f = Fixture::new();
    let toml = GOOD.replace("query = \"getById\"\ngraph", "query = \"byName\"\ngraph")
        + "[[entity.graphql.vectors]]\nname = \"byName\"\nquery = '{\"payload.name\": \"{{name}}\"}'\n";
    std::fs::write(
        f.dir.path().join("thing.graphql"),
        "type Query {\n  getById(id: ID, at: Float): Thing\n  getAll(at: Float): [Thing]\n  byName(name: String): [Thing]\n}\ntype Thing { id: ID name: String other: Thing others: [Thing] }\n",
    )
    .unwrap();
    let e = one_error(f.load(&toml));
    assert!(e.message.contains("no `id` argument"), "{e}");
}

/// A root query the SDL declares but the config binds to no template could only ever answer
/// `null`, with no error: refused, at its line in the SDL.
#[test]
fn an_sdl_root_query_bound_to_no_template_is_an_error_at_its_line() {
    let f = Fixture::new();
    std::fs::write(
        f.dir.path().join("thing.graphql"),
        "type Query {\n  getById(id: ID, at: Float): Thing\n  getAll(at: Float): [Thing]\n  getByZone(zone: String, at: Float): [Thing]\n}\ntype Thing { id: ID name: String other: Thing others: [Thing] }\n",
    )
    .unwrap();
    let e = one_error(f.load(GOOD));
    assert!(e.file.ends_with("thing.graphql"), "{e}");
    assert_eq!(e.line, Some(4), "{e}");
    assert!(e.field.ends_with("Query.getByZone"), "{e}");
    assert!(
        e.message
            .contains("`getByZone` is declared in the SDL but bound to no template")
            && e.message.contains("[[entity.graphql.vectors]]"),
        "{e}"
    );
}

#[test]
fn template_placeholders_must_be_arguments() {
    let f = Fixture::new();
    let e = one_error(f.load(&GOOD.replace(
        r#"query = '{"id": "{{id}}"}'"#,
        r#"query = '{"id": "{{ident}}"}'"#,
    )));
    assert!(e.message.contains("ident"), "{e}");
    assert_eq!(e.line, Some(10));
    let e = one_error(f.load(&GOOD.replace(r#"query = '{}'"#, r#"query = '{"name": "x"}'"#)));
    assert!(e.message.contains("unsupported template key"), "{e}");
}

#[test]
fn query_kinds_must_match_the_sdl() {
    let f = Fixture::new();
    let toml = GOOD.replace(
        "[[entity.graphql.vectors]]\nname = \"getAll\"",
        "[[entity.graphql.singletons]]\nname = \"getAll\"",
    );
    let e = one_error(f.load(&toml));
    assert!(e.message.contains("singleton"), "{e}");
}

#[test]
fn missing_env_var_names_the_line() {
    let f = Fixture::new();
    let e = one_error(f.load(&format!("port = ${{NO_SUCH_PORT}}\n{GOOD}")));
    assert_eq!(e.line, Some(1));
    assert!(e.message.contains("NO_SUCH_PORT"));
}

#[test]
fn config_json_schema_describes_entities() {
    let sqlite = serde_json::json!({
        "type": "object",
        "properties": { "file": { "type": "string" } },
        "required": ["file"]
    });
    let nats = serde_json::json!({
        "description": "NATS",
        "type": "object",
        "properties": {
            "url": { "type": "string" },
            "mode": { "$ref": "#/$defs/Mode" }
        },
        "required": ["url"],
        "$defs": { "Mode": { "enum": ["a", "b"] } }
    });
    let s = crate::config_json_schema(&[("sqlite", sqlite)], &[("nats", nats)]);
    let text = s.to_string();
    assert!(text.contains("entity"));
    // permissions: per role, actions and a field mask; roles from a claim
    let permission = &s["$defs"]["PermissionConfig"]["properties"];
    for field in ["actions", "hidden_fields", "fields"] {
        assert!(permission[field].is_object(), "{field}: {permission}");
    }
    assert!(s["$defs"]["AuthConfig"]["properties"]["roles_claim"].is_object());
    assert!(s["$defs"]["AuthConfig"]["properties"]["enforce_policy"].is_object());
    assert!(s["$defs"]["EntityConfig"]["properties"]["permissions"].is_object());
    // [server.rate_limit] and [server.persisted_queries], documented
    let server = &s["$defs"]["ServerConfig"]["properties"];
    assert!(server["rate_limit"].is_object(), "{server}");
    assert!(server["persisted_queries"].is_object(), "{server}");
    let limits = &s["$defs"]["RateLimitConfig"]["properties"];
    for field in ["reads", "writes", "graphql", "max_callers"] {
        assert!(
            limits[field]["description"].is_string(),
            "{field}: {limits}"
        );
    }
    let bucket = &s["$defs"]["BucketConfig"]["properties"];
    for field in ["per_second", "burst"] {
        assert!(
            bucket[field]["description"].is_string(),
            "{field}: {bucket}"
        );
    }
    let persisted = &s["$defs"]["PersistedQueriesConfig"]["properties"];
    for field in ["mode", "manifest", "max_entries"] {
        assert!(
            persisted[field]["description"].is_string(),
            "{field}: {persisted}"
        );
    }
    let modes = s["$defs"]["PersistedQueryMode"].to_string();
    for mode in ["apq", "allowlist", "off"] {
        assert!(modes.contains(&format!("\"{mode}\"")), "{mode}: {modes}");
    }
    let storage = &s["$defs"]["StorageConfig"]["oneOf"][0];
    assert_eq!(
        storage["properties"]["type"]["const"], "sqlite",
        "{storage}"
    );
    assert_eq!(storage["required"], serde_json::json!(["type", "file"]));
    // a relay: its type, the fields every relay has, then its own
    let relay = &s["$defs"]["RelayConfig"]["oneOf"][0];
    assert_eq!(relay["description"], "NATS");
    let fields: Vec<&String> = relay["properties"].as_object().unwrap().keys().collect();
    assert_eq!(
        fields,
        [
            "type",
            "name",
            "batch",
            "retry_backoff_max_ms",
            "url",
            "mode"
        ]
    );
    assert_eq!(relay["properties"]["type"]["const"], "nats");
    assert!(relay["properties"]["batch"]["description"]
        .as_str()
        .unwrap()
        .contains("per batch"));
    assert_eq!(
        relay["required"],
        serde_json::json!(["type", "name", "url"])
    );
    assert_eq!(relay["additionalProperties"], false);
    assert_eq!(s["$defs"]["Mode"]["enum"][0], "a");
    assert_eq!(
        s["properties"]["changes"]["$ref"], "#/$defs/ChangesConfig",
        "{}",
        s["properties"]["changes"]
    );
}

#[test]
fn projection_fields_missing_on_the_target_are_warned_about() {
    let f = Fixture::new();
    fs::write(
        f.dir.path().join("other.graphql"),
        "type Query { getById(id: ID, at: Float): Other }\ntype Other { id: ID }\n",
    )
    .unwrap();
    let toml = GOOD.replace("graph = \"/thing/graph\"", "graph = \"/other/graph\"")
        + "[[entity]]\nname = \"other\"\n[entity.graphql]\nschema = \"other.graphql\"\n[[entity.graphql.singletons]]\nname = \"getById\"\nquery = '{\"id\": \"{{id}}\"}'\n";
    let c = f.load(&toml).expect("warnings do not stop a config");
    let names: Vec<&str> = c.warnings.iter().map(|w| w.field.as_str()).collect();
    assert_eq!(
        names,
        ["Thing.name", "Thing.other", "Thing.others"],
        "{:?}",
        c.warnings
    );
    assert!(c.warnings[0].file.ends_with("thing.graphql"));
    assert_eq!(c.warnings[0].line, Some(6));
}

#[test]
fn farm_example_has_consistent_projections() {
    let c = load_with_env(&examples().join("farm"), no_env).unwrap();
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
}

#[test]
fn colliding_routes_and_tables_are_rejected() {
    let f = Fixture::new();
    let second = "\n[[entity]]\nname = \"other\"\ntable = \"thing\"\n[entity.rest]\npath = \"/thing/api/bulk\"\n";
    let errs = f.load(&format!("{GOOD}{second}")).unwrap_err().0;
    let text = ConfigErrors(errs.clone()).to_string();
    assert!(text.contains("table `thing`"), "{text}");
    assert!(
        text.contains("route `/thing/api/bulk` is already served"),
        "{text}"
    );
    let reserved = "\n[[entity]]\nname = \"other\"\n[entity.rest]\npath = \"/_meshql/assets\"\n";
    let e = one_error(f.load(&format!("{GOOD}{reserved}")));
    assert!(e.message.contains("reserved"), "{e}");
}

#[test]
fn resolver_targets_must_only_need_id() {
    let f = Fixture::new();
    let toml = GOOD.replace("query = \"getById\"\ngraph", "query = \"byName\"\ngraph")
        + "[[entity.graphql.vectors]]\nname = \"byName\"\nquery = '{\"payload.name\": \"{{name}}\", \"id\": \"{{id}}\"}'\n";
    std::fs::write(
        f.dir.path().join("thing.graphql"),
        "type Query {\n  getById(id: ID, at: Float): Thing\n  getAll(at: Float): [Thing]\n  byName(id: ID, name: String): [Thing]\n}\ntype Thing { id: ID name: String other: Thing others: [Thing] }\n",
    )
    .unwrap();
    let e = one_error(f.load(&toml));
    assert!(e.message.contains("{{name}}"), "{e}");
}

#[test]
fn dotted_resolver_names_are_ignored_with_a_warning() {
    let f = Fixture::new();
    let toml = GOOD.to_owned()
        + "[[entity.graphql.resolvers]]\nname = \"others.layReports\"\nkey = \"id\"\nquery = \"getById\"\ngraph = \"/thing/graph\"\n";
    let c = f
        .load(&toml)
        .expect("a legacy dotted resolver does not stop a config");
    let g = c.entities[0].graph.as_ref().unwrap();
    let fields: Vec<&str> = g.resolvers.iter().map(|r| r.field.as_str()).collect();
    assert_eq!(fields, ["others"]);
    assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
    let w = &c.warnings[0];
    assert!(w.message.contains("others.layReports"), "{w}");
    assert_eq!(w.field, "entity[0] \"thing\".graphql.resolvers[1].name");
    assert_eq!(w.line, Some(toml.lines().count() - 3));
}

const CASBIN_MODEL: &str = "[request_definition]\nr = sub, obj, act\n\n[policy_definition]\np = sub, obj, act\n\n[role_definition]\ng = _, _\n\n[policy_effect]\ne = some(where (p.eft == allow))\n\n[matchers]\nm = g(r.sub, p.sub) && r.obj == p.obj && r.act == p.act\n";

/// GOOD with an `[auth]` table of `type = "casbin"` and the given model and policy files.
fn with_casbin(f: &Fixture, model: &str, policy: &str) -> String {
    fs::create_dir_all(f.dir.path().join("auth")).unwrap();
    fs::write(f.dir.path().join("auth/model.conf"), model).unwrap();
    fs::write(f.dir.path().join("auth/policy.csv"), policy).unwrap();
    GOOD.to_owned()
        + "[auth]\ntype = \"casbin\"\nsecret = \"0123456789abcdef0123456789abcdef\"\nmodel = \"auth/model.conf\"\npolicy = \"auth/policy.csv\"\n"
}

#[test]
fn casbin_auth_reads_the_roles_of_each_subject() {
    let f = Fixture::new();
    let toml = with_casbin(
        &f,
        CASBIN_MODEL,
        "p, admin, thing, read\ng, user1, admin\ng, user2, editor\ng, user2, viewer\n",
    );
    let c = f.load(&toml).unwrap();
    let AuthSpec::Casbin { roles, jwt, .. } = &c.auth else {
        panic!("{:?}", c.auth)
    };
    assert_eq!(roles["user1"], ["admin"]);
    assert_eq!(roles["user2"], ["editor", "viewer"]);
    assert!(matches!(
        &jwt.verification,
        meshql_auth::Verification::Verify(v) if v.secret.is_some()
    ));
}

#[test]
fn casbin_problems_name_the_file_line_and_field() {
    let f = Fixture::new();
    let toml = with_casbin(&f, CASBIN_MODEL, "g, user1, admin\ng, user2\n");
    let e = one_error(f.load(&toml));
    assert!(e.file.ends_with("auth/policy.csv"), "{e}");
    assert_eq!((e.line, e.field.as_str()), (Some(2), "auth.policy"));

    let toml = with_casbin(&f, &CASBIN_MODEL.replace("g = _, _", "g = _, _, _"), "");
    let e = one_error(f.load(&toml));
    assert!(e.file.ends_with("auth/model.conf"), "{e}");
    assert_eq!((e.line, e.field.as_str()), (Some(8), "auth.model"));

    let e = one_error(f.load(&toml.replace("policy = \"auth/policy.csv\"\n", "")));
    assert_eq!(e.field, "auth.policy");
    assert!(e.message.contains("needs `policy`"), "{e}");

    let toml = toml.replace("auth/model.conf", "auth/missing.conf");
    let e = one_error(f.load(&toml));
    assert_eq!(e.field, "auth.model");
    assert_eq!(e.line, Some(toml.lines().count() - 1));
    assert!(e.message.contains("missing.conf"), "{e}");
}

#[test]
fn casbin_files_without_casbin_are_ignored_with_a_warning() {
    let f = Fixture::new();
    let toml = with_casbin(&f, CASBIN_MODEL, "").replace("\"casbin\"", "\"jwt\"");
    let c = f.load(&toml).unwrap();
    assert!(matches!(c.auth, AuthSpec::Jwt(_)), "{:?}", c.auth);
    let fields: Vec<&str> = c.warnings.iter().map(|w| w.field.as_str()).collect();
    assert_eq!(fields, ["auth.model", "auth.policy"]);
}

fn auth_testdata(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../meshql-auth/testdata")
        .join(name)
        .display()
        .to_string()
}

const SECRET32: &str = "0123456789abcdef0123456789abcdef";

#[test]
fn jwt_settings_resolve_with_their_defaults() {
    let f = Fixture::new();
    let toml = format!(
        "{GOOD}[auth]\ntype = \"jwt\"\nsecret = \"${{JWT_SECRET}}\"\npublic_keys = [\"{}\"]\nissuer = \"https://idp.example\"\naudience = [\"a\", \"b\"]\nalgorithms = [\"HS256\", \"ES256\"]\nrequired = true\n",
        auth_testdata("ec256.pub.pem")
    );
    let file = f.dir.path().join("meshql.toml");
    fs::write(&file, &toml).unwrap();
    let c = load_with_env(&file, |k| (k == "JWT_SECRET").then(|| SECRET32.to_owned())).unwrap();
    let AuthSpec::Jwt(jwt) = &c.auth else {
        panic!("{:?}", c.auth)
    };
    assert!(jwt.required);
    let meshql_auth::Verification::Verify(v) = &jwt.verification else {
        panic!("{jwt:?}")
    };
    assert_eq!(v.secret.as_ref().unwrap().0, SECRET32.as_bytes());
    assert!(
        !format!("{v:?}").contains(SECRET32),
        "the secret is not in Debug output"
    );
    assert_eq!(v.public_keys[0].algorithms, [meshql_auth::Algorithm::ES256]);
    assert_eq!(v.issuers, ["https://idp.example"]);
    assert_eq!(v.audiences, ["a", "b"]);
    assert_eq!(v.algorithms.len(), 2);
    assert_eq!((v.leeway_secs, v.require_exp), (60, true));
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
}

/// GOOD with `[auth]` made of these lines; returns the text and the 1-based line of `needle`.
fn with_auth(lines: &str, needle: &str) -> (String, Option<usize>) {
    let toml = format!("{GOOD}[auth]\n{lines}");
    let line = toml.lines().position(|l| l.contains(needle)).map(|i| i + 1);
    (toml, line)
}

#[test]
fn jwt_config_problems_name_the_line_and_field() {
    let f = Fixture::new();
    let cases: Vec<(String, &str, &str, &str)> = vec![
        // (auth lines, line marker, field, message part)
        (
            "type = \"jwt\"\n".into(),
            "type = ",
            "auth.type",
            "needs a key",
        ),
        (
            "type = \"jwt\"\nsecret = \"short\"\n".into(),
            "secret",
            "auth.secret",
            "5 bytes; at least 32",
        ),
        (
            format!("type = \"jwt\"\nsecret = \"{SECRET32}\"\nalgorithms = [\n  \"HS256\",\n  \"none\",\n]\n"),
            "\"none\"",
            "auth.algorithms[1]",
            "unknown algorithm `none`",
        ),
        (
            format!("type = \"jwt\"\nsecret = \"{SECRET32}\"\nalgorithms = [\"RS256\"]\n"),
            "algorithms",
            "auth.algorithms[0]",
            "no configured key verifies RS256",
        ),
        (
            "type = \"jwt\"\npublic_keys = [\"keys/missing.pem\"]\n".into(),
            "public_keys",
            "auth.public_keys[0]",
            "cannot read key file",
        ),
        (
            format!("type = \"jwt\"\npublic_keys = [\"{}\"]\n", auth_testdata("rsa.key.pem")),
            "public_keys",
            "auth.public_keys[0]",
            "private key",
        ),
        (
            format!("type = \"jwt\"\npublic_keys = [\"{}\"]\n", auth_testdata("ec521.pub.pem")),
            "public_keys",
            "auth.public_keys[0]",
            "unsupported curve",
        ),
        (
            "type = \"jwt\"\njwks_url = \"ftp://idp.example/keys\"\n".into(),
            "jwks_url",
            "auth.jwks_url",
            "not an http(s) URL",
        ),
        (
            "type = \"jwt\"\njwks_url = \"https://\"\n".into(),
            "jwks_url",
            "auth.jwks_url",
            "not an http(s) URL",
        ),
        (
            format!("type = \"jwt\"\nsecret = \"{SECRET32}\"\nleeway_secs = 86400\n"),
            "leeway_secs",
            "auth.leeway_secs",
            "at most 3600",
        ),
        (
            format!("type = \"jwt\"\nsecret = \"{SECRET32}\"\naudience = []\n"),
            "audience",
            "auth.audience",
            "non-empty",
        ),
        (
            "type = \"casbin\"\nmodel = \"m\"\npolicy = \"p\"\n".into(),
            "type = ",
            "auth.type",
            "type = \"casbin\" verifies tokens",
        ),
    ];
    for (lines, marker, field, message) in cases {
        let (toml, line) = with_auth(&lines, marker);
        let errors = f.load(&toml).expect_err(&lines).0;
        let e = errors
            .iter()
            .find(|e| e.field == field)
            .unwrap_or_else(|| panic!("no error at {field} for {lines}: {errors:?}"));
        assert_eq!(e.line, line, "{e}");
        assert!(e.message.contains(message), "{e}");
        assert!(e.file.ends_with("meshql.toml"), "{e}");
    }
    // an unknown setting is a TOML error with its line
    let (toml, line) = with_auth("type = \"jwt\"\nverify = false\n", "verify");
    let e = one_error(f.load(&toml));
    assert_eq!(e.line, line, "{e}");
}

#[test]
fn an_empty_secret_counts_as_none() {
    let f = Fixture::new();
    // a config that takes its secret from an optional variable loads with type = "none"...
    let (toml, _) = with_auth("type = \"none\"\nsecret = \"\"\n", "secret");
    let c = f.load(&toml).unwrap();
    assert_eq!(c.auth, AuthSpec::None);
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    // ...and asks for a key with type = "jwt"
    let (toml, _) = with_auth("type = \"jwt\"\nsecret = \"\"\n", "secret");
    assert_eq!(one_error(f.load(&toml)).field, "auth.type");
}

#[test]
fn trusted_gateway_mode_is_warned_about() {
    let f = Fixture::new();
    let (toml, line) = with_auth(
        &format!("type = \"jwt\"\ntrusted_gateway = true\nsecret = \"{SECRET32}\"\n"),
        "trusted_gateway",
    );
    let c = f.load(&toml).unwrap();
    let AuthSpec::Jwt(jwt) = &c.auth else {
        panic!("{:?}", c.auth)
    };
    assert_eq!(jwt.verification, meshql_auth::Verification::TrustedGateway);
    let fields: Vec<&str> = c.warnings.iter().map(|w| w.field.as_str()).collect();
    assert_eq!(fields, ["auth.trusted_gateway", "auth.secret"]);
    assert_eq!(c.warnings[0].line, line);
    assert!(
        c.warnings[0].message.contains("NOT verified"),
        "{}",
        c.warnings[0]
    );
}

#[test]
fn jwt_settings_without_jwt_are_ignored_with_a_warning() {
    let f = Fixture::new();
    let (toml, line) = with_auth(&format!("secret = \"{SECRET32}\"\n"), "secret");
    let c = f.load(&toml).unwrap();
    assert_eq!(c.auth, AuthSpec::None);
    assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
    assert_eq!(
        (c.warnings[0].field.as_str(), c.warnings[0].line),
        ("auth.secret", line)
    );
}

#[test]
fn a_data_dir_that_is_a_file_is_rejected_with_its_line() {
    let f = Fixture::new();
    fs::write(f.dir.path().join("afile"), "x").unwrap();
    let e = one_error(f.load(&format!("port = 1\ndata_dir = \"afile\"\n{GOOD}")));
    assert_eq!(e.field, "data_dir");
    assert_eq!(e.line, Some(2));
    assert!(e.message.contains("is a file"), "{e}");
}

#[test]
fn an_entity_serving_nothing_is_rejected() {
    let f = Fixture::new();
    let e = one_error(f.load(&format!("{GOOD}\n[[entity]]\nname = \"ghost\"\n")));
    assert!(e.message.contains("serves nothing"), "{e}");
    assert!(e.field.contains("ghost"), "{e}");
}

#[test]
fn a_resolver_key_must_name_a_field_of_the_parent() {
    let f = Fixture::new();
    // `name` is in the SDL and the JSON Schema: fine
    let ok = GOOD.replace("key = \"id\"", "key = \"name\"");
    f.load(&ok).expect("a key that is a field");
    // a field neither has: an error naming the resolver's line and the key
    let bad = GOOD.replace("key = \"id\"", "key = \"nope\"");
    let e = one_error(f.load(&bad));
    assert_eq!(e.field, "entity[0] \"thing\".graphql.resolvers[0].key");
    assert_eq!(e.line, Some(15));
    assert!(e.message.contains("`nope`"), "{e}");
}

/// GOOD with JWT auth reading roles from `realm_access.roles`, and `extra` appended.
fn with_roles(extra: &str) -> String {
    GOOD.to_owned()
        + "[entity.permissions.reader]\nactions = [\"read\"]\nhidden_fields = [\"name\"]\n"
        + extra
        + "\n[auth]\ntype = \"jwt\"\nsecret = \"0123456789abcdef0123456789abcdef\"\nroles_claim = \"realm_access.roles\"\n"
}

#[test]
fn permissions_by_role_resolve() {
    let f = Fixture::new();
    let c = f
        .load(&with_roles(
            "[entity.permissions.editor]\nactions = [\"read\", \"create\", \"update\", \"delete\"]\n[entity.permissions.anonymous]\nactions = [\"read\"]\nfields = [\"name\", \"id\"]\n",
        ))
        .unwrap();
    let crate::resolve::PermissionsSpec::Roles {
        roles_claim,
        tables,
    } = &c.permissions
    else {
        panic!("{:?}", c.permissions)
    };
    assert_eq!(roles_claim.as_deref(), Some("realm_access.roles"));
    let thing = &tables["thing"];
    assert_eq!(
        thing["reader"].actions,
        meshql_core::Actions::of([meshql_core::Action::Read])
    );
    assert!(!thing["reader"].mask.allows("name"));
    assert_eq!(thing["editor"].actions, meshql_core::Actions::ALL);
    assert!(thing["anonymous"].mask.allows("name") && !thing["anonymous"].mask.allows("other"));
    // without any table: everything is allowed
    assert_eq!(
        f.load(GOOD).unwrap().permissions,
        crate::resolve::PermissionsSpec::None
    );
}

#[test]
fn a_bad_action_is_named_with_its_line_and_field() {
    let f = Fixture::new();
    let toml = with_roles("[entity.permissions.writer]\nactions = [\"read\", \"write\"]\n");
    let e = one_error(f.load(&toml));
    assert!(e.file.ends_with("meshql.toml"), "{e}");
    assert_eq!(e.field, "entity \"thing\" permissions.writer.actions[1]");
    assert_eq!(e.line, Some(GOOD.lines().count() + 5), "{e}");
    assert!(e.message.contains("unknown action `write`"), "{e}");
}

#[test]
fn an_unknown_mask_field_is_named_with_its_line_and_field() {
    let f = Fixture::new();
    let toml = with_roles(
        "[entity.permissions.viewer]\nactions = [\"read\"]\nfields = [\"name\", \"colour\"]\n",
    );
    let e = one_error(f.load(&toml));
    assert_eq!(e.field, "entity \"thing\" permissions.viewer.fields[1]");
    assert_eq!(e.line, Some(GOOD.lines().count() + 6), "{e}");
    assert!(e.message.contains("unknown field `colour`"), "{e}");
    // both kinds of mask, and `id` hidden
    let toml = with_roles("[entity.permissions.viewer]\nactions = [\"read\"]\nfields = [\"name\"]\nhidden_fields = [\"other\"]\n");
    assert!(one_error(f.load(&toml)).message.contains("not both"));
    let toml =
        with_roles("[entity.permissions.viewer]\nactions = [\"read\"]\nhidden_fields = [\"id\"]\n");
    assert!(one_error(f.load(&toml)).message.contains("always readable"));
}

#[test]
fn roles_need_a_source() {
    let f = Fixture::new();
    let toml = GOOD.to_owned()
        + "[entity.permissions.reader]\nactions = [\"read\"]\n[entity.permissions.\"*\"]\nactions = [\"read\"]\n";
    let e = one_error(f.load(&toml));
    assert_eq!(e.field, "entity \"thing\" permissions.reader");
    assert!(e.message.contains("auth.roles_claim"), "{e}");
    let toml = with_roles("").replace("realm_access.roles", "realm_access..roles");
    assert_eq!(one_error(f.load(&toml)).field, "auth.roles_claim");
    let c = f
        .load(&(with_roles("") + "enforce_policy = false\n"))
        .unwrap();
    assert!(
        c.warnings.iter().any(|w| w.field == "auth.enforce_policy"),
        "{:?}",
        c.warnings
    );
}

#[test]
fn casbin_permission_lines_name_entities_and_actions() {
    let f = Fixture::new();
    let toml = with_casbin(
        &f,
        CASBIN_MODEL,
        "p, admin, thing, read\np, admin, farm, read\np, admin, thing, write\ng, user1, admin\n",
    );
    let errs = f.load(&toml).expect_err("rejected").0;
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert!(errs
        .iter()
        .all(|e| e.file.ends_with("auth/policy.csv") && e.field == "auth.policy"));
    assert_eq!(errs[0].line, Some(2));
    assert!(
        errs[0].message.contains("unknown entity `farm`"),
        "{}",
        errs[0]
    );
    assert_eq!(errs[1].line, Some(3));
    assert!(
        errs[1].message.contains("unknown action `write`"),
        "{}",
        errs[1]
    );
    // MeshQL's behaviour on request: `p` lines ignored
    let c = f
        .load(&(toml.clone() + "enforce_policy = false\n"))
        .unwrap();
    assert!(matches!(
        c.permissions,
        crate::resolve::PermissionsSpec::Casbin { enforce: false, .. }
    ));
    // masks by role, but no actions: the policy decides those
    let toml = with_casbin(&f, CASBIN_MODEL, "p, admin, thing, read\ng, user1, admin\n").replace(
        "[auth]",
        "[entity.permissions.admin]\nhidden_fields = [\"name\"]\n[auth]",
    );
    let c = f.load(&toml).unwrap();
    let crate::resolve::PermissionsSpec::Casbin { enforce, masks, .. } = &c.permissions else {
        panic!()
    };
    assert!(*enforce);
    assert!(!masks["thing"]["admin"].allows("name"));
    let bad = toml.replace("hidden_fields", "actions = [\"read\"]\nhidden_fields");
    assert!(one_error(f.load(&bad)).message.contains("p` lines decide"));
}
