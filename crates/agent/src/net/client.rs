//! The agent's HTTPS client: outbound only, HTTP/1.1 keep-alive, server verified against the
//! `--ca-file` (rustls with the ring provider), bearer token re-read from its file on every
//! request so a rotated token (a Secret's `..data` swap) takes effect at once; a successor token the server
//! offers is kept and promoted by [`crate::net::token_file`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use inplace_agent_api::{ErrorResponse, MAX_POLL_RESPONSE_BYTES, truncate_tail};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::limits::MAX_CA_FILE_BYTES;
use crate::net::token_file::TokenFiles;

/// TCP connect timeout.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle keep-alive connections are closed after this long.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Bytes of an error body kept for the log.
const ERROR_BODY_KEPT: usize = 512;

/// Why a request did not produce an answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// `--server`, `--ca-file` or TLS setup is unusable (fatal at start).
    #[error("{0}")]
    Setup(String),
    /// The token file is missing, empty or not a valid header value.
    #[error("token file {path}: {reason}")]
    Token {
        /// The file.
        path: String,
        /// What is wrong (never the token).
        reason: String,
    },
    /// Connection, TLS or HTTP failure.
    #[error("request to {url} failed: {reason}")]
    Transport {
        /// The URL.
        url: String,
        /// The error chain.
        reason: String,
        /// What kind of failure it was, for the diagnosis in the log.
        kind: TransportKind,
    },
    /// No answer within the timeout.
    #[error("request to {0} timed out")]
    Timeout(String),
    /// A non-2xx status.
    #[error("server answered {status} to {url}: {message}")]
    Status {
        /// The URL.
        url: String,
        /// HTTP status code.
        status: u16,
        /// The server's `message` (or the start of its body).
        message: String,
    },
    /// A 2xx body that is not the expected JSON (or too large).
    #[error("bad answer from {url}: {reason}")]
    Decode {
        /// The URL.
        url: String,
        /// The decode error.
        reason: String,
    },
}

/// What went wrong below HTTP: the network, the TLS handshake, or the server's certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    /// No TCP connection (refused, unreachable, DNS, connect timeout).
    Connect,
    /// The server's certificate does not chain to `--ca-file`.
    UnknownCa,
    /// The server's certificate is not valid for the name the agent checks.
    NameMismatch,
    /// The server's certificate has expired or is not valid yet.
    CertificateExpired,
    /// Another problem with the server's certificate.
    Certificate,
    /// The peer did not speak TLS (it answered with something else).
    NotTls,
    /// The peer closed the connection during the TLS handshake.
    HandshakeClosed,
    /// Anything else (e.g. a connection reset mid-request).
    Other,
}

fn tls_kind(error: &rustls::Error) -> TransportKind {
    use rustls::CertificateError as C;
    match error {
        rustls::Error::InvalidCertificate(cert) => match cert {
            // A CA of the same name but another key (two `certs` runs, a re-created issuer) fails the
            // signature check rather than the issuer lookup: to the operator it is the same mistake.
            C::UnknownIssuer | C::BadSignature => TransportKind::UnknownCa,
            C::NotValidForName | C::NotValidForNameContext { .. } => TransportKind::NameMismatch,
            C::Expired
            | C::ExpiredContext { .. }
            | C::NotValidYet
            | C::NotValidYetContext { .. } => TransportKind::CertificateExpired,
            _ => TransportKind::Certificate,
        },
        rustls::Error::InvalidMessage(_) => TransportKind::NotTls,
        _ => TransportKind::Other,
    }
}

