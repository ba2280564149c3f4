//! What the control-plane preflight sees of etcd, over etcd's JSON gateway with the node's health-check client
//! certificate: the members (`POST {endpoint}/v3/cluster/member/list`), the local member's id (`POST
//! {endpoint}/v3/maintenance/status`), and each member's health (`GET {clientURL}/health`), all at once.
//! When the local endpoint does not list the members (its member is down: disrupting it loses nothing when
//! the others keep a quorum), the other members the last listing showed are asked instead, all at once, the
//! first answer used (`members_seen.rs`). Every request is bounded by [`ETCD_REQUEST_TIMEOUT`] and its
//! answer by [`MAX_ETCD_ANSWER_BYTES`]; the certificate files are read again at every check (kubeadm renews
//! them in place).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;
use serde_json::Value;

use super::ControlPlaneConfig;
use super::decide::{Etcd, Member};
use super::members_seen::{self, MembersSeen};
use crate::fsutil::RootFs;
use crate::limits::MAX_ETCD_PKI_FILE_BYTES;
use crate::net::client::{HttpsClient, Unanswered, error_chain, send_bounded};

/// Longest one request to an etcd member may take (connect, TLS, answer).
pub const ETCD_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest answer read from an etcd member.
pub const MAX_ETCD_ANSWER_BYTES: usize = 256 * 1024;

/// Why etcd could not be asked, or did not answer as expected.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EtcdError {
    /// A certificate, key or CA file could not be read (missing, over [`MAX_ETCD_PKI_FILE_BYTES`]).
    #[error("controlPlane.{key}: {source}")]
    Read {
        /// The config key naming the file.
        key: &'static str,
        /// What failed.
        #[source]
        source: inplace_bounded_read::ReadError,
    },
    /// A file holds no usable PEM, or TLS refused the certificate and key (the key's bytes are never shown).
    #[error("controlPlane.{key}: {reason}")]
    Tls {
        /// The config key (or keys) at fault.
        key: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// No answer: connection, TLS handshake, or the connection dropped.
    #[error("{url}: {reason}")]
    Transport {
        /// The URL asked.
        url: String,
        /// The error chain.
        reason: String,
    },
    /// No answer within [`ETCD_REQUEST_TIMEOUT`].
    #[error("{url}: no answer within {} s", ETCD_REQUEST_TIMEOUT.as_secs())]
    Timeout {
        /// The URL asked.
        url: String,
    },
    /// An answer that is not 2xx, not the expected JSON, or over [`MAX_ETCD_ANSWER_BYTES`].
    #[error("{url}: {reason}")]
    Answer {
        /// The URL asked.
        url: String,
        /// What was wrong with it.
        reason: String,
    },
    /// The local endpoint did not list the members, and no other member is known from an earlier listing.
    #[error("{local} (no other member known to ask: the agent learns them from a listing)")]
    NoOtherMember {
        /// Why the local endpoint did not list them.
        #[source]
        local: Box<EtcdError>,
    },
    /// Neither the local endpoint nor any other member known from an earlier listing listed the members.
    #[error("{local}; the other members asked instead: {others}")]
    NoMemberList {
        /// Why the local endpoint did not list them.
        #[source]
        local: Box<EtcdError>,
        /// Why each other member did not (`url: reason`, `; `-separated).
        others: String,
    },
}

impl EtcdError {
    /// What went wrong, without the URL (when the message names the member already).
    fn reason(&self) -> String {
        match self {
            Self::Transport { reason, .. } | Self::Answer { reason, .. } => reason.clone(),
            Self::Timeout { .. } => {
                format!("no answer within {} s", ETCD_REQUEST_TIMEOUT.as_secs())
            }
            other => other.to_string(),
        }
    }
}

/// Sees etcd: `Etcd::NoLocalMember` when `manifest` (node path) does not exist. The members seen are kept in
/// `state_dir`.
pub(crate) async fn observe(
    config: &ControlPlaneConfig,
    fs: &RootFs,
    manifest: &str,
    state_dir: &Path,
) -> Etcd {
    if !config.check_etcd {
        return Etcd::NotChecked;
    }
    let manifest = match fs.path(manifest) {
        Ok(path) => path,
        Err(e) => return Etcd::Unreachable(format!("etcd.manifest: {e}")),
    };
    match manifest.try_exists() {
        Ok(false) => return Etcd::NoLocalMember,
        Ok(true) => {}
        Err(e) => return Etcd::Unreachable(format!("{}: {e}", manifest.display())),
    }
    match ask(config, fs, state_dir).await {
        Ok(etcd) => etcd,
        Err(e) => Etcd::Unreachable(e.to_string()),
    }
}

