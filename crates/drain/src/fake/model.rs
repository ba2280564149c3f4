//! The fake API server's objects and its answers to each call, as plain data and JSON (the
//! HTTP/TLS side is in `mod.rs`). Answers follow the documented API: Eviction 429 while a
//! PodDisruptionBudget allows no disruption, 500 for a pod more than one budget covers, 404 for a
//! pod that is gone, 201 otherwise; an evicted pod disappears after the node's eviction delay.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::serving::status;

/// A Node the fake serves: the agent's own (the one the drainer works on), or another one listed with it.
#[derive(Clone, Debug)]
pub struct FakeNode {
    /// `metadata.name`.
    pub name: String,
    /// Labelled `node-role.kubernetes.io/control-plane` (listed by that label selector).
    pub control_plane: bool,
    /// `Ready` condition `True` (else `False`, reason `KubeletNotReady`).
    pub ready: bool,
    /// `status.nodeInfo.kubeletVersion` (unless `kubelet_version_file` says otherwise).
    pub kubelet_version: String,
    /// When set and readable, its trimmed content is the kubelet version at every Node read: a
    /// sandbox's fake `install kubelet` command writes it.
    pub kubelet_version_file: Option<PathBuf>,
    /// When set and readable, its trimmed content is `status.nodeInfo.bootID` at every Node read (a
    /// sandbox's boot id: a kubelet reports the boot it runs in); `b` otherwise.
    pub boot_id_file: Option<PathBuf>,
    /// `spec.unschedulable` at start (an operator's cordon).
    pub unschedulable: bool,
    /// How long an evicted pod stays (terminating) before it is gone.
    pub eviction_delay: Duration,
}

impl FakeNode {
    /// A Ready, schedulable node at kubelet `v1.33.0`, evicted pods gone at once.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            control_plane: false,
            ready: true,
            kubelet_version: "v1.33.0".into(),
            kubelet_version_file: None,
            boot_id_file: None,
            unschedulable: false,
            eviction_delay: Duration::ZERO,
        }
    }

    /// The same Node labelled `node-role.kubernetes.io/control-plane`.
    pub fn control_plane(mut self) -> Self {
        self.control_plane = true;
        self
    }
}

/// A pod on the fake node.
#[derive(Clone, Debug)]
pub struct FakePod {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Kind of its controller owner (`None`: unmanaged).
    pub owner_kind: Option<String>,
    /// Name of that owner (`owner` unless set: the pods of one DaemonSet share it).
    pub owner_name: Option<String>,
    /// Has an `emptyDir` volume.
    pub empty_dir: bool,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
    /// `status.phase`.
    pub phase: String,
    /// Deleted by someone else just before its eviction arrives: listed, then the eviction gets 404.
    pub vanishes: bool,
    /// Its containers are ready: the `Ready` and `ContainersReady` conditions are `True` (else `False`, reason
    /// `ContainersNotReady`, as the kubelet reports a container that fails its readiness probe).
    pub ready: bool,
}

impl FakePod {
    /// A running pod owned by a ReplicaSet, no volumes, no labels.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            owner_kind: Some("ReplicaSet".into()),
            owner_name: None,
            empty_dir: false,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            phase: "Running".into(),
            vanishes: false,
            ready: true,
        }
    }

    /// Owned by the controller `kind` named `name` (the pods of one DaemonSet share it).
    pub fn owned_by(mut self, kind: &str, name: &str) -> Self {
        self.owner_kind = Some(kind.to_owned());
        self.owner_name = Some(name.to_owned());
        self
    }

    /// With its containers not ready (the `Ready` condition `False`).
    pub fn not_ready(mut self) -> Self {
        self.ready = false;
        self
    }

    /// With this controller kind (`None`: unmanaged).
    pub fn owner(mut self, kind: Option<&str>) -> Self {
        self.owner_kind = kind.map(str::to_owned);
        self
    }

    /// With an `emptyDir` volume.
    pub fn empty_dir(mut self) -> Self {
        self.empty_dir = true;
        self
    }

    /// With a label.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// With an annotation.
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }

    /// In this phase.
    pub fn phase(mut self, phase: &str) -> Self {
        self.phase = phase.into();
        self
    }

    /// Deleted by someone else just before its eviction arrives (the eviction gets 404).
    pub fn vanishes(mut self) -> Self {
        self.vanishes = true;
        self
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// How long a budget refuses evictions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PdbBlock {
    /// The next N evictions of its pods are refused, later ones allowed.
    Attempts(u32),
    /// Refused until [`super::FakeApiServer::release_pdb`].
    UntilReleased,
}

/// A PodDisruptionBudget selecting pods by labels in its namespace.
#[derive(Clone, Debug)]
pub struct FakePdb {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `spec.selector.matchLabels` (empty: every pod of the namespace).
    pub match_labels: BTreeMap<String, String>,
    /// When it refuses.
    pub block: PdbBlock,
}

