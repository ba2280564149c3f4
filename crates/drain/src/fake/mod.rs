//! `FakeApiServer`: a small HTTPS fake of exactly the Kubernetes API calls the drainer makes —
//! Node get and merge-patch, Node list by the control-plane `labelSelector`, Pod list by `fieldSelector=spec.nodeName=…` (paged), Pod get, and
//! Eviction create — with a real TLS certificate (rcgen CA, rustls) and a kubeconfig (CA data and
//! a bearer token) that kube-rs connects with, as it would to a real API server.
//!
//! It proves our reactions to the API's documented answers (429 while a PodDisruptionBudget is
//! exhausted, 500 for a pod under more than one budget, 404 for a gone pod, 201 then the pod
//! disappears); it does not prove Kubernetes itself behaves so. It runs on its own thread and
//! Tokio runtime, so it can be started from any test, process or `demo`; dropping it shuts it down.

mod model;

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

pub use model::{EvictionRecord, FakeNode, FakePdb, FakePod, PdbBlock};
use model::{Model, status};

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
    addr: SocketAddr,
    ca_pem: String,
    dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for FakeApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeApiServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl FakeApiServer {
    /// Starts serving `node` on `127.0.0.1:<free port>` and writes its kubeconfig.
    pub fn start(node: FakeNode) -> io::Result<Self> {
        let (ca_pem, server_config) = tls_config().map_err(io::Error::other)?;
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let model: Shared = Arc::new(Mutex::new(Model::new(node)));
        let app = router(model.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name("fake-apiserver".into())
            .spawn(move || runtime.block_on(serve(std_listener, server_config, app, stopped)))?;
        let dir = tempfile::tempdir()?;
        let server = Self {
            model,
            addr,
            ca_pem,
            dir,
            stop: Some(stop),
            thread: Some(thread),
        };
        server.write_kubeconfig(&server.kubeconfig_path())?;
        Ok(server)
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The kubeconfig written at start (removed with the server).
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    /// Writes a kubeconfig for this server at `path` (e.g. under an agent's `--root`).
    pub fn write_kubeconfig(&self, path: &Path) -> io::Result<()> {
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n    certificate-authority-data: {ca}\nusers:\n- name: node\n  user:\n    token: {FAKE_TOKEN}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: node\ncurrent-context: fake\n",
            self.url()
        );
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, text)
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

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A fresh CA and a server certificate for 127.0.0.1/localhost signed by it.
fn tls_config() -> Result<(String, rustls::ServerConfig), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let ca_key = rcgen::KeyPair::generate().map_err(|x| e(&x))?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(|x| e(&x))?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "fake apiserver CA");
    let ca_cert = ca_params.self_signed(&ca_key).map_err(|x| e(&x))?;
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().map_err(|x| e(&x))?;
    let mut params =
        rcgen::CertificateParams::new(vec!["localhost".to_owned()]).map_err(|x| e(&x))?;
    params
        .subject_alt_names
        .push(rcgen::SanType::IpAddress(std::net::IpAddr::from([
            127, 0, 0, 1,
        ])));
    let cert = params.signed_by(&key, &issuer).map_err(|x| e(&x))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|x| e(&x))?
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .map_err(|x| e(&x))?;
    Ok((ca_cert.pem(), config))
}

async fn serve(
    listener: std::net::TcpListener,
    config: rustls::ServerConfig,
    app: Router,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    loop {
        let accepted = tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else { continue };
        let acceptor = acceptor.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(stream).await else {
                return;
            };
            let service = hyper_util::service::TowerToHyperService::new(app);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
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
    if let Some(denied) = unauthorized(request.headers()) {
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

fn answer((code, body): (u16, Value)) -> Response {
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        code,
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// `None` when the request carries the fake's token.
fn unauthorized(headers: &HeaderMap) -> Option<Response> {
    let expected = format!("Bearer {FAKE_TOKEN}");
    let ok = headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(expected.as_str());
    (!ok).then(|| answer(status(401, "Unauthorized", "Unauthorized", Value::Null)))
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
