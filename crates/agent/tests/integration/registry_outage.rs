//! A registry outage the test controls: a TLS-terminating proxy in front of the real registry that serves the
//! registry's own certificate (the node's CA file vouches for it) and answers the requests the test tells it to
//! fail — 503, 429 with `Retry-After`, a dropped connection, a blob body cut short — while it forwards every
//! other request to the registry (hyper over TLS) untouched. It records every request it saw, with its
//! `Range` header and what it did with it.
#![allow(clippy::unwrap_used)]

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use http_body_util::{BodyExt as _, Full, combinators::BoxBody};
use hyper::body::{Body, Bytes, Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};

use crate::registry::Registry;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type ProxyBody = BoxBody<Bytes, BoxError>;
type Upstream = Client<hyper_rustls::HttpsConnector<HttpConnector>, Incoming>;

/// What the proxy does to one request instead of forwarding it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// `503 Service Unavailable`.
    Unavailable,
    /// `429 Too Many Requests` with `Retry-After: <seconds>`.
    TooManyRequests(u64),
    /// The connection closed without an answer.
    Drop,
    /// The registry's answer forwarded, its body cut (the connection aborted) after this many bytes.
    Cut(usize),
}

/// Which requests a fault may hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Any request.
    Any,
    /// A blob download (`/blobs/`).
    Blob,
}

/// One request the proxy saw.
#[derive(Clone, Debug)]
pub struct Seen {
    /// When it arrived.
    pub at: Instant,
    /// Its path.
    pub path: String,
    /// Its `Range` header.
    pub range: Option<String>,
    /// The fault it got; `None`: forwarded whole.
    pub fault: Option<Fault>,
}

#[derive(Default)]
struct Script {
    faults: VecDeque<(Target, Fault)>,
    /// Fail every request this way, whatever the queue holds.
    always: Option<Fault>,
    seen: Vec<Seen>,
}

/// The proxy; stops with the test's runtime.
pub struct OutageProxy {
    pub port: u16,
    script: Arc<Mutex<Script>>,
}

impl OutageProxy {
    pub async fn start(registry: &Registry) -> Self {
        let (cert, key) = registry.server_cert();
        let cert = rustls_pki_types::CertificateDer::pem_slice_iter(&cert)
            .map(Result::unwrap)
            .collect();
        use rustls_pki_types::pem::PemObject as _;
        let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(&key).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(cert, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let mut roots = rustls::RootCertStore::empty();
        let ca = std::fs::read(registry.ca_file()).unwrap();
        for cert in rustls_pki_types::CertificateDer::pem_slice_iter(&ca) {
            roots.add(cert.unwrap()).unwrap();
        }
        let client_tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(client_tls)
            .https_only()
            .enable_http1()
            .build();
        let upstream: Upstream = Client::builder(TokioExecutor::new()).build(connector);
        let target = registry.host();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let script = Arc::new(Mutex::new(Script::default()));
        let shared = script.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, upstream, script, target) = (
                    acceptor.clone(),
                    upstream.clone(),
                    shared.clone(),
                    target.clone(),
                );
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |req| {
                        handle(req, upstream.clone(), script.clone(), target.clone())
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Self { port, script }
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Queues `fault` for the next request `target` matches.
    pub fn fail_next(&self, target: Target, fault: Fault) {
        self.script
            .lock()
            .unwrap()
            .faults
            .push_back((target, fault));
    }

    /// Fails every request with `fault` (`None`: the outage is over).
    pub fn fail_all(&self, fault: Option<Fault>) {
        self.script.lock().unwrap().always = fault;
    }

    /// Every request so far, oldest first.
    pub fn seen(&self) -> Vec<Seen> {
        self.script.lock().unwrap().seen.clone()
    }

    /// Faults queued and not used yet.
    pub fn pending(&self) -> usize {
        self.script.lock().unwrap().faults.len()
    }
}

async fn handle(
    req: Request<Incoming>,
    upstream: Upstream,
    script: Arc<Mutex<Script>>,
    target: String,
) -> Result<Response<ProxyBody>, BoxError> {
    let path = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let fault = {
        let mut script = script.lock().unwrap();
        let fault = script.always.clone().or_else(|| {
            let blob = path.contains("/blobs/");
            let at = script
                .faults
                .iter()
                .position(|(t, _)| *t == Target::Any || blob)?;
            script.faults.remove(at).map(|(_, f)| f)
        });
        let range = req
            .headers()
            .get("range")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        script.seen.push(Seen {
            at: Instant::now(),
            path: path.clone(),
            range,
            fault: fault.clone(),
        });
        fault
    };
    let answer = |status: StatusCode, retry_after: Option<u64>| {
        let mut response = Response::builder()
            .status(status)
            .header("content-type", "application/json");
        if let Some(seconds) = retry_after {
            response = response.header("retry-after", seconds.to_string());
        }
        let body =
            format!(r#"{{"errors":[{{"code":"UNAVAILABLE","message":"outage ({status})"}}]}}"#);
        Ok(response
            .body(Full::new(Bytes::from(body)).map_err(|e| match e {}).boxed())
            .unwrap())
    };
    match fault {
        Some(Fault::Unavailable) => return answer(StatusCode::SERVICE_UNAVAILABLE, None),
        Some(Fault::TooManyRequests(seconds)) => {
            return answer(StatusCode::TOO_MANY_REQUESTS, Some(seconds));
        }
        // An error from the service makes hyper close the connection without an answer.
        Some(Fault::Drop) => return Err("connection dropped by the outage proxy".into()),
        Some(Fault::Cut(_)) | None => {}
    }
    let (mut parts, body) = req.into_parts();
    parts.uri = format!("https://{target}{path}").parse().unwrap();
    parts.headers.remove("host");
    let response = upstream
        .request(Request::from_parts(parts, body))
        .await
        .map_err(|e| -> BoxError { Box::new(e) })?;
    let (parts, body) = response.into_parts();
    let body = match fault {
        Some(Fault::Cut(after)) => Cut {
            inner: body,
            left: after,
        }
        .boxed(),
        _ => body.map_err(|e| -> BoxError { Box::new(e) }).boxed(),
    };
    Ok(Response::from_parts(parts, body))
}

/// A body that ends in an error after `left` more bytes: hyper then aborts the connection mid-body.
struct Cut {
    inner: Incoming,
    left: usize,
}

impl Body for Cut {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.left == 0 {
            return Poll::Ready(Some(Err("body cut by the outage proxy".into())));
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(mut data) => {
                    if data.len() > self.left {
                        data.truncate(self.left);
                    }
                    self.left -= data.len();
                    Poll::Ready(Some(Ok(Frame::data(data))))
                }
                Err(frame) => Poll::Ready(Some(Ok(frame))),
            },
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Box::new(e)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}
