//! `FakeManagementApi`: an HTTPS fake of the management cluster's API as the inplace-updater server uses it —
//! Machines (`cluster.x-k8s.io/v1beta2`) GET and PATCH (`machines.rs`) and events.k8s.io/v1 Events
//! (`events.rs`) — behind the authorization the shipped manifests grant the server's ServiceAccount
//! (`rbac.rs`: any other verb or resource is refused 403 with the API server's `Status`), with a real TLS
//! certificate and a kubeconfig kube-rs connects with. Three failure modes: [`Mode::Unreachable`] (connections
//! dropped before TLS), [`Mode::ForbidAll`] (403 for everything, as with a binding deleted) and [`Mode::Drop`]
//! (requests never answered).
//!
//! What it proves: our requests are the ones the RBAC we ship allows, our patches carry the resourceVersion
//! precondition and survive a 409, and our reactions to the API's documented answers. What it does not prove:
//! admission webhooks (CAPI's Machine webhook), field validation by the CRD's OpenAPI schema, server-side
//! apply, watch, and the API server's own behaviour beyond these answers.

mod events;
mod machines;
pub mod rbac;

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::get;
use serde_json::Value;

pub use machines::{MACHINES_PATH, MachinePatch};
use rbac::{Attributes, Rbac};

use super::serving::{Serving, answer, status, unauthorized};

/// The bearer token the fake's kubeconfig carries (any other is answered 401).
pub const FAKE_MANAGEMENT_TOKEN: &str = "fake-management-token";
/// The ServiceAccount the server runs as in the shipped manifests (whose grants the fake enforces).
pub const SERVER_SERVICE_ACCOUNT: (&str, &str) = ("inplace-updater-system", "inplace-updater");

/// How the fake answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// As the API server would, with the shipped RBAC.
    #[default]
    Normal,
    /// Every new connection is dropped before TLS (the API cannot be reached).
    Unreachable,
    /// Every request is refused 403 (the server's binding is gone).
    ForbidAll,
    /// Every request is read and never answered (a load balancer or API server that silently drops them): only
    /// the client's own timeout ends it.
    Drop,
}

/// One request the fake received, as the authorizer saw it, and the status code it answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    /// Verb, group, resource, namespace, name.
    pub request: Attributes,
    /// HTTP status answered.
    pub code: u16,
}

#[derive(Debug, Default)]
struct Model {
    rbac: Rbac,
    mode: Mode,
    machines: machines::Machines,
    // Read and written by the Event routes (events.rs).
    #[allow(dead_code)]
    events: events::Events,
    seen: Vec<Seen>,
}

type Shared = Arc<Mutex<Model>>;

fn lock(model: &Shared) -> MutexGuard<'_, Model> {
    model
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A running fake management API (see the module docs). Shut down when dropped.
pub struct FakeManagementApi {
    model: Shared,
    serving: Serving,
}

impl std::fmt::Debug for FakeManagementApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeManagementApi")
            .field("url", &self.serving.url())
            .finish_non_exhaustive()
    }
}

impl FakeManagementApi {
    /// Starts a fake that grants [`SERVER_SERVICE_ACCOUNT`] what the YAML `manifests` file grants it (e.g. the
    /// rendered clusterctl components, deploy/clusterctl/runtime-extension-components.yaml), and writes its
    /// kubeconfig.
    pub fn start(manifests: &Path) -> io::Result<Self> {
        let text = std::fs::read_to_string(manifests)?;
        let (namespace, name) = SERVER_SERVICE_ACCOUNT;
        let rbac = Rbac::from_manifests(&text, namespace, name).map_err(io::Error::other)?;
        let model: Shared = Arc::new(Mutex::new(Model {
            rbac,
            ..Model::default()
        }));
        let serving = Serving::start(router(model.clone()), "fake-management-api")?;
        let fake = Self { model, serving };
        fake.write_kubeconfig(&fake.kubeconfig_path())?;
        Ok(fake)
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        self.serving.url()
    }

