//! `FakeApiServer`: a small HTTPS fake of exactly the Kubernetes API calls the drainer makes —
//! Node get and merge-patch, Node list by the control-plane `labelSelector`, Pod list by `fieldSelector=spec.nodeName=…` (paged), Pod get, and
//! Eviction create — with a real TLS certificate (rcgen CA, rustls) and a kubeconfig (CA data and
//! a bearer token) that kube-rs connects with, as it would to a real API server.
//!
//! It proves our reactions to the API's documented answers (429 while a PodDisruptionBudget is
//! exhausted, 500 for a pod under more than one budget, 404 for a gone pod, 201 then the pod
//! disappears); it does not prove Kubernetes itself behaves so. It runs on its own thread and
//! Tokio runtime, so it can be started from any test, process or `demo`; dropping it shuts it down.

pub mod management;
mod model;
mod serving;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, Query, State};
use axum::response::Response;
use axum::routing::{get, post};
use serde_json::{Value, json};

use model::Model;
pub use model::{EvictionRecord, FakeNode, FakePdb, FakePod, PdbBlock};
use serving::{Serving, answer, status, unauthorized};

/// The bearer token the fake's kubeconfig carries (any other is answered 401).
pub const FAKE_TOKEN: &str = "fake-kubelet-token";

type Shared = Arc<Mutex<Model>>;

fn lock(model: &Shared) -> MutexGuard<'_, Model> {
    model
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A running fake API server (see the module docs). Shut down when dropped.
pub struct FakeApiServer {
    model: Shared,
    serving: Serving,
}

impl std::fmt::Debug for FakeApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeApiServer")
            .field("url", &self.serving.url())
            .finish_non_exhaustive()
    }
}

impl FakeApiServer {
    /// Starts serving `node` on `127.0.0.1:<free port>` and writes its kubeconfig.
    pub fn start(node: FakeNode) -> io::Result<Self> {
        let model: Shared = Arc::new(Mutex::new(Model::new(node)));
        let serving = Serving::start(router(model.clone()), "fake-apiserver")?;
        let server = Self { model, serving };
        server.write_kubeconfig(&server.kubeconfig_path())?;
        Ok(server)
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        self.serving.url()
    }

    /// The kubeconfig written at start (removed with the server).
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.serving.kubeconfig_path()
    }

    /// Writes a kubeconfig for this server at `path` (e.g. under an agent's `--root`).
    pub fn write_kubeconfig(&self, path: &Path) -> io::Result<()> {
        self.serving.write_kubeconfig(path, FAKE_TOKEN)
    }

    /// Puts a pod on the node (replacing one of the same name, with a new uid).
    pub fn add_pod(&self, pod: FakePod) {
        lock(&self.model).add_pod(pod);
    }

    /// The pods on the node now (`namespace/name`, terminating ones included).
    pub fn pods(&self) -> Vec<String> {
        let mut model = lock(&self.model);
        model.purge();
        model.pods.iter().map(|p| p.pod.key()).collect()
    }

    /// Sets whether the pod `namespace/name` is Ready (its containers pass their readiness probes); false when
    /// there is no such pod.
    pub fn set_pod_ready(&self, namespace: &str, name: &str, ready: bool) -> bool {
        lock(&self.model).set_pod_ready(namespace, name, ready)
    }

    /// Deletes the pod `namespace/name` at once, as its controller or the kubelet would; false when there is none.
    pub fn remove_pod(&self, namespace: &str, name: &str) -> bool {
        lock(&self.model).remove_pod(namespace, name)
    }

    /// Adds a PodDisruptionBudget.
    pub fn add_pdb(&self, pdb: FakePdb) {
        lock(&self.model).pdbs.push((pdb, false));
    }

    /// Lets a budget allow evictions from now on.
    pub fn release_pdb(&self, namespace: &str, name: &str) {
        for (pdb, released) in &mut lock(&self.model).pdbs {
            if pdb.namespace == namespace && pdb.name == name {
                *released = true;
            }
        }
    }

    /// Sets the Ready condition.
    pub fn set_ready(&self, ready: bool) {
        lock(&self.model).node.ready = ready;
    }

    /// Adds another Node (listed, e.g. a control-plane peer with [`FakeNode::control_plane`]; never drained),
    /// replacing one of the same name.
    pub fn add_node(&self, node: FakeNode) {
        let mut model = lock(&self.model);
        model.others.retain(|other| other.name != node.name);
        model.others.push(node);
    }

    /// Sets the Ready condition of the Node named `name`, the agent's or another; false when there is none.
    pub fn set_node_ready(&self, name: &str, ready: bool) -> bool {
        lock(&self.model).set_ready(name, ready)
    }

    /// Sets the kubelet version (a readable `kubelet_version_file` still wins).
    pub fn set_kubelet_version(&self, version: &str) {
        lock(&self.model).node.kubelet_version = version.into();
    }

    /// Cordons or uncordons as an operator would (not recorded in [`Self::unschedulable_patches`]).
    pub fn set_unschedulable(&self, value: bool) {
        lock(&self.model).node.unschedulable = value;
    }

    /// `spec.unschedulable` now.
    pub fn unschedulable(&self) -> bool {
        lock(&self.model).node.unschedulable
    }

    /// When a patch first cordoned the node (`None`: never).
    pub fn first_cordon_at(&self) -> Option<std::time::Instant> {
        lock(&self.model).first_cordon_at
    }

    /// Every `spec.unschedulable` the node was patched with, in order (`None`: set to null).
    pub fn unschedulable_patches(&self) -> Vec<Option<bool>> {
        lock(&self.model).patches.clone()
    }

    /// Answers the next `n` requests, whatever they ask, with 503 Service Unavailable (an API server restarting
    /// behind its address, as after `kubeadm upgrade` on a control plane node).
    pub fn fail_next(&self, n: u32) {
        lock(&self.model).unavailable = n;
    }

    /// Every eviction answered, in order.
    pub fn evictions(&self) -> Vec<EvictionRecord> {
        lock(&self.model).evictions.clone()
    }
}

