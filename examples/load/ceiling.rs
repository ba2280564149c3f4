//! The ceiling: a bare axum + rustls server that reads each request body and answers a constant JSON body,
//! served by the same hyper-util auto builder on the same certificate. Three kinds ([`Ceiling`], [`App`]):
//! `parse` also parses every hook body into a `serde_json::Value` (the floor of any correct hook: it must at
//! least read its JSON), `constant` does not, and the durable ceiling parses and then writes one small record
//! per call through the default store's group commit (the floor of a hook that must record before it
//! answers). Whatever our server does beyond the ceiling (decode, diff, policy, patch, self-check, store,
//! metrics, logging, limits) is what the ratio measures.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::http::header::CONTENT_TYPE;
use axum::routing::post;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use inplace_updater::api::Hook;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// What the ceiling answers to every hook (a valid, minimal Success).
const CONSTANT: &str = r#"{"apiVersion":"hooks.runtime.cluster.x-k8s.io/v1alpha1","kind":"CanUpdateMachineResponse","status":"Success","message":"constant"}"#;

/// Same ceiling on request bodies as our server, so the worst case is accepted by both.
const BODY_LIMIT: usize = inplace_updater::server::MAX_BODY_BYTES;

/// What the ceiling does with a hook body before it answers the constant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Ceiling {
    /// Parse it into a `serde_json::Value` (issue 18's "parse ceiling").
    Parse,
    /// Only read it.
    Constant,
}

/// The record the durable ceiling writes per call: about the size of a stored CanUpdate verdict.
pub const DURABLE_RECORD_BYTES: usize = 256;

/// A ceiling server's behaviour: the kind, and for the durable ceiling the store every call writes to.
#[derive(Clone)]
pub struct App {
    /// What it does with a body.
    pub ceiling: Ceiling,
    /// When set, each hook call also puts one [`DURABLE_RECORD_BYTES`] record under a key of its own (a
    /// plain, durable put: on the `file:` store one group-committed fsync).
    pub durable: Option<Arc<dyn inplace_store::Store>>,
}

/// Keys of the durable ceiling's records never repeat.
static RECORDED: AtomicU64 = AtomicU64::new(0);

async fn record(store: &dyn inplace_store::Store) -> bool {
    let n = RECORDED.fetch_add(1, Ordering::Relaxed);
    store
        .put(
            &format!("ceiling/{n:016}"),
            vec![b'x'; DURABLE_RECORD_BYTES],
            inplace_store::Precondition::Any,
        )
        .await
        .is_ok()
}

fn router(app: App) -> Router {
    let ceiling = app.ceiling;
    let mut router = Router::new();
    for hook in [
        Hook::Discovery,
        Hook::CanUpdateMachine,
        Hook::CanUpdateMachineSet,
        Hook::UpdateMachine,
    ] {
        let durable = app.durable.clone();
        router = router.route(
            hook.path(),
            post(move |body: Bytes| async move {
                // Read (and keep alive until here) the body, as a real handler must; parse it if asked.
                if ceiling == Ceiling::Parse || durable.is_some() {
                    let parsed = serde_json::from_slice::<serde_json::Value>(&body);
                    std::hint::black_box(parsed.is_ok());
                }
                std::hint::black_box(body.len());
                if let Some(store) = &durable
                    && !record(store.as_ref()).await
                {
                    return (
                        axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                        [(CONTENT_TYPE, "application/json")],
                        "{}",
                    );
                }
                (
                    axum::http::StatusCode::OK,
                    [(CONTENT_TYPE, "application/json")],
                    CONSTANT,
                )
            }),
        );
    }
    router
        .route(
            inplace_agent_api::POLL_PATH,
            post(|body: Bytes| async move {
                // A long-poll that never has work: hold the request for its waitSeconds, answer "nothing".
                let wait = serde_json::from_slice::<serde_json::Value>(&body)
                    .ok()
                    .and_then(|v| v["waitSeconds"].as_u64())
                    .unwrap_or(0)
                    .min(u64::from(inplace_agent_api::MAX_WAIT_SECONDS));
                tokio::time::sleep(std::time::Duration::from_secs(wait)).await;
                ([(CONTENT_TYPE, "application/json")], "{}")
            }),
        )
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
}

/// `load ceiling-serve`: the ceiling as a process of its own, so /proc tells its memory next to ours. Prints
/// its address the way our server logs it, then serves until SIGTERM / SIGINT.
pub fn serve_process(cert: &std::path::Path, key: &std::path::Path) -> anyhow::Result<()> {
    let config = tls_config(cert, key)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        eprintln!(
            "{}",
            serde_json::json!({"fields": {"hooks": listener.local_addr()?.to_string()}})
        );
        let stop = CancellationToken::new();
        let trigger = stop.clone();
        tokio::spawn(async move {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            trigger.cancel();
        });
        let app = App {
            ceiling: Ceiling::Constant,
            durable: None,
        };
        serve(listener, config, stop, app).await;
        anyhow::Ok(())
    })
}

/// A rustls server config for the given dev certificate (HTTP/1.1 and h2 by ALPN, as ours).
pub fn tls_config(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> anyhow::Result<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(cert)?.collect::<Result<_, _>>()?;
    let key = PrivateKeyDer::from_pem_file(key)?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// Accepts TLS connections until `stop` fires.
pub async fn serve(
    listener: TcpListener,
    config: rustls::ServerConfig,
    stop: CancellationToken,
    app: App,
) {
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let builder = Arc::new(Builder::new(TokioExecutor::new()));
    let app = router(app);
    loop {
        let (tcp, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(_) => continue,
            },
            () = stop.cancelled() => return,
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let builder = builder.clone();
        let app = app.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let connection =
                builder.serve_connection(TokioIo::new(tls), TowerToHyperService::new(app));
            tokio::select! {
                _ = connection => {}
                () = stop.cancelled() => {}
            }
        });
    }
}