async fn ask(
    config: &ControlPlaneConfig,
    fs: &RootFs,
    state_dir: &Path,
) -> Result<Etcd, EtcdError> {
    let http = client(config, fs)?;
    let endpoint = &config.etcd_endpoint;
    let seen = members_seen::load(state_dir).await;
    let list_url = member_list_url(endpoint);
    let status_url = format!("{endpoint}/v3/maintenance/status");
    let (list, status) = tokio::join!(post(&http, &list_url), post(&http, &status_url));
    let told_id = status
        .and_then(|body| decode::<Status>(&status_url, &body))
        .ok()
        .and_then(|s| id(&s.header.member_id));
    let (list, listed_by) = match list.and_then(|body| decode::<MemberList>(&list_url, &body)) {
        Ok(list) => (list, None),
        Err(local) => {
            let others = seen.others(endpoint);
            if others.is_empty() {
                return Err(EtcdError::NoOtherMember {
                    local: Box::new(local),
                });
            }
            let (list, url) =
                list_from_any(&http, others)
                    .await
                    .map_err(|others| EtcdError::NoMemberList {
                        local: Box::new(local),
                        others,
                    })?;
            (list, Some(url))
        }
    };
    // Without the local id (told now, else before) the member is looked for by the node's name.
    let local_id = told_id.or(seen.local_id);
    let mut health = tokio::task::JoinSet::new();
    for (i, member) in list.members.iter().enumerate() {
        let url = member.client_urls.first().cloned();
        let http = http.clone();
        health.spawn(async move {
            let health = match &url {
                Some(url) => member_health(&http, url).await,
                None => Err("not started (it lists no client URL)".to_owned()),
            };
            (i, url, health)
        });
    }
    let mut members: Vec<Option<Member>> = vec![None; list.members.len()];
    while let Some(joined) = health.join_next().await {
        let Ok((i, url, health)) = joined else {
            continue;
        };
        let listed = &list.members[i];
        members[i] = Some(Member {
            id: id(&listed.id).unwrap_or_default(),
            name: listed.name.clone(),
            url,
            learner: listed.is_learner,
            health,
        });
    }
    let now_seen = MembersSeen {
        local_id,
        client_urls: list
            .members
            .iter()
            .filter_map(|m| m.client_urls.first().cloned())
            .collect(),
    };
    members_seen::save(state_dir, &seen, now_seen).await;
    Ok(Etcd::Members {
        members: members.into_iter().flatten().collect(),
        local_id,
        listed_by,
    })
}

fn member_list_url(client_url: &str) -> String {
    format!(
        "{}/v3/cluster/member/list",
        client_url.trim_end_matches('/')
    )
}

/// The member list from the first of `urls` (other members' client URLs) to answer it, all asked at once, and
/// that URL; else why each did not (`url: reason; …`).
async fn list_from_any(
    http: &HttpsClient,
    urls: Vec<String>,
) -> Result<(MemberList, String), String> {
    let mut asked = tokio::task::JoinSet::new();
    for url in urls {
        let http = http.clone();
        asked.spawn(async move {
            let list_url = member_list_url(&url);
            let list = post(&http, &list_url)
                .await
                .and_then(|body| decode::<MemberList>(&list_url, &body));
            (url, list)
        });
    }
    let mut failures = Vec::new();
    while let Some(joined) = asked.join_next().await {
        let Ok((url, list)) = joined else {
            continue;
        };
        match list {
            Ok(list) => return Ok((list, url)),
            Err(e) => failures.push(format!("{url}: {}", e.reason())),
        }
    }
    failures.sort();
    Err(failures.join("; "))
}

/// `GET {url}/health`: `{"health":"true"}` is healthy; anything else says why not.
async fn member_health(http: &HttpsClient, url: &str) -> Result<(), String> {
    let health_url = format!("{}/health", url.trim_end_matches('/'));
    let request = hyper::Request::get(&health_url)
        .body(Full::new(Bytes::new()))
        .map_err(|e| format!("{health_url}: {e}"))?;
    let (status, body) = exchange(http, &health_url, request)
        .await
        .map_err(|e| e.reason())?;
    let answer: Health = serde_json::from_slice(&body).unwrap_or_default();
    if status.is_success() && answer.health == "true" {
        return Ok(());
    }
    let reason = if answer.reason.is_empty() {
        String::new()
    } else {
        format!(" ({})", answer.reason)
    };
    Err(format!("HTTP {status}, health {:?}{reason}", answer.health))
}

