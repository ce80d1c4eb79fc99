//! Assembles a meshql service from a resolved config: opens storage, builds one restlette
//! and one graphlette per entity, and serves them all on one HTTP listener together with
//! `/health`, `/ready`, `/metrics` and the built-in Swagger UI / GraphiQL assets.

mod app;
mod assets;
mod backup_routes;
mod changes_routes;
mod connection;
mod console;
mod cors;
mod direct;
mod graph_endpoint;
mod graphql_routes;
mod listener;
mod log_behind;
mod ops;
mod persisted_queries;
mod processors_routes;
mod rate_limit;
mod request_metrics;
mod subscription_routes;
pub mod tls;

pub use app::{build, preflight, App, BuildError};

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
    // `[server.tls]`: the pair was checked with the config; here it must also load
    // (the key matching the certificate)
    let tls = match &server.tls {
        Some(spec) => Some(
            tls::Tls::new(spec)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?,
        ),
        None => None,
    };
    let runtime = app.runtime().clone();
    let shutdown = async move {
        shutdown.await;
        // long-lived responses (change streams, long polls) end, so the drain can finish
        runtime.begin_closing();
    };
    listener::run(
        app.router.clone(),
        app.direct.clone(),
        app.limits_rates,
        listener,
        server,
        tls,
        shutdown,
    )
    .await;
    app.shutdown().await;
    Ok(())
}
