//! Downloads of the agent's own upgrade: from the server (`GET /agent/v1/binary`, with the agent's token and
//! CA) or from an `https://` URL the server names (verified against the node's system CA store). Both are
//! bounded in size ([`MAX_AGENT_BINARY_BYTES`]) and time ([`DOWNLOAD_TIMEOUT`]); the digest is checked by the
//! caller before anything is written.

use std::time::Duration;

use http_body_util::{BodyExt as _, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use inplace_agent_api::{AgentUpgrade, BINARY_PATH, MAX_AGENT_BINARY_BYTES};

use crate::net::client::{CONNECT_TIMEOUT, ServerClient};
use crate::upkeep::self_upgrade::UpgradeError;

/// Longest one download of an agent binary may take.
pub const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(300);

/// Downloads the binary `upgrade` offers.
pub(crate) async fn download(
    client: &ServerClient,
    upgrade: &AgentUpgrade,
) -> Result<Bytes, UpgradeError> {
    let failed = |reason: String| UpgradeError::Download {
        version: upgrade.version.clone(),
        reason,
    };
    let fetch = async {
        match &upgrade.url {
            None => client
                .get_bytes(
                    BINARY_PATH,
                    MAX_AGENT_BINARY_BYTES as usize,
                    DOWNLOAD_TIMEOUT,
                )
                .await
                .map_err(|e| e.to_string()),
            Some(url) => from_url(url).await,
        }
    };
    tokio::time::timeout(DOWNLOAD_TIMEOUT, fetch)
        .await
        .map_err(|_| {
            failed(format!(
                "no complete download within {} s",
                DOWNLOAD_TIMEOUT.as_secs()
            ))
        })?
        .map_err(failed)
}

/// `GET url` over HTTPS, verified against the system's CA store.
async fn from_url(url: &str) -> Result<Bytes, String> {
    if !url.starts_with("https://") {
        return Err(format!("{url:?} is not an https:// URL"));
    }
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_native_roots()
        .map_err(|e| format!("the system CA store: {e}"))?
        .https_only()
        .enable_http1()
        .wrap_connector(http);
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build(connector);
    let uri: hyper::Uri = url.parse().map_err(|e| format!("{url:?}: {e}"))?;
    let response = client.get(uri).await.map_err(|e| format!("{url}: {e}"))?;
    if !response.status().is_success() {
        return Err(format!("{url} answered {}", response.status()));
    }
    let body = Limited::new(response.into_body(), MAX_AGENT_BINARY_BYTES as usize)
        .collect()
        .await
        .map_err(|e| format!("{url}: {e} (at most {MAX_AGENT_BINARY_BYTES} bytes)"))?;
    Ok(body.to_bytes())
}
