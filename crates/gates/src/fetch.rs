//! One GET to a gate's endpoint: the CA file (else the system CA store) as trust root, the bearer token read
//! from its file on every call (a rotated token is used at once), the gate's timeout over the whole exchange,
//! and the body read no further than [`MAX_GATE_ANSWER_BYTES`]. Errors are causes for an operator: they name
//! files and addresses, never a token.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper::header::{ACCEPT, AUTHORIZATION, HeaderValue};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject as _;

use crate::config::Endpoint;

/// Largest answer body read from a gate (more is an unreachable gate: "answer larger than …").
pub const MAX_GATE_ANSWER_BYTES: usize = 1024 * 1024;

/// Largest `bearerTokenFile` read (at start-up and before every evaluation).
pub const MAX_TOKEN_FILE_BYTES: u64 = 16 * 1024;

/// Largest `caFile` read (at start-up and before every evaluation).
pub const MAX_CA_FILE_BYTES: u64 = 1024 * 1024;

/// An HTTP answer, any status.
pub(crate) struct Answer {
    /// The HTTP status code.
    pub status: u16,
    /// The body, at most [`MAX_GATE_ANSWER_BYTES`].
    pub body: Bytes,
}

/// GETs `endpoint.url` + `target` within `endpoint.timeout`.
pub(crate) async fn fetch(endpoint: &Endpoint, target: &str) -> Result<Answer, String> {
    match tokio::time::timeout(endpoint.timeout, exchange(endpoint, target)).await {
        Ok(result) => result,
        Err(_) => Err(format!(
            "no answer within {} s (timeoutSeconds)",
            endpoint.timeout.as_secs()
        )),
    }
}

async fn exchange(endpoint: &Endpoint, target: &str) -> Result<Answer, String> {
    let tls = client_tls(endpoint.ca_file.as_deref())?;
    // `build()` wraps hyper's HttpConnector, which also dials the https:// URLs the TLS layer asks it to.
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .build();
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build(connector);
    let uri: hyper::Uri = format!("{}{target}", endpoint.url)
        .parse()
        .map_err(|err| format!("bad request URI: {err}"))?;
    let mut request = hyper::Request::get(uri)
        .body(Empty::new())
        .map_err(|err| format!("bad request: {err}"))?;
    request
        .headers_mut()
        .insert(ACCEPT, HeaderValue::from_static("application/json"));
    if let Some(path) = &endpoint.bearer_token_file {
        let token = read_token(path)?;
        let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
            format!(
                "bearer token file {}: not a valid header value",
                path.display()
            )
        })?;
        value.set_sensitive(true);
        request.headers_mut().insert(AUTHORIZATION, value);
    }
    let response = client
        .request(request)
        .await
        .map_err(|err| describe(&err))?;
    let status = response.status().as_u16();
    let body = Limited::new(response.into_body(), MAX_GATE_ANSWER_BYTES)
        .collect()
        .await
        .map_err(|err| {
            if err.is::<http_body_util::LengthLimitError>() {
                format!("answer larger than {MAX_GATE_ANSWER_BYTES} bytes")
            } else {
                format!("reading the answer: {}", describe(err.as_ref()))
            }
        })?
        .to_bytes();
    Ok(Answer { status, body })
}

/// The token in `path`, trimmed; an error names the file, never its contents.
pub(crate) fn read_token(path: &Path) -> Result<String, String> {
    let text = inplace_bounded_read::read_to_string(path, MAX_TOKEN_FILE_BYTES)
        .map_err(|err| format!("bearer token file: {err}"))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(format!("bearer token file {} is empty", path.display()));
    }
    Ok(token.to_string())
}

/// Trust roots: the certificates in `ca_file`, else the system CA store.
pub(crate) fn client_tls(ca_file: Option<&Path>) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let pem = inplace_bounded_read::read(path, MAX_CA_FILE_BYTES)
                .map_err(|err| format!("CA file: {err}"))?;
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
                .collect::<Result<_, _>>()
                .map_err(|err| format!("CA file {}: {err}", path.display()))?;
            if roots.add_parsable_certificates(certs).0 == 0 {
                return Err(format!(
                    "CA file {}: no PEM certificate in it",
                    path.display()
                ));
            }
        }
        None => {
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|err| format!("TLS setup: {err}"))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// The error and its causes on one line, without hyper's generic outer layers: `connection refused`,
/// `dns error: failed to lookup address information: …`, `invalid peer certificate: UnknownIssuer`.
fn describe(err: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(err);
    while let Some(current) = next {
        if let Some(io) = current.downcast_ref::<std::io::Error>() {
            match io.kind() {
                std::io::ErrorKind::ConnectionRefused => return "connection refused".into(),
                std::io::ErrorKind::ConnectionReset => return "connection reset".into(),
                _ => {}
            }
        }
        let text = current.to_string();
        if !text.starts_with("client error") && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = current.source();
    }
    if parts.is_empty() {
        err.to_string()
    } else {
        parts.join(": ")
    }
}
