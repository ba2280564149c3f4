//! The hook port's accept loop: TLS handshakes (with a deadline), HTTP/1.1 or HTTP/2 per ALPN, a cap on
//! open connections, header read timeouts, and a graceful drain of every open connection on shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

/// What the TLS layer learned about a connection, attached to every request on it.
#[derive(Debug, Clone, Copy)]
pub struct ConnInfo {
    /// The peer's address.
    pub peer: SocketAddr,
    /// Whether the client presented a certificate that verified against `--client-ca`.
    pub client_cert_verified: bool,
}

/// Bounds of the hook port's connections.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Longest a TLS handshake may take.
    pub handshake_timeout: Duration,
    /// Longest a client may take to send request headers (HTTP/1.1).
    pub header_read_timeout: Duration,
    /// Most connections open at once; further ones wait in the kernel's backlog.
    pub max_connections: usize,
    /// Longest the drain waits for open connections on shutdown.
    pub shutdown_grace: Duration,
}

/// Serves `app` over TLS on `listener` until `shutdown` fires, then stops accepting, lets in-flight
/// requests finish (up to `limits.shutdown_grace`) and returns.
pub async fn serve_tls(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    app: Router,
    limits: ConnLimits,
    shutdown: CancellationToken,
) {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    builder.http2().timer(TokioTimer::new());
    let builder = Arc::new(builder);
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(limits.max_connections));

    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = shutdown.cancelled() => break,
        };
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // EMFILE and friends: back off briefly instead of spinning.
                    tracing::warn!(error = %err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let app = app.clone();
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let handshake_timeout = limits.handshake_timeout;
        tokio::spawn(async move {
            let _permit = permit;
            let tls = match tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(err)) => {
                    tracing::debug!(%peer, error = %err, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let info = ConnInfo {
                peer,
                client_cert_verified: tls.get_ref().1.peer_certificates().is_some(),
            };
            let service = app.map_request(move |mut request: axum::extract::Request<_>| {
                request.extensions_mut().insert(info);
                request
            });
            let connection = builder
                .serve_connection(TokioIo::new(tls), TowerToHyperService::new(service))
                .into_owned();
            if let Err(err) = watcher.watch(connection).await {
                tracing::debug!(%peer, error = %err, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.shutdown_grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            grace_seconds = limits.shutdown_grace.as_secs_f64(),
            "connections still open after the shutdown grace period; closing them"
        );
    }
}
