//! End-to-end test harness: runs the real `meshql` binary on a free port with a fresh data
//! directory, and talks to it over HTTP.
//!
//! Used by every test file in this directory (`mod common;`); not every file uses every helper.
#![allow(dead_code)]

pub mod fault_proxy;

use serde_json::Value;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// How long a server may take to answer `GET /health` with 200.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a server may take to exit after SIGTERM before it is killed.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// Path of the `meshql` binary under test.
pub fn meshql_bin() -> &'static str {
    env!("CARGO_BIN_EXE_meshql")
}

/// The repository's `examples/` directory.
pub fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// A port nobody listens on right now (bind 127.0.0.1:0, read the port, close).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral port")
        .port()
}

/// Copies a directory tree, without the `data` directories in it: an example served in place
/// (as the README's first command does) keeps its runtime state there (the default
/// `data_dir`), which a test must not start from.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("create {}: {e}", to.display()));
    for entry in std::fs::read_dir(from).unwrap_or_else(|e| panic!("read {}: {e}", from.display()))
    {
        let entry = entry.expect("directory entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            if entry.file_name() == "data" {
                continue;
            }
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap_or_else(|e| {
                panic!(
                    "copy {} to {}: {e}",
                    entry.path().display(),
                    target.display()
                )
            });
        }
    }
}

/// A copy of `examples/<name>` in a fresh temporary directory, with its `meshql.toml`
/// rewritten by `edit`. The config's relative paths resolve inside the copy.
pub fn example_copy(name: &str, edit: impl FnOnce(String) -> String) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    copy_dir(&examples_dir().join(name), dir.path());
    let config = dir.path().join("meshql.toml");
    let text = std::fs::read_to_string(&config).expect("read the copied meshql.toml");
    std::fs::write(&config, edit(text)).expect("write the edited meshql.toml");
    dir
}

/// Runs `meshql <args>` to completion (killed and panicking after `timeout`).
pub fn run_meshql(args: &[&str], timeout: Duration) -> Output {
    let mut child = Command::new(meshql_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn meshql");
    // read both pipes on threads so that a chatty child never blocks on a full pipe
    let mut stdout = child.stdout.take().expect("stdout piped");
    let mut stderr = child.stderr.take().expect("stderr piped");
    let out = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = stdout.read_to_end(&mut b);
        b
    });
    let err = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = stderr.read_to_end(&mut b);
        b
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for meshql") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`meshql {}` did not finish within {timeout:?}; stderr:\n{}",
                args.join(" "),
                String::from_utf8_lossy(&err.join().unwrap_or_default())
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
    }
}

/// Where a server keeps its data: a temporary directory it owns, or one the test owns.
enum DataDir {
    Owned(tempfile::TempDir),
    Borrowed(PathBuf),
}

impl DataDir {
    fn path(&self) -> &Path {
        match self {
            DataDir::Owned(d) => d.path(),
            DataDir::Borrowed(p) => p,
        }
    }
}

/// A running `meshql serve`. Dropping it stops the process (SIGTERM, then kill).
pub struct Server {
    child: Option<Child>,
    port: u16,
    data_dir: DataDir,
    /// Holds what the child wrote to stdout and stderr.
    log_dir: tempfile::TempDir,
    base: String,
}

impl Server {
    /// Serves `config_path` on a free port with a fresh data directory (deleted on drop).
    pub fn start(config_path: &Path, extra_args: &[&str]) -> Server {
        let dir = tempfile::tempdir().expect("temp data dir");
        Self::start_in(config_path, DataDir::Owned(dir), extra_args, &[], None)
    }

    /// Serves `config_path` with extra environment variables, on `port` when given (for
    /// services that must know each other's address before both are up).
    pub fn start_with_env(
        config_path: &Path,
        envs: &[(&str, String)],
        port: Option<u16>,
    ) -> Server {
        let dir = tempfile::tempdir().expect("temp data dir");
        Self::start_in(config_path, DataDir::Owned(dir), &[], envs, port)
    }

