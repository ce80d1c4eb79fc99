//! Assembles a meshql service from a resolved config: opens storage, builds one restlette
//! and one graphlette per entity, and serves them all on one HTTP listener together with
//! `/health`, `/ready`, `/metrics` and the built-in Swagger UI / GraphiQL assets.

mod app;
mod assets;
mod backends;
mod changes_routes;
mod connection;
mod cors;
mod deferred;
mod graphql_routes;
mod listener;
mod ops;
mod preflight;
mod relays;

pub use app::{build, App, BuildError};
pub use preflight::preflight;

use meshql_config::resolve::ServerSpec;
use std::future::Future;
use tokio::net::TcpListener;

pub use listener::{bind, default_max_connections};

/// Serves `app` on `listener` with the connection limits of `server` until `shutdown`
/// completes; then stops accepting, closes idle and half-read connections, lets requests in
/// progress finish for up to `server.shutdown_timeout`, flushes the storage writers and
/// returns.
pub async fn serve(
    app: App,
    listener: TcpListener,
    server: &ServerSpec,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let closing = app.closing.clone();
    let shutdown = async move {
        shutdown.await;
        // long-lived responses (change streams, long polls) end, so the drain can finish
        closing.send_replace(true);
    };
    listener::run(app.router.clone(), listener, server, shutdown).await;
    app.shutdown().await;
    Ok(())
}

/// Completes on SIGINT (Ctrl-C) or SIGTERM. From then on, a second one ends the process at
/// once (status 130 for SIGINT, 143 for SIGTERM), without waiting for requests or storage.
pub async fn shutdown_signal() {
    let first = next_signal().await;
    tracing::info!("{first}: shutting down (a second signal ends the process at once)");
    tokio::spawn(async {
        let second = next_signal().await;
        tracing::warn!("{second} again: exiting now, without waiting for requests in progress");
        std::process::exit(if second == "SIGINT" { 130 } else { 143 });
    });
}

/// The name of the next SIGINT or SIGTERM.
async fn next_signal() -> &'static str {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => futures::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = futures::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => "SIGINT",
        _ = term => "SIGTERM",
    }
}
