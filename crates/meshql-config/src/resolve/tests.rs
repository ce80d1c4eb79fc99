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
            "scalar Date\ntype Query {\n  getById(id: ID, at: Int): Thing\n  getAll(at: Float): [Thing]\n  byName(name: String): [Thing]\n}\ntype Thing { id: ID name: String other: Thing others: [Thing] }\n",
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
    assert!(matches!(
        &c.storages["default"],
        StorageSpec::Sqlite { path, .. } if path.ends_with("data/meshql.db")
    ));
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
fn unknown_storage_type_is_rejected() {
    let f = Fixture::new();
    let e = one_error(f.load(&format!(
        "[storage.x]\ntype = \"cassandra\"\nfile = \"a\"\n{GOOD}"
    )));
    assert!(e.message.contains("cassandra"), "{e}");
    assert_eq!(e.field, "storage.x.type", "{e}");
    assert!(matches!(e.line, Some(1..=2)), "{e}");
}

#[test]
fn an_empty_pool_is_rejected() {
    let f = Fixture::new();
    for block in [
        "type = \"postgres\"\nurl = \"postgres://h/db\"\npool_size = 0",
        "type = \"mysql\"\nurl = \"mysql://u:p@h/db\"\npool_size = 0",
        "type = \"mongo\"\nuri = \"mongodb://h/\"\ndb = \"d\"\npool_size = 0",
    ] {
        let e = one_error(f.load(&format!("[storage.x]\n{block}\n{GOOD}")));
        assert_eq!(e.field, "storage.x.pool_size", "{e}");
        assert!(e.message.contains("at least 1"), "{e}");
        assert!(matches!(e.line, Some(1..=5)), "{e}");
    }
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

#[test]
fn resolver_target_query_needs_an_id_argument() {
    let f = Fixture::new();
    let toml = GOOD.replace("query = \"getById\"\ngraph", "query = \"byName\"\ngraph")
        + "[[entity.graphql.vectors]]\nname = \"byName\"\nquery = '{\"payload.name\": \"{{name}}\"}'\n";
    let e = one_error(f.load(&toml));
    assert!(e.message.contains("no `id` argument"), "{e}");
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
    let s = crate::config_json_schema();
    let text = s.to_string();
    assert!(text.contains("entity"));
    assert!(text.contains("sqlite"));
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
    assert_eq!(c.warnings[0].line, Some(7));
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
        + "[auth]\ntype = \"casbin\"\nmodel = \"auth/model.conf\"\npolicy = \"auth/policy.csv\"\n"
}

#[test]
fn casbin_auth_reads_the_roles_of_each_subject() {
    let f = Fixture::new();
    let toml = with_casbin(
        &f,
        CASBIN_MODEL,
        "p, admin, data1, read\ng, user1, admin\ng, user2, editor\ng, user2, viewer\n",
    );
    let c = f.load(&toml).unwrap();
    let AuthSpec::Casbin { roles } = &c.auth else {
        panic!("{:?}", c.auth)
    };
    assert_eq!(roles["user1"], ["admin"]);
    assert_eq!(roles["user2"], ["editor", "viewer"]);
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
    assert_eq!(c.auth, AuthSpec::Jwt);
    let fields: Vec<&str> = c.warnings.iter().map(|w| w.field.as_str()).collect();
    assert_eq!(fields, ["auth.model", "auth.policy"]);
}
