//! What every fake API server here shares: a fresh CA and a server certificate for 127.0.0.1 (rcgen, rustls), a
//! loopback listener served from a thread and Tokio runtime of its own (so a fake starts from any test, process or
//! `demo`), the kubeconfig kube-rs connects with (CA data and a bearer token), Kubernetes `Status` bodies, and an
//! "unreachable" switch that drops every new connection before TLS. Dropping a [`Serving`] shuts it down.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

/// A TLS listener on `127.0.0.1:<free port>` serving one router (see the module docs).
pub(crate) struct Serving {
    addr: SocketAddr,
    ca_pem: String,
    dir: tempfile::TempDir,
    unreachable: Arc<AtomicBool>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Serving {
    /// Starts serving `app` on a thread named `name`.
    pub(crate) fn start(app: Router, name: &str) -> io::Result<Self> {
        let (ca_pem, server_config) = tls_config().map_err(io::Error::other)?;
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let unreachable = Arc::new(AtomicBool::new(false));
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let refuse = unreachable.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                runtime.block_on(serve(std_listener, server_config, app, refuse, stopped))
            })?;
        Ok(Self {
            addr,
            ca_pem,
            dir: tempfile::tempdir()?,
            unreachable,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// `https://127.0.0.1:<port>`.
    pub(crate) fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Writes a kubeconfig for this server at `path`, authenticating with `token`.
    pub(crate) fn write_kubeconfig(&self, path: &Path, token: &str) -> io::Result<()> {
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n    certificate-authority-data: {ca}\nusers:\n- name: user\n  user:\n    token: {token}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: user\ncurrent-context: fake\n",
            self.url()
        );
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, text)
    }

    /// The default kubeconfig path under [`Self::dir`].
    pub(crate) fn kubeconfig_path(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    /// While true, every new connection is closed before the TLS handshake (an API server that cannot be
    /// reached); connections already open are not touched.
    pub(crate) fn set_unreachable(&self, unreachable: bool) {
        self.unreachable.store(unreachable, Ordering::SeqCst);
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A Kubernetes `Status` failure body, as the API server sends it.
pub(crate) fn status(code: u16, reason: &str, message: &str, details: Value) -> (u16, Value) {
    let mut body = json!({
        "apiVersion": "v1", "kind": "Status", "status": "Failure",
        "message": message, "reason": reason, "code": code,
    });
    if !details.is_null() {
        body["details"] = details;
    }
    (code, body)
}

/// A JSON answer.
pub(crate) fn answer((code, body): (u16, Value)) -> Response {
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        code,
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// `None` when the request carries `Authorization: Bearer <token>`, else the API server's 401.
pub(crate) fn unauthorized(headers: &axum::http::HeaderMap, token: &str) -> Option<Response> {
    let expected = format!("Bearer {token}");
    let ok = headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(expected.as_str());
    (!ok).then(|| answer(status(401, "Unauthorized", "Unauthorized", Value::Null)))
}

/// A fresh CA and a server certificate for 127.0.0.1/localhost signed by it.
fn tls_config() -> Result<(String, rustls::ServerConfig), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let ca_key = rcgen::KeyPair::generate().map_err(|x| e(&x))?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(|x| e(&x))?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "fake apiserver CA");
    let ca_cert = ca_params.self_signed(&ca_key).map_err(|x| e(&x))?;
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().map_err(|x| e(&x))?;
    let mut params =
        rcgen::CertificateParams::new(vec!["localhost".to_owned()]).map_err(|x| e(&x))?;
    params
        .subject_alt_names
        .push(rcgen::SanType::IpAddress(std::net::IpAddr::from([
            127, 0, 0, 1,
        ])));
    let cert = params.signed_by(&key, &issuer).map_err(|x| e(&x))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|x| e(&x))?
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .map_err(|x| e(&x))?;
    Ok((ca_cert.pem(), config))
}

async fn serve(
    listener: std::net::TcpListener,
    config: rustls::ServerConfig,
    app: Router,
    unreachable: Arc<AtomicBool>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    loop {
        let accepted = tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else { continue };
        if unreachable.load(Ordering::SeqCst) {
            drop(stream);
            continue;
        }
        let acceptor = acceptor.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(stream).await else {
                return;
            };
            let service = hyper_util::service::TowerToHyperService::new(app);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
    }
}