/// POSTs `{}` to `url` and returns a 2xx body.
async fn post(http: &HttpsClient, url: &str) -> Result<Bytes, EtcdError> {
    let request = hyper::Request::post(url)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from_static(b"{}")))
        .map_err(|e| EtcdError::Transport {
            url: url.to_owned(),
            reason: e.to_string(),
        })?;
    let (status, body) = exchange(http, url, request).await?;
    if !status.is_success() {
        let text = String::from_utf8_lossy(&body[..body.len().min(256)]).into_owned();
        return Err(EtcdError::Answer {
            url: url.to_owned(),
            reason: format!("HTTP {status}: {text}"),
        });
    }
    Ok(body)
}

async fn exchange(
    http: &HttpsClient,
    url: &str,
    request: hyper::Request<Full<Bytes>>,
) -> Result<(hyper::StatusCode, Bytes), EtcdError> {
    let exchange = send_bounded(http, request, MAX_ETCD_ANSWER_BYTES);
    tokio::time::timeout(ETCD_REQUEST_TIMEOUT, exchange)
        .await
        .map_err(|_| EtcdError::Timeout {
            url: url.to_owned(),
        })?
        .map_err(|e| match e {
            Unanswered::Send(e) => EtcdError::Transport {
                url: url.to_owned(),
                reason: error_chain(&e),
            },
            Unanswered::Body(reason) => EtcdError::Answer {
                url: url.to_owned(),
                reason,
            },
        })
}

fn decode<T: serde::de::DeserializeOwned>(url: &str, body: &[u8]) -> Result<T, EtcdError> {
    serde_json::from_slice(body).map_err(|e| EtcdError::Answer {
        url: url.to_owned(),
        reason: e.to_string(),
    })
}

/// A member id as the gateway writes a uint64: a decimal string (or, leniently, a number).
fn id(value: &Value) -> Option<u64> {
    match value {
        Value::String(text) => text.parse().ok(),
        other => other.as_u64(),
    }
}

/// An HTTP(S) client presenting the configured client certificate, trusting the configured CA only.
fn client(config: &ControlPlaneConfig, fs: &RootFs) -> Result<HttpsClient, EtcdError> {
    let read = |key: &'static str, node_path: &str| {
        let path = fs.path(node_path).map_err(|e| EtcdError::Tls {
            key,
            reason: e.into(),
        })?;
        inplace_bounded_read::read(&path, MAX_ETCD_PKI_FILE_BYTES)
            .map_err(|source| EtcdError::Read { key, source })
    };
    let ca = read("etcdCaFile", &config.etcd_ca_file)?;
    let cert = read("etcdCertFile", &config.etcd_cert_file)?;
    let key = read("etcdKeyFile", &config.etcd_key_file)?;
    let pem = |key: &'static str| {
        move |e: rustls_pki_types::pem::Error| EtcdError::Tls {
            key,
            reason: e.to_string(),
        }
    };
    let mut roots = rustls::RootCertStore::empty();
    let cas = CertificateDer::pem_slice_iter(&ca)
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem("etcdCaFile"))?;
    if roots.add_parsable_certificates(cas).0 == 0 {
        return Err(EtcdError::Tls {
            key: "etcdCaFile",
            reason: "no usable CA certificate".to_owned(),
        });
    }
    let chain = CertificateDer::pem_slice_iter(&cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem("etcdCertFile"))?;
    let key = PrivateKeyDer::from_pem_slice(&key).map_err(pem("etcdKeyFile"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| EtcdError::Tls {
            key: "etcdCaFile",
            reason: e.to_string(),
        })?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| EtcdError::Tls {
            key: "etcdCertFile/etcdKeyFile",
            reason: e.to_string(),
        })?;
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(ETCD_REQUEST_TIMEOUT));
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new()).build(connector))
}

/// `/v3/cluster/member/list`'s answer.
#[derive(Deserialize)]
struct MemberList {
    #[serde(default)]
    members: Vec<ListedMember>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListedMember {
    #[serde(rename = "ID", default)]
    id: Value,
    #[serde(default)]
    name: String,
    #[serde(rename = "clientURLs", default)]
    client_urls: Vec<String>,
    #[serde(default)]
    is_learner: bool,
}

/// `/v3/maintenance/status`'s answer (the part read).
#[derive(Deserialize)]
struct Status {
    header: StatusHeader,
}

#[derive(Deserialize)]
struct StatusHeader {
    #[serde(default)]
    member_id: Value,
}

/// `/health`'s answer.
#[derive(Default, Deserialize)]
struct Health {
    #[serde(default)]
    health: String,
    #[serde(default)]
    reason: String,
}
