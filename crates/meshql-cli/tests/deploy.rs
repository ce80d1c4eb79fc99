//! The deployment files (issue 22 §6): the Dockerfile, the compose files of the three
//! topologies (`deploy/compose/{monolith,cqrs,events}/compose.yaml`) and the Kubernetes
//! manifests (`deploy/k8s/`).
//!
//! No container runtime runs on these machines, so nothing here starts a container. The tests
//! parse every file, check the facts a deployment depends on (health and readiness checks on
//! the paths and ports meshql serves, non-root users, the autoscaler's target, every file a
//! container is given exists, credentials and host names that must agree do), and run
//! `meshql check` on every config a container would serve, as that container would see it: the
//! image's copy of `examples/` (the Dockerfile's `COPY`) with the compose file's bind mounts or
//! the ConfigMap's items laid over it, and the environment the file gives.

mod common;

use meshql_config::ResolvedConfig;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use yaml_rust2::{Yaml, YamlLoader};

/// The repository root.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository root")
}

fn read_text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn rel(path: &Path) -> String {
    path.strip_prefix(repo())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// Every YAML document of a file (a `---`-separated file has several).
fn load_yaml(path: &Path) -> Vec<Yaml> {
    YamlLoader::load_from_str(&read_text(path))
        .unwrap_or_else(|e| panic!("{} is not valid YAML: {e}", rel(path)))
}

/// A scalar as text (YAML reads `3035` as a number and `"3035"` as a string; both are text to
/// an environment variable).
fn scalar(y: &Yaml) -> Option<String> {
    match y {
        Yaml::String(s) | Yaml::Real(s) => Some(s.clone()),
        Yaml::Integer(i) => Some(i.to_string()),
        Yaml::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

fn text(y: &Yaml, what: &str) -> String {
    scalar(y).unwrap_or_else(|| panic!("{what}: expected a scalar, found {y:?}"))
}

fn list(y: &Yaml) -> &[Yaml] {
    y.as_vec().map(Vec::as_slice).unwrap_or(&[])
}

fn hash_entries(y: &Yaml) -> Vec<(String, &Yaml)> {
    y.as_hash()
        .map(|h| {
            h.iter()
                .map(|(k, v)| (text(k, "a mapping key"), v))
                .collect()
        })
        .unwrap_or_default()
}

// ------------------------------------------------------------------------------------------
// The Dockerfile
// ------------------------------------------------------------------------------------------

struct Stage {
    name: Option<String>,
    /// (INSTRUCTION, the rest of the line), continuation lines joined.
    instructions: Vec<(String, String)>,
}

impl Stage {
    fn all(&self, instruction: &str) -> Vec<&str> {
        self.instructions
            .iter()
            .filter(|(i, _)| i == instruction)
            .map(|(_, rest)| rest.as_str())
            .collect()
    }

    fn last(&self, instruction: &str) -> Option<&str> {
        self.all(instruction).last().copied()
    }
}

fn dockerfile_stages() -> Vec<Stage> {
    let path = repo().join("Dockerfile");
    let mut stages: Vec<Stage> = Vec::new();
    let mut line = String::new();
    for raw in read_text(&path).lines() {
        let trimmed = raw.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && line.is_empty()) {
            continue;
        }
        if let Some(head) = trimmed.strip_suffix('\\') {
            line.push_str(head);
            line.push(' ');
            continue;
        }
        line.push_str(trimmed);
        let full = std::mem::take(&mut line);
        let (instruction, rest) = full.split_once(char::is_whitespace).unwrap_or((&full, ""));
        let instruction = instruction.to_ascii_uppercase();
        let rest = rest.trim().to_owned();
        if instruction == "FROM" {
            let words: Vec<&str> = rest.split_whitespace().collect();
            let name = match words.as_slice() {
                [_, kw, name] if kw.eq_ignore_ascii_case("as") => Some((*name).to_owned()),
                [_] => None,
                _ => panic!("Dockerfile: cannot read `FROM {rest}`"),
            };
            stages.push(Stage {
                name,
                instructions: Vec::new(),
            });
        } else if let Some(stage) = stages.last_mut() {
            stage.instructions.push((instruction, rest));
        } else {
            assert!(
                instruction == "ARG",
                "Dockerfile: {instruction} before the first FROM"
            );
        }
    }
    assert!(line.is_empty(), "Dockerfile ends inside a continued line");
    stages
}

/// What the final stage of the Dockerfile makes of a container.
struct Image {
    entrypoint: Vec<String>,
    cmd: Vec<String>,
    env: BTreeMap<String, String>,
    user: String,
    expose: BTreeSet<u16>,
    /// `COPY <repo path> <image path>` of the final stage (files from the build context).
    layers: Vec<(String, PathBuf)>,
}

fn json_array(rest: &str, what: &str) -> Vec<String> {
    serde_json::from_str(rest).unwrap_or_else(|e| {
        panic!("Dockerfile {what} `{rest}` is not a JSON array (exec form): {e}")
    })
}

fn image() -> Image {
    let stages = dockerfile_stages();
    let last = stages.last().expect("the Dockerfile has a stage");
    let mut env = BTreeMap::new();
    for rest in last.all("ENV") {
        for pair in rest.split_whitespace() {
            let (k, v) = pair
                .split_once('=')
                .unwrap_or_else(|| panic!("Dockerfile: ENV `{rest}`: write ENV KEY=value"));
            env.insert(k.to_owned(), v.to_owned());
        }
    }
    let mut layers = Vec::new();
    for rest in last.all("COPY") {
        if rest.starts_with("--from") {
            continue;
        }
        let words: Vec<&str> = rest.split_whitespace().collect();
        let [src, dst] = words.as_slice() else {
            panic!("Dockerfile: COPY `{rest}`: one source and one destination expected")
        };
        layers.push(((*dst).to_owned(), repo().join(src)));
    }
    Image {
        entrypoint: json_array(last.last("ENTRYPOINT").expect("ENTRYPOINT"), "ENTRYPOINT"),
        cmd: json_array(last.last("CMD").expect("CMD"), "CMD"),
        env,
        user: last
            .last("USER")
            .expect("a USER in the final stage")
            .to_owned(),
        expose: last
            .all("EXPOSE")
            .iter()
            .flat_map(|r| r.split_whitespace())
            .map(|p| {
                p.trim_end_matches("/tcp")
                    .parse()
                    .expect("EXPOSE a port number")
            })
            .collect(),
        layers,
    }
}

#[test]
fn dockerfile_builds_in_one_stage_and_runs_the_binary_unprivileged_in_another() {
    let stages = dockerfile_stages();
    assert!(
        stages.len() >= 2,
        "a multi-stage build: {} stage(s)",
        stages.len()
    );
    let (build, runtime) = (&stages[0], stages.last().unwrap());
    let build_name = build.name.as_deref().expect("the build stage is named");
    let runs = build.all("RUN").join("\n");
    assert!(
        runs.contains("cargo build --release --locked -p meshql"),
        "the build stage builds the release binary from the lock file: {runs}"
    );
    assert!(runs.contains("cmake"), "librdkafka is built with cmake");
    // the build context the build stage copies: the workspace, its lock file and .cargo/
    let copied: Vec<&str> = build.all("COPY");
    for needed in [".cargo", "Cargo.toml", "Cargo.lock", "crates"] {
        assert!(
            copied
                .iter()
                .any(|c| c.split_whitespace().any(|w| w == needed)),
            "the build stage copies {needed}: {copied:?}"
        );
        assert!(repo().join(needed).exists(), "{needed} exists");
    }

    // the runtime stage: the binary from the build stage, on PATH, run by an unprivileged user
    let binary = runtime
        .all("COPY")
        .into_iter()
        .find(|c| c.starts_with(&format!("--from={build_name} ")))
        .expect("the runtime stage copies from the build stage");
    assert!(
        binary.ends_with(" /usr/local/bin/meshql"),
        "the binary goes on PATH: COPY {binary}"
    );
    let image = image();
    assert_eq!(image.entrypoint, ["meshql"], "ENTRYPOINT runs the binary");
    let uid = image.user.split(':').next().unwrap();
    let uid: u32 = uid.parse().unwrap_or_else(|_| {
        panic!(
            "USER {} should be numeric (Kubernetes' runAsNonRoot checks a numeric user)",
            image.user
        )
    });
    assert_ne!(uid, 0, "the image runs as a user other than root");
    assert!(
        runtime
            .all("RUN")
            .iter()
            .any(|r| r.contains(&format!("--uid {uid}"))),
        "the runtime stage creates user {uid}"
    );
    assert_eq!(
        image.env.get("MESHQL_DATA_DIR").map(String::as_str),
        Some("/var/lib/meshql"),
        "data goes to a directory of its own"
    );
    assert!(
        runtime
            .all("RUN")
            .iter()
            .any(|r| r.contains("install -d -o meshql -g meshql") && r.contains("/var/lib/meshql")),
        "the data directory belongs to the user the image runs as"
    );
    for port in [5088, 3034, 3035, 4055] {
        assert!(image.expose.contains(&port), "EXPOSE {port}");
    }
    for (dst, src) in &image.layers {
        assert!(src.exists(), "COPY source {} exists", rel(src));
        assert!(dst.starts_with('/'), "COPY to an absolute path: {dst}");
    }
}

#[test]
fn dockerignore_keeps_target_out_and_the_build_inputs_in() {
    let ignored: Vec<String> = read_text(&repo().join(".dockerignore"))
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect();
    for out in ["target", ".git"] {
        assert!(
            ignored.iter().any(|l| l == out),
            ".dockerignore lists {out}"
        );
    }
    let stages = dockerfile_stages();
    let inputs: Vec<String> = stages
        .iter()
        .flat_map(|s| s.all("COPY"))
        .filter(|c| !c.starts_with("--from"))
        .flat_map(|c| {
            let words: Vec<&str> = c.split_whitespace().collect();
            words[..words.len() - 1]
                .iter()
                .map(|w| w.trim_end_matches('/').to_owned())
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(inputs.iter().any(|i| i == "examples"));
    for input in &inputs {
        assert!(
            !ignored
                .iter()
                .any(|l| l.trim_start_matches('/').trim_end_matches('/') == input),
            ".dockerignore leaves out {input}, which the Dockerfile copies"
        );
    }
}

// ------------------------------------------------------------------------------------------
// A container's view: its file system, its command line, its environment
// ------------------------------------------------------------------------------------------

/// Copies a file or a tree, leaving out what .dockerignore leaves out of the image (data
/// directories and SQLite files a local run left in examples/).
fn copy_tree(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == "data" || name.contains(".db") {
                continue;
            }
            copy_tree(&entry.path(), &to.join(&name));
        }
    } else {
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, to)
            .unwrap_or_else(|e| panic!("copy {} to {}: {e}", from.display(), to.display()));
    }
}

/// A container's file system, laid out under a temporary directory: the image's layers, then
/// the mounts.
struct Rootfs(tempfile::TempDir);

impl Rootfs {
    fn of_image(image: &Image) -> Rootfs {
        let fs = Rootfs(tempfile::tempdir().unwrap());
        for (dst, src) in &image.layers {
            fs.put_host(dst, src);
        }
        fs
    }

    fn host(&self, container_path: &str) -> PathBuf {
        assert!(
            container_path.starts_with('/'),
            "an absolute path in the container: {container_path}"
        );
        self.0.path().join(container_path.trim_start_matches('/'))
    }

    fn put_host(&self, container_path: &str, src: &Path) {
        copy_tree(src, &self.host(container_path));
    }

    fn put_text(&self, container_path: &str, text: &str) {
        let to = self.host(container_path);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::write(to, text).unwrap();
    }
}

/// A container that runs `meshql serve`.
struct Container {
    /// How messages name it: `deploy/compose/cqrs/compose.yaml: meshql-read`.
    what: String,
    argv: Vec<String>,
    env: BTreeMap<String, String>,
    fs: Rootfs,
}

/// `meshql serve`'s command line.
struct Serve {
    config: String,
    role: Option<String>,
    port: Option<u16>,
    data_dir: Option<String>,
}

impl Container {
    fn serve(&self) -> Serve {
        let what = &self.what;
        let argv = &self.argv;
        assert!(
            argv.len() >= 2 && argv[0] == "meshql" && argv[1] == "serve",
            "{what}: runs `meshql serve`, not {argv:?}"
        );
        let mut serve = Serve {
            config: ".".into(),
            role: None,
            port: None,
            data_dir: None,
        };
        let mut rest = argv[2..].iter();
        while let Some(arg) = rest.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f, Some(v.to_owned())),
                _ => (arg.as_str(), None),
            };
            let mut value = || {
                inline
                    .clone()
                    .or_else(|| rest.next().cloned())
                    .unwrap_or_else(|| panic!("{what}: {flag} without a value"))
            };
            match flag {
                "--role" => serve.role = Some(value()),
                "--port" => serve.port = Some(value().parse().expect("--port N")),
                "--data-dir" => serve.data_dir = Some(value()),
                "--host" | "--workers" | "--log-level" | "--log-format" => {
                    value();
                }
                "--no-processors" => {}
                f if f.starts_with('-') => panic!("{what}: unknown option {f}"),
                _ => serve.config = arg.clone(),
            }
        }
        assert!(
            serve.config.starts_with('/'),
            "{what}: an absolute config path ({})",
            serve.config
        );
        serve
    }

    /// The config file's path in the laid-out file system.
    fn config_file(&self) -> PathBuf {
        let path = self.fs.host(&self.serve().config);
        assert!(
            path.exists(),
            "{}: the config {} is neither in the image nor mounted",
            self.what,
            self.serve().config
        );
        if path.is_dir() {
            path.join("meshql.toml")
        } else {
            path
        }
    }

    fn config(&self) -> ResolvedConfig {
        meshql_config::resolve::load_with_env(&self.config_file(), |k| self.env.get(k).cloned())
            .unwrap_or_else(|e| panic!("{}: the config does not load: {e}", self.what))
    }

    /// The port it listens on: `--port`, else MESHQL_PORT, else the config's.
    fn port(&self) -> u16 {
        self.serve()
            .port
            .or_else(|| {
                self.env
                    .get("MESHQL_PORT")
                    .map(|p| p.parse().expect("MESHQL_PORT"))
            })
            .unwrap_or_else(|| self.config().port)
    }

    fn role(&self) -> String {
        let role = self
            .serve()
            .role
            .or_else(|| self.env.get("MESHQL_ROLE").cloned())
            .unwrap_or_else(|| "all".into());
        assert!(
            ["all", "write", "read"].contains(&role.as_str()),
            "{}: role {role}",
            self.what
        );
        role
    }

    /// The data directory (container path): `--data-dir`, else the config's `data_dir`.
    fn data_dir(&self) -> String {
        if let Some(dir) = self.serve().data_dir {
            return dir;
        }
        let dir = self.config().data_dir;
        let dir = dir
            .strip_prefix(self.fs.0.path())
            .map(|d| format!("/{}", d.display()))
            .unwrap_or_else(|_| dir.display().to_string());
        assert!(
            dir.starts_with('/'),
            "{}: data_dir {dir} should be absolute (a directory of its own, not beside the config)",
            self.what
        );
        dir
    }

    fn uses_sqlite(&self) -> bool {
        self.config().storages.values().any(|s| s.kind == "sqlite")
    }

    /// `meshql check` on the config, in exactly the container's environment (the data
    /// directory moved into the laid-out file system).
    fn check(&self) {
        let mut env = self.env.clone();
        if let Some(dir) = env.get("MESHQL_DATA_DIR").filter(|d| d.starts_with('/')) {
            let host = self.fs.host(dir);
            std::fs::create_dir_all(&host).unwrap();
            env.insert("MESHQL_DATA_DIR".into(), host.display().to_string());
        }
        let out = Command::new(common::meshql_bin())
            .arg("check")
            .arg(self.config_file())
            .env_clear()
            .envs(&env)
            .stdin(Stdio::null())
            .output()
            .expect("run meshql check");
        assert!(
            out.status.success(),
            "{}: `meshql check {}` failed:\n{}",
            self.what,
            self.serve().config,
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains(": ok ("), "{}: {stdout}", self.what);
    }
}

