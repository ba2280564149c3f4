//! The drain's calls to the Kubernetes API (kube-rs over rustls): get and patch the Node, list
//! the node's pods, create Evictions, get evicted pods until they are gone, and wait for the node
//! to be Ready at a kubelet version. Every wait ends at the caller's deadline with an error that
//! names what was still there. Dropping a returned future stops the work at once (the agent does
//! so when it shuts down).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use tokio::time::Instant;

use crate::decide::{
    self, DrainOptions, PodFacts, Verdict, Waiting, bound, name_pods, pdb_from_refusal,
    progress_text,
};

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
    client: Client,
    node: String,
    timing: Timing,
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

fn api_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> DrainError {
    let what = what.into();
    move |source| DrainError::Api { what, source }
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(r) if r.code == 404)
}

/// A failure worth asking again ([`TRANSIENT_RETRY_WINDOW`]).
fn is_transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(r) => matches!(r.code, 429 | 500 | 502 | 503 | 504),
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

/// How the API answered one eviction.
enum EvictionAnswer {
    Accepted,
    Gone,
    Refused(Waiting),
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

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    async fn get_node(&self) -> Result<Node, DrainError> {
        let nodes = self.nodes();
        self.retrying(|| nodes.get(&self.node))
            .await
            .map_err(api_error(format!("get Node {}", self.node)))
    }

    /// Runs `call` again after the poll interval while it fails transiently ([`is_transient`]), for at most
    /// [`TRANSIENT_RETRY_WINDOW`]; the caller's step deadline bounds it too (the agent drops the future).
    async fn retrying<T, F, Fut>(&self, mut call: F) -> Result<T, kube::Error>
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

