//! The HTTPS server: hook port (TLS, optional mTLS, cert reload), health port and metrics port, started
//! together and stopped together. It decides nothing about Machines; `hooks` does.

mod admin;
mod agent_routes;
mod app;
mod error;
mod listener;
pub mod metrics;
mod state;
pub mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

pub use admin::{
    HOOK_CALLS_ANSWERED_HEADER, Readiness, health_router, metrics_router, status_router,
};
pub use agent_routes::{
    AGENT_BODY_READ_TIME, AgentBodyError, MAX_AGENT_REQUEST_TIME, MAX_TOKEN_BYTES,
    REFUSED_BODY_READ_TIME, decode_agent_body,
};
pub use app::{
    AnswerFuture, Compute, DEADLINE_FRACTION, DEFAULT_CAPI_TIMEOUT, INLINE_COMPUTE_MAX_BODY_BYTES,
    MAX_BODY_BYTES, MAX_HOOK_TIME, MIN_BODY_READ_TIME, app, hook_route,
};
pub use error::HttpError;
pub use listener::{ConnInfo, ConnLimits};
pub use metrics::Metrics;
pub use state::AppState;
use tls::{ReloadingCert, TlsError, TlsFiles};

use crate::dispatch::Dispatcher;
use crate::dispatch::upkeep::rollout::release::SharedImage;
use crate::dispatch::upkeep::served_ca::Refreshed;
use crate::dispatch::upkeep::tokens::AgentTokens;
use crate::hooks::Engine;
use crate::mgmt::Management;

/// Default interval between checks of the certificate files for new content.
pub const DEFAULT_TLS_RELOAD_INTERVAL: Duration = Duration::from_secs(10);
/// Default TLS handshake deadline.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default deadline for a client to send its request headers.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default cap on open hook-port connections (30 000 long-polling agents plus CAPI fit under it).
pub const DEFAULT_MAX_CONNECTIONS: usize = 40_000;
/// Default time open connections get to finish on shutdown (the process exits within 10 s of SIGTERM).
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(8);

/// Everything `serve` needs, already typed.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Serving certificate and key.
    pub tls: TlsFiles,
    /// CA that client certificates must chain to; `Some` makes hook calls require one.
    pub client_ca: Option<PathBuf>,
    /// How often the certificate files (and the agent CA bundle) are re-read.
    pub tls_reload_interval: Duration,
    /// The CA bundle agents should trust (`--agent-ca-bundle`), served at `GET /agent/v1/ca`.
    pub agent_ca_bundle: Option<PathBuf>,
    /// Connection bounds of the hook port.
    pub limits: ConnLimits,
}

/// The three bound listeners; tests bind port 0 and pass them in.
#[derive(Debug)]
pub struct Listeners {
    /// The TLS hook port.
    pub hooks: TcpListener,
    /// `/healthz`, `/readyz`.
    pub health: TcpListener,
    /// `/metrics`.
    pub metrics: TcpListener,
}

impl Listeners {
    /// Binds the three addresses.
    pub async fn bind(
        hooks: SocketAddr,
        health: SocketAddr,
        metrics: SocketAddr,
    ) -> Result<Self, ServeError> {
        let bind = |addr: SocketAddr, flag: &'static str| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|source| ServeError::Bind { addr, flag, source })
        };
        Ok(Self {
            hooks: bind(hooks, "--listen").await?,
            health: bind(health, "--health-listen").await?,
            metrics: bind(metrics, "--metrics-listen").await?,
        })
    }

    /// The bound addresses (hooks, health, metrics).
    pub fn local_addrs(&self) -> std::io::Result<(SocketAddr, SocketAddr, SocketAddr)> {
        Ok((
            self.hooks.local_addr()?,
            self.health.local_addr()?,
            self.metrics.local_addr()?,
        ))
    }
}

/// Why the server could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// An address could not be bound.
    #[error("{flag} {addr}: cannot listen: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The flag that sets it (`--listen`, `--health-listen`, `--metrics-listen`).
        flag: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },
    /// TLS material is unusable.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// A background task (listener, certificate watcher) ended while the server was running.
    #[error("background task {0} stopped unexpectedly; exiting so the orchestrator restarts us")]
    TaskDied(&'static str),
}

/// How often the retention sweep runs.
pub const RETENTION_SWEEP_INTERVAL: Duration = Duration::from_secs(3600);

/// What the handlers decide with, built before the server starts.
#[derive(Debug, Clone)]
pub struct Services {
    /// Policy and dispatch.
    pub engine: Arc<Engine>,
    /// Agent tokens.
    pub tokens: Arc<AgentTokens>,
    /// The agent executable handed out at `GET /agent/v1/binary`, if any.
    pub agent_image: SharedImage,
    /// The management cluster's API (`--management-kubeconfig`, `--management-in-cluster`); none: nothing is
    /// written there, and hooks answer the same.
    pub management: Option<Management>,
}

