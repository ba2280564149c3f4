//! The ceiling: a bare axum + rustls server that reads each request body and answers a constant JSON body,
//! served by the same hyper-util auto builder on the same certificate. Whatever our server does beyond this
//! (decode, diff, policy, patch, self-check, store, metrics, logging, limits) is what the ratio measures.

use std::sync::Arc;

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

fn router() -> Router {
    let mut router = Router::new();
    for hook in [
        Hook::CanUpdateMachine,
        Hook::CanUpdateMachineSet,
        Hook::UpdateMachine,
    ] {
        router = router.route(
            hook.path(),
            post(|body: Bytes| async move {
                // Read (and keep alive until here) the body, as a real handler must.
                std::hint::black_box(body.len());
                ([(CONTENT_TYPE, "application/json")], CONSTANT)
            }),
        );
    }
    router.layer(DefaultBodyLimit::max(BODY_LIMIT))
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
pub async fn serve(listener: TcpListener, config: rustls::ServerConfig, stop: CancellationToken) {
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let builder = Arc::new(Builder::new(TokioExecutor::new()));
    let app = router();
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
