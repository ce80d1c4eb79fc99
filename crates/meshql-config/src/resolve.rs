//! Stage 3: read the files a config names and cross-check every name, producing a
//! [`ResolvedConfig`] that a server can start from without further checks.

use crate::error::{line_of, ConfigError, ConfigErrors};
use crate::expand::expand;
use crate::model::{HttpClientConfig, QueryConfig, ServiceConfig};
use apollo_compiler::schema::ExtendedType;
use apollo_compiler::validation::Valid;
use apollo_compiler::{Name, Schema};
use meshql_core::QueryTemplate;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use toml::Spanned;

/// A storage block as written: its backend's `type` and other fields, unchecked here (the
/// backend registry checks them; see `meshql_core::BackendRegistry`).
#[derive(Debug, Clone, PartialEq)]
pub struct StorageSpec {
    pub kind: String,
    pub settings: serde_json::Value,
    /// The block's line in the config file (`None` for the implicit `default`).
    pub line: Option<usize>,
    /// The line of each field (`type` included).
    pub field_lines: BTreeMap<String, usize>,
}

impl StorageSpec {
    /// The storage of entities that name none and no `[storage.default]`: SQLite `meshql.db`.
    pub fn default_sqlite() -> Self {
        Self {
            kind: "sqlite".into(),
            settings: serde_json::json!({ "file": "meshql.db" }),
            line: None,
            field_lines: BTreeMap::new(),
        }
    }

    /// The line of a field (`pool_size`, or a path into it such as `hosts[0]`), else the
    /// block's.
    pub fn line_of(&self, field: Option<&str>) -> Option<usize> {
        field_line(&self.field_lines, field).or(self.line)
    }
}

/// The line of a field (`pool_size`, or a path into it such as `hosts[0]` or
/// `options.linger.ms`) in a block's `field_lines`.
/// The deepest part of the path that has a line wins (`mapping.fields.eggs.int` → the line of
/// `mapping.fields.eggs` when only that is known).
fn field_line(field_lines: &BTreeMap<String, usize>, field: Option<&str>) -> Option<usize> {
    let mut path = field?;
    loop {
        if let Some(line) = field_lines.get(path) {
            return Some(*line);
        }
        path = &path[..path.rfind(['.', '['])?];
    }
}

/// A config that passed every check.
#[derive(Debug, Clone)]
pub struct ResolvedConfig {
    pub file: PathBuf,
    pub port: u16,
    pub host: String,
    pub data_dir: PathBuf,
    pub cors_origin: String,
    pub body_limit_bytes: usize,
    pub require_json_content_type: bool,
    /// What REST creates and updates answer.
    pub write_response: crate::model::WriteResponse,
    /// `[server]`: connection limits of the HTTP listener.
    pub server: ServerSpec,
    pub auth: AuthSpec,
    /// Who may do what with each entity (`PermissionsSpec::None`: everyone everything).
    pub permissions: PermissionsSpec,
    pub http_client: HttpClientConfig,
    pub graphql: crate::model::GraphqlLimits,
    /// The change feed (`changes.dir` resolved under `data_dir`).
    pub changes: ChangesSpec,
    /// `[console]`: the web console, and where it is served.
    pub console: crate::model::ConsoleConfig,
    /// `[backup]`, its directory resolved under `data_dir` and its schedule checked.
    pub backup: BackupSpec,
    /// `[cache]`: the read cache (`None`: no cache).
    pub cache: Option<CacheSpec>,
    /// Storage by name (only the ones some entity uses).
    pub storages: BTreeMap<String, StorageSpec>,
    pub entities: Vec<ResolvedEntity>,
    /// `[[processor]]`, names checked (the processor crate checks the rest).
    pub processors: Vec<ProcessorSpec>,
    /// Problems that do not stop a service but make some queries answer less than they ask
    /// (e.g. a projection field the target graphlette does not have).
    pub warnings: Vec<ConfigError>,
    /// What this process serves of the config (`meshql serve --role`; set with
    /// [`ResolvedConfig::set_role`]).
    pub role: crate::Role,
}

/// `[backup]`, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct BackupSpec {
    pub dir: PathBuf,
    /// The cron expression, checked.
    pub schedule: Option<String>,
    pub keep: u32,
    pub s3: Option<crate::model::S3Config>,
}

/// The change feed's settings, with its directory resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct ChangesSpec {
    pub dir: PathBuf,
    pub config: crate::model::ChangesConfig,
    /// `[[changes.relay]]`, their common fields checked and defaulted (the relay registry
    /// checks the others).
    pub relays: Vec<RelaySpec>,
}

impl ResolvedConfig {
    /// Moves the data directory (`--data-dir`): relative files of storage blocks and the
    /// change log resolve under the new one.
    pub fn set_data_dir(&mut self, data_dir: PathBuf) {
        if let Ok(rel) = self.changes.dir.strip_prefix(&self.data_dir) {
            self.changes.dir = data_dir.join(rel);
        }
        if let Ok(rel) = self.backup.dir.strip_prefix(&self.data_dir) {
            self.backup.dir = data_dir.join(rel);
        }
        self.data_dir = data_dir;
    }
}

#[derive(Debug, Clone)]
pub struct ResolvedEntity {
    pub name: String,
    pub storage: String,
    pub table: String,
    pub tokens: Vec<String>,
    pub rest: Option<ResolvedRest>,
    pub graph: Option<ResolvedGraph>,
    /// Declared migrations, in the order they run.
    pub migrations: Vec<MigrationSpec>,
}