/// Runs the server until `shutdown` is cancelled, then drains and returns `Ok`. Returns an error at once
/// when start-up fails or any background task dies.
pub async fn run(
    config: ServeConfig,
    listeners: Listeners,
    services: Services,
    metrics: Arc<Metrics>,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let provider = tls::provider();
    let cert = Arc::new(ReloadingCert::load(config.tls.clone(), provider.clone())?);
    let tls_config = tls::server_config(cert.clone(), config.client_ca.as_deref(), provider)?;
    let acceptor = TlsAcceptor::from(Arc::new(tls_config));
    // Only now: the certificates loaded and every listener is bound.
    if let Ok((hooks, health, metrics)) = listeners.local_addrs() {
        tracing::info!(%hooks, %health, %metrics, "listening");
    }
    let agent_ca = config.agent_ca_bundle.clone();
    if let Some(path) = &agent_ca {
        refresh_agent_ca(path, &cert, &services.engine.dispatcher);
    }
    let state = AppState {
        metrics: metrics.clone(),
        require_client_cert: config.client_ca.is_some(),
        engine: services.engine.clone(),
        tokens: services.tokens.clone(),
        agent_image: services.agent_image.clone(),
    };

    let mut tasks: JoinSet<&'static str> = JoinSet::new();
    if let Some(management) = &services.management {
        let (dispatcher, events) = (&services.engine.dispatcher, metrics.events.clone());
        crate::mgmt::events::start(&mut tasks, management, dispatcher, events, shutdown.clone());
    }
    let stop = shutdown.clone();
    tasks.spawn(async move {
        listener::serve_tls(
            listeners.hooks,
            acceptor,
            app::app(state),
            config.limits,
            stop,
        )
        .await;
        "hook listener"
    });
    for (name, listener, router) in [
        (
            "health listener",
            listeners.health,
            health_router(readiness.clone()).merge(status_router(
                services.engine.dispatcher.clone(),
                metrics.clone(),
            )),
        ),
        (
            "metrics listener",
            listeners.metrics,
            metrics_router(metrics.clone()),
        ),
    ] {
        let stop = shutdown.clone();
        tasks.spawn(async move {
            let served = axum::serve(listener, router)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await;
            if let Err(err) = served {
                tracing::error!(error = %err, "{name} failed");
            }
            name
        });
    }
    let metrics_for_guards = metrics.clone();
    let stop = shutdown.clone();
    let interval = config.tls_reload_interval;
    let watched = cert.clone();
    tasks.spawn(async move {
        watch_certificate(watched, interval, metrics, stop).await;
        "certificate watcher"
    });
    if let Some(path) = agent_ca {
        let stop = shutdown.clone();
        let dispatcher = services.engine.dispatcher.clone();
        tasks.spawn(async move {
            watch_agent_ca(path, cert, dispatcher, interval, stop).await;
            "agent CA bundle watcher"
        });
    }

    let stop = shutdown.clone();
    let tokens = services.tokens.clone();
    tasks.spawn(async move {
        watch_tokens(tokens, interval, stop).await;
        "token file watcher"
    });
    let dispatcher = services.engine.dispatcher.clone();
    let follower = dispatcher.agents.clone();
    tasks.spawn(async move {
        follower.follow_changes().await;
        "store change feed"
    });
    let presence = dispatcher.agents.presence.clone();
    tasks.spawn(async move {
        presence.run().await;
        "presence"
    });
    let counter = dispatcher.fleet.clone();
    tasks.spawn(async move {
        counter.run_census().await;
        "update census"
    });
    let changes = dispatcher.changes.clone();
    tasks.spawn(async move {
        changes.count_changes().await;
        "change counter"
    });
    if let Some(management) = &services.management {
        let guards = dispatcher.attach_guards(
            Arc::new(management.clone()),
            metrics_for_guards.management.guards.clone(),
        );
        tasks.spawn(async move {
            guards.run().await;
            "remediation guard"
        });
    }
    let stop = shutdown.clone();
    tasks.spawn(async move {
        sweep_retention(dispatcher, stop).await;
        "retention sweep"
    });

    readiness.set(true);
    tracing::info!("ready");
    tokio::select! {
        // Shutdown first: once it fires, tasks end on purpose and must not be mistaken for a death.
        biased;
        () = shutdown.cancelled() => {}
        ended = tasks.join_next() => {
            readiness.set(false);
            let name = match ended {
                Some(Ok(name)) => name,
                _ => "unknown",
            };
            shutdown.cancel();
            return Err(ServeError::TaskDied(name));
        }
    }
    readiness.set(false);
    tracing::info!("shutting down: no new connections, finishing in-flight calls");
    while tasks.join_next().await.is_some() {}
    tracing::info!("stopped");
    Ok(())
}

