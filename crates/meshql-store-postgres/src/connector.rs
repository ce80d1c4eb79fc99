//! Pool connections to PostgreSQL with the TLS settings of [`meshql_pg::tls`].

use futures::future::BoxFuture;
use meshql_pg::tls_failure;
use tokio_postgres::config::SslMode as PgSslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

/// Opens pool connections; under `prefer`, a server whose TLS handshake fails is connected to
/// again without TLS, as libpq does.
pub(crate) struct Connector {
    pub tls: MakeRustlsConnect,
    pub fall_back_to_plain: bool,
}

impl deadpool_postgres::Connect for Connector {
    fn connect(
        &self,
        pg_config: &tokio_postgres::Config,
    ) -> BoxFuture<
        '_,
        Result<(tokio_postgres::Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>,
    > {
        let config = pg_config.clone();
        Box::pin(async move {
            let (client, connection) = match config.connect(self.tls.clone()).await {
                Ok(pair) => pair,
                Err(e) if self.fall_back_to_plain => match tls_failure(&e) {
                    Some(reason) => {
                        tracing::warn!(
                            "PostgreSQL: the TLS handshake failed ({reason}); sslmode=prefer: \
                             connecting without TLS"
                        );
                        let mut plain = config.clone();
                        plain.ssl_mode(PgSslMode::Disable);
                        plain.connect(self.tls.clone()).await?
                    }
                    None => return Err(e),
                },
                Err(e) => return Err(e),
            };
            let task = tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::warn!("PostgreSQL connection error: {e}");
                }
            });
            Ok((client, task))
        })
    }
}