/// Classifies a request error by what is in its source chain. A rustls error hides inside an `io::Error`
/// (hyper-rustls even wraps that one in another), and `io::Error::source()` skips the error it wraps, so an
/// `io::Error` is followed into what it wraps rather than to its source.
pub(crate) fn transport_kind(error: &(dyn std::error::Error + 'static)) -> TransportKind {
    use std::io::ErrorKind;
    let mut connect = false;
    let mut current = Some(error);
    while let Some(err) = current {
        if let Some(tls) = err.downcast_ref::<rustls::Error>() {
            return tls_kind(tls);
        }
        if err
            .downcast_ref::<hyper_util::client::legacy::Error>()
            .is_some_and(|e| e.is_connect())
        {
            connect = true;
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            match io.kind() {
                ErrorKind::UnexpectedEof if connect => return TransportKind::HandshakeClosed,
                ErrorKind::ConnectionRefused
                | ErrorKind::TimedOut
                | ErrorKind::HostUnreachable
                | ErrorKind::NetworkUnreachable
                | ErrorKind::AddrNotAvailable => return TransportKind::Connect,
                _ => {}
            }
            if let Some(inner) = io.get_ref() {
                current = Some(inner as &(dyn std::error::Error + 'static));
                continue;
            }
        }
        current = err.source();
    }
    if connect {
        TransportKind::Connect
    } else {
        TransportKind::Other
    }
}

/// A client for one server.
#[derive(Clone)]
pub(crate) struct ServerClient {
    base: String,
    tokens: Arc<TokenFiles>,
    ca_file: PathBuf,
    server_name: Option<String>,
    /// SHA-256 of the CA bundle this client verifies the server with.
    ca_sha256: String,
    http: HttpsClient,
}

impl std::fmt::Debug for ServerClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerClient")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl ServerClient {
    /// Builds the client; fails on a non-https URL or an unusable CA file.
    pub fn new(
        server: &str,
        ca_file: &Path,
        token_file: &Path,
        server_name: Option<&str>,
    ) -> Result<Self, ClientError> {
        let pem = inplace_bounded_read::read(ca_file, MAX_CA_FILE_BYTES)
            .map_err(|e| ClientError::Setup(format!("--ca-file: {e}")))?;
        let tokens = Arc::new(TokenFiles::new(token_file));
        Self::with_ca(server, ca_file, &pem, tokens, server_name)
    }

    /// The same client, verifying the server with the CA bundle `pem` instead (kept for `--ca-file`).
    pub fn trusting(&self, pem: &[u8]) -> Result<Self, ClientError> {
        Self::with_ca(
            &self.base,
            &self.ca_file,
            pem,
            self.tokens.clone(),
            self.server_name.as_deref(),
        )
    }

    /// SHA-256 (64 lower-case hex digits) of the CA bundle this client verifies the server with: what the
    /// agent reports as `facts.caSha256`.
    pub fn ca_sha256(&self) -> &str {
        &self.ca_sha256
    }

    /// The `--ca-file` this client's CA bundle belongs in.
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    fn with_ca(
        server: &str,
        ca_file: &Path,
        pem: &[u8],
        tokens: Arc<TokenFiles>,
        server_name: Option<&str>,
    ) -> Result<Self, ClientError> {
        let uri: hyper::Uri = server
            .parse()
            .map_err(|e| ClientError::Setup(format!("--server {server:?} is not a URL: {e}")))?;
        if uri.scheme_str() != Some("https") || uri.authority().is_none() {
            return Err(ClientError::Setup(format!(
                "--server {server:?} must be an https:// URL"
            )));
        }
        if uri.query().is_some() {
            return Err(ClientError::Setup(format!(
                "--server {server:?} must not have a query"
            )));
        }
        let base = server.trim_end_matches('/').to_owned();

        let tls = tls_trusting(pem)
            .map_err(|e| ClientError::Setup(format!("--ca-file {}: {e}", ca_file.display())))?;

        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        http.set_nodelay(true);
        let builder = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_only();
        let builder = match server_name {
            Some(name) => {
                let name = rustls_pki_types::ServerName::try_from(name.to_owned())
                    .map_err(|e| ClientError::Setup(format!("--tls-server-name {name:?}: {e}")))?;
                builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name))
            }
            None => builder,
        };
        let connector = builder.enable_http1().wrap_connector(http);
        let http = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .build(connector);
        Ok(Self {
            base,
            tokens,
            ca_file: ca_file.to_path_buf(),
            server_name: server_name.map(str::to_owned),
            ca_sha256: sha256_hex(pem),
            http,
        })
    }

    /// The server's base URL (`--server`).
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Keeps a successor token the server offered (see [`crate::net::token_file`]).
    pub fn keep_successor(
        &self,
        token: &inplace_agent_api::SecretString,
    ) -> Result<(), crate::fsutil::FsError> {
        self.tokens.keep_successor(token)
    }

    /// The `Authorization` value for the next request, and whether it carries the successor token.
    fn token(&self) -> Result<(HeaderValue, bool), ClientError> {
        let err = |reason: String| ClientError::Token {
            path: self.tokens.path().display().to_string(),
            reason,
        };
        let presented = self.tokens.read().map_err(err)?;
        let mut value = HeaderValue::from_str(&format!("Bearer {}", presented.token.expose()))
            .map_err(|_| err("contains characters not allowed in an HTTP header".into()))?;
        value.set_sensitive(true);
        Ok((value, presented.successor))
    }

    /// `POST`s `body` as JSON to `path` and decodes a 2xx answer as `R`.
    pub async fn post<T: Serialize, R: DeserializeOwned>(
        &self,
        path: &str,
        body: &T,
        timeout: Duration,
    ) -> Result<R, ClientError> {
        let url = format!("{}{path}", self.base);
        let (token, successor) = self.token()?;
        let bytes = serde_json::to_vec(body).map_err(|e| ClientError::Decode {
            url: url.clone(),
            reason: e.to_string(),
        })?;
        let request = hyper::Request::post(&url)
            .header(CONTENT_TYPE, "application/json")
            .header(AUTHORIZATION, token)
            .body(Full::new(Bytes::from(bytes)))
            .map_err(|e| ClientError::Transport {
                url: url.clone(),
                reason: e.to_string(),
                kind: TransportKind::Other,
            })?;
        let body = self
            .exchange(&url, request, successor, MAX_POLL_RESPONSE_BYTES, timeout)
            .await?;
        serde_json::from_slice(&body).map_err(|e| ClientError::Decode {
            url,
            reason: e.to_string(),
        })
    }
}

