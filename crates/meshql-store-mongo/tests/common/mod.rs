//! A FerretDB server of a test's own (`scripts/services/ferretdb.sh` on free ports of its
//! own, with its TLS listener), stopped and its database dropped when dropped. For tests that
//! need a second server besides the shared one (`MESHQL_TEST_MONGO_URL`), or one they may
//! break.
//!
//! Used by more than one test file here (`mod common;`); not every file uses every field.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Server {
    /// The plain-text port.
    pub port: u16,
    /// The TLS listener's port.
    pub tls_port: u16,
    /// The directory of `ca.crt` (the CA that signed the server's certificate) and
    /// `other-ca.crt` (an unrelated one).
    pub tls: PathBuf,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Server {
    fn run(&self, action: &str) -> std::process::Output {
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/services/ferretdb.sh");
        Command::new("bash")
            .arg(script)
            .arg(action)
            .env("MESHQL_FERRETDB_PORT", self.port.to_string())
            .env("MESHQL_FERRETDB_TLS_PORT", self.tls_port.to_string())
            .stdin(std::process::Stdio::null())
            .output()
            .expect("ferretdb.sh")
    }

    pub fn start() -> Self {
        let mut server = Self {
            port: free_port(),
            tls_port: free_port(),
            tls: PathBuf::new(),
        };
        let out = server.run("start");
        assert!(
            out.status.success(),
            "FerretDB did not start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        server.tls = PathBuf::from(String::from_utf8(server.run("tls").stdout).unwrap().trim());
        server
    }

    /// The plain-text port's URI.
    pub fn uri(&self) -> String {
        format!("mongodb://127.0.0.1:{}/", self.port)
    }

    /// The TLS port's URI, by `host`, with `options` (`tls=true&tlsCAFile=…`).
    pub fn tls_uri(&self, host: &str, options: &str) -> String {
        format!(
            "mongodb://{host}:{}/?serverSelectionTimeoutMS=3000&{options}",
            self.tls_port
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.run("destroy");
    }
}