#[derive(Debug, Clone)]
pub struct ResolvedRest {
    pub path: String,
    /// The JSON Schema bodies are validated against (`None`: no validation).
    pub schema: Option<serde_json::Value>,
    pub schema_file: Option<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct ResolvedGraph {
    pub path: String,
    pub schema: Arc<Valid<Schema>>,
    pub sdl_file: PathBuf,
    /// The object type the root queries return (where resolver fields live).
    pub entity_type: String,
    pub queries: Vec<ResolvedQuery>,
    pub resolvers: Vec<ResolvedResolver>,
}

pub use meshql_core::graph::{
    GraphQuery as ResolvedQuery, Resolver as ResolvedResolver, ResolverTarget,
};

/// Loads a config file, or the `meshql.toml` inside a directory.
pub fn load(path: &Path) -> Result<ResolvedConfig, ConfigErrors> {
    load_with_env(path, |k| std::env::var(k).ok())
}

/// [`load`] with an explicit environment (for tests).
pub fn load_with_env(
    path: &Path,
    env: impl Fn(&str) -> Option<String>,
) -> Result<ResolvedConfig, ConfigErrors> {
    let file = if path.is_dir() {
        path.join(crate::CONFIG_FILE_NAME)
    } else {
        path.to_owned()
    };
    let raw = std::fs::read_to_string(&file).map_err(|e| ConfigError {
        file: file.clone(),
        line: None,
        field: String::new(),
        message: format!("cannot read config: {e}"),
    })?;
    let text = expand(&raw, env).map_err(|e| ConfigError {
        file: file.clone(),
        line: Some(e.line),
        field: String::new(),
        message: e.message,
    })?;
    let model: ServiceConfig = toml::from_str(&text).map_err(|e| {
        let line = e.span().map(|s| line_of(&text, s.start));
        ConfigError {
            file: file.clone(),
            line,
            field: toml_key_path(&e),
            message: e.message().trim().to_owned(),
        }
    })?;
    Resolver {
        own: None,
        file: file.clone(),
        base: file
            .parent()
            .map(Path::to_owned)
            .unwrap_or_else(|| PathBuf::from(".")),
        text,
        errors: Vec::new(),
        warnings: Vec::new(),
    }
    .resolve(model)
}

/// The dotted key path a TOML error occurred at (e.g. `storage.actors.type`; empty at the
/// top level). `toml` exposes it only in the `Display` of an error without input text.
fn toml_key_path(e: &toml::de::Error) -> String {
    let mut e = e.clone();
    e.set_input(None);
    e.to_string()
        .lines()
        .last()
        .and_then(|l| l.strip_prefix("in `"))
        .and_then(|l| l.strip_suffix('`'))
        .unwrap_or_default()
        .to_owned()
}

struct Resolver {
    /// This service's host and port: a `url` resolver pointing there is checked like an
    /// in-process one.
    own: Option<(String, u16)>,
    file: PathBuf,
    base: PathBuf,
    text: String,
    errors: Vec<ConfigError>,
    warnings: Vec<ConfigError>,
}

fn is_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl Resolver {
    fn error<T>(
        &mut self,
        at: Option<&Spanned<T>>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) {
        self.errors.push(ConfigError {
            file: self.file.clone(),
            line: at.map(|s| line_of(&self.text, s.span().start)),
            field: field.into(),
            message: message.into(),
        });
    }

    /// A problem that does not stop the service, at `at` in the config file.
    fn warn<T>(&mut self, at: &Spanned<T>, field: impl Into<String>, message: impl Into<String>) {
        self.warnings.push(ConfigError {
            file: self.file.clone(),
            line: Some(line_of(&self.text, at.span().start)),
            field: field.into(),
            message: message.into(),
        });
    }

    fn error_in(&mut self, file: &Path, line: Option<usize>, field: String, message: String) {
        self.errors.push(ConfigError {
            file: file.to_owned(),
            line,
            field,
            message,
        });
    }

    fn path_of(&self, relative: &str) -> PathBuf {
        let p = Path::new(relative);
        if p.is_absolute() {
            p.to_owned()
        } else {
            self.base.join(p)
        }
    }

    fn resolve(mut self, model: ServiceConfig) -> Result<ResolvedConfig, ConfigErrors> {
        self.own = Some((model.host.clone(), model.port));
        let data_dir = self.path_of(&model.data_dir);
        if data_dir.exists() && !data_dir.is_dir() {
            let line = self
                .text
                .lines()
                .position(|l| l.trim_start().starts_with("data_dir"))
                .map(|i| i + 1);
            let file = self.file.clone();
            self.error_in(
                &file,
                line,
                "data_dir".into(),
                format!(
                    "`{}` is a file; data_dir must be a directory (created when missing)",
                    data_dir.display()
                ),
            );
        }
        if model.entities.is_empty() {
            self.error::<()>(None, "entity", "the config declares no [[entity]]");
        }

        // storage
        let mut storages: BTreeMap<String, StorageSpec> = BTreeMap::new();
        for (name, block) in &model.storage {
            let spec = StorageSpec {
                kind: block.get_ref().kind.clone(),
                settings: serde_json::Value::Object(block.get_ref().settings.clone()),
                line: Some(line_of(&self.text, block.span().start)),
                field_lines: block
                    .get_ref()
                    .offsets
                    .iter()
                    .map(|(k, offset)| (k.clone(), line_of(&self.text, *offset)))
                    .collect(),
            };
            storages.insert(name.clone(), spec);
        }

        // entities, first pass: names, storage, paths, files
        let mut seen_names = HashSet::new();
        let mut seen_paths: HashMap<String, String> = HashMap::new();
        let mut used_storage = BTreeMap::new();
        let mut tables: HashMap<(String, String), String> = HashMap::new();
        let mut entities = Vec::new();
        let mut pending: Vec<(usize, Vec<crate::model::ResolverConfig>, String)> = Vec::new();
        for (index, entity) in model.entities.iter().enumerate() {
            let name = entity.name.get_ref().clone();
            let field = format!("entity[{index}] \"{name}\"");
            if !is_identifier(&name) {
                self.error(
                    Some(&entity.name),
                    format!("{field}.name"),
                    "use letters, digits, `_` or `-`",
                );
            }
            if !seen_names.insert(name.clone()) {
                self.error(
                    Some(&entity.name),
                    format!("{field}.name"),
                    "duplicate entity name",
                );
            }
            let storage_name = entity
                .storage
                .as_ref()
                .map(|s| s.get_ref().clone())
                .unwrap_or_else(|| "default".to_owned());
            match storages.get(&storage_name) {
                Some(spec) => {
                    used_storage.insert(storage_name.clone(), spec.clone());
                }
                None if entity.storage.is_none() => {
                    let spec = StorageSpec::default_sqlite();
                    storages.insert(storage_name.clone(), spec.clone());
                    used_storage.insert(storage_name.clone(), spec);
                }
                None => {
                    let known: Vec<_> = storages.keys().cloned().collect();
                    self.error(
                        entity.storage.as_ref(),
                        format!("{field}.storage"),
                        format!(
                            "no [storage.{storage_name}] block (declared: {})",
                            list(&known)
                        ),
                    );
                }
            }
            let table = entity.table.clone().unwrap_or_else(|| name.clone());
            if let Some(other) = tables.insert((storage_name.clone(), table.clone()), name.clone())
            {
                self.error(
                    Some(&entity.name),
                    format!("{field}.table"),
                    format!("table `{table}` of storage `{storage_name}` is already used by entity \"{other}\"; give one of them another `table`"),
                );
            }
            if !is_identifier(&table) {
                self.error(
                    Some(&entity.name),
                    format!("{field}.table"),
                    format!("`{table}` is not a valid table name"),
                );
            }

            let migrations = self.resolve_migrations(&entity.migration, &field);
            if entity.rest.is_none() && entity.graphql.is_none() {
                self.error(
                    Some(&entity.name),
                    field.clone(),
                    format!("entity \"{name}\" serves nothing: give it [entity.rest], [entity.graphql] or both"),
                );
            }
            let rest = entity.rest.as_ref().map(|rest| {
                let path = rest
                    .path
                    .as_ref()
                    .map(|p| p.get_ref().clone())
                    .unwrap_or_else(|| format!("/{name}/api"));
                self.check_path(
                    &path,
                    rest.path.as_ref(),
                    &format!("{field}.rest.path"),
                    &name,
                    &mut seen_paths,
                );
                let mut schema = None;
                let mut schema_file = None;
                if let Some(file) = &rest.schema {
                    let p = self.path_of(file.get_ref());
                    match std::fs::read_to_string(&p) {
                        Err(e) => self.error(
                            Some(file),
                            format!("{field}.rest.schema"),
                            format!("cannot read JSON Schema {}: {e}", p.display()),
                        ),
                        Ok(text) => match serde_json::from_str::<serde_json::Value>(&text) {
                            Err(e) => self.error_in(
                                &p,
                                Some(e.line()),
                                format!("{field}.rest.schema"),
                                format!("invalid JSON: {e}"),
                            ),
                            Ok(v) if !v.is_object() => self.error_in(
                                &p,
                                None,
                                format!("{field}.rest.schema"),
                                "a JSON Schema must be an object".into(),
                            ),
                            Ok(v) => {
                                if rest.validate {
                                    schema = Some(v);
                                }
                                schema_file = Some(p);
                            }
                        },
                    }
                } else if rest.validate {
                    // no schema: nothing to validate against
                }
                ResolvedRest {
                    path,
                    schema,
                    schema_file,
                }
            });

            let graph = entity.graphql.as_ref().and_then(|g| {
                let path = g
                    .path
                    .as_ref()
                    .map(|p| p.get_ref().clone())
                    .unwrap_or_else(|| format!("/{name}/graph"));
                self.check_path(&path, g.path.as_ref(), &format!("{field}.graphql.path"), &name, &mut seen_paths);
                let sdl_file = self.path_of(g.schema.get_ref());
                let sdl = match std::fs::read_to_string(&sdl_file) {
                    Ok(s) => s,
                    Err(e) => {
                        self.error(Some(&g.schema), format!("{field}.graphql.schema"), format!("cannot read GraphQL SDL {}: {e}", sdl_file.display()));
                        return None;
                    }
                };
                let schema = self.parse_sdl(&sdl, &sdl_file, &format!("{field}.graphql.schema"))?;
                let mut queries = Vec::new();
                let mut returned: Vec<(String, String)> = Vec::new();
                for (vector, list_name, configs) in [(false, "singletons", &g.singletons), (true, "vectors", &g.vectors)] {
                    for (qi, q) in configs.iter().enumerate() {
                        let qfield = format!("{field}.graphql.{list_name}[{qi}]");
                        if let Some(rq) = self.resolve_query(q, vector, &schema, &qfield) {
                            if let Some(t) = root_field_type(&schema, &rq.name) {
                                returned.push((rq.name.clone(), t));
                            }
                            queries.push(rq);
                        }
                    }
                }
                let entity_type = match entity_object_type(&schema, &name, &returned) {
                    Ok(t) => t,
                    Err(message) => {
                        self.error(Some(&g.schema), format!("{field}.graphql.schema"), message);
                        None
                    }
                };
                let bound: Vec<&str> = g.singletons.iter().chain(&g.vectors).map(|q| q.name.get_ref().as_str()).collect();
                self.check_unbound_roots(&schema, &sdl_file, &bound, &format!("{field}.graphql"));
                self.check_subscriptions(&schema, &sdl_file, &queries, &format!("{field}.graphql.schema"));
                let mut seen_q = HashSet::new();
                for q in &queries {
                    if !seen_q.insert(q.name.clone()) {
                        self.error::<()>(None, format!("{field}.graphql"), format!("query `{}` is bound twice", q.name));
                    }
                }
                let entity_type = match entity_type {
                    Some(t) => t,
                    None => {
                        if !g.resolvers.is_empty() {
                            self.error(Some(&g.schema), format!("{field}.graphql"), "resolvers need at least one bound root query (its return type is where resolver fields live)");
                        }
                        String::new()
                    }
                };
                pending.push((index, g.resolvers.clone(), field.clone()));
                Some(ResolvedGraph {
                    path,
                    schema: Arc::new(schema),
                    sdl_file,
                    entity_type,
                    queries,
                    resolvers: Vec::new(),
                })
            });
            entities.push(ResolvedEntity {
                name,
                storage: storage_name,
                table,
                tokens: entity.tokens.clone(),
                rest,
                graph,
                migrations,
            });
        }

        // second pass: resolvers (they refer to other entities' graphlettes)
        for (index, resolvers, field) in pending {
            let mut resolved = Vec::new();
            for (ri, r) in resolvers.iter().enumerate() {
                let rfield = format!("{field}.graphql.resolvers[{ri}]");
                if let Some(rr) = self.resolve_resolver(r, &entities[index], &entities, &rfield) {
                    resolved.push(rr);
                }
            }
            if let Some(g) = entities[index].graph.as_mut() {
                g.resolvers = resolved;
            }
        }

        let server = self.resolve_server(&model.server);
        if model.console.enabled {
            let path = model.console.path.as_str();
            if !path.starts_with('/')
                || path.contains(['{', '}', '*', ' ', '?', '#'])
                || (path != "/" && path.ends_with('/'))
            {
                self.error::<String>(None, "console.path", format!("`{path}` must be `/` or start with `/` and not end with `/`, and contain no `{{ }} * ? #` or spaces"));
            } else if matches!(path, "/health" | "/ready" | "/metrics" | "/_changes")
                || path.starts_with("/_meshql")
            {
                self.error::<String>(
                    None,
                    "console.path",
                    format!("`{path}` is reserved by the server"),
                );
            } else if let Some(other) = seen_paths.get(path) {
                self.error::<String>(
                    None,
                    "console.path",
                    format!("route `{path}` is already served for entity \"{other}\""),
                );
            }
        }
        let cache = self.resolve_cache(&model.cache);
        let relays = self.resolve_relays(&model.changes);
        let processors = self.resolve_processors(&model.processors, model.changes.enabled);
        let auth = self.resolve_auth(&model.auth);
        let Some(auth) = auth.filter(|_| self.errors.is_empty()) else {
            return Err(ConfigErrors(self.errors));
        };
        let permissions = self.resolve_permissions(&model, &entities, &auth);
        let backup = self.resolve_backup(&model.backup, &data_dir);
        if !self.errors.is_empty() {
            return Err(ConfigErrors(self.errors));
        }
        let mut warnings = self.warnings;
        warnings.extend(projection_warnings(&entities));
        let changes = ChangesSpec {
            dir: data_dir.join(&model.changes.dir),
            config: model.changes,
            relays,
        };
        Ok(ResolvedConfig {
            file: self.file,
            port: model.port,
            host: model.host,
            data_dir,
            cors_origin: model.cors_origin,
            body_limit_bytes: model.body_limit_bytes,
            require_json_content_type: model.require_json_content_type,
            write_response: model.write_response,
            server,
            auth,
            permissions,
            http_client: model.http_client,
            graphql: model.graphql,
            changes,
            console: model.console,
            backup,
            cache,
            storages: used_storage,
            entities,
            processors,
            warnings,
            role: crate::Role::All,
        })
    }

    fn resolve_backup(&mut self, b: &crate::model::BackupConfig, data_dir: &Path) -> BackupSpec {
        let schedule = b.schedule.as_ref().and_then(|s| {
            let text = s.get_ref().trim().to_owned();
            match crate::schedule::parse(&text) {
                Ok(_) => Some(text),
                Err(e) => {
                    self.error(Some(s), "backup.schedule", e);
                    None
                }
            }
        });
        if let Some(s3) = &b.s3 {
            let url = &s3.get_ref().url;
            if crate::schedule::s3_bucket(url).is_none() {
                self.error(
                    Some(s3),
                    "backup.s3.url",
                    format!("`{url}` is not an S3 URL: write s3://bucket or s3://bucket/prefix"),
                );
            }
        }
        BackupSpec {
            dir: data_dir.join(&b.dir),
            schedule,
            keep: b.keep,
            s3: b.s3.as_ref().map(|s| s.get_ref().clone()),
        }
    }

    fn check_path(
        &mut self,
        path: &str,
        at: Option<&Spanned<String>>,
        field: &str,
        entity: &str,
        seen: &mut HashMap<String, String>,
    ) {
        if !path.starts_with('/')
            || path.contains(['{', '}', '*', ' ', '?', '#'])
            || path.ends_with('/')
        {
            self.error(at, field, format!("`{path}` must start with `/`, not end with `/`, and contain no `{{ }} * ? #` or spaces"));
        }
        if matches!(path, "/health" | "/ready" | "/metrics") || path.starts_with("/_meshql") {
            self.error(at, field, format!("`{path}` is reserved by the server"));
        }
        // a REST path also serves `P/bulk`, `P/api-docs`, ...: none may collide
        let routes: Vec<String> = if field.ends_with("rest.path") {
            [
                "",
                "/",
                "/bulk",
                "/api-docs",
                "/api-docs/swagger.json",
                "/health",
                "/ready",
            ]
            .iter()
            .map(|suffix| format!("{path}{suffix}"))
            .collect()
        } else {
            vec![path.to_owned()]
        };
        if let Some((route, other)) = routes
            .iter()
            .find_map(|r| seen.get(r).map(|o| (r.clone(), o.clone())))
        {
            self.error(
                at,
                field,
                format!("route `{route}` is already served for entity \"{other}\""),
            );
            return;
        }
        for r in routes {
            seen.insert(r, entity.to_owned());
        }
    }

    /// Parses and validates an SDL file. `at: Int` arguments of root queries become `Float`
    /// so that 13-digit millisecond timestamps validate (GraphQL's Int is 32-bit).
    fn parse_sdl(&mut self, sdl: &str, file: &Path, field: &str) -> Option<Valid<Schema>> {
        let mut schema = match Schema::parse(sdl, file) {
            Ok(s) => s,
            Err(with_errors) => {
                self.report_sdl(&with_errors.errors, file, field);
                return None;
            }
        };
        widen_at_arguments(&mut schema);
        match schema.validate() {
            Ok(valid) => {
                if valid.schema_definition.query.is_none() {
                    self.error_in(
                        file,
                        None,
                        field.to_owned(),
                        "the SDL has no `type Query`".into(),
                    );
                    return None;
                }
                Some(valid)
            }
            Err(with_errors) => {
                self.report_sdl(&with_errors.errors, file, field);
                None
            }
        }
    }

    fn report_sdl(
        &mut self,
        errors: &apollo_compiler::validation::DiagnosticList,
        file: &Path,
        field: &str,
    ) {
        for d in errors.iter() {
            let line = sdl_line(
                d.sources,
                apollo_compiler::diagnostic::ToCliReport::location(d.error),
            );
            self.error_in(file, line, field.to_owned(), d.error.to_string());
        }
    }

    /// Every field of the SDL's `Query` type must be bound to a template
    /// (`[[entity.graphql.singletons]]` or `[[entity.graphql.vectors]]` of its name): one
    /// that is not could only ever answer `null`, silently.
    fn check_unbound_roots(
        &mut self,
        schema: &Valid<Schema>,
        sdl_file: &Path,
        bound: &[&str],
        field: &str,
    ) {
        let Some(root) = schema.schema_definition.query.as_ref() else {
            return;
        };
        let Some(object) = schema.get_object(root.name.as_str()) else {
            return;
        };
        for (name, def) in &object.fields {
            if bound.contains(&name.as_str()) {
                continue;
            }
            let list = if def.ty.is_list() {
                "vectors"
            } else {
                "singletons"
            };
            self.error_in(
                sdl_file,
                sdl_line(&schema.sources, def.location()),
                format!("{field}: Query.{name}"),
                format!(
                    "root query `{name}` is declared in the SDL but bound to no template, so it could only answer null: add `[[entity.graphql.{list}]]` with `name = \"{name}\"` and its `query` (or `sql`) to the config, or remove it from the SDL"
                ),
            );
        }
    }

    /// Every field of the SDL's `Subscription` type subscribes to the bound root query of the
    /// same name (its events are the changes that query's template matches): one without
    /// such a query, or with arguments the query does not take, could never be answered.
    fn check_subscriptions(
        &mut self,
        schema: &Valid<Schema>,
        sdl_file: &Path,
        queries: &[ResolvedQuery],
        field: &str,
    ) {
        let Some(root) = schema.schema_definition.subscription.as_ref() else {
            return;
        };
        let Some(object) = schema.get_object(root.name.as_str()) else {
            return;
        };
        for (name, def) in &object.fields {
            let line = sdl_line(&schema.sources, def.location());
            let Some(query) = queries.iter().find(|q| q.name == name.as_str()) else {
                self.error_in(
                    sdl_file,
                    line,
                    format!("{field}: Subscription.{name}"),
                    format!(
                        "subscription `{name}` names no bound root query (bound: {}); a subscription field follows the root query of the same name",
                        list(&queries.iter().map(|q| q.name.clone()).collect::<Vec<_>>())
                    ),
                );
                continue;
            };
            let query_args: HashSet<&str> = root_field(schema, &query.name)
                .map(|d| d.arguments.iter().map(|a| a.name.as_str()).collect())
                .unwrap_or_default();
            for arg in &def.arguments {
                if !query_args.contains(arg.name.as_str()) {
                    self.error_in(
                        sdl_file,
                        line,
                        format!("{field}: Subscription.{name}({})", arg.name),
                        format!(
                            "argument `{}` of subscription `{name}` is not an argument of the root query `{name}`",
                            arg.name
                        ),
                    );
                }
            }
        }
    }

    fn resolve_query(
        &mut self,
        q: &QueryConfig,
        vector: bool,
        schema: &Valid<Schema>,
        field: &str,
    ) -> Option<ResolvedQuery> {
        let name = q.name.get_ref().clone();
        let Some(def) = root_field(schema, &name) else {
            self.error(
                Some(&q.name),
                format!("{field}.name"),
                format!(
                    "`{name}` is not a field of the SDL's Query type (fields: {})",
                    list(&root_field_names(schema))
                ),
            );
            return None;
        };
        let returns_list = def.ty.is_list();
        if returns_list != vector {
            self.error(
                Some(&q.name),
                format!("{field}.name"),
                if vector {
                    format!(
                        "`{name}` is declared as a vector but the SDL returns `{}` (not a list)",
                        def.ty
                    )
                } else {
                    format!(
                        "`{name}` is declared as a singleton but the SDL returns the list `{}`",
                        def.ty
                    )
                },
            );
        }
        let template = match (&q.query, &q.sql) {
            (Some(t), None) => match QueryTemplate::filter(t.get_ref()) {
                Ok(t) => t,
                Err(e) => {
                    self.error(Some(t), format!("{field}.query"), e.to_string());
                    return None;
                }
            },
            (None, Some(t)) => match QueryTemplate::sql(t.get_ref()) {
                Ok(t) => t,
                Err(e) => {
                    self.error(Some(t), format!("{field}.sql"), e.to_string());
                    return None;
                }
            },
            _ => {
                self.error(
                    Some(&q.name),
                    field.to_owned(),
                    "give exactly one of `query` (JSON template) and `sql` (SQL fragment)",
                );
                return None;
            }
        };
        let template = match &q.sort {
            None => template,
            Some(sort) => match template.with_sort(sort.get_ref()) {
                Ok(t) => t,
                Err(e) => {
                    self.error(Some(sort), format!("{field}.sort"), e.to_string());
                    return None;
                }
            },
        };
        let args: HashSet<&str> = def.arguments.iter().map(|a| a.name.as_str()).collect();
        let at = q.query.as_ref().or(q.sql.as_ref());
        for placeholder in template.placeholders() {
            if !args.contains(placeholder.as_str()) {
                self.error(at, format!("{field}.{}", if q.query.is_some() { "query" } else { "sql" }), format!("placeholder `{{{{{placeholder}}}}}` is not an argument of `{name}` (arguments: {})", list(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())));
            }
        }
        Some(ResolvedQuery {
            name,
            vector,
            template,
        })
    }

    /// A resolver's `key` must name a field of the parent: its GraphQL type's or its JSON
    /// Schema's (an error when the schema lists its properties; a warning when the entity
    /// has no schema to tell).
    fn check_resolver_key(
        &mut self,
        r: &crate::model::ResolverConfig,
        owner: &ResolvedEntity,
        field: &str,
    ) {
        let key = r.key.as_str();
        if key == "id" {
            return;
        }
        let in_sdl = owner.graph.as_ref().is_some_and(|g| {
            g.schema
                .get_object(g.entity_type.as_str())
                .is_some_and(|t| t.fields.contains_key(key))
        });
        let properties = owner
            .rest
            .as_ref()
            .and_then(|rest| rest.schema.as_ref())
            .and_then(|schema| schema.get("properties"))
            .and_then(serde_json::Value::as_object);
        if in_sdl || properties.is_some_and(|p| p.contains_key(key)) {
            return;
        }
        let message = format!(
            "key `{key}` is not a field of \"{}\" (neither its GraphQL type nor its JSON Schema has it): every parent would send no key and the relationship would always be empty",
            owner.name
        );
        if properties.is_some() {
            self.error(Some(&r.name), format!("{field}.key"), message);
        } else {
            self.warn(&r.name, format!("{field}.key"), message);
        }
    }

    /// Checks a resolver whose target is a graphlette of this config (`graph`, or a `url` that
    /// points at this service): the path is a graphlette, `r.query` one of its bound root
    /// queries, with an `id` argument and no other placeholder. Errors name `at` and
    /// `error_field` and end with `note`.
    #[allow(clippy::too_many_arguments)]
    fn check_local_target(
        &mut self,
        r: &crate::model::ResolverConfig,
        at: &Spanned<String>,
        path: &str,
        entities: &[ResolvedEntity],
        error_field: &str,
        field: &str,
        note: &str,
    ) -> bool {
        let error_field = error_field.to_owned();
        let Some(target) = entities
            .iter()
            .find(|e| e.graph.as_ref().map(|g| g.path.as_str()) == Some(path))
        else {
            let known: Vec<String> = entities
                .iter()
                .filter_map(|e| e.graph.as_ref().map(|g| g.path.clone()))
                .collect();
            self.error(
                Some(at),
                error_field.clone(),
                format!(
                    "no graphlette at `{}` in this service (known: {}){note}",
                    path,
                    list(&known)
                ),
            );
            return false;
        };
        let tg = target.graph.as_ref().expect("found by graph path");
        match tg.queries.iter().find(|q| q.name == *r.query.get_ref()) {
            None => {
                let known: Vec<String> = tg.queries.iter().map(|q| q.name.clone()).collect();
                self.error(
                    Some(&r.query),
                    format!("{field}.query"),
                    format!(
                        "`{}` is not a bound query of `{}` (bound: {}){note}",
                        r.query.get_ref(),
                        tg.path,
                        list(&known)
                    ),
                );
                return false;
            }
            Some(q) => {
                let has_id = root_field(&tg.schema, r.query.get_ref())
                    .map(|d| d.arguments.iter().any(|a| a.name == "id"))
                    .unwrap_or(false);
                if !has_id {
                    self.error(Some(&r.query), format!("{field}.query"), format!("target query `{}` of `{}` has no `id` argument; resolvers call it as `{}(id: <key>, at: <time>)`{note}", r.query.get_ref(), tg.path, r.query.get_ref()));
                    return false;
                }
                let target_args: HashSet<&str> = root_field(&tg.schema, r.query.get_ref())
                    .map(|d| d.arguments.iter().map(|a| a.name.as_str()).collect())
                    .unwrap_or_default();
                let extra: Vec<String> = q
                    .template
                    .placeholders()
                    .into_iter()
                    .filter(|p| p != "id" && target_args.contains(p.as_str()))
                    .collect();
                if !extra.is_empty() {
                    self.error(
                                Some(&r.query),
                                format!("{field}.query"),
                                format!(
                                    "target query `{}` of `{}` uses {}; a resolver passes only `id` (and `at`), so those would match nothing{note}",
                                    r.query.get_ref(),
                                    tg.path,
                                    extra.iter().map(|p| format!("{{{{{p}}}}}")).collect::<Vec<_>>().join(", ")
                                ),
                            );
                    return false;
                }
            }
        }
        true
    }

    /// The graphlette path of `url` when it points at this service (see
    /// [`crate::this_service`]).
    fn own_path(&self, url: &str) -> Option<String> {
        let (own_host, own_port) = self.own.as_ref()?;
        crate::this_service::path_on(url, own_host, *own_port)
    }

    fn resolve_resolver(
        &mut self,
        r: &crate::model::ResolverConfig,
        owner: &ResolvedEntity,
        entities: &[ResolvedEntity],
        field: &str,
    ) -> Option<ResolvedResolver> {
        let graph = owner.graph.as_ref()?;
        let name = r.name.get_ref().clone();
        if name.contains('.') {
            // MeshQL's legacy dotted resolver names (`hens.layReports`) are never invoked:
            // ported configs load, with a warning, and the resolver is left out
            self.warn(&r.name, format!("{field}.name"), format!("`{name}`: dotted resolver names are ignored (as in MeshQL); declare the resolver on the entity that owns the field"));
            return None;
        }
        let ty = graph.schema.get_object(graph.entity_type.as_str());
        let Some(field_def) = ty.and_then(|t| t.fields.get(name.as_str())) else {
            self.error(
                Some(&r.name),
                format!("{field}.name"),
                format!(
                    "`{name}` is not a field of type `{}` in {}",
                    graph.entity_type,
                    graph.sdl_file.display()
                ),
            );
            return None;
        };
        let vector = field_def.ty.is_list();
        self.check_resolver_key(r, owner, field);
        let target = match (&r.graph, &r.url) {
            (Some(path), None) => {
                if !self.check_local_target(
                    r,
                    path,
                    path.get_ref(),
                    entities,
                    &format!("{field}.graph"),
                    field,
                    "",
                ) {
                    return None;
                }
                ResolverTarget::InProcess {
                    graph_path: path.get_ref().clone(),
                }
            }
            (None, Some(url)) => {
                let u = url.get_ref();
                if !(u.starts_with("http://") || u.starts_with("https://")) {
                    self.error(
                        Some(url),
                        format!("{field}.url"),
                        format!("`{u}` is not an http(s) URL"),
                    );
                    return None;
                }
                if let Some(path) = self.own_path(u) {
                    let note = format!(" (`{u}` is this service)");
                    if !self.check_local_target(
                        r,
                        url,
                        &path,
                        entities,
                        &format!("{field}.url"),
                        field,
                        &note,
                    ) {
                        return None;
                    }
                }
                ResolverTarget::Http { url: u.clone() }
            }
            _ => {
                self.error(Some(&r.name), field.to_owned(), "give exactly one of `graph` (in-process graphlette path) and `url` (remote graphlette)");
                return None;
            }
        };
        Some(ResolvedResolver {
            field: name,
            key: r.key.clone(),
            query: r.query.get_ref().clone(),
            vector,
            target,
        })
    }
}

/// Every field of the projection type the parent's SDL declares for a relationship should
/// exist on the type the target query returns, or selecting it answers null (in-process) or
/// an error (over HTTP). Checked for in-process targets, and for HTTP targets whose path is a
/// graphlette of this config (the same service, or another instance of it).
fn projection_warnings(entities: &[ResolvedEntity]) -> Vec<ConfigError> {
    let mut warnings = Vec::new();
    for e in entities {
        let Some(g) = &e.graph else { continue };
        for r in &g.resolvers {
            let graph_path = match &r.target {
                ResolverTarget::InProcess { graph_path } => graph_path.as_str(),
                ResolverTarget::Http { url } => url
                    .split_once("://")
                    .and_then(|(_, rest)| rest.find('/').map(|i| &rest[i..]))
                    .unwrap_or(""),
            };
            let Some(tg) = entities
                .iter()
                .filter_map(|t| t.graph.as_ref())
                .find(|t| t.path == graph_path)
            else {
                continue;
            };
            let projection = g
                .schema
                .get_object(g.entity_type.as_str())
                .and_then(|t| t.fields.get(r.field.as_str()))
                .map(|f| f.ty.inner_named_type().clone());
            let Some(projection) = projection else {
                continue;
            };
            let Some(target_type) = root_field_type(&tg.schema, &r.query) else {
                continue;
            };
            let mut seen = HashSet::new();
            compare_projection(
                g,
                tg,
                projection.as_str(),
                &target_type,
                &format!("{}.{}", g.entity_type, r.field),
                &mut seen,
                &mut warnings,
            );
        }
    }
    warnings
}

/// Checks that projection type `p` of `g`'s SDL fits type `t` of `tg`'s SDL, recursing into
/// object-typed fields (the target validates nested selections against its own SDL).
fn compare_projection(
    g: &ResolvedGraph,
    tg: &ResolvedGraph,
    p: &str,
    t: &str,
    via: &str,
    seen: &mut HashSet<(String, String)>,
    warnings: &mut Vec<ConfigError>,
) {
    if !seen.insert((p.to_owned(), t.to_owned())) {
        return;
    }
    let (Some(po), Some(to)) = (g.schema.get_object(p), tg.schema.get_object(t)) else {
        return;
    };
    for (name, field) in &po.fields {
        match to.fields.get(name) {
            None => warnings.push(ConfigError {
                file: g.sdl_file.clone(),
                line: sdl_line(&g.schema.sources, field.location()),
                field: format!("{p}.{name}"),
                message: format!(
                    "`{t}` in {} has no field `{name}`: selecting it through `{via}` fails",
                    tg.sdl_file.display()
                ),
            }),
            Some(target_field) => {
                let inner = field.ty.inner_named_type();
                let target_inner = target_field.ty.inner_named_type();
                if g.schema.get_object(inner.as_str()).is_some() {
                    compare_projection(
                        g,
                        tg,
                        inner.as_str(),
                        target_inner.as_str(),
                        via,
                        seen,
                        warnings,
                    );
                }
            }
        }
    }
}

fn list(items: &[String]) -> String {
    if items.is_empty() {
        "none".to_owned()
    } else {
        items.join(", ")
    }
}

fn root_field<'a>(
    schema: &'a Schema,
    name: &str,
) -> Option<&'a apollo_compiler::schema::FieldDefinition> {
    let query = schema.schema_definition.query.as_ref()?;
    let obj = schema.get_object(query.name.as_str())?;
    obj.fields.get(name).map(|c| &***c)
}

