//! The client side: one rustls client config trusting the dev CA, and kept-alive HTTP/1.1 connections over it,
//! optionally from a chosen loopback source address (one source address has only ~28 000 ephemeral ports, so
//! 30 000 agents are spread over several 127.0.0.x).

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST, HeaderValue};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpSocket;
use tokio_rustls::TlsConnector;

/// Longest a TCP connect plus TLS handshake may take before the attempt counts as failed.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

/// A TLS client trusting `ca`, offering HTTP/1.1 only (CAPI and the agent keep HTTP/1.1 connections alive), or
/// no ALPN at all when `alpn` is false (the server then detects the protocol from the first bytes).
pub fn connector(ca: &Path, alpn: bool) -> anyhow::Result<TlsConnector> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).context("CA file")? {
        roots.add(cert.context("CA PEM")?)?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    if alpn {
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
    }
    Ok(TlsConnector::from(Arc::new(config)))
}

/// One kept-alive HTTP/1.1 connection over TLS.
pub struct Conn {
    sender: SendRequest<Full<Bytes>>,
    host: HeaderValue,
    auth: Option<HeaderValue>,
}

/// What a request got back.
pub struct Reply {
    pub status: u16,
    pub body: Bytes,
}

impl Conn {
    /// Connects to `addr` (from `source` when given) and completes the TLS and HTTP/1.1 handshakes.
    pub async fn open(
        connector: &TlsConnector,
        addr: SocketAddr,
        source: Option<IpAddr>,
        token: Option<&str>,
    ) -> anyhow::Result<Conn> {
        tokio::time::timeout(
            CONNECT_TIMEOUT,
            Self::open_now(connector, addr, source, token),
        )
        .await
        .context("connect timed out")?
    }

    async fn open_now(
        connector: &TlsConnector,
        addr: SocketAddr,
        source: Option<IpAddr>,
        token: Option<&str>,
    ) -> anyhow::Result<Conn> {
        let socket = TcpSocket::new_v4()?;
        if let Some(source) = source {
            socket.bind(SocketAddr::new(source, 0))?;
        }
        let tcp = socket.connect(addr).await?;
        tcp.set_nodelay(true)?;
        let tls = connector
            .connect(ServerName::try_from("localhost")?, tcp)
            .await?;
        let (sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await?;
        tokio::spawn(connection);
        Ok(Conn {
            sender,
            host: HeaderValue::from_str(&format!("localhost:{}", addr.port()))?,
            auth: token
                .map(|t| HeaderValue::from_str(&format!("Bearer {t}")))
                .transpose()?,
        })
    }

    /// POSTs `body` to `path` and reads the whole answer.
    pub async fn post(&mut self, path: &str, body: Bytes) -> anyhow::Result<Reply> {
        self.post_unless_closed(path, body)
            .await?
            .context("the server closed the connection before the request was sent")
    }

    /// As [`Conn::post`], but `Ok(None)` when the connection was closed before any of the request was
    /// written (the server closes a kept-alive connection idle for its `--header-read-timeout`): nothing
    /// reached the server, so the request may go again on a new connection. Go's `net/http`, which CAPI's
    /// controllers call hooks with, drops such a connection from its pool or sends again on a new one, so a
    /// CAPI call never fails for it.
    pub async fn post_unless_closed(
        &mut self,
        path: &str,
        body: Bytes,
    ) -> anyhow::Result<Option<Reply>> {
        if self.sender.ready().await.is_err() {
            return Ok(None);
        }
        let mut request = hyper::Request::post(path)
            .header(HOST, self.host.clone())
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(body))?;
        if let Some(auth) = &self.auth {
            request.headers_mut().insert(AUTHORIZATION, auth.clone());
        }
        let response = match self.sender.try_send_request(request).await {
            Ok(response) => response,
            Err(unsent) if unsent.message().is_some() => return Ok(None),
            Err(failed) => return Err(failed.into_error().into()),
        };
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        Ok(Some(Reply { status, body }))
    }
}
