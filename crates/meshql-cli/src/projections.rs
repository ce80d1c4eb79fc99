//! `meshql projections rebuild NAME`: asks a running server to recompute a processor's
//! output from the start of its change log into a new table and swap it in (reads see the
//! old table until then), and follows the rebuild until it is done.

use clap::{Args, Subcommand};
use serde_json::Value;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Args)]
pub struct ProjectionsArgs {
    #[command(subcommand)]
    command: ProjectionsCommand,
}

#[derive(Subcommand)]
enum ProjectionsCommand {
    /// Recompute a processor's output from the start of the log, without downtime.
    Rebuild {
        /// The processor's name.
        name: String,
        /// Config file or directory of the server (its port finds it on this machine).
        #[arg(default_value = ".")]
        config: PathBuf,
        /// The server's base URL (instead of the config's port on 127.0.0.1).
        #[arg(long)]
        url: Option<String>,
        /// A bearer token of a caller allowed to write the processor's output entity.
        #[arg(long, env = "MESHQL_TOKEN")]
        token: Option<String>,
    },
}

pub fn run(args: ProjectionsArgs) -> ExitCode {
    let ProjectionsCommand::Rebuild {
        name,
        config,
        url,
        token,
    } = args.command;
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("meshql projections: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(rebuild(name, config, url, token)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("meshql projections rebuild: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn rebuild(
    name: String,
    config: PathBuf,
    url: Option<String>,
    token: Option<String>,
) -> Result<(), String> {
    let (base, from_config) = match url {
        Some(u) => (u.trim_end_matches('/').to_owned(), false),
        None => {
            let c = meshql_config::load(&config).map_err(|e| e.to_string())?;
            (format!("http://127.0.0.1:{}", c.port), true)
        }
    };
    // a server that cannot be reached: say where we looked, and how to look elsewhere
    let unreachable = |e: reqwest::Error| {
        if !(e.is_connect() || e.is_timeout()) {
            format!("{base}: {e}")
        } else if from_config {
            format!(
                "no meshql server answers at {base}, the port of {}: start it, or pass `--url http://HOST:PORT` where it listens ({e})",
                config.display()
            )
        } else {
            format!("no meshql server answers at {base} (--url): {e}")
        }
    };
    let http = reqwest::Client::new();
    let with_token = |r: reqwest::RequestBuilder| match &token {
        Some(t) => r.bearer_auth(t),
        None => r,
    };
    let reply = with_token(http.post(format!("{base}/_meshql/processors/{name}/rebuild")))
        .send()
        .await
        .map_err(unreachable)?;
    let status = reply.status();
    let body: Value = reply.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        return Err(format!(
            "{status}: {}",
            body["error"].as_str().unwrap_or("the server refused")
        ));
    }
    eprintln!("rebuilding {name} on {base}: reads see the old table until it is done");
    let mut last = String::new();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let state: Value = with_token(http.get(format!("{base}/_meshql/processors/{name}")))
            .send()
            .await
            .map_err(unreachable)?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        let r = &state["rebuild"];
        match r["state"].as_str() {
            Some("done") => {
                println!(
                    "{name}: rebuilt up to position {} in {:.2} s",
                    r["position"],
                    r["seconds"].as_f64().unwrap_or(0.0)
                );
                return Ok(());
            }
            Some("failed") => {
                return Err(r["reason"].as_str().unwrap_or("failed").to_owned());
            }
            _ => {
                let line = format!("position {}, {} changes to go", r["position"], r["lag"]);
                if line != last {
                    eprintln!("{line}");
                    last = line;
                }
            }
        }
    }
}
