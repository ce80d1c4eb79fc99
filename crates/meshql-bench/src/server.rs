//! Servers the bench starts itself: a fresh `meshql serve` on a temporary data directory
//! (one-command local mode) and the do-nothing ceiling server.

use crate::monitor::ProcProbe;
use bytes::Bytes;
use http_body_util::Full;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot start {exe}: {source}")]
    Spawn { exe: String, source: std::io::Error },
    #[error(
        "meshql serve {config} exited before it was ready ({status}); its log ends with:\n{log}"
    )]
    Exited {
        config: String,
        status: String,
        log: String,
    },
    #[error("meshql serve {config} was not ready within {secs} s; its log ends with:\n{log}")]
    NotReady {
        config: String,
        secs: u64,
        log: String,
    },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// How to start a local meshql server.
#[derive(Debug, Clone)]
pub struct ServerSpec {
    /// The `meshql` binary.
    pub exe: PathBuf,
    /// Config file or directory.
    pub config: PathBuf,
    /// Worker threads (`--workers`); `None` = one per core.
    pub workers: Option<usize>,
    /// Extra environment; `{url}` in a value becomes the server's own base URL.
    pub env: Vec<(String, String)>,
    /// Extra arguments of `meshql serve` (e.g. `--role read`).
    pub args: Vec<String>,
    /// A data directory shared with another server (a CQRS pair on one SQLite file); `None`:
    /// one of its own, removed with it.
    pub data_dir: Option<PathBuf>,
}

/// A `meshql serve` child process on a free loopback port and a temporary data directory.
pub struct LocalServer {
    spec: ServerSpec,
    child: Child,
    port: u16,
    data: tempfile::TempDir,
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

impl LocalServer {
    pub async fn start(spec: ServerSpec) -> Result<Self, ServerError> {
        let mut server = Self::launch(spec)?;
        server.wait_ready().await?;
        Ok(server)
    }

    /// Spawns the server without waiting for it to be ready: the caller times its start
    /// ([`LocalServer::wait_ready_within`], or its own polling of `/ready`).
    pub fn launch(spec: ServerSpec) -> Result<Self, ServerError> {
        let data = tempfile::Builder::new().prefix("meshql-bench-").tempdir()?;
        let port = free_port()?;
        let child = Self::spawn(&spec, port, data.path())?;
        Ok(Self {
            spec,
            child,
            port,
            data,
        })
    }

    fn spawn(spec: &ServerSpec, port: u16, data: &Path) -> Result<Child, ServerError> {
        let url = format!("http://127.0.0.1:{port}");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(data.join("server.log"))?;
        let mut cmd = Command::new(&spec.exe);
        cmd.arg("serve")
            .arg(&spec.config)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .arg("--data-dir")
            .arg(spec.data_dir.clone().unwrap_or_else(|| data.join("data")))
            // the last `--log-level` given wins: the spec's arguments may ask for another
            .args(["--log-level", "warn"])
            .args(&spec.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if let Some(w) = spec.workers {
            cmd.args(["--workers", &w.to_string()]);
        }
        for (k, v) in &spec.env {
            cmd.env(k, v.replace("{url}", &url));
        }
        cmd.spawn().map_err(|source| ServerError::Spawn {
            exe: spec.exe.display().to_string(),
            source,
        })
    }

    async fn wait_ready(&mut self) -> Result<(), ServerError> {
        self.wait_ready_within(Duration::from_secs(60)).await
    }

    /// Waits until `GET /ready` answers 200, the process exits, or `limit` has passed (the
    /// errors carry the end of its log).
    pub async fn wait_ready_within(&mut self, limit: Duration) -> Result<(), ServerError> {
        let started = Instant::now();
        let addr = format!("127.0.0.1:{}", self.port);
        let config = self.spec.config.display().to_string();
        let log = self.log_path();
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Err(ServerError::Exited {
                    config,
                    status: status.to_string(),
                    log: log_tail(&log),
                });
            }
            if ready(&addr).await {
                return Ok(());
            }
            if started.elapsed() > limit {
                return Err(ServerError::NotReady {
                    config,
                    secs: limit.as_secs(),
                    log: log_tail(&log),
                });
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
    }

    /// How this server was started (to start another like it, e.g. with other environment).
    pub fn spec(&self) -> &ServerSpec {
        &self.spec
    }

    /// The file its standard output and error go to.
    pub fn log_path(&self) -> PathBuf {
        self.data.path().join("server.log")
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn probe(&self) -> ProcProbe {
        ProcProbe::new(self.child.id())
    }

    /// Stops the server and starts it again on the same port and data, with `workers` threads.
    pub async fn restart(&mut self, workers: Option<usize>) -> Result<(), ServerError> {
        self.restart_with(|spec| spec.workers = workers).await
    }

    /// Stops the server and starts it again on the same port and data, as `change` makes
    /// its spec (e.g. another config).
    pub async fn restart_with(
        &mut self,
        change: impl FnOnce(&mut ServerSpec),
    ) -> Result<(), ServerError> {
        self.terminate();
        change(&mut self.spec);
        self.child = Self::spawn(&self.spec, self.port, self.data.path())?;
        self.wait_ready().await
    }

    fn terminate(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        self.terminate();
    }
}

/// `GET /ready` answers 200.
async fn ready(addr: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
        return false;
    };
    let req = format!("GET /ready HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).await.is_err() {
        return false;
    }
    let mut buf = [0u8; 16];
    matches!(s.read(&mut buf).await, Ok(n) if n >= 12 && &buf[9..12] == b"200")
}

/// The body the ceiling server returns: a fixed ~170-byte JSON document, like the nginx
/// ceiling of the issue.
pub const CEILING_BODY: &str = r#"{"name":"Emerdale","farm_type":"homestead","zone":"north","owner":"someone","id":"dc605290-9677-4957-9f0e-7bb8f0379c60","extra":"padding-to-about-170-bytes-xx"}"#;

/// A server that does nothing but answer [`CEILING_BODY`], on one thread of its own (the
/// equivalent of nginx with one worker). Returns its base URL; it lives until the process ends.
pub fn start_ceiling() -> std::io::Result<String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let url = format!("http://{}", listener.local_addr()?);
    listener.set_nonblocking(true)?;
    std::thread::Builder::new()
        .name("ceiling".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("ceiling runtime");
            rt.block_on(async move {
                let listener =
                    tokio::net::TcpListener::from_std(listener).expect("ceiling listener");
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(|_req| async {
                            let mut r = hyper::Response::new(Full::new(Bytes::from_static(
                                CEILING_BODY.as_bytes(),
                            )));
                            r.headers_mut().insert(
                                http::header::CONTENT_TYPE,
                                http::HeaderValue::from_static("application/json"),
                            );
                            Ok::<_, Infallible>(r)
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                            .await;
                    });
                }
            });
        })?;
    Ok(url)
}