/// One eviction the fake answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvictionRecord {
    /// `namespace/name`.
    pub pod: String,
    /// HTTP status answered.
    pub status: u16,
}

pub(super) struct StoredPod {
    pub pod: FakePod,
    pub uid: String,
    pub gone_at: Option<Instant>,
}

/// Everything the fake knows.
pub(super) struct Model {
    pub node: FakeNode,
    /// The other Nodes (listed, never drained).
    pub others: Vec<FakeNode>,
    pub pods: Vec<StoredPod>,
    pub pdbs: Vec<(FakePdb, bool)>,
    pub patches: Vec<Option<bool>>,
    /// When the node was first cordoned by a patch.
    pub first_cordon_at: Option<Instant>,
    pub evictions: Vec<EvictionRecord>,
    pub next_uid: u64,
    /// The next this many requests are answered 503 (an API server restarting).
    pub unavailable: u32,
}

impl Model {
    pub fn new(node: FakeNode) -> Self {
        Self {
            node,
            others: Vec::new(),
            pods: Vec::new(),
            pdbs: Vec::new(),
            patches: Vec::new(),
            first_cordon_at: None,
            evictions: Vec::new(),
            next_uid: 1,
            unavailable: 0,
        }
    }

    /// Drops pods whose eviction delay passed.
    pub fn purge(&mut self) {
        let now = Instant::now();
        self.pods.retain(|p| p.gone_at.is_none_or(|at| at > now));
    }

    pub fn add_pod(&mut self, pod: FakePod) {
        let uid = format!("uid-{}", self.next_uid);
        self.next_uid += 1;
        self.pods.retain(|p| p.pod.key() != pod.key());
        self.pods.push(StoredPod {
            pod,
            uid,
            gone_at: None,
        });
    }

    /// Sets the readiness of the pod `namespace/name`; false when there is none.
    pub fn set_pod_ready(&mut self, namespace: &str, name: &str, ready: bool) -> bool {
        let pod = self
            .pods
            .iter_mut()
            .find(|p| p.pod.namespace == namespace && p.pod.name == name);
        pod.map(|p| p.pod.ready = ready).is_some()
    }

    /// Deletes the pod `namespace/name` at once (its controller or the kubelet removed it); false when there is none.
    pub fn remove_pod(&mut self, namespace: &str, name: &str) -> bool {
        let before = self.pods.len();
        self.pods
            .retain(|p| !(p.pod.namespace == namespace && p.pod.name == name));
        self.pods.len() != before
    }

    /// The agent's own Node.
    pub fn node_json(&self) -> Value {
        node_json(&self.node)
    }

    /// Every Node (the agent's first) that `label_selector` selects: only the control-plane label (or none)
    /// is understood.
    pub fn list_nodes(&self, label_selector: Option<&str>) -> Vec<Value> {
        let control_plane = match label_selector {
            None | Some("") => false,
            Some(crate::CONTROL_PLANE_LABEL) => true,
            Some(_) => return Vec::new(),
        };
        std::iter::once(&self.node)
            .chain(&self.others)
            .filter(|node| node.control_plane || !control_plane)
            .map(node_json)
            .collect()
    }

    /// Sets the Ready condition of the Node named `name` (the agent's or another); false when there is none.
    pub fn set_ready(&mut self, name: &str, ready: bool) -> bool {
        let node = std::iter::once(&mut self.node)
            .chain(&mut self.others)
            .find(|node| node.name == name);
        node.map(|node| node.ready = ready).is_some()
    }

    /// Applies a merge patch's `spec.unschedulable` (recorded: true, false, or null = None).
    pub fn patch_node(&mut self, patch: &Value) {
        if let Some(value) = patch.get("spec").and_then(|s| s.get("unschedulable")) {
            let value = value.as_bool();
            self.patches.push(value);
            if value == Some(true) && self.first_cordon_at.is_none() {
                self.first_cordon_at = Some(Instant::now());
            }
            self.node.unschedulable = value.unwrap_or(false);
        }
    }

