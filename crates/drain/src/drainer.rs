//! The drain's calls to the Kubernetes API (kube-rs over rustls): get and patch the Node, list
//! the node's pods, create Evictions, get evicted pods until they are gone, and wait for the node
//! to be Ready at a kubelet version. Every wait ends at the caller's deadline with an error that
//! names what was still there. Dropping a returned future stops the work at once (the agent does
//! so when it shuts down).

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use tokio::time::Instant;

/// Largest kubeconfig file read.
pub const MAX_KUBECONFIG_BYTES: u64 = 256 * 1024;
/// Longest one API request may take (connect, write, read).
pub const MAX_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Pods asked for per page of the node's pod list.
pub const MAX_PODS_PER_PAGE: u32 = 100;
/// Most pods read from one node (pages stop there; a node runs far fewer).
pub const MAX_PODS_LISTED: usize = 5_000;
/// Largest eviction answer body read.
pub const MAX_EVICTION_ANSWER_BYTES: usize = 64 * 1024;
/// Default time between two looks at the node's pods (or its Ready condition).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(2);
/// Default time before an eviction the API refused (PDB, multiple PDBs, other error) is asked again.
pub const DEFAULT_EVICTION_RETRY_INTERVAL: Duration = Duration::from_secs(5);
/// Shortest interval accepted for either (config values are clamped into this range).
pub const MIN_INTERVAL: Duration = Duration::from_millis(50);
/// Longest interval accepted for either.
pub const MAX_INTERVAL: Duration = Duration::from_secs(60);
/// How long one call (get or patch the Node, list or get pods) keeps retrying a transient failure — a
/// connection error, 429 (API throttling), 500, 502, 503 or 504 — at the poll interval, at most until the
/// step's deadline. Right after `kubeadm upgrade` restarts a control plane node's API server such failures
/// are expected; one of them must not fail the step (or leave the node cordoned at the uncordon).
pub const TRANSIENT_RETRY_WINDOW: Duration = Duration::from_secs(60);

/// Why a drain, uncordon or wait did not end well.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    /// The kubeconfig could not be read (over [`MAX_KUBECONFIG_BYTES`], missing, not UTF-8).
    #[error("kubeconfig {path}: {source}")]
    ReadKubeconfig {
        /// Its path.
        path: String,
        /// What failed.
        source: inplace_bounded_read::ReadError,
    },
    /// The kubeconfig is not usable (YAML, context, credentials).
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig {
        /// Its path.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// An API call failed.
    #[error("{what}: {source}")]
    Api {
        /// The call.
        what: String,
        /// kube-rs' error.
        source: kube::Error,
    },
    /// Pods that the step's options do not allow evicting are on the node.
    #[error("cannot drain {node}: {pods}")]
    Blocked {
        /// The node.
        node: String,
        /// The pods and the option each needs.
        pods: String,
    },
    /// The deadline passed (text names the pods left and what they waited on).
    #[error("{0}")]
    Timeout(String),
}

/// How often the drain looks again (clamped into [`MIN_INTERVAL`]..=[`MAX_INTERVAL`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// Between two looks at the pods / the node.
    pub poll_interval: Duration,
    /// Before a refused eviction is asked again.
    pub eviction_retry_interval: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            poll_interval: DEFAULT_POLL_INTERVAL,
            eviction_retry_interval: DEFAULT_EVICTION_RETRY_INTERVAL,
        }
    }
}

impl Timing {
    fn clamped(self) -> Self {
        Self {
            poll_interval: self.poll_interval.clamp(MIN_INTERVAL, MAX_INTERVAL),
            eviction_retry_interval: self
                .eviction_retry_interval
                .clamp(MIN_INTERVAL, MAX_INTERVAL),
        }
    }
}

/// What a finished drain did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainSummary {
    /// Pods evicted (`namespace/name`).
    pub evicted: Vec<String>,
    /// Pods that were gone before their eviction (404).
    pub gone: Vec<String>,
}

/// One node's drainer.
#[derive(Clone)]
pub struct Drainer {
    pub(crate) client: Client,
    pub(crate) node: String,
    pub(crate) timing: Timing,
}