    async fn list_pods(&self) -> Result<Vec<PodFacts>, DrainError> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let mut params = ListParams::default()
            .fields(&format!("spec.nodeName={}", self.node))
            .limit(MAX_PODS_PER_PAGE);
        let mut facts = Vec::new();
        loop {
            let page = self
                .retrying(|| pods.list(&params))
                .await
                .map_err(api_error(format!("list pods on {}", self.node)))?;
            facts.extend(page.items.iter().map(PodFacts::from_pod));
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() && facts.len() < MAX_PODS_LISTED => {
                    params = params.continue_token(&token);
                }
                _ => break,
            }
        }
        Ok(facts)
    }

    /// True when the pod `key` with `uid` no longer exists (404, or the name now has another uid).
    async fn pod_gone(&self, pod: &PodFacts) -> Result<bool, DrainError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        match self.retrying(|| pods.get(&pod.name)).await {
            Ok(found) => Ok(found.metadata.uid.as_deref() != Some(pod.uid.as_str())),
            Err(e) if is_not_found(&e) => Ok(true),
            // The node authorizer answers a node's get of a pod no longer bound to it with 403, not 404
            // (AuthorizeNodeWithSelectors): the node's own pod list then tells whether it is still there.
            Err(kube::Error::Api(r)) if r.code == 403 => Ok(!self
                .list_pods()
                .await?
                .iter()
                .any(|listed| listed.uid == pod.uid)),
            Err(e) => Err(api_error(format!("get pod {}", pod.key()))(e)),
        }
    }

    async fn evict(&self, pod: &PodFacts) -> Result<EvictionAnswer, DrainError> {
        let path = format!(
            "/api/v1/namespaces/{}/pods/{}/eviction",
            pod.namespace, pod.name
        );
        let body = serde_json::json!({
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod.name, "namespace": pod.namespace},
        });
        let what = format!("evict pod {}", pod.key());
        let request = http::Request::post(path)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(kube::client::Body::from(body.to_string().into_bytes()))
            .map_err(|e| api_error(what.clone())(kube::Error::HttpError(e)))?;
        let response = self
            .client
            .send(request)
            .await
            .map_err(api_error(what.clone()))?;
        let status = response.status().as_u16();
        let limited = http_body_util::Limited::new(response.into_body(), MAX_EVICTION_ANSWER_BYTES);
        let bytes = match limited.collect().await {
            Ok(collected) => collected.to_bytes(),
            // An unreadable answer body: its status code still decides.
            Err(_) => Default::default(),
        };
        let answer: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
        let message = answer["message"].as_str().unwrap_or("").to_owned();
        let causes: Vec<String> = answer["details"]["causes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["message"].as_str().map(str::to_owned))
            .collect();
        Ok(match status {
            200..=299 => EvictionAnswer::Accepted,
            404 => EvictionAnswer::Gone,
            429 => EvictionAnswer::Refused(Waiting::Pdb(
                pdb_from_refusal(&pod.namespace, &causes)
                    .unwrap_or_else(|| bound(format!("({message})"))),
            )),
            500 if message.contains("more than one PodDisruptionBudget") => {
                EvictionAnswer::Refused(Waiting::MultiplePdbs(pod.key()))
            }
            _ => EvictionAnswer::Refused(Waiting::Other(bound(format!("{status} {message}")))),
        })
    }

    /// Evicts every pod the step must move off the node (see [`decide`]) and waits until they are
    /// gone, until `deadline`. Refused evictions (429 PDB, 500 multiple PDBs, other errors) are
    /// asked again after the retry interval, never replaced by a delete. `progress` gets a text
    /// whenever it changes. Does not cordon: call [`Drainer::cordon`] first.
    pub async fn drain(
        &self,
        options: DrainOptions,
        deadline: Instant,
        progress: &mut (dyn FnMut(String) + Send),
    ) -> Result<DrainSummary, DrainError> {
        let mut summary = DrainSummary::default();
        // uid -> pod, for pods whose eviction the API accepted.
        let mut evicted: BTreeMap<String, PodFacts> = BTreeMap::new();
        // uid -> when a refused eviction may be asked again.
        let mut retry_at: BTreeMap<String, Instant> = BTreeMap::new();
        let mut waiting: Option<Waiting> = None;
        let mut last_text = String::new();
        loop {
            let pods = self.list_pods().await?;
            let acted = decide::plan(&pods, options);
            let blocked: Vec<String> = acted
                .iter()
                .filter_map(|(p, v)| match v {
                    Verdict::Block(reason) => {
                        Some(format!("{} needs {}", p.key(), reason.option()))
                    }
                    _ => None,
                })
                .collect();
            if !blocked.is_empty() {
                return Err(DrainError::Blocked {
                    node: self.node.clone(),
                    pods: name_pods(&blocked),
                });
            }
            let mut remaining = Vec::new();
            let mut refused_now: Option<Waiting> = None;
            for (pod, verdict) in &acted {
                if evicted.contains_key(&pod.uid) {
                    if !self.pod_gone(pod).await? {
                        remaining.push(pod.key());
                    }
                    continue;
                }
                if *verdict == Verdict::WaitDeleting {
                    remaining.push(pod.key());
                    continue;
                }
                let now = Instant::now();
                if retry_at.get(&pod.uid).is_some_and(|at| *at > now) {
                    remaining.push(pod.key());
                    continue;
                }
                match self.evict(pod).await? {
                    EvictionAnswer::Accepted => {
                        tracing::info!(pod = %pod.key(), node = %self.node, "eviction accepted");
                        summary.evicted.push(pod.key());
                        evicted.insert(pod.uid.clone(), pod.clone());
                        if !self.pod_gone(pod).await? {
                            remaining.push(pod.key());
                        }
                    }
                    EvictionAnswer::Gone => summary.gone.push(pod.key()),
                    EvictionAnswer::Refused(why) => {
                        tracing::info!(pod = %pod.key(), reason = ?why, "eviction refused; retrying later");
                        retry_at.insert(pod.uid.clone(), now + self.timing.eviction_retry_interval);
                        refused_now.get_or_insert(why);
                        remaining.push(pod.key());
                    }
                }
            }
            if remaining.is_empty() {
                progress(progress_text(&self.node, &[], None));
                return Ok(summary);
            }
            // A refusal keeps being the reason shown until evictions are asked again.
            if let Some(why) = refused_now {
                waiting = Some(why);
            } else if remaining.iter().all(|k| {
                evicted.values().any(|p| &p.key() == k)
                    || acted
                        .iter()
                        .any(|(p, v)| &p.key() == k && *v == Verdict::WaitDeleting)
            }) {
                waiting = Some(Waiting::Terminating);
            }
            let text = progress_text(&self.node, &remaining, waiting.as_ref());
            if text != last_text {
                progress(text.clone());
                last_text = text.clone();
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(DrainError::Timeout(bound(format!(
                    "drain of {} timed out: {} pod(s) still on the node: {}{}",
                    self.node,
                    remaining.len(),
                    name_pods(&remaining),
                    match &waiting {
                        Some(Waiting::Pdb(pdb)) => format!("; eviction blocked by PDB {pdb}"),
                        Some(Waiting::MultiplePdbs(pod)) =>
                            format!("; {pod} is covered by more than one PDB"),
                        Some(Waiting::Terminating) => "; evicted pods still terminating".into(),
                        Some(Waiting::Other(m)) => format!("; last eviction error: {m}"),
                        None => String::new(),
                    }
                ))));
            }
            tokio::time::sleep_until((now + self.timing.poll_interval).min(deadline)).await;
        }
    }

    /// Waits until the node's `Ready` condition is `True` and, when `kubelet_version` is given,
    /// `status.nodeInfo.kubeletVersion` equals it; until `deadline`. `progress` gets what is
    /// missing whenever that changes.
    pub async fn wait_node_ready(
        &self,
        kubelet_version: Option<&str>,
        deadline: Instant,
        progress: &mut (dyn FnMut(String) + Send),
    ) -> Result<String, DrainError> {
        let mut last_text = String::new();
        loop {
            let node = self.get_node().await?;
            let missing = ready_gaps(&node, kubelet_version);
            if missing.is_empty() {
                let version = node_kubelet_version(&node).unwrap_or_default();
                return Ok(format!("node {} is Ready (kubelet {version})", self.node));
            }
            let text = bound(format!(
                "waiting for node {}: {}",
                self.node,
                missing.join(", ")
            ));
            if text != last_text {
                progress(text.clone());
                last_text = text.clone();
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(DrainError::Timeout(format!("timed out {text}")));
            }
            tokio::time::sleep_until((now + self.timing.poll_interval).min(deadline)).await;
        }
    }
}

fn node_kubelet_version(node: &Node) -> Option<String> {
    node.status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.kubelet_version.clone())
}

/// What keeps `node` from counting as ready (empty when nothing does).
pub fn ready_gaps(node: &Node, kubelet_version: Option<&str>) -> Vec<String> {
    let mut gaps = Vec::new();
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    match ready {
        Some(c) if c.status == "True" => {}
        Some(c) => gaps.push(format!(
            "Ready is {}{}",
            c.status,
            c.reason
                .as_ref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        )),
        None => gaps.push("no Ready condition".into()),
    }
    if let Some(want) = kubelet_version {
        let have = node_kubelet_version(node).unwrap_or_default();
        if have != want {
            gaps.push(format!("kubelet is {have:?}, want {want}"));
        }
    }
    gaps
}

/// The set of pod keys, for tests and logs.
pub fn keys(pods: &[PodFacts]) -> BTreeSet<String> {
    pods.iter().map(PodFacts::key).collect()
}
