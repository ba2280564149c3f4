//! A minimal plain-HTTP GET for the CLI (`status` reads the health port; no TLS there).

use http_body_util::{BodyExt as _, Empty};
use hyper::body::Bytes;

/// Largest answer read.
pub const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;

/// Why a GET failed.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The URL is not `http://host:port/path`.
    #[error("expected an http://host:port/path URL, got {0:?}")]
    Url(String),
    /// Connecting or talking failed.
    #[error("{0}")]
    Io(String),
    /// The server answered with an error status.
    #[error("HTTP {status}: {body}")]
    Status {
        /// The status code.
        status: u16,
        /// The start of the body.
        body: String,
    },
}

/// GETs a URL over plain HTTP/1.1 and returns the body and headers of a 200 answer.
pub async fn get_plain_response(url: &str) -> Result<(Vec<u8>, hyper::HeaderMap), HttpError> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| HttpError::Url(url.into()))?;
    let (authority, path) = rest
        .split_once('/')
        .map(|(a, p)| (a, format!("/{p}")))
        .unwrap_or((rest, "/".into()));
    let stream = tokio::net::TcpStream::connect(authority)
        .await
        .map_err(|e| HttpError::Io(e.to_string()))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| HttpError::Io(e.to_string()))?;
    tokio::spawn(connection);
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, authority)
        .body(Empty::<Bytes>::new())
        .map_err(|e| HttpError::Url(e.to_string()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| HttpError::Io(e.to_string()))?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = http_body_util::Limited::new(response.into_body(), MAX_ANSWER_BYTES)
        .collect()
        .await
        .map_err(|e| HttpError::Io(e.to_string()))?
        .to_bytes()
        .to_vec();
    if status != 200 {
        return Err(HttpError::Status {
            status,
            body: String::from_utf8_lossy(&body).chars().take(200).collect(),
        });
    }
    Ok((body, headers))
}

/// POSTs a JSON body over HTTPS (HTTP/1.1), verifying the server against `ca_pem` for `server_name`.
pub async fn post_tls(
    addr: std::net::SocketAddr,
    server_name: &str,
    ca_pem: &[u8],
    path: &str,
    body: Vec<u8>,
) -> Result<(u16, Vec<u8>), HttpError> {
    use rustls_pki_types::pem::PemObject as _;
    let io = |e: &dyn std::fmt::Display| HttpError::Io(e.to_string());
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(cert.map_err(|e| io(&e))?).map_err(|e| io(&e))?;
    }
    let config = rustls::ClientConfig::builder_with_provider(crate::server::tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| io(&e))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name =
        rustls_pki_types::ServerName::try_from(server_name.to_string()).map_err(|e| io(&e))?;
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| io(&e))?;
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| io(&e))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| io(&e))?;
    tokio::spawn(connection);
    let request = hyper::Request::post(path)
        .header(hyper::header::HOST, server_name)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(http_body_util::Full::new(Bytes::from(body)))
        .map_err(|e| HttpError::Url(e.to_string()))?;
    let response = sender.send_request(request).await.map_err(|e| io(&e))?;
    let status = response.status().as_u16();
    let body = http_body_util::Limited::new(response.into_body(), MAX_ANSWER_BYTES)
        .collect()
        .await
        .map_err(|e| io(&e))?
        .to_bytes()
        .to_vec();
    Ok((status, body))
}
