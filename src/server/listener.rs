//! The hook port's accept loop: TLS handshakes (with a deadline), HTTP/1.1 or HTTP/2 per ALPN, a cap on
//! open connections, header read timeouts, an idle timeout for connections with no request in progress,
//! and a graceful drain of every open connection on shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulConnection;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
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
    /// Longest a client may take to send request headers (HTTP/1.1), and longest any connection may stay
    /// open with no request in progress (HTTP/1.1, HTTP/2, or no protocol negotiated).
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

/// Requests in progress on one connection, and since when there has been none.
struct Activity {
    opened: Instant,
    active: AtomicUsize,
    /// Milliseconds after `opened` at which the last request ended.
    idle_since_ms: AtomicU64,
}

impl Activity {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            opened: Instant::now(),
            active: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
        })
    }

    fn begin(self: &Arc<Self>) -> InRequest {
        self.active.fetch_add(1, Ordering::SeqCst);
        InRequest(self.clone())
    }

    /// How long the connection has had no request in progress; `None` while one is.
    fn idle_for(&self) -> Option<Duration> {
        if self.active.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let since = Duration::from_millis(self.idle_since_ms.load(Ordering::SeqCst));
        Some(self.opened.elapsed().saturating_sub(since))
    }
}

/// One request in progress; its end starts the idle clock.
struct InRequest(Arc<Activity>);

impl Drop for InRequest {
    fn drop(&mut self) {
        // The idle clock is set before the count drops, so a check that sees no request sees this end.
        let now = self.0.opened.elapsed().as_millis() as u64;
        self.0.idle_since_ms.store(now, Ordering::SeqCst);
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Drives one connection: ends it gracefully when the server shuts down or when no request has been in
/// progress for `idle_timeout` (an HTTP/2 client that never sends a request, or a client that negotiated no
/// protocol and sends nothing, would otherwise hold a connection slot for ever). An idle connection that has
/// not closed `idle_timeout` after being asked to (hyper's HTTP/2 waits for the client's preface before it
/// can say goodbye) is dropped.
async fn drive<C>(
    connection: C,
    activity: Arc<Activity>,
    idle_timeout: Duration,
    shutdown: CancellationToken,
) -> Result<(), String>
where
    C: GracefulConnection,
    C::Error: std::fmt::Display,
{
    #[derive(PartialEq)]
    enum State {
        Open,
        Draining,
        Idled,
    }
    let mut connection = std::pin::pin!(connection);
    let check = tokio::time::sleep(idle_timeout);
    let mut check = std::pin::pin!(check);
    let mut state = State::Open;
    loop {
        tokio::select! {
            ended = connection.as_mut() => return ended.map_err(|err| err.to_string()),
            () = shutdown.cancelled(), if state == State::Open => {
                state = State::Draining;
                connection.as_mut().graceful_shutdown();
            }
            () = check.as_mut(), if state != State::Draining => match (&state, activity.idle_for()) {
                (State::Idled, _) => return Err("idle connection did not close; dropped".to_owned()),
                (_, Some(idle)) if idle >= idle_timeout => {
                    state = State::Idled;
                    connection.as_mut().graceful_shutdown();
                    check.as_mut().reset(tokio::time::Instant::now() + idle_timeout);
                }
                (_, idle) => {
                    let left = idle_timeout - idle.unwrap_or_default();
                    check.as_mut().reset(tokio::time::Instant::now() + left);
                }
            },
        }
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
    let connections = TaskTracker::new();
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
        let shutdown = shutdown.clone();
        let handshake_timeout = limits.handshake_timeout;
        let idle_timeout = limits.header_read_timeout;
        connections.spawn(async move {
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
            let activity = Activity::new();
            let requests = activity.clone();
            let service = app
                .map_request(move |mut request: axum::extract::Request<_>| {
                    request.extensions_mut().insert(info);
                    request
                })
                .map_future(move |response| {
                    let in_request = requests.begin();
                    async move {
                        let response = response.await;
                        drop(in_request);
                        response
                    }
                });
            let (io, service) = (TokioIo::new(tls), TowerToHyperService::new(service));
            // ALPN already named the protocol: serve exactly that one. An HTTP/1.1 connection (agents, CAPI)
            // then holds only HTTP/1.1 state in this task, ~0.9 KiB less than the auto-detecting connection,
            // which is sized for both protocols; over 30 000 long-polling agents that adds up. The larger
            // HTTP/2 and detecting states are boxed so they do not size every task. Only a client that
            // negotiated nothing gets detection from the first bytes, as before.
            let ended = match alpn.as_deref() {
                Some(b"http/1.1") => {
                    let connection = protocols.http1.serve_connection(io, service);
                    drive(connection, activity, idle_timeout, shutdown).await
                }
                Some(b"h2") => {
                    let connection = protocols.http2.serve_connection(io, service);
                    Box::pin(drive(connection, activity, idle_timeout, shutdown)).await
                }
                _ => {
                    let connection = protocols.auto.serve_connection(io, service).into_owned();
                    Box::pin(drive(connection, activity, idle_timeout, shutdown)).await
                }
            };
            if let Err(err) = ended {
                tracing::debug!(%peer, error = %err, "connection ended with an error");
            }
        });
    }
    drop(listener);
    connections.close();
    if tokio::time::timeout(limits.shutdown_grace, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            grace_seconds = limits.shutdown_grace.as_secs_f64(),
            "connections still open after the shutdown grace period; closing them"
        );
    }
}