fn root_field_names(schema: &Schema) -> Vec<String> {
    schema
        .schema_definition
        .query
        .as_ref()
        .and_then(|q| schema.get_object(q.name.as_str()))
        .map(|o| o.fields.keys().map(|k| k.to_string()).collect())
        .unwrap_or_default()
}

fn root_field_type(schema: &Schema, name: &str) -> Option<String> {
    root_field(schema, name).map(|f| f.ty.inner_named_type().to_string())
}

/// The object type of an entity's documents, from what its bound root queries return
/// (`(query, type)` in config order): the first object type among them; when they all
/// return an interface or a union, the one type of it that is an object, else the one whose
/// name is the entity's (`lay_report` ~ `LayReport`). `Err` when an abstract return type
/// leaves it open; `Ok(None)` when no bound query returns a type the SDL declares.
fn entity_object_type(
    schema: &Schema,
    entity: &str,
    returned: &[(String, String)],
) -> Result<Option<String>, String> {
    if let Some((_, t)) = returned
        .iter()
        .find(|(_, t)| schema.get_object(t.as_str()).is_some())
    {
        return Ok(Some(t.clone()));
    }
    let Some((query, abstract_type)) = returned.first() else {
        return Ok(None);
    };
    let Ok(abstract_name) = Name::new(abstract_type) else {
        return Ok(None);
    };
    let possible: Vec<&Name> = schema
        .types
        .iter()
        .filter(|(n, t)| t.is_object() && schema.is_subtype(&abstract_name, n))
        .map(|(n, _)| n)
        .collect();
    let plain = |s: &str| s.replace('_', "").to_ascii_lowercase();
    match possible.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(one.to_string())),
        many => match many.iter().find(|n| plain(n) == plain(entity)) {
            Some(n) => Ok(Some(n.to_string())),
            None => Err(format!(
                "`{query}` returns `{abstract_type}`, which is any of {}: meshql cannot tell which of them \"{entity}\"'s documents are; name one of them after the entity or bind a root query that returns it",
                many.iter()
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        },
    }
}