fn router(model: Shared) -> Router {
    Router::new()
        .route("/api/v1/nodes", get(list_nodes))
        .route("/api/v1/nodes/{name}", get(get_node).patch(patch_node))
        .route("/api/v1/pods", get(list_pods))
        .route("/api/v1/namespaces/{ns}/pods/{name}", get(get_pod))
        .route("/api/v1/namespaces/{ns}/pods/{name}/eviction", post(evict))
        .layer(axum::middleware::from_fn_with_state(model.clone(), guard))
        .with_state(model)
}

/// In front of every route: 401 without the kubeconfig's bearer token, then [`FakeApiServer::fail_next`]'s
/// 503 while requests of an outage are left.
async fn guard(
    State(model): State<Shared>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if let Some(denied) = unauthorized(request.headers(), FAKE_TOKEN) {
        return denied;
    }
    {
        let mut model = lock(&model);
        if model.unavailable > 0 {
            model.unavailable -= 1;
            return answer(status(
                503,
                "ServiceUnavailable",
                "the fake API server is restarting",
                Value::Null,
            ));
        }
    }
    next.run(request).await
}

async fn get_node(State(model): State<Shared>, UrlPath(name): UrlPath<String>) -> Response {
    let model = lock(&model);
    if name != model.node.name {
        return answer(status(
            404,
            "NotFound",
            &format!("nodes \"{name}\" not found"),
            Value::Null,
        ));
    }
    answer((200, model.node_json()))
}

async fn list_nodes(
    State(model): State<Shared>,
    Query(query): Query<std::collections::BTreeMap<String, String>>,
) -> Response {
    let items = lock(&model).list_nodes(query.get("labelSelector").map(String::as_str));
    answer((
        200,
        json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {"resourceVersion": "1"}, "items": items}),
    ))
}

async fn patch_node(
    State(model): State<Shared>,
    UrlPath(name): UrlPath<String>,
    body: Bytes,
) -> Response {
    let mut model = lock(&model);
    if name != model.node.name {
        return answer(status(
            404,
            "NotFound",
            &format!("nodes \"{name}\" not found"),
            Value::Null,
        ));
    }
    let Ok(patch) = serde_json::from_slice::<Value>(&body) else {
        return answer(status(400, "BadRequest", "patch is not JSON", Value::Null));
    };
    model.patch_node(&patch);
    answer((200, model.node_json()))
}

async fn list_pods(
    State(model): State<Shared>,
    Query(query): Query<std::collections::BTreeMap<String, String>>,
) -> Response {
    let mut model = lock(&model);
    model.purge();
    let on_node = query.get("fieldSelector").map(String::as_str)
        == Some(format!("spec.nodeName={}", model.node.name).as_str());
    let start: usize = query
        .get("continue")
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let limit: usize = query
        .get("limit")
        .and_then(|l| l.parse().ok())
        .unwrap_or(usize::MAX);
    let all: Vec<Value> = if on_node {
        model.pods.iter().map(|p| model.pod_json(p)).collect()
    } else {
        Vec::new()
    };
    let page: Vec<Value> = all.iter().skip(start).take(limit).cloned().collect();
    let next = start.saturating_add(limit);
    let mut metadata = json!({"resourceVersion": "1"});
    if next < all.len() {
        metadata["continue"] = json!(next.to_string());
    }
    answer((
        200,
        json!({"apiVersion": "v1", "kind": "PodList", "metadata": metadata, "items": page}),
    ))
}

async fn get_pod(
    State(model): State<Shared>,
    UrlPath((ns, name)): UrlPath<(String, String)>,
) -> Response {
    let mut model = lock(&model);
    model.purge();
    match model
        .pods
        .iter()
        .find(|p| p.pod.namespace == ns && p.pod.name == name)
    {
        Some(pod) => answer((200, model.pod_json(pod))),
        None => answer(status(
            404,
            "NotFound",
            &format!("pods \"{name}\" not found"),
            Value::Null,
        )),
    }
}

async fn evict(
    State(model): State<Shared>,
    UrlPath((ns, name)): UrlPath<(String, String)>,
) -> Response {
    let mut model = lock(&model);
    model.purge();
    answer(model.evict(&ns, &name))
}