impl std::fmt::Debug for Drainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Drainer")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// Builds a client from the kubeconfig at `path` (read with a bound; its current context).
pub async fn client_from_kubeconfig(path: &Path) -> Result<Client, DrainError> {
    let shown = path.display().to_string();
    let text =
        inplace_bounded_read::read_to_string(path, MAX_KUBECONFIG_BYTES).map_err(|source| {
            DrainError::ReadKubeconfig {
                path: shown.clone(),
                source,
            }
        })?;
    let bad = |message: String| DrainError::Kubeconfig {
        path: shown.clone(),
        message,
    };
    let kubeconfig = Kubeconfig::from_yaml(&text).map_err(|e| bad(e.to_string()))?;
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| bad(e.to_string()))?;
    config.connect_timeout = Some(MAX_REQUEST_TIMEOUT);
    config.read_timeout = Some(MAX_REQUEST_TIMEOUT);
    config.write_timeout = Some(MAX_REQUEST_TIMEOUT);
    Client::try_from(config).map_err(|e| bad(e.to_string()))
}

pub(crate) fn api_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> DrainError {
    let what = what.into();
    move |source| DrainError::Api { what, source }
}

pub(crate) fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(r) if r.code == 404)
}

/// A failure worth asking again ([`TRANSIENT_RETRY_WINDOW`]).
pub(crate) fn is_transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(r) => matches!(r.code, 429 | 500 | 502 | 503 | 504),
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

impl Drainer {
    /// A drainer of `node` through `client`.
    pub fn new(client: Client, node: impl Into<String>, timing: Timing) -> Self {
        Self {
            client,
            node: node.into(),
            timing: timing.clamped(),
        }
    }

    /// The node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    pub(crate) fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    pub(crate) async fn get_node(&self) -> Result<Node, DrainError> {
        let nodes = self.nodes();
        self.retrying(|| nodes.get(&self.node))
            .await
            .map_err(api_error(format!("get Node {}", self.node)))
    }

    /// Runs `call` again after the poll interval while it fails transiently ([`is_transient`]), for at most
    /// [`TRANSIENT_RETRY_WINDOW`]; the caller's step deadline bounds it too (the agent drops the future).
    pub(crate) async fn retrying<T, F, Fut>(&self, mut call: F) -> Result<T, kube::Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, kube::Error>>,
    {
        let give_up = Instant::now() + TRANSIENT_RETRY_WINDOW;
        loop {
            match call().await {
                Err(e)
                    if is_transient(&e) && Instant::now() + self.timing.poll_interval < give_up =>
                {
                    tracing::debug!(error = %e, "transient API failure; asking again");
                    tokio::time::sleep(self.timing.poll_interval).await;
                }
                other => return other,
            }
        }
    }

    /// Whether the node is cordoned (`spec.unschedulable`).
    pub async fn is_cordoned(&self) -> Result<bool, DrainError> {
        let node = self.get_node().await?;
        Ok(node.spec.and_then(|s| s.unschedulable).unwrap_or(false))
    }

    /// Cordons the node: a merge patch `{"spec":{"unschedulable":true}}`.
    pub async fn cordon(&self) -> Result<(), DrainError> {
        self.patch_unschedulable(serde_json::Value::Bool(true))
            .await
    }

    /// Uncordons the node: a merge patch `{"spec":{"unschedulable":null}}`, which removes the field
    /// (what `kubectl uncordon` sends, since the field is omitted when false). Idempotent.
    pub async fn uncordon(&self) -> Result<(), DrainError> {
        self.patch_unschedulable(serde_json::Value::Null).await
    }

    async fn patch_unschedulable(&self, value: serde_json::Value) -> Result<(), DrainError> {
        let patch = serde_json::json!({"spec": {"unschedulable": value}});
        let nodes = self.nodes();
        let params = PatchParams::default();
        let merge = Patch::Merge(&patch);
        self.retrying(|| nodes.patch(&self.node, &params, &merge))
            .await
            .map_err(api_error(format!(
                "patch Node {} spec.unschedulable",
                self.node
            )))?;
        Ok(())
    }
}