    /// Serves `role` (`write`, `read`) of `config_path` with extra environment, a fresh data
    /// directory of its own, on `port` when given.
    pub fn start_role(
        config_path: &Path,
        role: &'static str,
        envs: &[(&str, String)],
        port: Option<u16>,
    ) -> Server {
        let dir = tempfile::tempdir().expect("temp data dir");
        Self::start_in(
            config_path,
            DataDir::Owned(dir),
            &["--role", role],
            envs,
            port,
        )
    }

    /// Serves `config_path` on a free port with `data_dir` (kept after the server stops, so
    /// another server can be started on it).
    pub fn start_with_data_dir(config_path: &Path, data_dir: &Path, extra_args: &[&str]) -> Server {
        Self::start_in(
            config_path,
            DataDir::Borrowed(data_dir.to_owned()),
            extra_args,
            &[],
            None,
        )
    }

    /// Serves `config_path` with `data_dir` (kept), extra arguments and environment, on `port`
    /// when given: for processes that share a data directory and must know each other's
    /// address (a write and a read role of one config).
    pub fn start_sharing(
        config_path: &Path,
        data_dir: &Path,
        extra_args: &[&str],
        envs: &[(&str, String)],
        port: Option<u16>,
    ) -> Server {
        Self::start_in(
            config_path,
            DataDir::Borrowed(data_dir.to_owned()),
            extra_args,
            envs,
            port,
        )
    }