/// The entities of a config as comparable lines: names, tables, paths, files (relative to
/// the config), root queries with their templates, resolvers with their targets.
fn entities(config: &ResolvedConfig) -> Vec<String> {
    let base = config.file.parent().unwrap();
    let relative = |p: &Path| p.strip_prefix(base).unwrap_or(p).display().to_string();
    let mut lines = Vec::new();
    for e in &config.entities {
        let name = &e.name;
        lines.push(format!(
            "{name}: storage {} table {} tokens {:?}",
            e.storage, e.table, e.tokens
        ));
        if let Some(r) = &e.rest {
            let schema = r.schema_file.as_deref().map(relative).unwrap_or_default();
            lines.push(format!("{name}: rest {} {schema}", r.path));
        }
        if let Some(g) = &e.graph {
            lines.push(format!(
                "{name}: graph {} {} type {}",
                g.path,
                relative(&g.sdl_file),
                g.entity_type
            ));
            for q in &g.queries {
                lines.push(format!(
                    "{name}: query {} vector {} {} {:?}",
                    q.name, q.vector, q.template.source, q.template.kind
                ));
            }
            for r in &g.resolvers {
                lines.push(format!(
                    "{name}: resolver {} key {} query {} vector {} {:?}",
                    r.field, r.key, r.query, r.vector, r.target
                ));
            }
        }
    }
    lines
}

