//! Shutting down on a signal: the first SIGINT or SIGTERM starts an orderly stop, a second
//! one ends the process at once.

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