    fn start_in(
        config_path: &Path,
        data_dir: DataDir,
        extra_args: &[&str],
        envs: &[(&str, String)],
        fixed_port: Option<u16>,
    ) -> Server {
        let log_dir = tempfile::tempdir().expect("temp log dir");
        // Another process may take the free port between our probe and the child's bind;
        // that (and only that) is retried with a new port.
        for attempt in 1..=3 {
            let port = fixed_port.unwrap_or_else(free_port);
            let log_path = log_dir.path().join(format!("stderr-{attempt}.log"));
            let log = std::fs::File::create(&log_path).expect("create the log");
            let log_too = log.try_clone().expect("clone the log handle");
            let mut child = Command::new(meshql_bin())
                .arg("serve")
                .arg(config_path)
                .arg("--port")
                .arg(port.to_string())
                .arg("--data-dir")
                .arg(data_dir.path())
                .arg("--log-level")
                .arg("warn")
                .args(extra_args)
                .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
                .stdin(Stdio::null())
                .stdout(Stdio::from(log_too))
                .stderr(Stdio::from(log))
                .spawn()
                .expect("spawn meshql serve");
            match wait_healthy(&mut child, port, &log_path) {
                Ok(()) => {
                    return Server {
                        child: Some(child),
                        port,
                        data_dir,
                        log_dir,
                        base: format!("http://127.0.0.1:{port}"),
                    }
                }
                Err(why) => {
                    terminate(&mut child);
                    if !(why.contains("cannot listen") && attempt < 3 && fixed_port.is_none()) {
                        panic!(
                            "`meshql serve {}` did not become healthy {why}",
                            config_path.display()
                        );
                    }
                }
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn data_dir(&self) -> &Path {
        self.data_dir.path()
    }

    /// The process id of the server.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// What the server logged so far, stdout and stderr (all start attempts).
    pub fn log(&self) -> String {
        let mut names: Vec<PathBuf> = std::fs::read_dir(self.log_dir.path())
            .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        names.sort();
        names
            .iter()
            .map(|p| std::fs::read_to_string(p).unwrap_or_default())
            .collect()
    }

    /// An HTTP client bound to this server.
    pub fn client(&self) -> Client {
        Client::new(&self.base)
    }

    /// Sends SIGTERM and waits for the process to exit (killing it after the timeout, in
    /// which case this panics).
    pub fn stop_gracefully(mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        match terminate(&mut child) {
            Some(status) => status,
            None => panic!(
                "meshql did not exit within {SHUTDOWN_TIMEOUT:?} of SIGTERM; stderr:\n{}",
                self.log()
            ),
        }
    }
}

impl Server {
    /// Sends `SIG<name>` (e.g. `"TERM"`) to the server and returns at once.
    pub fn signal(&self, name: &str) {
        let pid = self.pid();
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(pid.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} {pid} failed");
    }

    /// Waits up to `timeout` for the process to end by itself: its exit status, or `None`
    /// while it still runs.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut().expect("running");
        loop {
            if let Some(status) = child.try_wait().expect("wait for meshql") {
                self.child = None;
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// SIGTERM, wait up to [`SHUTDOWN_TIMEOUT`], then kill. `None` if it had to be killed.
fn terminate(child: &mut Child) -> Option<ExitStatus> {
    if let Ok(Some(status)) = child.try_wait() {
        return Some(status);
    }
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let deadline = Instant::now() + SHUTDOWN_TIMEOUT;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            terminate(&mut child);
        }
    }
}

/// Polls `GET /health` until it answers 200; on failure returns why, with the child's stderr.
fn wait_healthy(child: &mut Child, port: u16, log_path: &Path) -> Result<(), String> {
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    let stderr = || std::fs::read_to_string(log_path).unwrap_or_default();
    loop {
        if let Some(status) = child.try_wait().expect("wait for meshql") {
            return Err(format!("(it exited with {status}); log:\n{}", stderr()));
        }
        if health_ok(port) {
            // the answer came from our child only if it is still running
            if let Some(status) = child.try_wait().expect("wait for meshql") {
                return Err(format!("(it exited with {status}); log:\n{}", stderr()));
            }
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "(no 200 from /health within {STARTUP_TIMEOUT:?}); log:\n{}",
                stderr()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A raw `GET /health` over a plain socket (no async runtime needed): true on a 200.
fn health_ok(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(500),
    ) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
    let request =
        format!("GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.1 200")
}

/// A response, fully read.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub text: String,
}

impl Response {
    /// The body as JSON (panics, showing the body, if it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| {
            panic!(
                "body of a {} response is not JSON ({e}): {:?}",
                self.status, self.text
            )
        })
    }

    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The media type of `content-type`, without parameters, lowercased.
    pub fn content_type(&self) -> String {
        self.header("content-type")
            .unwrap_or_default()
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase()
    }

    /// Panics, showing the response, unless the status is `expected`.
    #[track_caller]
    pub fn expect_status(&self, expected: u16) -> &Self {
        assert_eq!(
            self.status, expected,
            "expected status {expected}, got {} with body {:?}",
            self.status, self.text
        );
        self
    }
}

/// An async HTTP client for one server (cheap to clone; clones share connections).
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    pub fn new(base: &str) -> Client {
        Client {
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(Duration::from_secs(30))
                .build()
                .expect("reqwest client"),
            base: base.trim_end_matches('/').to_owned(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Any request: `body` is sent as-is (with `content-type: application/json` unless a
    /// content type is given in `headers`).
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
        headers: &[(&str, &str)],
    ) -> Response {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("HTTP method");
        let mut req = self.http.request(method.clone(), self.url(path));
        let has_content_type = headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(body) = body {
            if !has_content_type {
                req = req.header("content-type", "application/json");
            }
            req = req.body(body);
        }
        let resp = req
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp
            .text()
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: reading the body: {e}"));
        Response {
            status,
            headers,
            text,
        }
    }

    pub async fn get(&self, path: &str) -> Response {
        self.request("GET", path, None, &[]).await
    }

    pub async fn delete(&self, path: &str) -> Response {
        self.request("DELETE", path, None, &[]).await
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> Response {
        self.request("POST", path, Some(body.to_string().into_bytes()), &[])
            .await
    }

    pub async fn put_json(&self, path: &str, body: &Value) -> Response {
        self.request("PUT", path, Some(body.to_string().into_bytes()), &[])
            .await
    }

    /// POST of raw bytes as `application/json` (for malformed bodies).
    pub async fn post_raw(&self, path: &str, body: &[u8]) -> Response {
        self.request("POST", path, Some(body.to_vec()), &[]).await
    }

    pub async fn put_raw(&self, path: &str, body: &[u8]) -> Response {
        self.request("PUT", path, Some(body.to_vec()), &[]).await
    }

    /// `GET path`, asserting 200 and a JSON array; returns its items.
    /// Waits until `meshql_storage_connections_in_use{storage}` in `/metrics` reads `n` on two
    /// looks 100 ms apart (a change-feed poll holds a connection for about a millisecond, so
    /// two looks both landing on one mean it is held for longer). Panics after 10 s.
    pub async fn until_connections_in_use(&self, storage: &str, n: u64) {
        let series = format!("meshql_storage_connections_in_use{{storage=\"{storage}\"}} ");
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut seen_before = false;
        loop {
            let metrics = self.get("/metrics").await.text;
            let now: u64 = metrics
                .lines()
                .find_map(|l| l.strip_prefix(series.as_str()))
                .unwrap_or_else(|| panic!("no {series} in:\n{metrics}"))
                .parse()
                .unwrap();
            if now == n && seen_before {
                return;
            }
            seen_before = now == n;
            assert!(
                Instant::now() < deadline,
                "{series} did not reach {n} within 10 s (it reads {now})"
            );
            tokio::time::sleep(Duration::from_millis(if seen_before { 100 } else { 10 })).await;
        }
    }

    pub async fn list(&self, path: &str) -> Vec<Value> {
        let r = self.get(path).await;
        r.expect_status(200);
        match r.json() {
            Value::Array(items) => items,
            other => panic!("GET {path}: expected a JSON array, got {other}"),
        }
    }
}

/// True for an RFC-4122 UUID in canonical text form (8-4-4-4-12 hex, version 1-8, variant
/// `10xx`).
pub fn is_rfc4122_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
        && matches!(b[14], b'1'..=b'8')
        && matches!(b[19], b'8' | b'9' | b'a' | b'b' | b'A' | b'B')
}

/// The URL of the test PostgreSQL server: `MESHQL_TEST_POSTGRES_URL`, or one started by
/// `scripts/services/postgres.sh` (which installs PostgreSQL when missing). Panics — the test
/// fails loudly — when no server can be had.
#[allow(dead_code)]
pub fn postgres_url() -> String {
    meshql_conformance::test_server_url("postgres", "MESHQL_TEST_POSTGRES_URL")
}

/// The URL of the test S3-compatible server (SeaweedFS, with the bucket `meshql-test` and the
/// access key `meshql` / `meshql-secret`): `MESHQL_TEST_S3_URL`, or one started by
/// `scripts/services/seaweedfs.sh`. Panics when none can be had.
#[allow(dead_code)]
pub fn s3_url() -> String {
    meshql_conformance::test_server_url("seaweedfs", "MESHQL_TEST_S3_URL")
}

/// Runs SQL on `url` with psql; its output (unaligned, tuples only), trimmed. Panics with
/// psql's message when the statement fails.
#[allow(dead_code)]
pub fn psql(url: &str, sql: &str) -> String {
    let out = Command::new("psql")
        .args([url, "-v", "ON_ERROR_STOP=1", "-tAqc", sql])
        .output()
        .expect("run psql");
    assert!(
        out.status.success(),
        "psql failed on {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A new, empty database on the test server; returns its URL.
#[allow(dead_code)]
pub fn fresh_postgres_database() -> String {
    let base = postgres_url();
    let name = format!("t_{}", uuid_like());
    let out = Command::new("psql")
        .arg(&base)
        .arg("-qc")
        .arg(format!("CREATE DATABASE {name}"))
        .output()
        .expect("run psql");
    assert!(
        out.status.success(),
        "cannot create a test database: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (prefix, _) = base.rsplit_once('/').expect("URL with a database");
    format!("{prefix}/{name}")
}

fn uuid_like() -> String {
    use std::time::{SystemTime, UNIX_EPOCH};
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{:x}_{}_{}",
        t,
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

/// The URL of the test MariaDB server: `MESHQL_TEST_MYSQL_URL`, or one started by
/// `scripts/services/mariadb.sh`. Panics — the test fails loudly — when none can be had.
#[allow(dead_code)]
pub fn mysql_url() -> String {
    meshql_conformance::test_server_url("mariadb", "MESHQL_TEST_MYSQL_URL")
}

/// A new, empty database on the test MariaDB; returns its URL.
#[allow(dead_code)]
pub fn fresh_mysql_database() -> String {
    let base = mysql_url();
    let name = format!("t_{}", uuid_like());
    let rest = base.strip_prefix("mysql://").expect("mysql URL");
    let (creds, host_db) = rest.split_once('@').expect("user@host");
    let (user, password) = creds.split_once(':').unwrap_or((creds, ""));
    let (host_port, _) = host_db.split_once('/').expect("host/db");
    let (host, port) = host_port.split_once(':').unwrap_or((host_port, "3306"));
    let out = Command::new("mariadb")
        .args(["-h", host, "-P", port, "-u", user, &format!("-p{password}")])
        .args(["-e", &format!("CREATE DATABASE {name}")])
        .output()
        .expect("run the mariadb client");
    assert!(
        out.status.success(),
        "cannot create a test database: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (prefix, _) = base.rsplit_once('/').expect("URL with a database");
    format!("{prefix}/{name}")
}

/// The URI of the test MongoDB-wire server (FerretDB): `MESHQL_TEST_MONGO_URL`, or one started
/// by `scripts/services/ferretdb.sh`. Panics — the test fails loudly — when none can be had.
#[allow(dead_code)]
pub fn mongo_url() -> String {
    meshql_conformance::test_server_url("ferretdb", "MESHQL_TEST_MONGO_URL")
}

/// A new database name on the test MongoDB-wire server (created on first write).
pub fn fresh_mongo_database() -> String {
    format!("t_{}", uuid_like())
}

/// The failure test shared by the client/server backends: a store with one pooled connection
/// and a 200 ms wait, whose `slow` query holds that connection for 2 s (`slow_sql`, a raw SQL
/// template). A request arriving meanwhile must get a clear 503 after the bounded wait, and
/// the service must be fine afterwards.
#[allow(dead_code)]
pub async fn pool_exhaustion_answers_503(storage_type: &str, url: &str, slow_sql: &str) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("slow.graphql"),
        "type Query { slow(at: Float): [Thing] getById(id: ID, at: Float): Thing }\ntype Thing { id: ID name: String }\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("meshql.toml"),
        format!(
            r#"
[storage.db]
type = "{storage_type}"
url = "{url}"
pool_size = 1
pool_wait_ms = 200

[[entity]]
name = "thing"
storage = "db"
[entity.rest]
[entity.graphql]
schema = "slow.graphql"
[[entity.graphql.vectors]]
name = "slow"
sql = "{slow_sql}"
[[entity.graphql.singletons]]
name = "getById"
query = '{{"id": "{{{{id}}}}"}}'
"#
        ),
    )
    .unwrap();
    let server = Server::start(dir.path(), &[]);
    let c = server.client();
    c.post_json("/thing/api", &serde_json::json!({"name": "x"}))
        .await
        .expect_status(201);
    // one request holds the only connection for 2 s...
    let slow_client = server.client();
    let slow = tokio::spawn(async move {
        slow_client
            .post_json(
                "/thing/graph",
                &serde_json::json!({"query": "{ slow { name } }"}),
            )
            .await
    });
    c.until_connections_in_use("db", 1).await;
    // ...so this one waits 200 ms for a connection, then gets a clear 503
    // (were the wait unbounded, this would answer 200 once the slow request finished)
    let r = c.get("/thing/api").await;
    r.expect_status(503);
    assert!(
        r.json()["error"]
            .as_str()
            .is_some_and(|e| e.contains("pool exhausted")),
        "{}",
        r.text
    );
    let slow = slow.await.unwrap();
    assert_eq!(
        slow.json(),
        serde_json::json!({"data": {"slow": [{"name": "x"}]}})
    );
    // and the service is fine afterwards, every connection back in the pool
    c.get("/thing/api").await.expect_status(200);
    c.until_connections_in_use("db", 0).await;
}

/// After a write was cut off mid-request: the service answers again within 10 s, the farms
/// listed are exactly `["kept"]` (nothing of the interrupted write), and a new write succeeds.
#[allow(dead_code)]
pub async fn assert_interrupted_write_left_nothing(c: &Client) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let list = loop {
        let r = c.get("/farm/api").await;
        if r.status == 200 {
            break r.json();
        }
        assert!(Instant::now() < deadline, "no recovery: {}", r.text);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["kept"]);
    c.post_json(
        "/farm/api",
        &serde_json::json!({"name": "after", "farm_type": "megafarm", "zone": "north"}),
    )
    .await
    .expect_status(201);
}

/// The HS256 secret of the test configs that verify JWTs (`auth.secret`).
pub const JWT_SECRET: &str = "meshql-test-secret-0123456789abcdef";

/// `Bearer <jwt>` with `sub` as its subject, an hour to live, signed with [`JWT_SECRET`].
pub fn bearer(sub: &str) -> String {
    bearer_with(&serde_json::json!({"sub": sub}))
}

/// `Bearer <jwt>` with these claims (`exp` an hour ahead unless given), HS256 with
/// [`JWT_SECRET`].
pub fn bearer_with(claims: &Value) -> String {
    let mut claims = claims.clone();
    if claims.get("exp").is_none() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        claims["exp"] = serde_json::json!(now + 3600);
    }
    let token = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(JWT_SECRET.as_bytes()),
    )
    .expect("sign a test JWT");
    format!("Bearer {token}")
}

/// A throw-away server of `scripts/services/<service>.sh` on a port of a test's own (the
/// script's port variable, e.g. `MESHQL_NATS_PORT`), which the test may stop and start again
/// without disturbing the shared one; stopped when dropped. Not started by [`OwnService::new`].
pub struct OwnService {
    service: String,
    script: PathBuf,
    port_var: &'static str,
    port: u16,
}

impl OwnService {
    pub fn new(service: &str, port_var: &'static str, port: u16) -> OwnService {
        OwnService {
            service: service.to_owned(),
            script: Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../scripts/services")
                .join(format!("{service}.sh")),
            port_var,
            port,
        }
    }

    /// `kill -9` of the server process (the pid file its script keeps).
    #[allow(dead_code)]
    pub fn kill_9(&self) {
        let base = std::env::var("MESHQL_SERVICES_DIR")
            .unwrap_or_else(|_| "/tmp/meshql-services".to_owned());
        let path = format!("{base}/{}/{}/pid", self.service, self.port);
        let pid = std::fs::read_to_string(&path).expect("the server's pid file");
        let status = Command::new("kill")
            .args(["-9", pid.trim()])
            .status()
            .unwrap();
        assert!(status.success());
        std::thread::sleep(Duration::from_millis(200));
    }

    fn run(&self, verb: &str) -> String {
        let out = Command::new("bash")
            .arg(&self.script)
            .arg(verb)
            .env(self.port_var, self.port.to_string())
            .stdin(Stdio::null())
            .output()
            .expect("run the service script");
        assert!(
            out.status.success(),
            "{} {verb} failed:\n{}",
            self.script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    /// Starts the server (idempotent) and returns its URL; panics when it cannot start.
    pub fn start(&self) -> String {
        self.run("start")
    }

    /// Stops the server (idempotent).
    pub fn stop(&self) {
        self.run("stop");
    }

    /// Its URL, whether or not it runs.
    pub fn url(&self) -> String {
        self.run("url")
    }
}

impl Drop for OwnService {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(&self.script)
            .arg("stop")
            .env(self.port_var, self.port.to_string())
            .output();
    }
}

/// Waits until every id of `events` has exactly one processed event at `c` and nothing else
/// is processed; fails at once on an event processed twice.
pub async fn processed_once(
    c: &Client,
    events: &std::collections::BTreeSet<String>,
    within: Duration,
) {
    let deadline = Instant::now() + within;
    loop {
        let processed = c.list("/processedevent/api").await;
        let mut per: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
        for p in &processed {
            *per.entry(p["raw_event_id"].as_str().unwrap().to_owned())
                .or_default() += 1;
        }
        assert!(
            per.values().all(|n| *n == 1),
            "an event processed twice: {:?}",
            per.iter().filter(|(_, n)| **n > 1).collect::<Vec<_>>()
        );
        assert!(
            per.keys().all(|k| events.contains(k)),
            "a processed event from nowhere"
        );
        if per.len() == events.len() {
            // an event processed again writes its processedevent again (same derived id, a
            // second version), which the count of current documents cannot show
            one_version_each(c, "processedevent", &per.into_keys().collect()).await;
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} events processed",
            per.len(),
            events.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The stored versions of `entity`'s document `id` at `c`, oldest first, tombstones included
/// (the console's versions API).
pub async fn versions(c: &Client, entity: &str, id: &str) -> Vec<Value> {
    let r = c
        .get(&format!(
            "/_meshql/console/api/entities/{entity}/documents/{id}/versions"
        ))
        .await;
    r.expect_status(200);
    r.json()["versions"].as_array().unwrap().clone()
}

/// Asserts that every current document of `entity` at `c` has exactly one stored version,
/// and (when `raw_ids` is not empty) that they are the processed records of exactly those
/// `raw_event_id`s. A processor's output id is derived from its input, so an input
/// processed twice overwrites its document (the count of documents stays the same) and shows
/// only as a second version. Returns the number of documents.
pub async fn one_version_each(
    c: &Client,
    entity: &str,
    raw_ids: &std::collections::BTreeSet<String>,
) -> usize {
    use futures::StreamExt;
    let docs = c.list(&format!("/{entity}/api")).await;
    let ids: Vec<String> = docs
        .iter()
        .map(|d| d["id"].as_str().unwrap().to_owned())
        .collect();
    let counted: Vec<(String, usize)> = futures::stream::iter(ids.iter().cloned())
        .map(|id| async move {
            let n = versions(c, entity, &id).await.len();
            (id, n)
        })
        .buffer_unordered(8)
        .collect()
        .await;
    let twice: Vec<&(String, usize)> = counted.iter().filter(|(_, n)| *n != 1).collect();
    assert!(
        twice.is_empty(),
        "{} of {} {entity} documents have other than one version (an input processed again): {:?}",
        twice.len(),
        counted.len(),
        &twice[..twice.len().min(10)]
    );
    if !raw_ids.is_empty() {
        let raw: std::collections::BTreeSet<String> = docs
            .iter()
            .map(|d| d["raw_event_id"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(
            &raw, raw_ids,
            "the processed records are those of the events"
        );
        assert_eq!(docs.len(), raw_ids.len());
    }
    assert!(!counted.is_empty(), "no {entity} document at all");
    counted.len()
}

/// Runs `meshql check CONFIG`, which must fail, and returns the line of its errors that
/// contains `needle` (failing the test when none does).
pub fn check_error_line(config: &Path, needle: &str) -> String {
    let out = run_meshql(
        &["check", config.to_str().unwrap()],
        Duration::from_secs(60),
    );
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{said}");
    said.lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("`{needle}` in:\n{said}"))
        .to_owned()
}

/// `meshql process` on a config and data directory, its output in `log`.
#[allow(dead_code)]
pub fn spawn_process(
    config: &std::path::Path,
    data: &std::path::Path,
    log: &std::path::Path,
) -> std::process::Child {
    let out = std::fs::File::create(log).unwrap();
    std::process::Command::new(meshql_bin())
        .arg("process")
        .arg(config)
        .arg("--data-dir")
        .arg(data)
        .arg("--status-every")
        .arg("1")
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap()
}

/// Replication slots a test's servers make, named `meshql_%<suffix>` (the examples'
/// `LEGACY_SLOT_SUFFIX`): dropped when the guard is dropped, whatever the test's outcome (a
/// slot nothing reads keeps the server's WAL forever).
pub struct SlotsDropped {
    admin: String,
    pub suffix: String,
}

impl SlotsDropped {
    /// A guard with a fresh suffix.
    pub fn new() -> SlotsDropped {
        SlotsDropped {
            admin: postgres_url(),
            suffix: format!("_{}", &uuid::Uuid::new_v4().simple().to_string()[..10]),
        }
    }

    /// `FROM … WHERE` the slots it guards.
    pub fn like(&self) -> String {
        format!(
            "FROM pg_replication_slots WHERE slot_name LIKE 'meshql_%{}'",
            self.suffix
        )
    }

    /// The environment a legacy example reads: its database and the slots' suffix.
    pub fn env(&self, url: &str) -> Vec<(&'static str, String)> {
        vec![
            ("LEGACY_URL", url.to_owned()),
            ("LEGACY_SLOT_SUFFIX", self.suffix.clone()),
        ]
    }
}

impl Drop for SlotsDropped {
    fn drop(&mut self) {
        // the server is gone by now, but PostgreSQL may take a moment to let go of its slots
        for _ in 0..50 {
            let out = Command::new("psql")
                .args([
                    &self.admin,
                    "-tAqc",
                    &format!(
                        "SELECT pg_drop_replication_slot(slot_name) {} AND NOT active; SELECT count(*) {}",
                        self.like(),
                        self.like()
                    ),
                ])
                .output();
            match out {
                Ok(o) if String::from_utf8_lossy(&o.stdout).trim().ends_with('0') => return,
                Ok(_) => std::thread::sleep(Duration::from_millis(100)),
                Err(_) => return,
            }
        }
    }
}

/// A fresh database on the test PostgreSQL loaded from the SQL file `init` (psql,
/// `ON_ERROR_STOP`); returns its URL.
pub fn postgres_database_from(init: &Path) -> String {
    let url = fresh_postgres_database();
    let out = Command::new("psql")
        .arg(&url)
        .args(["-q", "-v", "ON_ERROR_STOP=1", "-f"])
        .arg(init)
        .output()
        .expect("run psql");
    assert!(
        out.status.success(),
        "loading {}: {}",
        init.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    url
}

/// Posts `query` to the graphlette at `path`; its `data`, failing on any `errors`.
pub async fn gql(s: &Server, path: &str, query: &str) -> Value {
    let r = s
        .client()
        .post_json(path, &serde_json::json!({ "query": query }))
        .await
        .json();
    assert!(r.get("errors").is_none(), "{path} {query}: {r}");
    r["data"].clone()
}

/// Waits (up to 30 s) until the `data` of `query` at `path` satisfies `check`; returns it.
pub async fn until_gql(
    s: &Server,
    path: &str,
    query: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = s
            .client()
            .post_json(path, &serde_json::json!({ "query": query }))
            .await
            .json();
        if r.get("errors").is_none() && check(&r["data"]) {
            return r["data"].clone();
        }
        assert!(
            Instant::now() < deadline,
            "{path} {query}: got {r}\n{}",
            s.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The length of a JSON array (0 for anything else).
pub fn len(v: &Value) -> usize {
    v.as_array().map_or(0, Vec::len)
}

/// Every change in `/_changes`, in order.
pub async fn feed(c: &Client) -> Vec<Value> {
    let mut out = Vec::new();
    let mut since = 0;
    loop {
        let r = c.get(&format!("/_changes?since={since}&limit=1000")).await;
        r.expect_status(200);
        let body = r.json();
        let page = body["changes"].as_array().unwrap().clone();
        if page.is_empty() {
            return out;
        }
        since = body["last"].as_u64().unwrap();
        out.extend(page);
    }
}