fn processors(config: &ResolvedConfig) -> Vec<String> {
    config
        .processors
        .iter()
        .map(|p| format!("{} {} {}", p.name, p.kind, p.settings))
        .collect()
}

/// `scheme://user:password@host:port/path` → (user, password, host, port, path).
fn url_parts(url: &str) -> (String, String, String, u16, String) {
    let (_, rest) = url.split_once("://").expect("a URL with a scheme");
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (userinfo, hostport) = authority.rsplit_once('@').unwrap_or(("", authority));
    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let (host, port) = hostport.rsplit_once(':').expect("a URL with a port");
    (
        user.into(),
        password.into(),
        host.into(),
        port.parse().expect("a port number"),
        path.split('?').next().unwrap().into(),
    )
}

#[test]
fn farm_cqrs_declares_the_same_entities_on_sqlite_and_on_postgres() {
    let env = BTreeMap::from([
        ("DATABASE_URL", "postgres://u:p@primary:5432/db"),
        ("DATABASE_READ_URL", "postgres://u:p@standby:5432/db"),
    ]);
    let load = |name: &str| {
        meshql_config::resolve::load_with_env(
            &common::examples_dir().join("farm-cqrs").join(name),
            |k| env.get(k).map(|v| v.to_string()),
        )
        .unwrap_or_else(|e| panic!("examples/farm-cqrs/{name}: {e}"))
    };
    let (sqlite, postgres) = (load("meshql.toml"), load("meshql-postgres.toml"));
    assert_eq!(entities(&sqlite), entities(&postgres));
    assert_eq!(sqlite.port, postgres.port);
    assert_eq!(processors(&sqlite), processors(&postgres));
    let storage = |c: &ResolvedConfig| {
        c.storages
            .values()
            .map(|s| s.kind.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(storage(&sqlite), ["sqlite"]);
    assert_eq!(storage(&postgres), ["postgres"]);
    let pg = postgres.storages.values().next().unwrap();
    assert_eq!(pg.settings["url"], "postgres://u:p@primary:5432/db");
    assert_eq!(pg.settings["read_url"], "postgres://u:p@standby:5432/db");
    assert!(
        postgres.cache.is_none(),
        "meshql-postgres.toml runs without Redis"
    );
}

#[test]
fn farm_cqrs_on_postgres_with_redis_is_the_postgres_config_plus_a_shared_cache() {
    let env = BTreeMap::from([
        ("DATABASE_URL", "postgres://u:p@primary:5432/db"),
        ("DATABASE_READ_URL", "postgres://u:p@standby:5432/db"),
        ("REDIS_URL", "redis://cache:6379"),
    ]);
    let dir = common::examples_dir().join("farm-cqrs");
    let load = |name: &str| {
        meshql_config::resolve::load_with_env(&dir.join(name), |k| {
            env.get(k).map(|v| v.to_string())
        })
        .unwrap_or_else(|e| panic!("examples/farm-cqrs/{name}: {e}"))
    };
    let (postgres, redis) = (
        load("meshql-postgres.toml"),
        load("meshql-postgres-redis.toml"),
    );
    assert_eq!(entities(&postgres), entities(&redis));
    assert_eq!(processors(&postgres), processors(&redis));
    assert_eq!(
        (postgres.port, &postgres.data_dir),
        (redis.port, &redis.data_dir)
    );
    let storage = |c: &ResolvedConfig| {
        c.storages
            .iter()
            .map(|(name, s)| format!("{name} {} {}", s.kind, s.settings))
            .collect::<Vec<_>>()
    };
    assert_eq!(storage(&postgres), storage(&redis));
    assert_eq!(redis_cache_url(&redis), "redis://cache:6379");

    // REDIS_URL has no default: without it the file does not load (meshql-postgres.toml is
    // the one to serve without Redis)
    let without =
        meshql_config::resolve::load_with_env(&dir.join("meshql-postgres-redis.toml"), |k| {
            env.get(k)
                .filter(|_| k != "REDIS_URL")
                .map(|v| v.to_string())
        });
    let Err(error) = without else {
        panic!("examples/farm-cqrs/meshql-postgres-redis.toml loads without REDIS_URL")
    };
    assert!(error.to_string().contains("REDIS_URL"), "{error}");
}

/// The URL of a config's shared cache, which must be Redis.
fn redis_cache_url(config: &ResolvedConfig) -> String {
    let file = rel(&config.file);
    let cache = config
        .cache
        .as_ref()
        .unwrap_or_else(|| panic!("{file}: a [cache] block"));
    let shared = cache
        .shared
        .as_ref()
        .unwrap_or_else(|| panic!("{file}: [cache] redis = {{ … }}"));
    assert_eq!(shared.kind, "redis", "{file}");
    shared.settings["url"]
        .as_str()
        .unwrap_or_else(|| panic!("{file}: [cache] redis.url"))
        .to_owned()
}

/// A size as Redis reads it (`256mb`: 1024-based with a `b`, 1000-based without).
fn redis_bytes(size: &str) -> u64 {
    let lower = size.to_ascii_lowercase();
    let digits = lower.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = match &lower[digits.len()..] {
        "" | "b" => 1,
        "k" => 1000,
        "kb" => 1 << 10,
        "m" => 1_000_000,
        "mb" => 1 << 20,
        "g" => 1_000_000_000,
        "gb" => 1 << 30,
        other => panic!("`{size}`: unknown unit {other}"),
    };
    digits.parse::<u64>().expect("a number of bytes") * unit
}

/// Checks a `redis-server` command line for what meshql's shared read cache needs of its
/// Redis (meshql-cache-redis): tags have no expiry, so only keys with one (the answers) may
/// be evicted (`noeviction` or a `volatile-*` policy); nothing is kept on disk (a snapshot
/// restored would bring back tags older than the writes made since); memory is bounded.
/// Returns `--maxmemory` in bytes.
fn check_redis_cache_server(argv: &[String], what: &str) -> u64 {
    assert_eq!(
        argv.first().map(String::as_str),
        Some("redis-server"),
        "{what}: runs redis-server: {argv:?}"
    );
    let mut settings = BTreeMap::new();
    let mut rest = argv[1..].iter();
    while let Some(flag) = rest.next() {
        let name = flag
            .strip_prefix("--")
            .unwrap_or_else(|| panic!("{what}: `{flag}` is not a --setting (no config file)"));
        let value = rest
            .next()
            .unwrap_or_else(|| panic!("{what}: --{name} without a value"));
        assert!(
            settings.insert(name.to_owned(), value.clone()).is_none(),
            "{what}: --{name} given twice"
        );
    }
    let get = |name: &str| settings.get(name).map(String::as_str);
    let policy = get("maxmemory-policy")
        .unwrap_or_else(|| panic!("{what}: --maxmemory-policy (say which keys may be evicted)"));
    assert!(
        policy == "noeviction" || policy.starts_with("volatile-"),
        "{what}: --maxmemory-policy {policy} could evict the cache's tags (keys without an expiry)"
    );
    assert_eq!(
        get("save"),
        Some(""),
        "{what}: no RDB snapshots (--save \"\")"
    );
    assert_eq!(get("appendonly"), Some("no"), "{what}: no append-only file");
    let maxmemory = redis_bytes(get("maxmemory").unwrap_or_else(|| panic!("{what}: --maxmemory")));
    assert!(maxmemory > 0, "{what}: --maxmemory 0 is no bound");
    maxmemory
}

#[test]
fn the_image_serves_egg_economy_by_default() {
    let image = image();
    let container = Container {
        what: "Dockerfile (CMD)".into(),
        argv: image.entrypoint.iter().chain(&image.cmd).cloned().collect(),
        env: image.env.clone(),
        fs: Rootfs::of_image(&image),
    };
    container.check();
    assert_eq!(container.port(), 5088);
    assert!(image.expose.contains(&container.port()));
    assert_eq!(container.data_dir(), "/var/lib/meshql");
}

// ------------------------------------------------------------------------------------------
// Compose
// ------------------------------------------------------------------------------------------

/// Compose's variable interpolation with every variable unset: `${VAR:-default}` and
/// `${VAR-default}` take the default, `$$` is a `$`. A variable without a default is an error
/// here, so that `docker compose up` works without an .env file.
fn interpolate(value: &str, what: &str) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        rest = &rest[i + 1..];
        if let Some(r) = rest.strip_prefix('$') {
            out.push('$');
            rest = r;
        } else if let Some(r) = rest.strip_prefix('{') {
            let end = r
                .find('}')
                .unwrap_or_else(|| panic!("{what}: unclosed ${{ in {value}"));
            let inner = &r[..end];
            let default = inner
                .split_once(":-")
                .or_else(|| inner.split_once('-'))
                .map(|(_, d)| d)
                .unwrap_or_else(|| {
                    panic!("{what}: ${{{inner}}} has no default (write ${{{inner}:-…}})")
                });
            out.push_str(default);
            rest = &r[end + 1..];
        } else {
            panic!("{what}: `$` not followed by {{ or $ in {value} (write $$ for a literal $)");
        }
    }
    out.push_str(rest);
    out
}

