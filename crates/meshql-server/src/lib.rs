//! Assembles a meshql service from a resolved config: opens storage, builds one restlette
//! and one graphlette per entity, and serves them all on one HTTP listener together with
//! `/health`, `/ready`, `/metrics` and the built-in Swagger UI / GraphiQL assets.

mod app;
mod assets;
pub mod backends;
pub mod caches;
mod changes_routes;
mod connection;
mod console;
mod cors;
mod direct;
mod graphql_routes;
mod listener;
mod log_behind;
mod ops;
mod preflight;
mod processors;
mod relays;
mod request_metrics;
mod served;
mod subscription_routes;
mod subscriptions;
pub mod tls;

pub use app::{build, App, BuildError};
pub use preflight::preflight;
pub use processors::{configure as processor_plans, host as host_processors, ProcessorHost};

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
    let closing = app.closing.clone();
    let shutdown = async move {
        shutdown.await;
        // long-lived responses (change streams, long polls) end, so the drain can finish
        closing.send_replace(true);
    };
    listener::run(
        app.router.clone(),
        app.direct.clone(),
        listener,
        server,
        tls,
        shutdown,
    )
    .await;
    app.shutdown().await;
    Ok(())
}

/// Completes on SIGINT (Ctrl-C) or SIGTERM. From then on, a second one ends the process at
/// once (status 130 for SIGINT, 143 for SIGTERM), without waiting for requests or storage.
pub async fn shutdown_signal() {
    let mut signals = Signals::new();
    let first = signals.next().await;
    tracing::info!("{first}: shutting down (a second signal ends the process at once)");
    // the same listeners: a second signal that comes at once is not missed
    tokio::spawn(async move {
        let second = signals.next().await;
        tracing::warn!("{second} again: exiting now, without waiting for requests in progress");
        std::process::exit(if second == "SIGINT" { 130 } else { 143 });
    });
}

/// Listeners for SIGINT and SIGTERM, kept from one signal to the next.
struct Signals {
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn new() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Self {
                int: signal(SignalKind::interrupt()).ok(),
                term: signal(SignalKind::terminate()).ok(),
            }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// The name of the next SIGINT or SIGTERM.
    async fn next(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
                match s {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => futures::future::pending::<()>().await,
                }
            }
            tokio::select! {
                _ = recv(&mut self.int) => "SIGINT",
                _ = recv(&mut self.term) => "SIGTERM",
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            "SIGINT"
        }
    }
}