    /// The kubeconfig written at start (removed with the fake).
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.serving.kubeconfig_path()
    }

    /// Writes a kubeconfig for this fake at `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> io::Result<()> {
        self.serving.write_kubeconfig(path, FAKE_MANAGEMENT_TOKEN)
    }

    /// Switches how the fake answers from now on.
    pub fn set_mode(&self, mode: Mode) {
        lock(&self.model).mode = mode;
        self.serving.set_unreachable(mode == Mode::Unreachable);
    }

    /// Every `(verb, group, resource)` the manifests grant the server.
    pub fn grants(&self) -> Vec<(String, String, String)> {
        lock(&self.model).rbac.grants()
    }

    /// Creates (or replaces) Machine `namespace/name` with these annotations.
    pub fn add_machine(&self, namespace: &str, name: &str, annotations: &BTreeMap<String, String>) {
        lock(&self.model).machines.put(namespace, name, annotations);
    }

    /// Sets (`Some`) or removes (`None`) an annotation as an operator would; false when there is no such Machine.
    pub fn annotate(&self, namespace: &str, name: &str, key: &str, value: Option<&str>) -> bool {
        lock(&self.model)
            .machines
            .annotate(namespace, name, key, value)
    }

    /// The Machine's annotations now (`None`: no such Machine).
    pub fn annotations(&self, namespace: &str, name: &str) -> Option<BTreeMap<String, String>> {
        lock(&self.model)
            .machines
            .object(namespace, name)
            .map(machines::annotations)
    }

    /// The Machine object now.
    pub fn machine(&self, namespace: &str, name: &str) -> Option<Value> {
        lock(&self.model).machines.object(namespace, name).cloned()
    }

    /// Every Machine patch accepted, in order.
    pub fn machine_patches(&self) -> Vec<MachinePatch> {
        lock(&self.model).machines.patches.clone()
    }

    /// Every request received (after authentication), in order, with its answer's status code.
    pub fn seen(&self) -> Vec<Seen> {
        lock(&self.model).seen.clone()
    }
}

fn router(model: Shared) -> Router {
    let machine = format!("{MACHINES_PATH}/namespaces/{{ns}}/machines/{{name}}");
    Router::new()
        .route(&machine, get(get_machine).patch(patch_machine))
        .merge(events::routes())
        .fallback(not_served)
        .layer(axum::middleware::from_fn_with_state(
            model.clone(),
            authorize,
        ))
        .with_state(model)
}

/// In front of every route: 401 without the kubeconfig's token; 403 in [`Mode::ForbidAll`] or when the shipped
/// RBAC grants nothing for the request; then the route, its answer recorded in [`FakeManagementApi::seen`].
async fn authorize(
    State(model): State<Shared>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if let Some(denied) = unauthorized(request.headers(), FAKE_MANAGEMENT_TOKEN) {
        return denied;
    }
    let Some(attributes) = Attributes::of(
        request.method().as_str(),
        request.uri().path(),
        request.uri().query(),
    ) else {
        return next.run(request).await;
    };
    if lock(&model).mode == Mode::Drop {
        return std::future::pending().await;
    }
    let refused = {
        let model = lock(&model);
        (model.mode == Mode::ForbidAll || !model.rbac.allows(&attributes))
            .then(|| attributes.forbidden_message(model.rbac.user()))
    };
    let response = match refused {
        Some(message) => {
            let details = serde_json::json!({
                "name": attributes.name, "group": attributes.group, "kind": attributes.resource,
            });
            answer(status(403, "Forbidden", &message, details))
        }
        None => next.run(request).await,
    };
    lock(&model).seen.push(Seen {
        request: attributes,
        code: response.status().as_u16(),
    });
    response
}

async fn not_served() -> Response {
    answer(status(
        404,
        "NotFound",
        "the server could not find the requested resource",
        Value::Null,
    ))
}

async fn get_machine(
    State(model): State<Shared>,
    UrlPath((ns, name)): UrlPath<(String, String)>,
) -> Response {
    answer(lock(&model).machines.get(&ns, &name))
}

async fn patch_machine(
    State(model): State<Shared>,
    UrlPath((ns, name)): UrlPath<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    answer(
        lock(&model)
            .machines
            .patch(&ns, &name, &content_type, &body),
    )
}