struct Compose {
    path: PathBuf,
    doc: Yaml,
}

fn compose_files() -> Vec<Compose> {
    let dir = repo().join("deploy/compose");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path().join("compose.yaml"))
        .filter(|p| p.exists())
        .collect();
    files.sort();
    let names: Vec<String> = files
        .iter()
        .map(|p| {
            p.parent()
                .unwrap()
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(
        names,
        ["cqrs", "events", "monolith"],
        "the three topologies"
    );
    files
        .into_iter()
        .map(|path| {
            let mut docs = load_yaml(&path);
            assert_eq!(docs.len(), 1, "{}: one document", rel(&path));
            Compose {
                path,
                doc: docs.remove(0),
            }
        })
        .collect()
}

fn compose(topology: &str) -> Compose {
    compose_files()
        .into_iter()
        .find(|c| c.path.parent().unwrap().ends_with(topology))
        .unwrap()
}

impl Compose {
    fn dir(&self) -> &Path {
        self.path.parent().unwrap()
    }

    fn what(&self, service: &str) -> String {
        format!("{}: {service}", rel(&self.path))
    }

    fn services(&self) -> Vec<(String, &Yaml)> {
        let services = hash_entries(&self.doc["services"]);
        assert!(!services.is_empty(), "{}: services", rel(&self.path));
        services
    }

    fn service(&self, name: &str) -> &Yaml {
        &self.doc["services"][name]
    }

    fn value(&self, y: &Yaml, service: &str) -> String {
        let what = self.what(service);
        interpolate(&text(y, &what), &what)
    }

    /// A string or a list of strings (`command`, `entrypoint`, `healthcheck.test`).
    fn words(&self, y: &Yaml, service: &str) -> Option<Vec<String>> {
        match y {
            Yaml::BadValue | Yaml::Null => None,
            Yaml::Array(items) => Some(items.iter().map(|i| self.value(i, service)).collect()),
            other => Some(
                self.value(other, service)
                    .split_whitespace()
                    .map(str::to_owned)
                    .collect(),
            ),
        }
    }

    fn environment(&self, service: &str) -> BTreeMap<String, String> {
        let env = &self.service(service)["environment"];
        match env {
            Yaml::BadValue | Yaml::Null => BTreeMap::new(),
            Yaml::Array(items) => items
                .iter()
                .map(|i| {
                    let kv = self.value(i, service);
                    let (k, v) = kv.split_once('=').expect("KEY=value");
                    (k.to_owned(), v.to_owned())
                })
                .collect(),
            _ => hash_entries(env)
                .into_iter()
                .map(|(k, v)| (k, self.value(v, service)))
                .collect(),
        }
    }

    /// (source, target, read-only): a bind mount's source is a host path (checked to exist,
    /// relative to the compose file), a named volume's is its name.
    fn volumes(&self, service: &str) -> Vec<(String, String, bool)> {
        list(&self.service(service)["volumes"])
            .iter()
            .map(|v| {
                let spec = self.value(v, service);
                let parts: Vec<&str> = spec.split(':').collect();
                let (source, target, ro) = match parts.as_slice() {
                    [s, t] => (*s, *t, false),
                    [s, t, mode] => (*s, *t, mode.split(',').any(|m| m == "ro")),
                    _ => panic!("{}: volume `{spec}`", self.what(service)),
                };
                (source.to_owned(), target.to_owned(), ro)
            })
            .collect()
    }

    fn is_bind(source: &str) -> bool {
        source.starts_with('.') || source.starts_with('/')
    }

    /// Whether the service runs the image the repository's Dockerfile builds.
    fn is_meshql(&self, service: &str) -> bool {
        let svc = self.service(service);
        let build = &svc["build"];
        if build.is_badvalue() {
            return false;
        }
        let context = self
            .dir()
            .join(text(&build["context"], "build.context"))
            .canonicalize()
            .unwrap();
        assert_eq!(
            context,
            repo(),
            "{}: builds from the repository root",
            self.what(service)
        );
        assert_eq!(
            text(&build["dockerfile"], "build.dockerfile"),
            "Dockerfile",
            "{}",
            self.what(service)
        );
        true
    }

    /// The meshql container of a service: the image's layers with the bind mounts laid over
    /// them, `command` in place of the image's CMD, the image's ENV and the service's
    /// environment.
    fn container(&self, service: &str, image: &Image) -> Container {
        let svc = self.service(service);
        let fs = Rootfs::of_image(image);
        for (source, target, _) in self.volumes(service) {
            if Self::is_bind(&source) {
                fs.put_host(&target, &self.dir().join(&source));
            }
        }
        let entrypoint = self
            .words(&svc["entrypoint"], service)
            .unwrap_or_else(|| image.entrypoint.clone());
        let command = self
            .words(&svc["command"], service)
            .unwrap_or_else(|| image.cmd.clone());
        let mut env = image.env.clone();
        env.extend(self.environment(service));
        Container {
            what: self.what(service),
            argv: entrypoint.into_iter().chain(command).collect(),
            env,
            fs,
        }
    }

    /// The URL a service's health check asks for: (port, path).
    fn health_url(&self, service: &str) -> (u16, String) {
        let test = self
            .words(&self.service(service)["healthcheck"]["test"], service)
            .unwrap_or_else(|| panic!("{}: a healthcheck", self.what(service)));
        assert!(
            test[0] == "CMD" || test[0] == "CMD-SHELL",
            "{}: healthcheck test {test:?}",
            self.what(service)
        );
        let url = test
            .iter()
            .find_map(|w| w.find("http://").map(|i| &w[i..]))
            .unwrap_or_else(|| panic!("{}: the health check asks a URL", self.what(service)));
        let (_, _, host, port, path) = url_parts(&format!("http://_@{}", &url[7..]));
        assert!(
            ["127.0.0.1", "localhost"].contains(&host.as_str()),
            "{}: the health check asks the container itself ({url})",
            self.what(service)
        );
        (port, format!("/{path}"))
    }

    /// The container side of each published port.
    fn ports(&self, service: &str) -> Vec<u16> {
        list(&self.service(service)["ports"])
            .iter()
            .map(|p| {
                let spec = self.value(p, service);
                spec.rsplit(':')
                    .next()
                    .unwrap()
                    .trim_end_matches("/tcp")
                    .parse()
                    .unwrap_or_else(|_| panic!("{}: port `{spec}`", self.what(service)))
            })
            .collect()
    }

    fn depends_on(&self, service: &str) -> BTreeMap<String, String> {
        let deps = &self.service(service)["depends_on"];
        match deps {
            Yaml::Array(items) => items
                .iter()
                .map(|i| (text(i, "depends_on"), "service_started".into()))
                .collect(),
            _ => hash_entries(deps)
                .into_iter()
                .map(|(k, v)| (k, text(&v["condition"], "depends_on.condition")))
                .collect(),
        }
    }
}

#[test]
fn every_compose_service_is_healthy_when_meshql_is_ready_and_every_config_checks() {
    let image = image();
    for compose in compose_files() {
        let named_volumes: BTreeSet<String> = hash_entries(&compose.doc["volumes"])
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        let services = compose.services();
        let names: BTreeSet<String> = services.iter().map(|(n, _)| n.clone()).collect();
        let mut meshql = 0;
        let mut sqlite_data_volumes = BTreeSet::new();
        for (name, svc) in &services {
            let what = compose.what(name);
            // every file mounted exists; every named volume is declared
            for (source, _, _) in compose.volumes(name) {
                if Compose::is_bind(&source) {
                    assert!(
                        compose.dir().join(&source).exists(),
                        "{what}: mounts {source}, which does not exist"
                    );
                } else {
                    assert!(
                        named_volumes.contains(&source),
                        "{what}: volume {source} is not declared"
                    );
                }
            }
            // whatever waits for a service's health can: it has a health check
            for (dep, condition) in compose.depends_on(name) {
                assert!(
                    names.contains(&dep),
                    "{what}: depends on {dep}, not a service"
                );
                if condition == "service_healthy" {
                    assert!(
                        !compose.service(&dep)["healthcheck"].is_badvalue(),
                        "{what}: waits for {dep} to be healthy, which has no healthcheck"
                    );
                }
            }
            // every value interpolates without an .env file
            let _ = compose.environment(name);
            let _ = compose.words(&svc["command"], name);
            if !compose.is_meshql(name) {
                assert!(
                    scalar(&svc["image"]).is_some_and(|i| i.contains(':')),
                    "{what}: a pinned image"
                );
                continue;
            }
            meshql += 1;
            let container = compose.container(name, &image);
            container.check();
            let port = container.port();
            let (health_port, health_path) = compose.health_url(name);
            assert_eq!(
                health_port, port,
                "{what}: the health check asks meshql's port"
            );
            assert!(
                ["/ready", "/health"].contains(&health_path.as_str()),
                "{what}: the health check asks /ready or /health, not {health_path}"
            );
            assert_eq!(
                compose.ports(name),
                [port],
                "{what}: publishes meshql's port"
            );
            assert!(
                image.expose.contains(&port),
                "{what}: the image EXPOSEs {port}"
            );
            // SQLite lives in one process: its data directory is a named volume of its own
            let data_dir = container.data_dir();
            let data_volume = compose
                .volumes(name)
                .into_iter()
                .find(|(_, target, _)| *target == data_dir);
            if container.uses_sqlite() {
                let (source, _, ro) = data_volume
                    .clone()
                    .unwrap_or_else(|| panic!("{what}: SQLite data on a volume"));
                assert!(!ro && !Compose::is_bind(&source), "{what}: a named volume");
                assert!(
                    sqlite_data_volumes.insert(source.clone()),
                    "{what}: SQLite volume {source} shared by two services"
                );
            }
            if container.role() == "write" || container.role() == "all" {
                // the change log (and the positions of relays and processors) outlive the
                // container
                assert!(
                    data_volume.is_some(),
                    "{what}: the {} role keeps its data directory on a volume",
                    container.role()
                );
            }
        }
        assert!(meshql >= 1, "{}: a meshql service", rel(&compose.path));
    }
}

#[test]
fn the_monolith_compose_serves_egg_economy_on_sqlite() {
    let compose = compose("monolith");
    let container = compose.container("meshql", &image());
    assert_eq!(container.serve().config, "/opt/meshql/examples/egg-economy");
    assert_eq!(container.role(), "all");
    assert_eq!(container.port(), 5088);
    let config = container.config();
    assert_eq!(config.entities.len(), 13);
    assert!(config.storages.values().all(|s| s.kind == "sqlite"));
    assert_eq!(compose.services().len(), 1, "one process, nothing else");
}

#[test]
fn the_cqrs_compose_writes_on_the_primary_and_reads_on_its_standby() {
    let compose = compose("cqrs");
    let image = image();
    let meshql: Vec<String> = compose
        .services()
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| compose.is_meshql(n))
        .collect();
    assert_eq!(meshql, ["meshql-write", "meshql-read"]);
    let write = compose.container("meshql-write", &image);
    let read = compose.container("meshql-read", &image);
    assert_eq!((write.role(), read.role()), ("write".into(), "read".into()));
    assert_eq!((write.port(), read.port()), (3034, 3035));
    for c in [&write, &read] {
        assert_eq!(
            c.serve().config,
            "/opt/meshql/examples/farm-cqrs/meshql-postgres-redis.toml"
        );
        assert_eq!(
            c.config().storages.values().next().unwrap().kind,
            "postgres"
        );
    }
    // relationship fields: the read service calls itself
    assert_eq!(
        read.env.get("READ_SERVICE_URL").map(String::as_str),
        Some("http://localhost:3035")
    );
    let deps = compose.depends_on("meshql-read");
    assert_eq!(deps["meshql-write"], "service_healthy");

    // the primary: its credentials are the ones meshql connects with; the standby: copies it
    let primary_env = compose.environment("postgres-primary");
    let standby_env = compose.environment("postgres-standby");
    for (service, c) in [("meshql-write", &write), ("meshql-read", &read)] {
        assert!(
            compose
                .depends_on(service)
                .keys()
                .any(|d| d.starts_with("postgres-")),
            "{}: waits for PostgreSQL",
            c.what
        );
        for (var, host) in [
            ("DATABASE_URL", "postgres-primary"),
            ("DATABASE_READ_URL", "postgres-standby"),
        ] {
            let (user, password, h, port, db) = url_parts(&c.env[var]);
            assert_eq!(h, host, "{}: {var} names the {host} service", c.what);
            assert_eq!(port, 5432);
            assert_eq!(user, primary_env["POSTGRES_USER"], "{}: {var} user", c.what);
            assert_eq!(
                password, primary_env["POSTGRES_PASSWORD"],
                "{}: {var}",
                c.what
            );
            assert_eq!(db, primary_env["POSTGRES_DB"], "{}: {var} database", c.what);
        }
    }
    assert_eq!(standby_env["PRIMARY_HOST"], "postgres-primary");
    assert_eq!(
        standby_env["PGPASSWORD"], primary_env["REPLICATION_PASSWORD"],
        "the standby connects with the replication role's password"
    );
    assert_eq!(
        compose.depends_on("postgres-standby")["postgres-primary"],
        "service_healthy"
    );
    assert_eq!(
        compose.service("postgres-primary")["image"],
        compose.service("postgres-standby")["image"],
        "primary and standby run one PostgreSQL version"
    );

    // the scripts: valid shell, and they agree on the role and the slot
    let mounted = |service: &str, target_part: &str| {
        let (source, _, _) = compose
            .volumes(service)
            .into_iter()
            .find(|(_, t, _)| t.contains(target_part))
            .unwrap_or_else(|| panic!("{service} mounts a {target_part} script"));
        compose.dir().join(source)
    };
    let init = mounted("postgres-primary", "/docker-entrypoint-initdb.d/");
    let entry = mounted("postgres-standby", "standby-entrypoint.sh");
    assert_eq!(
        compose.words(
            &compose.service("postgres-standby")["entrypoint"],
            "postgres-standby"
        ),
        Some(vec![
            "bash".to_owned(),
            "/usr/local/bin/standby-entrypoint.sh".to_owned()
        ])
    );
    for script in [&init, &entry] {
        let out = Command::new("bash").arg("-n").arg(script).output().unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            rel(script),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (init, entry) = (read_text(&init), read_text(&entry));
    assert!(init.contains("CREATE ROLE replicator WITH REPLICATION LOGIN"));
    assert!(init.contains("host replication replicator all scram-sha-256"));
    assert!(init.contains("pg_create_physical_replication_slot('standby1')"));
    assert!(entry.contains("--username=replicator"));
    assert!(entry.contains("--slot=standby1"));
    assert!(entry.contains("--write-recovery-conf"));
    assert!(entry.contains("exec docker-entrypoint.sh postgres"));
}

#[test]
fn the_cqrs_compose_shares_one_redis_that_never_evicts_a_tag_and_keeps_nothing_on_disk() {
    let compose = compose("cqrs");
    let image = image();
    let what = compose.what("redis");
    let redis = compose.service("redis");
    let redis_image = text(&redis["image"], &what);
    assert!(redis_image.starts_with("redis:7"), "{what}: {redis_image}");
    let argv = compose
        .words(&redis["command"], "redis")
        .unwrap_or_else(|| panic!("{what}: a command with the cache's settings"));
    check_redis_cache_server(&argv, &what);
    // nothing persisted, and no password: not published on the host either
    assert!(compose.volumes("redis").is_empty(), "{what}: no volume");
    assert!(
        compose.ports("redis").is_empty(),
        "{what}: no published port"
    );
    let test = compose
        .words(&redis["healthcheck"]["test"], "redis")
        .unwrap_or_else(|| panic!("{what}: a healthcheck"));
    assert!(
        test.join(" ").contains("redis-cli ping"),
        "{what}: healthcheck {test:?}"
    );

    // both meshql services name it (REDIS_URL, in the config's [cache] redis), wait for it,
    // and so share their tags: a write acknowledged by one invalidates the other's answers
    for service in ["meshql-write", "meshql-read"] {
        let c = compose.container(service, &image);
        let url = c
            .env
            .get("REDIS_URL")
            .unwrap_or_else(|| panic!("{}: REDIS_URL", c.what));
        assert_eq!(url, "redis://redis:6379", "{}", c.what);
        assert_eq!(
            redis_cache_url(&c.config()),
            *url,
            "{}: the config reads REDIS_URL",
            c.what
        );
        let (_, _, host, port, _) = url_parts(url);
        assert_eq!((host.as_str(), port), ("redis", 6379), "{}", c.what);
        assert_eq!(
            compose.depends_on(service).get("redis").map(String::as_str),
            Some("service_healthy"),
            "{}: waits for Redis",
            c.what
        );
    }
}

#[test]
fn the_events_compose_relays_to_its_kafka_broker() {
    let compose = compose("events");
    let container = compose.container("meshql", &image());
    let config = container.config();
    assert_eq!(container.port(), 4055);
    // the mounted config is the example's, plus the relay
    let example =
        meshql_config::resolve::load_with_env(&common::examples_dir().join("events"), |k| {
            container.env.get(k).cloned()
        })
        .expect("examples/events");
    assert_eq!(entities(&example), entities(&config));
    assert_eq!(processors(&example), processors(&config));
    assert!(example.changes.relays.is_empty());
    assert!(config.changes.config.enabled);
    let [relay] = config.changes.relays.as_slice() else {
        panic!("one relay: {:?}", config.changes.relays.len())
    };
    assert_eq!(relay.kind, "kafka");
    let brokers = relay.settings["brokers"].as_str().unwrap().to_owned();
    let (host, port) = brokers.split_once(':').unwrap();
    let kafka = compose.environment(host);
    assert!(
        kafka["KAFKA_ADVERTISED_LISTENERS"]
            .split(',')
            .any(|l| l.ends_with(&format!("://{host}:{port}"))),
        "the broker advertises {brokers}: {}",
        kafka["KAFKA_ADVERTISED_LISTENERS"]
    );
    assert!(kafka["KAFKA_PROCESS_ROLES"].contains("controller"), "KRaft");
    assert_eq!(kafka["KAFKA_AUTO_CREATE_TOPICS_ENABLE"], "true");
    assert!(text(&compose.service(host)["image"], "image").starts_with("apache/kafka:"));
}

// ------------------------------------------------------------------------------------------
// Kubernetes
// ------------------------------------------------------------------------------------------

struct Manifests {
    /// (file, document) of every document of every YAML file in deploy/k8s.
    docs: Vec<(PathBuf, Yaml)>,
}

fn manifests() -> Manifests {
    let dir = repo().join("deploy/k8s");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    let mut docs = Vec::new();
    for file in files {
        for doc in load_yaml(&file) {
            assert!(
                doc["kind"].as_str().is_some(),
                "{}: every document has a kind",
                rel(&file)
            );
            docs.push((file.clone(), doc));
        }
    }
    Manifests { docs }
}

impl Manifests {
    fn of_kind(&self, kind: &str) -> Vec<(&Path, &Yaml)> {
        self.docs
            .iter()
            .filter(|(_, d)| d["kind"].as_str() == Some(kind))
            .map(|(f, d)| (f.as_path(), d))
            .collect()
    }

    fn named(&self, kind: &str, name: &str) -> &Yaml {
        self.of_kind(kind)
            .into_iter()
            .find(|(_, d)| d["metadata"]["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("no {kind} {name} in deploy/k8s"))
            .1
    }

    /// The value an `env` entry takes: `value`, or a key of a ConfigMap or of a Secret (the
    /// Secret from secret.example.yaml, whose values stand for the real ones).
    fn env_value(&self, entry: &Yaml, what: &str) -> String {
        if let Some(v) = scalar(&entry["value"]) {
            return v;
        }
        let from = &entry["valueFrom"];
        for (kind, reference, data) in [
            ("Secret", "secretKeyRef", "stringData"),
            ("ConfigMap", "configMapKeyRef", "data"),
        ] {
            let r = &from[reference];
            if !r.is_badvalue() {
                let name = text(&r["name"], what);
                let key = text(&r["key"], what);
                return scalar(&self.named(kind, &name)[data][key.as_str()])
                    .unwrap_or_else(|| panic!("{what}: {kind} {name} has no key {key}"));
            }
        }
        panic!("{what}: env entry {entry:?}")
    }
}

/// A Deployment's meshql container, as the pod would run it.
fn k8s_container(m: &Manifests, file: &Path, deployment: &Yaml, image: &Image) -> Container {
    let name = text(&deployment["metadata"]["name"], "metadata.name");
    let what = format!("{}: Deployment {name}", rel(file));
    let pod = &deployment["spec"]["template"]["spec"];
    let containers = list(&pod["containers"]);
    assert_eq!(containers.len(), 1, "{what}: one container");
    let c = &containers[0];
    assert!(
        text(&c["image"], "image").starts_with("meshql"),
        "{what}: the meshql image"
    );
    let words = |y: &Yaml| -> Option<Vec<String>> {
        y.as_vec()
            .map(|v| v.iter().map(|w| text(w, &what)).collect())
    };
    let entrypoint = words(&c["command"]).unwrap_or_else(|| image.entrypoint.clone());
    let args = words(&c["args"]).unwrap_or_else(|| image.cmd.clone());
    let mut env = image.env.clone();
    assert!(
        c["envFrom"].is_badvalue(),
        "{what}: envFrom is not read here"
    );
    for entry in list(&c["env"]) {
        env.insert(
            text(&entry["name"], &what),
            m.env_value(entry, &format!("{what}: env")),
        );
    }
    // the file system: the image, then each volume mount
    let fs = Rootfs::of_image(image);
    let volumes: BTreeMap<String, &Yaml> = list(&pod["volumes"])
        .iter()
        .map(|v| (text(&v["name"], &what), v))
        .collect();
    for mount in list(&c["volumeMounts"]) {
        let vname = text(&mount["name"], &what);
        let at = text(&mount["mountPath"], &what);
        let volume = volumes
            .get(&vname)
            .unwrap_or_else(|| panic!("{what}: mounts volume {vname}, which the pod lacks"));
        assert!(
            mount["subPath"].is_badvalue(),
            "{what}: subPath is not read here"
        );
        let cm = &volume["configMap"];
        if cm.is_badvalue() {
            std::fs::create_dir_all(fs.host(&at)).unwrap();
            continue;
        }
        let cm_name = text(&cm["name"], &what);
        let data = &m.named("ConfigMap", &cm_name)["data"];
        let items: Vec<(String, String)> = if cm["items"].is_badvalue() {
            hash_entries(data)
                .into_iter()
                .map(|(k, _)| (k.clone(), k))
                .collect()
        } else {
            list(&cm["items"])
                .iter()
                .map(|i| (text(&i["key"], &what), text(&i["path"], &what)))
                .collect()
        };
        for (key, path) in items {
            let content = scalar(&data[key.as_str()])
                .unwrap_or_else(|| panic!("{what}: ConfigMap {cm_name} has no key {key}"));
            fs.put_text(&format!("{at}/{path}"), &content);
        }
    }
    Container {
        what,
        argv: entrypoint.into_iter().chain(args).collect(),
        env,
        fs,
    }
}

/// A probe's or a Service's port: a number, or the name of a container port.
fn resolve_port(port: &Yaml, container: &Yaml, what: &str) -> u16 {
    if let Some(n) = port.as_i64() {
        return n as u16;
    }
    let name = text(port, what);
    list(&container["ports"])
        .iter()
        .find(|p| p["name"].as_str() == Some(name.as_str()))
        .and_then(|p| p["containerPort"].as_i64())
        .unwrap_or_else(|| panic!("{what}: no container port named {name}")) as u16
}

/// The image of a Deployment's (first) container.
fn deployment_image(deployment: &Yaml) -> String {
    text(
        &deployment["spec"]["template"]["spec"]["containers"][0]["image"],
        "image",
    )
}

fn meshql_deployments(m: &Manifests) -> Vec<(&Path, &Yaml)> {
    let deployments: Vec<(&Path, &Yaml)> = m
        .of_kind("Deployment")
        .into_iter()
        .filter(|(_, d)| deployment_image(d).starts_with("meshql"))
        .collect();
    assert_eq!(deployments.len(), 2, "a write and a read Deployment");
    deployments
}

/// Bytes of a Kubernetes quantity (`512Mi`, `1Gi`, `500M`).
fn k8s_bytes(quantity: &str) -> u64 {
    let digits = quantity.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit: u64 = match &quantity[digits.len()..] {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "k" => 1000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        other => panic!("`{quantity}`: unit {other} is not read here"),
    };
    digits.parse::<u64>().expect("a quantity") * unit
}

#[test]
fn every_k8s_deployment_is_probed_unprivileged_bounded_and_serves_a_config_that_checks() {
    let m = manifests();
    let image = image();
    let image_uid: i64 = image.user.split(':').next().unwrap().parse().unwrap();
    for (file, deployment) in meshql_deployments(&m) {
        let container = k8s_container(&m, file, deployment, &image);
        let what = container.what.clone();
        container.check();
        let port = container.port();
        assert!(
            image.expose.contains(&port),
            "{what}: the image EXPOSEs {port}"
        );
        let pod = &deployment["spec"]["template"]["spec"];
        let c = &list(&pod["containers"])[0];
        let ports: Vec<u16> = list(&c["ports"])
            .iter()
            .map(|p| p["containerPort"].as_i64().unwrap() as u16)
            .collect();
        assert_eq!(ports, [port], "{what}: declares the port meshql serves");

        // metrics scraped where meshql serves them
        let annotations = &deployment["spec"]["template"]["metadata"]["annotations"];
        if !annotations.is_badvalue() {
            assert_eq!(
                scalar(&annotations["prometheus.io/port"]),
                Some(port.to_string()),
                "{what}: prometheus.io/port"
            );
            assert_eq!(
                annotations["prometheus.io/path"].as_str(),
                Some("/metrics"),
                "{what}: prometheus.io/path"
            );
        }

        // readiness on /ready, liveness on /health, both on that port
        for (probe, path) in [("readinessProbe", "/ready"), ("livenessProbe", "/health")] {
            let get = &c[probe]["httpGet"];
            assert_eq!(get["path"].as_str(), Some(path), "{what}: {probe}");
            assert_eq!(
                resolve_port(&get["port"], c, &what),
                port,
                "{what}: {probe} port"
            );
        }

        // not root: the pod says so, with the image's user
        let psc = &pod["securityContext"];
        let csc = &c["securityContext"];
        assert_eq!(
            psc["runAsNonRoot"].as_bool(),
            Some(true),
            "{what}: runAsNonRoot"
        );
        assert_eq!(
            psc["runAsUser"].as_i64(),
            Some(image_uid),
            "{what}: the image's user"
        );
        assert_eq!(
            psc["fsGroup"].as_i64(),
            Some(image_uid),
            "{what}: volumes writable"
        );
        assert_eq!(
            csc["allowPrivilegeEscalation"].as_bool(),
            Some(false),
            "{what}"
        );
        assert_eq!(
            csc["capabilities"]["drop"][0].as_str(),
            Some("ALL"),
            "{what}"
        );
        assert_eq!(
            csc["readOnlyRootFilesystem"].as_bool(),
            Some(true),
            "{what}"
        );
        // ... so the data directory is a writable mount
        let data_dir = container.data_dir();
        let data_mount = list(&c["volumeMounts"])
            .iter()
            .find(|v| v["mountPath"].as_str() == Some(data_dir.as_str()))
            .unwrap_or_else(|| panic!("{what}: a volume at the data directory {data_dir}"));
        assert_ne!(
            data_mount["readOnly"].as_bool(),
            Some(true),
            "{what}: data writable"
        );

        // bounded: requests (the HPA's measure) and a memory limit
        let resources = &c["resources"];
        for key in ["cpu", "memory"] {
            assert!(
                scalar(&resources["requests"][key]).is_some(),
                "{what}: requests.{key}"
            );
        }
        assert!(
            scalar(&resources["limits"]["memory"]).is_some(),
            "{what}: limits.memory"
        );

        // SQLite cannot be shared by pods: one replica on a claim of its own
        if container.uses_sqlite() {
            assert_eq!(
                deployment["spec"]["replicas"].as_i64(),
                Some(1),
                "{what}: SQLite"
            );
            let volume = list(&pod["volumes"])
                .iter()
                .find(|v| v["name"] == data_mount["name"])
                .unwrap();
            assert!(
                !volume["persistentVolumeClaim"].is_badvalue(),
                "{what}: SQLite data on a PersistentVolumeClaim"
            );
        }
        // every file the config names came from the ConfigMap or the image (check passed);
        // the config itself is the ConfigMap's
        assert_eq!(
            container.serve().config,
            "/etc/meshql/meshql.toml",
            "{what}"
        );
    }
}

#[test]
fn the_k8s_write_deployment_is_one_pod_and_the_hpa_scales_the_read_one() {
    let m = manifests();
    let image = image();
    let mut by_role = BTreeMap::new();
    for (file, d) in meshql_deployments(&m) {
        let c = k8s_container(&m, file, d, &image);
        by_role.insert(c.role(), (d, c));
    }
    let roles: Vec<&String> = by_role.keys().collect();
    assert_eq!(roles, ["read", "write"]);
    let (write, write_c) = &by_role["write"];
    let (read, read_c) = &by_role["read"];
    assert_eq!((write_c.port(), read_c.port()), (3034, 3035));

    // the write role: one process, replaced (not rolled) so two never run at once, its change
    // log on a claim
    assert_eq!(write["spec"]["replicas"].as_i64(), Some(1));
    assert_eq!(write["spec"]["strategy"]["type"].as_str(), Some("Recreate"));
    let claims: Vec<String> = list(&write["spec"]["template"]["spec"]["volumes"])
        .iter()
        .filter_map(|v| {
            v["persistentVolumeClaim"]["claimName"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(claims.len(), 1, "the write pod's data on a claim");
    m.named("PersistentVolumeClaim", &claims[0]);

    // the HPA scales the read Deployment, on CPU, from at least 2
    let hpas = m.of_kind("HorizontalPodAutoscaler");
    assert_eq!(hpas.len(), 1);
    let hpa = hpas[0].1;
    assert_eq!(hpa["apiVersion"].as_str(), Some("autoscaling/v2"));
    let target = &hpa["spec"]["scaleTargetRef"];
    assert_eq!(target["kind"].as_str(), Some("Deployment"));
    assert_eq!(
        target["name"], read["metadata"]["name"],
        "the HPA scales the read role"
    );
    let min = hpa["spec"]["minReplicas"].as_i64().unwrap();
    assert!(min >= 2 && hpa["spec"]["maxReplicas"].as_i64().unwrap() > min);
    assert_eq!(
        hpa["spec"]["metrics"][0]["resource"]["name"].as_str(),
        Some("cpu")
    );

    // both on PostgreSQL: the write pod's primary, the read pods' replica
    for c in [write_c, read_c] {
        let config = c.config();
        let storage = config.storages.values().next().unwrap();
        assert_eq!(storage.kind, "postgres", "{}", c.what);
        assert_eq!(
            storage.settings["url"].as_str(),
            Some(c.env["DATABASE_URL"].as_str())
        );
        assert_eq!(
            storage.settings["read_url"].as_str(),
            Some(c.env["DATABASE_READ_URL"].as_str())
        );
    }
    assert_eq!(
        read_c.env.get("READ_SERVICE_URL").map(String::as_str),
        Some("http://localhost:3035"),
        "relationship fields: a read pod calls itself"
    );

    // both share the read cache in the Redis of redis.yaml, through its Service
    let redis_service = m.named("Service", "meshql-redis");
    let redis_port = redis_service["spec"]["ports"][0]["port"].as_i64().unwrap() as u16;
    for c in [write_c, read_c] {
        let url = c
            .env
            .get("REDIS_URL")
            .unwrap_or_else(|| panic!("{}: REDIS_URL", c.what));
        assert_eq!(
            redis_cache_url(&c.config()),
            *url,
            "{}: the config reads REDIS_URL",
            c.what
        );
        let (_, _, host, port, _) = url_parts(url);
        assert_eq!(
            (host.as_str(), port),
            ("meshql-redis", redis_port),
            "{}: REDIS_URL names the Service meshql-redis",
            c.what
        );
    }
}

#[test]
fn the_k8s_redis_is_one_pod_that_never_evicts_a_tag_and_keeps_nothing_on_disk() {
    let m = manifests();
    let redis: Vec<(&Path, &Yaml)> = m
        .of_kind("Deployment")
        .into_iter()
        .filter(|(_, d)| deployment_image(d).starts_with("redis:"))
        .collect();
    let [(file, deployment)] = redis.as_slice() else {
        panic!("one Redis Deployment, not {}", redis.len())
    };
    let what = format!(
        "{}: Deployment {}",
        rel(file),
        text(&deployment["metadata"]["name"], "name")
    );
    assert!(
        deployment_image(deployment).starts_with("redis:7"),
        "{what}"
    );
    // two Redis pods behind one Service would be two caches, each missing the other's
    // invalidations: one pod, and the old one gone before the new one starts
    assert_eq!(deployment["spec"]["replicas"].as_i64(), Some(1), "{what}");
    assert_eq!(
        deployment["spec"]["strategy"]["type"].as_str(),
        Some("Recreate"),
        "{what}"
    );
    let pod = &deployment["spec"]["template"]["spec"];
    let containers = list(&pod["containers"]);
    assert_eq!(containers.len(), 1, "{what}: one container");
    let c = &containers[0];
    // the image's entry point runs the args
    assert!(c["command"].is_badvalue(), "{what}: args, not command");
    let argv: Vec<String> = list(&c["args"]).iter().map(|a| text(a, &what)).collect();
    let maxmemory = check_redis_cache_server(&argv, &what);
    let limit = k8s_bytes(&text(&c["resources"]["limits"]["memory"], &what));
    assert!(
        maxmemory < limit,
        "{what}: --maxmemory ({maxmemory} bytes) leaves room under the memory limit ({limit})"
    );
    assert!(
        scalar(&c["resources"]["requests"]["memory"]).is_some(),
        "{what}: requests.memory"
    );
    // ready once it answers PING
    let probe: Vec<String> = list(&c["readinessProbe"]["exec"]["command"])
        .iter()
        .map(|w| text(w, &what))
        .collect();
    assert_eq!(probe, ["redis-cli", "ping"], "{what}: readinessProbe");
    // nothing persisted: no claim
    for v in list(&pod["volumes"]) {
        assert!(
            v["persistentVolumeClaim"].is_badvalue(),
            "{what}: no PersistentVolumeClaim"
        );
    }
    // unprivileged, as the meshql pods
    assert_eq!(
        pod["securityContext"]["runAsNonRoot"].as_bool(),
        Some(true),
        "{what}"
    );
    let csc = &c["securityContext"];
    assert_eq!(
        csc["allowPrivilegeEscalation"].as_bool(),
        Some(false),
        "{what}"
    );
    assert_eq!(
        csc["readOnlyRootFilesystem"].as_bool(),
        Some(true),
        "{what}"
    );
    assert_eq!(
        csc["capabilities"]["drop"][0].as_str(),
        Some("ALL"),
        "{what}"
    );
    // the Service meshql's REDIS_URL names reaches it on Redis's port
    let service = m.named("Service", "meshql-redis");
    let port = &list(&service["spec"]["ports"])[0];
    assert_eq!(
        resolve_port(&port["targetPort"], c, &what),
        6379,
        "{what}: the Service reaches Redis's port"
    );
}

#[test]
fn k8s_services_select_the_deployments_and_reach_their_ports() {
    let m = manifests();
    let services = m.of_kind("Service");
    assert_eq!(services.len(), 3, "one Service per role, and Redis's");
    for (file, service) in services {
        let name = text(&service["metadata"]["name"], "name");
        let what = format!("{}: Service {name}", rel(file));
        let selector: Vec<(String, String)> = hash_entries(&service["spec"]["selector"])
            .into_iter()
            .map(|(k, v)| (k, text(v, &what)))
            .collect();
        assert!(!selector.is_empty(), "{what}: a selector");
        let selected: Vec<&Yaml> = m
            .of_kind("Deployment")
            .into_iter()
            .map(|(_, d)| d)
            .filter(|d| {
                let labels = &d["spec"]["template"]["metadata"]["labels"];
                selector
                    .iter()
                    .all(|(k, v)| labels[k.as_str()].as_str() == Some(v.as_str()))
            })
            .collect();
        assert_eq!(selected.len(), 1, "{what}: selects one Deployment");
        let c = &list(&selected[0]["spec"]["template"]["spec"]["containers"])[0];
        for p in list(&service["spec"]["ports"]) {
            let target = resolve_port(&p["targetPort"], c, &what);
            assert_eq!(
                p["port"].as_i64(),
                Some(target as i64),
                "{what}: the Service port is its container's"
            );
        }
    }
    // the PodDisruptionBudget and the Deployments' own selectors match their pods
    for (_, d) in m
        .of_kind("Deployment")
        .into_iter()
        .chain(m.of_kind("PodDisruptionBudget"))
    {
        assert!(!hash_entries(&d["spec"]["selector"]["matchLabels"]).is_empty());
    }
    for (_, d) in m.of_kind("Deployment") {
        assert_eq!(
            d["spec"]["selector"]["matchLabels"],
            d["spec"]["template"]["metadata"]["labels"]
        );
    }
}

#[test]
fn the_k8s_configmap_holds_farm_cqrs_as_it_is_in_examples() {
    let m = manifests();
    let data = hash_entries(&m.named("ConfigMap", "meshql-config")["data"]);
    let example = common::examples_dir().join("farm-cqrs");
    let mut keys = BTreeSet::new();
    for (key, value) in data {
        let file = if key == "meshql.toml" {
            example.join("meshql-postgres-redis.toml")
        } else if key.ends_with(".schema.json") {
            example.join("schema").join(&key)
        } else if key.ends_with(".graphql") {
            example.join("graph").join(&key)
        } else {
            panic!("ConfigMap meshql-config: unexpected key {key}")
        };
        assert_eq!(
            text(value, &key),
            read_text(&file),
            "ConfigMap meshql-config: {key} differs from {} (copy the file into \
             deploy/k8s/configmap.yaml again)",
            rel(&file)
        );
        keys.insert(key);
    }
    // every file of the example is there
    for sub in ["schema", "graph"] {
        for entry in std::fs::read_dir(example.join(sub)).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            assert!(
                keys.contains(&name),
                "ConfigMap meshql-config lacks {sub}/{name}"
            );
        }
    }
}

#[test]
fn the_kustomization_applies_every_manifest_but_the_example_secret() {
    let dir = repo().join("deploy/k8s");
    let k = &load_yaml(&dir.join("kustomization.yaml"))[0];
    assert_eq!(k["kind"].as_str(), Some("Kustomization"));
    let resources: BTreeSet<String> = list(&k["resources"])
        .iter()
        .map(|r| text(r, "resources"))
        .collect();
    let mut files = BTreeSet::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".yaml") && name != "kustomization.yaml" && name != "secret.example.yaml"
        {
            files.insert(name);
        }
    }
    assert_eq!(resources, files);
    assert!(
        !resources.contains("secret.example.yaml"),
        "the Secret's values are the operator's"
    );
    // ... and the Secret it stands for has every key the Deployments read
    let m = manifests();
    let secret = &m.named("Secret", "meshql-database")["stringData"];
    for (_, d) in m.of_kind("Deployment") {
        for e in list(&d["spec"]["template"]["spec"]["containers"][0]["env"]) {
            let r = &e["valueFrom"]["secretKeyRef"];
            if !r.is_badvalue() {
                assert_eq!(r["name"].as_str(), Some("meshql-database"));
                assert!(scalar(&secret[text(&r["key"], "key").as_str()]).is_some());
            }
        }
    }
}