fn widen_at_arguments(schema: &mut Schema) {
    let Some(query) = schema
        .schema_definition
        .query
        .as_ref()
        .map(|q| q.name.clone())
    else {
        return;
    };
    let int = Name::new_unchecked("Int");
    let float = apollo_compiler::ast::Type::Named(Name::new_unchecked("Float"));
    if let Some(ExtendedType::Object(obj)) = schema.types.get_mut(&query) {
        let obj = obj.make_mut();
        for (_, def) in obj.fields.iter_mut() {
            let def = def.make_mut();
            for arg in def.arguments.iter_mut() {
                if arg.name == "at" && *arg.ty.inner_named_type() == int && !arg.ty.is_list() {
                    let arg = arg.make_mut();
                    let non_null = arg.ty.is_non_null();
                    arg.ty = apollo_compiler::Node::new(if non_null {
                        float.clone().non_null()
                    } else {
                        float.clone()
                    });
                }
            }
        }
    }
}

/// The 1-based line of a place in an SDL file, counting `\n` as every other config error
/// does (apollo-compiler's own line numbers also break at `\r`, vertical tab, form feed and
/// U+0085/2028/2029, which would name lines past the end of the file as editors count them).
fn sdl_line(
    sources: &apollo_compiler::parser::SourceMap,
    at: Option<apollo_compiler::parser::SourceSpan>,
) -> Option<usize> {
    let at = at?;
    let text = sources.get(&at.file_id())?.source_text();
    Some(line_of(text, at.offset()))
}

mod auth;
mod permissions;
pub use auth::{AuthSpec, CasbinFiles};
pub use permissions::PermissionsSpec;
mod migrations;
mod processors;
mod relays;
pub use migrations::MigrationSpec;
pub use processors::ProcessorSpec;
pub use relays::RelaySpec;
mod cache;
pub use cache::{CacheSpec, SharedCacheSpec};
mod server;
pub use server::{read_cert_chain, read_private_key, ServerSpec, TlsSpec};
mod rate_limit;
pub use rate_limit::{BucketSpec, RateLimitSpec, SharedLimitSpec};
mod persisted_queries;
pub use persisted_queries::{PersistedOperation, PersistedQueriesSpec, MANIFEST_FORMAT};

#[cfg(test)]
mod tests;