impl ServerClient {
    /// `GET`s `path` (with the token) and returns a 2xx body of at most `limit` bytes.
    pub async fn get_bytes(
        &self,
        path: &str,
        limit: usize,
        timeout: Duration,
    ) -> Result<Bytes, ClientError> {
        let url = format!("{}{path}", self.base);
        let (token, successor) = self.token()?;
        let request = hyper::Request::get(&url)
            .header(AUTHORIZATION, token)
            .body(Full::new(Bytes::new()))
            .map_err(|e| ClientError::Transport {
                url: url.clone(),
                reason: e.to_string(),
                kind: TransportKind::Other,
            })?;
        self.exchange(&url, request, successor, limit, timeout)
            .await
    }

    /// Sends `request` (`successor`: its token is the successor not yet confirmed) and returns a 2xx body of at most `limit` bytes; any other status is an error carrying
    /// the server's message.
    async fn exchange(
        &self,
        url: &str,
        request: hyper::Request<Full<Bytes>>,
        successor: bool,
        limit: usize,
        timeout: Duration,
    ) -> Result<Bytes, ClientError> {
        let exchange = send_bounded(&self.http, request, limit);
        let (status, body) = tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| ClientError::Timeout(url.to_owned()))?
            .map_err(|e| match e {
                Unanswered::Send(e) => ClientError::Transport {
                    url: url.to_owned(),
                    reason: error_chain(&e),
                    kind: transport_kind(&e),
                },
                Unanswered::Body(reason) => ClientError::Decode {
                    url: url.to_owned(),
                    reason,
                },
            })?;
        self.tokens.answered(successor, Some(status.as_u16()));
        if !status.is_success() {
            let message = match serde_json::from_slice::<ErrorResponse>(&body) {
                Ok(error) => truncate_tail(&error.message, ERROR_BODY_KEPT).to_owned(),
                Err(_) => {
                    let text = String::from_utf8_lossy(&body[..body.len().min(ERROR_BODY_KEPT)]);
                    text.into_owned()
                }
            };
            return Err(ClientError::Status {
                url: url.to_owned(),
                status: status.as_u16(),
                message,
            });
        }
        Ok(body)
    }
}

/// The agent's HTTP(S) client: hyper's pooled client over rustls (the server's, and etcd's in the preflight).
pub(crate) type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Why a request got no whole answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Unanswered {
    /// The request failed: no connection, the TLS handshake, or the connection dropped.
    #[error("{0}")]
    Send(#[source] hyper_util::client::legacy::Error),
    /// The answer's body could not be read, or is over the limit.
    #[error("{0}")]
    Body(String),
}

/// Sends `request` and reads its answer's body, at most `limit` bytes (the caller bounds the time).
pub(crate) async fn send_bounded(
    http: &HttpsClient,
    request: hyper::Request<Full<Bytes>>,
    limit: usize,
) -> Result<(hyper::StatusCode, Bytes), Unanswered> {
    let response = http.request(request).await.map_err(Unanswered::Send)?;
    let status = response.status();
    let body = Limited::new(response.into_body(), limit)
        .collect()
        .await
        .map_err(|e| Unanswered::Body(e.to_string()))?
        .to_bytes();
    Ok((status, body))
}

pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

/// A TLS client configuration (ring) that trusts only the CA certificates in the PEM bundle `pem`.
pub(crate) fn tls_trusting(pem: &[u8]) -> Result<rustls::ClientConfig, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let mut roots = rustls::RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err("no usable CA certificate".into());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// SHA-256 of `bytes` as the wire carries it (64 lower-case hex digits).
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    crate::hex::hex(&sha2::Sha256::digest(bytes))
}