    pub fn pod_json(&self, stored: &StoredPod) -> Value {
        let pod = &stored.pod;
        let mut meta = json!({
            "name": pod.name, "namespace": pod.namespace, "uid": stored.uid, "resourceVersion": "1",
            "labels": pod.labels, "annotations": pod.annotations,
        });
        if let Some(kind) = &pod.owner_kind {
            let name = pod.owner_name.as_deref().unwrap_or("owner");
            meta["ownerReferences"] = json!([{
                "apiVersion": "apps/v1", "kind": kind, "name": name, "uid": format!("uid-{name}"), "controller": true
            }]);
        }
        if stored.gone_at.is_some() {
            meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        let volumes = if pod.empty_dir {
            json!([{"name": "scratch", "emptyDir": {}}])
        } else {
            json!([])
        };
        let mut status = json!({"phase": pod.phase});
        // The kubelet reports conditions for a pod it started; a pending one has only PodScheduled.
        if pod.phase != "Pending" {
            let (ready, reason, message) = if pod.ready {
                ("True", None, None)
            } else {
                (
                    "False",
                    Some("ContainersNotReady"),
                    Some("containers with unready status: [c]"),
                )
            };
            let condition = |kind: &str| {
                let mut c = json!({"type": kind, "status": ready, "lastTransitionTime": "2026-01-01T00:00:00Z"});
                if let (Some(reason), Some(message)) = (reason, message) {
                    c["reason"] = json!(reason);
                    c["message"] = json!(message);
                }
                c
            };
            status["conditions"] = json!([
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                condition("ContainersReady"),
                condition("Ready"),
            ]);
        }
        json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": self.node.name, "containers": [{"name": "c", "image": "fake"}], "volumes": volumes},
            "status": status
        })
    }

    /// Answers an eviction of `namespace/name`: (status, body).
    pub fn evict(&mut self, namespace: &str, name: &str) -> (u16, Value) {
        let key = format!("{namespace}/{name}");
        let answer = self.evict_answer(namespace, name);
        self.evictions.push(EvictionRecord {
            pod: key,
            status: answer.0,
        });
        answer
    }

    fn evict_answer(&mut self, namespace: &str, name: &str) -> (u16, Value) {
        let Some(index) = self
            .pods
            .iter()
            .position(|p| p.pod.namespace == namespace && p.pod.name == name)
        else {
            return status(
                404,
                "NotFound",
                &format!("pods \"{name}\" not found"),
                json!(null),
            );
        };
        if self.pods[index].pod.vanishes {
            self.pods.remove(index);
            return status(
                404,
                "NotFound",
                &format!("pods \"{name}\" not found"),
                json!(null),
            );
        }
        let labels = self.pods[index].pod.labels.clone();
        let covering: Vec<usize> = self
            .pdbs
            .iter()
            .enumerate()
            .filter(|(_, (pdb, _))| {
                pdb.namespace == namespace
                    && pdb
                        .match_labels
                        .iter()
                        .all(|(k, v)| labels.get(k) == Some(v))
            })
            .map(|(i, _)| i)
            .collect();
        if covering.len() > 1 {
            return status(
                500,
                "InternalError",
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
                json!(null),
            );
        }
        if let Some(&i) = covering.first() {
            let (pdb, released) = &mut self.pdbs[i];
            let refuse = match &mut pdb.block {
                _ if *released => false,
                PdbBlock::UntilReleased => true,
                PdbBlock::Attempts(0) => false,
                PdbBlock::Attempts(n) => {
                    *n -= 1;
                    true
                }
            };
            if refuse {
                let cause = format!(
                    "The disruption budget {} needs 1 healthy pods and has 1 currently",
                    pdb.name
                );
                return status(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    json!({"causes": [{"reason": "DisruptionBudget", "message": cause}]}),
                );
            }
        }
        let pod = &mut self.pods[index];
        if pod.gone_at.is_none() {
            pod.gone_at = Some(Instant::now() + self.node.eviction_delay);
        }
        (
            201,
            json!({"apiVersion": "v1", "kind": "Status", "status": "Success", "code": 201}),
        )
    }
}

fn kubelet_version(node: &FakeNode) -> String {
    node.kubelet_version_file
        .as_ref()
        .and_then(|f| std::fs::read_to_string(f).ok())
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| node.kubelet_version.clone())
}

fn boot_id(node: &FakeNode) -> String {
    node.boot_id_file
        .as_ref()
        .and_then(|f| std::fs::read_to_string(f).ok())
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| "b".to_owned())
}

fn node_json(node: &FakeNode) -> Value {
    let (status, reason) = if node.ready {
        ("True", "KubeletReady")
    } else {
        ("False", "KubeletNotReady")
    };
    let mut spec = json!({});
    if node.unschedulable {
        spec["unschedulable"] = json!(true);
    }
    let mut labels = json!({});
    if node.control_plane {
        labels[crate::CONTROL_PLANE_LABEL] = json!("");
    }
    json!({
    "apiVersion": "v1", "kind": "Node",
    "metadata": {"name": node.name, "uid": format!("uid-{}", node.name), "resourceVersion": "1", "labels": labels},
    "spec": spec,
        "status": {
            "conditions": [{"type": "Ready", "status": status, "reason": reason}],
            "nodeInfo": {
                "architecture": "amd64", "bootID": boot_id(node), "containerRuntimeVersion": "fake://1",
                "kernelVersion": "6", "kubeProxyVersion": "", "kubeletVersion": kubelet_version(node),
                "machineID": "m", "operatingSystem": "linux", "osImage": "fake", "systemUUID": "s"
            }
        }
    })
}