async fn watch_tokens(tokens: Arc<AgentTokens>, interval: Duration, shutdown: CancellationToken) {
    let mut ticker = watch_ticker(interval).await;
    while next_check(&mut ticker, &shutdown).await {
        let check = tokens.clone();
        match tokio::task::spawn_blocking(move || check.reload_if_changed()).await {
            Ok(Ok(true)) => tracing::info!(tokens = tokens.len(), "agent token file reloaded"),
            Ok(Ok(false)) => {}
            Ok(Err(err)) => {
                tracing::warn!(error = %err, "agent token file not reloaded; keeping the previous tokens")
            }
            Err(err) => {
                tracing::error!(error = %err, "token check panicked");
                return;
            }
        }
    }
}

async fn sweep_retention(dispatcher: Arc<Dispatcher>, shutdown: CancellationToken) {
    let mut ticker = tokio::time::interval(RETENTION_SWEEP_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = shutdown.cancelled() => return,
        }
        match dispatcher.sweep().await {
            Ok(record) => {
                let deleted: u64 = record.deleted.values().sum();
                if deleted > 0 {
                    tracing::info!(deleted, "{}", record.status_line(record.swept_ms));
                }
                for (kind, why) in &record.failed {
                    tracing::warn!(kind = %kind, error = %why, "retention sweep of {kind} failed; will try again");
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, "retention sweep not recorded; will try again")
            }
        }
    }
}

async fn watch_certificate(
    cert: Arc<ReloadingCert>,
    interval: Duration,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let mut ticker = watch_ticker(interval).await;
    while next_check(&mut ticker, &shutdown).await {
        let check = cert.clone();
        let result = tokio::task::spawn_blocking(move || check.reload_if_changed()).await;
        match result {
            Ok(Ok(true)) => {
                metrics
                    .tls_reloads
                    .get_or_create(&metrics::ResultLabels { result: "success" })
                    .inc();
                tracing::info!(cert = %cert.files().cert.display(), "serving certificate reloaded");
            }
            Ok(Ok(false)) => {}
            Ok(Err(err)) => {
                metrics
                    .tls_reloads
                    .get_or_create(&metrics::ResultLabels { result: "error" })
                    .inc();
                tracing::warn!(error = %err, "new certificate files are not usable yet; still serving the previous pair");
            }
            Err(err) => {
                tracing::error!(error = %err, "certificate check panicked");
                return;
            }
        }
    }
}

/// Has the served CA check the bundle at `path` against the serving certificate now, and logs what it did.
fn refresh_agent_ca(path: &std::path::Path, cert: &ReloadingCert, dispatcher: &Dispatcher) {
    let served = &dispatcher.upkeep.served_ca;
    match served.refresh(path, &cert.chain(), &tls::provider()) {
        Ok(Refreshed::Unchanged | Refreshed::StillGood) => {}
        Ok(Refreshed::Served) => {
            let digest = served.sha256().unwrap_or_default();
            tracing::info!(bundle = %path.display(), sha256 = %digest, "agent CA bundle served");
        }
        Err(err) => {
            let kept = served.sha256();
            tracing::error!(error = %err, bundle = %path.display(), kept_sha256 = kept.as_deref().unwrap_or("none"), "agent CA bundle refused; agents keep being offered the last good one");
        }
    }
}

async fn watch_agent_ca(
    path: PathBuf,
    cert: Arc<ReloadingCert>,
    dispatcher: Arc<Dispatcher>,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let mut ticker = watch_ticker(interval).await;
    while next_check(&mut ticker, &shutdown).await {
        let (check, serving, dispatch) = (path.clone(), cert.clone(), dispatcher.clone());
        let checked =
            tokio::task::spawn_blocking(move || refresh_agent_ca(&check, &serving, &dispatch))
                .await;
        if let Err(err) = checked {
            tracing::error!(error = %err, "agent CA bundle check panicked");
            return;
        }
    }
}

/// The ticker of a file watcher: its first check one `interval` after start (start-up has just read the
/// files), late ticks delayed rather than bunched.
async fn watch_ticker(interval: Duration) -> tokio::time::Interval {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    ticker
}

/// Waits for a watcher's next check; false once the server shuts down.
async fn next_check(ticker: &mut tokio::time::Interval, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        _ = ticker.tick() => true,
        () = shutdown.cancelled() => false,
    }
}
