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

/// The connection builders, configured alike: HTTP/1.1 (header read timeout, keep-alive), HTTP/2, and the
/// auto-detecting one for clients that negotiated no ALPN protocol.
struct Protocols {
    http1: hyper::server::conn::http1::Builder,
    http2: hyper::server::conn::http2::Builder<TokioExecutor>,
    auto: Builder<TokioExecutor>,
}

impl Protocols {
    fn new(limits: &ConnLimits) -> Self {
        let mut http1 = hyper::server::conn::http1::Builder::new();
        http1
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .keep_alive(true);
        let mut http2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        http2.timer(TokioTimer::new());
        let mut auto = Builder::new(TokioExecutor::new());
        auto.http1()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .keep_alive(true);
        auto.http2().timer(TokioTimer::new());
        Self { http1, http2, auto }
    }
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
    let protocols = Arc::new(Protocols::new(&limits));
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
        let protocols = protocols.clone();
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
            let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
            let service = app.map_request(move |mut request: axum::extract::Request<_>| {
                request.extensions_mut().insert(info);
                request
            });
            let (io, service) = (TokioIo::new(tls), TowerToHyperService::new(service));
            // ALPN already named the protocol: serve exactly that one. An HTTP/1.1 connection (agents, CAPI)
            // then holds only HTTP/1.1 state in this task, ~0.9 KiB less than the auto-detecting connection,
            // which is sized for both protocols; over 30 000 long-polling agents that adds up. The larger
            // HTTP/2 and detecting states are boxed so they do not size every task. Only a client that
            // negotiated nothing gets detection from the first bytes, as before.
            let ended = match alpn.as_deref() {
                Some(b"http/1.1") => watcher
                    .watch(protocols.http1.serve_connection(io, service))
                    .await
                    .map_err(|err| err.to_string()),
                Some(b"h2") => {
                    Box::pin(watcher.watch(protocols.http2.serve_connection(io, service)))
                        .await
                        .map_err(|err| err.to_string())
                }
                _ => Box::pin(
                    watcher.watch(protocols.auto.serve_connection(io, service).into_owned()),
                )
                .await
                .map_err(|err| err.to_string()),
            };
            if let Err(err) = ended {
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
