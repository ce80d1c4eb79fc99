//! Assembles a meshql service from a resolved config: opens storage, builds one restlette
//! and one graphlette per entity, and serves them all on one HTTP listener together with
//! `/health`, `/ready`, `/metrics` and the built-in Swagger UI / GraphiQL assets.

mod app;
mod assets;
mod backends;
mod changes_routes;
mod cors;
mod deferred;
mod graphql_routes;
mod ops;
mod preflight;
mod relays;

pub use app::{build, App, BuildError};
pub use preflight::preflight;

use axum::serve::ListenerExt;
use std::future::Future;
use tokio::net::TcpListener;

/// Serves `app` on `listener` until `shutdown` completes, then finishes in-flight requests,
/// flushes the storage writers and returns.
pub async fn serve(
    app: App,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = app.router.clone();
    let closing = app.closing.clone();
    let shutdown = async move {
        shutdown.await;
        // long-lived responses (change streams, long polls) end, so the drain can finish
        closing.send_replace(true);
    };
    // TCP_NODELAY: a change stream writes small events one after the other; with Nagle's
    // algorithm each waited for the client's delayed ACK (up to 40 ms) before the next left
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await?;
    app.shutdown().await;
    Ok(())
}

/// Completes on SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
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
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down: finishing in-flight requests");
}
